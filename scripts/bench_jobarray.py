#!/usr/bin/env python3
"""A job array on one box against one process: the same dataset, and the wall time of each.

Usage: python scripts/bench_jobarray.py SOURCE_DIR [--parts 4] [--out DIR]

Packs SOURCE_DIR (``scripts/make_bench_data.py`` makes one) twice, with a fixed creation time:

* one process: ``hframe pack SOURCE_DIR -o one.hframe``;
* a job array: ``hframe pack SOURCE_DIR -o ds.hframe --plan-only`` once, then ``--parts``
  subprocesses at once, each ``hframe pack --plan PLAN -o ds.hframe --shard-of env/N`` told its
  index by ``JOB_COMPLETION_INDEX`` (as a Kubernetes Indexed Job), then ``hframe index ds.hframe
  --merge``.

Then it checks that both hold the same frames (name, md5, length, in order) and prints the wall
time of each step and the ratio. The page cache is left warm for both (the sources are read once
untimed first): the comparison is of the packing work, not of the disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hframe_cli as h

CREATED = "2026-01-01T00:00:00Z"


def _hframe() -> list[str]:
    return [sys.executable, "-m", "hframe_cli"]


def _run(argv: list[str], env: dict[str, str] | None = None) -> None:
    r = subprocess.run(argv, env=env, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.decode()[-500:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="hframe-jobarray-"))
    work.mkdir(parents=True, exist_ok=True)
    for f in args.source.rglob("*"):  # warm the page cache: both sides read warm sources
        if f.is_file():
            f.read_bytes()

    t0 = time.perf_counter()
    _run([*_hframe(), "pack", str(args.source), "-o", str(work / "one.hframe"), "--created", CREATED, "-q"])
    one_s = time.perf_counter() - t0

    ds = work / "parts" / "ds.hframe"
    ds.parent.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    _run([*_hframe(), "pack", str(args.source), "-o", str(ds), "--plan-only", "-q"])
    plan_s = time.perf_counter() - t0
    plan = f"{ds}.plan.parquet"
    t1 = time.perf_counter()
    procs = []
    for i in range(args.parts):
        env = {**os.environ, "JOB_COMPLETION_INDEX": str(i)}
        argv = [*_hframe(), "pack", "--plan", plan, "-o", str(ds), "--shard-of", f"env/{args.parts}"]
        procs.append(subprocess.Popen([*argv, "--created", CREATED, "-q"], env=env, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"a part failed: {err.decode()[-500:]}")
    parts_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    _run([*_hframe(), "index", str(ds), "--merge", str(ds.parent / "ds-*.hframe"), "-q"])
    merge_s = time.perf_counter() - t2

    cols = ["name", "md5", "length"]
    with h.open_pack(work / "one.hframe") as one, h.open_pack(ds) as merged:
        same = one.table.select(cols).to_pylist() == merged.table.select(cols).to_pylist()
        frames, nbytes = len(one), one.pack_bytes
    sizes = sorted(os.path.getsize(p) for p in ds.parent.glob("ds-*.hframe"))
    array_s = plan_s + parts_s + merge_s
    print(
        f"bench=jobarray source={args.source} frames={frames} bytes={nbytes} parts={args.parts} cpus={os.cpu_count()}"
    )
    print(f"one_process_s={one_s:.2f}")
    print(f"plan_s={plan_s:.2f} parts_in_parallel_s={parts_s:.2f} merge_s={merge_s:.2f} job_array_s={array_s:.2f}")
    print(f"part_bytes_min={sizes[0]} part_bytes_max={sizes[-1]} (balanced by bytes)")
    print(f"job_array_vs_one_process={one_s / array_s:.2f} (wall time; > 1: the array is faster)")
    print(f"same_frames={same}")
    if args.out is None:
        shutil.rmtree(work)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
