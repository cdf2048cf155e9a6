#!/usr/bin/env python3
"""Kill `hframe pack` at many moments, resume it, and check the result is byte-identical.

Usage: python scripts/crash_resume.py [--kills 100] [--files 400] [--seed 1] [--workers N] [--keep DIR]

Two kinds of kill, alternating:
- at a named point (HFRAME_FAULT=after-frame:K, checkpoint-before-rename:K,
  checkpoint-between-renames:K, after-seal, publish-between-renames) with K drawn at random;
- at a random wall-clock moment: SIGKILL after a random delay, wherever the process is
  (listing, reading, writing, fsync, sealing, self-check, publishing).

After each kill: `hframe resume OUT` (run again if the resume itself was killed), then the
pack and index must equal a clean run's byte for byte, and no checkpoint or lock may be left.
``--workers N`` packs with N forked workers (``hframe_cli/write/parallel.py``), whose periodic
checkpoints are committed on a thread while they go on.
Prints one line per kill and a summary; exits 1 on the first mismatch. The suite runs 20+ of
these in tests/write/test_resume.py; this script runs as many as you like.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HFRAME = [sys.executable, "-m", "hframe_cli"]


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*HFRAME, *args], capture_output=True, env={**os.environ, "HFRAME_TTY": "0", **(env or {})})


def make_files(root: Path, n: int, rng: random.Random) -> None:
    for i in range(n):
        p = root / f"d{i % 7}" / f"{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randrange(1, 64_000)))


def identical(a: Path, b: Path) -> bool:
    return (
        a.read_bytes() == b.read_bytes()
        and Path(f"{a}.index.parquet").read_bytes() == Path(f"{b}.index.parquet").read_bytes()
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, help="pack (and resume) with --workers N")
    ap.add_argument("--keep", help="work in this folder and keep it")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hframe-crash-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    if not src.exists():
        make_files(src, args.files, rng)
    pack_args = ["pack", str(src), "--created", "1700000000", "--checkpoint-every", "7", "-q"]
    if args.workers:
        pack_args += ["--workers", str(args.workers)]
    clean = work / "clean.hframe"
    t0 = time.perf_counter()
    r = run([*[a for a in pack_args if a != "-q"], "-o", str(clean), "--force"])
    if r.returncode != 0:
        print("clean pack failed", file=sys.stderr)
        return 1
    clean_s = time.perf_counter() - t0
    # checkpoint saves in a clean run: one line per periodic one, plus the intent and the last
    # (workers checkpoint once per chunk, far fewer than --checkpoint-every alone would say)
    saves = r.stderr.count(b"checkpoint:") + 2
    points = [
        "after-frame",
        "checkpoint-before-rename",
        "checkpoint-between-renames",
        "after-seal",
        "publish-between-renames",
    ]
    failures = 0
    for k in range(args.kills):
        out = work / "k.hframe"
        for p in work.glob("k.hframe*"):
            p.unlink()
        if k % 2 == 0:
            point = rng.choice(points)
            fault = f"{point}:{rng.randrange(1, saves + 1) if point.startswith('checkpoint') else rng.randrange(1, args.files + 1)}"
            if point in ("after-seal", "publish-between-renames"):
                fault = point
            r = run([*pack_args, "-o", str(out)], env={"HFRAME_FAULT": fault})
            how = fault
            killed = r.returncode == -signal.SIGKILL
        else:
            delay = rng.uniform(0.0, clean_s * 1.2)
            proc = subprocess.Popen(
                [*HFRAME, *pack_args, "-o", str(out)], stderr=subprocess.DEVNULL, env={**os.environ, "HFRAME_TTY": "0"}
            )
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            killed = proc.wait() == -signal.SIGKILL
            how = f"SIGKILL after {delay:.3f} s"
        tries = 0
        while True:
            r = run(["resume", str(out)])
            tries += 1
            if r.returncode in (0, 5) or tries > 3:
                break
        if r.returncode == 5:  # killed before the intent was on disk: nothing to resume; pack again
            r = run([*pack_args, "-o", str(out)])
        ok = (
            r.returncode == 0
            and identical(out, clean)
            and not list(work.glob("k.hframe.ckpt*"))
            and not (work / "k.hframe.lock").exists()
        )
        print(
            f"kill {k + 1:3d}: {how:40s} killed={killed!s:5s} resume rc={r.returncode} "
            f"{'identical' if ok else 'MISMATCH'}"
        )
        if not ok:
            failures += 1
            print(r.stderr.decode(errors="replace"), file=sys.stderr)
            break
    print(
        f"crash_resume kills={k + 1} failures={failures} files={args.files} workers={args.workers or 'default'} "
        f"clean_pack_s={clean_s:.2f} "
        f"result={'PASS' if failures == 0 else 'FAIL'}"
    )
    if not args.keep:
        shutil.rmtree(work)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
