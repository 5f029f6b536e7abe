#!/usr/bin/env python3
"""WebSocket echo benchmark: a Weir worker echo, a Weir actor echo (one
room actor owning every socket), workerd's Durable Object echo with the
hibernation API (npm `workerd`), a plain fastwebsockets echo server (what
another framing crate is worth, no Wasm) and a plain tokio-tungstenite echo
server (the ceiling, no Wasm), one after another in one run. Then memory per idle
socket on a hibernated Weir actor.

Each server is loaded by the same generator (bench/ws-echo's `ws-load`, a
Rust client): SOCKETS sockets, each sending a SIZE-byte text message and
waiting for its echo, in a loop. Prints round trips per second and the
p50/p99 round-trip latency, and the ratio to the ceiling. That closed loop
gives the most each server answers; its latency is mostly the queue the
loop itself fills. So each server is then also loaded at fixed rates
(--paced, messages per second over all sockets, open loop: each socket
sends on schedule, and a round trip is timed from when its message was
due), which gives the latency a client sees at that load. The servers are
measured --rounds times, interleaved and every other round reversed, and
the median round is reported.

Usage: python3 bench/websockets.py [--rounds 3] [--duration 10] [--sockets 100] [--size 32]
       [--paced 5000,20000] (open-loop rates, msg/s; 0: none)
       [--idle 2000] (sockets held for the memory figure) [--no-workerd]
       [--baseline BIN] (adds the actor echo on another weir binary, for an A/B)
"""

import argparse
import json
import os
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
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip2",
                    "-p", "sockets", "-p", "chat", "-p", "chat-room"],
                   cwd=ROOT / "guests", check=True)


