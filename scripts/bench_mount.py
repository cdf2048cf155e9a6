#!/usr/bin/env python3
"""Benchmark ``hframe mount`` against ratarmount's mount of the same files as a tar, and against
reading the frames directly.

Usage: python scripts/bench_mount.py DATA_DIR [--count N] [--repeat 3]

Packs the first ``--count`` files (default: all) of ``DATA_DIR/jpegs``
(``scripts/make_bench_data.py``) into a pack, and tars the same files (``tar cf``). Then, in one
run, medians of ``--repeat``:

* ``md5_all_hframe_s`` / ``md5_all_ratarmount_s``: ``find MOUNT -type f -print0 | xargs -0
  md5sum`` over ``hframe mount`` of the pack and ``ratarmount`` (``pip install ratarmount``;
  skipped without it) of the tar, each freshly mounted (no FUSE page cache) with the pack's
  and the tar's pages evicted (cold) and then again (warm: the page cache of the pack or tar
  holds them; FUSE's own cache is dropped by mounting again). Goal: ratarmount / hframe >= 2.
* ``md5_all_loose_warm_s``: the same over the files themselves on the local disk, warm: the
  floor (``hframe_mount_vs_loose_md5_all_warm``: what the mount costs over it).
* ``random256_mount_first_s`` / ``random256_mount_s`` / ``random256_read_many_s``: 256 random
  files read through the mount (``open``, ``read``, ``close``, one by one as a script does), the
  first time (the pack's pages warm, the mount's not: FUSE read requests to the mount's process)
  and again (the kernel serves the pages it kept), against ``read_many`` of the same frames in
  this process, warm. The mount answers no ``open`` (the kernel then sends none, nor
  ``release``); what is left per file is Python's ``isatty`` check in ``open()`` (one ``ioctl``
  round trip on Python < 3.14) and, the first time, the reads.

The time to mount (the index read, the tree built) is printed for each. Output: one
``key=value`` line per measurement and ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HFRAME = os.path.join(os.path.dirname(sys.executable), "hframe")
RATARMOUNT = shutil.which("ratarmount") or os.path.join(os.path.dirname(sys.executable), "ratarmount")


def wait_mounted(where: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not os.path.ismount(where):
        if time.monotonic() > end:
            raise SystemExit(f"{where}: not mounted")
        time.sleep(0.01)


def unmount(where: str) -> None:
    subprocess.run(["fusermount3", "-u", where], check=False, capture_output=True)
    end = time.monotonic() + 30
    while os.path.ismount(where) and time.monotonic() < end:
        time.sleep(0.05)


def md5_all(where: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        f"find {where} -type f -print0 | xargs -0 md5sum > /dev/null", shell=True, check=True, executable="/bin/bash"
    )
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from hframe_cli import open_pack
    from hframe_cli.storage.access import evict_from_page_cache

    work = tempfile.mkdtemp(prefix="hframe-bench-mount-")
    try:
        src = os.path.join(args.data_dir, "jpegs")
        if args.count:
            names = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)
            src = os.path.join(work, "src")
            for n in names[: args.count]:
                os.makedirs(os.path.dirname(os.path.join(src, n)), exist_ok=True)
                shutil.copyfile(os.path.join(args.data_dir, "jpegs", n), os.path.join(src, n))
        pack, tar = os.path.join(work, "p.hframe"), os.path.join(work, "p.tar")
        subprocess.run([HFRAME, "pack", src, "-o", pack, "-q"], check=True)
        subprocess.run(["tar", "cf", tar, "-C", src, "."], check=True)
        with open_pack(pack) as p:
            print(f"frames={len(p)}")
        mnt_h, mnt_r = os.path.join(work, "mh"), os.path.join(work, "mr")
        os.makedirs(mnt_h)
        os.makedirs(mnt_r)

        def mount_hframe() -> float:
            t0 = time.perf_counter()
            subprocess.run([HFRAME, "mount", pack, mnt_h, "--background"], check=True)
            wait_mounted(mnt_h)
            return time.perf_counter() - t0

        def mount_ratar() -> float:
            t0 = time.perf_counter()
            subprocess.run([RATARMOUNT, tar, mnt_r], check=True, capture_output=True)
            wait_mounted(mnt_r)
            return time.perf_counter() - t0

        have_ratar = os.path.exists(RATARMOUNT)
        if not have_ratar:
            print("ratarmount=missing (pip install ratarmount)")
        runs: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for label, mount, where, backing in (
                ("hframe", mount_hframe, mnt_h, [pack]),
                *((("ratarmount", mount_ratar, mnt_r, [tar]),) if have_ratar else ()),
            ):
                for f in backing:
                    evict_from_page_cache(f)
                runs.setdefault(f"mount_{label}_s", []).append(mount())
                runs.setdefault(f"md5_all_{label}_cold_s", []).append(md5_all(where))
                unmount(where)
                mount()
                runs.setdefault(f"md5_all_{label}_warm_s", []).append(md5_all(where))
                unmount(where)
        for _ in range(args.repeat):  # the floor: md5sum of the same files on the local disk, warm
            md5_all(src)
            runs.setdefault("md5_all_loose_warm_s", []).append(md5_all(src))
        mount_hframe()
        try:
            with open_pack(pack) as p:
                table = p.table
                names = table.column("name").to_pylist()
                for _ in range(args.repeat):
                    ids = random.Random(len(runs["mount_hframe_s"]) + _).sample(range(len(names)), 256)
                    p.read_many(ids)  # the pack's pages warm
                    t0 = time.perf_counter()
                    for i in ids:
                        with open(os.path.join(mnt_h, names[i]), "rb") as f:
                            f.read()
                    runs.setdefault("random256_mount_first_s", []).append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    for i in ids:
                        with open(os.path.join(mnt_h, names[i]), "rb") as f:
                            f.read()
                    runs.setdefault("random256_mount_s", []).append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    p.read_many(ids)
                    runs.setdefault("random256_read_many_s", []).append(time.perf_counter() - t0)
        finally:
            unmount(mnt_h)
        med = {k: statistics.median(v) for k, v in runs.items()}
        for k, v in med.items():
            print(f"{k}={v:.3f}")
        if have_ratar:
            for t in ("cold", "warm"):
                print(
                    f"ratarmount_vs_hframe_md5_all_{t}={med[f'md5_all_ratarmount_{t}_s'] / med[f'md5_all_hframe_{t}_s']:.2f}"
                )
        print(f"hframe_mount_vs_loose_md5_all_warm={med['md5_all_hframe_warm_s'] / med['md5_all_loose_warm_s']:.2f}")
        print(f"mount_first_vs_read_many_random256={med['random256_mount_first_s'] / med['random256_read_many_s']:.2f}")
        print(f"mount_vs_read_many_random256={med['random256_mount_s'] / med['random256_read_many_s']:.2f}")
    finally:
        for m in ("mh", "mr"):
            unmount(os.path.join(work, m))
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
