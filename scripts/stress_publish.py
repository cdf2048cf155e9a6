#!/usr/bin/env python3
"""Readers against cron: random reads while `hframe pack --update` publishes again and again.

Writers (``--writers`` threads, each running the real ``hframe`` command) change the source
folder (add, rewrite or remove a file) and run ``pack --update --wait``, some killed with
SIGKILL at a random moment (``--kill-rate``). Reader processes meanwhile open the pack over and
over and read random batches (``read_many``, and every other batch ``read_many_into`` one reused
buffer, as the workers do) and single frames (``p[i]``, ``p[name]``), every other open through a
memory map (``memory_map=True``), and keep one long-lived reader open across every publish
(mapped in every other reader process), forking and spawning workers from it. Every frame's bytes start with its own name and version, so a
read is checked against the file it claims to be, independently of any index: a frame whose
bytes belong to another name, or disagree with the md5 of the reader's own index, is a wrong
read.

Prints one JSON document: publishes, kills, reads, wrong reads, failed opens, lock waits
(p50/p99/max). Exit status 1 if any read was wrong or any open failed.

    .venv/bin/python scripts/stress_publish.py --publishes 1000 --readers 3 --writers 2 --kill-rate 0.1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HFRAME = str(Path(sys.executable).with_name("hframe"))


def frame_bytes(name: str, version: int, rng: random.Random) -> bytes:
    head = f"{name}|v{version}|".encode()
    return head + rng.randbytes(rng.randrange(200, 6000))


def check(name: str, data: bytes, md5: str) -> bool:
    """The bytes are those of this name (any version) and match the reader's own index."""
    return data.startswith(f"{name}|v".encode()) and hashlib.md5(data).hexdigest() == md5


# -- readers (separate processes) -----------------------------------------------------------


def _worker_read(blob: bytes | None, reader: object, results: object) -> None:
    import hframe_cli as h  # noqa: F401 - unpickling needs it

    r = pickle.loads(blob) if blob is not None else reader
    names = r.table.column("name").to_pylist()
    md5s = r.table.column("md5").to_pylist()
    ids = list(range(len(r)))
    wrong = sum(not check(n, d, m) for n, d, m in zip(names, batch(r, ids, 1), md5s))
    results.put(("worker", len(ids), wrong))  # type: ignore[attr-defined]


_BUFFER = bytearray(64 << 10)  # reused by every read_many_into of a reader process


def batch(reader: object, ids: list[int], turn: int) -> list[bytes]:
    """``read_many``, or every other turn ``read_many_into`` one reused buffer."""
    if turn % 2:
        return [bytes(v) for v in reader.read_many_into(ids, _BUFFER)]  # type: ignore[attr-defined]
    return reader.read_many(ids)  # type: ignore[attr-defined]


def reader_loop(out: str, stop: object, results: object, seed: int) -> None:
    import hframe_cli as h

    rng = random.Random(seed)
    reads = wrong = opens = failed = workers = 0
    errors: list[str] = []
    held = h.open_pack(out, memory_map=seed % 2 == 1)  # one reader kept across every publish
    held_names = held.table.column("name").to_pylist()
    held_md5 = held.table.column("md5").to_pylist()
    loops = 0
    while not stop.is_set():  # type: ignore[attr-defined]
        loops += 1
        try:
            opens += 1
            with h.open_pack(out, memory_map=loops % 2 == 1) as p:
                n = len(p)
                names = p.table.column("name").to_pylist()
                md5s = p.table.column("md5").to_pylist()
                for turn in range(5):
                    ids = [rng.randrange(n) for _ in range(min(n, 32))]
                    for i, data in zip(ids, batch(p, ids, turn)):
                        reads += 1
                        wrong += not check(names[i], data, md5s[i])
                    k = rng.randrange(n)
                    reads += 2
                    wrong += not check(names[k], p[names[k]], md5s[k])  # by name
                    wrong += not check(names[k], p[k], md5s[k])  # by id (the fast path)
        except Exception as e:  # noqa: BLE001 - every failed open is counted and shown
            failed += 1
            errors.append(f"{type(e).__name__}: {e}")
        ids = [rng.randrange(len(held)) for _ in range(16)]
        for i, data in zip(ids, batch(held, ids, loops)):
            reads += 1
            wrong += not check(held_names[i], data, held_md5[i])
        if loops % 20 == 3:  # a forked and a spawned worker from the long-lived reader
            for method in ("fork", "spawn"):
                ctx = mp.get_context(method)
                q = ctx.Queue()
                blob = pickle.dumps(held) if method == "spawn" else None
                proc = ctx.Process(target=_worker_read, args=(blob, held if blob is None else None, q))
                proc.start()
                try:
                    _, count, bad = q.get(timeout=120)
                    reads += count
                    wrong += bad
                except Exception as e:  # noqa: BLE001
                    failed += 1
                    errors.append(f"{method} worker: {type(e).__name__}: {e}")
                proc.join(30)
                workers += 1
    held.close()
    results.put(
        {
            "reads": reads,
            "wrong": wrong,
            "opens": opens,
            "failed_opens": failed,
            "workers": workers,
            "errors": errors[:5],
        }
    )  # type: ignore[attr-defined]


