"""PackReader: lookups, read_many ordering and coalescing, bounds checks, forks and pickling."""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import hframe_cli as h
from hframe_cli.read.reader import ReadStats, default_workers


def expected(pack):
    rows = pq.read_table(f"{pack}.index.parquet", columns=["offset", "length"]).to_pylist()
    data = open(pack, "rb").read()
    return [data[r["offset"] : r["offset"] + r["length"]] for r in rows]


def test_len_get_by_id_and_name(packed, photos):
    with h.open_pack(packed) as p:
        assert len(p) == 30
        assert p["cats/000.png"] == (photos / "cats/000.png").read_bytes()
        assert p[p.frame_id("dogs/001.jpg")] == (photos / "dogs/001.jpg").read_bytes()
        with pytest.raises(h.NotFound, match=r"frame 30 does not exist \(pack has 30 frames, ids 0..29\)"):
            p.read(30)
        with pytest.raises(h.NotFound, match="no frame named 'cats/nope.jpg'"):
            p.read("cats/nope.jpg")


@pytest.mark.parametrize("gap", [0, 1, 8192, 1 << 20])
@pytest.mark.parametrize("workers", [1, 4])
def test_read_many_returns_frames_in_asked_order(packed, gap, workers):
    want = expected(packed)
    rng = random.Random(gap + workers)
    ids = [rng.randrange(30) for _ in range(100)] + [5, 5, 6, 7, 29, 0]
    with h.open_pack(packed, coalesce_gap=gap, max_read=4096) as p:
        assert p.read_many(ids, workers=workers) == [want[i] for i in ids]
        assert p.read_many([]) == []


def test_coalescing_reduces_read_calls(packed):
    with h.open_pack(packed, coalesce_gap=1 << 20, max_read=1 << 30) as p:
        stats = ReadStats()
        assert p.read_many(list(range(30)), stats=stats) == expected(packed)
        assert stats.read_calls == 1  # every frame in one range
        assert stats.bytes_read >= stats.bytes_requested == sum(len(b) for b in expected(packed))
    with h.open_pack(packed, coalesce_gap=0) as p:
        stats = ReadStats()
        p.read_many(list(range(30)), workers=1, stats=stats)
        assert stats.read_calls == 30  # record headers sit between frames, so nothing is adjacent
        assert stats.bytes_read == stats.bytes_requested and len(stats.frame_latencies_s) == 30


def test_frames_bigger_than_max_read_are_split(tmp_path):
    src = tmp_path / "s"
    src.mkdir()
    blob = os.urandom(100_000)
    (src / "a").write_bytes(blob)
    out = tmp_path / "a.hframe"
    h.pack([src], out)
    with h.open_pack(out, max_read=4096) as p:
        assert p[0] == blob and p.read_many([0, 0]) == [blob, blob]


def test_max_read_splits_batches_and_a_local_p_i_reads_a_frame_whole(tmp_path, monkeypatch):
    """``read_many`` reads no range longer than ``max_read``; ``p[i]`` of a local pack is one
    ``pread`` of the whole frame, and a pack holding a frame longer than ``max_read`` still
    reads its small frames that way (it once took the checked path for every frame)."""
    from hframe_cli.read import reader as reader_module

    src = tmp_path / "s"
    src.mkdir()
    big, small = os.urandom(100_000), os.urandom(1000)
    (src / "a").write_bytes(big)
    (src / "b").write_bytes(small)
    out = tmp_path / "a.hframe"
    h.pack([src], out)
    asked: list[int] = []
    real_pread = os.pread

    def pread(fd, n, off):
        asked.append(n)
        return real_pread(fd, n, off)

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(reader_module, "_pread", pread)
    with h.open_pack(out, max_read=4096) as p:
        assert p.read_many([1, 0, 1, 0]) == [small, big, small, big]
        assert asked and max(asked) <= 4096
        asked.clear()
        assert [p[1], p[0], p[1]] == [small, big, small]
        assert asked[-3:] == [len(small), len(big), len(small)] and p._fast_fd >= 0


