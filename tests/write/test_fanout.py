"""``pack`` on several processes (``fanout``): byte for byte the pack of one writer, whatever the
inputs hold, and a run that is stopped, killed, runs out of disk or loses a worker resumes to
the same bytes."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import hframe_bin, make_image, open_files, real_media, run_bin
from conftest import same_pack as same

import hframe_cli as h
import hframe_cli.write.parallel as fanout
import hframe_cli.write.writer as writer_mod
from hframe_cli.errors import InputError, StorageError
from hframe_cli.format.index import IndexBuilder, IndexMeta
from hframe_cli.processes import usable_cpus
from hframe_cli.sources.inputs import collect_sources
from hframe_cli.sources.sourcelist import SourceList
from hframe_cli.write.checkpoint import CheckpointPolicy
from hframe_cli.write.writer import ChunkWriter, PackWriter

CREATED = ["--created", "1700000000", "--allow-empty"]


def mixed_tree(root: Path, n: int = 600, seed: int = 0) -> Path:
    """Tiny blobs, empty files, names that are not UTF-8, images of ours (one with a broken
    header) and real ones, in nested folders (labels)."""
    rng = random.Random(seed)
    for i in range(n):
        p = root / f"c{i % 7}" / f"{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.choice([0, 1, 17, 300, 2600, 9000])))
    os.makedirs(root / "odd", exist_ok=True)
    with open(os.path.join(os.fsencode(root / "odd"), b"caf\xe9.bin"), "wb") as f:
        f.write(b"latin-1 name")
    for i in range(5):
        make_image(root / "ours" / f"{i}.png", (20 + i, 10 + i), "RGB", i)
        make_image(root / "ours" / f"{i}.jpg", (30 + i, 12 + i), "L", i)
    (root / "ours" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    real = real_media()
    assert len(real) >= 10, real  # the machine has images made by others
    for i, p in enumerate(real):
        dst = root / "real" / f"{i:03d}-{p.name}"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dst)
    return root


@pytest.fixture(autouse=True)
def forks(monkeypatch):
    """This test process has idle Arrow threads by now (from earlier tests), which makes
    ``fork_is_safe`` say no; the ``hframe`` processes the other tests run have none."""
    monkeypatch.setattr(fanout, "fork_is_safe", lambda: True)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return mixed_tree(tmp_path_factory.mktemp("fanout") / "src")


@pytest.fixture(scope="module")
def clean(tree, tmp_path_factory) -> Path:
    """The one-writer pack of ``tree``."""
    out = tmp_path_factory.mktemp("clean") / "one.hframe"
    r = run_bin(["pack", str(tree), "-o", str(out), "-q", "--workers", "1", *CREATED])
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("workers", ["2", "3", "7"])
def test_workers_write_the_pack_of_one_writer(tree, clean, tmp_path, workers):
    out = tmp_path / "n.hframe"
    r = run_bin(["pack", str(tree), "-o", str(out), "--workers", workers, "--json", *CREATED])
    assert r.returncode == 0, r.stderr
    assert same(out, clean)
    doc = json.loads(r.stdout)
    assert [w["path"] for w in doc["warnings"]] == [str(tree / "ours" / "broken.jpg")]
    t = pq.read_table(f"{out}.index.parquet")  # an independent reader agrees with the pack
    assert t.num_rows == doc["frame_count"] and t.column("width").null_count < t.num_rows
    assert h.verify_pack(out).ok


@pytest.mark.skipif(usable_cpus() < 2, reason="the default uses workers only with two CPUs or more")
def test_the_default_uses_workers_for_many_files(tree, tmp_path, monkeypatch):
    sources = collect_sources([str(tree)], allow_empty=True)
    used = []
    real = fanout.write_chunks
    monkeypatch.setattr(fanout, "_DEFAULT_ABOVE_FILES", 100)
    monkeypatch.setattr("hframe_cli.write.run.write_chunks", lambda *a: used.append(a[-1]) or real(*a))
    h.pack_sources(sources, tmp_path / "d.hframe", created_us=1)
    assert used and used[0] >= 2
    used.clear()
    h.pack_sources(sources, tmp_path / "a.hframe", created_us=1, alignment=64)  # sizes depend on offsets
    assert not used


def test_bad_inputs_are_skipped_or_fail_as_with_one_writer(tree, tmp_path):
    work = tmp_path / "src"
    shutil.copytree(tree, work)
    sources = collect_sources([str(work)], allow_empty=True)
    paths = [s.path for s in sources.sources]
    gone = [paths[40], paths[41], paths[300]]
    grown = paths[500]
    for p in gone:
        os.unlink(p)
    with open(grown, "ab") as f:
        f.write(b"more")
    results = {}
    for workers in (1, 3):
        out = tmp_path / f"s{workers}.hframe"
        results[workers] = h.pack_sources(sources, out, created_us=1, skip_bad=True, workers=workers)
    assert same(tmp_path / "s1.hframe", tmp_path / "s3.hframe")
    for workers in (1, 3):
        assert [r.path for r in results[workers].skipped] == [*gone[:2], gone[2], grown]
    # without --skip-bad: the first bad file in order is named, nothing is left behind
    with pytest.raises(InputError, match=re.escape(f"{paths[40]}: vanished while packing")):
        h.pack_sources(sources, tmp_path / "f.hframe", created_us=1, workers=3)
    assert not list(tmp_path.glob("f.hframe*"))


def test_strict_images_fail_on_the_broken_header(tree, tmp_path):
    r = run_bin(["pack", str(tree), "-o", str(tmp_path / "x.hframe"), "--workers", "3", "--strict-images", *CREATED])
    assert r.returncode != 0 and b"broken.jpg" in r.stderr and b"Traceback" not in r.stderr
    assert not list(tmp_path.glob("x.hframe*"))


def test_a_lost_worker_is_replaced_by_this_process(tree, clean, tmp_path, monkeypatch):
    """A worker that dies mid-run (killed here as the fourth chunk is placed): the others are
    killed and reaped, the pack is cut back to the chunks taken in, and this process packs the
    rest: the same bytes."""
    pids: list[int] = []
    real_fork, real_write = fanout.fork_helper, os.write
    placed = []

    def fork_helper(*a):
        pids.append(real_fork(*a))
        return pids[-1]

    def write(fd, data):
        if len(data) == fanout._PLACE.size and len(pids) == 2:
            placed.append(fd)
            if len(placed) == 4:
                os.kill(pids[0], signal.SIGKILL)
        return real_write(fd, data)

    monkeypatch.setattr(fanout, "fork_helper", fork_helper)
    monkeypatch.setattr(fanout.os, "write", write)
    events: list[str] = []
    out = tmp_path / "lost.hframe"
    h.pack_sources(
        collect_sources([str(tree)], allow_empty=True),
        out,
        created_us=1_700_000_000_000_000,
        workers=2,
        on_event=events.append,
    )
    assert any("a packing worker stopped" in e for e in events), events
    assert same(out, clean)
    assert len(pids) == 2 and all(_parent(p) == -1 for p in pids)  # both reaped


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _paused(tree: Path, out: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HFRAME_TTY": "0", "HFRAME_FAULT": "after-frame:300:stop"}
    proc = subprocess.Popen(
        [hframe_bin(), "pack", str(tree), "-o", str(out), "--workers", "2", *CREATED, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.monotonic() + 60
    while True:  # until it stops itself after frame 300 (state T)
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return proc
        time.sleep(0.01)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_pack_ends_the_workers_and_resume_gives_the_same_pack(tree, clean, tmp_path, sig):
    out = tmp_path / "s.hframe"
    proc = _paused(tree, out, "--checkpoint-every", "100")
    workers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == proc.pid]
    assert len(workers) == 2
    for pid in workers:  # each holds the pack and the output's lock, and nothing else of the parent's
        fds = open_files(pid)
        assert f"{out}.partial" in fds and f"{out}.lock" in fds, fds
    # a second run meanwhile, a second process: locked out, and the paused run's pack untouched
    r = run_bin(["pack", str(tree), "-o", str(out), "--force", "--workers", "2", *CREATED])
    assert r.returncode == 3 and b"locked by another hframe run" in r.stderr, r.stderr
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130 and b"Traceback" not in err, err
    for pid in workers:
        assert _parent(pid) == -1  # gone
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] >= 300  # the end of the chunk it stopped in
    assert same(out, clean)


def test_a_packer_killed_with_a_stuck_worker_is_resumed_to_the_same_pack(tree, clean, tmp_path):
    """SIGKILL of the packer while a worker is stopped: the worker dies with it (it could
    still write into the pack), so the next run takes the lock and finishes the same pack."""
    out = tmp_path / "k.hframe"
    proc = _paused(tree, out, "--checkpoint-every", "100")
    stuck = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == proc.pid][0]
    os.kill(stuck, signal.SIGSTOP)
    proc.kill()
    proc.communicate(timeout=60)
    r = run_bin(["resume", str(out), "--wait", "30"])
    assert r.returncode == 0, r.stderr
    assert same(out, clean)


@pytest.mark.parametrize("frame", [1, 150, 420])
def test_killed_anywhere_then_resumed(tree, clean, tmp_path, frame):
    out = tmp_path / "k.hframe"
    r = run_bin(
        ["pack", str(tree), "-o", str(out), "--workers", "3", "--checkpoint-every", "50", *CREATED],
        env={"HFRAME_FAULT": f"after-frame:{frame}"},
    )
    assert r.returncode == -signal.SIGKILL
    r = run_bin(["resume", str(out), "--workers", "2", "--json"])
    assert r.returncode == 0, r.stderr
    assert same(out, clean)


def test_disk_full_keeps_the_checkpoint_and_resumes(tree, clean, tmp_path):
    out = tmp_path / "full.hframe"
    r = run_bin(
        ["pack", str(tree), "-o", str(out), "--workers", "3", "--checkpoint-every", "50", *CREATED],
        env={"HFRAME_FAULT": "enospc:400000"},
    )
    assert r.returncode == 3, r.stderr
    assert b"disk full" in r.stderr and b"Traceback" not in r.stderr
    assert Path(f"{out}.ckpt").exists()
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] > 0
    assert same(out, clean)


def test_index_builders_joined_are_the_builder_of_all_rows():
    rng = random.Random(7)
    rows = []
    for i in range(400):
        name = rng.choice([b"a/", b"b/", b"", b"c\xff/"]) + f"{i}".encode() + rng.choice([b"", b"\xfe"])
        meta = rng.choice(
            [
                None,
                {"width": i, "height": 2 * i, "mode": rng.choice(["RGB", "L"])},
                {"label": rng.choice(["x", "y", None]), "split": rng.choice(["train", "val"])},
                {
                    "frame_index": i,
                    "pts_s": i / 3,
                    "keyframe": bool(i % 2),
                    "source": "v.mp4",
                    "width": 4,
                    "height": 3,
                    "mode": "RGB",
                },
            ]
        )
        rows.append(
            dict(
                name=name,
                offset=rng.randrange(1 << 40),
                length=i,
                md5=rng.randbytes(16),
                media_type=rng.choice(["jpeg", "png", "unknown"]),
                kind=rng.choice([0, 1, 2]),
                codec=0,
                raw_length=i,
                source_size=i,
                mtime_ns=rng.randrange(1 << 60),
                record_offset=rng.randrange(1 << 40),
                meta=meta,
            )
        )
    whole = IndexBuilder()
    for row in rows:
        whole.append(**row)
    cuts = sorted(rng.sample(range(1, 400), 9))
    joined = IndexBuilder()
    for a, b in zip([0, *cuts], [*cuts, 400]):
        part = IndexBuilder()
        for row in rows[a:b]:
            part.append(**{**row, "offset": row["offset"] - 5, "record_offset": row["record_offset"] - 5})
        part.shift_offsets(5)
        joined.extend(part)
    meta = IndexMeta("1.1", "1", "0" * 32, "t", 400, 1, 1, 1, "x")
    assert joined.to_table(meta).equals(whole.to_table(meta))
    assert array("q", joined._ints["offset"]) == whole._ints["offset"]


@pytest.mark.parametrize(
    "extra", [["--compress", "zstd:3"], ["--label-from", "none", "--split", "train=0.8,val=0.2"], ["--no-image-meta"]]
)
def test_workers_with_compression_and_options_write_the_pack_of_one_writer(tree, tmp_path, extra):
    packs = []
    for workers in ("1", "3"):
        out = tmp_path / f"w{workers}.hframe"
        r = run_bin(["pack", str(tree), "-o", str(out), "-q", "--workers", workers, *CREATED, *extra])
        assert r.returncode == 0, r.stderr
        packs.append(out)
    assert same(*packs)
    assert h.verify_pack(packs[1]).ok


def test_a_pack_by_workers_builds_no_source_objects(tree, clean, tmp_path, monkeypatch):
    """200,000 ``Source`` objects took 0.3 s of a 4 s pack: the command's path (listing, shard
    plan, fingerprint, saved list, workers) reads the list's columns; a worker makes its own."""

    def refuse(self):
        raise AssertionError("a Source object per source was built in the packing process")

    monkeypatch.setattr(SourceList, "sources", property(refuse))
    out = tmp_path / "cols.hframe"
    h.pack([str(tree)], out, allow_empty=True, workers=2, created_us=1_700_000_000_000_000)
    assert same(out, clean)


