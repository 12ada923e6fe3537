#!/usr/bin/env python3
"""Bad-input suite for herald-lab (make test-badinput).

Mutates the shipped plans and small real log folders (a simulated bundle, a slice of Herald's
2020-12-08 fixture) with a seeded generator, runs the built herald-lab on each as a subprocess
with a time limit, and counts exit codes, crashes (killed by a signal), hangs (time limit hit)
and escapes (files written outside the output folders: the sandbox is listed before and after).
Then hostile_http.py starts the air, a coordinator and an agent and throws malformed and hostile
requests at them over raw sockets (--http-requests per service, 0 to skip).
Then identity_attacks.py attacks a TLS lab with enrolment (revocation mid-run, ticket replay,
injection, heartbeat replay, name takeover) and prints what each attack got.
Exit status 1 if any crash, hang or escape; 0 otherwise.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import hostile_http
import identity_attacks
import lockout
import mutate_logs
import mutate_plans
import spin_attacks

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def listing(root, skip):
    """Every path under root (not following links) with its type, size and mtime, except under skip."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel = os.path.relpath(dirpath, root)
        if any(rel == s or rel.startswith(s + os.sep) for s in skip):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            r = os.path.relpath(p, root)
            if any(r == s or r.startswith(s + os.sep) for s in skip):
                continue
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


class Runner:
    def __init__(self, binary, timeout, sandbox):
        self.binary = binary
        self.timeout = timeout
        self.cwd = os.path.join(sandbox, "cwd")
        os.makedirs(self.cwd, exist_ok=True)
        self.env = dict(os.environ, HERALDLAB_RESULTS=os.path.join(sandbox, "out", "results"))

    def run(self, args, timeout=None):
        """(kind, code, seconds, stderr tail): kind is exit, crash or hang."""
        started = time.monotonic()
        try:
            p = subprocess.run([self.binary] + args, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout or self.timeout)
        except subprocess.TimeoutExpired:
            return ("hang", None, time.monotonic() - started, "", "")
        took = time.monotonic() - started
        err = p.stderr[-400:].decode("utf-8", "replace")
        out = p.stdout[:2000].decode("utf-8", "replace")
        if p.returncode < 0:
            return ("crash", -p.returncode, took, err, out)
        return ("exit", p.returncode, took, err, out)


