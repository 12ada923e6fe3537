#!/usr/bin/env python3
"""Pipelined-close attacks on herald-lab's services (part of make test-badinput; issue 19, item 2).

Starts two labs from the built herald-lab: one over TLS (`ca init`, the air and the coordinator
with --credentials, an agent enrolled with `agents enrol` + `enrol`) and one plain (shared token
file). Then, as a stranger would:

- HTTP (each coordinator and each agent): connections that send 200 pipelined `GET /health` and
  close without reading a byte, half with a FIN, half with a reset (SO_LINGER 0);
- the air (TLS and plain): junk senders that send garbage lines and hellos without a token, then
  vanish with a reset;
- then, on each TLS coordinator and agent, 80 strangers (more than the 64 workers) that start a
  TLS record and send no more, and 80 that trickle it a byte every 40 ms: a real TLS client must
  still be answered within 2 s.

Each service's CPU time is read from /proc/PID/stat (utime + stime, in clock ticks) over 10 s of
quiet before the attack and 10 s after it (once it has had 2 s to settle), together with the
number of its threads in state R. A service whose ticks after the attack exceed those before by
more than 1 % of a core over the window (10 ticks at 100 Hz) counts as a spin; it must also
still answer its health check (HTTP 200; the air: a hello answered). Counts are printed.
"""
import argparse
import collections
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

from hostile_http import REPO, Service, air_hello, http_health

PIPELINED = 200
WINDOW = 10.0
SETTLE = 2.0


# A stranger's address on loopback (the lab's own clients use 127.0.0.1).
STRANGER = "127.0.0.2"

def cpu_ticks(pid):
    """utime + stime of a process, in clock ticks (None once it has gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def running_threads(pid):
    """How many of a process's threads are running or runnable (state R) now."""
    n = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "R":
                        n += 1
            except OSError:
                pass
    except OSError:
        return None
    return n


def window(services, seconds):
    """Ticks each service uses over `seconds`, and the most threads seen in state R."""
    start = {name: cpu_ticks(s.proc.pid) for name, s in services.items()}
    most = collections.Counter()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, s in services.items():
            most[name] = max(most[name], running_threads(s.proc.pid) or 0)
        time.sleep(0.5)
    ticks = {}
    for name, s in services.items():
        end = cpu_ticks(s.proc.pid)
        ticks[name] = None if end is None or start[name] is None else end - start[name]
    return ticks, most


def connect(port, tls_context):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if tls_context is not None:
        s = tls_context.wrap_socket(s, server_hostname="127.0.0.1")
    return s


def leave(s, reset):
    """Closes without reading: with a reset (SO_LINGER 0) or a FIN (and, over TLS, no close_notify)."""
    try:
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    except OSError:
        pass


def pipelined_close(port, tls_context, connections, counts, key):
    """`connections` connections each sending 200 pipelined GET /health, then gone unread."""
    burst = b"GET /health HTTP/1.1\r\nHost: spin\r\n\r\n" * PIPELINED
    for i in range(connections):
        try:
            s = connect(port, tls_context)
            s.sendall(burst)
            # Some answers have started to come back (the server is writing): now leave.
            time.sleep(0.01)
            leave(s, reset=i % 2 == 1)
            counts[key + " connections"] += 1
            counts[key + " requests"] += PIPELINED
        except (OSError, ssl.SSLError):
            counts[key + " refused"] += 1


def air_junk(port, tls_context, connections, counts, key):
    """Junk senders on the air: garbage lines and hellos without a token, then a reset."""
    lines = b"".join([b"junk \x1b[2J\n", b"{\"t\":\n", b"\xff\xfe\n"] +
                     [json.dumps({"t": "hello", "id": i, "node": f"junk{i}"}).encode() + b"\n" for i in range(20)] +
                     [json.dumps({"t": "read", "id": i}).encode() + b"\n" for i in range(200)])
    for i in range(connections):
        try:
            s = connect(port, tls_context)
            s.sendall(lines)
            # The air's refusal is written before or after the reset, depending on the pause.
            time.sleep((0, 0.001, 0.003, 0.01)[i % 4])
            leave(s, reset=True)
            counts[key + " connections"] += 1
            counts[key + " lines"] += lines.count(b"\n")
        except (OSError, ssl.SSLError):
            counts[key + " refused"] += 1