def test_a_checkpoint_is_committed_on_a_thread_while_the_workers_go_on(tree, clean, tmp_path, monkeypatch):
    """A periodic checkpoint's fsync waits for the disk (0.3 s here); the workers' chunks are
    taken in meanwhile, the checkpoint is saved after its fsync, and every one is reported."""
    seen: list[tuple[str, int, int]] = []
    real = PackWriter.sync

    def slow_sync(self):
        before = len(self)
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.3)
        real(self)
        seen.append((threading.current_thread().name, before, len(self)))

    monkeypatch.setattr(PackWriter, "sync", slow_sync)
    events: list[str] = []
    out = tmp_path / "ck.hframe"
    h.pack(
        [str(tree)],
        out,
        allow_empty=True,
        workers=2,
        created_us=1_700_000_000_000_000,
        checkpoints=CheckpointPolicy(every_frames=150),
        on_event=events.append,
    )
    assert same(out, clean)
    on_thread = [(b, a) for name, b, a in seen if name == "hframe-checkpoint"]
    assert on_thread and any(after > before for before, after in on_thread), seen
    periodic = [e for e in events if e.startswith("checkpoint:") and "frames committed" in e]
    assert len(periodic) == len(on_thread), events
    assert not [t for t in threading.enumerate() if t.name == "hframe-checkpoint"]


