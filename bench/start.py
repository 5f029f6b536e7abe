#!/usr/bin/env python3
"""Start time with many actors on disk: how long `weir serve` takes from
exec to serving (its "serving" line, then a first request answered),
until every actor's timer is known (in the timer index: from then on a
timer fires on time; a build without the timer ledger knows them only as
its timer pass reads each database), and until its timer pass has read
every actor's next timer, then how long `weir images sweep` takes on the
stopped data dir, for this build and,
with --baseline, another build of Weir, rounds interleaved on one data
dir.

The data dir is made once: N actors of the `actor-probe` class (every
tenth with a timer an hour away), through a server of this build. Each
round then starts each build on it: warm (the files in the page cache),
and, with --cold, after the kernel's caches are dropped (needs root).

Usage: python3 bench/start.py [--actors 20000] [--rounds 3] [--cold]
                              [--baseline PATH/TO/OTHER/weir]
"""

import argparse
import asyncio
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port  # noqa: E402

GUESTS = ROOT / "guests/target/wasm32-wasip2/release"


def serve(binary, data, port, admin_port):
    return subprocess.Popen(
        [str(binary), "serve", str(GUESTS / "gateway.wasm"),
         "--actor", f"probe={GUESTS / 'actor_probe.wasm'}",
         "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin_port}",
         "--data-dir", str(data)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "WEIR_LOG": "warn"},
    )


def wait_serving(proc):
    """Reads stderr up to the "serving" line, then drains it on a thread
    (a full pipe would hold the server's log writer back)."""
    for line in proc.stderr:
        if line.startswith("weir: serving "):
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return
    raise RuntimeError(f"weir exited: {proc.wait()}")


def admin(data, admin_port, path):
    token = (Path(data) / "admin-token").read_text().strip()
    c = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=30)
    c.request("GET", path, headers={"authorization": f"Bearer {token}"})
    return json.loads(c.getresponse().read())


async def make_actors(port, n, connections=32):
    async def worker(k):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for i in range(k, n, connections):
            path = f"/probe/a{i}/schedule?reason=tick&in_ms=3600000" if i % 10 == 0 else f"/probe/a{i}/incr"
            w.write(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n".encode())
            await w.drain()
            head = await r.readuntil(b"\r\n\r\n")
            length, chunked = 0, False
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                if line.lower().replace(b" ", b"") == b"transfer-encoding:chunked":
                    chunked = True
            if chunked:
                # A body not whole when its head went (a loaded machine).
                while size := int((await r.readuntil(b"\r\n")).strip(), 16):
                    await r.readexactly(size + 2)
                await r.readuntil(b"\r\n")
            else:
                await r.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
        w.close()
    await asyncio.gather(*(worker(k) for k in range(connections)))


def first_answer(port, deadline):
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("POST", "/probe/a1/incr", body=b"")
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.001)
    raise RuntimeError("no answer")


def one_start(binary, data, cold, expected):
    if cold:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    port, admin_port = free_port(), free_port()
    began = time.perf_counter()
    proc = serve(binary, data, port, admin_port)
    try:
        wait_serving(proc)
        serving = time.perf_counter() - began
        first_answer(port, time.time() + 600)
        answered = time.perf_counter() - began
        # While the pass runs: actor calls on one connection, timed.
        # Beside it, on a thread of its own: when the timer index first
        # holds every timer, from /status every 5 ms (a build whose /status
        # does not show it: from /actors, which lists every actor, every
        # 250 ms).
        known, stop = [], threading.Event()

        def watch():
            while not stop.is_set():
                pending = admin(data, admin_port, "/status").get("actors", {}).get("pending_timers")
                pause = 0.005
                if pending is None:
                    pending = admin(data, admin_port, "/actors")["status"]["pending_timers"]
                    pause = 0.25
                if pending >= expected:
                    known.append(time.perf_counter() - began)
                    return
                time.sleep(pause)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        pass_done, during = None, []
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        deadline = time.time() + 600
        while time.time() < deadline:
            status = admin(data, admin_port, "/status").get("actors", {})
            tp = status.get("timer_pass")
            if tp is None:
                break  # a build without the pass indexes every timer before serving
            if tp["done"]:
                pass_done = time.perf_counter() - began
                break
            for _ in range(20):
                t = time.perf_counter()
                c.request("POST", "/probe/a1/incr", body=b"")
                c.getresponse().read()
                during.append((time.perf_counter() - t) * 1e3)
        watcher.join(timeout=10)
        stop.set()
        timers = admin(data, admin_port, "/actors")["status"]["pending_timers"]
        return serving, answered, pass_done, timers, during, (known or [None])[0]
    finally:
        proc.terminate()
        proc.wait()


