#!/usr/bin/env python3
"""Capability benchmark: key-value and SQL batch workloads through Weir.

Serves guests/kv (wasi:keyvalue over HTTP) and guests/sqlprobe (weir:sql
batches over HTTP) with `weir serve` on a fresh data dir, and loads each
with wrk and the Lua scripts in bench/wrk/:

- key-value get and set on one hot key and on 10,000 keys spread uniformly
  (the spread keys are written before they are read);
- a SQL batch of an INSERT plus a SELECT, and a one-statement point read;
- the hello guest on the same build, as the no-capability reference;
- a guest that prints: `guests/hostile` writing 4 lines of 1 KiB to its
  stderr per request (`/print?kb=4`), Weir's stderr into a file, with the
  bytes the log grew by per request.

Prints req/s, p50 and p99 per workload. Durability is the default
("process": each acknowledged write survives a crash of Weir).

Usage: python3 bench/capabilities.py [--duration 8] [--connections 32]
       [--baseline OLD_WEIR]   (an earlier build, each workload after this build's, with ratios)
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port, run_wrk_script, wait_ready  # noqa: E402

WRK = ROOT / "bench" / "wrk"


def serve_build(app, args, binary=None, env=None, log=None):
    port = free_port()
    proc = subprocess.Popen(
        [str(binary or ROOT / "target/release/weir"), "serve", str(app), "--listen", f"127.0.0.1:{port}", *args],
        stdout=log or subprocess.DEVNULL,
        stderr=log or subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    return port, proc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline", help="an earlier weir build, measured right after this one on each workload")
    args = ap.parse_args()

    subprocess.run(["cargo", "build", "--release", "-p", "weir"], cwd=ROOT, check=True)
    subprocess.run(
        ["cargo", "build", "--release", "--target", "wasm32-wasip2",
         "--manifest-path", str(ROOT / "guests/Cargo.toml"), "--target-dir", str(ROOT / "guests/target")],
        check=True,
    )
    builds = [("", None)]
    if args.baseline:
        builds.append((" [baseline]", args.baseline))
    rows = {}
    for label, binary in builds:
        rows[label] = measure(args, label, binary)
    if args.baseline:
        print("\nthis build / baseline:")
        for name, r in rows[""].items():
            b = rows[" [baseline]"][name]
            print(f"  {name:40} {r['rps'] / b['rps']:.2f}x req/s, p99 {r['p99']:.2f} vs {b['p99']:.2f} ms")
    print(f"\nwrk -t{args.threads} -c{args.connections} -d{args.duration}s")


def measure(args, label, binary):
    """Every workload on one build; the results by workload."""
    guests = ROOT / "guests/target/wasm32-wasip2/release"
    data = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    rows = {}

    def load(name, port, script=None, path="/"):
        r = run_wrk_script(port, args.duration, args.connections, args.threads,
                           str(WRK / script) if script else None, path)
        rows[name] = r
        print(f"{name + label:52} {r['rps']:>9.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms"
              + (f"  non-2xx {r['non2xx']}" if r["non2xx"] else ""), flush=True)

    def serve(app, extra, log=None):
        return serve_build(app, extra, binary, log=log)

    try:
        port, proc = serve(guests / "hello.wasm", [])
        try:
            wait_ready(port, proc)
            load("hello (no capability)", port)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

        port, proc = serve(guests / "kv.wasm", ["--data-dir", str(data), "--kv-store", "main"])
        try:
            wait_ready(port, proc, path="/kv/open?store=main")
            urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/kv/set?store=main&key=hot", data=b"v" * 64, method="PUT")).read()
            load("kv set, one hot key", port, "kv_set_hot.lua")
            load("kv get, one hot key", port, "kv_get_hot.lua")
            load("kv set, 10,000 keys", port, "kv_set_spread.lua")
            load("kv get, 10,000 keys", port, "kv_get_spread.lua")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

        port, proc = serve(guests / "sqlprobe.wasm", ["--data-dir", str(data), "--sql-database", "app"])
        try:
            wait_ready(port, proc, method="POST", path="/batch",
                       body=json.dumps({"db": "app", "statements": [
                           {"sql": "CREATE TABLE IF NOT EXISTS items (k INTEGER, v TEXT)", "params": []},
                           {"sql": "CREATE INDEX IF NOT EXISTS items_k ON items (k)", "params": []},
                       ]}).encode())
            load("sql batch: insert + count", port, "sql_batch.lua")
            load("sql batch: point read", port, "sql_read.lua")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

        log_path = data / "weir.log"
        with open(log_path, "wb") as log:
            port, proc = serve(guests / "hostile.wasm", ["--data-dir", str(data / "print")], log=log)
            try:
                wait_ready(port, proc, path="/hello")
                name = "guest prints 4 x 1 KiB lines"
                load(name, port, path="/print?kb=4")
                # What one such request adds to the log: 200 of them, one
                # after another, once the load's lines are written out.
                time.sleep(0.5)
                before = log_path.stat().st_size
                for _ in range(200):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/print?kb=4").read()
                time.sleep(0.5)
                grew = (log_path.stat().st_size - before) / 200
                print(f"{'  log bytes per request' + label:52} {grew:>9.0f}", flush=True)
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                proc.wait()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main()
