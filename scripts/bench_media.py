#!/usr/bin/env python3
"""Media benchmarks, measured side by side in one run (issue 6 targets).

1. Small compressible records (default 200,000 JSON-like annotation records of 1-4 KB, made
   here, deterministic): packed three ways (raw, zstd:3, zstd:3 with a trained dictionary).
   Prints the compression ratio of each and
   ``dict_ratio_gain`` = ratio(zstd+dict) / ratio(zstd)                       target >= 1.5
   ``warm_read_compressed_vs_raw`` = time of 256 random frames via read_many,
        zstd+dict pack / raw pack, warm page cache, median of batches         target <= 2.0
2. Video: a generated H.264 clip (default 640x360, 600 frames); frames/s of
   - PyAV's bare decode loop (decode only: the floor for any extractor),
   - PyAV decode + RGB conversion + JPEG encode (what extraction has to do per kept frame),
   - ``hframe`` packing ``--video-frames all`` and ``fps:2`` (in-process ``pack_sources``),
   - the ``ffmpeg`` command writing JPEGs, if installed.

Usage: scripts/bench_media.py [WORKDIR] [--records N] [--video-frames N] [--batches B]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_pack import verdict  # noqa: E402

import hframe_cli as h  # noqa: E402
from hframe_cli.sources.inputs import collect_sources  # noqa: E402
from hframe_cli.sources.media import MediaOptions  # noqa: E402
from hframe_cli.write.run import CheckpointPolicy, pack_sources  # noqa: E402

WORDS = "person bicycle car motorcycle bus truck boat bench bird cat dog horse sheep cow bottle cup fork".split()


def make_records(root: Path, n: int) -> None:
    """JSON-like annotation records of 1-4 KB (same keys, varied values), 1000 per folder."""
    if (root / "done").exists() and int((root / "done").read_text()) == n:
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(6)
    for i in range(n):
        folder = root / f"{i // 1000:04d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        objs = []
        for k in range(rng.randint(3, 14)):
            objs.append(
                {
                    "id": i * 100 + k,
                    "category": rng.choice(WORDS),
                    "bbox": [round(rng.uniform(0, 640), 1) for _ in range(4)],
                    "area": round(rng.uniform(10, 40000), 2),
                    "iscrowd": rng.random() < 0.05,
                    "score": round(rng.random(), 3),
                    "attributes": {"occluded": rng.random() < 0.3, "truncated": rng.random() < 0.2},
                }
            )
        rec = {"image_id": i, "file_name": f"{i:012d}.jpg", "width": 640, "height": 480, "annotations": objs}
        (folder / f"{i:07d}.json").write_text(json.dumps(rec))
    (root / "done").write_text(str(n))


def pack_records(src: Path, out: Path, compress: str, zdict: str) -> tuple[float, int, int]:
    sources = collect_sources([str(src)], output=str(out), exclude=["done"])
    t0 = time.perf_counter()
    pack_sources(
        sources,
        out,
        force=True,
        checkpoints=CheckpointPolicy(enabled=False),
        media=MediaOptions(compress=compress, zstd_dict=zdict),
    )
    elapsed = time.perf_counter() - t0
    with h.open_pack(out) as p:
        t = p.table
        stored = sum(t.column("length").to_pylist())
        raw = sum(t.column("raw_length").to_pylist())
    return elapsed, raw, stored


def warm_reads(packs: list[Path], batches: int, frames: int = 256) -> list[float]:
    """Median seconds for ``frames`` random frames through ``read_many`` per pack, warm: each
    pack is read whole first, then batches alternate between the packs (drift hits all alike)."""
    readers = [h.open_pack(p) for p in packs]
    for p in packs:
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass
    rng = random.Random(1)
    times: list[list[float]] = [[] for _ in packs]
    for _ in range(batches):
        for k, r in enumerate(readers):
            ids = [rng.randrange(len(r)) for _ in range(frames)]
            t0 = time.perf_counter()
            r.read_many(ids)
            times[k].append(time.perf_counter() - t0)
    for r in readers:
        r.close()
    return [statistics.median(t) for t in times]


def make_video(path: Path, frames: int, size: tuple[int, int]) -> None:
    import av
    from PIL import Image, ImageDraw

    if path.exists():
        return
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=30)
        s.width, s.height = size
        s.pix_fmt = "yuv420p"
        for i in range(frames):
            img = Image.new("RGB", size, (i % 256, 80, 160))
            d = ImageDraw.Draw(img)
            for k in range(8):
                x = (i * (k + 3) * 7) % size[0]
                d.rectangle((x, k * 40, x + 60, k * 40 + 30), fill=((k * 40) % 256, 255 - k * 20, i % 200))
            f = av.VideoFrame.from_image(img)
            f.pts, f.time_base = i, Fraction(1, 30)
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def bare_decode(path: Path, convert: bool) -> tuple[float, int]:
    import io

    import av

    t0 = time.perf_counter()
    n = 0
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in c.decode(stream):
            n += 1
            if convert:
                buf = io.BytesIO()
                frame.to_image().save(buf, "JPEG", quality=90)
    return time.perf_counter() - t0, n


def hframe_video(path: Path, out: Path, mode: str) -> tuple[float, int]:
    sources = collect_sources([str(path)], output=str(out))
    t0 = time.perf_counter()
    res = pack_sources(
        sources, out, force=True, checkpoints=CheckpointPolicy(enabled=False), media=MediaOptions(video_frames=mode)
    )
    return time.perf_counter() - t0, res.frame_count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workdir", nargs="?", help="where data and packs go (default: a temporary folder)")
    ap.add_argument("--records", type=int, default=200_000, help="small records to make (default 200000)")
    ap.add_argument("--video-frames", type=int, default=600, help="frames in the test video (default 600)")
    ap.add_argument("--batches", type=int, default=200, help="random-read batches per pack (default 200)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="hframe-media-"))
    work.mkdir(parents=True, exist_ok=True)
    rec = work / f"records-{args.records}"
    t0 = time.perf_counter()
    make_records(rec, args.records)
    print(f"# {args.records} records under {rec} (made or reused in {time.perf_counter() - t0:.1f} s)")

    results = {}
    for label, compress, zdict in (
        ("raw", "none", "none"),
        ("zstd", "zstd:3", "none"),
        ("zstd_dict", "zstd:3", "auto"),
    ):
        out = work / f"records-{label}.hframe"
        elapsed, raw, stored = pack_records(rec, out, compress, zdict)
        results[label] = (out, raw / stored)
        print(f"pack_{label}_s={elapsed:.2f} ratio_{label}={raw / stored:.3f} stored_bytes={stored} raw_bytes={raw}")
    verdict("dict_ratio_gain", results["zstd_dict"][1] / results["zstd"][1], 1.5, True)
    t_raw, t_zstd, t_dict = warm_reads([results[k][0] for k in ("raw", "zstd", "zstd_dict")], args.batches)
    print(
        f"warm_256_raw_ms={t_raw * 1e3:.3f} warm_256_zstd_ms={t_zstd * 1e3:.3f} warm_256_zstd_dict_ms={t_dict * 1e3:.3f}"
    )
    verdict("warm_read_compressed_vs_raw", t_dict / t_raw, 2.0, False)

    video = work / f"clip-{args.video_frames}.mp4"
    make_video(video, args.video_frames, (640, 360))
    dt, n = bare_decode(video, convert=False)
    print(f"video_bare_decode_fps={n / dt:.1f} frames={n}")
    dt, n = bare_decode(video, convert=True)
    print(f"video_decode_convert_jpeg_fps={n / dt:.1f}")
    for mode in ("all", "fps:2"):
        dt, kept = hframe_video(video, work / "clip.hframe", mode)
        print(f"hframe_video_{mode.replace(':', '')}_fps={args.video_frames / dt:.1f} (source frames/s; kept {kept})")
    # memory stays flat however long the video: peak RSS of `hframe pack` on this clip and on one
    # ten times longer (a separate process each, so the numbers are the command's own)
    long_video = work / f"clip-{args.video_frames * 10}.mp4"
    make_video(long_video, args.video_frames * 10, (640, 360))
    rss = []
    for v in (video, long_video):
        out = work / "rss.hframe"
        cmd = [sys.executable, "-m", "hframe_cli", "pack", str(v), "-o", str(out), "--force", "-q"]
        proc = subprocess.Popen([*cmd, "--video-frames", "fps:5", "--no-checkpoint"])
        _, status, usage = os.wait4(proc.pid, 0)
        if status != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({status})")
        rss.append(usage.ru_maxrss / 1024)
    print(
        f"video_peak_rss_mb={rss[0]:.0f} ({args.video_frames} frames) {rss[1]:.0f} ({args.video_frames * 10} frames) "
        f"ratio={rss[1] / rss[0]:.2f} (fps:5; about 1 means memory does not grow with length)"
    )
    if shutil.which("ffmpeg"):
        d = work / "ffmpeg-out"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        t0 = time.perf_counter()
        subprocess.run(["ffmpeg", "-loglevel", "error", "-i", str(video), "-q:v", "2", str(d / "%06d.jpg")], check=True)
        print(f"ffmpeg_jpeg_fps={args.video_frames / (time.perf_counter() - t0):.1f}")
    else:
        print("ffmpeg_jpeg_fps=n/a (ffmpeg not installed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
