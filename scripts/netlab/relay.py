#!/usr/bin/env python3
"""An L2 relay between two interfaces (AF_PACKET), standing in for netem, which this kernel lacks.

    relay.py IF_A IF_B --delay-ms 20 --jitter-ms 5 --loss 0.01 --seed 1 [--stats FILE]

Every frame that arrives on one interface leaves on the other after a per-frame delay drawn
uniformly from [delay - jitter, delay + jitter] ms, unless it is dropped (probability --loss).
Frames keep their order in each direction (a frame never leaves before the one ahead of it).
It forwards whole Ethernet frames, so ARP, IPv6 neighbour discovery and everything else pass
through the same way. Both random streams come from --seed. Statistics are written to --stats
(JSON) every second and on SIGTERM.

The interfaces should be up, promiscuous, without addresses of their own, and the hosts whose
traffic crosses the relay should not rely on checksum offload or segmentation offload (a frame read
from a packet socket carries an unfinished checksum then, and a 64 KB GSO frame cannot be sent
again as one); scripts/netlab/netlab.py turns those off.
"""
import argparse
import gc
import heapq
import json
import os
import random
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--jitter-ms", type=float, default=5.0)
    ap.add_argument("--loss", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats")
    args = ap.parse_args()

    # Forwarding is timing: no garbage-collector pauses (frames hold no cycles), and ahead of the
    # lab's own processes on a busy machine.
    gc.disable()
    try:
        os.nice(-10)
    except OSError:
        pass
    socks = {}
    for name in (args.a, args.b):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.bind((name, 0))
        s.setblocking(False)
        socks[name] = s
    other = {args.a: args.b, args.b: args.a}
    by_fd = {s.fileno(): name for name, s in socks.items()}
    # One generator per direction and purpose, so that traffic one way never shifts the other's draws.
    rng = {(name, what): random.Random(f"{args.seed}/{name}/{what}") for name in socks for what in ("delay", "loss")}
    last_due = {name: 0.0 for name in socks}
    queue = []  # (due, sequence, out interface, frame)
    seq = 0
    stats = {name: {"in": 0, "dropped": 0, "out": 0, "sendErrors": 0, "maxDelayMs": 0.0, "sumDelayMs": 0.0} for name in socks}
    lo, hi = (args.delay_ms - args.jitter_ms) / 1000.0, (args.delay_ms + args.jitter_ms) / 1000.0

    def write_stats():
        if args.stats:
            with open(args.stats + ".tmp", "w") as f:
                json.dump({"delayMs": args.delay_ms, "jitterMs": args.jitter_ms, "loss": args.loss, "seed": args.seed, "from": stats}, f)
            os.replace(args.stats + ".tmp", args.stats)

    running = [True]

    def stop(*_):
        running[0] = False
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    poller = select.epoll()
    for s in socks.values():
        poller.register(s.fileno(), select.EPOLLIN)
    next_stats = time.monotonic() + 1
    while running[0]:
        now = time.monotonic()
        timeout = 0.2
        if queue:
            timeout = max(0.0, min(timeout, queue[0][0] - now))
        try:
            events = poller.poll(timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd, _ in events:
            name = by_fd[fd]
            s = socks[name]
            while True:
                try:
                    frame, addr = s.recvfrom(65535)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break  # the interface went down
                if addr[2] == PACKET_OUTGOING:
                    continue  # our own transmission on this interface
                st = stats[name]
                st["in"] += 1
                if rng[(name, "loss")].random() < args.loss:
                    st["dropped"] += 1
                    continue
                delay = rng[(name, "delay")].uniform(lo, hi)
                due = max(now + delay, last_due[name])
                last_due[name] = due
                seq += 1
                heapq.heappush(queue, (due, seq, name, frame, now))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, src, frame, arrived = heapq.heappop(queue)
            st = stats[src]
            try:
                socks[other[src]].send(frame)
                st["out"] += 1
                d = (now - arrived) * 1000
                st["sumDelayMs"] += d
                st["maxDelayMs"] = max(st["maxDelayMs"], d)
            except OSError:
                st["sendErrors"] += 1
        if now >= next_stats:
            write_stats()
            next_stats = now + 1
    write_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
