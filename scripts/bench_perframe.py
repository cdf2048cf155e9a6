#!/usr/bin/env python3
"""The per-frame cost table (issue 17), every row from one run.

Usage: python scripts/bench_perframe.py DATA_DIR [--repeat 3] [--log FILE] [--no-cold]

DATA_DIR holds ``jpegs/`` and ``blobs/`` from ``scripts/make_bench_data.py``. This runs, one
after the other on the same quiet machine, ``bench_pack.py``, ``bench_read.py`` (warm, then
``--cold``), ``bench_verify.py`` and a start-up measurement, keeps their full output in
``--log`` (default ``DATA_DIR/_bench_out/perframe.log``), and prints the table below in
Markdown (the README's performance table is pasted from it), each row against its goal:

* ``pack`` time ÷ ``tar cf`` + ``sync`` (≤ 1.5), and its speed ÷ a minimal Python packer (≥ 1);
* warm ``p[i]`` loop ÷ bare ``os.pread`` loop over the same 256-frame batches (≥ 0.8);
* warm ``read_many(256 ids)`` (default threads) ÷ the same pread loop (≥ 0.9), and ÷ the
  ``p[i]`` loop (≥ 1: a batch is never slower than one call per frame); ``read_many_into`` with
  one buffer reused for every batch ÷ the pread loop (reported: no allocation per frame);
* cold ``read_many`` on 8 threads ÷ ``fio --rw=randread``, 8 jobs, same block size (≥ 0.9;
  needs ``fio``);
* ``hframe verify`` (the whole command, warm) throughput ÷ ``md5sum`` of the pack (≥ 1.3 on
  JPEGs; md5 on 2 cores caps it near 2.1);
* ``pack --update`` with nothing changed ÷ a full pack (≤ 0.10);
* the floors of those two rows (reported): a ``__getitem__`` with no check (two lookups in the
  index's arrays and one ``pread``), and a batch read that looks its ranges up and preads each
  (``bench_read.MinimalReader``); the bare loop itself is handed its ranges;
* warm ``p[i]`` and ``read_many`` on a reader opened with ``memory_map=True`` ÷ the pread loop
  (reported);
* the warm rows again in a process whose glibc keeps freed memory (``bench_read.py
  --keep-freed-heap``), and what that is worth to the bare pread loop (kept ÷ default, frames/s);
* start-up: ``hframe get PACK 0`` wall time, and the floor under it
  (``python -c "import pyarrow.parquet"``), medians of 15 runs (reported).

Ratios are frames/s or seconds measured side by side in one run by the scripts named; targets
are reported, never enforced (exit status 0 unless a script fails).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from typing import TextIO

HERE = os.path.dirname(os.path.abspath(__file__))
HFRAME = os.path.join(os.path.dirname(sys.executable), "hframe")

# (row label, result key, fields the result line must have, how to show it, goal)
ROWS: list[tuple[str, str, dict[str, str], str, str]] = [
    ("`hframe pack` ÷ (`tar cf` + `sync`)", "pack_vs_tar_sync", {}, "x", "≤ 1.5"),
    ("`hframe pack` speed ÷ a minimal Python packer", "pack_vs_seed", {}, "1/x", "≥ 1.0"),
    ("warm `p[i]` loop ÷ bare `os.pread` loop", "getitem_vs_bare_pread", {"mode": "warm"}, "x", "≥ 0.8"),
    (
        "warm `read_many(256 ids)` ÷ bare `os.pread` loop",
        "read_many_default_vs_bare_pread",
        {"mode": "warm"},
        "x",
        "≥ 0.9",
    ),
    ("warm `read_many(256 ids)` ÷ `p[i]` loop", "read_many_default_vs_getitem", {"mode": "warm"}, "x", "≥ 1.0"),
    # the floors of the two rows above: the least a reader handed ids can do (bench_read.MinimalReader)
    (
        "floor: a `__getitem__` with no check (two array lookups + `pread`) ÷ bare `os.pread` loop",
        "getitem_floor_vs_bare_pread",
        {"mode": "warm"},
        "x",
        "",
    ),
    (
        "floor: ranges looked up (`itemgetter`) + one `pread` each ÷ bare `os.pread` loop",
        "read_many_floor_vs_bare_pread",
        {"mode": "warm"},
        "x",
        "",
    ),
    (
        "warm `read_many_into(256 ids, reused buffer)` ÷ bare `os.pread` loop",
        "read_many_into_vs_bare_pread",
        {"mode": "warm"},
        "x",
        "",
    ),
    (
        "cold `read_many` (8 threads) ÷ `fio` randread, 8 jobs",
        "read_many_w8_vs_fio_8jobs",
        {"mode": "cold"},
        "x",
        "≥ 0.9",
    ),
    (
        "`hframe verify` (command, warm) ÷ `md5sum`",
        "verify_vs_md5sum",
        {"mode": "warm", "dataset": "jpegs"},
        "x",
        "≥ 1.3",
    ),
    ("`pack --update`, nothing changed ÷ full pack", "update_noop_vs_full", {}, "x", "≤ 0.10"),
    ("`find` (C, one core) stat of every file ÷ full pack: a no-op update's floor", "find_stat_vs_full", {}, "x", ""),
    # the same warm reads on a reader opened with memory_map=True (a copy per frame, no system call)
    (
        "`memory_map=True`: warm `p[i]` loop ÷ bare `os.pread` loop",
        "getitem_mmap_vs_bare_pread",
        {"mode": "warm"},
        "x",
        "",
    ),
    (
        "`memory_map=True`: warm `read_many(256 ids)` ÷ bare `os.pread` loop",
        "read_many_mmap_vs_bare_pread",
        {"mode": "warm"},
        "x",
        "",
    ),
    (
        "`memory_map=True`: warm `read_many_into(256 ids, reused buffer)` ÷ bare `os.pread` loop",
        "read_many_into_mmap_vs_bare_pread",
        {"mode": "warm"},
        "x",
        "",
    ),
    # the same warm reads in a process whose glibc keeps freed memory (bench_read.py --keep-freed-heap)
    ("heap kept¹: warm `p[i]` loop ÷ bare `os.pread` loop", "getitem_vs_bare_pread", {"mode": "warm_kept"}, "x", ""),
    (
        "heap kept¹: warm `read_many(256 ids)` ÷ bare `os.pread` loop",
        "read_many_default_vs_bare_pread",
        {"mode": "warm_kept"},
        "x",
        "",
    ),
    ("heap kept¹ ÷ default: warm bare `os.pread` loop, frames/s", "heap_kept_vs_default", {}, "x", ""),
]

RESULT = re.compile(r"^([a-z0-9_]+)=([-0-9.]+)((?: [a-z0-9_]+=\S+)*)")


def run(cmd: list[str], log: TextIO) -> list[str]:
    """Run one bench script, echo and log its output; its result lines are returned."""
    print(f"$ {' '.join(cmd)}", file=log, flush=True)
    print(f"running: {' '.join(os.path.basename(c) for c in cmd[1:3])} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(proc.stdout, proc.stderr, file=log, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout.splitlines()


def parse(lines: list[str]) -> list[tuple[str, float, dict[str, str]]]:
    out = []
    for line in lines:
        m = RESULT.match(line)
        if m and not line.startswith("bench="):
            fields = dict(kv.split("=", 1) for kv in m.group(3).split())
            out.append((m.group(1), float(m.group(2)), fields))
    return out


def startup(pack: str, repeat: int = 15) -> dict[str, float]:
    def median(cmd: list[str]) -> float:
        walls = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            walls.append(time.perf_counter() - t0)
        return statistics.median(walls)

    return {
        "hframe get": median([HFRAME, "get", pack, "0"]),
        "hframe --version": median([HFRAME, "--version"]),
        "python + pyarrow.parquet": median([sys.executable, "-c", "import pyarrow.parquet"]),
        "python": median([sys.executable, "-c", "pass"]),
    }


def goal_met(value: float, goal: str) -> bool:
    target = float(goal.split()[1])
    return value <= target if goal.startswith("≤") else value >= target


def io_stalled_s() -> float | None:
    """Seconds so far in which every task waiting on I/O was stalled (Linux PSI, "full"), or
    None where the kernel does not say. A shared VM disk stalls now and then; a run during which
    it did is not a measurement of the packer."""
    try:
        with open("/proc/pressure/io") as f:
            for line in f:
                if line.startswith("full"):
                    return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        pass
    return None


def io_share(before: float | None, after: float | None, seconds: float) -> str:
    if before is None or after is None or seconds <= 0:
        return "unknown"
    return f"{(after - before) / seconds:.0%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement in each script")
    ap.add_argument("--log", help="where the scripts' full output goes")
    ap.add_argument("--no-cold", action="store_true", help="skip bench_read.py --cold (the fio row)")
    args = ap.parse_args()
    out_dir = os.path.join(args.data_dir, "_bench_out")
    os.makedirs(out_dir, exist_ok=True)
    log_path = args.log or os.path.join(out_dir, "perframe.log")
    py = sys.executable
    results: list[tuple[str, float, dict[str, str]]] = []
    # as installed by pip: the package's bytecode compiled once (with PYTHONDONTWRITEBYTECODE set,
    # as on CI machines, a source tree's edited modules would be compiled again at every start)
    import hframe_cli

    subprocess.run([py, "-m", "compileall", "-q", os.path.dirname(hframe_cli.__file__)], check=True)
    stalled0, t0 = io_stalled_s(), time.monotonic()
    with open(log_path, "w") as log:
        print(f"cpus={os.cpu_count()} load1={os.getloadavg()[0]:.2f} started={time.strftime('%F %T')}", file=log)
        results += parse(
            run([py, os.path.join(HERE, "bench_pack.py"), args.data_dir, "--repeat", str(args.repeat)], log)
        )
        results += parse(run([py, os.path.join(HERE, "bench_read.py"), args.data_dir], log))
        results += parse(run([py, os.path.join(HERE, "bench_read.py"), args.data_dir, "--keep-freed-heap"], log))
        for dataset in ("jpegs", "blobs"):
            bare = {f["mode"]: v for k, v, f in results if k == "bare_pread_frames_per_s" and f["dataset"] == dataset}
            if {"warm", "warm_kept"} <= bare.keys():
                results.append(("heap_kept_vs_default", bare["warm_kept"] / bare["warm"], {"dataset": dataset}))
        if not args.no_cold:
            results += parse(run([py, os.path.join(HERE, "bench_read.py"), args.data_dir, "--cold"], log))
        results += parse(
            run([py, os.path.join(HERE, "bench_verify.py"), args.data_dir, "--repeat", str(args.repeat)], log)
        )
        starts = startup(os.path.join(out_dir, "jpegs.hframe"))
        print(" ".join(f"startup[{k}]={v:.3f}" for k, v in starts.items()), file=log)
        stalled = io_share(stalled0, io_stalled_s(), time.monotonic() - t0)
        print(f"load1={os.getloadavg()[0]:.2f} io_full_stall={stalled} finished={time.strftime('%F %T')}", file=log)

    print(
        f"Measured {time.strftime('%F')} by `scripts/bench_perframe.py {args.data_dir} --repeat {args.repeat}` "
        f"({os.cpu_count()} cores; the disk fully stalled {stalled} of the run; full output in {log_path}).\n"
    )
    print("| measurement | jpegs (20k, 34 KB mean) | blobs (200k, 2.6 KB mean) | goal |")
    print("| --- | --- | --- | --- |")
    for label, key, where, show, goal in ROWS:
        cells = []
        for dataset in ("jpegs", "blobs"):
            want = {**where, "dataset": dataset}
            got = [v for k, v, f in results if k == key and all(f.get(a) == b for a, b in want.items())]
            if where.get("dataset", dataset) != dataset:
                got = []  # a row for one data set only
            if not got:
                cells.append("—")
                continue
            value = 1 / got[-1] if show == "1/x" else got[-1]
            mark = "" if not goal else " ✓" if goal_met(value, goal) else " ✗"
            cells.append(f"{value:.2f}{mark}")
        print(f"| {label} | {cells[0]} | {cells[1]} | {goal or 'reported'} |")
    print(
        f"| start-up: `hframe get PACK 0`, s (floor: python + pyarrow.parquet) | "
        f"{starts['hframe get']:.3f} ({starts['python + pyarrow.parquet']:.3f}) | | reported |"
    )
    print(
        "\n¹ `GLIBC_TUNABLES=glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432`: "
        "glibc keeps freed memory instead of returning it to the kernel (`scripts/bench_read.py --keep-freed-heap`)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
