#!/usr/bin/env python3
"""Cluster benchmark: Weir's cluster mode on PostgreSQL, next to single-node
Weir and workerd's Durable Objects, in one run on this machine.

- one hot actor, get + put per request (the `gateway` worker calling the
  `actor-probe` class's `/incr`, as bench/actors.py): single-node Weir;
  cluster mode with the load on the actor's owner; cluster mode with the
  load on a node that forwards every call to the owner (one hop); and
  workerd's Durable Object counter of the same shape;
- 1,000 actors uniform over 3 nodes, the load spread over all three;
- forwarding overhead: sequential calls to one actor through its owner and
  through another node, p50 and p99 of each and what the hop adds;
- failover: the hot actor's owner is SIGKILLed N times at random moments
  under a stream of writes (cluster_lease_ms=1000): the time from the kill
  to the next acknowledged write, p50 and max; then the counter must count
  every acknowledged write (nothing acknowledged was lost, snapshots and
  restores included).

With --sockets, only the WebSocket row runs: the chat example's room
actor echoing over 100 sockets (bench/ws-echo's `ws-load`, as
bench/websockets.py), on two nodes, with the sockets on the room's owner
and through the other node (relayed to the owner), over --rounds rounds
in alternating order; the medians and what the relay costs.

With --restarts N, only the graceful-restart row runs: the hot actor's
owner is stopped with SIGTERM (as for an upgrade) and started again N
times under writes spread over three nodes; every call sent must be
answered 200 and the counter must hold exactly the acknowledged writes
(the script exits 1 otherwise), and the time from SIGTERM to exit and
the pause in acknowledgements each restart causes are printed.

With --starts N (and --baseline), only the node-start row runs: a node
joins a serving cluster N times per build (builds alternating), each
time on a fresh data dir, timed from exec to its first answer, while one
connection writes to actors of the node already there (the longest of
those writes during each start is printed); then each build starts once
more while another session holds every table as `pg_dump` does (ACCESS
SHARE, in one open transaction), for at most 15 s.

With --baseline BIN, only the owner row runs, for this build and BIN in
alternating order over --rounds rounds (each on fresh nodes and a fresh
database), and the medians and their ratio are printed: an A/B of two
builds on the path the p99 bar is about. With --hop as well, the load
goes to a node that forwards every call to the owner instead: an A/B of
the path between nodes.

Each load row also prints the share of the machine's CPU time the
hypervisor took while it ran (steal, from /proc/stat): on this virtual
machine a round with steal is slower for reasons outside Weir.

PostgreSQL is Debian's (initdb'd in a temporary directory, fsync on, as an
unprivileged user when run as root). workerd comes from npm as in
bench/actors.py; without it (or with --no-workerd) its row is skipped.

Usage: python3 bench/cluster.py [--duration 8] [--connections 32] [--kills 50]
       python3 bench/cluster.py --baseline /path/to/weir [--rounds 6] [--hop]
       python3 bench/cluster.py --sockets [--rounds 6] [--duration 8]
       python3 bench/cluster.py --restarts 20
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port, run_wrk_script, wait_ready  # noqa: E402
from actors import WRK, find_workerd, start_workerd, pct  # noqa: E402

SECRET = "weir-bench-cluster-secret-0123456789"
GUESTS = ROOT / "guests/target/wasm32-wasip2/release"


def pg_bindir():
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                   key=lambda p: int(p.parent.parent.name))
    if not found:
        sys.exit("PostgreSQL is not installed: apt-get install postgresql")
    return found[-1].parent


class Postgres:
    """A PostgreSQL of the benchmark's own, on a free port."""

    def __init__(self, tmp):
        self.bin = pg_bindir()
        self.dir = tmp / "pg"
        self.dir.mkdir()
        self.user = None
        if os.geteuid() == 0:
            self.user = "postgres"
            shutil.chown(self.dir, self.user)
        self.port = free_port()
        self.run("initdb", "-D", str(self.dir / "data"), "-A", "trust", "-U", "weir", "-E", "UTF8")
        self.proc = subprocess.Popen(
            self.cmd("postgres", "-D", str(self.dir / "data"), "-p", str(self.port), "-k", str(self.dir),
                     "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            if subprocess.run(self.cmd("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-q")).returncode == 0:
                break
            time.sleep(0.05)
        self.psql("postgres", "CREATE DATABASE weir")

    def cmd(self, program, *args):
        path = str(self.bin / program)
        if self.user:
            return ["setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--init-groups", path, *args]
        return [path, *args]

    def run(self, program, *args):
        subprocess.run(self.cmd(program, *args), check=True, capture_output=True)

    def psql(self, db, sql):
        return subprocess.run([str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "weir",
                               "-d", db, "-At", "-c", sql], check=True, capture_output=True,
                              text=True).stdout.strip()

    def url(self):
        return f"postgres://weir@127.0.0.1:{self.port}/weir"

    def owner(self, key):
        return self.psql("weir", "SELECT n.name FROM weir_objects o JOIN weir_nodes n ON n.session = o.owner "
                                 f"WHERE o.key = '{key}' AND n.expires_at > now()")

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT)
        self.proc.wait()


WEIR = ROOT / "target/release/weir"


def start_weir(data, cluster=None, node=None, lease_ms=None, binary=WEIR, chat=False):
    port = free_port()
    if chat:
        app = ["chat.wasm", "--actor", f"room={GUESTS / 'chat_room.wasm'}", "--actor-route", "room=/rooms"]
    else:
        app = ["gateway.wasm", "--actor", f"probe={GUESTS / 'actor_probe.wasm'}", "--actor-route", "probe=/direct"]
    args = [str(binary), "serve", str(GUESTS / app[0]), *app[1:],
            "--listen", f"127.0.0.1:{port}", "--data-dir", str(data)]
    env = dict(os.environ)
    if cluster:
        args += ["--cluster", cluster, "--node", node, "--cluster-listen", "127.0.0.1:0"]
        if lease_ms:
            args += ["--limit", f"cluster_lease_ms={lease_ms}"]
        env["WEIR_CLUSTER_SECRET"] = SECRET
    env["WEIR_LOG"] = "warn"
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return port, proc


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def post(port, path, timeout=30, body=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=b"")
        r = c.getresponse()
        data = r.read()
        return (r.status, data) if body else r.status
    except OSError:
        return (None, b"") if body else None
    finally:
        c.close()


def timed(port, path, n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        c.request("POST", path, body=b"")
        r = c.getresponse()
        r.read()
        out.append((time.perf_counter() - t) * 1e3)
        if r.status != 200:
            raise RuntimeError(f"{path}: {r.status}")
    return out


def report(label, r):
    print(f"{label:52} {r['rps']:>8.0f} req/s  p50 {r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms"
          + (f"  steal {r['steal']:4.1f}%" if "steal" in r else "")
          + (f"  non-2xx {r['non2xx']}" if r["non2xx"] else "")
          + (f"  socket errors {r['socket_errors']}" if r["socket_errors"] else ""), flush=True)


def spread_over(ports, duration, connections, script, path):
    """One wrk per node at once, the connections split between them; their sums."""
    per = max(1, connections // len(ports))
    with concurrent.futures.ThreadPoolExecutor(len(ports)) as pool:
        rs = list(pool.map(lambda p: run_wrk_script(p, duration, per, 1, script, path), ports))
    return {
        "rps": sum(r["rps"] for r in rs),
        "p50": max(r["p50"] for r in rs),
        "p99": max(r["p99"] for r in rs),
        "non2xx": sum(r["non2xx"] for r in rs),
        "socket_errors": "; ".join(r["socket_errors"] for r in rs if r["socket_errors"]),
    }


def three_nodes(pg, tmp, prefix, names):
    """Nodes `names` (lease 1 s), each answering: {name: (port, process)}."""
    nodes = {n: start_weir(tmp / f"{prefix}{n}", pg.url(), n, 1000) for n in names}
    for port, proc in nodes.values():
        wait_ready(port, proc, method="POST", path="/direct/warm/incr", timeout=120)
    return nodes


def failover(pg, tmp, kills):
    """SIGKILLs the hot actor's owner `kills` times under writes; the time
    from each kill to the next acknowledged write."""
    nodes = three_nodes(pg, tmp, "fail-", ["f1", "f2", "f3"])
    acks = []
    sent = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def writer(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            with lock:
                ports = [p for p, _ in nodes.values()]
                sent[0] += 1
            status = post(rng.choice(ports), "/direct/fo/incr", timeout=10)
            if status == 200:
                with lock:
                    acks.append(time.monotonic())
            elif status is None:
                time.sleep(0.002)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    rng = random.Random(42)
    times = []
    try:
        for _ in range(kills):
            time.sleep(0.2 + rng.random() * 0.8)
            owner = pg.owner("actor/gateway/probe/fo")
            if owner not in nodes:
                continue
            with lock:
                port, proc = nodes.pop(owner)
            kill(proc)
            killed = time.monotonic()
            while True:
                with lock:
                    after = [a for a in acks[-200:] if a > killed]
                if after:
                    times.append(after[0] - killed)
                    break
                if time.monotonic() - killed > 60:
                    raise RuntimeError("no write acknowledged for 60 s after a kill")
                time.sleep(0.002)
            port, proc = start_weir(tmp / f"fail-{owner}", pg.url(), owner, 1000)
            wait_ready(port, proc, method="POST", path="/direct/warm/incr", timeout=120)
            with lock:
                nodes[owner] = (port, proc)
        stop.set()
        for t in threads:
            t.join()
        # Every acknowledged write is in the counter, and no write twice (a
        # write that failed may be there: it may have committed before its
        # answer was lost).
        counted = None
        for _ in range(100):
            status, data = post(next(iter(nodes.values()))[0], "/direct/fo/incr", body=True)
            if status == 200:
                counted = int(data) - 1
                break
            time.sleep(0.1)
        if counted is None or not len(acks) <= counted <= sent[0]:
            raise RuntimeError(f"the counter holds {counted} writes; {len(acks)} were acknowledged "
                               f"of {sent[0]} sent")
    finally:
        stop.set()
        for t in threads:
            t.join()
        for _, proc in nodes.values():
            kill(proc)
    times.sort()
    return times, len(acks), counted, sent[0]


def send(port, path):
    """One POST on a connection of its own: its status, "refused" when no
    connection was made (the request never left), or the error that ended
    it after it was sent."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        try:
            c.connect()
        except ConnectionRefusedError:
            return "refused", b""
        c.request("POST", path, body=b"")
        r = c.getresponse()
        return r.status, r.read()
    except OSError as e:
        return f"error: {e}", b""
    finally:
        c.close()


def restarts(pg, tmp, n):
    """Stops the hot actor's owner gracefully (SIGTERM, as for an upgrade)
    and starts it again, `n` times, under writes spread over the three
    nodes: every call sent must be answered 200, and the counter must hold
    exactly the acknowledged writes."""
    nodes = three_nodes(pg, tmp, "restart-", ["r1", "r2", "r3"])
    acks, failed, refused = [], [], [0]
    lock = threading.Lock()
    stop = threading.Event()

    def writer(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            with lock:
                port = rng.choice([p for p, _ in nodes.values()])
            status, _ = send(port, "/direct/rr/incr")
            with lock:
                if status == 200:
                    acks.append(time.monotonic())
                elif status == "refused":
                    refused[0] += 1
                else:
                    failed.append(status)

    post(nodes["r1"][0], "/direct/rr/incr")
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    exits, gaps = [], []
    try:
        for _ in range(n):
            time.sleep(0.3)
            owner = pg.owner("actor/gateway/probe/rr")
            if owner not in nodes:
                continue
            with lock:
                port, proc = nodes.pop(owner)
            termed = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            exits.append(time.monotonic() - termed)
            with lock:
                after = [a for a in acks if a > termed]
                before = [a for a in acks if a <= termed]
            if after and before:
                gaps.append(after[0] - before[-1])
            port, proc = start_weir(tmp / f"restart-{owner}", pg.url(), owner, 1000)
            wait_ready(port, proc, method="POST", path="/direct/warm/incr", timeout=120)
            with lock:
                nodes[owner] = (port, proc)
        stop.set()
        for t in threads:
            t.join()
        status, data = post(next(iter(nodes.values()))[0], "/direct/rr/incr", body=True)
        counted = int(data) - 2 if status == 200 else None
    finally:
        stop.set()
        for t in threads:
            t.join()
        for _, proc in nodes.values():
            kill(proc)
    return {"restarts": len(exits), "acks": len(acks), "failed": failed, "refused": refused[0],
            "counted": counted, "exits": sorted(exits), "gaps": sorted(gaps)}


def owner_row(pg, tmp, label, binary, d, c, t, hot, hop=False):
    """The owner row on fresh nodes of `binary` and a fresh database (with
    `hop`, the load on a node that forwards every call to the owner)."""
    pg.psql("postgres", "DROP DATABASE IF EXISTS weir WITH (FORCE)")
    pg.psql("postgres", "CREATE DATABASE weir")
    nodes = []
    try:
        for n in ["n1", "n2", "n3"]:
            data = tmp / f"{label}-{n}"
            shutil.rmtree(data, ignore_errors=True)
            nodes.append((n, *start_weir(data, pg.url(), n, binary=binary)))
        for n, port, proc in nodes:
            wait_ready(port, proc, method="POST", path="/probe/warm/incr", timeout=120)
        post(nodes[0][1], "/probe/hot/incr")
        owner = pg.owner("actor/gateway/probe/hot")
        port = next(p for n, p, _ in nodes if (n != owner if hop else n == owner))
        return run_wrk_script(port, d, c, t, hot, "/probe/hot/incr")
    finally:
        for _, _, proc in nodes:
            kill(proc)


def ab(pg, tmp, baseline, rounds, d, c, t, hot, hop=False):
    """This build against `baseline` on the owner row (or, with `hop`,
    through another node), alternating order."""
    runs = {"this build": [], "baseline": []}
    builds = [("this build", WEIR), ("baseline", Path(baseline))]
    for i in range(rounds):
        for label, binary in (builds if i % 2 == 0 else builds[::-1]):
            r = owner_row(pg, tmp, label.replace(" ", "-"), binary, d, c, t, hot, hop)
            runs[label].append(r)
            where = "through another node" if hop else "on its owner"
            report(f"round {i + 1}: {label}, one hot actor {where}", r)
    med = {k: {m: pct([r[m] for r in v], 50) for m in ("rps", "p50", "p99", "steal")} for k, v in runs.items()}
    print()
    for k, m in med.items():
        print(f"{k:12} median {m['rps']:8.0f} req/s  p50 {m['p50']:6.2f} ms  p99 {m['p99']:6.2f} ms"
              f"  steal {m['steal']:4.1f}%")
    per_round = ", ".join(f"{a['rps'] / b['rps']:.3f}" for a, b in zip(runs["this build"], runs["baseline"]))
    print(f"this build / baseline: {med['this build']['rps'] / med['baseline']['rps']:.3f}x req/s "
          f"(per round {per_round})")


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def sockets_row(pg, tmp, rounds, duration, sockets=100, size=32, idle_sockets=2000):
    """The room actor's echo over `sockets` sockets on its owner and
    through the other node, `rounds` times in alternating order."""
    load = ROOT / "target/release/ws-load"
    nodes = []
    try:
        for n in ["n1", "n2"]:
            nodes.append((n, *start_weir(tmp / f"ws-{n}", pg.url(), n, chat=True)))
        for n, port, proc in nodes:
            wait_ready(port, proc, path="/", timeout=120)
        url = lambda port: f"ws://127.0.0.1:{port}/rooms/bench/echo"  # noqa: E731
        subprocess.run([str(load), url(nodes[0][1]), "1", "1", str(size)], check=True, capture_output=True)
        owner = pg.owner("actor/chat/room/bench")
        ports = {"owner": next(p for n, p, _ in nodes if n == owner),
                 "relayed": next(p for n, p, _ in nodes if n != owner)}
        runs = {"owner": [], "relayed": []}
        for r in range(rounds):
            order = ["owner", "relayed"] if r % 2 == 0 else ["relayed", "owner"]
            for where in order:
                subprocess.run([str(load), url(ports[where]), str(sockets), "1", str(size)],
                               check=True, capture_output=True)
                out = subprocess.run([str(load), url(ports[where]), str(sockets), str(duration), str(size)],
                                     check=True, capture_output=True, text=True).stdout
                m = json.loads(out)
                m = {"rate": m["per_s"], "p50_ms": m["p50_us"] / 1000, "p99_ms": m["p99_us"] / 1000,
                     "errors": m["errors"]}
                runs[where].append(m)
                print(f"  round {r + 1} {where:8}: {m['rate']:9.0f} msg/s  p50 {m['p50_ms']:.2f} ms  "
                      f"p99 {m['p99_ms']:.2f} ms")
        med = {w: {k: statistics.median(m[k] for m in runs[w]) for k in ("rate", "p50_ms", "p99_ms")}
               for w in runs}
        for w in ("owner", "relayed"):
            print(f"room echo, {sockets} sockets, {'on its owner' if w == 'owner' else 'through the other node'}: "
                  f"{med[w]['rate']:.0f} msg/s, p50 {med[w]['p50_ms']:.2f} ms, p99 {med[w]['p99_ms']:.2f} ms")
        print(f"relayed / owner: {med['relayed']['rate'] / med['owner']['rate']:.2f}x msg/s, "
              f"p50 +{med['relayed']['p50_ms'] - med['owner']['p50_ms']:.2f} ms")
        # Memory per idle socket held through the relaying node, on it
        # and on the owner (whose room actor hibernates).
        procs = {n: proc for n, _, proc in nodes}
        relay_proc = procs[next(n for n in procs if n != owner)]
        idle = url(ports["relayed"])
        base = (rss_kib(relay_proc.pid), rss_kib(procs[owner].pid))
        held = subprocess.Popen([str(load), idle, str(idle_sockets), "30", "0"], stdout=subprocess.PIPE, text=True)
        assert json.loads(held.stdout.readline())["held"] == idle_sockets
        time.sleep(5)
        after = (rss_kib(relay_proc.pid), rss_kib(procs[owner].pid))
        print(f"{idle_sockets} idle sockets through the relaying node: "
              f"{(after[0] - base[0]) / idle_sockets:.1f} KiB each on it, "
              f"{(after[1] - base[1]) / idle_sockets:.1f} KiB each on the owner")
        # The relaying node stops gracefully with them open: how each of
        # its clients sees its socket end, and how long that takes.
        asked = time.monotonic()
        relay_proc.send_signal(signal.SIGTERM)
        ended = json.loads(held.stdout.readline())["ended"]
        all_ended = time.monotonic() - asked
        relay_proc.wait(timeout=60)
        exited = time.monotonic() - asked
        held.wait()
        print(f"the relaying node stopped with {idle_sockets} of them open: they ended {ended} "
              f"within {all_ended * 1000:.0f} ms of its SIGTERM; it exited after {exited * 1000:.0f} ms")
    finally:
        for _, _, proc in nodes:
            kill(proc)


def node_starts(pg, tmp, n, baseline):
    """A node joining a serving cluster, each build in turn; see --starts."""
    first_port, first = start_weir(tmp / "starts-first", pg.url(), "first", 1000)
    wait_ready(first_port, first, method="POST", path="/direct/warm/incr", timeout=120)
    stop = threading.Event()
    writes = []  # (sent at, ms)

    def writer():
        c = http.client.HTTPConnection("127.0.0.1", first_port, timeout=30)
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            try:
                c.request("POST", f"/direct/w{i % 500}/incr", body=b"")
                r = c.getresponse()
                r.read()
                status = r.status
            except OSError:
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", first_port, timeout=30)
                status = None
            writes.append((t, (time.perf_counter() - t) * 1e3, status))
            i += 1

    w = threading.Thread(target=writer)
    w.start()
    builds = [("this build", WEIR), ("baseline", Path(baseline))]

    def one_start(label, binary, k, limit):
        data = tmp / f"starts-{label.replace(' ', '-')}-{k}"
        t0 = time.perf_counter()
        port, proc = start_weir(data, pg.url(), f"joiner-{k}", 1000, binary=binary)
        try:
            wait_ready(port, proc, method="POST", path="/direct/warm/incr", timeout=limit)
            took = (time.perf_counter() - t0) * 1e3
        except RuntimeError as e:
            took = f"did not serve ({e})"
        t1 = time.perf_counter()
        during = [ms for (at, ms, _) in writes if t0 <= at <= t1]
        failed = sum(1 for (at, _, st) in writes if t0 <= at <= t1 and st != 200)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill(proc)
        return took, max(during, default=float("nan")), len(during), failed

    results = {label: [] for label, _ in builds}
    try:
        for k in range(n):
            order = builds if k % 2 == 0 else builds[::-1]
            for label, binary in order:
                results[label].append(one_start(label, binary, k, 60))
        for label, _ in builds:
            ts = [r[0] for r in results[label]]
            worst = [r[1] for r in results[label]]
            print(f"{label:12} exec -> first answer: p50 {pct(ts, 50):6.1f} ms, max {max(ts):6.1f} ms; "
                  f"the other node's longest write during a start: p50 {pct(worst, 50):5.1f} ms, "
                  f"max {max(worst):6.1f} ms; writes refused {sum(r[3] for r in results[label])}",
                  flush=True)
        # A backup's read holds every table.
        tables = pg.psql("weir", "SELECT string_agg(tablename, ', ') FROM pg_tables WHERE tablename LIKE 'weir%'")
        backup = subprocess.Popen([str(pg.bin / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "weir",
                                   "-d", "weir", "-q"], stdin=subprocess.PIPE, text=True)
        backup.stdin.write(f"BEGIN; LOCK TABLE {tables} IN ACCESS SHARE MODE;\n")
        backup.stdin.flush()
        time.sleep(0.5)
        try:
            for label, binary in builds:
                took, worst, count, failed = one_start(label, binary, n + 1, 15)
                took = f"{took:.1f} ms" if isinstance(took, float) else took
                print(f"{label:12} during a backup: exec -> first answer {took}; the other node's "
                      f"longest write {worst:.1f} ms of {count}, {failed} refused", flush=True)
        finally:
            backup.stdin.write("COMMIT;\n")
            backup.stdin.close()
            backup.wait()
    finally:
        stop.set()
        w.join()
        kill(first)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--no-workerd", action="store_true")
    ap.add_argument("--baseline", help="another weir binary: A/B of the owner row only")
    ap.add_argument("--hop", action="store_true",
                    help="with --baseline: the load through a node that forwards to the owner")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sockets", action="store_true", help="only the WebSocket row")
    ap.add_argument("--starts", type=int, default=0,
                    help="with --baseline, only the node-start row: N starts per build")
    ap.add_argument("--restarts", type=int, default=0,
                    help="only the graceful-restart row: the owner stopped (SIGTERM) and started N times")
    args = ap.parse_args()

    subprocess.run(["cargo", "build", "--release", "-p", "weir", "-p", "ws-echo"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--target", "wasm32-wasip2", "--manifest-path",
                    str(ROOT / "guests/Cargo.toml"), "--target-dir", str(ROOT / "guests/target")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="weir-cluster-bench-"))
    os.chmod(tmp, 0o755)
    d, c, t = args.duration, args.connections, args.threads
    hot = str(WRK / "actor_post.lua")
    spread = str(WRK / "actor_spread.lua")
    results = {}

    if args.sockets:
        pg = Postgres(tmp)
        try:
            sockets_row(pg, tmp, args.rounds, d)
        finally:
            pg.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        return

    if args.restarts:
        pg = Postgres(tmp)
        try:
            r = restarts(pg, tmp, args.restarts)
        finally:
            pg.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        ms = [e * 1e3 for e in r["exits"]]
        gaps = [g * 1e3 for g in r["gaps"]]
        print(f"graceful restarts of the owner under writes: {r['restarts']}, {r['acks']} writes acknowledged, "
              f"{len(r['failed'])} failed, {r['refused']} not sent (a stopping node's closed port)")
        print(f"  SIGTERM to exit: p50 {pct(ms, 50):.0f} ms, max {max(ms):.0f} ms; "
              f"longest pause in acknowledgements per restart: p50 {pct(gaps, 50):.0f} ms, max {max(gaps):.0f} ms")
        print(f"  the counter holds {r['counted']} writes; {r['acks']} were acknowledged")
        if r["failed"]:
            print(f"  failed: {r['failed'][:10]}")
        if r["failed"] or r["counted"] != r["acks"]:
            sys.exit(1)
        return

    if args.starts:
        if not args.baseline:
            sys.exit("--starts needs --baseline")
        pg = Postgres(tmp)
        try:
            node_starts(pg, tmp, args.starts, args.baseline)
        finally:
            pg.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        return

    if args.baseline:
        pg = Postgres(tmp)
        try:
            ab(pg, tmp, args.baseline, args.rounds, d, c, t, hot, args.hop)
        finally:
            pg.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        return

    # Single node, embedded SQLite only.
    port, proc = start_weir(tmp / "single")
    try:
        wait_ready(port, proc, method="POST", path="/probe/hot/incr")
        results["single"] = run_wrk_script(port, d, c, t, hot, "/probe/hot/incr")
        report("single node: one hot actor (get+put)", results["single"])
        results["single-spread"] = run_wrk_script(port, d, c, t, spread, "/probe/NAME/incr")
        report("single node: 1,000 actors uniform", results["single-spread"])
    finally:
        kill(proc)

    pg = Postgres(tmp)
    # What one commit costs this machine's PostgreSQL (its fsync), for
    # context: every acknowledged write waits for one.
    pg.psql("weir", "CREATE TABLE bench_commit (id int PRIMARY KEY, n bigint); INSERT INTO bench_commit VALUES (1, 0)")
    script = tmp / "commit.sql"
    script.write_text("UPDATE bench_commit SET n = n + 1 WHERE id = 1;\n")
    out = subprocess.run([str(pg.bin / "pgbench"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "weir", "-n",
                          "-f", str(script), "-c", "1", "-T", "3", "weir"], capture_output=True, text=True).stdout
    latency = next((line.split("=")[1].strip() for line in out.splitlines() if "latency average" in line), "?")
    print(f"PostgreSQL: one commit (pgbench, 1 client, fsync on): {latency}")
    nodes = []
    try:
        for n in ["n1", "n2", "n3"]:
            nodes.append((n, *start_weir(tmp / n, pg.url(), n)))
        for n, port, proc in nodes:
            wait_ready(port, proc, method="POST", path="/probe/warm/incr", timeout=120)
        # The hot actor's owner, and a node that is not it.
        post(nodes[0][1], "/probe/hot/incr")
        owner = pg.owner("actor/gateway/probe/hot")
        owner_port = next(p for n, p, _ in nodes if n == owner)
        other_port = next(p for n, p, _ in nodes if n != owner)
        results["owner"] = run_wrk_script(owner_port, d, c, t, hot, "/probe/hot/incr")
        report("cluster: one hot actor, load on its owner", results["owner"])
        results["hop"] = run_wrk_script(other_port, d, c, t, hot, "/probe/hot/incr")
        report("cluster: one hot actor, load through another node", results["hop"])
        results["spread"] = spread_over([p for _, p, _ in nodes], d, c, spread, "/probe/NAME/incr")
        report("cluster: 1,000 actors over 3 nodes, load on all 3", results["spread"])
        owners = pg.psql("weir", "SELECT n.name, count(*) FROM weir_objects o JOIN weir_nodes n "
                                 "ON n.session = o.owner WHERE o.key LIKE 'actor/gateway/probe/a%' "
                                 "GROUP BY n.name ORDER BY n.name")
        print(f"  actors per node: {owners.replace(chr(10), ', ')}")
        # What one hop adds, sequential calls on one connection.
        post(nodes[0][1], "/direct/seq/incr")
        seq_owner = pg.owner("actor/gateway/probe/seq")
        seq_port = next(p for n, p, _ in nodes if n == seq_owner)
        seq_other = next(p for n, p, _ in nodes if n != seq_owner)
        direct = timed(seq_port, "/direct/seq/incr", 2000)
        hop = timed(seq_other, "/direct/seq/incr", 2000)
        print(f"sequential calls through the owner:  p50 {pct(direct, 50):.3f} ms  p99 {pct(direct, 99):.3f} ms")
        print(f"sequential calls through a hop:      p50 {pct(hop, 50):.3f} ms  p99 {pct(hop, 99):.3f} ms"
              f"  (one hop adds p50 {pct(hop, 50) - pct(direct, 50):.3f} ms)")
    finally:
        for _, _, proc in nodes:
            kill(proc)

    workerd = None if args.no_workerd else find_workerd(ROOT / "bench/.cache/workerd")
    if workerd:
        port, proc = start_workerd(workerd, tmp / "workerd")
        try:
            wait_ready(port, proc, method="POST", path="/hot")
            results["workerd"] = run_wrk_script(port, d, c, t, hot, "/hot")
            report("workerd: one hot Durable Object (get+put)", results["workerd"])
        finally:
            kill(proc)

    print()
    print(f"cluster (owner) / single node: {results['owner']['rps'] / results['single']['rps']:.2f}x req/s")
    print(f"cluster, 1,000 actors / single node: "
          f"{results['spread']['rps'] / results['single-spread']['rps']:.2f}x req/s")
    print(f"cluster (one hop) / single node: {results['hop']['rps'] / results['single']['rps']:.2f}x req/s")
    if "workerd" in results:
        for key, label in [("owner", "on its owner"), ("hop", "through another node")]:
            print(f"cluster ({label}) / workerd: {results[key]['rps'] / results['workerd']['rps']:.2f}x req/s, "
                  f"p99 {results[key]['p99']:.2f} vs {results['workerd']['p99']:.2f} ms")

    if args.kills:
        times, acked, counted, sent = failover(pg, tmp, args.kills)
        print(f"failover over {len(times)} kills (cluster_lease_ms=1000): p50 {pct(times, 50):.2f} s, "
              f"p90 {pct(times, 90):.2f} s, max {times[-1]:.2f} s; {acked} writes acknowledged, "
              f"the counter holds {counted} of {sent} sent")
    pg.stop()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