def base_logs(runner, sandbox, fixture):
    """Small real log folders: a simulated 3-node bundle and a slice of the fixture."""
    bases = {}
    plan = os.path.join(sandbox, "base", "tiny.yaml")
    os.makedirs(os.path.dirname(plan), exist_ok=True)
    with open(plan, "w") as f:
        f.write("name: tiny\nduration: 90s\nwarmup: 10s\nnodes:\n  - {name: alpha, position: [0, 0]}\n"
                "  - {name: beta, position: [1m, 0]}\n  - {name: gamma, position: [2m, 1m]}\n")
    bundle = os.path.join(sandbox, "base", "tiny-bundle")
    kind, code, _, err, _ = runner.run(["simulate", plan, "--out", bundle, "--quiet"], timeout=120)
    if kind != "exit" or code != 0:
        sys.exit(f"badinput: cannot simulate the base bundle ({kind} {code}): {err}")
    bases["bundle"] = (bundle, [])
    slice_dir = os.path.join(sandbox, "base", "fixture-slice")
    if fixture and os.path.exists(fixture):
        os.makedirs(slice_dir, exist_ok=True)
        with tarfile.open(fixture, "r:xz") as tar:
            for m in tar:
                if not m.isfile():
                    continue
                parts = m.name.split("/")
                if len(parts) < 2 or parts[-1] not in ("contacts.csv", "detection.csv", "battery.csv"):
                    continue
                device = parts[-2]
                os.makedirs(os.path.join(slice_dir, device), exist_ok=True)
                data = tar.extractfile(m).read()
                if parts[-1] == "contacts.csv":
                    data = b"".join(data.splitlines(keepends=True)[:3000])
                elif parts[-1] == "battery.csv":
                    data = b"".join(data.splitlines(keepends=True)[:200])
                with open(os.path.join(slice_dir, device, parts[-1]), "wb") as f:
                    f.write(data)
        bases["slice"] = (slice_dir, ["--ce-start", "2020-12-08 22:56:00", "--ce-end", "2020-12-08 23:30:00",
                                      "--filter-start", "2020-12-08 22:50:00", "--filter-end", "2020-12-08 23:40:00"])
    return bases


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", default=os.path.join(REPO, ".build", "debug", "herald-lab"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plans", type=int, default=1000)
    ap.add_argument("--logs", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=max(2, os.cpu_count() or 2))
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--sandbox", default=os.path.join(REPO, ".build", "badinput"))
    ap.add_argument("--fixture", default=os.path.join(REPO, "..", "shared", "herald", "fixtures", "herald-2020-12-08.tar.xz"))
    ap.add_argument("--max-sim-nodes", type=int, default=30)
    ap.add_argument("--http-requests", type=int, default=1000, help="hostile inputs per service (0: skip the HTTP part)")
    ap.add_argument("--http-budget", type=float, default=90, help="seconds of hostile network traffic at most")
    ap.add_argument("--lockout", type=int, default=1, help="1: run the lockout test (lockout.py), 0: skip it")
    ap.add_argument("--lockout-window", type=float, default=30, help="seconds the operator is timed under the attack")
    args = ap.parse_args()

    started = time.monotonic()
    binary = os.path.abspath(args.bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"badinput: {binary} not found; run swift build first")
    sandbox = os.path.abspath(args.sandbox)
    if os.path.exists(sandbox):
        shutil.rmtree(sandbox)
    os.makedirs(sandbox)
    runner = Runner(binary, args.timeout, sandbox)
    rng = random.Random(args.seed)

    # Inputs, generated in order from the seed before anything runs (deterministic).
    bases = base_logs(runner, sandbox, args.fixture)
    outside = os.path.join(sandbox, "outside")
    os.makedirs(outside)
    with open(os.path.join(outside, "secret.csv"), "w") as f:
        f.write("time,sensor,id,detect,read,measure,share,visit,data\n2020-12-08 23:00:00,BLE,X,,2,,,,SECRET\n")
    plan_dir = os.path.join(sandbox, "plans")
    plan_jobs = mutate_plans.generate(rng, os.path.join(REPO, "plans"), plan_dir, args.plans)
    log_dir = os.path.join(sandbox, "logs")
    log_jobs = mutate_logs.generate(rng, bases, log_dir, outside, args.logs)
    generated = time.monotonic() - started

    out_root = os.path.join(sandbox, "out")
    os.makedirs(out_root, exist_ok=True)
    allowed = ["out", "cwd"] + [os.path.relpath(p, sandbox) for j in log_jobs for p in j["outputs"]]
    before = listing(sandbox, skip=allowed)

    counts = collections.Counter()
    failures = []

    def plan_job(j):
        i, path = j["index"], j["path"]
        results = []
        r = runner.run(["plan", "check", path])
        results.append(("plan check", r, path))
        kind, code, _, _, out = r
        if kind == "exit" and code == 0:
            nodes = None
            first = out.splitlines()[0] if out else ""
            try:
                nodes = int(first.split(": ", 1)[1].split(" nodes", 1)[0])
            except (IndexError, ValueError):
                pass
            if nodes is not None and nodes <= args.max_sim_nodes:
                sim_out = os.path.join(out_root, f"plan-{i:04d}")
                r2 = runner.run(["simulate", path, "--out", sim_out, "--quiet", "--max-duration", j["simulate"]])
                results.append(("simulate", r2, path))
            else:
                results.append(("simulate skipped", None, path))
        return results

    def log_job(j):
        r = runner.run(j["args"])
        return [(j["command"], r, " ".join(j["args"]))]

    jobs = [("plan", j) for j in plan_jobs] + [("logs", j) for j in log_jobs]
    # Interleave the two kinds so both cores stay busy with a mix.
    rng.shuffle(jobs)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(plan_job if k == "plan" else log_job, j) for k, j in jobs]
        for f in concurrent.futures.as_completed(futures):
            for command, r, path in f.result():
                if r is None:
                    counts[(command, "n")] += 1
                    continue
                kind, code, took, err, _ = r
                counts[(command, "n")] += 1
                if kind == "exit":
                    # regress exits 3 when it cannot tell (too little history, or infra faults).
                    allowed_codes = (0, 1, 2, 3) if command == "regress" else (0, 1, 2)
                    counts[(command, f"exit {code}" if code in allowed_codes else "exit other")] += 1
                    if code not in allowed_codes:
                        failures.append(f"{command} exit {code}: {path}: {err.strip()[-200:]}")
                else:
                    counts[(command, kind)] += 1
                    counts[kind] += 1
                    what = f"signal {signal.Signals(code).name}" if kind == "crash" else f"no exit within {args.timeout:.0f} s"
                    failures.append(f"{command} {kind} ({what}): {path}: {err.strip()[-300:]}")

    after = listing(sandbox, skip=allowed)
    escapes = sorted(p for p in after if p not in before or after[p] != before[p])
    gone = sorted(p for p in before if p not in after)
    counts["escape"] = len(escapes)

    elapsed = time.monotonic() - started
    inputs = len(plan_jobs) + len(log_jobs)
    print(f"badinput: seed {args.seed}, {inputs} inputs ({len(plan_jobs)} plans, {len(log_jobs)} log folders), "
          f"{args.jobs} jobs, timeout {args.timeout:.0f} s per run, {elapsed:.0f} s ({generated:.0f} s generating)")
    for command in ["plan check", "simulate", "analyse", "compare", "regress"]:
        n = counts[(command, "n")]
        if not n:
            continue
        parts = [f"{k} {counts[(command, k)]}" for k in ["exit 0", "exit 1", "exit 2", "exit 3", "exit other", "crash", "hang"] if counts[(command, k)]]
        print(f"  {command:<11} {n:5d} runs: " + ", ".join(parts))
    if counts[("simulate skipped", "n")]:
        print(f"  (simulate skipped for {counts[('simulate skipped', 'n')]} valid plans over {args.max_sim_nodes} nodes)")
    print(f"  crashes {counts['crash']}, hangs {counts['hang']}, escapes {len(escapes)}")
    for p in escapes[:20]:
        print(f"  escape: {p}")
    for p in gone[:5]:
        print(f"  (removed outside the outputs: {p})")
    if failures:
        with open(os.path.join(sandbox, "failures.txt"), "w") as f:
            f.write("\n".join(failures) + "\n")
        for line in failures[:20]:
            print("  " + line)
        print(f"  all failures: {os.path.join(sandbox, 'failures.txt')}")
    bad = counts["crash"] + counts["hang"] + len(escapes)
    print("badinput files: " + ("FAIL" if bad else "PASS"))

    # The services over raw sockets (hostile_http.py): malformed and hostile HTTP and air input.
    if args.http_requests > 0:
        http = hostile_http.run(binary, args.seed, sandbox, requests=args.http_requests, budget=args.http_budget)
        bad += http["bad"]
        # Pipelined-close spin attacks on TLS and plain services (spin_attacks.py): CPU ticks counted.
        bad += spin_attacks.run(binary, sandbox)["bad"]
    # Identity attacks on a TLS lab (issue 19): revocation mid-run, ticket and heartbeat replay, injection.
    bad += identity_attacks.run(binary, args.seed, sandbox)["bad"]
    # Lockout by strangers (issue 22): 2,000 idle, 500 slowloris and 200 half-done TLS handshakes
    # from one address while the operator and the agents must be answered within 1 s.
    if args.lockout:
        code = lockout.run(binary, window=args.lockout_window)
        if code != 0:
            print(f"badinput lockout: FAIL (exit {code})")
            bad += 1
    print("badinput: " + ("FAIL" if bad else "PASS"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
