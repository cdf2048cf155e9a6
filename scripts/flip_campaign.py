#!/usr/bin/env python3
"""Single-byte flip campaign: does ``verify`` find every flipped byte, and blame only what it hit?

Usage: python scripts/flip_campaign.py WORK_DIR [--flips N] [--index-flips N] [--footer-flips N]
       [--seed S] [--real DIR] [--all]

Makes three packs in WORK_DIR from generated but real-shaped data (``make_sample.py`` images:
JPEG and PNG of several sizes and modes; JSON records compressed with zstd and a trained
dictionary; 3,000 small blobs), then for each pack flips one byte at a time (XOR with a random
non-zero value) at every byte of its header, trailer and first record header (where a zstd
dictionary lives) and ``--flips`` random positions of the rest (``--all``: every byte), and at
``--index-flips`` positions of its index (every footer byte and a random sample of the rest),
restores it, and runs ``verify_pack`` after each flip (full; pack flips twice, with the index
and with ``--no-index``):

* missed:      verify said clean although a byte changed;
* false alarm: a problem named a frame whose bytes (record header + payload) the flip did not
  touch; a flip in the pack header or trailer may name no frame at all;
* crash:       anything but a report or an hframe error (``HframeError``) came out.

Prints one line per pack and part (pack bytes / index bytes), then a total; exits 1 if anything
was missed, falsely blamed or crashed. Targets: 0, 0 and 0.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pyarrow.parquet as pq  # noqa: E402
from make_sample import main as make_sample_main  # noqa: E402
from make_sample import make_records  # noqa: E402

from hframe_cli import pack  # noqa: E402
from hframe_cli.errors import HframeError  # noqa: E402
from hframe_cli.format.layout import HEADER_SIZE  # noqa: E402
from hframe_cli.verify.check import verify_pack  # noqa: E402


def make_packs(work: Path, seed: int, real: str | None) -> dict[str, Path]:
    from hframe_cli.sources.media import MediaOptions

    rng = random.Random(seed)
    make_sample_main([str(work / "photos"), "--count", "60", "--seed", str(seed)])
    make_records(str(work / "records"), 300, seed)
    blobs = work / "blobs"
    blobs.mkdir()
    for i in range(3000):
        (blobs / f"{i:05d}.bin").write_bytes(rng.randbytes(rng.randint(1, 300)))
    sources = [
        ("photos", work / "photos", MediaOptions()),
        ("records-zstd-dict", work / "records", MediaOptions(compress="zstd", zstd_dict="auto")),
        ("blobs", blobs, MediaOptions()),
    ]
    if real:
        sources.append(("real", Path(real), MediaOptions()))
    out = {}
    for name, src, media in sources:
        target = work / f"{name}.hframe"
        pack([src], target, media=media, skip_bad=True)
        out[name] = target
    return out


def frame_spans(pack_path: Path) -> list[tuple[int, int, int]]:
    t = pq.read_table(f"{pack_path}.index.parquet", columns=["frame_id", "record_offset", "offset", "length"])
    return [(r["record_offset"], r["offset"] + r["length"], r["frame_id"]) for r in t.to_pylist()]


def allowed_frames(pos: int, spans: list[tuple[int, int, int]]) -> set[int | None]:
    """The frames a flip at ``pos`` may be blamed on (None: a problem of the pack as a whole)."""
    if pos < HEADER_SIZE or pos >= spans[-1][1]:
        return {None}
    lo, hi = 0, len(spans) - 1
    while lo < hi:  # the last span starting at or before pos
        mid = (lo + hi + 1) // 2
        if spans[mid][0] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return {spans[lo][2], None}


def run_one(
    path: Path, target: Path, positions: list[int], rng: random.Random, spans, use_index: bool = True
) -> dict[str, int]:
    good = target.read_bytes()
    counts = {"flips": 0, "missed": 0, "false_alarms": 0, "crashes": 0}
    for pos in positions:
        bad = bytearray(good)
        bad[pos] ^= rng.randrange(1, 256)
        target.write_bytes(bytes(bad))
        counts["flips"] += 1
        try:
            report = verify_pack(path, use_index=use_index)
        except HframeError:
            continue  # not a pack at all, another major version: said in one line, exit 1 or 2
        except Exception as e:  # noqa: BLE001 - what the campaign is for
            counts["crashes"] += 1
            print(f"crash: {target.name} byte {pos}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        finally:
            target.write_bytes(good)
        if report.ok and report.error is None:
            counts["missed"] += 1
            print(f"missed: {target.name} byte {pos}", file=sys.stderr)
        elif spans is not None:
            allowed = allowed_frames(pos, spans)
            blamed = {p.frame_id for p in report.problems} - allowed
            if blamed:
                counts["false_alarms"] += 1
                print(f"false alarm: {target.name} byte {pos}: blamed frames {sorted(blamed)[:5]}", file=sys.stderr)
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work_dir", help="scratch folder (emptied first)")
    ap.add_argument("--flips", type=int, default=1000, help="random pack positions per pack (default 1000)")
    ap.add_argument("--index-flips", type=int, default=300, help="random index positions per pack, besides the footer")
    ap.add_argument("--first-record-bytes", type=int, default=4096, help="flip every one of record 0's first N bytes")
    ap.add_argument("--footer-flips", type=int, help="random footer positions of each index (default: every byte)")
    ap.add_argument("--all", action="store_true", help="flip every byte of every pack (slow)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--real", metavar="DIR", help="also pack the files of DIR (media made by others) and flip them")
    args = ap.parse_args()
    work = Path(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = random.Random(args.seed)
    total = {"flips": 0, "missed": 0, "false_alarms": 0, "crashes": 0}
    t0 = time.perf_counter()
    for name, path in make_packs(work, args.seed, args.real).items():
        spans = frame_spans(path)
        size = path.stat().st_size
        # every byte of the header, the trailer and record 0's header (a dictionary lives there),
        # and a random sample of the rest
        fixed = {
            *range(HEADER_SIZE),
            *range(spans[-1][1], size),
            *range(spans[0][0], min(spans[0][0] + args.first_record_bytes, spans[0][1])),
        }
        sampled = rng.sample(range(size), min(args.flips, size))
        positions = list(range(size)) if args.all else sorted(fixed.union(sampled))
        index = Path(f"{path}.index.parquet")
        isize = index.stat().st_size
        data = index.read_bytes()
        footer = isize - 8 - int.from_bytes(data[-8:-4], "little")
        footer_positions = range(footer, isize)
        if args.footer_flips is not None:
            footer_positions = rng.sample(footer_positions, min(args.footer_flips, isize - footer))
        ipositions = sorted({*footer_positions, *rng.sample(range(footer), min(args.index_flips, footer))})
        for part, target, where, sp, use_index in (
            ("pack", path, positions, spans, True),
            ("pack-no-index", path, positions, spans, False),
            ("index", index, ipositions, None, True),
        ):
            c = run_one(path, target, where, rng, sp, use_index)
            print(
                f"flip_campaign pack={name} part={part} bytes={target.stat().st_size} "
                + " ".join(f"{k}={v}" for k, v in c.items())
            )
            for k in total:
                total[k] += c[k]
    print(
        f"flip_campaign total {' '.join(f'{k}={v}' for k, v in total.items())} seconds={time.perf_counter() - t0:.1f} "
        f"target=missed=0,false_alarms=0,crashes=0 result={'PASS' if not (total['missed'] or total['false_alarms'] or total['crashes']) else 'FAIL'}"
    )
    return 1 if total["missed"] or total["false_alarms"] or total["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