@pytest.mark.parametrize("workers", [2, 1])
def test_a_checkpoint_that_fails_fails_the_run(tree, clean, tmp_path, monkeypatch, workers):
    """A checkpoint fsync that fails (the disk went away), on the checkpoint's thread while
    workers pack or in the one-writer loop, fails the run: nothing is published, the
    checkpoint before it is kept, and resume gives the same pack."""
    real = PackWriter.sync
    calls: list[str] = []

    def failing_sync(self):  # the first call is the partial pack's creation; then checkpoints
        calls.append(threading.current_thread().name)
        if threading.current_thread() is not threading.main_thread() or (workers == 1 and len(calls) > 1):
            raise StorageError(f"{self.partial_path}: cannot write: Input/output error")
        real(self)

    monkeypatch.setattr(PackWriter, "sync", failing_sync)
    out = tmp_path / "fail.hframe"
    with pytest.raises(StorageError, match="Input/output error"):
        h.pack(
            [str(tree)],
            out,
            allow_empty=True,
            workers=workers,
            created_us=1_700_000_000_000_000,
            checkpoints=CheckpointPolicy(every_frames=150),
        )
    assert not out.exists() and Path(f"{out}.partial").exists() and Path(f"{out}.ckpt").exists()
    assert not [t for t in threading.enumerate() if t.name == "hframe-checkpoint"]
    assert len(calls) == 2 and calls[-1] == ("hframe-checkpoint" if workers > 1 else "MainThread")
    monkeypatch.setattr(PackWriter, "sync", real)
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert same(out, clean)


