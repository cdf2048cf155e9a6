#!/usr/bin/env python3
"""Benchmark remote reads over HTTP on loopback, with injected latency so loopback resembles a
real store, against the issue-15 targets.

Usage: python scripts/bench_remote.py PACK [--latency-ms 20] [--frames 256] [--batches 5] [--seed 1]

PACK is a local pack (``scripts/make_bench_data.py`` + ``hframe pack`` make one). Its folder is
served by ``tests/range_server.py`` (the test suite's range server: HTTP/1.1 keep-alive, byte
ranges, ETag, If-Match) with ``--latency-ms`` added to every request, and, where nginx is
installed, by nginx without added latency (for the verify comparison). Measured side by side:

* open: requests to open the pack (target <= 8, index included);
* random: ``--batches`` batches of ``--frames`` distinct random frames through ``read_many``:
  median seconds per batch (target <= 0.5 s at 20 ms), GETs per batch against the reads
  planned (target: exactly one GET per planned read), bytes received / bytes wanted (<= 1.1);
* neighbours: ``--frames`` consecutive frames in one ``read_many`` (target <= 3 GETs);
* verify: ``verify_pack`` of the pack over nginx against the local warm verify of the same
  file (target >= 0.7x the local bytes/s);
* every frame read is checked against its index md5 (a mismatch fails the run).

Numbers are printed as a table of ratios with their target, and as JSON with --json. Exit 0
unless something errors or a frame's bytes are wrong; targets are reported, not enforced.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from range_server import RangeServer  # noqa: E402

import hframe_cli as h  # noqa: E402
from hframe_cli.verify import verify_pack  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pack", type=Path)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pack = args.pack.resolve()
    with h.open_pack(pack) as local:
        md5s = local.table.column("md5").to_pylist()
        n = len(local)
    if n < args.frames:
        sys.exit(f"{pack}: {n} frames, fewer than --frames {args.frames}")
    rng = random.Random(args.seed)  # seeded once
    batches = [rng.sample(range(n), args.frames) for _ in range(args.batches)]
    out: dict[str, object] = {"pack": str(pack), "frames": n, "latency_ms": args.latency_ms}

    with RangeServer(pack.parent) as srv:
        srv.latency_s = args.latency_ms / 1000
        url = srv.url(pack.name)
        t0 = time.perf_counter()
        with h.open_pack(url) as p:
            out["open_requests"] = srv.total_requests()
            out["open_s"] = round(time.perf_counter() - t0, 3)
            times, gets, planned, got_bytes, want_bytes = [], [], [], 0, 0
            for ids in batches:
                srv.reset_counts()
                offs = [p._offsets[i] for i in ids]  # noqa: SLF001 - the plan, to count reads
                lens = [p._lengths[i] for i in ids]  # noqa: SLF001
                plan = len(p._coalesce(offs, lens))  # noqa: SLF001
                before = p.storage_counters().bytes
                t = time.perf_counter()
                frames = p.read_many(ids)
                times.append(time.perf_counter() - t)
                gets.append(srv.total_requests())
                planned.append(plan)
                got_bytes += p.storage_counters().bytes - before
                want_bytes += sum(lens)
                if [hashlib.md5(f).hexdigest() for f in frames] != [md5s[i] for i in ids]:
                    sys.exit("WRONG BYTES in a random batch")
            out["random_batch_s_median"] = round(statistics.median(times), 3)
            out["random_gets_per_batch"] = gets
            out["random_planned_reads_per_batch"] = planned
            out["random_bytes_ratio"] = round(got_bytes / want_bytes, 3)
            start = rng.randrange(0, n - args.frames)
            ids = list(range(start, start + args.frames))
            srv.reset_counts()
            t = time.perf_counter()
            frames = p.read_many(ids)
            out["neighbours_s"] = round(time.perf_counter() - t, 3)
            out["neighbours_gets"] = srv.total_requests()
            if [hashlib.md5(f).hexdigest() for f in frames] != [md5s[i] for i in ids]:
                sys.exit("WRONG BYTES in the neighbour batch")
            out["counters"] = p.storage_counters().to_dict()

    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    verify_pack(pack)  # warm the page cache: the local side is the warm verify
    local_runs = [verify_pack(pack, workers=1) for _ in range(3)]
    local_rate = max(r.bytes_checked / r.elapsed_s for r in local_runs)
    out["verify_local_MBps"] = round(local_rate / 1e6, 1)
    if nginx is not None:
        from conftest import nginx_serving  # the test suite's nginx launcher

        with tempfile.TemporaryDirectory() as tmp, nginx_serving(pack.parent, Path(tmp)) as base:
            runs = [verify_pack(f"{base}/{pack.name}") for _ in range(3)]
            if any(not r.ok for r in runs):
                sys.exit(f"remote verify found problems: {runs[0].problems[:3]} {runs[0].error}")
            remote_rate = max(r.bytes_checked / r.elapsed_s for r in runs)
        out["verify_nginx_MBps"] = round(remote_rate / 1e6, 1)
        out["verify_nginx_vs_local"] = round(remote_rate / local_rate, 3)

    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    one_get = all(g == q for g, q in zip(out["random_gets_per_batch"], out["random_planned_reads_per_batch"]))  # type: ignore[call-overload]
    rows = [
        ("open: requests", out["open_requests"], "<= 8"),
        (f"random {args.frames}: median s per batch", out["random_batch_s_median"], "<= 0.5"),
        ("random: one GET per planned read", one_get, "True"),
        ("random: bytes received / wanted", out["random_bytes_ratio"], "<= 1.1"),
        (f"neighbours {args.frames}: GETs", out["neighbours_gets"], "<= 3"),
        ("verify over nginx vs local warm", out.get("verify_nginx_vs_local", "n/a (no nginx)"), ">= 0.7"),
    ]
    print(f"bench_remote: {pack} ({n} frames), {args.latency_ms:g} ms per request, seed {args.seed}")
    for label, value, target in rows:
        print(f"  {label:<44} {value!s:>10}   target {target}")
    print(f"  (random GETs per batch {out['random_gets_per_batch']}, planned {out['random_planned_reads_per_batch']};"
          f" verify local {out['verify_local_MBps']} MB/s, nginx {out.get('verify_nginx_MBps', 'n/a')} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