def test_the_bounds_check_of_a_large_index_agrees_with_a_small_ones():
    """``_all_in_range`` uses pyarrow.compute from 65,536 rows on and plain Python below: both
    say the same of the same entries, an offset + length past 2**63 included (an int64 sum
    that wraps around read as in range)."""
    from array import array

    import pyarrow as pa

    from hframe_cli.format.layout import HEADER_SIZE
    from hframe_cli.read.reader import _all_in_range

    rng = random.Random(3)
    lengths = [rng.randrange(0, 5000) for _ in range(70_000)]
    offsets, at = [], HEADER_SIZE
    for n in lengths:
        offsets.append(at)
        at += n
    huge = (2**63 - 100, 200)
    cases = [
        (at, offsets, lengths, True),
        (at - 1, offsets, lengths, False),  # the last frame ends past the data
        (at, offsets, [*lengths[:-1], -1], False),
        (at, [*offsets[:-1], huge[0]], [*lengths[:-1], huge[1]], False),
        (at, [HEADER_SIZE - 1, *offsets[1:]], lengths, False),
    ]
    for end, offs, lens, want in cases:
        table = pa.table({"offset": pa.array(offs, pa.int64()), "length": pa.array(lens, pa.int64())})
        o, n = array("q", offs), array("q", lens)
        assert _all_in_range(table, end, o, n) is want  # (pyarrow.compute)
        tail = table.slice(70_000 - 60_000)  # (Python): the last 60,000 rows hold every bad entry
        assert _all_in_range(tail, end, o[-60_000:], n[-60_000:]) is (want or end == at and offs[0] < HEADER_SIZE)
    assert _all_in_range(pa.table({"offset": pa.array([], pa.int64())}), 0, array("q"), array("q")) is True


@pytest.mark.parametrize("workers", [1, 4])
def test_empty_frames_without_a_coalescing_gap(tmp_path, workers):
    src = tmp_path / "s"
    src.mkdir()
    for name in ("a", "b", "c"):
        (src / name).write_bytes(b"")
    h.pack([src], tmp_path / "e.hframe", allow_empty=True)
    with h.open_pack(tmp_path / "e.hframe", coalesce_gap=0) as p:
        assert p.read_many([0, 1, 2, 1], workers=workers) == [b""] * 4 and p[2] == b""


def test_out_of_range_index_entry_is_reported_before_reading(packed):
    idx = f"{packed}.index.parquet"
    t = pq.read_table(idx)
    offsets = t.column("offset").to_pylist()
    offsets[7] = os.path.getsize(packed) - 10
    t = t.set_column(t.schema.get_field_index("offset"), "offset", __import__("pyarrow").array(offsets))
    pq.write_table(t, idx)
    with h.open_pack(packed) as p:
        assert p[6]
        with pytest.raises(h.FrameOutOfRange, match=r"frame 7 \(offset \d+, length \d+\): index out of range"):
            p.read(7)
        with pytest.raises(h.FrameOutOfRange, match="frame 7"):
            p.read_many([1, 7])


