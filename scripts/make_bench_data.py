#!/usr/bin/env python3
"""Generate the benchmark data sets used by bench_pack.py and bench_read.py.

Usage: python scripts/make_bench_data.py OUT_DIR [--jpegs N] [--blobs N] [--seed S]

Makes two folders, deterministically for a given seed (stdlib + Pillow, no network):

* ``OUT_DIR/jpegs/<class>/<nnnnnn>.jpg``: ``--jpegs`` (20,000) valid JPEGs of 5-150 KB,
  about 700 MB in all, spread over 20 ImageFolder-style class folders. To stay fast, a few
  hundred base images are rendered and encoded once; each file is a base JPEG with a COM
  (comment) segment of random bytes inserted after SOI, which makes every file unique and
  sets its size to a target drawn from a log-normal distribution (median 28 KB).
* ``OUT_DIR/blobs/<nnn>/<nnnnnn>.bin``: ``--blobs`` (200,000) random binary blobs of
  1-4 KB, at most 2,000 files per folder.

A folder that already holds the requested number of files is left alone.
"""

from __future__ import annotations

import argparse
import bisect
import io
import math
import os
import random
import sys
import time

from PIL import Image, ImageDraw, ImageFilter

N_CLASSES = 20
N_BASES = 300
JPEG_MIN, JPEG_MAX = 5 * 1024, 150 * 1024
BLOB_MIN, BLOB_MAX = 1024, 4096
BLOBS_PER_FOLDER = 2000


def count_files(folder: str) -> int:
    return sum(len(files) for _, _, files in os.walk(folder)) if os.path.isdir(folder) else 0


def render_base(rng: random.Random) -> bytes:
    """One JPEG: gradient + shapes + some noise, random size and quality."""
    w = rng.randrange(96, 900)
    h = int(w * rng.uniform(0.6, 1.4))
    img = Image.linear_gradient("L").resize((w, h)).convert("RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randrange(5, 40)):
        x0, y0 = rng.randrange(w), rng.randrange(h)
        box = (x0, y0, x0 + rng.randrange(4, w), y0 + rng.randrange(4, h))
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    noise = Image.frombytes("L", (w, h), rng.randbytes(w * h)).filter(ImageFilter.GaussianBlur(rng.uniform(0.0, 1.5)))
    img = Image.blend(img, Image.merge("RGB", (noise, noise, noise)), rng.uniform(0.05, 0.5))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=rng.randrange(40, 96))
    return out.getvalue()


def com_segments(payload: bytes) -> bytes:
    """``payload`` as one or more JPEG COM segments (each at most 65,533 bytes of data)."""
    out = bytearray()
    for i in range(0, len(payload), 65533):
        part = payload[i : i + 65533]
        out += b"\xff\xfe" + (len(part) + 2).to_bytes(2, "big") + part
    return bytes(out)


def make_jpegs(folder: str, count: int, rng: random.Random) -> int:
    bases = sorted((render_base(rng) for _ in range(N_BASES)), key=len)
    sizes = [len(b) for b in bases]
    print(f"  {N_BASES} base JPEGs: {sizes[0] / 1024:.1f}-{sizes[-1] / 1024:.1f} KB", flush=True)
    total = 0
    for c in range(N_CLASSES):
        os.makedirs(os.path.join(folder, f"class{c:02d}"), exist_ok=True)
    for i in range(count):
        target = int(min(JPEG_MAX, max(JPEG_MIN, rng.lognormvariate(math.log(28 * 1024), 0.6))))
        # The largest base that leaves room for a COM segment of at least 16 bytes.
        k = max(0, bisect.bisect_right(sizes, target - 20) - 1)
        base = bases[k]
        pad = max(16, target - len(base) - 4 * (1 + (target - len(base)) // 65533))
        data = base[:2] + com_segments(rng.randbytes(pad)) + base[2:]
        path = os.path.join(folder, f"class{i % N_CLASSES:02d}", f"{i:06d}.jpg")
        with open(path, "wb") as f:
            f.write(data)
        total += len(data)
    return total


def make_blobs(folder: str, count: int, rng: random.Random) -> int:
    total = 0
    for i in range(count):
        sub = os.path.join(folder, f"{i // BLOBS_PER_FOLDER:03d}")
        if i % BLOBS_PER_FOLDER == 0:
            os.makedirs(sub, exist_ok=True)
        data = rng.randbytes(rng.randint(BLOB_MIN, BLOB_MAX))
        with open(os.path.join(sub, f"{i:06d}.bin"), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--jpegs", type=int, default=20_000, help="number of JPEG files (default 20000)")
    ap.add_argument("--blobs", type=int, default=200_000, help="number of blobs (default 200000)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = ap.parse_args()

    for name, count, make in (("jpegs", args.jpegs, make_jpegs), ("blobs", args.blobs, make_blobs)):
        folder = os.path.join(args.out_dir, name)
        have = count_files(folder)
        if have == count:
            print(f"{folder}: already has {have} files, skipped")
            continue
        if have:
            print(f"error: {folder} has {have} files, expected {count}; remove it first", file=sys.stderr)
            return 1
        os.makedirs(folder, exist_ok=True)
        print(f"{folder}: generating {count} files ...", flush=True)
        t0 = time.perf_counter()
        # One generator per data set, so each set is the same whatever the other's count.
        total = make(folder, count, random.Random(f"{args.seed}:{name}"))
        print(
            f"{folder}: made {count} files, {total / 1e6:.1f} MB "
            f"(mean {total / count / 1024:.1f} KB) in {time.perf_counter() - t0:.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
