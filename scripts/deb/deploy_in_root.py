#!/usr/bin/env python3
"""make test-deb, second part: agents/README.md's deployment steps, from the .deb, in a clean
Debian root (chroot) where the package is installed.

  deploy_in_root.py ROOT DEB HOST_BINARY WORK SUITE

As the guide says: agents/install-coordinator.sh --deb on the "coordinator host" (the CA once,
coordinator.env and air.env), `herald-lab agents enrol` there for two agents, agents/install.sh
--deb --radio sim for each; the air, the coordinator and each agent are then started exactly as
their installed units start them (ExecStart with systemd's variable rules, EnvironmentFile,
User=heraldlab; systemd is not running in a chroot), and the operator's machine (this host, with
a folder holding copies of ca.pem and operator.token) lists the agents and runs a short plan
over TLS. One PASS/FAIL line per step; exit 1 on any FAIL.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "scripts", "netlab"))
import lab  # noqa: E402  (the unit and env-file rules netlab uses)

COORD_PORT, AIR_PORT, AGENT_PORT = 18700, 18702, 18711
AGENTS = ["sim1", "sim2"]
PLAN = """name: deb-deploy
description: two simulated nodes, installed from the .deb as agents/README.md says
duration: 20s
warmup: 5s
nodes:
  - name: alpha
    position: [0, 0]
  - name: beta
    position: [1m, 0]
radio:
  kind: sim
"""


def main():
    root, deb, host_bin, work, suite = sys.argv[1:6]
    failed = []
    procs = []

    def check(what, ok, detail=""):
        print(f"test-deb {suite}: {'PASS' if ok else 'FAIL'} {what}{'' if ok or not detail else ': ' + detail}", flush=True)
        if not ok:
            failed.append(what)
        return ok

    def chroot(*args, timeout=300):
        p = subprocess.run(["chroot", root, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace")

    def start(name, unit, env_file, instance=None):
        """A service as its unit starts it: ExecStart expanded with its EnvironmentFile, as User=heraldlab."""
        argv = lab.unit_command(os.path.join(root, "lib/systemd/system", unit), open(os.path.join(root, env_file.lstrip("/"))).read(), instance)
        log = open(os.path.join(work, f"{suite}-{name}.log"), "w")
        p = subprocess.Popen(["chroot", root, "runuser", "-u", "heraldlab", "--", *argv], stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append(p)
        return p

    def operator(*args, timeout=180):
        p = subprocess.run([host_bin, *args, "--coordinator", f"https://127.0.0.1:{COORD_PORT}", "--credentials", creds],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace")

    creds = os.path.join(work, f"{suite}-operator")
    try:
        shutil.copytree(os.path.join(REPO, "agents"), os.path.join(root, "root", "agents"))
        shutil.copy(deb, os.path.join(root, "root", os.path.basename(deb)))
        pkg = "/root/" + os.path.basename(deb)
        # 2. The coordinator host.
        rc, out = chroot("bash", "/root/agents/install-coordinator.sh", "--deb", pkg, "--host", "127.0.0.1",
                         "--port", str(COORD_PORT), "--air-port", str(AIR_PORT))
        if not check("install-coordinator.sh --deb (CA, coordinator.env, air.env)", rc == 0, out[-1500:]):
            return 1
        cred = os.path.join(root, "etc/herald-lab/coordinator")
        mode = os.stat(cred).st_mode & 0o777
        check(f"the credentials folder is the coordinator's own (mode {mode:o})", mode == 0o700)
        start("air", "herald-lab-air.service", "/etc/herald-lab/air.env")
        start("coordinator", "herald-lab-coordinator.service", "/etc/herald-lab/coordinator.env")
        # 3. The operator's machine: copies of ca.pem and operator.token.
        os.makedirs(creds, exist_ok=True)
        for f in ["ca.pem", "operator.token"]:
            shutil.copy(os.path.join(cred, f), os.path.join(creds, f))
        up = False
        for _ in range(150):
            if operator("agents", "--json", timeout=10)[0] == 0:
                up = True
                break
            time.sleep(0.2)
        if not check("coordinator and air started as their units start them; the operator reaches it over TLS", up,
                     open(os.path.join(work, f"{suite}-coordinator.log")).read()[-1500:]):
            return 1
        # 5-6. Enrol on the coordinator host, install on the node (here the same root).
        for i, a in enumerate(AGENTS):
            rc, out = chroot("herald-lab", "agents", "enrol", a, "--host", "127.0.0.1", "--out", f"/root/{a}.enrol",
                             "--coordinator", f"https://127.0.0.1:{COORD_PORT}", "--credentials", "/etc/herald-lab/coordinator")
            if not check(f"agents enrol {a} on the coordinator host", rc == 0, out[-800:]):
                return 1
            rc, out = chroot("bash", "/root/agents/install.sh", "--deb", pkg, "--radio", "sim", "--name", a,
                             "--enrolment", f"/root/{a}.enrol", "--port", str(AGENT_PORT + i), "--node-host", "127.0.0.1")
            if not check(f"install.sh --deb --radio sim --name {a}", rc == 0, out[-1500:]):
                return 1
            start(a, "herald-lab-agent@.service", f"/etc/herald-lab/agents/{a}.env", instance=a)
        alive = []
        for _ in range(150):
            rc, out = operator("agents", "--json", timeout=10)
            if rc == 0:
                alive = sorted(x["info"]["name"] for x in json.loads(out) if x["state"] == "alive")
                if alive == AGENTS:
                    break
            time.sleep(0.2)
        check(f"both agents alive at the coordinator ({', '.join(alive) or 'none'})", alive == AGENTS,
              " | ".join(f"{a}: " + open(os.path.join(work, f"{suite}-{a}.log")).read()[-600:] for a in AGENTS))
        # 7. A run from the operator's machine.
        plan = os.path.join(work, f"{suite}-plan.yaml")
        open(plan, "w").write(PLAN)
        rc, out = operator("run", plan, "--out", os.path.join(work, f"{suite}-results"), timeout=240)
        check("herald-lab run from the operator's machine passes", rc == 0, out[-1500:])
        manifests = [os.path.join(d, f, "manifest.json") for d in [os.path.join(work, f"{suite}-results")] if os.path.isdir(d) for f in os.listdir(d)]
        states = []
        for m in manifests:
            if os.path.exists(m):
                states += [n.get("state") for n in json.load(open(m)).get("nodes", [])]
        check(f"the bundle's nodes are complete ({', '.join(map(str, states)) or 'no manifest'})", states == ["complete", "complete"])
    except Exception as e:  # noqa: BLE001 - reported as a FAIL line, never a traceback
        check("the deployment steps ran", False, f"{type(e).__name__}: {e}")
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        subprocess.run(["pkill", "-f", f"herald-lab .*--port ({COORD_PORT}|{AIR_PORT})"], check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
