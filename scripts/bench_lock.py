#!/usr/bin/env python3
"""How fast a run that finds its output locked gives up, beside what listing would have cost.

Makes (or reuses) a folder of ``--files`` small files, packs it once, then holds the output's
lock from another process and times, side by side, medians of ``--repeat`` runs each:

- ``hframe --version``: the interpreter and typer start-up, the floor of any command;
- ``hframe pack FOLDER -o OUT --update`` while locked (exit 3);
- ``hframe resume OUT`` while locked (exit 3);
- ``hframe pack FOLDER -o OUT --update`` unlocked, nothing changed: the listing and comparison
  a locked run no longer does before giving up.

    .venv/bin/python scripts/bench_lock.py /tmp/lockbench --files 200000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HFRAME = str(Path(sys.executable).with_name("hframe"))


def timed(args: list[str], expect: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run([HFRAME, *args], capture_output=True, env={**os.environ, "HFRAME_TTY": "0"})
        times.append(time.perf_counter() - t0)
        if r.returncode != expect:
            sys.exit(f"{' '.join(args)}: exit {r.returncode}, expected {expect}: {r.stderr.decode()[-300:]}")
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    root = Path(args.dir)
    src = root / "files"
    if not src.is_dir() or sum(1 for _ in src.rglob("*.bin")) != args.files:
        for i in range(args.files):
            d = src / f"d{i // 1000:04d}"
            if i % 1000 == 0:
                d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:07d}.bin").write_bytes(b"x%d" % i)
    out = root / "locked.hframe"
    if not out.exists():
        subprocess.run([HFRAME, "pack", str(src), "-o", str(out), "-q"], check=True)
    version = timed(["--version"], 0, args.repeat)
    unlocked = timed(["pack", str(src), "-o", str(out), "--update", "-q"], 0, args.repeat)
    code = "import sys; from hframe_cli.write.lock import OutputLock; l = OutputLock(sys.argv[1]).acquire(); "
    code += "print('held', flush=True); sys.stdin.read(); l.release()"
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    try:
        locked = timed(["pack", str(src), "-o", str(out), "--update", "-q"], 3, args.repeat)
        resume = timed(["resume", str(out), "-q"], 3, args.repeat)
    finally:
        holder.communicate()
    print(f"{args.files} files, medians of {args.repeat} runs")
    print(f"hframe --version                      {version:7.3f} s")
    print(f"pack --update, locked (exit 3)        {locked:7.3f} s   {locked / version:5.2f} x --version")
    print(f"resume, locked (exit 3)               {resume:7.3f} s   {resume / version:5.2f} x --version")
    print(f"pack --update, unlocked, no change    {unlocked:7.3f} s   locked / unlocked = {locked / unlocked:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
