"""The source list (``sources.SourceList``): kept as columns while listed, sorted and compared,
objects only when a pack asks for them; the two views always agree, and a no-op ``--update``
never builds the objects."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

import hframe_cli.sources.sourcelist as sources_mod
from hframe_cli.sources.inputs import collect_sources
from hframe_cli.sources.sourcelist import Rejected, Source, SourceList
from hframe_cli.write.run import pack_sources
from hframe_cli.write.update import plan_update


def listed(n: int) -> list[Source]:
    return [Source(f"/in/{i:03d}.jpg", b"%03d.jpg" % i, 100 + i, 1_700_000_000_123_456_789 + i) for i in range(n)]


def test_columns_and_objects_are_two_views_of_one_list():
    want = listed(5)
    cols = SourceList.from_columns(
        [s.path for s in want], [s.name for s in want], [s.size for s in want], [s.mtime_ns for s in want]
    )
    objs = SourceList(want)
    assert len(cols) == len(objs) == 5 and cols.total_bytes == objs.total_bytes == sum(s.size for s in want)
    assert cols == objs  # the same sources, whichever view each one holds
    assert cols.names == objs.names and cols.mtimes_ns == objs.mtimes_ns and cols.paths == objs.paths
    assert cols.sources == want  # built on demand...
    cols.sources.append(Source("/in/new.jpg", b"new.jpg", 7, 8))  # ...and changed in place
    cols.add("/in/zzz.jpg", b"zzz.jpg", 9, 10)  # an add after the objects were built keeps both
    assert cols.names[-2:] == [b"new.jpg", b"zzz.jpg"] and len(cols) == 7
    paths, names, sizes, mtimes = cols.columns()  # columns again, in step
    assert (paths[-1], names[-1], sizes[-1], mtimes[-1]) == ("/in/zzz.jpg", b"zzz.jpg", 9, 10)
    assert [s.size for s in cols.sources] == [s.size for s in want] + [7, 9]


def test_extend_pickle_and_bad_columns():
    a = SourceList.from_columns(["/a"], [b"a"], [1], [2], [Rejected("/x", "broken symlink")])
    b = SourceList(listed(2), [Rejected("/y", "symlink loop")])
    a.extend(b)
    assert a.names == [b"a", b"000.jpg", b"001.jpg"] and [r.path for r in a.rejected] == ["/x", "/y"]
    assert all(pickle.loads(pickle.dumps(a, protocol)) == a for protocol in range(pickle.HIGHEST_PROTOCOL + 1))
    given = listed(3)
    assert SourceList(given).sources is given  # a list given is kept, as the dataclass kept it
    assert a != SourceList(a.sources[:2], a.rejected)
    with pytest.raises(ValueError, match="differ in length"):
        SourceList.from_columns(["/a"], [b"a"], [1, 2], [3])


def test_a_name_found_twice_keeps_the_first_in_every_column(tmp_path):
    """Sorted by name, stable: of files that share a name the first argument's is kept and each
    other one rejected naming it; every column stays aligned with the names."""
    for d, files in (("a", ["x.jpg", "a.jpg"]), ("b", ["x.jpg", "m.jpg"]), ("c", ["x.jpg", "b.jpg", "m.jpg"])):
        (tmp_path / d).mkdir()
        for f in files:
            (tmp_path / d / f).write_bytes(f"{d}/{f}".encode())
    found = collect_sources([str(tmp_path / d) for d in "acb"], skip_bad=True)
    assert found.names == [b"a.jpg", b"b.jpg", b"m.jpg", b"x.jpg"]
    for s in found.sources:  # each name with the path it came from
        assert open(s.path, "rb").read().endswith(s.name) and s.size == os.path.getsize(s.path)
    assert [os.path.basename(os.path.dirname(s.path)) for s in found.sources] == ["a", "c", "c", "a"]
    assert [(r.path, r.reason.split(" (")[0]) for r in found.rejected] == [
        (str(tmp_path / "b" / "m.jpg"), "name 'm.jpg' appears twice"),
        (str(tmp_path / "c" / "x.jpg"), "name 'x.jpg' appears twice"),
        (str(tmp_path / "b" / "x.jpg"), "name 'x.jpg' appears twice"),
    ]
    assert all(f"(also {tmp_path / ('c' if 'm.jpg' in r.path else 'a')}" in r.reason for r in found.rejected)


def test_a_no_op_update_compares_columns_without_building_sources(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(30):
        (src / f"{i:02d}.bin").write_bytes(os.urandom(10 + i))
    out = str(tmp_path / "p.hframe")
    pack_sources(collect_sources([str(src)]), out)

    def refused(*args: object) -> Source:
        raise AssertionError("a Source object was built")

    monkeypatch.setattr(sources_mod, "Source", refused)
    assert plan_update(collect_sources([str(src)]), out).status == "up_to_date"
    os.utime(src / "07.bin", ns=(1, 1))  # one file changed: the plan names it (objects are fine then)
    monkeypatch.undo()
    plan = plan_update(collect_sources([str(src)]), out)
    assert plan.status == "repack" and plan.changed == [b"07.bin"]


def test_a_no_op_update_command_does_not_import_the_packer(tmp_path):
    """Cron's usual run finds nothing to do: its start-up is most of its time, so the command
    leaves the packer (packing, its workers, the writer) unimported, and imports it when a file
    changed."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.bin").write_bytes(os.urandom(50))
    out = str(tmp_path / "p.hframe")
    pack_sources(collect_sources([str(src)]), out)
    code = (
        "import sys\n"
        "from hframe_cli.cli.app import main\n"
        "try:\n"
        "    main(['pack', sys.argv[1], '-o', sys.argv[2], '--update', '--quiet'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print(','.join(m for m in ('hframe_cli.write.run', 'hframe_cli.write.parallel', 'hframe_cli.write.writer') if m in sys.modules))"
    )
    run = [sys.executable, "-c", code, str(src), out]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip() == ""
    (src / "5.bin").write_bytes(b"new")
    imported = subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip()
    assert imported == "hframe_cli.write.run,hframe_cli.write.parallel,hframe_cli.write.writer"
    assert plan_update(collect_sources([str(src)]), out).status == "up_to_date"


