#!/usr/bin/env python3
"""make test-ci: docs/CI.md's GitHub Actions job, run as written against the simulated lab.

Starts the air, a coordinator and two agents on loopback (a shared-token lab), then runs the
job's steps night after night in a workspace, as a runner would: each `run:` step with
`bash -eo pipefail`, the job's env with the lab's address and credential put in, steps after a
failure skipped unless `if: always()`; `uses:` steps are checked for what they consume (the
bundle folder to keep, the junit.xml to publish). The first nights have too little history
(regress exit 3: a warning, the job passes); from the fourth, regress judges the night against
the three before it. Prints one line per night and step; exit 1 when a night fails.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def recipe():
    text = open(os.path.join(REPO, "docs", "CI.md"), encoding="utf-8").read()
    section = text.split("## GitHub Actions", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    workflow = yaml.safe_load(block)
    return workflow["jobs"]["nightly"]


def wait_for(path, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        time.sleep(0.1)
    raise SystemExit(f"test-ci: timed out waiting for {path}")


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, ".build", "debug", "herald-lab"))
    nights = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    if not os.access(binary, os.X_OK):
        print(f"test-ci: {binary} not found; build herald-lab first")
        return 2
    job = recipe()
    work = tempfile.mkdtemp(prefix="heraldlab-ci-")
    procs = []
    try:
        token = os.urandom(16).hex()
        env = dict(os.environ, HERALDLAB_TOKEN=token)
        env.pop("HERALDLAB_CREDENTIALS", None)
        results = os.path.join(work, "coordinator-results")

        def start(name, args):
            log = open(os.path.join(work, f"{name}.log"), "w")
            procs.append(subprocess.Popen([binary] + args + ["--port", "0", "--port-file", os.path.join(work, f"{name}.port")],
                                          stdout=log, stderr=subprocess.STDOUT, env=env))
            return wait_for(os.path.join(work, f"{name}.port"))

        air = "127.0.0.1:" + start("air", ["air"])
        coordinator = "http://127.0.0.1:" + start("coordinator", ["coordinator", "--results", results, "--air", air])
        for i in (1, 2):
            start(f"agent{i}", ["agent", "--name", f"agent{i}", "--data", os.path.join(work, f"agent{i}"), "--coordinator", coordinator, "--air", air])
        time.sleep(1.5)  # first heartbeats
        plan = os.path.join(work, "nightly.yaml")
        with open(plan, "w") as f:
            f.write("name: nightly\nduration: 20s\nwarmup: 2s\nnodes:\n  - {name: n1, position: [0, 0]}\n  - {name: n2, position: [1, 0]}\n")
        bindir = os.path.join(work, "bin")
        os.makedirs(bindir)
        os.symlink(binary, os.path.join(bindir, "herald-lab"))

        # The job's env, with this lab's address, credential and results put in.
        job_env = dict(env)
        job_env.update({k: str(v) for k, v in job.get("env", {}).items()})
        job_env.update(HERALDLAB_COORDINATOR=coordinator, HERALDLAB_RESULTS=results, PLAN=plan,
                       PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        job_env.pop("HERALDLAB_CREDENTIALS", None)

        failed_nights = 0
        for night in range(1, nights + 1):
            workspace = os.path.join(work, f"night{night}")
            os.makedirs(workspace)
            job_failed = False
            warnings = []
            for step in job["steps"]:
                name = step.get("name", step.get("uses", "?"))
                if job_failed and "always()" not in str(step.get("if", "")):
                    print(f"night {night}: {name}: skipped (an earlier step failed)")
                    continue
                if "uses" in step:
                    uses, inputs = step["uses"], step.get("with", {})
                    if uses.startswith("actions/checkout"):
                        continue
                    if uses.startswith("actions/upload-artifact"):
                        path = os.path.join(workspace, inputs["path"])
                        ok = os.path.isdir(path) and any(os.path.exists(os.path.join(path, d, "manifest.json")) for d in os.listdir(path))
                        print(f"night {night}: {name}: {'the bundle is there' if ok else 'FAIL: no bundle in ' + inputs['path']}")
                        job_failed |= not ok
                    elif "junit" in uses:
                        path = os.path.join(workspace, inputs["report_paths"])
                        ok = os.path.exists(path) and "<testsuite" in open(path, encoding="utf-8").read()
                        print(f"night {night}: {name}: {'junit.xml is there' if ok else 'FAIL: no junit.xml'}")
                        job_failed |= not ok
                    continue
                started = time.time()
                p = subprocess.run(["bash", "-eo", "pipefail", "-c", step["run"]], cwd=workspace, env=job_env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
                warnings += [l for l in p.stdout.splitlines() if l.startswith("::warning::")]
                tail = "\n    ".join(p.stdout.strip().splitlines()[-6:])
                print(f"night {night}: {name}: exit {p.returncode} in {time.time() - started:.0f} s\n    {tail}")
                if p.returncode != 0:
                    job_failed = True
            judged = os.path.join(workspace, "regress.json")
            verdict = json.load(open(judged)).get("verdict", "?") if os.path.exists(judged) else "none"
            expect_conclusive = night >= 4
            if job_failed:
                print(f"test-ci: night {night}: FAIL (the job failed)")
                failed_nights += 1
            elif expect_conclusive and warnings:
                print(f"test-ci: night {night}: FAIL (three nights of history, and still inconclusive: {warnings})")
                failed_nights += 1
            else:
                print(f"test-ci: night {night}: PASS (regress: {verdict}{'; ' + warnings[0] if warnings else ''})")
        print("test-ci: " + ("PASS" if failed_nights == 0 else f"FAIL ({failed_nights} of {nights} nights)"))
        return 1 if failed_nights else 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if os.environ.get("KEEP_CI_TEST"):
            print(f"test-ci: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
