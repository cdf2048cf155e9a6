#!/usr/bin/env python3
"""Benchmark ``hframe sheet`` (64 frames of a 20,000-JPEG pack, cold and warm, local and over
HTTP) and what ``verify --html`` adds to ``verify``.

Usage: python scripts/bench_sheet.py DATA_DIR [--frames 64] [--repeat 3]

Packs ``DATA_DIR/jpegs`` (``scripts/make_bench_data.py``) once, then times the whole command
(a new process each run: start-up, open, read, decode, lay out, write a JPEG) for a seeded
sample of ``--frames`` frames (a new seed each run, so no run reads what the one before did):

* ``local_cold``: the pack's pages evicted first (``posix_fadvise``, as ``bench-cold`` does);
* ``local_warm``: the same sample again, pages cached;
* ``http_cold`` / ``http_warm``: the pack served by nginx on loopback (``apt-get install
  nginx-light``), its pages evicted on the server side for the cold run.

Also ``in_process_warm``: ``contact_sheet`` called in this process, warm (no start-up, no
image written): what the command's own work costs; and ``verify`` of the same clean pack, warm,
with and without ``--html`` (runs alternated), as ``html_overhead`` (goal: <= 0.05). Output: one ``key=value`` line per measurement (medians of ``--repeat``, seconds).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cache import nginx  # noqa: E402 - the one nginx launcher of the benchmarks

HFRAME = os.path.join(os.path.dirname(sys.executable), "hframe")


def timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([HFRAME, *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from hframe_cli import open_pack
    from hframe_cli.storage.access import evict_from_page_cache
    from hframe_cli.view.sheet import contact_sheet

    work = tempfile.mkdtemp(prefix="hframe-bench-sheet-")
    server = None
    try:
        www = os.path.join(work, "www")
        os.makedirs(www)
        pack = os.path.join(www, "p.hframe")
        subprocess.run([HFRAME, "pack", os.path.join(args.data_dir, "jpegs"), "-o", pack, "-q"], check=True)
        with open_pack(pack) as p:
            print(f"frames_in_pack={len(p)}")
        server, port = nginx(www, os.path.join(work, "nginx"))
        url = f"http://127.0.0.1:{port}/p.hframe"
        out = os.path.join(work, "s.jpg")
        runs: dict[str, list[float]] = {k: [] for k in ("local_cold", "local_warm", "http_cold", "http_warm")}
        for r in range(args.repeat):
            for where, key in ((pack, "local"), (url, "http")):
                seed = str(100 * r + (key == "http"))
                sample = ["--sample", str(args.frames), "--seed", seed, "-o", out, "-q"]
                evict_from_page_cache(pack)
                evict_from_page_cache(pack + ".index.parquet")
                runs[f"{key}_cold"].append(timed(["sheet", where, *sample]))
                runs[f"{key}_warm"].append(timed(["sheet", where, *sample]))
        for k, v in runs.items():
            print(f"{k}_s={statistics.median(v):.3f}")
        t0 = time.perf_counter()
        contact_sheet(pack, sample=args.frames, seed=1)
        print(f"in_process_warm_s={time.perf_counter() - t0:.3f}")
        plain, page = [], []
        for _ in range(args.repeat):
            plain.append(timed(["verify", pack, "-q"]))
            page.append(timed(["verify", pack, "-q", "--html", os.path.join(work, "r.html")]))
        print(f"verify_s={statistics.median(plain):.3f}")
        print(f"verify_html_s={statistics.median(page):.3f}")
        print(f"html_overhead={statistics.median(page) / statistics.median(plain) - 1:.3f}")
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
