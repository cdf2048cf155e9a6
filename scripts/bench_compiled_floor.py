#!/usr/bin/env python3
"""What a compiled per-file loop would buy ``hframe pack``: the numbers issue 17 asks for before
any compiled part is proposed, side by side in one run, all on ONE core.

Usage: python scripts/bench_compiled_floor.py DATA_DIR [--sets jpegs,blobs] [--repeat 3]

For each of ``DATA_DIR/jpegs`` and ``DATA_DIR/blobs`` (``scripts/make_bench_data.py``), after one
warm-up read of the sources, every round runs in a new random order, each after a ``sync``:

* ``tar``: ``tar cf OUT -C SRC . && sync`` (C, no hash; the issue's yardstick);
* ``c_loop``: a 60-line C loop compiled here with ``cc -O2`` (skipped if there is no compiler or
  OpenSSL header): per file ``open``, ``fstat``, one ``read``, ``close``, md5, a 64-byte header
  with a CRC, appended to a 4 MiB buffer written with ``pwrite``; ``fsync`` at the end. That is
  a pack worker's work without the index;
* ``python_loop``: hframe's own worker loop in this process, pinned to one core: the calls
  ``fanout._work`` makes for each file (``load_prepared``, ``add_loaded``) into a
  ``ChunkWriter``, its ``write_at`` every 4 MiB of records, ``fsync`` at the end;
* ``hframe_w1``: the whole command, ``hframe pack SRC -o OUT --force -q --workers 1``, pinned to
  one core (listing, source list, index, self-check and publishing included).

Prints the medians, microseconds per file, and ``python_loop_vs_c_loop`` (what the interpreter
costs per file), ``c_loop_vs_tar`` (what md5 and headers cost in C) and
``hframe_w1_vs_python_loop`` (what the rest of the command costs). Nothing here is a target.
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
from pathlib import Path

HFRAME = str(Path(sys.executable).with_name("hframe"))

C_LOOP = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <openssl/md5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
int main(int argc, char **argv) {  /* argv[1]: output; paths on stdin, one a line */
    int out = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t cap = 4 << 20, used = 0, lcap = 0, np = 0, pcap = 0;
    unsigned char *buf = malloc(cap);
    char *line = NULL, **paths = NULL;
    ssize_t n;
    off_t pos = 0;
    while ((n = getline(&line, &lcap, stdin)) > 0) {
        if (line[n - 1] == '\n') line[n - 1] = 0;
        if (np == pcap) { pcap = pcap ? 2 * pcap : 4096; paths = realloc(paths, pcap * sizeof *paths); }
        paths[np++] = strdup(line);
    }
    for (size_t i = 0; i < np; i++) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) { perror(paths[i]); return 1; }
        size_t nl = strlen(paths[i]), need = 64 + nl + (size_t)st.st_size + 1;
        if (used + need > cap) {
            if (pwrite(out, buf, used, pos) != (ssize_t)used) { perror("pwrite"); return 1; }
            pos += used; used = 0;
            if (need > cap) { cap = 2 * need; buf = realloc(buf, cap); }
        }
        unsigned char *h = buf + used;
        ssize_t got = read(fd, h + 64 + nl, (size_t)st.st_size + 1);
        close(fd);
        if (got != st.st_size) { fprintf(stderr, "%s: changed\n", paths[i]); return 1; }
        MD5(h + 64 + nl, (size_t)got, h + 8);
        memcpy(h, "HFREC\0\0\0", 8);
        memcpy(h + 24, &st.st_size, 8);
        memcpy(h + 32, &st.st_mtim, 16);
        memset(h + 48, 0, 12);
        memcpy(h + 64, paths[i], nl);
        uint32_t crc = crc32(crc32(0, h, 60), h + 64, nl);
        memcpy(h + 60, &crc, 4);
        used += 64 + nl + (size_t)got;
    }
    if (pwrite(out, buf, used, pos) != (ssize_t)used || fsync(out) != 0) { perror("write"); return 1; }
    return 0;
}
"""