def in_fork(check: Callable[[], bool]) -> bool:
    """Whether ``check()`` holds in a forked child. The child never returns into pytest: an
    exception ends it with status 1, and a hang with SIGALRM after 10 s."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(10)
            code = 0 if check() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def test_reader_is_safe_across_fork(packed):
    want = expected(packed)
    with h.open_pack(packed) as p:
        assert p[0] == want[0]  # parent opened its descriptor
        # child: must reopen, not share the parent's descriptor
        assert in_fork(lambda: p.read_many(list(range(30)), workers=4) == want and p._storage._pid == os.getpid())
        assert p[29] == want[29]


def test_getitem_in_a_fork_does_not_trust_the_inherited_descriptor_number(packed, tmp_path):
    """``p[i]`` is one pread on the descriptor it armed; a forked child whose inherited number
    now names another file must still read the pack (it takes the careful path, which reattaches)."""
    want = expected(packed)
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"\xee" * 1_000_000)
    with h.open_pack(packed) as p:
        assert p[3] == want[3]  # armed in the parent
        fd = p._storage.fileno()

        def child() -> bool:
            os.dup2(os.open(decoy, os.O_RDONLY), fd)  # the inherited number now reads the decoy
            return [p[i] for i in range(30)] == want and p[3] == want[3]

        assert in_fork(child)


def test_a_reader_armed_again_in_a_forked_child_is_disarmed_in_the_grandchild(packed, tmp_path):
    """A worker that forks again (a DataLoader worker's own pool): the reader the child armed
    again on its own descriptor is disarmed in the grandchild too, whose inherited number may
    name another file. (Without the at-fork hook the child reads on its parent's number, and
    so does the grandchild, which finds the decoy there.)"""
    want = expected(packed)
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"\xee" * 1_000_000)
    with h.open_pack(packed) as p:
        assert p[3] == want[3]

        def child() -> bool:
            ok = p[4] == want[4]  # (the careful path, which arms it again on the child's own number)
            armed = p._fast_fd

            def grandchild() -> bool:
                os.dup2(os.open(decoy, os.O_RDONLY), armed)
                return [p[i] for i in range(30)] == want

            return ok and in_fork(grandchild)

        assert in_fork(child)


def test_a_child_forked_while_another_thread_holds_the_arming_lock_can_close_and_read(packed):
    """A fork while another of the parent's threads holds a reader's arming lock (arming after a
    close, or closing): the child has no such thread, and must not wait for it forever."""
    want = expected(packed)
    with h.open_pack(packed) as p:
        assert p[0] == want[0]
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with p._arm_lock:
                held.set()
                release.wait(10)

        def child() -> bool:
            p.close()  # (a lock never released: killed by the alarm, not hung)
            return [p[i] for i in range(30)] == want

        t = threading.Thread(target=hold)
        t.start()
        try:
            assert held.wait(5)
            assert in_fork(child)
        finally:
            release.set()
            t.join()


def test_getitem_after_close_does_not_read_a_reused_descriptor_number(packed, tmp_path):
    want = expected(packed)
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"\xee" * 1_000_000)
    p = h.open_pack(packed)
    assert p[5] == want[5]
    fd = p._storage.fileno()
    p.close()
    other = os.open(decoy, os.O_RDONLY)
    try:
        if other != fd:
            os.dup2(other, fd)
        assert p[5] == want[5]  # reopened by path, not read through the old number
        assert [p[i] for i in range(30)] == want
    finally:
        p.close()
        os.close(other)
        if other != fd:
            os.close(fd)


def test_reader_pickles_by_path(packed):
    with h.open_pack(packed, workers=3) as p:
        q = pickle.loads(pickle.dumps(p))
        assert q.workers == 3 and q.read_many([1, 2]) == p.read_many([1, 2])
        q.close()


def test_default_workers_follow_the_rule_of_thumb():
    assert [default_workers(n) for n in (1, 4, 8, 64, 256, 10_000)] == [1, 1, 2, 16, 16, 16]


def test_opening_missing_or_wrong_files(tmp_path, packed):
    with pytest.raises(h.InputError, match="no such file"):
        h.open_pack(tmp_path / "nope.hframe")
    jpg = tmp_path / "x.jpg"
    jpg.write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 300)
    with pytest.raises(h.NotAPack, match="x.jpg: not a frame pack"):
        h.open_pack(jpg)
    os.unlink(f"{packed}.index.parquet")
    with pytest.raises(h.InputError, match=r"index not found \(rebuild it with 'hframe index PACK --rebuild'\)"):
        h.open_pack(packed)


def test_importing_the_reader_loads_no_cli_or_torch():
    code = (
        "import sys, hframe_cli.read.reader, hframe_cli\n"
        "bad = [m for m in ('typer', 'rich', 'tqdm', 'torch', 'av') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_md5_of_read_many_matches_index(packed):
    with h.open_pack(packed) as p:
        md5 = p.table.column("md5").to_pylist()
        assert [hashlib.md5(b).hexdigest() for b in p.read_many(range(30))] == md5


def test_a_bool_is_no_frame_id_in_read_nor_in_read_many(packed):
    """True would index as frame 1: both calls refuse it (a mask passed where ids were meant)."""
    with h.open_pack(packed) as p:
        for call in (lambda: p.read(True), lambda: p.read_many([True]), lambda: p.read_many([3, False])):
            with pytest.raises(h.InputError, match="not bool"):
                call()
        assert p.read_many([1, 0]) == [p.read(1), p.read(0)]


def _evict(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_read_many_into_fills_one_reused_buffer_with_what_read_many_gives(packed):
    with h.open_pack(packed) as p:
        names = p.table.column("name").to_pylist()
        keys = [7, 0, names[3], 7, 29, 12]
        want = p.read_many(keys)
        assert p.frame_sizes(keys) == [len(w) for w in want]
        buf = bytearray(sum(map(len, want)) + 100)
        for cold in (False, True):
            if cold:
                _evict(packed)
            got = p.read_many_into(keys, buf)
            assert [bytes(v) for v in got] == want
            assert all(v.obj is buf for v in got)  # in the buffer given, back to back
            assert b"".join(want) == bytes(buf[: sum(map(len, want))])
        again = p.read_many_into([1, 2], buf)  # the same buffer again: the old views show the new bytes
        assert bytes(again[0]) == p[1] and bytes(got[0][: len(p[1])]) == p[1]
        small = bytearray(10)
        fresh = p.read_many_into(keys, small)
        assert [bytes(v) for v in fresh] == want and fresh[0].obj is not small and small == bytearray(10)
        assert [bytes(v) for v in p.read_many_into(keys)] == want
        assert p.read_many_into([]) == []
        with pytest.raises(h.InputError, match="read-only"):
            p.read_many_into(keys, memoryview(bytes(len(buf))))
        with pytest.raises(h.NotFound):
            p.read_many_into([len(p)], buf)


def test_read_many_into_a_compressed_pack_and_a_dataset(tmp_path, photos, cli):
    from conftest import make_records

    rec = make_records(tmp_path / "rec")
    for out, extra in (
        (tmp_path / "c.hframe", ["--compress", "zstd"]),
        (tmp_path / "ds.hframe", ["--max-pack-bytes", "15kB"]),
    ):
        src = rec if "--compress" in extra else photos
        assert cli(["pack", str(src), "-o", str(out), "-q", *extra]).exit_code == 0
        with h.open_pack(out) as p:
            keys = list(range(len(p)))[::-1] + [0]
            want = p.read_many(keys)
            assert p.frame_sizes(keys) == [len(w) for w in want]
            buf = bytearray(sum(map(len, want)))
            got = p.read_many_into(keys, buf)
            assert [bytes(v) for v in got] == want and all(v.obj is buf for v in got)
            assert bytes(buf) == b"".join(want)  # back to back in the order asked, whatever the shard
        for bad in (-1, len(p)):
            with pytest.raises(h.NotFound):
                p.frame_sizes([0, bad])


def test_read_many_into_a_pack_cut_short_since_it_was_opened_fails_like_read_many(packed, tmp_path):
    copy = tmp_path / "cut.hframe"
    copy.write_bytes(packed.read_bytes())
    (tmp_path / "cut.hframe.index.parquet").write_bytes(Path(f"{packed}.index.parquet").read_bytes())
    with h.open_pack(copy) as p:
        last = len(p) - 1
        start, _ = p.range_of(last)
        os.truncate(copy, start + 3)  # the last frame's bytes are gone
        with pytest.raises(h.HframeError) as many:
            p.read_many([0, last])
        with pytest.raises(h.HframeError) as into:
            p.read_many_into([0, last], bytearray(1 << 20))
        assert type(into.value) is type(many.value) and str(into.value) == str(many.value)


class _IndexLike:
    """An integer that is not an int (numpy.int64, a torch scalar): only ``__index__``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_integer_like_ids_are_global_ids_in_a_dataset(photos, tmp_path):
    """A dataset took a numpy-style id for each shard's own id in turn, and returned shard 0's
    frame with that number (review finding: 61 of 62 frames wrong)."""
    out = tmp_path / "ds.hframe"
    h.pack([photos], out, max_pack_bytes=20_000)
    with h.open_pack(out) as d:
        assert len(d.shard_paths) > 2
        want = [d[i] for i in range(len(d))]
        assert [d[_IndexLike(i)] for i in range(len(d))] == want
        assert d.read_many([_IndexLike(i) for i in reversed(range(len(d)))]) == want[::-1]
        assert d.frame_id(_IndexLike(len(d) - 1)) == len(d) - 1
        with pytest.raises(h.NotFound, match="does not exist"):
            d.read(_IndexLike(len(d)))
        with pytest.raises(h.InputError, match="not bool"):
            d.read(True)


def test_a_dataset_reads_index_columns_as_a_pack_does(photos, tmp_path):
    """``read_index_columns`` of a dataset: every shard's rows in turn, global frame ids, the
    md5 of each frame as read (a PackReader's method, which a DatasetReader lacked)."""
    out = tmp_path / "ds.hframe"
    h.pack([photos], out, max_pack_bytes=20_000)
    with h.open_pack(out) as d:
        assert len(d.shard_paths) > 2
        t = d.read_index_columns(["frame_id", "name", "md5"])
        assert t.column_names == ["frame_id", "name", "md5"] and t.num_rows == len(d)
        assert t.column("frame_id").to_pylist() == list(range(len(d)))
        assert t.column("md5").to_pylist() == [hashlib.md5(d[i]).hexdigest() for i in range(len(d))]
        assert t.equals(d.table.select(["frame_id", "name", "md5"]))
        assert d.read_index_columns().equals(d.table)


def test_prefetch_on_a_descriptor_closed_meanwhile_is_only_advice(packed):
    """A reader closed by another thread mid-batch: the kernel hint fails (EBADF), quietly; the
    reads then say what is wrong (review finding: a raw OSError escaped)."""
    from hframe_cli.storage.access import LocalFile

    f = LocalFile(str(packed))
    fd = f.fileno()
    os.close(fd)  # behind its back, as a close() in another thread
    try:
        f.prefetch([4096, 8192], [100, 100])  # no error: advice only
        with pytest.raises(h.StorageError, match=str(packed)):  # the read says what is wrong, with the path
            f.read_at(4096, 100)
    finally:
        f._fd = -1  # (already closed)