def slow_handshakes(port, tls_context, count, counts, failures, name):
    """2 x `count` strangers from one address start a TLS record of 512 bytes:
    `count` send its first byte and no more, `count` trickle the rest a byte every 40 ms;
    meanwhile a real TLS client must be answered within 2 s. Then they leave."""
    held = []
    stop = threading.Event()

    def trickle(sockets):
        while not stop.is_set():
            for s in sockets:
                try:
                    s.send(b"\x00")
                except OSError:
                    pass
            stop.wait(0.04)

    try:
        for _ in range(2 * count):
            try:
                # From a stranger's address (127.0.0.2): the gate holds 32 of them and refuses
                # the rest at accept; the real client comes from 127.0.0.1.
                s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(STRANGER, 0))
                s.sendall(b"\x16\x03\x01\x02\x00\x01")
                held.append(s)
            except OSError:
                counts["handshake refused"] += 1
        counts["slow handshakes"] += len(held)
        t = threading.Thread(target=trickle, args=(held[::2],), daemon=True)
        t.start()
        time.sleep(0.5)
        if not tls_health(port, tls_context):
            counts["held"] += 1
            failures.append(f"{name}: no answer within 2 s while {len(held)} strangers held TLS handshakes open")
    finally:
        stop.set()
        for s in held:
            leave(s, reset=False)


def tls_health(port, tls_context, timeout=2.0):
    try:
        s = connect(port, tls_context)
        s.settimeout(timeout)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: spin\r\nConnection: close\r\n\r\n")
        got = s.recv(64)
        s.close()
        return got.startswith(b"HTTP/1.1 200")
    except (OSError, ssl.SSLError):
        return False


def tls_air_answers(port, tls_context, timeout=2.0):
    """A hello over TLS gets an answer line (a refusal: this prober holds no ticket)."""
    try:
        s = connect(port, tls_context)
        s.settimeout(timeout)
        s.sendall(json.dumps({"t": "hello", "id": 1, "node": "spin-probe"}).encode() + b"\n")
        got = s.recv(4096)
        s.close()
        return got.startswith(b"{")
    except (OSError, ssl.SSLError):
        return False


def cli(binary, args, root, env):
    p = subprocess.run([binary] + args, cwd=os.path.join(root, "cwd"), env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"herald-lab {' '.join(args[:3])} exited {p.returncode}: {p.stdout[-300:].decode('utf-8', 'replace')}")


def start(services, name, args, root, env):
    s = Service(name, args, root, env)
    services[name] = s
    if not s.wait_listening():
        raise RuntimeError(f"{name} did not start (log: {s.log_path})")
    return s


def labs(binary, root, env, token_file, services):
    """Starts both labs; returns the TLS client context."""
    cred = os.path.join(root, "cred")
    cli(binary, ["ca", "init", "--dir", cred, "--host", "127.0.0.1"], root, env)
    tls = ssl.create_default_context(cafile=os.path.join(cred, "ca.pem"))
    air = start(services, "tls air", [binary, "air", "--credentials", cred], root, env)
    coord = start(services, "tls coordinator", [binary, "coordinator", "--credentials", cred, "--results",
                                                os.path.join(root, "tls-results"), "--air", f"127.0.0.1:{air.port}"], root, env)
    url = f"https://127.0.0.1:{coord.port}"
    enrolment = os.path.join(root, "a1.enrol")
    cli(binary, ["agents", "enrol", "a1", "--host", "127.0.0.1", "--out", enrolment, "--coordinator", url, "--credentials", cred], root, env)
    cli(binary, ["enrol", enrolment, "--dir", os.path.join(root, "a1-cred")], root, env)
    start(services, "tls agent", [binary, "agent", "--name", "a1", "--credentials", os.path.join(root, "a1-cred"), "--data",
                                  os.path.join(root, "a1-data"), "--coordinator", url], root, env)
    air = start(services, "plain air", [binary, "air", "--token-file", token_file], root, env)
    coord = start(services, "plain coordinator", [binary, "coordinator", "--token-file", token_file, "--results",
                                                  os.path.join(root, "plain-results"), "--air", f"127.0.0.1:{air.port}"], root, env)
    start(services, "plain agent", [binary, "agent", "--name", "p1", "--token-file", token_file, "--data", os.path.join(root, "p1-data"),
                                    "--coordinator", f"http://127.0.0.1:{coord.port}", "--air", f"127.0.0.1:{air.port}"], root, env)
    return tls


