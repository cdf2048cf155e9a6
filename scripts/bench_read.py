#!/usr/bin/env python3
"""Benchmark random frame reads: ``PackReader.read_many`` against bare preads and loose files.

Usage: python scripts/bench_read.py DATA_DIR [--frames 256] [--batches 10] [--seed 1] [--cold]

DATA_DIR holds ``jpegs/`` and ``blobs/`` from ``scripts/make_bench_data.py``. The packs are
the ones ``bench_pack.py`` leaves in ``DATA_DIR/_bench_out/`` (made here if missing): the
hframe pack and the seed-style pack with its JSON index. For each data set, ``--batches``
batches of ``--frames`` distinct random frame ids are drawn from one generator seeded once
with ``--seed``; every method reads the same ids:

* ``read_many``:  ``PackReader.read_many(ids, workers=1)`` (the measured product);
* ``bare_pread``: a single-thread loop of ``os.pread(fd, length, offset)`` over the same
  ranges, taken from the index beforehand (the floor for one thread);
* ``seed``:       the seed-style reader: JSON index entry, then one ``os.pread`` per frame;
* ``loose``:      the original files, open/read/close each;
* ``read_many_default`` (information only): ``read_many(ids)`` with its default thread count.

Warm (default): each batch is read once untimed by every method, then timed. ``--cold``:
before each timed method the pack files and the batch's loose files are evicted from the
page cache with ``posix_fadvise(DONTNEED)`` (on a VM the host may still cache them).
Correctness is checked once per data set: md5 of every ``read_many`` frame equals the index
md5, and all methods return the same bytes.

Targets (reported, not enforced; exit status 0 unless something errors):
  read_many_vs_bare_pread >= 0.8 (frames/s ratio); read_many_vs_loose is reported without one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable

from bench_pack import DATASETS, seed_pack

import hframe_cli

#: A read method: (frame ids, their (offset, length) ranges from the index) -> frame bytes.
Method = Callable[[list[int], list[tuple[int, int]]], list[bytes]]


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def ensure_packs(data_dir: str, name: str) -> tuple[str, str]:
    src = os.path.join(data_dir, name)
    out_dir = os.path.join(data_dir, "_bench_out")
    os.makedirs(out_dir, exist_ok=True)
    hf, seed = os.path.join(out_dir, f"{name}.hframe"), os.path.join(out_dir, f"{name}.seed")
    if not os.path.exists(hf + ".index.parquet"):
        print(f"packing {src} -> {hf}", flush=True)
        hframe_cli.pack([src], hf, force=True)
    if not os.path.exists(seed + ".json"):
        print(f"seed-packing {src} -> {seed}", flush=True)
        seed_pack(src, seed)
    return hf, seed


def methods_for(reader: hframe_cli.PackReader, pack_fd: int, seed_fd: int,
                seed_index: list[dict], paths: list[str]) -> dict[str, Method]:
    def read_many(ids: list[int], ranges: list[tuple[int, int]]) -> list[bytes]:
        return reader.read_many(ids, workers=1)

    def bare_pread(ids: list[int], ranges: list[tuple[int, int]]) -> list[bytes]:
        return [os.pread(pack_fd, length, offset) for offset, length in ranges]

    def seed(ids: list[int], ranges: list[tuple[int, int]]) -> list[bytes]:
        out = []
        for i in ids:
            e = seed_index[i]
            out.append(os.pread(seed_fd, e["length"], e["offset"]))
        return out

    def loose(ids: list[int], ranges: list[tuple[int, int]]) -> list[bytes]:
        out = []
        for i in ids:
            with open(paths[i], "rb") as f:
                out.append(f.read())
        return out

    def read_many_default(ids: list[int], ranges: list[tuple[int, int]]) -> list[bytes]:
        return reader.read_many(ids)

    return {"read_many": read_many, "bare_pread": bare_pread, "seed": seed, "loose": loose,
            "read_many_default": read_many_default}


def bench_dataset(data_dir: str, name: str, args: argparse.Namespace) -> dict[str, float]:
    hf, seed_path = ensure_packs(data_dir, name)
    src = os.path.join(data_dir, name)
    reader = hframe_cli.open_pack(hf)
    with open(seed_path + ".json") as f:
        seed_index = json.load(f)
    names = reader.table.column("name").to_pylist()
    if names != [e["name"] for e in seed_index]:
        raise RuntimeError(f"{name}: the hframe and seed packs list different frames")
    paths = [os.path.join(src, n) for n in names]
    pack_fd, seed_fd = os.open(hf, os.O_RDONLY), os.open(seed_path, os.O_RDONLY)
    methods = methods_for(reader, pack_fd, seed_fd, seed_index, paths)

    rng = random.Random(args.seed)
    batches = [rng.sample(range(len(reader)), min(args.frames, len(reader))) for _ in range(args.batches)]

    # Correctness, once: read_many matches the index md5, and every method matches read_many.
    ids = batches[0]
    got = reader.read_many(ids, workers=1)
    md5s = reader.table.column("md5")
    bad = [i for i, data in zip(ids, got) if hashlib.md5(data).hexdigest() != md5s[i].as_py()]
    ranges = [reader.range_of(i) for i in ids]
    others = {m: fn(ids, ranges) for m, fn in methods.items()}
    bad += [m for m, data in others.items() if data != got]
    if bad:
        raise RuntimeError(f"{name}: read mismatch: {bad[:10]}")
    print(f"bench=read dataset={name} check=md5 frames={len(ids)} result=ok", flush=True)

    mode = "cold" if args.cold else "warm"
    seconds = dict.fromkeys(methods, 0.0)
    nbytes = 0
    for ids in batches:
        ranges = [reader.range_of(i) for i in ids]
        nbytes += sum(n for _, n in ranges)
        for method, fn in methods.items():
            if args.cold:
                for p in (hf, seed_path, *(paths[i] for i in ids)):
                    evict(p)
            else:
                fn(ids, ranges)  # untimed warm-up read of this batch
            t0 = time.perf_counter()
            fn(ids, ranges)
            seconds[method] += time.perf_counter() - t0
    total = len(batches) * len(batches[0])
    fps = {}
    for method, s in seconds.items():
        fps[method] = total / s
        print(f"bench=read mode={mode} dataset={name} method={method} frames={total} seconds={s:.4f} "
              f"frames_per_s={fps[method]:.0f} mb_per_s={nbytes / 1e6 / s:.1f}", flush=True)
    os.close(pack_fd)
    os.close(seed_fd)
    reader.close()
    return fps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir", help="folder with jpegs/ and blobs/ (make_bench_data.py)")
    ap.add_argument("--frames", type=int, default=256, help="random frames per batch (default 256)")
    ap.add_argument("--batches", type=int, default=10, help="batches per data set (default 10)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the frame-id generator (default 1)")
    ap.add_argument("--cold", action="store_true", help="evict packs and loose files before each timed read")
    args = ap.parse_args()
    if args.frames < 1 or args.batches < 1:
        ap.error("--frames and --batches must be at least 1")

    results = {name: bench_dataset(args.data_dir, name, args) for name in DATASETS}
    mode = "cold" if args.cold else "warm"
    for name, fps in results.items():
        ratio = fps["read_many"] / fps["bare_pread"]
        print(f"read_many_vs_bare_pread={ratio:.3f} mode={mode} dataset={name} target=>=0.8 "
              f"result={'PASS' if ratio >= 0.8 else 'FAIL'}")
        print(f"read_many_vs_loose={fps['read_many'] / fps['loose']:.3f} mode={mode} dataset={name} target=none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
