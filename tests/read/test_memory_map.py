"""PackReader(memory_map=True): the same bytes as pread on every read path, across fork, close,
pickling and a dataset's shards; and what the docs say happens to a pack truncated under it."""

from __future__ import annotations

import mmap
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_records, run_cli

import hframe_cli as h
from hframe_cli.read.reader import ReadStats


def expected(pack: Path) -> list[bytes]:
    with h.open_pack(pack) as p:  # pread: the reference
        return [p[i] for i in range(len(p))]


def every_read(p: h.PackReader | h.DatasetReader) -> dict[str, list[bytes]]:
    n = len(p)
    ids = [(i * 7) % n for i in range(n)] + [0, n - 1, 0]  # out of order, with repeats
    views = p.read_many_into(ids)
    return {
        "getitem": [p[i] for i in range(n)],
        "read_many": [bytes(b) for b in p.read_many(ids)],
        "read_many_w4": p.read_many(ids, workers=4),
        "read_many_into": [bytes(v) for v in views],
        "head": [p.head(i, 10) for i in range(n)],
    }


def reference(p: h.PackReader | h.DatasetReader, want: list[bytes]) -> dict[str, list[bytes]]:
    n = len(p)
    ids = [(i * 7) % n for i in range(n)] + [0, n - 1, 0]
    return {
        "getitem": want,
        "read_many": [want[i] for i in ids],
        "read_many_w4": [want[i] for i in ids],
        "read_many_into": [want[i] for i in ids],
        "head": [w[:10] for w in want],
    }


def test_mapped_reads_equal_pread_reads(packed):
    want = expected(packed)
    with h.open_pack(packed, memory_map=True) as p:
        assert p._map is not None  # really mapped (else this test checks pread twice)
        assert every_read(p) == reference(p, want)
        assert p["cats/000.png"] == want[p.frame_id("cats/000.png")]
        # merged runs (neighbours read together) cut from the map
        with h.open_pack(packed, memory_map=True, coalesce_gap=1 << 20) as q:
            assert q.read_many(list(range(len(q))), workers=1) == want


def test_mapped_reads_of_a_compressed_pack_and_of_a_dataset(tmp_path):
    src = make_records(tmp_path / "rec", n=40)
    comp = tmp_path / "c.hframe"
    assert run_cli(["pack", str(src), "-o", str(comp), "-q", "--compress", "zstd:3"]).exit_code == 0
    ds = tmp_path / "d.hframe"
    assert run_cli(["pack", str(src), "-o", str(ds), "-q", "--max-pack-bytes", "20KB"]).exit_code == 0
    for path in (comp, ds):
        want = expected(path)
        with h.open_pack(path, memory_map=True) as p:
            assert every_read(p) == reference(p, want)
    with h.open_pack(comp, memory_map=True) as p, h.open_pack(comp) as q:
        assert p.compressed and p.read_many_stored([0, 1, 2]) == q.read_many_stored([0, 1, 2])
    with h.open_pack(ds, memory_map=True) as d:
        shards = [d.shard(k) for k in range(len(d.shard_paths))]
        assert len(shards) > 1 and all(s._map is not None for s in shards)


def test_a_forked_child_reads_through_the_map_whatever_its_descriptors_name(packed, tmp_path):
    want = expected(packed)
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"\xee" * 1_000_000)
    with h.open_pack(packed, memory_map=True) as p:
        assert p[3] == want[3]
        fd = p._storage.fileno()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(decoy, os.O_RDONLY), fd)  # the inherited number now reads the decoy
            ok = [p[i] for i in range(len(want))] == want and p.read_many(list(range(len(want)))) == want
            p.close()  # the child's close unmaps the child's map only
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 1) == b"1"
        assert [p[i] for i in range(len(want))] == want  # the parent's map still reads


def test_close_unmaps_and_a_read_after_close_maps_again(packed):
    want = expected(packed)
    p = h.open_pack(packed, memory_map=True)
    first = p._map
    assert first is not None and p[5] == want[5]
    p.close()
    assert first.closed
    assert p[5] == want[5] and p.read_many([1, 2]) == want[1:3]  # reopened by path, mapped again
    assert p._map is not None and p._map is not first
    p.close()
    assert p.read_many([3, 1, 2]) == [want[3], want[1], want[2]] and p._map is not None  # read_many first
    p.close()