def run(binary, sandbox, connections=20, out=print):
    """Runs the attacks; returns {"bad": n, ...}."""
    started = time.monotonic()
    root = os.path.join(sandbox, "spin")
    if os.path.exists(root):
        shutil.rmtree(root)
    for d in ["cwd", "logs", "tmp"]:
        os.makedirs(os.path.join(root, d))
    token_file = os.path.join(root, "token")
    with open(token_file, "w") as f:
        f.write("spin" * 16 + "\n")
    env = dict(os.environ, TMPDIR=os.path.join(root, "tmp"))
    env.pop("HERALDLAB_TOKEN", None)
    env.pop("HERALDLAB_CREDENTIALS", None)
    services = {}
    counts = collections.Counter()
    failures = []
    before = after = {}
    most_before = most_after = {}
    try:
        tls = labs(binary, root, env, token_file, services)
        time.sleep(SETTLE)  # agents register, heartbeats settle
        before, most_before = window(services, WINDOW)
        for name, s in services.items():
            context = tls if name.startswith("tls") else None
            if name.endswith("air"):
                air_junk(s.port, context, connections, counts, "air")
            else:
                pipelined_close(s.port, context, connections, counts, "http")
        time.sleep(SETTLE)
        after, most_after = window(services, WINDOW)
        for name, s in services.items():
            if name.startswith("tls") and not name.endswith("air"):
                slow_handshakes(s.port, tls, 80, counts, failures, name)
        for name, s in services.items():
            if s.proc.poll() is not None:
                counts["crash"] += 1
                failures.append(f"{name} exited with {s.proc.returncode} (log: {s.log_path})")
                continue
            b, a = before.get(name), after.get(name)
            if a is not None and b is not None and a - b > WINDOW:  # 1 % of a core at 100 ticks/s
                counts["spin"] += 1
                failures.append(f"{name}: {a} CPU ticks in {WINDOW:.0f} s after the attack, {b} before (a spin)")
            context = tls if name.startswith("tls") else None
            if name.endswith("air"):
                ok = tls_air_answers(s.port, context) if context else air_hello(s.port, "spin" * 16)
            else:
                ok = tls_health(s.port, context) if context else http_health(s.port)
            if not ok:
                counts["hang"] += 1
                failures.append(f"{name}: no answer within 2 s after the attack")
    except RuntimeError as e:
        counts["crash"] += 1
        failures.append(str(e))
    finally:
        for name, s in services.items():
            if not s.stop(5.0):
                counts["hang"] += 1
                failures.append(f"{name}: did not exit within 5 s of SIGTERM")
    out(f"badinput spin: {counts['http connections']} HTTP connections x {PIPELINED} pipelined GET /health closed unread "
        f"({counts['http requests']} requests), {counts['air connections']} junk senders on the air ({counts['air lines']} lines), "
        f"{time.monotonic() - started:.0f} s")
    for name in services:
        out(f"  {name:<18} CPU ticks in {WINDOW:.0f} s: {before.get(name)} before, {after.get(name)} after; "
            f"threads running at most {most_before.get(name, 0)} before, {most_after.get(name, 0)} after")
    out(f"  {counts['slow handshakes']} strangers holding TLS handshakes open: answered while held "
        f"{'no' if counts['held'] else 'yes'}")
    out(f"  spins {counts['spin']}, crashes {counts['crash']}, hangs {counts['hang']}, held {counts['held']}, refused connections "
        f"{counts['http refused'] + counts['air refused']}")
    for f in failures[:20]:
        out("  " + f)
    bad = counts["spin"] + counts["crash"] + counts["hang"] + counts["held"]
    out("badinput spin: " + ("FAIL" if bad else "PASS"))
    return {"bad": bad, "spin": counts["spin"], "crash": counts["crash"], "hang": counts["hang"], "held": counts["held"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, ".build", "debug", "herald-lab"))
    ap.add_argument("--connections", type=int, default=20, help="attacking connections per service")
    ap.add_argument("--sandbox", default=os.path.join(REPO, ".build", "badinput"))
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"badinput spin: {binary} not found; run swift build first")
    os.makedirs(args.sandbox, exist_ok=True)
    return 1 if run(binary, os.path.abspath(args.sandbox), connections=args.connections)["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