def start_weir(port, data, sockets):
    guest = ROOT / "guests/target/wasm32-wasip2/release/sockets.wasm"
    proc = subprocess.Popen(
        [str(RELEASE / "weir"), "serve", str(guest), "--listen", f"127.0.0.1:{port}",
         "--data-dir", data, "--limit", f"max_concurrent={max(sockets, 32)}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, f"ws://127.0.0.1:{port}/echo"


def start_weir_actor(port, data, _sockets, binary=None):
    guests = ROOT / "guests/target/wasm32-wasip2/release"
    proc = subprocess.Popen(
        [str(binary or RELEASE / "weir"), "serve", str(guests / "chat.wasm"),
         "--actor", f"room={guests / 'chat_room.wasm'}", "--actor-route", "room=/rooms",
         "--listen", f"127.0.0.1:{port}", "--data-dir", data],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, f"ws://127.0.0.1:{port}/rooms/bench/echo"


WORKERD = None


def start_workerd(port, data, _sockets):
    data = Path(data)
    shutil.copy(ROOT / "bench/workerd/ws_echo.js", data / "ws_echo.js")
    storage = data / "do-storage"
    storage.mkdir()
    (data / "config.capnp").write_text(f'''
using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [
    (name = "main", worker = .echo),
    (name = "storage", disk = (path = "{storage}", writable = true)),
  ],
  sockets = [(name = "http", address = "127.0.0.1:{port}", http = (), service = "main")],
);
const echo :Workerd.Worker = (
  compatibilityDate = "2024-09-01",
  modules = [(name = "ws_echo.js", esModule = embed "ws_echo.js")],
  durableObjectNamespaces = [(className = "Echo", uniqueKey = "weir-bench-ws-echo")],
  durableObjectStorage = (localDisk = "storage"),
  bindings = [(name = "ECHO", durableObjectNamespace = "Echo")],
);
''')
    proc = subprocess.Popen([str(WORKERD), "serve", str(data / "config.capnp"), "--experimental"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=data)
    wait_port(port, proc)
    return proc, f"ws://127.0.0.1:{port}/bench"


def start_ceiling(port, _data, _sockets):
    proc = subprocess.Popen([str(RELEASE / "ws-echo"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, f"ws://127.0.0.1:{port}/"


def start_ceiling_fast(port, _data, _sockets):
    proc = subprocess.Popen([str(RELEASE / "ws-echo-fast"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc, f"ws://127.0.0.1:{port}/"


# The last one is the ceiling every row is compared with.
SERVERS = [
    ("weir worker echo", start_weir),
    ("weir actor echo (hibernatable)", start_weir_actor),
    ("workerd DO echo (hibernation API)", start_workerd),
    ("fastwebsockets echo (no Wasm)", start_ceiling_fast),
    ("tokio-tungstenite echo (ceiling)", start_ceiling),
]


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_ticks(pid):
    """The process's user + system time so far, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def idle_memory(n, binary=None):
    """Server memory per idle socket on one hibernated room actor."""
    port = free_port()
    admin_port = free_port()
    data = tempfile.mkdtemp(prefix="weir-wsbench-")
    guests = ROOT / "guests/target/wasm32-wasip2/release"
    proc = subprocess.Popen(
        [str(binary or RELEASE / "weir"), "serve", str(guests / "chat.wasm"),
         "--actor", f"room={guests / 'chat_room.wasm'}", "--actor-route", "room=/rooms",
         "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin_port}",
         "--data-dir", data, "--limit", "actor_idle_ms=500"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        url = f"ws://127.0.0.1:{port}/rooms/idle/echo"
        # One socket first, so the actor's class and engine are warm, then
        # let it hibernate: the baseline.
        warm = subprocess.Popen([str(RELEASE / "ws-load"), url, "1", "3", "0"],
                                stdout=subprocess.PIPE, text=True)
        warm.stdout.readline()
        warm.wait()
        time.sleep(2)
        base = rss_kib(proc.pid)
        held = subprocess.Popen([str(RELEASE / "ws-load"), url, str(n), "30", "0"],
                                stdout=subprocess.PIPE, text=True)
        assert json.loads(held.stdout.readline())["held"] == n
        time.sleep(3)  # the actor hibernates (actor_idle_ms=500)
        after = rss_kib(proc.pid)
        held.kill()
        held.wait()
        return base, after
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)


def machine_ticks():
    """The machine's CPU time so far, in clock ticks: (stolen, total)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


def load(url, args, rate=None):
    """One ws-load run; with the share of the machine's CPU the hypervisor
    took meanwhile (steal), which slows every server alike."""
    machine = machine_ticks()
    cmd = [str(RELEASE / "ws-load"), url, str(args.sockets), str(args.duration), str(args.size)]
    out = subprocess.run(cmd + ([str(rate)] if rate else []),
                         check=True, capture_output=True, text=True).stdout
    stolen, elapsed = (b - a for a, b in zip(machine, machine_ticks()))
    m = json.loads(out)
    m["steal"] = 100.0 * stolen / elapsed if elapsed else 0.0
    return m


def measure(start, args):
    port = free_port()
    data = tempfile.mkdtemp(prefix="weir-wsbench-")
    proc, url = start(port, data, args.sockets)
    try:
        # A short warm-up, then the measured run.
        subprocess.run([str(RELEASE / "ws-load"), url, str(args.sockets), "1", str(args.size)],
                       check=True, capture_output=True)
        before = cpu_ticks(proc.pid)
        m = load(url, args)
        # The server's own CPU per echoed message: steadier between rounds
        # than the rate, which moves with whatever else the machine runs.
        ticks = cpu_ticks(proc.pid) - before
        m["cpu_us"] = ticks * 1e6 / os.sysconf("SC_CLK_TCK") / max(m["messages"], 1)
        m["paced"] = {}
        for rate in args.paced:
            m["paced"][rate] = load(url, args, rate)
        return m
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
    p.add_argument("--no-workerd", action="store_true")
    p.add_argument("--paced", default="5000,20000",
                   help="open-loop rates in msg/s over all sockets, comma-separated; 0 for none")
    p.add_argument("--idle", type=int, default=2000)
    p.add_argument("--baseline", help="another weir binary whose actor echo runs beside this one's")
    args = p.parse_args()
    args.paced = [int(r) for r in args.paced.split(",") if int(r) > 0]
    if not args.no_build:
        build()
    global WORKERD
    servers = SERVERS
    if not args.no_workerd:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from actors import find_workerd  # noqa: E402
        WORKERD = find_workerd(ROOT / "bench/.cache/workerd")
    if WORKERD is None:
        servers = [s for s in SERVERS if s[1] is not start_workerd]
    if args.baseline:
        baseline = Path(args.baseline).resolve()
        servers = servers[:2] + [(
            "baseline actor echo",
            lambda port, data, n: start_weir_actor(port, data, n, baseline),
        )] + servers[2:]
    results = {name: [] for name, _ in servers}
    for r in range(args.rounds):
        order = servers if r % 2 == 0 else list(reversed(servers))
        for name, start in order:
            m = measure(start, args)
            results[name].append(m)
            print(f"round {r + 1}: {name}: {m['per_s']:.0f} msg/s, p50 {m['p50_us']} us, "
                  f"p99 {m['p99_us']} us, server CPU {m['cpu_us']:.2f} us/msg, errors {m['errors']}, "
                  f"steal {m['steal']:.1f}%",
                  file=sys.stderr)
            for rate, pm in m["paced"].items():
                print(f"round {r + 1}: {name}: paced at {rate} msg/s: {pm['per_s']:.0f} echoed/s, "
                      f"p50 {pm['p50_us']} us, p99 {pm['p99_us']} us, p99.9 {pm['p999_us']} us, "
                      f"max {pm['max_us']} us, errors {pm['errors']}, steal {pm['steal']:.1f}%",
                      file=sys.stderr)
    median = {}
    for name, runs in results.items():
        runs = sorted(runs, key=lambda m: m["per_s"])
        median[name] = runs[len(runs) // 2]
    ceiling = median[servers[-1][0]]["per_s"]
    print(f"{args.sockets} sockets, {args.size}-byte text echo, {args.duration:.0f} s, "
          f"median of {args.rounds} rounds")
    print(f"{'server':36} {'msg/s':>9} {'p50 us':>8} {'p99 us':>8} {'vs ceiling':>10} "
          f"{'CPU us/msg':>10} {'steal %':>7}")
    for name, m in median.items():
        print(f"{name:36} {m['per_s']:9.0f} {m['p50_us']:8} {m['p99_us']:8} "
              f"{m['per_s'] / ceiling:9.2f}x {m['cpu_us']:10.2f} {m['steal']:7.1f}")
    for rate in args.paced:
        print(f"paced at {rate} msg/s over {args.sockets} sockets (open loop; median round by p99)")
        print(f"{'server':36} {'echoed/s':>9} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} "
              f"{'errors':>7} {'steal %':>7}")
        for name, runs in results.items():
            runs = sorted((m["paced"][rate] for m in runs), key=lambda pm: pm["p99_us"])
            pm = runs[len(runs) // 2]
            print(f"{name:36} {pm['per_s']:9.0f} {pm['p50_us']:8} {pm['p99_us']:8} "
                  f"{pm['p999_us']:9} {pm['errors']:7} {pm['steal']:7.1f}")
    actor = median.get("weir actor echo (hibernatable)")
    workerd = median.get("workerd DO echo (hibernation API)")
    if actor and workerd:
        print(f"weir actor echo vs workerd: {actor['per_s'] / workerd['per_s']:.2f}x msg/s, "
              f"p99 {actor['p99_us'] / 1000:.2f} vs {workerd['p99_us'] / 1000:.2f} ms")
    base = median.get("baseline actor echo")
    if actor and base:
        per_round = ", ".join(f"{a['per_s'] / b['per_s']:.2f}" for a, b in
                              zip(results["weir actor echo (hibernatable)"], results["baseline actor echo"]))
        cpu = ", ".join(f"{a['cpu_us'] / b['cpu_us']:.3f}" for a, b in
                        zip(results["weir actor echo (hibernatable)"], results["baseline actor echo"]))
        print(f"weir actor echo vs baseline: {actor['per_s'] / base['per_s']:.3f}x msg/s "
              f"(per round {per_round}), p99 {actor['p99_us'] / 1000:.2f} vs {base['p99_us'] / 1000:.2f} ms; "
              f"server CPU per message, this / baseline, per round: {cpu}")
    if args.idle:
        binaries = [("this build", None)]
        if args.baseline:
            binaries.append(("baseline", Path(args.baseline).resolve()))
        for label, binary in binaries:
            base, after = idle_memory(args.idle, binary)
            print(f"{label}: {args.idle} idle sockets on a hibernated actor: RSS {base} -> {after} KiB, "
                  f"{(after - base) / args.idle:.1f} KiB per socket")


if __name__ == "__main__":
    main()
