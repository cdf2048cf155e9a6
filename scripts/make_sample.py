#!/usr/bin/env python3
"""Generate a small image folder for demos and tests: JPEG and PNG, several sizes and modes.

Usage: python scripts/make_sample.py OUT_DIR [--count N] [--seed S]

Layout is ImageFolder-style (OUT_DIR/<class>/<nnn>.<ext>), so the parent folder becomes the
label. Deterministic for a given seed; needs only Pillow (no network).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

from PIL import Image, ImageDraw

CLASSES = ("cats", "dogs", "birds")
MODES = ("RGB", "L", "RGBA", "P")
SIZES = ((32, 32), (64, 48), (160, 120), (320, 240), (640, 480))


def make_image(rng: random.Random, size: tuple[int, int], mode: str) -> Image.Image:
    img = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, y0 = rng.randrange(size[0]), rng.randrange(size[1])
        x1, y1 = x0 + rng.randrange(1, size[0]), y0 + rng.randrange(1, size[1])
        draw.ellipse((x0, y0, x1, y1), fill=tuple(rng.randrange(256) for _ in range(3)))
    if mode == "P":
        return img.convert("P", palette=Image.Palette.ADAPTIVE)
    return img.convert(mode)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    for i in range(args.count):
        label = CLASSES[(i // 4) % len(CLASSES)]
        folder = os.path.join(args.out, label)
        os.makedirs(folder, exist_ok=True)
        mode = MODES[i % len(MODES)]
        img = make_image(rng, SIZES[rng.randrange(len(SIZES))], mode)
        if mode in ("RGB", "L") and i % 3:
            img.save(os.path.join(folder, f"{i:03d}.jpg"), quality=85)
        else:
            img.save(os.path.join(folder, f"{i:03d}.png"))
    print(f"wrote {args.count} images under {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
