#!/usr/bin/env python3
"""Actor benchmark: Weir's durable actors next to workerd's Durable Objects.

Runs, in the same session on the same machine:

- one hot actor, get + put per request, reached through a worker: Weir's
  `gateway` worker calling the `actor-probe` class (`POST /incr`), and
  workerd serving a Durable Object counter of the same shape
  (bench/workerd/counter.js, storage on local disk);
- 1,000 actors chosen uniformly at random, the same shape, on both;
- wake from hibernation (Weir): N actors are touched once, left to
  hibernate (`actor_idle_ms`), then each is called once more; the latency
  of those first calls is reported next to warm calls on the same path;
- memory: the server's RSS with 10,000 live actors and after they have all
  hibernated, per actor.

workerd comes from npm (@cloudflare/workerd-linux-64); without it (or with
--no-workerd) only Weir's figures are printed.

Usage: python3 bench/actors.py [--duration 8] [--connections 32]
       python3 bench/actors.py --baseline OTHER/weir [--rounds 3] [--timers]
         (this build against another on the hot and 1,000-actor loads, and
         with --timers on loads whose every request schedules a timer due
         at once; rate, p99 and server CPU per request)
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port, run_wrk_script, wait_ready  # noqa: E402

WRK = ROOT / "bench" / "wrk"
WORKERD_PKG = "@cloudflare/workerd-linux-64"


def find_workerd(cache):
    """workerd from npm, installed once under `cache`."""
    binary = cache / "node_modules" / WORKERD_PKG / "bin" / "workerd"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache), WORKERD_PKG],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"workerd not available: {r.stderr.strip()[:200]}")
            return None
    return binary


def start_workerd(binary, workdir):
    port = free_port()
    storage = workdir / "do-storage"
    storage.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "bench/workerd/counter.js", workdir / "counter.js")
    (workdir / "config.capnp").write_text(f'''
using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .counter),
    (name = "storage", disk = (path = "{storage}", writable = true)),
  ],
  sockets = [(name = "http", address = "127.0.0.1:{port}", http = (), service = "main")],
);
const counter :Workerd.Worker = (
  compatibilityDate = "2024-09-01",
  modules = [(name = "counter.js", esModule = embed "counter.js")],
  durableObjectNamespaces = [(className = "Counter", uniqueKey = "weir-bench-counter")],
  durableObjectStorage = (localDisk = "storage"),
  bindings = [(name = "COUNTER", durableObjectNamespace = "Counter")],
);
''')
    proc = subprocess.Popen([str(binary), "serve", str(workdir / "config.capnp"), "--experimental"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir)
    return port, proc


# Admin port -> data dir, whose admin-token file /actors requires.
DATA_DIRS = {}


def start_weir(data, idle_ms, admin_port, binary=None):
    port = free_port()
    DATA_DIRS[admin_port] = Path(data)
    guests = ROOT / "guests/target/wasm32-wasip2/release"
    proc = subprocess.Popen(
        [str(binary or ROOT / "target/release/weir"), "serve", str(guests / "gateway.wasm"),
         "--actor", f"probe={guests / 'actor_probe.wasm'}",
         "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin_port}",
         "--data-dir", str(data), "--limit", f"actor_idle_ms={idle_ms}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return port, proc


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def admin(port, path):
    token = (DATA_DIRS[port] / "admin-token").read_text().strip()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path, headers={"authorization": f"Bearer {token}"})
    return json.loads(c.getresponse().read())


def wait_hibernated(admin_port, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if admin(admin_port, "/actors")["status"]["live"] == 0:
            return
        time.sleep(0.2)
    raise RuntimeError("actors did not hibernate")


def timed_posts(port, paths):
    """Latency of each POST, in ms, on one keep-alive connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for p in paths:
        t = time.perf_counter()
        c.request("POST", p, body=b"")
        r = c.getresponse()
        r.read()
        out.append((time.perf_counter() - t) * 1e3)
        if r.status != 200:
            raise RuntimeError(f"{p}: {r.status}")
    return out


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def parallel_posts(port, paths, connections=16):
    import concurrent.futures
    chunks = [paths[i::connections] for i in range(connections)]
    with concurrent.futures.ThreadPoolExecutor(connections) as pool:
        list(pool.map(lambda ch: timed_posts(port, ch), chunks))


