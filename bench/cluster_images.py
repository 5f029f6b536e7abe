#!/usr/bin/env python3
"""Shared images in cluster mode: what sharing a push costs, and how fast a
node fetches an image it lacks, next to references in the same run.

For each size (1, 16 and 64 MiB of random bytes, new ones each round):
- push: `PUT /images` to a single-node Weir (its store only) and to a
  node of a two-node cluster (its store, then PostgreSQL, in 4 MiB
  pieces); the ratio is what sharing adds to a push;
- fetch: the first `programs.run` of the image from an actor the other
  node owns, right after the push (the node fetches the image, hashing it
  as it comes, then finds it is no command), less the same call once the
  image is there; next to reading the same pieces out of PostgreSQL with
  `psql \\copy … TO /dev/null` (the database's own read, no hashing, no
  file): the ratio is what Weir's fetch costs over the raw read.

Rounds alternate, the medians are printed. PostgreSQL is Debian's, as in
bench/cluster.py (fsync on).

Usage: python3 bench/cluster_images.py [--rounds 3] [--sizes 1,16,64]
"""

import argparse
import hashlib
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port  # noqa: E402
from cluster import GUESTS, SECRET, WEIR, Postgres  # noqa: E402

MIB = 1024 * 1024


def start(data, pg=None, node=None):
    port, admin = free_port(), free_port()
    runner = GUESTS / "runner.wasm"
    args = [str(WEIR), "serve", str(runner), "--actor", f"runner={runner}", "--actor-route", "runner=/r",
            "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}", "--data-dir", str(data)]
    env = dict(os.environ, WEIR_LOG="warn")
    if pg:
        args += ["--cluster", pg.url(), "--node", node, "--cluster-listen", "127.0.0.1:0"]
        env["WEIR_CLUSTER_SECRET"] = SECRET
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(600):
        try:
            if request(admin, "GET", "/healthz")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.05)
    token = (Path(data) / "admin-token").read_text().strip()
    return {"port": port, "admin": admin, "token": token, "proc": proc}


def request(port, method, path, body=None, token=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def push(server, blob):
    started = time.perf_counter()
    status, body = request(server["admin"], "PUT", "/images", blob, server["token"])
    elapsed = time.perf_counter() - started
    if status not in (200, 201):
        sys.exit(f"push failed: {status} {body[:300]!r}")
    return elapsed


def run_once(server, actor, digest):
    started = time.perf_counter()
    status, body = request(server["port"], "POST", f"/r/{actor}/run/{digest}?arg=x")
    elapsed = time.perf_counter() - started
    if b"not_a_command" not in body and b"not-runnable" not in body:
        sys.exit(f"unexpected answer to a run of random bytes: {status} {body[:300]!r}")
    return elapsed


def placed_on(node, nodes, prefix):
    """A name the cluster's rendezvous placement gives `node` among `nodes`."""
    for i in range(100000):
        name = f"{prefix}{i}"
        key = f"actor/runner/runner/{name}".encode()
        best = max(nodes, key=lambda n: (int.from_bytes(hashlib.sha256(n.encode() + b"\0" + key).digest()[:8], "big"), n))
        if best == node:
            return name
    raise RuntimeError("no name")


def raw_read(pg, digest):
    started = time.perf_counter()
    subprocess.run([str(pg.bin / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "weir", "-d", "weir",
                    "-c", f"\\copy (SELECT data FROM weir_image_pieces WHERE digest = '{digest}' ORDER BY piece) "
                          "TO '/dev/null' WITH (FORMAT binary)"],
                   check=True, capture_output=True)
    return time.perf_counter() - started


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="1,16,64")
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-p", "weir"], cwd=ROOT, check=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="weir-bench-images-") as tmp:
        tmp = Path(tmp)
        # PostgreSQL runs as its own user, which must reach its directory.
        os.chmod(tmp, 0o755)
        pg = Postgres(tmp)
        servers = []
        try:
            single = start(tmp / "single")
            a = start(tmp / "a", pg, "a")
            b = start(tmp / "b", pg, "b")
            servers = [single, a, b]
            print(f"{'size':>7} | {'push, one node':>14} | {'push, cluster':>13} | ratio | "
                  f"{'fetch (first run - next)':>24} | {'psql read':>9} | ratio | fetch rate")
            for size in sizes:
                rows = {"single": [], "cluster": [], "fetch": [], "raw": []}
                for r in range(args.rounds):
                    blob = os.urandom(size * MIB)
                    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
                    actor = placed_on("b", ["a", "b"], f"img-{size}-{r}-")
                    # The run follows the cluster push at once, before b
                    # catches up by itself (every 2 s).
                    if r % 2 == 0:
                        rows["single"].append(push(single, blob))
                    rows["cluster"].append(push(a, blob))
                    first = run_once(a, actor, digest)
                    if r % 2 == 1:
                        rows["single"].append(push(single, blob))
                    again = run_once(a, actor, digest)
                    rows["fetch"].append(first - again)
                    rows["raw"].append(raw_read(pg, digest))
                m = {k: statistics.median(v) for k, v in rows.items()}
                print(f"{size:>4} MiB | {m['single'] * 1000:>11.0f} ms | {m['cluster'] * 1000:>10.0f} ms | "
                      f"{m['cluster'] / m['single']:>4.2f}x | {m['fetch'] * 1000:>21.0f} ms | "
                      f"{m['raw'] * 1000:>6.0f} ms | {m['fetch'] / m['raw']:>4.2f}x | "
                      f"{size / m['fetch']:.0f} MiB/s", flush=True)
        finally:
            for s in servers:
                s["proc"].terminate()
                s["proc"].wait()
            pg.stop()


if __name__ == "__main__":
    main()