def test_memory_map_survives_pickling(packed):
    want = expected(packed)
    with h.open_pack(packed, memory_map=True) as p:
        q = pickle.loads(pickle.dumps(p))
        assert q.memory_map and q._map is not None
        assert q.read_many([4, 2]) == [want[4], want[2]]
        q.close()
    with h.open_pack(packed) as p:
        assert p._map is None  # not asked for: pread


TRUNCATE_AND_READ = textwrap.dedent(
    """
    import os, sys
    import hframe_cli as h
    path, mapped = sys.argv[1], sys.argv[2] == "1"
    p = h.open_pack(path, memory_map=mapped)
    last = len(p) - 1
    off, length = p.range_of(last)
    os.truncate(path, 4096 * (off // 4096) - 4096)  # in place: the last frame's pages are gone
    try:
        p[last]
    except h.HframeError as e:
        print(type(e).__name__)
        sys.exit(e.exit_code)
    """
)


def test_a_pack_truncated_in_place_under_a_map_kills_the_reader_with_sigbus(packed, tmp_path):
    """What the docs promise for ``memory_map=True`` (and why it is not the default): pread gives
    a clear error where a map gives SIGBUS."""
    rows = pq.read_table(f"{packed}.index.parquet", columns=["offset"]).num_rows
    assert rows > 1
    for mapped, check in (("0", "pread"), ("1", "map")):
        copy = tmp_path / f"t{mapped}.hframe"
        shutil.copy(packed, copy)
        shutil.copy(f"{packed}.index.parquet", f"{copy}.index.parquet")
        r = subprocess.run(
            [sys.executable, "-c", TRUNCATE_AND_READ, str(copy), mapped], capture_output=True, text=True, timeout=60
        )
        if check == "pread":
            assert r.returncode == h.FrameOutOfRange.exit_code and r.stdout.strip() == "FrameOutOfRange", r
        else:
            assert r.returncode == -signal.SIGBUS, r


@pytest.mark.parametrize("memory_map", [False, True])
def test_a_pack_that_fails_to_open_says_why_in_both_modes(packed, tmp_path, memory_map):
    """An index with a row fewer than its metadata says: IncompletePack from the constructor's
    own cleanup, not an AttributeError from close() (review finding)."""
    short = tmp_path / "short.hframe"
    shutil.copy(packed, short)
    t = pq.read_table(f"{packed}.index.parquet")
    pq.write_table(t.slice(0, t.num_rows - 1), f"{short}.index.parquet")
    with pytest.raises(h.IncompletePack, match=r"index has 29 rows, metadata says 30"):
        h.open_pack(short, memory_map=memory_map)
    r = run_cli(["get", str(short), "0"])
    assert r.exit_code == 1 and "index has 29 rows" in r.stderr and "internal error" not in r.stderr


def test_a_file_that_cannot_be_mapped_is_read_with_pread_and_not_mapped_again_per_read(packed, monkeypatch):
    want = expected(packed)
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise OSError(19, "No such device")  # ENODEV: a file system without mmap

    monkeypatch.setattr(mmap, "mmap", refuse)
    with h.open_pack(packed, memory_map=True) as p:
        assert p._map is None
        for _ in range(5):
            assert p.read_many(list(range(len(p)))) == want and [p[i] for i in range(len(p))] == want
        assert len(calls) == 1  # tried once, at open
        p.close()
        assert p[2] == want[2] and len(calls) == 2  # a reader reopened after close() tries again


def test_a_map_closed_under_a_timed_read_falls_back_to_pread(packed):
    """read_many(stats=...) (bench-warm's timed path) on a map closed by another thread: the
    bytes, not a raw ValueError (review finding)."""
    want = expected(packed)
    with h.open_pack(packed, memory_map=True) as p:
        assert p._map is not None
        p._map.close()  # as close() in another thread would, mid-read
        ids = list(range(len(p)))
        assert p.read_many(ids, stats=ReadStats()) == want
        assert p.read_many(ids) == want and [p[i] for i in ids] == want


