#!/usr/bin/env python3
"""WebSocket echo benchmark: a Weir worker echo against a plain
tokio-tungstenite echo server (the ceiling, no Wasm).

Each server is loaded by the same generator (bench/ws-echo's `ws-load`, a
Rust client): SOCKETS sockets, each sending a SIZE-byte text message and
waiting for its echo, in a loop. Prints round trips per second and the
p50/p99 round-trip latency, and the ratio to the ceiling. The servers are
measured --rounds times, interleaved and every other round reversed, and
the median round is reported.

Weir's actor echo and workerd's Durable Object echo join this script with
hibernatable actor sockets (issue 11's remaining part).

Usage: python3 bench/websockets.py [--rounds 3] [--duration 10] [--sockets 100] [--size 32]
"""

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not listen")


def build():
    subprocess.run(["cargo", "build", "--release", "-p", "weir", "-p", "ws-echo"],
                   cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip2", "-p", "sockets"],
                   cwd=ROOT / "guests", check=True)


def start_weir(port, data, sockets):
    guest = ROOT / "guests/target/wasm32-wasip2/release/sockets.wasm"
    proc = subprocess.Popen(
        [str(RELEASE / "weir"), "serve", str(guest), "--listen", f"127.0.0.1:{port}",
         "--data-dir", data, "--limit", f"max_concurrent={max(sockets, 32)}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, f"ws://127.0.0.1:{port}/echo"


def start_ceiling(port, _data, _sockets):
    proc = subprocess.Popen([str(RELEASE / "ws-echo"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, f"ws://127.0.0.1:{port}/"


SERVERS = [
    ("weir worker echo", start_weir),
    ("tokio-tungstenite echo (ceiling)", start_ceiling),
]


def measure(start, args):
    port = free_port()
    data = tempfile.mkdtemp(prefix="weir-wsbench-")
    proc, url = start(port, data, args.sockets)
    try:
        # A short warm-up, then the measured run.
        subprocess.run([str(RELEASE / "ws-load"), url, str(args.sockets), "1", str(args.size)],
                       check=True, capture_output=True)
        out = subprocess.run(
            [str(RELEASE / "ws-load"), url, str(args.sockets), str(args.duration), str(args.size)],
            check=True, capture_output=True, text=True).stdout
        return json.loads(out)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--sockets", type=int, default=100)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--no-build", action="store_true")
    args = p.parse_args()
    if not args.no_build:
        build()
    results = {name: [] for name, _ in SERVERS}
    for r in range(args.rounds):
        order = SERVERS if r % 2 == 0 else list(reversed(SERVERS))
        for name, start in order:
            m = measure(start, args)
            results[name].append(m)
            print(f"round {r + 1}: {name}: {m['per_s']:.0f} msg/s, p50 {m['p50_us']} us, "
                  f"p99 {m['p99_us']} us, errors {m['errors']}", file=sys.stderr)
    median = {}
    for name, runs in results.items():
        runs = sorted(runs, key=lambda m: m["per_s"])
        median[name] = runs[len(runs) // 2]
    ceiling = median[SERVERS[-1][0]]["per_s"]
    print(f"{args.sockets} sockets, {args.size}-byte text echo, {args.duration:.0f} s, "
          f"median of {args.rounds} rounds")
    print(f"{'server':36} {'msg/s':>9} {'p50 us':>8} {'p99 us':>8} {'vs ceiling':>10}")
    for name, m in median.items():
        print(f"{name:36} {m['per_s']:9.0f} {m['p50_us']:8} {m['p99_us']:8} "
              f"{m['per_s'] / ceiling:9.2f}x")


if __name__ == "__main__":
    main()
