"""PackReader(memory_map=True): the same bytes as pread on every read path, across fork, close,
pickling and a dataset's shards; and what the docs say happens to a pack truncated under it."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
from conftest import run_cli
from test_compress import make_records

import hframe_cli as h


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
