#!/usr/bin/env python3
"""Resident processes handed over between cluster nodes: how long a
process is away when the node that holds its owner dies, and that it comes
back exactly once.

Two nodes on one PostgreSQL (Debian's, fsync on, as bench/cluster.py),
cluster_lease_ms=1000, serving the runner guest. One owner spawns the
`resident` image. Then, --kills times: the node that holds the owner is
SIGKILLed at a random moment, and, asking only the other node's admin
address (nobody calls the owner), the script times
- kill -> the process runs on the other node under a new pid (the other
  node claimed the owner for its journal and re-drove it), and
- kill -> the process answers a request through its owner;
then checks that exactly one copy runs over both nodes, and starts the
killed node again (it waits for its old lease to end) before the next
kill. What bounds the first: the dead node's lease (1 s) and the orphan
sweep's interval (a third of the lease); printed next to them.

With --owners N, N owners (each with its process) are all on the killed
node, and the script times kill -> the first and kill -> the last of them
running on the other node: how a mass take-over goes (each owner is
claimed by the orphan sweep and opened, its history read from PostgreSQL,
its process re-driven).

Usage: python3 bench/handovers.py [--kills 20] [--owners 1]
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port  # noqa: E402
from cluster import GUESTS, SECRET, WEIR, Postgres, pct  # noqa: E402
from cluster_images import placed_on, request  # noqa: E402

LEASE_MS = 1000


def start(data, pg, node):
    port, admin = free_port(), free_port()
    runner = GUESTS / "runner.wasm"
    args = [str(WEIR), "serve", str(runner), "--actor", f"runner={runner}", "--actor-route", "runner=/r",
            "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}", "--data-dir", str(data),
            "--cluster", pg.url(), "--node", node, "--cluster-listen", "127.0.0.1:0",
            "--limit", f"cluster_lease_ms={LEASE_MS}"]
    env = dict(os.environ, WEIR_LOG=os.environ.get("WEIR_LOG", "warn"), WEIR_CLUSTER_SECRET=SECRET)
    # WEIR_BENCH_LOGS=DIR keeps each node's log there (appended across restarts).
    logs = os.environ.get("WEIR_BENCH_LOGS")
    err = open(Path(logs) / f"{node}.log", "a") if logs else subprocess.DEVNULL
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=env)
    deadline = time.monotonic() + 120
    while True:
        try:
            if request(admin, "GET", "/healthz", timeout=5)[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            sys.exit(f"node {node} did not start")
        time.sleep(0.05)
    token = (Path(data) / "admin-token").read_text().strip()
    return {"name": node, "port": port, "admin": admin, "token": token, "proc": proc, "data": data}


def processes(node):
    try:
        status, body = request(node["admin"], "GET", "/processes", token=node["token"], timeout=5)
    except OSError:
        return None
    if status != 200:
        return None
    # A pid is its owner's: (owner, pid) names a process.
    return {(p["owner"]["name"], p["pid"]) for p in json.loads(body)["processes"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--owners", type=int, default=1)
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-p", "weir"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip2", "--manifest-path",
                    str(ROOT / "guests/Cargo.toml"), "--target-dir", str(ROOT / "guests/target")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="weir-handovers-"))
    os.chmod(tmp, 0o755)
    pg = Postgres(tmp)
    nodes = {}
    try:
        for n in ["a", "b"]:
            nodes[n] = start(tmp / n, pg, n)
        a = nodes["a"]
        status, body = request(a["admin"], "PUT", "/images", (GUESTS / "resident.wasm").read_bytes(), a["token"])
        if status not in (200, 201):
            sys.exit(f"push failed: {status} {body[:300]!r}")
        image = json.loads(body)["digest"]
        owners = [placed_on("a", ["a", "b"], f"owner{i}") for i in range(args.owners)]
        pids = set()
        for owner in owners:
            status, body = request(a["port"], "POST", f"/r/{owner}/spawn/{image}")
            if status != 200:
                sys.exit(f"spawn failed: {status} {body[:300]!r}")
            pids.add((owner, json.loads(body)["pid"]))
        owner = owners[0]
        rng = random.Random(7)
        running, all_running, answering = [], [], []
        for i in range(args.kills):
            time.sleep(0.2 + rng.random() * 0.8)
            holder = pg.owner(f"actor/runner/runner/{owner}")
            victim = nodes[holder]
            other = nodes["b" if holder == "a" else "a"]
            victim["proc"].send_signal(signal.SIGKILL)
            victim["proc"].wait()
            killed = time.monotonic()
            first = None
            while True:
                now = processes(other) or set()
                if now and first is None:
                    first = time.monotonic() - killed
                if len(now) == len(owners):
                    if now & pids:
                        sys.exit(f"kill {i}: an old process runs on {other['name']}")
                    all_running.append(time.monotonic() - killed)
                    running.append(first)
                    pids = now
                    break
                if time.monotonic() - killed > 60:
                    sys.exit(f"kill {i}: {len(now)} of {len(owners)} processes came back on "
                             f"{other['name']} within 60 s")
                time.sleep(0.005)
            probe, pid = min(pids)
            while request(other["port"], "GET", f"/r/{probe}/proc/{pid}/starts")[0] != 200:
                if time.monotonic() - killed > 60:
                    sys.exit(f"kill {i}: the process did not answer within 60 s")
                time.sleep(0.005)
            answering.append(time.monotonic() - killed)
            nodes[victim["name"]] = start(victim["data"], pg, victim["name"])
            copies = sum(len(processes(n) or []) for n in nodes.values())
            if copies != len(owners):
                sys.exit(f"kill {i}: {copies} copies of {len(owners)} processes run over both nodes")
        ms = sorted(t * 1e3 for t in running)
        last = sorted(t * 1e3 for t in all_running)
        answered = sorted(t * 1e3 for t in answering)
        print(f"handovers after SIGKILL of the owners' node: {len(ms)} of {len(owners)} owner(s) each "
              f"(cluster_lease_ms={LEASE_MS}, orphan sweep every {LEASE_MS // 3} ms); "
              f"one copy of each process ran after each")
        print(f"  kill -> first running on the other node, no call: p50 {pct(ms, 50):.0f} ms, "
              f"p90 {pct(ms, 90):.0f} ms, max {ms[-1]:.0f} ms")
        if len(owners) > 1:
            print(f"  kill -> all {len(owners)} running on the other node:     p50 {pct(last, 50):.0f} ms, "
                  f"p90 {pct(last, 90):.0f} ms, max {last[-1]:.0f} ms")
        print(f"  kill -> answering through its owner:              p50 {pct(answered, 50):.0f} ms, "
              f"p90 {pct(answered, 90):.0f} ms, max {answered[-1]:.0f} ms")
    finally:
        for n in nodes.values():
            n["proc"].send_signal(signal.SIGKILL)
            n["proc"].wait()
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