@pytest.fixture(scope="module")
def big_records(tmp_path_factory) -> tuple[Path, Path]:
    """A tree whose records average 40 KB (the chunks are written through a map of the pack),
    real images among them, and its one-writer pack."""
    root = tmp_path_factory.mktemp("bigrec") / "src"
    rng = random.Random(3)
    for i in range(90):
        p = root / f"d{i % 3}" / f"{i:03d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randrange(20_000, 60_000)))
    (root / "real").mkdir()
    for i, src in enumerate(real_media(20)):
        shutil.copyfile(src, root / "real" / f"{i:02d}-{src.name}")
    one = tmp_path_factory.mktemp("bigrec1") / "one.hframe"
    r = run_bin(["pack", str(root), "-o", str(one), "-q", "--workers", "1", *CREATED])
    assert r.returncode == 0, r.stderr
    return root, one


def _mapped_calls(monkeypatch, log: Path, before=None) -> None:
    """Record each worker's ``_map_write`` (pid, answer) in ``log`` (workers are forked: a file
    outlives them); ``before(at)`` runs first. Chunks made in Python (a compiled chunk is never
    mapped: ``test_compiled_chunks_are_written_in_turns_not_mapped``)."""
    monkeypatch.setattr(fanout, "blobs", None)
    real = ChunkWriter._map_write

    def logged(self, parts, at, size):
        if before is not None:
            before(at)
        ok = real(self, parts, at, size)
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {ok}\n")
        return ok

    monkeypatch.setattr(ChunkWriter, "_map_write", logged)
    monkeypatch.setattr(writer_mod, "maps_coherently", lambda dev: True)  # whatever holds tmp_path


