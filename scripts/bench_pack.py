#!/usr/bin/env python3
"""Benchmark ``hframe pack`` against tar and a minimal "seed-style" packer.

Usage: python scripts/bench_pack.py DATA_DIR [--repeat N]

DATA_DIR holds ``jpegs/`` and ``blobs/`` from ``scripts/make_bench_data.py``. Outputs go to
``DATA_DIR/_bench_out/`` (the 1M-frame index pack is kept there and reused). For each data set
the sources are read once first (warm page cache), then each of these runs ``--repeat`` times
(default 3), in a new random (seeded) order every run, and the median wall time is reported:

* ``tar``:    ``tar cf OUT.tar -C SRC . && sync`` (the baseline that makes data durable);
* ``seed``:   the minimal packer below (sorted walk, concatenate, md5 each file, JSON index
  ``[{name, offset, length, md5}]``, fsync both), run as ``python bench_pack.py --seed-pack``
  so it pays interpreter start-up like the CLI does;
* ``hframe``: ``hframe pack SRC -o OUT.hframe --force`` (includes fsync, Parquet index and
  the self-check), with its peak RSS from ``/usr/bin/time`` (or ``getrusage``);
* ``hframe_nockpt``: the same with ``--no-checkpoint`` (to a separate output, removed at the
  end), for the cost of checkpoints (default: on);
* ``hframe_update_noop``: ``hframe pack SRC -o OUT.hframe --update`` on the pack
  the ``hframe`` run just wrote, nothing having changed (no rewrite expected; the script fails
  if the pack's size or mtime changes);
* ``find_stat``: ``find SRC -type f -printf "%s %T@\\n"``: the ``stat`` of every file a no-op
  update must make, by a C program on one core (printed as ``find_stat_vs_full``).

Index lookup at 1,000,000 frames: a real pack of 1M tiny frames is written once through
``hframe_cli.PackWriter`` (no million files on disk), plus the matching JSON list. Timed
in-process (warm): open + one lookup by id + one by name, ``open_pack`` vs ``json.load``
followed by list indexing and a linear name search.

Targets (reported, not enforced; the exit status is 0 unless something errors):
  pack_vs_tar_sync <= 1.5, pack_vs_seed <= 1.0, rss_200k_vs_20k <= 2.0,
  index_lookup_speedup_vs_json >= 10, checkpoint_overhead (hframe / hframe_nockpt - 1) <= 0.05
  on both sets, update_noop_vs_full (hframe_update_noop / hframe, both sets) <= 0.10.
The first line names the ``hframe_cli`` the ``hframe`` command imports (PYTHONPATH applies).
Output: one ``key=value`` line per measurement, then one line per ratio with PASS/FAIL.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HFRAME = os.path.join(os.path.dirname(sys.executable), "hframe")
GNU_TIME = "/usr/bin/time"
DATASETS = ("jpegs", "blobs")
UPDATE_DATASETS = ("jpegs", "blobs")  # where the no-op ``--update`` is timed
INDEX_FRAMES = 1_000_000


def list_files(src: str) -> list[tuple[str, str]]:
    """(name, path) of every file under ``src``, sorted by name bytes as hframe sorts them."""
    out = []
    for root, _, files in os.walk(src):
        for f in files:
            path = os.path.join(root, f)
            out.append((os.path.relpath(path, src).replace(os.sep, "/"), path))
    out.sort(key=lambda e: os.fsencode(e[0]))
    return out


def seed_pack(src: str, out: str) -> None:
    """The seed-style packer: one concatenated file plus a JSON index, both fsynced."""
    index = []
    offset = 0
    with open(out, "wb") as pack:
        for name, path in list_files(src):
            with open(path, "rb") as f:
                data = f.read()
            pack.write(data)
            index.append({"name": name, "offset": offset, "length": len(data), "md5": hashlib.md5(data).hexdigest()})
            offset += len(data)
        pack.flush()
        os.fsync(pack.fileno())
    with open(out + ".json", "w") as f:
        json.dump(index, f)
        f.flush()
        os.fsync(f.fileno())


def timed(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` after a sync; return (wall seconds, peak RSS in MB)."""
    os.sync()  # do not charge one run for flushing the previous run's dirty pages
    with tempfile.NamedTemporaryFile("r") as rss_file:
        if os.access(GNU_TIME, os.X_OK):
            cmd = [GNU_TIME, "-f", "%M", "-o", rss_file.name, *cmd]
        else:  # fresh child per run, so RUSAGE_CHILDREN sees only this command
            cmd = [
                sys.executable,
                "-c",
                "import resource,subprocess,sys;"
                "r=subprocess.run(sys.argv[2:]).returncode;"
                "open(sys.argv[1],'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss));"
                "sys.exit(r)",
                rss_file.name,
                *cmd,
            ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return wall, int(rss_file.read().split()[-1]) / 1024


def remove(*paths: str) -> None:
    for p in paths:
        if os.path.exists(p):
            os.remove(p)


def warm(files: list[tuple[str, str]]) -> int:
    total = 0
    for _, path in files:
        with open(path, "rb") as f:
            total += len(f.read())
    return total


def bench_dataset(data_dir: str, out_dir: str, name: str, repeat: int) -> dict[str, tuple[float, float]]:
    src = os.path.join(data_dir, name)
    files = list_files(src)
    nbytes = warm(files)
    tar_out = os.path.join(out_dir, f"{name}.tar")
    seed_out = os.path.join(out_dir, f"{name}.seed")
    hf_out = os.path.join(out_dir, f"{name}.hframe")
    nockpt_out = os.path.join(out_dir, f"{name}.nockpt.hframe")
    methods = {
        "tar": ([tar_out], ["sh", "-c", f'tar cf "{tar_out}" -C "{src}" . && sync']),
        "seed": (
            [seed_out, seed_out + ".json"],
            [sys.executable, os.path.abspath(__file__), "--seed-pack", src, seed_out],
        ),
        "hframe": ([hf_out, hf_out + ".index.parquet"], [HFRAME, "pack", src, "-o", hf_out, "--force"]),
    }
    if name in UPDATE_DATASETS:  # right after "hframe", on the pack it wrote; nothing is removed
        methods["hframe_update_noop"] = ([], [HFRAME, "pack", src, "-o", hf_out, "--update"])
        # what any no-op update must do at least: a stat of every file (C, one process)
        methods["find_stat"] = ([], ["sh", "-c", f'find "{src}" -type f -printf "%s %T@\\n" > /dev/null'])
    methods["hframe_nockpt"] = (
        [nockpt_out, nockpt_out + ".index.parquet"],
        [HFRAME, "pack", src, "-o", nockpt_out, "--force", "--no-checkpoint"],
    )
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    # a new random (seeded) order every run; the no-op update stays right after the pack it
    # updates. A run right after one that wrote 700 MB pays for it (the VM host flushing them?),
    # so no method may always follow the same one: the order used to turn, which kept every
    # method's predecessor (hframe always after seed, hframe_nockpt always after the no-op
    # update), and checkpoint_overhead read 0.2-1.0 in three runs while in-process, alternating,
    # the two measured the same
    groups = [[m] for m in methods if m not in ("hframe", "hframe_update_noop")]
    groups.append([m for m in ("hframe", "hframe_update_noop") if m in methods])
    shuffler = random.Random(len(name) + repeat)
    for r in range(1, repeat + 1):
        shuffler.shuffle(groups)
        order = [m for g in groups for m in g]
        for method in order:
            outputs, cmd = methods[method]
            remove(*outputs)
            before = os.stat(hf_out) if method == "hframe_update_noop" else None
            wall, rss = timed(cmd)
            if before is not None:
                after = os.stat(hf_out)
                if (after.st_size, after.st_mtime_ns, after.st_ino) != (
                    before.st_size,
                    before.st_mtime_ns,
                    before.st_ino,
                ):
                    raise RuntimeError(f"--update rewrote {hf_out} although nothing changed")
            runs[method].append((wall, rss))
            print(
                f"bench=pack dataset={name} method={method} run={r} wall_s={wall:.3f} peak_rss_mb={rss:.1f}", flush=True
            )
    medians = {}
    for method, rs in runs.items():
        wall = statistics.median(w for w, _ in rs)
        rss = statistics.median(m for _, m in rs)
        medians[method] = (wall, rss)
        print(
            f"bench=pack dataset={name} method={method} files={len(files)} bytes={nbytes} "
            f"wall_s_median={wall:.3f} mb_per_s={nbytes / 1e6 / wall:.1f} files_per_s={len(files) / wall:.0f} "
            f"peak_rss_mb_median={rss:.1f}",
            flush=True,
        )
    remove(nockpt_out, nockpt_out + ".index.parquet")
    return medians


def build_index_pack(out_dir: str, frames: int) -> tuple[str, str]:
    """A real pack of 1M tiny frames (via PackWriter) and the matching JSON index; cached."""
    import hframe_cli

    pack_path = os.path.join(out_dir, f"index{frames}.hframe")
    json_path = pack_path + ".json"
    if os.path.exists(json_path) and os.path.exists(pack_path + ".index.parquet"):
        return pack_path, json_path
    t0 = time.perf_counter()
    with hframe_cli.PackWriter(pack_path, created_us=0, force=True) as w:
        for i in range(frames):
            w.add(f"{i // 2000:03d}/{i:07d}.bin".encode(), i.to_bytes(8, "little"))
        w.seal()
        w.publish()
    with hframe_cli.open_pack(pack_path) as r:
        rows = r.table.select(["name", "offset", "length", "md5"]).to_pylist()
    with open(json_path, "w") as f:
        json.dump(rows, f)
    print(f"bench=index_build frames={frames} seconds={time.perf_counter() - t0:.1f}", flush=True)
    return pack_path, json_path


def bench_index(out_dir: str, repeat: int, frames: int) -> float:
    """Median seconds for open + lookup by id + by name; hframe vs JSON. Returns the speedup."""
    import hframe_cli

    pack_path, json_path = build_index_pack(out_dir, frames)
    a, b = frames * 7 // 9, frames * 5 // 9  # an id and a name well inside the index
    want_id, want_name = a, f"{b // 2000:03d}/{b:07d}.bin"
    res: dict[str, list[float]] = {k: [] for k in ("hframe_open_id", "hframe_name", "json_load_id", "json_name")}
    for _ in range(max(repeat, 3)):
        gc.collect()
        t0 = time.perf_counter()
        r = hframe_cli.open_pack(pack_path)
        by_id = r.range_of(want_id)
        t1 = time.perf_counter()
        by_name = r.range_of(r.frame_id(want_name))
        t2 = time.perf_counter()
        r.close()
        res["hframe_open_id"].append(t1 - t0)
        res["hframe_name"].append(t2 - t1)

        gc.collect()
        t0 = time.perf_counter()
        with open(json_path) as f:
            idx = json.load(f)
        e = idx[want_id]
        j_by_id = (e["offset"], e["length"])
        t1 = time.perf_counter()
        e = next(e for e in idx if e["name"] == want_name)
        j_by_name = (e["offset"], e["length"])
        t2 = time.perf_counter()
        res["json_load_id"].append(t1 - t0)
        res["json_name"].append(t2 - t1)
        del idx, e
        if (by_id, by_name) != (j_by_id, j_by_name):
            raise RuntimeError(f"lookup mismatch: hframe {by_id} {by_name}, json {j_by_id} {j_by_name}")
    med = {k: statistics.median(v) for k, v in res.items()}
    hf, js = med["hframe_open_id"] + med["hframe_name"], med["json_load_id"] + med["json_name"]
    print(
        f"bench=index_lookup frames={frames} method=hframe open_and_id_s={med['hframe_open_id']:.4f} "
        f"name_s={med['hframe_name']:.4f} total_s={hf:.4f}"
    )
    print(
        f"bench=index_lookup frames={frames} method=json load_and_id_s={med['json_load_id']:.4f} "
        f"name_s={med['json_name']:.4f} total_s={js:.4f}",
        flush=True,
    )
    return js / hf


def verdict(key: str, value: float, target: float, higher_is_better: bool, extra: str = "") -> None:
    ok = value >= target if higher_is_better else value <= target
    print(
        f"{key}={value:.3f}{extra} target={'>=' if higher_is_better else '<='}{target} "
        f"result={'PASS' if ok else 'FAIL'}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir", nargs="?", help="folder with jpegs/ and blobs/ (make_bench_data.py)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    ap.add_argument(
        "--index-frames", type=int, default=INDEX_FRAMES, help="frames in the lookup index (default 1000000)"
    )
    ap.add_argument("--seed-pack", nargs=2, metavar=("SRC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.seed_pack:
        seed_pack(*args.seed_pack)
        return 0
    if not args.data_dir:
        ap.error("DATA_DIR is required")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if not os.access(HFRAME, os.X_OK):
        ap.error(f"{HFRAME} not found: run this with the project's venv python")
    if not shutil.which("tar"):
        ap.error("tar not found")
    out_dir = os.path.join(args.data_dir, "_bench_out")
    os.makedirs(out_dir, exist_ok=True)

    which = subprocess.run(
        [sys.executable, "-c", "import hframe_cli; print(hframe_cli.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(
        f"bench=pack hframe={HFRAME} hframe_cli={os.path.dirname(which)} cpus={os.cpu_count()} "
        f"load1={os.getloadavg()[0]:.2f}",
        flush=True,
    )
    medians = {name: bench_dataset(args.data_dir, out_dir, name, args.repeat) for name in DATASETS}
    speedup = bench_index(out_dir, args.repeat, args.index_frames)
    for name in DATASETS:
        m = medians[name]
        verdict("pack_vs_tar_sync", m["hframe"][0] / m["tar"][0], 1.5, False, f" dataset={name}")
        verdict("pack_vs_seed", m["hframe"][0] / m["seed"][0], 1.0, False, f" dataset={name}")
    verdict(
        "rss_200k_vs_20k",
        medians["blobs"]["hframe"][1] / medians["jpegs"]["hframe"][1],
        2.0,
        False,
        f" rss_20k_mb={medians['jpegs']['hframe'][1]:.1f} rss_200k_mb={medians['blobs']['hframe'][1]:.1f}",
    )
    verdict("index_lookup_speedup_vs_json", speedup, 10.0, True, f" frames={args.index_frames}")
    for name in DATASETS:
        m = medians[name]
        verdict(
            "checkpoint_overhead",
            m["hframe"][0] / m["hframe_nockpt"][0] - 1,
            0.05,
            False,
            f" dataset={name} on_s={m['hframe'][0]:.3f} off_s={m['hframe_nockpt'][0]:.3f}",
        )
    for name in UPDATE_DATASETS:
        m = medians[name]
        verdict(
            "update_noop_vs_full",
            m["hframe_update_noop"][0] / m["hframe"][0],
            0.10,
            False,
            f" dataset={name} update_s={m['hframe_update_noop'][0]:.3f} full_s={m['hframe'][0]:.3f}",
        )
        print(
            f"find_stat_vs_full={m['find_stat'][0] / m['hframe'][0]:.3f} dataset={name} "
            f"find_s={m['find_stat'][0]:.3f} full_s={m['hframe'][0]:.3f} target=none "
            "(the stat of every file a no-op update makes, by find on one core)",
            flush=True,
        )
    print(f"bench=pack load_avg={' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
