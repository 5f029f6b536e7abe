#!/usr/bin/env python3
"""Crash soak for durable actors: many SIGKILL cycles under a write stream.

Each cycle starts `weir serve` (gateway worker + actor-probe class) on the
same data dir, checks every actor, then lets writers stream `POST /pair?i=N`
(one turn writing `x:N` and `y:N`) to several actors and kills the server
with SIGKILL at a random moment. The check after each restart:

- every write acknowledged (200 with its N) before the kill is present;
- no turn is half applied: the set of N with `x:N` equals the set with `y:N`.

Usage: python3 bench/soak_actors.py [--cycles 200] [--actors 8] [--writers 16]
"""

import argparse
import http.client
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port, wait_ready  # noqa: E402


def start(data):
    port = free_port()
    guests = ROOT / "guests/target/wasm32-wasip2/release"
    proc = subprocess.Popen(
        [str(ROOT / "target/release/weir"), "serve", str(guests / "gateway.wasm"),
         "--actor", f"probe={guests / 'actor_probe.wasm'}",
         "--listen", f"127.0.0.1:{port}", "--data-dir", str(data)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_ready(port, proc, path="/probe/soak-ready/whoami")
    return port, proc


def check(port, actor, acked):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", f"/probe/{actor}/pairs")
    r = c.getresponse()
    body = r.read()
    if r.status != 200:
        raise SystemExit(f"{actor}: /pairs answered {r.status}: {body[:200]!r}")
    v = json.loads(body)
    x, y = set(v["x"]), set(v["y"])
    if x != y:
        raise SystemExit(f"{actor}: half-applied turns: x-only {sorted(x - y)[:10]}, y-only {sorted(y - x)[:10]}")
    lost = acked - x
    if lost:
        raise SystemExit(f"{actor}: acknowledged writes lost: {sorted(lost)[:10]}")
    return len(x)


def writer(port, actor, counter, lock, acked, killed, failures, gap_ms):
    """Writes pairs until the kill. Every answer must acknowledge its write;
    the only failure allowed is a transport error once `killed` is set."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while True:
            with lock:
                i = counter[actor]
                counter[actor] += 1
            c.request("POST", f"/probe/{actor}/pair?i={i}&gap_ms={gap_ms}", body=b"")
            r = c.getresponse()
            body = r.read()
            if r.status == 200 and body == str(i).encode():
                with lock:
                    acked[actor].add(i)
            else:
                failures.append(f"{actor}: write {i} answered {r.status} {body[:200]!r}")
                return
    except (OSError, http.client.HTTPException) as e:
        if not killed.is_set():
            failures.append(f"{actor}: transport error before the kill: {e!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--max-run-ms", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--gap-ms", type=int, default=5,
                    help="pause between a pair's two writes, so kills land between them")
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-p", "weir"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip2",
                    "--manifest-path", str(ROOT / "guests/Cargo.toml"),
                    "--target-dir", str(ROOT / "guests/target")], check=True)
    rng = random.Random(args.seed)
    data = Path(tempfile.mkdtemp(prefix="weir-soak-"))
    actors = [f"s{i}" for i in range(args.actors)]
    counter = {a: 0 for a in actors}
    acked = {a: set() for a in actors}
    lock = threading.Lock()
    started = time.time()
    cycles_with_writes = 0
    try:
        for cycle in range(args.cycles):
            port, proc = start(data)
            stored = sum(check(port, a, acked[a]) for a in actors)
            killed = threading.Event()
            failures = []
            before = sum(len(s) for s in acked.values())
            threads = [threading.Thread(target=writer, args=(port, actors[w % len(actors)], counter, lock, acked,
                                                             killed, failures, args.gap_ms))
                       for w in range(args.writers)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.01, args.max_run_ms / 1000))
            killed.set()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            for t in threads:
                t.join()
            if failures:
                raise SystemExit(f"cycle {cycle + 1}: {failures[0]}")
            if sum(len(s) for s in acked.values()) > before:
                cycles_with_writes += 1
            if cycle % 20 == 0 or cycle == args.cycles - 1:
                total = sum(len(s) for s in acked.values())
                print(f"cycle {cycle + 1}/{args.cycles}: {total} acknowledged writes so far, {stored} pairs stored at start",
                      flush=True)
        port, proc = start(data)
        stored = sum(check(port, a, acked[a]) for a in actors)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    total = sum(len(s) for s in acked.values())
    if cycles_with_writes * 2 <= args.cycles:
        raise SystemExit(f"only {cycles_with_writes} of {args.cycles} cycles acknowledged writes")
    print(f"ok: {args.cycles} SIGKILL cycles in {time.time() - started:.0f} s ({cycles_with_writes} with acknowledged "
          f"writes), {total} acknowledged pair writes all present, {stored} pairs stored, none half applied")


if __name__ == "__main__":
    main()
