#!/usr/bin/env python3
"""How ``hframe pack --workers N`` scales, side by side with ``tar cf`` + ``sync`` in one run.

Usage: python scripts/bench_pack_workers.py DATA_DIR [--workers 1,2,3,4] [--repeat 3]

For each of ``DATA_DIR/jpegs`` and ``DATA_DIR/blobs`` (``scripts/make_bench_data.py``), after one
warm-up read of the sources: every round runs ``tar cf OUT.tar -C SRC . && sync`` and
``hframe pack SRC -o OUT --force -q --workers N`` for each N, in a new random order, each after a
``sync``; the median of ``--repeat`` rounds is reported, with speed-up over N=1 and the ratio
to tar. ``--workers 1`` is the one-writer loop in this process; N >= 2 forks N packing workers
(``hframe_cli/write/parallel.py``). Every pack is compared with the N=1 pack (same ``--created``): the
script fails if any byte differs.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HFRAME = str(Path(sys.executable).with_name("hframe"))


def timed(cmd: list[str], shell: str | None = None) -> float:
    subprocess.run(["sync"], check=True)
    t0 = time.perf_counter()
    if shell is not None:
        subprocess.run(shell, shell=True, check=True)
    else:
        subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir")
    ap.add_argument("--workers", default="1,2,3,4", help="comma-separated N values (default 1,2,3,4)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sets", default="jpegs,blobs")
    args = ap.parse_args()
    ns = [int(x) for x in args.workers.split(",")]
    out = Path(args.data_dir) / "_bench_out" / "workers"
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(17)
    print(f"cpus={len(os.sched_getaffinity(0))} load_avg={' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for name in args.sets.split(","):
        src = Path(args.data_dir) / name
        subprocess.run(f"tar cf - -C {src} . > /dev/null", shell=True, check=True)  # warm the page cache
        runs: dict[str, list[float]] = {"tar": [], **{f"w{n}": [] for n in ns}}
        for r in range(args.repeat):
            order = list(runs)
            rng.shuffle(order)
            for method in order:
                if method == "tar":
                    tar = out / f"{name}.tar"
                    t = timed([], shell=f"tar cf {tar} -C {src} . && sync")
                    tar.unlink()
                else:
                    n = int(method[1:])
                    pack = out / f"{name}-{n}.hframe"
                    t = timed(
                        [
                            HFRAME,
                            "pack",
                            str(src),
                            "-o",
                            str(pack),
                            "--force",
                            "-q",
                            "--workers",
                            str(n),
                            "--created",
                            "1700000000",
                        ]
                    )
                runs[method].append(t)
                print(f"bench=pack_workers dataset={name} method={method} run={r + 1} wall_s={t:.3f}", flush=True)
        base = out / f"{name}-{ns[0]}.hframe"
        for n in ns[1:]:
            other = out / f"{name}-{n}.hframe"
            for a, b in ((base, other), (Path(f"{base}.index.parquet"), Path(f"{other}.index.parquet"))):
                if a.read_bytes() != b.read_bytes():
                    print(f"FAIL: {b} differs from {a}", flush=True)
                    return 1
        med = {k: statistics.median(v) for k, v in runs.items()}
        one = med[f"w{ns[0]}"]
        for n in ns:
            m = med[f"w{n}"]
            print(
                f"pack_workers dataset={name} workers={n} wall_s_median={m:.3f} speedup_vs_{ns[0]}={one / m:.2f} "
                f"vs_tar_sync={m / med['tar']:.2f} (tar {med['tar']:.3f} s)",
                flush=True,
            )
        for n in ns:
            for suffix in ("", ".index.parquet"):
                Path(f"{out / f'{name}-{n}.hframe'}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
