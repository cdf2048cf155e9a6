#!/usr/bin/env python3
"""Benchmark ``hframe verify`` against ``md5sum`` and a minimal "seed-style" scan.

Usage: python scripts/bench_verify.py DATA_DIR [--repeat N]

DATA_DIR holds ``_bench_out/`` from ``scripts/bench_pack.py``: for each data set (jpegs,
blobs) the hframe pack ``<set>.hframe`` with its index, and the seed pack ``<set>.seed`` with
its JSON index ``<set>.seed.json``. Run ``bench_pack.py`` (or ``hframe pack``) first so the
packs come from the code being measured. Each measurement runs ``--repeat`` times (default 3),
the methods interleaved run by run, and the median wall time is reported:

* ``md5sum``:      ``md5sum PACK`` (GNU coreutils, one thread);
* ``seed_scan``:   the seed-style check below: ``json.load`` the index, read the seed pack
  sequentially in 8 MB chunks, md5 each frame and compare with the JSON table; run as
  ``python bench_verify.py --seed-scan PACK INDEX`` so it pays interpreter start-up like the CLI;
* ``verify``:      ``python -m hframe_cli verify PACK -q`` (every frame);
* ``verify_sample``: ``python -m hframe_cli verify PACK --sample 5% -q``;
* ``verify_pack`` (information only): ``hframe_cli.verify.check.verify_pack(PACK)`` in this process;
* ``verify_pack_sample`` (information only): the same with a 5 % sample;
* ``python_pyarrow_start`` (information only): ``python -c "import pyarrow.parquet"``, the
  start-up any Python program reading the index pays (a floor under the CLI's times).

Cold: before every timed run the data files (both packs and both indexes) are evicted from the
page cache (``posix_fadvise(DONTNEED)``, as ``hframe bench-cold`` does), so every method reads
its data from the disk while the programs themselves (md5sum, Python, pyarrow) stay cached, as
on a machine that runs them routinely. ``--drop-all-caches`` instead empties the whole page
cache (``echo 3 > /proc/sys/vm/drop_caches``, root): then every Python run also loads the
interpreter and pyarrow from disk, a fixed cost that md5sum does not pay. On a VM the host may
still cache the files either way. Warm: each method runs once untimed, then the timed runs.
Throughput is the size of the file read (hframe pack, or seed pack for seed_scan) / wall time.

Targets (reported, not enforced; the exit status is 0 unless something errors):
  jpegs: verify_vs_md5sum >= 1.6 warm and >= 1.0 cold (throughput ratio);
  both:  verify_vs_seed_scan >= 1.0 cold (seed-scan seconds / verify seconds);
  blobs: verify_vs_md5sum >= 0.8 (cold and warm);
  both:  sample5_vs_full <= 0.10 cold (sampled seconds / full seconds).
Output: one ``key=value`` line per measurement, then one line per ratio with PASS/FAIL.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from bench_pack import verdict

import hframe_cli
from hframe_cli.storage.access import evict_from_page_cache
from hframe_cli.verify.check import verify_pack

DATASETS = ("jpegs", "blobs")
SEED_CHUNK = 8 << 20
#: run the CLI from the folder holding the imported package, so ``-m hframe_cli`` is this code
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(hframe_cli.__file__)))


def seed_scan(pack: str, index_path: str) -> int:
    """The seed-style check: sequential 8 MB reads, md5 of each frame vs the JSON table.

    Returns the number of frames whose md5 (or presence) does not match.
    """
    with open(index_path) as f:
        index = json.load(f)
    bad = 0
    buf, base = b"", 0  # buf holds pack bytes [base, base + len(buf))
    with open(pack, "rb", buffering=0) as f:
        for e in index:
            off, ln = e["offset"], e["length"]
            while off + ln > base + len(buf):
                chunk = f.read(SEED_CHUNK)
                if not chunk:
                    break
                keep = max(0, min(off - base, len(buf)))
                buf, base = buf[keep:] + chunk, base + keep
            view = memoryview(buf)[off - base : off - base + ln]
            if len(view) != ln or hashlib.md5(view).hexdigest() != e["md5"]:
                bad += 1
    return bad


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def evict(paths: list[str]) -> None:
    for p in paths:
        if not evict_from_page_cache(p):
            raise RuntimeError(f"cannot evict {p} from the page cache")


def run_cmd(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=PKG_ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stdout[-1000:]}{proc.stderr[-2000:]}")


def methods_for(pack: str, seed: str) -> dict[str, Callable[[], None]]:
    cli = [sys.executable, "-m", "hframe_cli", "verify", pack, "-q"]

    def in_process() -> None:
        rep = verify_pack(pack)
        if not rep.ok or rep.frames_checked != rep.frames_total:
            raise RuntimeError(f"verify_pack({pack}): {rep.status}, {rep.frames_checked}/{rep.frames_total} frames")

    def in_process_sample() -> None:
        rep = verify_pack(pack, sample=("percent", 5.0))
        if not rep.ok or not rep.frames_checked:
            raise RuntimeError(f"verify_pack({pack}, 5%): {rep.status}")

    return {
        "md5sum": lambda: run_cmd(["md5sum", pack]),
        "seed_scan": lambda: run_cmd([sys.executable, os.path.abspath(__file__), "--seed-scan", seed, seed + ".json"]),
        "verify": lambda: run_cmd(cli),
        "verify_sample": lambda: run_cmd([*cli, "--sample", "5%"]),
        "verify_pack": in_process,
        "verify_pack_sample": in_process_sample,
        # the fixed cost of any Python program that reads Parquet: interpreter + pyarrow.parquet
        "python_pyarrow_start": lambda: run_cmd([sys.executable, "-c", "import pyarrow.parquet"]),
    }


def bench_dataset(out_dir: str, name: str, repeat: int, drop_all: bool) -> dict[tuple[str, str], float]:
    pack, seed = os.path.join(out_dir, f"{name}.hframe"), os.path.join(out_dir, f"{name}.seed")
    for p in (pack, pack + ".index.parquet", seed, seed + ".json"):
        if not os.path.exists(p):
            raise SystemExit(f"{p} not found: run scripts/bench_pack.py {os.path.dirname(out_dir)} first")
    sizes = {"pack": os.path.getsize(pack), "seed": os.path.getsize(seed)}
    data_files = [pack, pack + ".index.parquet", seed, seed + ".json"]
    methods = methods_for(pack, seed)
    runs: dict[tuple[str, str], list[float]] = {}
    for mode in ("cold", "warm"):
        if mode == "warm":
            for fn in methods.values():
                fn()  # untimed: fills the page cache (and the interpreter's file caches)
        for r in range(1, repeat + 1):
            for method, fn in methods.items():
                if mode == "cold":
                    drop_caches() if drop_all else evict(data_files)
                t0 = time.perf_counter()
                fn()
                wall = time.perf_counter() - t0
                runs.setdefault((mode, method), []).append(wall)
                print(f"bench=verify mode={mode} dataset={name} method={method} run={r} wall_s={wall:.3f}", flush=True)
    medians = {}
    for (mode, method), walls in runs.items():
        wall = medians[mode, method] = statistics.median(walls)
        nbytes = sizes["seed" if method == "seed_scan" else "pack"]
        print(
            f"bench=verify mode={mode} dataset={name} method={method} bytes={nbytes} "
            f"wall_s_median={wall:.3f} gb_per_s={nbytes / 1e9 / wall:.3f}",
            flush=True,
        )
    # throughput ratios are over the same pack bytes, so they are inverse time ratios
    return medians


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir", nargs="?", help="folder whose _bench_out/ holds the packs (bench_pack.py)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    ap.add_argument("--drop-all-caches", action="store_true", help="cold: empty the whole page cache (root)")
    ap.add_argument("--seed-scan", nargs=2, metavar=("PACK", "INDEX"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.seed_scan:
        bad = seed_scan(*args.seed_scan)
        if bad:
            print(f"seed scan: {bad} frames do not match", file=sys.stderr)
        return 1 if bad else 0
    if not args.data_dir:
        ap.error("DATA_DIR is required")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if not shutil.which("md5sum"):
        ap.error("md5sum not found")
    if args.drop_all_caches:
        try:
            drop_caches()
        except OSError as e:
            ap.error(f"cannot drop the page cache ({e}): run as root")
    cold = "whole page cache dropped" if args.drop_all_caches else "data files evicted"
    print(
        f"bench=verify hframe_cli={PKG_ROOT} cpus={os.cpu_count()} load1={os.getloadavg()[0]:.2f} cold={cold!r}",
        flush=True,
    )

    out_dir = os.path.join(args.data_dir, "_bench_out")
    med = {name: bench_dataset(out_dir, name, args.repeat, args.drop_all_caches) for name in DATASETS}
    for name in DATASETS:
        m = med[name]
        for mode in ("cold", "warm"):
            ratio = m[mode, "md5sum"] / m[mode, "verify"]
            target = (1.6 if mode == "warm" else 1.0) if name == "jpegs" else 0.8
            verdict("verify_vs_md5sum", ratio, target, True, f" mode={mode} dataset={name}")
        verdict(
            "verify_vs_seed_scan", m["cold", "seed_scan"] / m["cold", "verify"], 1.0, True, f" mode=cold dataset={name}"
        )
        print(
            f"verify_vs_seed_scan={m['warm', 'seed_scan'] / m['warm', 'verify']:.3f} mode=warm dataset={name} "
            "target=none"
        )
        verdict(
            "sample5_vs_full",
            m["cold", "verify_sample"] / m["cold", "verify"],
            0.10,
            False,
            f" mode=cold dataset={name}",
        )
        for mode in ("cold", "warm"):
            print(
                f"verify_pack_vs_md5sum={m[mode, 'md5sum'] / m[mode, 'verify_pack']:.3f} mode={mode} "
                f"dataset={name} target=none"
            )
        print(
            f"sample5_vs_full_in_process={m['cold', 'verify_pack_sample'] / m['cold', 'verify_pack']:.3f} "
            f"mode=cold dataset={name} target=none (the same ratio without interpreter start-up)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