def test_chunks_of_large_records_are_written_through_a_map_to_the_same_bytes(big_records, tmp_path, monkeypatch):
    root, one = big_records
    log = tmp_path / "maps.log"
    _mapped_calls(monkeypatch, log)
    out = tmp_path / "m.hframe"
    h.pack_sources(collect_sources([str(root)]), out, created_us=1_700_000_000_000_000, workers=2)
    calls = log.read_text().split()
    assert calls.count("True") >= 4 and len(set(calls[0::2])) == 2  # both workers mapped
    assert same(out, one)
    assert pq.read_table(f"{out}.index.parquet").num_rows == pq.read_table(f"{one}.index.parquet").num_rows
    assert h.verify_pack(out).ok


def test_a_pack_that_cannot_be_mapped_is_written_with_pwritev(big_records, tmp_path, monkeypatch):
    root, one = big_records
    monkeypatch.setattr(fanout, "blobs", None)  # (chunks made in Python: the ones that map)
    monkeypatch.setattr(writer_mod.mmap, "mmap", lambda *a, **k: (_ for _ in ()).throw(OSError(19, "No such device")))
    out = tmp_path / "p.hframe"
    h.pack_sources(collect_sources([str(root)]), out, created_us=1_700_000_000_000_000, workers=2)
    assert same(out, one)


