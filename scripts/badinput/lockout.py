#!/usr/bin/env python3
"""Lockout by strangers (issue 22, item 3): can an unauthenticated peer deny service?

Starts a TLS lab as deployed (`herald-lab ca init`, the air, a coordinator, two agents enrolled
with `herald-lab agents enrol` and `herald-lab enrol`), then, from one stranger's address
(127.0.0.2; the lab's own clients use 127.0.0.1), holds open against the coordinator:

- IDLE connections that send nothing,
- SLOW slowloris connections that send a request head one byte at a time, a byte every few
  seconds, never finishing it,
- HALF TLS handshakes: a real ClientHello (Python's ssl over a memory BIO) and nothing after it,

and, while all of them are open, the operator asks `GET /v1/agents` over TLS every half second
for WINDOW seconds, from 127.0.0.1. Each answer's time is taken, and the agents' states in it
(an agent whose heartbeats do not get through goes `missing`). Then the air: AIR_IDLE idle
connections and JUNK junk senders, and the air's threads and resident memory before and after.

Prints the figures; exit 0 when every operator request was answered 200 within 1 s and no agent
went missing, 1 otherwise, 2 when the lab could not be set up.

    lockout.py BINARY [--idle 2000] [--slow 500] [--half-tls 200] [--window 30]
"""
import argparse
import json
import os
import resource
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from identity_attacks import Lab, wait  # noqa: E402

STRANGER = "127.0.0.2"


def proc_figures(pid):
    """(threads, resident MB) of a process, from /proc."""
    threads, rss = None, None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return threads, rss