def one_sweep(binary, data, cold):
    """`weir images sweep` on the stopped data dir: it reads the launch
    journals (of every actor, or of those with a launch mark)."""
    if cold:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    began = time.perf_counter()
    subprocess.run([str(binary), "images", "--data-dir", str(data), "sweep"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--actors", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also start with the page cache dropped (root)")
    ap.add_argument("--baseline", help="another weir binary to start on the same data dir")
    args = ap.parse_args()
    builds = [("this build", ROOT / "target/release/weir")]
    if args.baseline:
        builds.append(("baseline", Path(args.baseline)))
    with tempfile.TemporaryDirectory(prefix="weir-start-") as tmp:
        data = Path(tmp) / "data"
        port, admin_port = free_port(), free_port()
        proc = serve(builds[0][1], data, port, admin_port)
        wait_serving(proc)
        t = time.perf_counter()
        asyncio.run(make_actors(port, args.actors))
        print(f"made {args.actors} actors in {time.perf_counter() - t:.1f} s", flush=True)
        proc.terminate()
        proc.wait()
        expected = (args.actors + 9) // 10
        caches = ["warm", "cold"] if args.cold else ["warm"]
        seen = {(b, c): [] for b, _ in builds for c in caches}
        for round_no in range(1, args.rounds + 1):
            order = builds if round_no % 2 else list(reversed(builds))
            for cache in caches:
                for name, binary in order:
                    r = one_start(binary, data, cache == "cold", expected) + (one_sweep(binary, data, cache == "cold"),)
                    seen[(name, cache)].append(r)
                    done = f"{r[2]:.2f} s" if r[2] is not None else "before serving"
                    calls = ""
                    if r[4]:
                        d = sorted(r[4])
                        calls = (f"; {len(d)} actor calls meanwhile, p50 {d[len(d) // 2]:.2f} ms, "
                                 f"p99 {d[min(len(d) - 1, int(len(d) * 0.99))]:.2f} ms, max {d[-1]:.2f} ms")
                    known = f"{r[5]:.3f} s" if r[5] is not None else "before serving"
                    print(f"round {round_no} {cache} {name:10}: serving {r[0]:.3f} s, first answer {r[1]:.3f} s, "
                          f"every timer known {known}, pass done {done} ({r[3]} pending){calls}; "
                          f"offline sweep {r[6]:.3f} s", flush=True)
        print(f"\nmedians of {args.rounds} rounds, {args.actors} actors on disk:")
        for cache in caches:
            for name, _ in builds:
                rs = seen[(name, cache)]
                med = lambda i: sorted(x[i] for x in rs)[len(rs) // 2]  # noqa: E731
                def med_of(i):
                    xs = sorted(x[i] for x in rs if x[i] is not None)
                    return f"{xs[len(xs) // 2]:.3f} s" if xs else "before serving"
                print(f"{cache} {name:10}: serving {med(0):.3f} s, first answer {med(1):.3f} s, "
                      f"every timer known {med_of(5)}, pass done {med_of(2)}, offline sweep {med(6):.3f} s")


if __name__ == "__main__":
    main()