def compare_builds(args, tmp):
    """This build and --baseline, the hot and the 1,000-actor loads, rounds
    interleaved; the median round of each."""
    builds = [("this build", ROOT / "target/release/weir"), ("baseline", Path(args.baseline))]
    loads = [("one hot actor", "actor_post.lua", "/probe/hot/incr"),
             ("1,000 actors", "actor_spread.lua", "/probe/NAME/incr")]
    if args.timers:
        # Every request schedules a timer due at once: its turn brings the
        # actor's earliest deadline forward, and its alarm turn follows.
        loads += [("timers, hot", "actor_post.lua", "/probe/hot/schedule?reason=tick&in_ms=0"),
                  ("timers, 1,000", "actor_spread.lua", "/probe/NAME/schedule?reason=tick&in_ms=0")]
    seen = {(b, l): [] for b, _ in builds for l, _, _ in loads}
    for round_no in range(1, args.rounds + 1):
        # Every other round the other build first.
        for build, binary in (builds if round_no % 2 else list(reversed(builds))):
            admin_port = free_port()
            port, proc = start_weir(tmp / f"{build}-{round_no}".replace(" ", "-"), 10000, admin_port, binary)
            try:
                wait_ready(port, proc, method="POST", path="/probe/hot/incr")
                for load, script, path in loads:
                    r = run_wrk_script(port, args.duration, args.connections, args.threads, str(WRK / script), path,
                                       pid=proc.pid)
                    seen[(build, load)].append(r)
                    print(f"round {round_no}  {build:10} {load:14} {r['rps']:>9.0f} req/s  p99 {r['p99']:6.2f} ms"
                          f"  CPU {r['cpu_us']:6.2f} us/req", flush=True)
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    print(f"\nmedian of {args.rounds} rounds, wrk -t{args.threads} -c{args.connections} -d{args.duration}s:")
    for load, _, _ in loads:
        med = {}
        for build, _ in builds:
            rs = sorted(seen[(build, load)], key=lambda r: r["rps"])
            p99s = sorted(r["p99"] for r in rs)
            cpus = sorted(r["cpu_us"] for r in rs)
            med[build] = (rs[len(rs) // 2]["rps"], p99s[len(p99s) // 2], cpus[len(cpus) // 2])
            print(f"{build:10} {load:14} {med[build][0]:>9.0f} req/s  p99 {med[build][1]:6.2f} ms"
                  f"  CPU {med[build][2]:6.2f} us/req")
        a, b = med["this build"], med["baseline"]
        print(f"  this build / baseline, {load}: {a[0] / b[0]:.2f}x req/s, p99 {a[1]:.2f} vs {b[1]:.2f} ms, "
              f"CPU per request {a[2] / b[2]:.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--wake-actors", type=int, default=1000)
    ap.add_argument("--memory-actors", type=int, default=10000)
    ap.add_argument("--memory-idle-ms", type=int, default=40000)
    ap.add_argument("--no-workerd", action="store_true")
    ap.add_argument("--baseline", help="an earlier weir build: measure the throughput loads of both, "
                                       "interleaved, and print their ratio (nothing else is measured)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the --baseline comparison")
    ap.add_argument("--timers", action="store_true",
                    help="with --baseline, also loads whose every request schedules a timer due at once")
    args = ap.parse_args()

    subprocess.run(["cargo", "build", "--release", "-p", "weir"], cwd=ROOT, check=True)
    subprocess.run(
        ["cargo", "build", "--release", "--target", "wasm32-wasip2",
         "--manifest-path", str(ROOT / "guests/Cargo.toml"), "--target-dir", str(ROOT / "guests/target")],
        check=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="weir-actors-bench-"))
    if args.baseline:
        try:
            compare_builds(args, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    workerd = None if args.no_workerd else find_workerd(ROOT / "bench/.cache/workerd")
    results = {}

    def load(label, port, script, path):
        r = run_wrk_script(port, args.duration, args.connections, args.threads, str(WRK / script), path)
        results[label] = r
        print(f"{label:44} {r['rps']:>9.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms"
              + (f"  non-2xx {r['non2xx']}" if r["non2xx"] else "")
              + (f"  socket errors {r['socket_errors']}" if r["socket_errors"] else ""), flush=True)

    try:
        admin_port = free_port()
        port, proc = start_weir(tmp / "weir", 10000, admin_port)
        try:
            wait_ready(port, proc, method="POST", path="/probe/hot/incr")
            load("weir: one hot actor (get+put)", port, "actor_post.lua", "/probe/hot/incr")
            load("weir: 1,000 actors uniform (get+put)", port, "actor_spread.lua", "/probe/NAME/incr")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

        if workerd:
            port, proc = start_workerd(workerd, tmp / "workerd")
            try:
                wait_ready(port, proc, method="POST", path="/hot")
                load("workerd: one hot Durable Object (get+put)", port, "actor_post.lua", "/hot")
                load("workerd: 1,000 Durable Objects uniform", port, "actor_spread.lua", "/NAME")
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            for shape in ("one hot", "1,000"):
                w = next(v for k, v in results.items() if k.startswith("weir") and shape in k)
                d = next(v for k, v in results.items() if k.startswith("workerd") and shape in k)
                print(f"ratio weir/workerd, {shape}: {w['rps'] / d['rps']:.2f}x req/s, "
                      f"p99 {w['p99']:.2f} vs {d['p99']:.2f} ms")

        # Wake from hibernation, and memory per live / hibernated actor.
        admin_port = free_port()
        port, proc = start_weir(tmp / "weir-wake", 1000, admin_port)
        try:
            wait_ready(port, proc, method="POST", path="/probe/warmup/incr")
            wait_hibernated(admin_port)
            n = args.wake_actors
            parallel_posts(port, [f"/probe/w{i}/incr" for i in range(n)])
            wait_hibernated(admin_port)
            # Sequential calls, one client: each is the first call to an
            # actor that hibernated.
            woken = timed_posts(port, [f"/probe/w{i}/incr" for i in range(n)])
            # The same path to one live actor, for comparison.
            warm = timed_posts(port, ["/probe/w0/incr"] * n)
            print(f"warm call through the worker (one live actor): p50 {pct(warm, 50):.3f} ms  p99 {pct(warm, 99):.3f} ms")
            print(f"first call after hibernation ({n} actors):   p50 {pct(woken, 50):.3f} ms  p99 {pct(woken, 99):.3f} ms"
                  f"  (wake cost p50 {pct(woken, 50) - pct(warm, 50):.3f} ms)")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

        # Memory: every actor live at once (a long idle time), then all
        # hibernated.
        admin_port = free_port()
        port, proc = start_weir(tmp / "weir-memory", args.memory_idle_ms, admin_port)
        try:
            wait_ready(port, proc, method="POST", path="/probe/warmup/incr")
            time.sleep(1)
            baseline = rss_kib(proc.pid)
            m = args.memory_actors
            started = time.time()
            parallel_posts(port, [f"/probe/m{i}/incr" for i in range(m)])
            created = time.time() - started
            live = rss_kib(proc.pid)
            live_count = admin(admin_port, "/actors")["status"]["live"]
            wait_hibernated(admin_port, timeout=args.memory_idle_ms / 1000 + 120)
            time.sleep(1)
            after = rss_kib(proc.pid)
            print(f"{m} actors created in {created:.1f} s ({m / created:.0f}/s, each a new SQLite file)")
            print(f"RSS: baseline {baseline} KiB; {live_count} live actors {live} KiB "
                  f"({(live - baseline) / max(live_count, 1):.1f} KiB per live actor); all hibernated {after} KiB "
                  f"({(after - baseline) * 1024 / m:.0f} bytes per hibernated actor over baseline)")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nwrk -t{args.threads} -c{args.connections} -d{args.duration}s; Weir durability \"process\"")


if __name__ == "__main__":
    main()