def build_c_loop(workdir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, exe = workdir / "c_loop.c", workdir / "c_loop"
    src.write_text(C_LOOP)
    r = subprocess.run(
        [cc, "-O2", "-Wno-deprecated-declarations", "-o", str(exe), str(src), "-lcrypto", "-lz"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        print(f"c_loop: not built ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else cc})", flush=True)
        return None
    return exe


def python_loop(src: str, out: str) -> float:
    """hframe's worker loop, as ``fanout._work`` runs it per file, in this process (one core)."""
    from hframe_cli.sources.inputs import collect_sources
    from hframe_cli.sources.media import FramePrep, MediaOptions
    from hframe_cli.write.loading import add_loaded, load_prepared
    from hframe_cli.write.writer import ChunkWriter

    sources = collect_sources([src])
    prep = FramePrep(MediaOptions(), None)
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        at, frame, chunk = 0, 0, ChunkWriter(fd, out)
        for k in range(len(sources)):
            item = load_prepared(sources.source(k), prep, False)
            if item.error is not None:
                raise SystemExit(f"{item.source.path}: {item.error}")
            add_loaded(chunk, item, False)
            if chunk.position >= 4 << 20:
                at += chunk.write_at(at, frame).size
                frame += len(chunk)
                chunk = ChunkWriter(fd, out)
        chunk.write_at(at, frame)
        os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def timed(cmd: list[str] | str, stdin: Path | None = None) -> float:
    subprocess.run(["sync"], check=True)
    t0 = time.perf_counter()
    if isinstance(cmd, str):
        subprocess.run(cmd, shell=True, check=True)
    else:
        with open(stdin or os.devnull, "rb") as f:
            subprocess.run(cmd, check=True, stdin=f)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir")
    ap.add_argument("--sets", default="jpegs,blobs")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, inherited by the commands
    out = Path(args.data_dir) / "_bench_out" / "floor"
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(23)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_c_loop(Path(tmp))
        for name in args.sets.split(","):
            src = Path(args.data_dir) / name
            listing = Path(tmp) / f"{name}.list"
            files = sorted(str(p) for p in src.rglob("*") if p.is_file())
            listing.write_text("".join(f + "\n" for f in files))
            subprocess.run(f"tar cf - -C {src} . > /dev/null", shell=True, check=True)  # warm the page cache
            runs: dict[str, list[float]] = {"tar": [], "python_loop": [], "hframe_w1": []}
            if exe is not None:
                runs["c_loop"] = []
            for _ in range(args.repeat):
                order = list(runs)
                rng.shuffle(order)
                for method in order:
                    target = out / f"{name}.{method}"
                    for leftover in out.glob(f"{name}.*"):
                        leftover.unlink()
                    if method == "tar":
                        t = timed(f"tar cf {target} -C {src} . && sync")
                    elif method == "c_loop":
                        t = timed([str(exe), str(target)], stdin=listing)
                    elif method == "python_loop":
                        subprocess.run(["sync"], check=True)
                        t = python_loop(str(src), str(target))
                    else:
                        t = timed([HFRAME, "pack", str(src), "-o", str(target), "--force", "-q", "--workers", "1"])
                    runs[method].append(t)
            med = {m: statistics.median(v) for m, v in runs.items()}
            for m, s in med.items():
                print(
                    f"floor dataset={name} method={m} files={len(files)} wall_s_median={s:.3f} "
                    f"us_per_file={s / len(files) * 1e6:.1f} runs={','.join(f'{x:.2f}' for x in runs[m])}"
                )
            if "c_loop" in med:
                print(f"python_loop_vs_c_loop={med['python_loop'] / med['c_loop']:.2f} dataset={name}")
                print(f"c_loop_vs_tar={med['c_loop'] / med['tar']:.2f} dataset={name}")
            print(f"hframe_w1_vs_python_loop={med['hframe_w1'] / med['python_loop']:.2f} dataset={name}", flush=True)
            for leftover in out.glob(f"{name}.*"):
                leftover.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