# -- writers (threads running the real command) ----------------------------------------------


class Sources:
    """The source folder; every change gives a file new bytes that start with its name."""

    def __init__(self, root: Path, files: int, rng: random.Random) -> None:
        self.root, self.rng = root, rng
        self.lock = threading.Lock()
        self.versions: dict[str, int] = {}
        self.next_name = 0
        for _ in range(files):
            self.add()

    def write(self, name: str) -> None:
        self.versions[name] = self.versions.get(name, 0) + 1
        (self.root / name).write_bytes(frame_bytes(name, self.versions[name], self.rng))

    def add(self) -> None:
        self.write(f"f{self.next_name:06d}.bin")
        self.next_name += 1

    def change(self) -> None:
        with self.lock:
            roll = self.rng.random()
            live = sorted(n for n in self.versions if (self.root / n).exists())
            if roll < 0.5 or len(live) < 20:
                self.add()  # append
            elif roll < 0.75:
                self.write(self.rng.choice(live))  # rewrite: repack
            else:
                (self.root / self.rng.choice(live)).unlink()  # remove: repack


def writer_loop(args: argparse.Namespace, src: Sources, out: str, state: dict, seed: int) -> None:
    rng = random.Random(seed)
    while True:
        with state["lock"]:
            if state["publishes"] >= args.publishes or time.monotonic() > state["deadline"]:
                return
        src.change()
        proc = subprocess.Popen(
            # --skip-bad: the other writer may remove a file while this one lists it
            [HFRAME, "pack", str(src.root), "-o", out, "--update", "--wait", "120", "--skip-bad"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "HFRAME_TTY": "0"},
        )
        killed = rng.random() < args.kill_rate
        if killed:
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate()
        waits = [float(w) for w in re.findall(rb"waited ([0-9.]+) s for the lock", stderr)]
        with state["lock"]:
            state["lock_waits"].append(waits[0] if waits else 0.0)
            if proc.returncode == -signal.SIGKILL:
                state["kills"] += 1
            elif proc.returncode != 0:
                state["writer_errors"].append(stderr.decode(errors="replace").strip()[-300:])
            elif b"up to date" not in stderr:
                state["publishes"] += 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--publishes", type=int, default=1000)
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--kill-rate", type=float, default=0.1, help="share of writer runs killed with SIGKILL")
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--max-seconds", type=float, default=3600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed after)")
    args = ap.parse_args()

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hframe-stress-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    root = work / "src"
    root.mkdir(exist_ok=True)
    src = Sources(root, args.files, rng)
    out = str(work / "stress.hframe")
    subprocess.run([HFRAME, "pack", str(root), "-o", out, "-q", "--force"], check=True)

    ctx = mp.get_context("spawn")
    stop, results = ctx.Event(), ctx.Queue()
    readers = [ctx.Process(target=reader_loop, args=(out, stop, results, args.seed + k)) for k in range(args.readers)]
    for r in readers:
        r.start()
    state: dict = {
        "lock": threading.Lock(),
        "publishes": 0,
        "kills": 0,
        "lock_waits": [],
        "writer_errors": [],
        "deadline": time.monotonic() + args.max_seconds,
    }
    t0 = time.monotonic()
    threads = [
        threading.Thread(target=writer_loop, args=(args, src, out, state, args.seed * 100 + k))
        for k in range(args.writers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    stop.set()
    totals = {"reads": 0, "wrong": 0, "opens": 0, "failed_opens": 0, "workers": 0, "errors": []}
    for _ in readers:
        part = results.get(timeout=300)
        for k in totals:
            totals[k] += part[k]
    for r in readers:
        r.join(60)
    final = subprocess.run([HFRAME, "pack", str(root), "-o", out, "--update", "--json"], capture_output=True)
    verify = subprocess.run([HFRAME, "verify", out, "-q"], capture_output=True)
    waits = state["lock_waits"]
    doc = {
        "publishes": state["publishes"],
        "writer_runs": len(waits),
        "kills": state["kills"],
        "writer_errors": state["writer_errors"][:5],
        "reads": totals["reads"],
        "wrong_reads": totals["wrong"],
        "opens": totals["opens"],
        "failed_opens": totals["failed_opens"],
        "workers_forked_and_spawned": totals["workers"],
        "reader_errors": totals["errors"],
        "lock_wait_s": {
            "p50": percentile(waits, 0.5),
            "p99": percentile(waits, 0.99),
            "max": max(waits, default=0.0),
        },
        "final_update_exit": final.returncode,
        "final_verify_exit": verify.returncode,
        "elapsed_s": round(elapsed, 1),
    }
    print(json.dumps(doc, indent=1))
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    bad = doc["wrong_reads"] or doc["failed_opens"] or doc["writer_errors"] or final.returncode or verify.returncode
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