def stranger_socket(port, timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((STRANGER, 0))
    s.connect(("127.0.0.1", port))
    return s


class Attack:
    """The stranger's connections, held open until close()."""

    def __init__(self):
        self.sockets = []
        self.refused = 0
        self.stop = threading.Event()
        self.threads = []

    def open(self, n, port, first=b""):
        for _ in range(n):
            try:
                s = stranger_socket(port)
                if first:
                    s.sendall(first)
                self.sockets.append(s)
            except OSError:
                self.refused += 1

    def idle(self, n, port):
        self.open(n, port)

    def slowloris(self, n, port, every=3.0):
        start = len(self.sockets)
        self.open(n, port, b"GET /v1/agents HTTP/1.1\r\nHost: coord\r\n")
        mine = self.sockets[start:]

        def trickle():
            while not self.stop.wait(every):
                for s in mine:
                    try:
                        s.send(b"X")
                    except OSError:
                        pass
        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        self.threads.append(t)

    def half_tls(self, n, port):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        for _ in range(n):
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            obj = ctx.wrap_bio(incoming, outgoing, server_hostname="coord.lab")
            try:
                obj.do_handshake()
            except ssl.SSLWantReadError:
                pass
            hello = outgoing.read()
            self.open(1, port, hello)

    def close(self):
        self.stop.set()
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass
        self.sockets = []


def timed_agents(lab, token):
    """(seconds, status, agents or None) of one operator GET /v1/agents, on a new connection."""
    t0 = time.monotonic()
    try:
        status, body = lab.https("GET", "/v1/agents", token)
        agents = json.loads(body) if status == 200 else None
    except (OSError, ssl.SSLError, ValueError) as e:
        status, agents = f"error: {type(e).__name__}", None
    return time.monotonic() - t0, status, agents


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary")
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--slow", type=int, default=500)
    ap.add_argument("--half-tls", type=int, default=200)
    ap.add_argument("--air-idle", type=int, default=1000)
    ap.add_argument("--junk", type=int, default=200)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--keep", help="a folder for the lab's logs (default: a temporary one, removed)")
    a = ap.parse_args()
    return run(a.binary, idle=a.idle, slow=a.slow, half_tls=a.half_tls, air_idle=a.air_idle, junk=a.junk, window=a.window, keep=a.keep)


def run(binary, idle=2000, slow=500, half_tls=200, air_idle=1000, junk=200, window=30.0, keep=None):
    """The whole test (main's flags as arguments); 0 pass, 1 fail, 2 no lab."""
    a = argparse.Namespace(idle=idle, slow=slow, half_tls=half_tls, air_idle=air_idle, junk=junk, window=window, keep=keep)
    for name in ["idle", "slow", "half_tls", "air_idle", "junk"]:
        if not 0 <= getattr(a, name) <= 5000:
            print(f"lockout.py: --{name.replace('_', '-')} must be 0 to 5000", file=sys.stderr)
            return 2
    if not 1 <= a.window <= 600:
        print("lockout.py: --window must be 1 to 600 seconds", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.idle + a.slow + a.half_tls + a.air_idle + a.junk + 512
    if hard < need:
        print(f"lockout.py: needs {need} open files, the hard limit is {hard}", file=sys.stderr)
        return 2
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the lab's processes inherit it
    binary = os.path.abspath(binary)
    root = a.keep or tempfile.mkdtemp(prefix="lockout-")
    os.makedirs(root, exist_ok=True)
    lab = Lab(binary, root)
    attack = Attack()
    try:
        code, out = lab.cli("ca", "init", "--dir", lab.cred, "--host", "127.0.0.1")
        if code != 0:
            print(f"lockout.py: ca init failed: {out}", file=sys.stderr)
            return 2
        op = lab.secret("operator.token")
        lab.start("air", ["air", "--credentials", lab.cred])
        lab.start("coordinator", ["coordinator", "--credentials", lab.cred, "--results", os.path.join(root, "results"),
                                  "--air", f"127.0.0.1:{lab.procs['air'].port}"])
        for name in ["a1", "a2"]:
            lab.enrol(name)
            lab.start(name, ["agent", "--name", name, "--credentials", os.path.join(root, f"{name}-cred"),
                             "--data", os.path.join(root, f"{name}-data"), "--coordinator", lab.url])
        wait("a1 and a2 alive", 30, lambda: sum(1 for v in (timed_agents(lab, op)[2] or []) if v["state"] == "alive") == 2)

        coord = lab.procs["coordinator"]
        before = proc_figures(coord.proc.pid)
        t0 = time.monotonic()
        attack.idle(a.idle, coord.port)
        attack.slowloris(a.slow, coord.port)
        attack.half_tls(a.half_tls, coord.port)
        opened = time.monotonic() - t0
        during = proc_figures(coord.proc.pid)
        print(f"stranger {STRANGER} -> coordinator: {a.idle} idle, {a.slow} slowloris, {a.half_tls} half TLS handshakes; "
              f"{len(attack.sockets)} open, {attack.refused} refused at connect, {opened:.1f} s to open")
        times, failures, missing = [], [], set()
        end = time.monotonic() + a.window
        while time.monotonic() < end:
            seconds, status, agents = timed_agents(lab, op)
            times.append(seconds)
            if status != 200 or seconds > 1.0:
                failures.append(f"{status} after {seconds:.2f} s")
            for v in agents or []:
                if v["state"] != "alive":
                    missing.add(f"{v['info']['name']} {v['state']}")
            time.sleep(max(0.0, 0.5 - seconds))
        attack.close()
        times.sort()
        answered = len(times) - len(failures)
        print(f"operator GET /v1/agents over TLS from 127.0.0.1 for {a.window:.0f} s: {answered} of {len(times)} answered 200 within 1 s; "
              f"median {times[len(times) // 2] * 1000:.0f} ms, slowest {times[-1] * 1000:.0f} ms")
        for f in failures[:5]:
            print(f"  failed: {f}")
        print(f"agents not alive during the attack: {', '.join(sorted(missing)) or 'none'}")
        print(f"coordinator threads {before[0]} -> {during[0]}, resident {before[1]:.0f} MB -> {during[1]:.0f} MB")

        air = lab.procs["air"]
        air_before = proc_figures(air.proc.pid)
        air_attack = Attack()
        air_attack.idle(a.air_idle, air.port)
        air_attack.open(a.junk, air.port, os.urandom(64 * 1024).replace(b"\n", b"x"))
        time.sleep(2)
        air_during = proc_figures(air.proc.pid)
        air_attack.close()
        print(f"air: {a.air_idle} idle and {a.junk} junk senders from {STRANGER}: threads {air_before[0]} -> {air_during[0]}, "
              f"resident {air_before[1]:.0f} MB -> {air_during[1]:.0f} MB")
        ok = not failures and not missing
        print(f"lockout: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    except RuntimeError as e:
        print(f"lockout.py: {e}", file=sys.stderr)
        return 2
    finally:
        attack.close()
        lab.stop()
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
