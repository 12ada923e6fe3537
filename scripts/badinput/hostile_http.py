#!/usr/bin/env python3
"""Hostile network input for herald-lab's services (the HTTP part of make test-badinput).

Starts the real `herald-lab air`, `herald-lab coordinator` and `herald-lab agent` (token file,
loopback, folders in a sandbox) and throws seeded malformed and hostile requests at each over raw
sockets: bad JSON and wrong JSON types, huge, negative, repeated and conflicting Content-Length,
chunked bodies with bad sizes, huge and many headers, invalid UTF-8, encoded traversal in paths,
missing and wrong tokens, replayed and cross-agent requests, a few slow senders, and for the air
garbage, huge and mistyped newline-JSON lines. After each batch every service must answer its
health check within 2 s (the air: a TCP connection and a valid hello), no process may have died,
resident memory must stay under 2x its start + 50 MB, and nothing may change outside the
services' folders (the sandbox is listed before and after; a canary file outside must never come
back in an answer). At the end each service must exit on SIGTERM within 5 s.

Counts: inputs, crashes, hangs (a health check or SIGTERM not answered in time), escapes,
memory, forged log lines (inputs carry a line break and "forged"; no log line may start so). Bounded in time (--budget seconds of hostile traffic).
"""
import argparse
import collections
import errno
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
CANARY = "SECRET-CANARY-7f3a"


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
            out[r] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