@pytest.mark.skipif(fanout.blobs is None, reason="the compiled part is not built here (or HFRAME_NATIVE=0)")
def test_compiled_chunks_are_written_in_turns(big_records, tmp_path, monkeypatch):
    """A compiled chunk (one buffer) is written with one ``pwrite`` while its worker holds the
    run's write turn (a POSIX lock the other worker sleeps on, instead of spinning on the inode
    lock): both workers wrote, never both at once (each logs its turn while holding it: the log
    alternates), and the pack is one writer's, byte for byte."""
    import fcntl

    root, one = big_records
    log = tmp_path / "turns.log"
    monkeypatch.setattr(writer_mod, "maps_coherently", lambda dev: True)  # whatever holds tmp_path
    real = fcntl.lockf

    def lockf(fd, cmd, length=0, start=0, whence=0):
        if start != writer_mod._TURN_AT:
            return real(fd, cmd, length, start, whence)
        if cmd == fcntl.LOCK_UN:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}:give\n")
        real(fd, cmd, length, start, whence)
        if cmd == fcntl.LOCK_EX:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}:take\n")
        return None

    monkeypatch.setattr(writer_mod.fcntl, "lockf", lockf)
    out = tmp_path / "t.hframe"
    h.pack_sources(collect_sources([str(root)]), out, created_us=1_700_000_000_000_000, workers=2)
    turns = [t.split(":") for t in log.read_text().split()]
    assert len({pid for pid, _ in turns}) == 2  # both workers wrote compiled chunks
    assert [op for _, op in turns] == ["take", "give"] * (len(turns) // 2)  # one at a time
    assert all(turns[k][0] == turns[k + 1][0] for k in range(0, len(turns), 2))  # each gave its own back
    assert same(out, one) and h.verify_pack(out).ok


def test_a_pack_on_a_filesystem_that_writes_around_its_cache_is_never_mapped(big_records, tmp_path, monkeypatch):
    """Where ``write`` may go around the page cache (FUSE with direct I/O, CIFS cache=none), a
    mapped page written back whole could put stale bytes over a neighbouring chunk: no map, no
    room reserved for one, the same bytes."""
    root, one = big_records
    log = tmp_path / "maps.log"
    _mapped_calls(monkeypatch, log)
    monkeypatch.setattr(writer_mod, "maps_coherently", lambda dev: False)
    asked, extended = [], []  # reserve calls, and ftruncate calls made inside them
    real_reserve, real_ftruncate = writer_mod.PackWriter.reserve, os.ftruncate

    def reserve(self, start, size, records):
        asked.append(start)
        real_reserve(self, start, size, records)

    def ftruncate(fd, n):
        if len(asked) > len(extended) and sys._getframe(1).f_code.co_name == "reserve":
            extended.append(n)
        real_ftruncate(fd, n)

    monkeypatch.setattr(writer_mod.PackWriter, "reserve", reserve)
    monkeypatch.setattr(writer_mod.os, "ftruncate", ftruncate)
    out = tmp_path / "n.hframe"
    h.pack_sources(collect_sources([str(root)]), out, created_us=1_700_000_000_000_000, workers=2)
    assert not log.exists() and asked and extended == []  # room asked for, none taken, no map
    assert same(out, one)


MOUNTINFO = b"""22 27 0:21 / /proc rw,relatime - proc proc rw
29 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
31 29 0:42 / /mnt/fast rw,relatime master:4 shared:9 - xfs /dev/nvme0n1 rw
33 29 0:50 / /mnt/sshfs rw,nosuid,nodev,relatime - fuse.sshfs host:/data rw,user_id=0
34 29 0:51 / /mnt/smb\040share rw,relatime - cifs //nas/share rw,cache=none
35 29 0:52 / /var/lib/docker/x rw - overlay overlay rw,lowerdir=/a,upperdir=/b
a broken line
"""


@pytest.mark.parametrize(
    ("dev", "fstype", "coherent"),
    [
        ((254, 0), "ext4", True),
        ((0, 42), "xfs", True),
        ((0, 50), "fuse.sshfs", False),
        ((0, 51), "cifs", False),
        ((0, 52), "overlay", False),
        ((9, 9), None, False),
    ],
)
def test_the_filesystem_of_a_device_is_read_from_mountinfo(dev, fstype, coherent):
    found = writer_mod.filesystem_type(os.makedev(*dev), MOUNTINFO.splitlines())
    assert found == fstype
    assert (found in writer_mod._COHERENT_FILESYSTEMS) is coherent


def test_maps_coherently_names_the_filesystem_findmnt_names(tmp_path):
    findmnt = shutil.which("findmnt")
    if findmnt is None:
        pytest.skip("no findmnt here to compare with")
    for where in (tmp_path, Path("/dev/shm"), Path("/proc")):
        if not where.exists():
            continue
        fstype = subprocess.run([findmnt, "-n", "-o", "FSTYPE", "-T", str(where)], capture_output=True, text=True)
        want = fstype.stdout.strip().splitlines()[-1] if fstype.stdout.strip() else None
        with open("/proc/self/mountinfo", "rb") as f:
            assert writer_mod.filesystem_type(os.stat(where).st_dev, f) == want, where
        assert writer_mod.maps_coherently(os.stat(where).st_dev) is (want in writer_mod._COHERENT_FILESYSTEMS)


def test_a_worker_killed_by_sigbus_in_its_map_is_replaced(big_records, tmp_path, monkeypatch):
    """A page of the map that cannot be written (the disk filled up, an I/O error) is a SIGBUS
    in the worker: it dies, and this process packs the rest, to the same bytes."""
    root, one = big_records
    log = tmp_path / "maps.log"
    half = sum(p.stat().st_size for p in root.rglob("*")) // 2

    def sigbus_past_half(at: int) -> None:
        if at > half:  # (both workers may get here: each dies)
            os.kill(os.getpid(), signal.SIGBUS)

    _mapped_calls(monkeypatch, log, sigbus_past_half)
    events: list[str] = []
    out = tmp_path / "b.hframe"
    h.pack_sources(
        collect_sources([str(root)]), out, created_us=1_700_000_000_000_000, workers=2, on_event=events.append
    )
    assert any("a packing worker stopped" in e for e in events), events
    assert same(out, one)
