#!/usr/bin/env python3
"""Writing side by side: ``hframe pack`` against ``tar cf`` + ``sync``, Lance's ``write_dataset``
and a 10-line Python packer; ``hframe verify`` against ``md5sum`` of the same pack.

Usage: python scripts/bench_write.py DATA_DIR [--repeat N] [--markdown]

DATA_DIR holds ``jpegs/`` and ``blobs/`` (``scripts/make_bench_data.py``). Every round runs
every method once, in a new (seeded) random order; before each run the sources are read again
(this VM's kernel evicts page cache on its own, so a method could otherwise meet cold sources
by the luck of its turn) and the previous run's dirty pages are synced. Each method is a fresh
process (start-up counted, as a user pays it):

* ``tar``:    ``tar cf OUT.tar -C SRC . && sync``;
* ``lance``:  the files read in name order, 1,024 to an Arrow record batch (name, bytes), streamed
  to ``lance.write_dataset``, then ``sync`` (no per-frame hash; only when ``pylance`` is
  installed);
* ``packer10``: the 10-line packer (sorted walk, concatenate, md5 each file, JSON index, fsync);
* ``hframe``: ``hframe pack SRC -o OUT --force -q``;
* ``md5sum`` and ``verify`` (JPEGs): ``md5sum PACK`` and ``hframe verify PACK -q`` of the pack
  just written, warm (read once before).

Prints one line per run, then medians with the spread, the ratios against the issue's goals
(``pack / tar <= 1.3``, ``pack`` faster than Lance and the 10-line packer,
``verify`` >= 1.5x ``md5sum``'s speed) and, with ``--markdown``, the README's table.
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

HERE = os.path.dirname(os.path.abspath(__file__))
HFRAME = os.path.join(os.path.dirname(sys.executable), "hframe")

PACKER10 = r"""
import hashlib, json, os, sys
src, out = sys.argv[1], sys.argv[2]
files = sorted((os.path.relpath(os.path.join(r, f), src) for r, _, fs in os.walk(src) for f in fs), key=os.fsencode)
index, offset = [], 0
with open(out, "wb") as pack:
    for name in files:
        data = open(os.path.join(src, name), "rb").read()
        pack.write(data)
        index.append({"name": name, "offset": offset, "length": len(data), "md5": hashlib.md5(data).hexdigest()})
        offset += len(data)
    pack.flush(); os.fsync(pack.fileno())
with open(out + ".json", "w") as f:
    json.dump(index, f); f.flush(); os.fsync(f.fileno())
"""

LANCE = r"""
import os, subprocess, sys
import lance, pyarrow as pa
src, out = sys.argv[1], sys.argv[2]
files = sorted((os.path.relpath(os.path.join(r, f), src) for r, _, fs in os.walk(src) for f in fs), key=os.fsencode)
schema = pa.schema([("name", pa.string()), ("data", pa.large_binary())])
def batches():  # 1,024 files a batch: one table of every file's bytes was 2x slower here
    for i in range(0, len(files), 1024):
        names, datas = files[i : i + 1024], []
        for name in names:
            with open(os.path.join(src, name), "rb") as f:
                datas.append(f.read())
        yield pa.record_batch([pa.array(names, pa.string()), pa.array(datas, pa.large_binary())], schema=schema)
lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), out, mode="overwrite")
subprocess.run(["sync"], check=True)
"""


def have_lance() -> bool:
    try:
        import lance  # noqa: F401
    except ImportError:
        return False
    return True


def warm(src: str) -> int:
    """Read every source (page cache), return the bytes."""
    total = 0
    for root, _, files in os.walk(src):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                while chunk := os.read(fd, 1 << 20):
                    total += len(chunk)
            finally:
                os.close(fd)
    return total


def run(cmd: list[str]) -> float:
    os.sync()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall


def clear(path: str) -> None:
    for p in (path, path + ".json", path + ".index.parquet"):
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)


def bench_set(data_dir: str, out_dir: str, name: str, repeat: int, rng: random.Random) -> dict[str, list[float]]:
    src = os.path.join(data_dir, name)
    outs = {m: os.path.join(out_dir, f"{name}.{m}") for m in ("tar", "lance", "packer10", "hframe")}
    methods = {
        "tar": ["sh", "-c", f'tar cf "{outs["tar"]}" -C "{src}" . && sync'],
        "packer10": [sys.executable, "-c", PACKER10, src, outs["packer10"]],
        "hframe": [HFRAME, "pack", src, "-o", outs["hframe"], "--force", "-q"],
    }
    if have_lance():
        methods["lance"] = [sys.executable, "-c", LANCE, src, outs["lance"]]
    verify = name == "jpegs"
    times: dict[str, list[float]] = {m: [] for m in methods}
    if verify:
        times["md5sum"], times["verify"] = [], []
    nbytes = 0
    for r in range(1, repeat + 1):
        order = list(methods)
        rng.shuffle(order)
        for m in order:
            clear(outs[m])
            nbytes = warm(src)
            wall = run(methods[m])
            times[m].append(wall)
            print(f"bench=write set={name} method={m} run={r} wall_s={wall:.3f}", flush=True)
            if m != "hframe" and m != "tar":
                clear(outs[m])  # room on the disk; tar and hframe are kept (tar for the size check)
        if verify:  # the pack just written, warm, the two in a random order
            pack = outs["hframe"]
            warm_file(pack)
            pair = [("md5sum", ["md5sum", pack]), ("verify", [HFRAME, "verify", pack, "-q"])]
            rng.shuffle(pair)
            for m, cmd in pair:
                wall = run(cmd)
                times[m].append(wall)
                print(f"bench=write set={name} method={m} run={r} wall_s={wall:.3f}", flush=True)
    for m in outs:
        clear(outs[m])
    print(f"bench=write set={name} bytes={nbytes}", flush=True)
    return times


def warm_file(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 22):
            pass


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir", help="folder with jpegs/ and blobs/ (make_bench_data.py)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    ap.add_argument("--sets", default="jpegs,blobs", help="which of jpegs,blobs")
    ap.add_argument("--markdown", action="store_true", help="also print the README's table")
    ap.add_argument("--seed", type=int, default=35)
    args = ap.parse_args()
    # as installed by pip: the package's bytecode compiled once (with PYTHONDONTWRITEBYTECODE set,
    # as here and on CI machines, a source tree's edited modules are compiled again at every start:
    # 100+ ms of a remote open once, when its storage modules had changed)
    import hframe_cli

    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.dirname(hframe_cli.__file__)], check=True)
    out_dir = os.path.join(args.data_dir, "_bench_write")
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(args.seed)
    sets = [s for s in args.sets.split(",") if s]
    results = {s: bench_set(args.data_dir, out_dir, s, args.repeat, rng) for s in sets}
    print()
    ok = True
    rows = []
    for s, times in results.items():
        med = {m: statistics.median(v) for m, v in times.items()}
        for m, v in times.items():
            print(f"bench=write set={s} method={m} median_s={med[m]:.3f} min_s={min(v):.3f} max_s={max(v):.3f}")
        ratio = med["hframe"] / med["tar"]
        good = ratio <= 1.3
        ok &= good
        print(f"set={s} pack_vs_tar_sync={ratio:.2f} target<=1.3 result={'PASS' if good else 'FAIL'}")
        for rival in ("lance", "packer10"):
            if rival in med:
                r = med[rival] / med["hframe"]
                good = r > 1.0
                ok &= good
                print(f"set={s} pack_speed_vs_{rival}={r:.2f} target>1.0 result={'PASS' if good else 'FAIL'}")
        if "verify" in med:
            r = med["md5sum"] / med["verify"]
            good = r >= 1.5
            ok &= good
            print(f"set={s} verify_speed_vs_md5sum={r:.2f} target>=1.5 result={'PASS' if good else 'FAIL'}")
        rows.append((s, times, med))
    if args.markdown:
        print()
        print("| | " + " | ".join(s for s, _, _ in rows) + " |")
        print("|---|" + "---|" * len(rows))
        labels = {
            "tar": "`tar cf` + `sync`",
            "lance": "Lance `write_dataset` + `sync` (no per-frame hash)",
            "packer10": "the 10-line Python packer (concat + md5 + JSON)",
            "hframe": "`hframe pack`",
        }
        for m, label in labels.items():
            cells = []
            for _, times, med in rows:
                if m not in times:
                    cells.append("—")
                elif m == "hframe":
                    cells.append(f"{spread(times[m])}: **{med[m] / med['tar']:.2f}× tar**")
                else:
                    cells.append(spread(times[m]))
            print(f"| {label} | " + " | ".join(cells) + " |")
        for _, times, med in rows:
            if "verify" in med:
                print(
                    f"| `hframe verify` / `md5sum` of the pack (warm) | {spread(times['verify'])} / "
                    f"{spread(times['md5sum'])}: **{med['md5sum'] / med['verify']:.2f}× md5sum's speed** | |"
                )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
