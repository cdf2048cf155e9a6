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


def make_clips(out: str, count: int, seed: int) -> None:
    """Short 64x48 H.264 clips at 10 fps (2-4 s), a keyframe every 10 frames."""
    from fractions import Fraction

    import av

    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    for k in range(count):
        with av.open(os.path.join(out, f"clip{k:03d}.mp4"), "w") as c:
            s = c.add_stream("libx264", rate=10)
            s.width, s.height, s.pix_fmt, s.gop_size = 64, 48, "yuv420p", 10
            s.codec_context.options = {"x264-params": "scenecut=0"}
            for i in range(rng.randint(20, 40)):
                frame = av.VideoFrame.from_image(make_image(rng, (64, 48), "RGB"))
                frame.pts, frame.time_base = i, Fraction(1, 10)
                for p in s.encode(frame):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
    print(f"wrote {count} clips under {out}", file=sys.stderr)


def make_records(out: str, count: int, seed: int) -> None:
    """Small JSON annotation records (compress well with a shared dictionary)."""
    import json

    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    for i in range(count):
        rec = {
            "image_id": i,
            "objects": [
                {"category": rng.choice(CLASSES), "bbox": [rng.randrange(64) for _ in range(4)], "iscrowd": False}
                for _ in range(rng.randint(1, 6))
            ],
        }
        with open(os.path.join(out, f"{i:05d}.json"), "w") as f:
            json.dump(rec, f)
    print(f"wrote {count} records under {out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--clips", type=int, default=0, help="also write N short H.264 videos under OUT/clips-src/")
    ap.add_argument("--records", type=int, default=0, help="also write N small JSON records under OUT/records-src/")
    args = ap.parse_args(argv)
    if args.clips:
        make_clips(os.path.join(os.path.dirname(args.out.rstrip("/")) or ".", "clips"), args.clips, args.seed)
    if args.records:
        make_records(os.path.join(os.path.dirname(args.out.rstrip("/")) or ".", "records"), args.records, args.seed)
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