class Service:
    def __init__(self, name, args, root, env):
        self.name = name
        self.port_file = os.path.join(root, f"{name}.port")
        self.log_path = os.path.join(root, "logs", f"{name}.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args + ["--port", "0", "--port-file", self.port_file], cwd=os.path.join(root, "cwd"),
                                     env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        self.rss_start = None

    def wait_listening(self, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with open(self.port_file) as f:
                    text = f.read().strip()
                if text:
                    self.port = int(text)
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def stop(self, seconds=5.0):
        """SIGTERM; True when it exited within `seconds` (else it is killed)."""
        if self.proc.poll() is not None:
            self.log.close()
            return True
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False
        finally:
            self.log.close()


def exchange(port, data, timeout=3.0, limit=1 << 20):
    """Connects, sends `data` (the peer may refuse part of it), ends the sending side, and reads
    until the peer closes. Returns (outcome, bytes read): outcome is the first answer's status
    ("400"), "closed" (ended without an answer), "reset", "refused" or "timeout"."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return "refused", b""
    s.settimeout(timeout)
    got = bytearray()
    outcome = None
    try:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except socket.timeout:
            outcome = "timeout"
        except OSError as e:
            # The peer refused the rest and closed (a reset can make even shutdown() fail with
            # ENOTCONN): what it answered before that is read below.
            if e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
        deadline = time.monotonic() + timeout
        while outcome is None and len(got) < limit and time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                outcome = "timeout"
                break
            except ConnectionResetError:
                outcome = "reset" if not got else None
                break
            if not chunk:
                break
            got += chunk
        else:
            if outcome is None and len(got) < limit and time.monotonic() >= deadline:
                outcome = "timeout"
    finally:
        s.close()
    if got.startswith(b"HTTP/1.") and len(got) >= 12:
        return got[9:12].decode("ascii", "replace"), bytes(got)
    if got:
        return "garbage-answer", bytes(got)
    return outcome or "closed", bytes(got)


def http_health(port, timeout=2.0):
    started = time.monotonic()
    outcome, body = exchange(port, b"GET /health HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout=timeout)
    return outcome == "200" and time.monotonic() - started <= timeout


def air_hello(port, token, timeout=2.0):
    """A TCP connection and a valid hello: the air answers hello ok within `timeout`."""
    started = time.monotonic()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return False
    s.settimeout(timeout)
    try:
        s.sendall((json.dumps({"t": "hello", "id": 1, "node": "badinput-probe", "token": token}) + "\n").encode())
        buf = b""
        while b"\n" not in buf and time.monotonic() - started <= timeout:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        line = buf.split(b"\n", 1)[0]
        reply = json.loads(line) if line else {}
        return reply.get("t") == "hello" and reply.get("ok") is True and time.monotonic() - started <= timeout
    except (OSError, ValueError):
        return False
    finally:
        s.close()


# MARK: HTTP inputs

def request(method, path, headers=(), body=b"", version="HTTP/1.1", host=True):
    head = f"{method} {path} {version}\r\n".encode("latin-1") if isinstance(path, str) else method.encode() + b" " + path + b" " + version.encode() + b"\r\n"
    if host:
        head += b"Host: badinput\r\n"
    for h in headers:
        head += (h if isinstance(h, bytes) else h.encode("latin-1")) + b"\r\n"
    return head + b"\r\n" + body


def auth(ctx):
    return f"Authorization: Bearer {ctx['token']}"


def json_body(method, path, ctx, body, extra=()):
    return request(method, path, [auth(ctx), "Content-Type: application/json", f"Content-Length: {len(body)}", *extra], body)


def random_bytes(rng, n):
    return bytes(rng.getrandbits(8) for _ in range(n))


def gen_bad_json(rng, ctx):
    bodies = [b"{", b"[]", b"null", b"\"x\"", b"{\"name\":", b"{\"a\":1}}", b"\xff\xfe{}", b"{\"name\": \"a\0b\"}",
              b"{" + b"\"k\":1," * rng.randint(1, 5000) + b"\"z\":2}", random_bytes(rng, rng.randint(1, 2000)),
              b"[" * rng.choice([100, 5000, 100000]) + b"]" * rng.choice([0, 100]),
              b"{\"a\":" * rng.choice([1000, 50000]) + b"1" + b"}" * 10]
    path = rng.choice(ctx["post_routes"])
    return "bad json", json_body("POST", path, ctx, rng.choice(bodies))


def gen_wrong_types(rng, ctx):
    values = [5, -1, 1e308, -1e308, "x" * rng.randint(0, 3000), [], {}, None, True, [1, "a", None], {"$ref": "../../etc"}]
    fields = ["name", "url", "port", "tags", "radio", "adapter", "version", "state", "runId", "startAt", "assignment", "air",
              "node", "seed", "duration", "host", "gaps", "held", "x", "y"]
    obj = {rng.choice(fields): rng.choice(values) for _ in range(rng.randint(1, 6))}
    body = json.dumps(obj).encode()
    path = rng.choice(ctx["post_routes"])
    return "wrong json types", json_body("POST", path, ctx, body)


def gen_content_length(rng, ctx):
    path = rng.choice(ctx["post_routes"])
    variants = [
        ["Content-Length: 99999999999999999999999999"], ["Content-Length: 9223372036854775807"], ["Content-Length: -1"],
        ["Content-Length: -99999999999"], ["Content-Length: 1e3"], ["Content-Length: 0x20"], ["Content-Length: 5, 7"],
        ["Content-Length: 5", "Content-Length: 5"], ["Content-Length: 5", "Content-Length: 6"], ["Content-Length: "],
        ["Content-Length: 5", "Transfer-Encoding: chunked"], ["Transfer-Encoding: chunked", "Content-Length: 0"],
        [f"Content-Length: {200 << 20}"], [f"Content-Length: {rng.randint(1 << 20, 1 << 40)}"], ["Content-Length: +10"],
        ["Content-Length: 10"],  # shorter body than claimed
        [f"Content-Length: {2 << 20}", "Expect: 100-continue"],
    ]
    return "content-length", request("POST", path, [auth(ctx)] + rng.choice(variants), b"{\"a\": 1}")


def gen_chunked(rng, ctx):
    path = rng.choice(ctx["post_routes"])
    bodies = [b"zz\r\n", b"-1\r\nx\r\n0\r\n\r\n", b"ffffffffffffffffffff\r\n", b"7fffffffffffffff\r\n", b"C800000\r\n" + b"a" * 4096,
              b"5\r\nhelloEXTRA\r\n0\r\n\r\n", b"5\nhello\n0\n\n", b"5;" + b"e" * 5000 + b"\r\nhello\r\n0\r\n\r\n",
              b"0\r\n" + b"X-T: v\r\n" * 3000 + b"\r\n", b"3\r\n{}\n\r\n0\r\n\r\n", b"\r\n\r\n", random_bytes(rng, 300),
              b"".join(b"1\r\n{\r\n" for _ in range(rng.randint(1, 3000))) + b"0\r\n\r\n",
              b"100000\r\n" + b"[" * 4000]
    te = rng.choice(["Transfer-Encoding: chunked", "Transfer-Encoding: Chunked", "Transfer-Encoding: gzip, chunked",
                     "Transfer-Encoding: chunked, chunked", "Transfer-Encoding:  chunked "])
    return "chunked", request("POST", path, [auth(ctx), te], rng.choice(bodies))


def gen_huge_headers(rng, ctx):
    kind = rng.randint(0, 4)
    if kind == 0:
        size = rng.choice([17 * 1024, 64 * 1024, 256 * 1024, 1 << 20])
        return "huge header", request("GET", "/health", [f"X-Big: {'a' * size}"])
    if kind == 1:
        n = rng.choice([101, 500, 5000])
        return "many headers", request("GET", "/health", [f"X-{i}: {i}" for i in range(n)])
    if kind == 2:
        return "huge request line", request("GET", "/v1/" + "a" * rng.choice([9000, 70000, 1 << 20]), [auth(ctx)])
    if kind == 3:
        return "huge header name", request("GET", "/health", ["X" * rng.choice([20000, 100000]) + ": 1"])
    return "empty lines", b"\r\n" * rng.choice([10, 10000]) + request("GET", "/health", [])


def gen_invalid_utf8(rng, ctx):
    bad = random_bytes(rng, 8).replace(b"\r", b"").replace(b"\n", b"") + b"\xc3\x28\xff"
    where = rng.randint(0, 3)
    if where == 0:
        return "invalid utf-8", b"GET /v1/" + bad + b" HTTP/1.1\r\nHost: h\r\n\r\n"
    if where == 1:
        return "invalid utf-8", b"GET /health HTTP/1.1\r\nHost: h\r\nX-A: " + bad + b"\r\n\r\n"
    if where == 2:
        return "invalid utf-8", b"G\xffT /health HTTP/1.1\r\nHost: h\r\n\r\n"
    return "invalid utf-8", b"GET /health HTTP/1.1\r\nHost: h\r\n" + bad + b": v\r\n\r\n"


def gen_garbage(rng, ctx):
    options = [random_bytes(rng, rng.randint(1, 5000)), b"GET /\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
               bytes.fromhex("16030100a5010000a103035b") + random_bytes(rng, 150), b"\x00" * 100, b"GET /health HTTP/1.1\r\n",
               b"GET /health HTTP/1.1\nHost: h\n\n", b"GET /health HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n",
               b"GET /health HTTP/9.9\r\nHost: h\r\n\r\n", b"GET /health\r\n\r\n", b"GET  /health  HTTP/1.1\r\n\r\n",
               b"GET /health HTTP/1.1\r\nHost: h\r\n\r\n" * 50 + b"GET /health HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
               b"GET /v1/x HTTP/1.1\r\nHost: h\r\n\r\n" * 3000]
    return "garbage", rng.choice(options)


def gen_methods(rng, ctx):
    method = rng.choice(["OPTIONS", "TRACE", "CONNECT", "get", "PROPFIND", "M" * 5000, "G\x00T", "DELETE", "PUT", "PATCH", ""])
    return "method", request(method, rng.choice(["/health", "/v1/status", "/v1/agents", "*", "http://evil/"]), [auth(ctx)])


def gen_traversal(rng, ctx):
    paths = ["/v1/runs/..%2f..%2fetc/files", "/v1/runs/%2e%2e/files/contacts.csv", "/v1/runs/%252e%252e/files/contacts.csv",
             "/v1/runs/x/files/..%2f..%2f..%2foutside%2fsecret.csv", "/v1/runs/../../outside/secret.csv",
             "/v1/runs/..%5c..%5coutside/files/contacts.csv", "/v1/runs/%c0%ae%c0%ae/files/contacts.csv",
             "/v1/runs/%2e%2e%2f%2e%2e%2f%2e%2e%2foutside%2fsecret.csv/bundle", "/v1/runs/.%2e/files/detection.csv",
             "/v1/runs/..%252f..%252foutside/files/contacts.csv", "/v1/runs/%00/files/contacts.csv",
             "/v1/runs/" + "..%2f" * 20 + "outside%2fsecret.csv/files/contacts.csv", "//outside/secret.csv",
             "/v1/runs/abc/files/..", "/v1/runs/abc/files/%2e%2e%2f%2e%2e%2fsecret.csv", "/%2e%2e/%2e%2e/outside/secret.csv",
             "/v1/runs/abc/files/contacts.csv%00.txt", "/v1/runs/x%0D%0Aforged%20line/files", "/v1/x%0Aforged%20line", "/v1/runs/x/files/" + ctx["outside_abs"].replace("/", "%2f")]
    path = rng.choice(paths)
    headers = [auth(ctx)] if rng.random() < 0.8 else []
    if rng.random() < 0.3:
        headers.append(rng.choice(["Range: bytes=0-", "Range: bytes=-5", "Range: bytes=99999999999999999999-", "Range: bytes=5-1"]))
    return "traversal", request(rng.choice(["GET", "POST", "HEAD"]), path, headers)


def gen_auth(rng, ctx):
    token = ctx["token"]
    variants = [[], ["Authorization: Bearer wrong-token-wrong-token"], ["Authorization: Bearer "], [f"Authorization: bearer {token}"],
                [f"Authorization: Bearer {token}x"], [f"Authorization: Bearer {token[:-1]}"], [f"Authorization: Basic {token}"],
                [f"Authorization: Bearer {token}", f"Authorization: Bearer {token}"], [f"Authorization: Bearer  {token}"],
                [f"Authorization:Bearer {token}"], ["Authorization: Bearer " + "A" * 10000]]
    path = rng.choice(ctx["get_routes"] + ["/v1/no-such-route", "/v1/runs/x/files", "/"])
    return "token", request(rng.choice(["GET", "POST"]), path, rng.choice(variants))


def gen_replay(rng, ctx):
    if ctx["kind"] == "coordinator":
        name = rng.choice([ctx["agent"], "ghost", "a" * 300, "../../x", "n\r\nforged"])
        status = {"name": name, "state": rng.choice(["idle", "running", "nonsense", 5]), "held": rng.choice([[], ["x"] * 1000, None])}
        if rng.random() < 0.5:
            # Heartbeat clock stamps (docs/API.md): numbers that are not times, a counter out of range.
            status["boot"] = rng.choice(["boot-0001", "x", None])
            status["sequence"] = rng.choice([1, 2**64, -1, "1"])
            status["clock"] = rng.choice([{"sequence": rng.choice([0, 1, 2**64, -1, "x"]), "sent": rng.choice([1e308, -5, 0, time.time(), "x", None]),
                                           "answered": rng.choice([-1e308, time.time() - 60, time.time() + 7200, 1e11, []])}, "clock", [], None])
        if rng.random() < 0.5:
            body = json.dumps(status).encode()
            return "cross-agent heartbeat", json_body("POST", f"/v1/agents/{rng.choice([ctx['agent'], 'ghost', '%2e%2e'])}/heartbeat", ctx, body)
        info = {"name": name, "url": rng.choice(["http://127.0.0.1:1", "file:///etc/passwd", "http://[::1", "x" * 5000]),
                "port": rng.choice([0, 1, 65535, -1, 70000]), "tags": ["t"] * rng.randint(0, 2000), "radio": rng.choice(["sim", "bluez", "x"])}
        return "replayed registration", json_body("POST", "/v1/agents/register", ctx, json.dumps(info).encode())
    route = rng.choice(["/v1/arm", "/v1/start", "/v1/runs/r1/stop", "/v1/runs/r1/release", "/v1/clock"])
    body = rng.choice([b"{}", json.dumps({"runId": "r1", "startAt": rng.choice([0, 1e18, -5, time.time()])}).encode(),
                       json.dumps({"assignment": {"node": "../x", "runId": "../../outside"}, "air": {"host": "127.0.0.1", "port": 1}}).encode()])
    return "replayed agent call", json_body("POST", route, ctx, body)


def gen_plans(rng, ctx):
    if ctx["kind"] != "coordinator":
        return gen_bad_json(rng, ctx)
    bodies = [b"name: x\nduration: 1s\nnodes: {count: 100000000}\n", b"a: &a [*a]\n", b"name: " + b"[" * 10000,
              b"\t\x00\xff", b"name: ../../outside\nduration: 10s\nnodes: [{name: ../x}]\n",
              b"lol: &l [x,x,x,x,x,x,x,x]\nl2: &l2 [*l,*l,*l,*l,*l,*l,*l,*l]\nl3: &l3 [*l2,*l2,*l2,*l2,*l2,*l2,*l2,*l2]\nl4: [*l3,*l3,*l3,*l3,*l3,*l3,*l3,*l3]\n",
              random_bytes(rng, 3000)]
    query = rng.choice(["", "?name=../../outside/x", "?name=%00", "?name=" + "q" * 3000, "?%zz"])
    body = rng.choice(bodies)
    return "plan", request("POST", "/v1/runs" + query, [auth(ctx), f"Content-Length: {len(body)}"], body)


HTTP_GENERATORS = [gen_bad_json, gen_wrong_types, gen_content_length, gen_chunked, gen_huge_headers, gen_invalid_utf8,
                   gen_garbage, gen_methods, gen_traversal, gen_auth, gen_replay, gen_plans]


# MARK: air inputs

def gen_air(rng, ctx):
    token = ctx["token"]
    hello = json.dumps({"t": "hello", "id": 1, "node": "hostile", "token": token}).encode() + b"\n"
    kind = rng.randint(0, 9)
    if kind == 0:
        return "garbage line", random_bytes(rng, rng.randint(1, 3000)).replace(b"\n", b"") + b"\n"
    if kind == 1:
        return "invalid utf-8 line", b"{\"t\": \"hello\", \"node\": \"\xff\xfe\", \"token\": \"" + token.encode() + b"\"}\n"
    if kind == 2:
        size = rng.choice([200_000, 900_000, 2_000_000])
        return "huge line", b"{\"t\": \"" + b"a" * size + (b"\"}\n" if rng.random() < 0.5 else b"")
    if kind == 3:
        return "wrong types", json.dumps(rng.choice([{"t": 5}, {"t": "hello", "x": "a", "token": token}, {"t": "hello", "token": 123},
                                                      {"t": ["hello"]}, [], "hello", {"t": "hello", "id": "1", "token": token}])).encode() + b"\n"
    if kind == 4:
        return "hello without token", rng.choice([b"{\"t\":\"hello\",\"node\":\"x\"}\n", b"{\"t\":\"hello\",\"token\":\"wrong-wrong-wrong\"}\n",
                                                  b"{\"t\":\"hello\",\"token\":\"\"}\n"])
    if kind == 5:
        return "messages before hello", b"{\"t\":\"connect\",\"address\":\"x\"}\n{\"t\":\"read\"}\n{\"t\":\"register\"}\n"
    if kind == 6:
        msgs = [{"t": "connect", "id": 2, "address": "nowhere", "timeout": rng.choice([0, -1, 1e308, 0.01])},
                {"t": "read", "id": 3, "address": "x", "service": "not-a-uuid", "characteristic": "zz"},
                {"t": "register", "id": 4, "services": [{"uuid": "x", "characteristics": [["y", "read"]] * 50}], "values": {"a": "%%%"}},
                {"t": "values", "values": {"0000": "!!notbase64!!"}},
                {"t": "startAdvertising", "id": 5, "uuids": ["x"] * rng.choice([1, 5000]), "mfr": {"99999999": "AAAA"}, "interval": -1},
                {"t": "write", "id": 6, "address": "y", "service": "180A", "characteristic": "2A29", "value": "AAAA", "withResponse": True},
                {"t": "discover", "id": 7, "address": "z"}, {"t": "startScanning", "id": 8}, {"t": "powerOn", "id": 9},
                {"t": "hello", "id": 10, "node": "hostile", "token": token, "x": 1e308, "y": -1e308}]
        rng.shuffle(msgs)
        return "hostile messages after hello", hello + b"".join(json.dumps(m).encode() + b"\n" for m in msgs[:rng.randint(1, len(msgs))])
    if kind == 7:
        return "deep nesting", b"[" * rng.choice([1000, 100000]) + b"\n"
    if kind == 8:
        return "many lines", b"{\"t\":\"tick\"}\n" * rng.randint(100, 3000)
    name = rng.choice(["n\nforged", "a" * 10000, "../../x", ""])
    return "odd node names", json.dumps({"t": "hello", "id": 1, "node": name, "token": token}).encode() + b"\n"


# MARK: the run

def slow_sender(port, data, pause, stop):
    """Sends `data` a byte at a time with pauses until done or told to stop."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return
    try:
        for b in data:
            if stop.is_set():
                break
            s.sendall(bytes([b]))
            time.sleep(pause)
    except OSError:
        pass
    finally:
        s.close()


def run(binary, seed, sandbox, requests=1000, budget=90.0, batches=5, out=print):
    """Runs the hostile part; returns counts {inputs, crash, hang, escape, memory}."""
    started = time.monotonic()
    rng = random.Random(seed)
    root = os.path.join(sandbox, "http")
    if os.path.exists(root):
        shutil.rmtree(root)
    for d in ["cwd", "logs", "coordinator", "agent", "tmp", "outside"]:
        os.makedirs(os.path.join(root, d))
    token = "".join(rng.choice("0123456789abcdef") for _ in range(64))
    token_file = os.path.join(root, "token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    outside = os.path.join(root, "outside", "secret.csv")
    with open(outside, "w") as f:
        f.write(f"time,sensor,id\n2020-12-08 23:00:00,BLE,{CANARY}\n")
    env = dict(os.environ, TMPDIR=os.path.join(root, "tmp"))
    env.pop("HERALDLAB_TOKEN", None)
    allowed = ["coordinator", "agent", "logs"] + [f"{n}.port" for n in ["air", "coordinator", "agent"]]
    before = listing(root, skip=allowed)

    counts = collections.Counter()
    outcomes = {k: collections.Counter() for k in ["coordinator", "agent", "air"]}
    failures = []
    services = {}
    try:
        attack(binary, rng, root, env, token, token_file, outside, requests, budget, batches, started, counts, outcomes, failures, services)
    finally:
        # Every service must still be running, and must exit on SIGTERM within 5 s.
        for name, s in services.items():
            s.rss_end = rss_mb(s.proc.pid) if s.proc.poll() is None else None
            if s.proc.poll() is not None:
                if not any(f.startswith(name) for f in failures):
                    counts["crash"] += 1
                    failures.append(f"{name} exited with {s.proc.returncode} (log: {s.log_path})")
                s.stop()
            elif not s.stop(5.0):
                counts["hang"] += 1
                failures.append(f"{name}: did not exit within 5 s of SIGTERM")
    return finish(counts, outcomes, failures, services, root, before, allowed, started, seed, out)


def attack(binary, rng, root, env, token, token_file, outside, requests, budget, batches, started, counts, outcomes, failures, services):
    services["air"] = Service("air", [binary, "air", "--token-file", token_file], root, env)
    if not services["air"].wait_listening():
        failures.append("air: did not start")
        counts["crash"] += 1
        return
    air = f"127.0.0.1:{services['air'].port}"
    services["coordinator"] = Service("coordinator", [binary, "coordinator", "--token-file", token_file, "--results",
                                                      os.path.join(root, "coordinator"), "--air", air], root, env)
    if not services["coordinator"].wait_listening():
        failures.append("coordinator: did not start")
        counts["crash"] += 1
        return
    services["agent"] = Service("agent", [binary, "agent", "--name", "hostile1", "--token-file", token_file, "--data",
                                          os.path.join(root, "agent"), "--coordinator", f"http://127.0.0.1:{services['coordinator'].port}",
                                          "--air", air], root, env)
    if not services["agent"].wait_listening():
        failures.append("agent: did not start")
        counts["crash"] += 1
        return
    time.sleep(0.5)
    for name, s in services.items():
        ok = air_hello(s.port, token) if name == "air" else http_health(s.port)
        if not ok:
            failures.append(f"{name}: no health answer before any input")
            counts["hang"] += 1
        s.rss_start = rss_mb(s.proc.pid)

    contexts = {
        "coordinator": {"kind": "coordinator", "token": token, "agent": "hostile1", "outside_abs": outside,
                        "post_routes": ["/v1/agents/register", "/v1/agents/hostile1/heartbeat", "/v1/agents/ghost/heartbeat", "/v1/runs",
                                        "/v1/runs/r1/cancel", "/v1/runs/r1/abort", "/v1/runs/r1/gather"],
                        "get_routes": ["/v1/agents", "/v1/runs", "/v1/runs/r1", "/v1/runs/r1/bundle", "/health"]},
        "agent": {"kind": "agent", "token": token, "agent": "hostile1", "outside_abs": outside,
                  "post_routes": ["/v1/clock", "/v1/arm", "/v1/start", "/v1/runs/r1/stop", "/v1/runs/r1/release"],
                  "get_routes": ["/v1/status", "/v1/runs", "/v1/runs/r1/files", "/v1/runs/r1/files/contacts.csv", "/health"]},
        "air": {"kind": "air", "token": token},
    }
    # Inputs, generated from the seed before anything is sent (deterministic).
    plan = {}
    for name in ["coordinator", "agent"]:
        plan[name] = [HTTP_GENERATORS[i % len(HTTP_GENERATORS)](rng, contexts[name]) for i in range(requests)]
        rng.shuffle(plan[name])
    plan["air"] = [gen_air(rng, contexts["air"]) for _ in range(requests)]

    # A few slow senders during the first two batches: a head (or a line) a byte every 0.1 s.
    stop = threading.Event()
    slow = []
    for name in ["coordinator", "agent", "air"]:
        for _ in range(3):
            data = (b"POST /v1/runs HTTP/1.1\r\nHost: h\r\nX-Slow: " + b"s" * 40) if name != "air" else b"{\"t\": \"hello\", \"node\": \"" + b"s" * 40
            t = threading.Thread(target=slow_sender, args=(services[name].port, data, 0.1, stop), daemon=True)
            t.start()
            slow.append(t)
            counts["inputs"] += 1
            outcomes[name]["slow sender"] += 1

    per_batch = (requests + batches - 1) // batches
    try:
        for b in range(batches):
            if time.monotonic() - started > budget:
                failures.append(f"(time budget of {budget:.0f} s spent after {b} batches: fewer inputs, not a failure)")
                break
            for name in ["coordinator", "agent", "air"]:
                port = services[name].port
                for kind, data in plan[name][b * per_batch:(b + 1) * per_batch]:
                    outcome, answer = exchange(port, data, timeout=3.0)
                    counts["inputs"] += 1
                    outcomes[name][outcome if name != "air" else ("reply" if answer else outcome)] += 1
                    if CANARY.encode() in answer:
                        counts["escape"] += 1
                        failures.append(f"{name}: the canary came back for {kind}: {data[:120]!r}")
            if b == 1:
                stop.set()
            # After each batch: alive, healthy within 2 s, memory bounded.
            for name, s in services.items():
                if s.proc.poll() is not None:
                    counts["crash"] += 1
                    how = "status 0, as after SIGTERM or SIGINT" if s.proc.returncode == 0 else f"status {s.proc.returncode}"
                    failures.append(f"{name}: exited ({how}) during batch {b + 1} (log: {s.log_path})")
                    return
                ok = air_hello(s.port, token) if name == "air" else http_health(s.port)
                if not ok:
                    counts["hang"] += 1
                    failures.append(f"{name}: no health answer within 2 s after batch {b + 1}")
                rss = rss_mb(s.proc.pid)
                if rss is not None and s.rss_start is not None and rss > 2 * s.rss_start + 50:
                    counts["memory"] += 1
                    failures.append(f"{name}: resident memory {rss:.0f} MB after batch {b + 1} (started at {s.rss_start:.0f} MB)")
    finally:
        stop.set()
        for t in slow:
            t.join(timeout=5)


def finish(counts, outcomes, failures, services, root, before, allowed, started, seed, out):
    after = listing(root, skip=allowed)
    escapes = sorted(p for p in after if p not in before or after[p] != before[p])
    escapes = [p for p in escapes if not p.startswith("cwd" + os.sep + ".") and p != "cwd"]
    counts["escape"] += len(escapes)
    for p in escapes[:20]:
        failures.append(f"written outside the services' folders: {p}")
    # Inputs carry "forged" after a line break (paths, node names): no log line may start with it.
    for s in services.values():
        try:
            with open(s.log_path, "rb") as f:
                forged = [line for line in f if line.startswith(b"forged")]
        except OSError:
            forged = []
        if forged:
            counts["forged"] += len(forged)
            failures.append(f"{s.name}: {len(forged)} forged log line(s), such as {forged[0][:100]!r}")
    elapsed = time.monotonic() - started
    out(f"badinput http: seed {seed}, {counts['inputs']} inputs over raw sockets, {elapsed:.0f} s")
    for name in ["coordinator", "agent", "air"]:
        o = outcomes[name]
        n = sum(o.values())
        if not n:
            continue
        parts = ", ".join(f"{k} {v}" for k, v in sorted(o.items(), key=lambda kv: (-kv[1], kv[0])))
        extra = ""
        s = services.get(name)
        if s is not None and s.rss_start is not None:
            end = getattr(s, "rss_end", None)
            extra = f"; RSS {s.rss_start:.0f} -> {end:.0f} MB" if end is not None else f"; RSS {s.rss_start:.0f} MB at start"
        out(f"  {name:<11} {n:5d} inputs: {parts}{extra}")
    out(f"  crashes {counts['crash']}, hangs {counts['hang']}, escapes {counts['escape']}, memory {counts['memory']}, forged log lines {counts['forged']}")
    for f in failures[:20]:
        out("  " + f)
    bad = counts["crash"] + counts["hang"] + counts["escape"] + counts["memory"] + counts["forged"]
    out("badinput http: " + ("FAIL" if bad else "PASS"))
    return {"inputs": counts["inputs"], "crash": counts["crash"], "hang": counts["hang"], "escape": counts["escape"],
            "memory": counts["memory"], "forged": counts["forged"], "bad": bad}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, ".build", "debug", "herald-lab"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=1000, help="inputs per service")
    ap.add_argument("--budget", type=float, default=90, help="seconds of hostile traffic at most")
    ap.add_argument("--sandbox", default=os.path.join(REPO, ".build", "badinput"))
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"badinput http: {binary} not found; run swift build first")
    os.makedirs(args.sandbox, exist_ok=True)
    result = run(binary, args.seed, os.path.abspath(args.sandbox), requests=args.requests, budget=args.budget)
    return 1 if result["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