@pytest.mark.parametrize("memory_map", [False, True])
def test_a_close_while_another_thread_arms_the_fast_path_does_not_leave_it_armed_on_another_file(
    packed, tmp_path, monkeypatch, memory_map
):
    """Thread A re-arms ``read`` after a close (the careful path's last step) and has taken the
    descriptor (to bind a pread to, or to map) when thread B closes the reader and opens another
    file, which takes the freed number. Arming and close() are serialised: B's close waits for
    A, then disarms. Unserialised (review finding), A armed on the other file and every later
    ``p[i]`` read it."""
    from hframe_cli.read import reader as reader_module
    from hframe_cli.storage.access import LocalFile

    want = expected(packed)
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"\xee" * 1_000_000)
    p = h.open_pack(packed, memory_map=memory_map)
    p.close()  # the next read arms again
    inside, b_done = threading.Event(), threading.Event()
    a_thread: list[int] = []
    held: list[int] = []

    def pause_in_a() -> None:
        if threading.get_ident() in a_thread:
            inside.set()
            b_done.wait(0.5)  # long enough for B, unless B has to wait for A

    if memory_map:
        real_map = reader_module._map_file

        def map_file(fd: int):
            pause_in_a()
            return real_map(fd)

        monkeypatch.setattr(reader_module, "_map_file", map_file)
    else:
        real_fileno = LocalFile.fileno

        def fileno(self):
            fd = real_fileno(self)
            if p._arm_lock.locked():  # arming takes the descriptor (not the careful read before it)
                pause_in_a()
            return fd

        monkeypatch.setattr(LocalFile, "fileno", fileno)

    def a() -> None:
        a_thread.append(threading.get_ident())
        assert p[5] == want[5]

    def b() -> None:
        inside.wait(5)
        p.close()
        held.append(os.open(decoy, os.O_RDONLY))  # takes the number the close freed
        b_done.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.undo()
    try:
        assert inside.is_set() and held
        assert [p[i] for i in range(len(want))] == want
        assert p.read_many(list(range(len(want)))) == want
    finally:
        p.close()
        for fd in held:
            os.close(fd)


def test_a_cold_batch_is_read_with_pread_even_when_mapped(packed, monkeypatch):
    """A page fault holds the GIL while the disk reads (threads would take turns) and reads
    around the page: a batch that looks cold goes through pread, and its first frame, read to
    tell, too; a warm one through the map."""
    from hframe_cli.read import reader as reader_module

    want = expected(packed)
    sliced = []
    real_slicer = reader_module._map_slicer

    def counting_slicer(m):
        read = real_slicer(m)

        def counted(length, offset):
            sliced.append(offset)
            return read(length, offset)

        return counted

    monkeypatch.setattr(reader_module, "_map_slicer", counting_slicer)
    ids = list(range(len(want)))
    with h.open_pack(packed, memory_map=True, coalesce_gap=0) as p:
        monkeypatch.setattr(reader_module, "_looks_cold", lambda seconds, nbytes: True)
        for workers in (1, 8):
            assert p.read_many(ids, workers=workers) == want
        assert sliced == []
        monkeypatch.setattr(reader_module, "_looks_cold", lambda seconds, nbytes: False)
        assert p.read_many(ids) == want
        assert len(sliced) == len(ids) - 1  # warm: all but the first frame (read to tell) from the map


@pytest.mark.parametrize("memory_map", [False, True])
def test_read_many_into_copies_a_warm_batch_out_of_the_map_and_reads_a_cold_one(packed, monkeypatch, memory_map):
    """Into a caller's buffer: on a mapped reader a warm batch costs one ``pread`` (its first
    frame, timed to tell) and the rest are copies out of the map; a cold one, or an unmapped
    reader, reads every frame."""
    from hframe_cli.read import reader as reader_module

    want = expected(packed)
    ids = [(i * 5) % len(want) for i in range(len(want))] + [0, 0]
    calls = []
    real_preadv = os.preadv

    def counted(fd, buffers, offset, *rest):
        calls.append(offset)
        return real_preadv(fd, buffers, offset, *rest)

    monkeypatch.setattr(os, "preadv", counted)
    buffer = bytearray()
    with h.open_pack(packed, memory_map=memory_map) as p:
        for cold in (False, True):
            monkeypatch.setattr(reader_module, "_looks_cold", lambda seconds, nbytes, cold=cold: cold)
            calls.clear()
            views = p.read_many_into(ids, buffer)
            buffer = views[0].obj  # reused: the second batch overwrites the first
            assert [bytes(v) for v in views] == [want[i] for i in ids]
            assert len(calls) == (1 if memory_map and not cold else len(ids))