def test_sources_come_out_in_byte_order_reordered_only_when_the_walk_did_not(tmp_path, monkeypatch):
    """The walk visits subfolders in name order, so a tree whose folders hold files or folders
    (not both) lists sorted and is not reordered; files beside folders, and a folder ``a-b``
    beside ``a`` ('-' sorts before '/'), are put in byte order of the name."""
    import hframe_cli.sources.inputs as inputs

    reorders: list[int] = []
    real = inputs._reorder
    monkeypatch.setattr(inputs, "_reorder", lambda columns, positions: reorders.append(1) or real(columns, positions))
    clean = tmp_path / "clean"
    for folder in ("n/10", "n/2", "m", "z/y/x"):
        for f in ("b.bin", "a.bin", "c.bin"):
            (clean / folder).mkdir(parents=True, exist_ok=True)
            (clean / folder / f).write_bytes(f.encode())
    names = collect_sources([str(clean)], base=str(clean)).names
    assert names == sorted(names) and len(names) == 12 and not reorders
    mixed = tmp_path / "mixed"
    for rel in ("a.bin", "a/x.bin", "a-b/y.bin", "b/z.bin", "c.bin", "a/0/q.bin", "a/1.bin"):
        (mixed / rel).parent.mkdir(parents=True, exist_ok=True)
        (mixed / rel).write_bytes(b"x")
    names = collect_sources([str(mixed)], base=str(mixed)).names
    assert names == [b"a-b/y.bin", b"a.bin", b"a/0/q.bin", b"a/1.bin", b"a/x.bin", b"b/z.bin", b"c.bin"]
    assert reorders


def test_a_saved_source_list_is_written_in_slices_and_reads_back_whole(tmp_path, monkeypatch):
    """The saved list (resume's record of the run's sources) is written a slice at a time, one
    row group each, so a list of millions is never all in Arrow at once; it reads back the same,
    paths that are not UTF-8 and rejections included, and so does an empty list."""
    import pyarrow.parquet as pq

    import hframe_cli.write.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "_LIST_SLICE", 3)
    paths = [os.fsdecode(b"/in/caf\xe9-%d.jpg" % i) if i % 4 == 0 else f"/in/{i:02d}.jpg" for i in range(10)]
    names = [os.fsencode(p)[4:] for p in paths]
    sl = SourceList.from_columns(paths, names, list(range(100, 110)), [-(2**40) + i for i in range(10)])
    sl.rejected.append(Rejected("/in/bad", "zero-byte file"))
    out = tmp_path / "list.parquet"
    checkpoint.write_source_list(out, sl)
    assert pq.ParquetFile(out).metadata.num_row_groups == 4
    back = checkpoint.read_source_list(out)
    assert back.columns() == sl.columns() and back.rejected == sl.rejected
    assert os.fsencode(back.paths[0]) == b"/in/caf\xe9-0.jpg"
    checkpoint.write_source_list(out, SourceList())
    assert len(checkpoint.read_source_list(out)) == 0
