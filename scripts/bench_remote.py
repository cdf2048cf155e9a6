#!/usr/bin/env python3
"""Benchmark remote reads over HTTP and S3 on loopback, with injected latency so loopback
resembles a real store, against the issue-15 targets.

Usage: python scripts/bench_remote.py PACK [--latency-ms 20] [--frames 256] [--batches 5] [--seed 1]

PACK is a local pack (``scripts/make_bench_data.py`` + ``hframe pack`` make one). Its folder is
served by ``tests/range_server.py`` (the test suite's range server: HTTP/1.1 keep-alive, byte
ranges, ETag, If-Match; it also answers path-style S3 requests, so pyarrow's S3 client reads
the same file through hframe's s3:// backend) with ``--latency-ms`` added to every request
(HEAD included), and, where nginx is
installed, by nginx without added latency (for the verify comparison). Measured side by side:

* open: requests to open the pack (target <= 8, index included);
* random: ``--batches`` batches of ``--frames`` distinct random frames through ``read_many``:
  median seconds per batch (target <= 0.5 s at 20 ms), GETs per batch against the reads
  planned (target: exactly one GET per planned read), bytes received / bytes wanted (<= 1.1);
* neighbours: ``--frames`` consecutive frames in one ``read_many`` (target <= 3 GETs);
* block-local: ``--batches`` batches in ``BlockShuffleSampler``'s order (defaults: blocks of 64,
  windows of 4), median seconds per batch against the random batches (target >= 1.5x);
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
import os
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
from hframe_cli.training.sampler import BlockShuffleSampler  # noqa: E402
from hframe_cli.verify.check import verify_pack  # noqa: E402


def _measure(
    srv: RangeServer,
    url: str,
    batches: list[list[int]],
    md5s: list[str],
    rng: random.Random,
    frames_per_batch: int,
    n: int,
) -> dict[str, object]:
    """Open ``url``, read the random batches and one batch of neighbours; requests counted at
    the server, bytes at the client; every frame checked against its md5."""
    out: dict[str, object] = {}
    srv.reset_counts()
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
                sys.exit(f"WRONG BYTES in a random batch from {url}")
        out["random_batch_s_median"] = round(statistics.median(times), 3)
        out["random_gets_per_batch"] = gets
        out["random_planned_reads_per_batch"] = planned
        out["random_bytes_ratio"] = round(got_bytes / want_bytes, 3)
        start = rng.randrange(0, n - frames_per_batch)
        ids = list(range(start, start + frames_per_batch))
        srv.reset_counts()
        t = time.perf_counter()
        frames = p.read_many(ids)
        out["neighbours_s"] = round(time.perf_counter() - t, 3)
        out["neighbours_gets"] = srv.total_requests()
        if [hashlib.md5(f).hexdigest() for f in frames] != [md5s[i] for i in ids]:
            sys.exit(f"WRONG BYTES in the neighbour batch from {url}")
        # the same number of batches in BlockShuffleSampler's order (one rank's share of an epoch)
        order = BlockShuffleSampler(p, seed=1, rank=0, world_size=1).part()
        times, gets = [], []
        for k in range(len(batches)):
            ids = order[k * frames_per_batch : (k + 1) * frames_per_batch]
            srv.reset_counts()
            t = time.perf_counter()
            frames = p.read_many(ids)
            times.append(time.perf_counter() - t)
            gets.append(srv.total_requests())
            if [hashlib.md5(f).hexdigest() for f in frames] != [md5s[i] for i in ids]:
                sys.exit(f"WRONG BYTES in a block-local batch from {url}")
        out["block_local_batch_s_median"] = round(statistics.median(times), 3)
        out["block_local_gets_per_batch"] = gets
        out["block_local_vs_random"] = round(out["random_batch_s_median"] / out["block_local_batch_s_median"], 2)
        out["counters"] = p.storage_counters().to_dict()
        out["checks_md5"] = p.checks_md5
    return out


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

    with tempfile.TemporaryDirectory() as root:
        # the same server answers as a web server (GET /NAME) and, path-style, as an S3 bucket
        # (HEAD and GET /bkt/NAME) that pyarrow's S3 client is pointed at
        (Path(root) / "bkt").symlink_to(pack.parent, target_is_directory=True)
        with RangeServer(root) as srv:
            srv.latency_s = args.latency_ms / 1000
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
            for kind, url in (
                ("http", srv.url(f"bkt/{pack.name}")),
                ("s3", f"s3://bkt/{pack.name}?endpoint_override=127.0.0.1:{srv.port}&scheme=http&region=us-east-1"),
            ):
                out[kind] = _measure(srv, url, batches, md5s, rng, args.frames, n)

    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    verify_pack(pack)  # warm the page cache: the local side is the warm verify
    local_rate = max(r.bytes_checked / r.elapsed_s for r in [verify_pack(pack, workers=1) for _ in range(3)])
    local_default = max(r.bytes_checked / r.elapsed_s for r in [verify_pack(pack) for _ in range(3)])
    out["verify_local_MBps"] = round(local_rate / 1e6, 1)  # one process, as the remote verify runs
    out["verify_local_default_MBps"] = round(local_default / 1e6, 1)  # one per core (the default)
    if nginx is not None:
        from conftest import nginx_serving  # the test suite's nginx launcher

        with tempfile.TemporaryDirectory() as tmp, nginx_serving(pack.parent, Path(tmp)) as base:
            runs = [verify_pack(f"{base}/{pack.name}") for _ in range(3)]
            if any(not r.ok for r in runs):
                sys.exit(f"remote verify found problems: {runs[0].problems[:3]} {runs[0].error}")
            remote_rate = max(r.bytes_checked / r.elapsed_s for r in runs)
        out["verify_nginx_MBps"] = round(remote_rate / 1e6, 1)
        out["verify_nginx_vs_local"] = round(remote_rate / local_rate, 3)
        out["verify_nginx_vs_local_default"] = round(remote_rate / local_default, 3)

    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"bench_remote: {pack} ({n} frames), {args.latency_ms:g} ms per request, seed {args.seed}")
    print(f"  {'':<44} {'http':>10} {'s3':>10}   target")
    for kind in ("http", "s3"):
        m = out[kind]
        m["one_get"] = all(g == q for g, q in zip(m["random_gets_per_batch"], m["random_planned_reads_per_batch"]))
    rows = [
        ("open: requests", "open_requests", "<= 8"),
        (f"random {args.frames}: median s per batch", "random_batch_s_median", "<= 0.5"),
        ("random: one GET per planned read", "one_get", "True"),
        ("random: bytes received / wanted", "random_bytes_ratio", "<= 1.1"),
        (f"neighbours {args.frames}: GETs", "neighbours_gets", "<= 3"),
        (f"block-local {args.frames}: median s per batch", "block_local_batch_s_median", ""),
        ("block-local sampler vs random, batch time", "block_local_vs_random", ">= 1.5"),
    ]
    for label, key, target in rows:
        print(f"  {label:<44} {out['http'][key]!s:>10} {out['s3'][key]!s:>10}   {target}")
    for label, key in (("1 process", "verify_nginx_vs_local"), ("default", "verify_nginx_vs_local_default")):
        print(f"  {'verify over nginx vs local warm, ' + label:<44} {out.get(key, 'n/a')!s:>10} {'':>10}   >= 0.7")
    for kind in ("http", "s3"):
        m = out[kind]
        print(
            f"  ({kind}: GETs per batch {m['random_gets_per_batch']}, planned {m['random_planned_reads_per_batch']};"
            f" frames md5-checked by the reader: {m['checks_md5']})"
        )
    print(
        f"  (verify local {out['verify_local_MBps']} MB/s in 1 process, {out['verify_local_default_MBps']} MB/s by"
        f" default; nginx {out.get('verify_nginx_MBps', 'n/a')} MB/s, 1 process with blocks in flight)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