def maps_of(path: Path) -> int:
    """How many maps of ``path`` this process has."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return sum(line.rstrip("\n").endswith(" " + real) for line in f)


def test_read_into_checks_its_views_and_takes_any_byte_format(packed):
    """``read_into`` with views laid out by the caller: as many views as frames (else an error,
    never a frame silently left out), of any one-byte format (``array('b')`` as well as bytes)."""
    from array import array

    want = expected(packed)
    ids = [2, 0, 1]
    for memory_map in (False, True):
        with h.open_pack(packed, memory_map=memory_map) as p:
            for views in ([memoryview(bytearray(len(want[i]))) for i in ids[:2]], [memoryview(bytearray(9))] * 4):
                with pytest.raises(h.InputError, match="3 frames asked for"):
                    p.read_into(ids, views)
            signed = [memoryview(array("b", bytes(len(want[i])))) for i in ids]
            p.read_into(ids, signed)
            assert [v.tobytes() for v in signed] == [want[i] for i in ids]


def test_a_close_while_read_many_into_copies_from_the_map_neither_fails_nor_misreads(packed):
    """``close()`` in one thread while another copies frames out of the map: the copy goes on
    from the map it holds (unmapped when it lets go), ``close()`` does not raise BufferError, and
    every batch has the right bytes; reads after close map again."""
    want = expected(packed)
    ids = [(i * 3) % len(want) for i in range(len(want))]
    with h.open_pack(packed, memory_map=True) as p:
        held = memoryview(p._map)  # a copy in flight, exactly: the map exported
        p.close()  # must not raise: the map is unmapped when the copy releases it
        assert p._map is None and bytes(held[:4]) == packed.read_bytes()[:4]  # still mapped for the copy
        assert maps_of(packed) == 1
        held.release()
        del held
        assert maps_of(packed) == 0  # unmapped as the copy let go: nothing else held it
        assert [bytes(v) for v in p.read_many_into(ids)] == [want[i] for i in ids] and p._map is not None
        errors: list[BaseException] = []
        wrong = 0
        stop = threading.Event()

        def closer() -> None:
            while not stop.is_set():
                p.close()

        t = threading.Thread(target=closer)
        t.start()
        try:
            for _ in range(300):
                try:
                    got = [bytes(v) for v in p.read_many_into(ids)]
                except Exception as e:  # noqa: BLE001 - any error is a failure of this test
                    errors.append(e)
                    break
                wrong += got != [want[i] for i in ids]
        finally:
            stop.set()
            t.join()
        assert errors == [] and wrong == 0


@pytest.mark.parametrize("method", ["read_many", "read_many_into"])
@pytest.mark.parametrize("memory_map", [False, True])
def test_a_close_and_an_open_in_other_threads_during_a_batch_do_not_change_its_bytes(
    packed, tmp_path, monkeypatch, method, memory_map
):
    """The race a reused descriptor number makes: while a batch reads, another thread closes
    the reader and a third opens a file, which takes the lowest free number (the pack's). The
    batch must still read the pack: the close waits for it, then the descriptor goes."""
    from hframe_cli.read import reader as reader_module

    monkeypatch.setattr(reader_module, "_looks_cold", lambda seconds, nbytes: False)
    want = expected(packed)
    other = tmp_path / "other.bin"
    other.write_bytes(b"\xee" * 1_000_000)
    ids = [5, 6, 7, 1, 2]
    opened: list[int] = []
    p = h.open_pack(packed, memory_map=memory_map)
    (real_name, real) = ("preadv", os.preadv) if method == "read_many_into" else ("pread", os.pread)

    def racing(fd, *args):
        if not opened:  # first read of the batch: thread B closes, thread C opens (exactly)
            closer = threading.Thread(target=p.close)
            closer.start()
            closer.join()
            opened.append(os.open(other, os.O_RDONLY))
        return real(fd, *args)

    try:
        monkeypatch.setattr(os, real_name, racing)
        if method == "read_many":
            got = [bytes(b) for b in p.read_many(ids, workers=1)]
        else:
            got = [bytes(v) for v in p.read_many_into(ids)]
        monkeypatch.undo()
        assert opened, "the race did not run"
        assert got == [want[i] for i in ids]
        if not memory_map:  # (a mapped reader closed mid-batch maps again for the rest: open again)
            assert fds_of(packed) == 0  # the close took effect once the batch was done
    finally:
        for fd in opened:
            os.close(fd)
        p.close()


def fds_of(path: Path) -> int:
    """How many of this process's descriptors name ``path``."""
    real = os.path.realpath(path)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.path.realpath(f"/proc/self/fd/{fd}") == real
        except OSError:
            pass
    return n


def test_a_read_between_a_deferred_close_and_its_batch_end_does_not_keep_the_descriptor(packed, tmp_path, monkeypatch):
    """A ``close()`` left to a batch in flight, then ``p[i]`` (which re-arms its one-``pread``
    fast path), then the batch ends and the descriptor goes, then a file is opened and takes its
    number: ``p[i]`` must still read the pack, not that file."""
    from hframe_cli.read import reader as reader_module

    monkeypatch.setattr(reader_module, "_looks_cold", lambda seconds, nbytes: False)
    want = expected(packed)
    other = tmp_path / "other.bin"
    other.write_bytes(b"\xee" * 1_000_000)
    p = h.open_pack(packed)
    real = os.pread
    started, go = threading.Event(), threading.Event()

    def paused(fd, n, off):
        if threading.current_thread().name == "batch" and not started.is_set():
            started.set()
            assert go.wait(10)
        return real(fd, n, off)

    monkeypatch.setattr(os, "pread", paused)
    got: dict[str, list[bytes]] = {}
    batch = threading.Thread(target=lambda: got.setdefault("b", p.read_many([5, 6, 7], workers=1)), name="batch")
    batch.start()
    assert started.wait(10)
    p.close()  # left to the batch
    assert p[0] == want[0]  # the careful path, which arms the fast path again: not on that descriptor
    go.set()
    batch.join()
    fd = os.open(other, os.O_RDONLY)  # the lowest free number: the pack's, now closed
    try:
        assert got["b"] == [want[5], want[6], want[7]]
        assert [p[i] for i in range(len(want))] == want
    finally:
        os.close(fd)
        p.close()


def test_a_close_that_shuts_the_pool_under_a_batch_lets_the_batch_finish(packed, monkeypatch):
    """``close()`` shuts the reader's thread pool down; a batch in another thread that had taken
    the pool reads its runs on its own thread instead of failing."""
    from hframe_cli.read import reader as reader_module

    monkeypatch.setattr(reader_module, "_looks_cold", lambda seconds, nbytes: True)  # runs go to the pool
    want = expected(packed)
    p = h.open_pack(packed, coalesce_gap=0)
    ids = list(range(0, len(want), 2))
    assert p.read_many(ids, workers=4) == [want[i] for i in ids]  # the pool exists
    took, closed = threading.Event(), threading.Event()
    real_get_pool = p._get_pool

    def get_pool(workers):
        pool = real_get_pool(workers)
        if threading.current_thread().name == "batch":
            took.set()
            assert closed.wait(10)  # another thread's close() shuts this pool down here
        return pool

    monkeypatch.setattr(p, "_get_pool", get_pool)
    result: dict[str, object] = {}

    def batch() -> None:
        try:
            result["got"] = p.read_many(ids, workers=4)
        except BaseException as e:  # noqa: BLE001 - the test reports it
            result["error"] = e

    t = threading.Thread(target=batch, name="batch")
    t.start()
    assert took.wait(10)
    p.close()
    closed.set()
    t.join()
    p.close()
    assert result == {"got": [want[i] for i in ids]}
