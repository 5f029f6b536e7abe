#!/usr/bin/env python3
"""The operators' listing of actors with many actors on disk: what one
`GET /actors/probe` costs (time to its last byte, and its size), for this
build and, with --baseline, another build of Weir, on one data dir. A
build that answers a page at a time is also timed reading every page
(`?limit=10000`, each after the `next` of the one before), as `weir actors
list` does, and for one page from the middle (`?after=`).

The data dir is made once: N actors of the `actor-probe` class, through a
server of this build (bench/start.py's). Each round starts each build on
it, waits for its timer pass to end (it opens every database once after
a start), then times each request ROUNDS times; the median is printed.

Usage: python3 bench/listing.py [--actors 100000] [--rounds 5]
                                [--baseline PATH/TO/OTHER/weir]
"""

import argparse
import asyncio
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hello import ROOT, free_port  # noqa: E402
from start import admin, make_actors, serve, wait_serving  # noqa: E402

RELEASE = ROOT / "target" / "release" / "weir"


def get(data, admin_port, path):
    """One admin GET: (seconds to the last byte, bytes, its JSON)."""
    token = (Path(data) / "admin-token").read_text().strip()
    c = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=600)
    began = time.perf_counter()
    c.request("GET", path, headers={"authorization": f"Bearer {token}"})
    r = c.getresponse()
    body = r.read()
    took = time.perf_counter() - began
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status} {body[:200]!r}")
    return took, len(body), json.loads(body)


def walk(data, admin_port):
    """Every page of 10,000: (seconds, pages, actors)."""
    began = time.perf_counter()
    after, pages, actors = None, 0, 0
    while True:
        path = "/actors/probe?limit=10000" + (f"&after={after}" if after else "")
        _, _, page = get(data, admin_port, path)
        pages += 1
        actors += len(page["actors"])
        after = page.get("next")
        if after is None:
            return time.perf_counter() - began, pages, actors


def measure(binary, data, rounds, n):
    port, admin_port = free_port(), free_port()
    proc = serve(binary, data, port, admin_port)
    try:
        wait_serving(proc)
        deadline = time.time() + 900
        while time.time() < deadline:
            tp = admin(data, admin_port, "/status").get("actors", {}).get("timer_pass")
            if tp is None or tp["done"]:
                break
            time.sleep(0.2)
        out = {"first": [], "bytes": 0, "listed": 0, "paged": None, "middle": [], "walk": []}
        for _ in range(rounds):
            took, size, page = get(data, admin_port, "/actors/probe")
            out["first"].append(took)
            out["bytes"], out["listed"] = size, len(page["actors"])
            out["paged"] = "next" in page
            if out["paged"]:
                middle = f"/actors/probe?after=a{n // 2}&limit=1000"
                out["middle"].append(get(data, admin_port, middle)[0])
                took, pages, actors = walk(data, admin_port)
                if actors != n:
                    raise RuntimeError(f"the pages held {actors} actors, not {n}")
                out["walk"].append((took, pages))
        return out
    finally:
        proc.terminate()
        proc.wait()


def ms(xs):
    return f"{statistics.median(xs) * 1e3:,.1f} ms"


def report(name, m):
    print(f"{name}:")
    print(f"  GET /actors/probe: {ms(m['first'])} (median of {len(m['first'])}), "
          f"{m['listed']:,} actors, {m['bytes']:,} bytes")
    if m["paged"]:
        print(f"  one page of 1,000 from the middle (?after=): {ms(m['middle'])}")
        walks = [w[0] for w in m["walk"]]
        print(f"  every page of 10,000 ({m['walk'][0][1]} pages): {ms(walks)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--actors", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline")
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="weir-listing-"))
    port, admin_port = free_port(), free_port()
    proc = serve(RELEASE, data, port, admin_port)
    began = time.perf_counter()
    try:
        wait_serving(proc)
        asyncio.run(make_actors(port, args.actors))
    finally:
        proc.terminate()
        proc.wait()
    print(f"{args.actors:,} actors made in {time.perf_counter() - began:.1f} s ({data})")
    builds = [("this build", RELEASE)]
    if args.baseline:
        builds.append((f"baseline {args.baseline}", Path(args.baseline)))
    for name, binary in builds:
        report(name, measure(binary, data, args.rounds, args.actors))


if __name__ == "__main__":
    main()
