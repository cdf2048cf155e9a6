#!/usr/bin/env python3
"""Benchmark ``hframe pack --from tar|zip|parquet`` against extracting and packing the folder.

Usage: python scripts/bench_archives.py DATA_DIR [--repeat N] [--sets jpegs,blobs]

DATA_DIR holds ``jpegs/`` and ``blobs/`` from ``scripts/make_bench_data.py``. For each set, a
tar (``tar cf``), a stored zip (``zip -0``) and a Parquet table (columns ``name`` and ``data``,
rows in name order, pyarrow's defaults) of it are made once in ``DATA_DIR/_bench_out/``,
read once (warm page cache), then each of these runs ``--repeat`` times (default 3),
alternated, and the median wall time is reported:

* ``from_tar``: ``hframe pack --from tar SET.tar -o OUT --force``;
* ``from_zip``: ``hframe pack --from zip SET.zip -o OUT --force``;
* ``from_parquet``: ``hframe pack --from parquet SET.parquet --column data --name-column name``;
* ``extract``:  ``tar xf SET.tar`` into an empty folder (what a user does today first);
* ``folder``:   ``hframe pack FOLDER -o OUT --force`` of that extracted folder;
* ``extract_then_pack`` = ``extract`` + ``folder``, the whole of today's way.

Ratios (goal: ``from_tar_vs_folder`` <= 1.0, and so far below ``extract_then_pack``):
``from_tar_vs_folder``, ``from_zip_vs_folder``, ``from_parquet_vs_folder``,
``from_tar_vs_extract_then_pack``. The frames of the packs are compared (names, md5, sizes,
times; a table's rows have its time, so only names and md5 there: the script fails if they differ).
Output: one ``key=value`` line per measurement or ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

HFRAME = os.path.join(os.path.dirname(sys.executable), "hframe")
SAME = ["name", "md5", "source_size", "source_mtime"]


def timed(cmd: list[str], cwd: str | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def frames(pack: str) -> list[dict]:
    return pq.read_table(f"{pack}.index.parquet", columns=SAME).to_pylist()


def write_table(src: str, path: str) -> None:
    """The set as a table: one row per file, in name order (what a dataset export looks like)."""
    names = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, files in os.walk(src) for f in files)
    writer = None
    for i in range(0, len(names), 10_000):
        chunk = names[i : i + 10_000]
        data = [open(os.path.join(src, n), "rb").read() for n in chunk]
        t = pa.table({"name": chunk, "data": pa.array(data, pa.binary())})
        writer = writer or pq.ParquetWriter(path, t.schema)
        writer.write_table(t)
    if writer is not None:
        writer.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sets", default="jpegs,blobs")
    args = ap.parse_args()
    out = os.path.join(args.data_dir, "_bench_out")
    os.makedirs(out, exist_ok=True)
    for name in args.sets.split(","):
        src = os.path.join(args.data_dir, name)
        tar, zipf = os.path.join(out, f"{name}.tar"), os.path.join(out, f"{name}.zip")
        if not os.path.exists(tar):
            subprocess.run(["tar", "cf", tar, "-C", src, "."], check=True)
        if not os.path.exists(zipf):
            subprocess.run(["zip", "-qr0", zipf, "."], cwd=src, check=True)
        table = os.path.join(out, f"{name}.parquet")
        if not os.path.exists(table):
            write_table(src, table)
        for f in (tar, zipf, table):
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
        times: dict[str, list[float]] = {k: [] for k in ("from_tar", "from_zip", "from_parquet", "extract", "folder")}
        folder = os.path.join(out, f"{name}-x")
        packs = {k: os.path.join(out, f"{name}-{k}.hframe") for k in ("tar", "zip", "parquet", "folder")}
        by_rows = ["--from", "parquet", table, "--column", "data", "--name-column", "name"]
        for _ in range(args.repeat):
            times["from_tar"].append(timed([HFRAME, "pack", "--from", "tar", tar, "-o", packs["tar"], "--force", "-q"]))
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            times["extract"].append(timed(["tar", "xf", tar], cwd=folder))
            times["folder"].append(timed([HFRAME, "pack", folder, "-o", packs["folder"], "--force", "-q"]))
            times["from_zip"].append(
                timed([HFRAME, "pack", "--from", "zip", zipf, "-o", packs["zip"], "--force", "-q"])
            )
            times["from_parquet"].append(timed([HFRAME, "pack", *by_rows, "-o", packs["parquet"], "--force", "-q"]))
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"{name}.{k}_s={v:.3f}")
        print(f"{name}.extract_then_pack_s={med['extract'] + med['folder']:.3f}")
        print(f"{name}.from_tar_vs_folder={med['from_tar'] / med['folder']:.2f}")
        print(f"{name}.from_zip_vs_folder={med['from_zip'] / med['folder']:.2f}")
        print(f"{name}.from_parquet_vs_folder={med['from_parquet'] / med['folder']:.2f}")
        print(f"{name}.from_tar_vs_extract_then_pack={med['from_tar'] / (med['extract'] + med['folder']):.2f}")
        if not frames(packs["tar"]) == frames(packs["zip"]) == frames(packs["folder"]):
            print(f"{name}: the frames of the packs differ", file=sys.stderr)
            return 1
        named = [{k: f[k] for k in ("name", "md5")} for f in frames(packs["folder"])]
        if [{k: f[k] for k in ("name", "md5")} for f in frames(packs["parquet"])] != named:
            print(f"{name}: the frames of the table's pack differ", file=sys.stderr)
            return 1
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
