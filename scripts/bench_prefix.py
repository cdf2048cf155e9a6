#!/usr/bin/env python3
"""Benchmark ``hframe pack s3://bucket/prefix/`` against ``aws s3 sync`` to a folder + ``hframe pack``.

Usage: python scripts/bench_prefix.py SOURCE_DIR [--count N] [--repeat N] [--workdir DIR]

Starts moto's S3 server (``moto_server``, a test extra) on a free loopback port, uploads the
first ``--count`` files of SOURCE_DIR (default 20,000; ``scripts/make_bench_data.py``'s
``jpegs/``) under ``s3://bench/set/`` once, then runs each way ``--repeat`` times (default 2),
alternated, and reports median wall times:

* ``direct``: ``hframe pack s3://bench/set/?endpoint_override=... -o OUT`` (no local copy);
* ``sync``: ``aws s3 sync s3://bench/set/ DIR`` (the AWS CLI, ``pip install awscli``);
* ``pack_synced``: ``hframe pack DIR -o OUT`` of the synced folder;

and the ratio ``direct_vs_sync_then_pack`` (goal: < 1.0), the peak disk each way takes
(``direct``: the pack; the other: the synced folder and the pack), and the requests moto
answered per object each way (pyarrow opens an object with a HEAD, then GETs it: 2; the AWS
CLI GETs it: 1). The frames of both packs are compared (names, md5, sizes,
times: the script fails if they differ). moto answers one request at a time (a Python server):
on it, a run's time is its request count, which is what this measures; a real store answers
many at once. Output: one ``key=value`` line per measurement or ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs
import pyarrow.parquet as pq

BIN = os.path.dirname(sys.executable)
HFRAME = os.path.join(BIN, "hframe")
SAME = ["name", "md5", "source_size", "source_mtime"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def frames(pack: str) -> list[dict]:
    return pq.read_table(f"{pack}.index.parquet", columns=SAME).to_pylist()


def requests(log: str) -> int:
    """Requests moto answered (one log line each; some are wrapped in colour codes)."""
    with open(log, "rb") as f:
        return sum(1 for line in f if b"HTTP/1.1" in line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source_dir")
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    aws = shutil.which("aws")
    moto = os.path.join(BIN, "moto_server")
    if aws is None or not os.path.exists(moto):
        print("needs the AWS CLI (pip install awscli) and moto_server (pip install 'moto[server]')", file=sys.stderr)
        return 2
    work = args.workdir or tempfile.mkdtemp(prefix="hframe-bench-prefix-")
    os.makedirs(work, exist_ok=True)
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(args.source_dir) for f in fs)[: args.count]
    port = free_port()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "HFRAME_TTY": "0",
    }
    log = os.path.join(work, "moto.log")
    server = subprocess.Popen(
        [moto, "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb")
    )
    try:
        endpoint = f"127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
        fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
        fs.create_dir("bench")

        def put(path: str) -> None:
            key = "bench/set/" + os.path.relpath(path, args.source_dir)
            with open(path, "rb") as src, fs.open_output_stream(key) as dst:
                dst.write(src.read())

        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, files))
        print(f"objects={len(files)}")
        print(f"bytes={sum(os.path.getsize(f) for f in files)}")
        print(f"upload_s={time.perf_counter() - t0:.1f}")
        url = f"s3://bench/set/?endpoint_override={endpoint}&scheme=http"
        direct, synced_pack = os.path.join(work, "direct.hframe"), os.path.join(work, "synced.hframe")
        folder = os.path.join(work, "synced")
        times: dict[str, list[float]] = {"direct": [], "sync": [], "pack_synced": []}
        per_object: dict[str, list[float]] = {"direct": [], "sync": []}
        for _ in range(args.repeat):
            before = requests(log)
            times["direct"].append(timed([HFRAME, "pack", url, "-o", direct, "--force", "-q"], env))
            per_object["direct"].append((requests(log) - before) / len(files))
            shutil.rmtree(folder, ignore_errors=True)
            before = requests(log)
            sync = [
                aws,
                "s3",
                "sync",
                "s3://bench/set/",
                folder,
                "--endpoint-url",
                f"http://{endpoint}",
                "--only-show-errors",
            ]
            times["sync"].append(timed(sync, env))
            per_object["sync"].append((requests(log) - before) / len(files))
            times["pack_synced"].append(timed([HFRAME, "pack", folder, "-o", synced_pack, "--force", "-q"], env))
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"{k}_s={v:.2f}")
        print(f"sync_then_pack_s={med['sync'] + med['pack_synced']:.2f}")
        print(f"direct_vs_sync_then_pack={med['direct'] / (med['sync'] + med['pack_synced']):.2f}")
        print(f"direct_requests_per_object={statistics.median(per_object['direct']):.2f}")
        print(f"sync_requests_per_object={statistics.median(per_object['sync']):.2f}")
        print(f"direct_peak_disk_bytes={du(direct)}")
        print(f"sync_then_pack_peak_disk_bytes={du(folder) + du(synced_pack)}")
        if frames(direct) != frames(synced_pack):
            print("the frames of the two packs differ", file=sys.stderr)
            return 1
        print("same_frames=yes")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=10)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
