"""The Parquet index: independent readers, metadata, rebuild from the pack alone, odd names."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hframe_cli as h
from hframe_cli.format.index import COLUMNS, SCHEMA

META_KEYS = {
    "format_version",
    "index_schema_version",
    "pack_uuid",
    "pack_time",
    "frame_count",
    "pack_bytes",
    "payload_bytes",
    "alignment",
    "hframe_version",
}


def test_duckdb_reads_the_index_as_is(packed):
    idx = f"{packed}.index.parquet"
    con = duckdb.connect()
    rows = con.execute(f"select name, \"offset\", length, md5 from '{idx}' order by frame_id limit 3").fetchall()
    with open(packed, "rb") as f:
        for name, off, length, md5 in rows:
            f.seek(off)
            assert hashlib.md5(f.read(length)).hexdigest() == md5, name
    assert len(rows) == 3
    assert con.execute(f"select count(*), count(distinct label) from '{idx}'").fetchall() == [(30, 3)]


def test_schema_and_metadata_are_complete(packed):
    pf = pq.ParquetFile(f"{packed}.index.parquet")
    assert pf.schema_arrow.names == list(COLUMNS)
    assert pf.schema_arrow.remove_metadata().equals(SCHEMA)
    md = {k.decode(): v.decode() for k, v in pf.schema_arrow.metadata.items() if k.startswith(b"hframe.")}
    assert {k.removeprefix("hframe.") for k in md} == META_KEYS
    assert md["hframe.frame_count"] == "30"
    assert md["hframe.pack_bytes"] == str(os.path.getsize(packed))
    assert md["hframe.format_version"] == "1.1"  # image width/height/mode live in record extras
    assert md["hframe.index_schema_version"] == "1.1"
    assert pf.metadata.row_group(0).column(0).compression == "ZSTD"


def test_packs_without_format_1_1_features_are_written_as_1_0(tmp_path, cli):
    src = tmp_path / "blobs"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 50)
    out = tmp_path / "b.hframe"
    assert cli(["pack", str(src), "-o", str(out), "-q"]).exit_code == 0
    assert out.read_bytes()[8:12] == b"\x01\x00\x00\x00"  # major 1, minor 0
    md = pq.ParquetFile(f"{out}.index.parquet").schema_arrow.metadata
    assert md[b"hframe.format_version"] == b"1.0"


def test_rebuild_gives_the_same_rows(packed, cli):
    idx = Path(f"{packed}.index.parquet")
    original = pq.read_table(idx)
    idx.unlink()
    r = cli(["index", str(packed), "--rebuild"])
    assert r.exit_code == 0, r.stderr
    rebuilt = pq.read_table(idx)
    assert rebuilt.equals(original, check_metadata=True)


ODD = [
    b"sp ace.bin",
    "ünï/cödé.bin".encode(),
    b"new\nline.bin",
    b"tab\there.bin",
    b"bad\xff\xfename.bin",
    b"dir\xe9/x.bin",
]


def odd_tree(root: Path) -> dict[bytes, bytes]:
    contents = {}
    for i, n in enumerate(ODD):
        p = os.path.join(os.fsencode(root), n)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        contents[n] = bytes([i]) * (i + 1)
        with open(p, "wb") as f:
            f.write(contents[n])
    return contents


def test_odd_names_round_trip_exactly(tmp_path, cli):
    contents = odd_tree(tmp_path / "odd")
    out = tmp_path / "odd.hframe"
    h.pack([tmp_path / "odd"], out)
    t = pq.read_table(f"{out}.index.parquet").to_pydict()
    raw = [r if r is not None else n.encode() for n, r in zip(t["name"], t["name_raw"])]
    assert sorted(raw) == raw
    assert set(raw) == set(ODD)
    assert t["name"][raw.index(b"bad\xff\xfename.bin")] == "bad\\xff\\xfename.bin"
    assert t["label"][raw.index(b"dir\xe9/x.bin")] == "dir\\xe9"
    with h.open_pack(out) as p:
        for name, data in contents.items():
            assert p[name] == data
        assert p[b"bad\xff\xfename.bin"] == bytes([4]) * 5
        assert p[os.fsdecode(b"bad\xff\xfename.bin")] == bytes([4]) * 5  # str from argv (surrogateescape)
        assert p["ünï/cödé.bin"] == bytes([1]) * 2
    # and the CLI finds them too; rebuilt index is identical
    r = cli(["get", str(out), os.fsdecode(b"bad\xff\xfename.bin")])
    assert r.exit_code == 0 and r.stdout_bytes == bytes([4]) * 5
    original = pq.read_table(f"{out}.index.parquet")
    h.rebuild_index(out, f"{out}.index.parquet")
    assert pq.read_table(f"{out}.index.parquet").equals(original)


def test_index_of_another_pack_is_refused(photos, tmp_path):
    a, b = tmp_path / "a.hframe", tmp_path / "b.hframe"
    h.pack([photos], a)
    h.pack([photos], b)
    os.replace(f"{b}.index.parquet", f"{a}.index.parquet")
    with pytest.raises(h.IndexMismatch, match=r"index does not belong to this pack \(pack UUID"):
        h.open_pack(a)


def test_newer_index_schema_is_refused(packed):
    idx = f"{packed}.index.parquet"
    t = pq.read_table(idx)
    md = dict(t.schema.metadata)
    md[b"hframe.index_schema_version"] = b"2.0"
    pq.write_table(t.replace_schema_metadata(md), idx)
    with pytest.raises(h.UnsupportedVersion, match=r"index schema version 2\.0 is not supported"):
        h.open_pack(packed)


def test_plain_parquet_is_not_an_index(packed):
    pq.write_table(pa.table({"a": [1]}), f"{packed}.index.parquet")
    with pytest.raises(h.FormatError, match="not an hframe index"):
        h.open_pack(packed)


@pytest.mark.parametrize("seed", range(6))
def test_built_columns_read_back_as_the_rows_that_went_in(tmp_path, seed):
    """The index columns are built from typed arrays with their null bitmaps by hand (no
    pyarrow.compute): whatever mix of rows goes in, an independent read of the written file
    (DuckDB) gives every value and every null back. Seeds 0-1 are all blobs (each code column
    one value throughout), the others mix images, video frames, labels and splits."""
    import random
    from datetime import datetime, timezone

    from hframe_cli.format.index import IndexBuilder, IndexMeta, write_index
    from hframe_cli.format.layout import CODEC_NAMES, KIND_IDS, KIND_NAMES, MEDIA_TYPES

    rng = random.Random(seed)
    n = 1 if seed == 0 else rng.randrange(200, 3000)
    b, want = IndexBuilder(), []
    for i in range(n):
        folder = rng.choice([b"", b"cats/", b"dogs/sub/", b"caf\xe9/", b"\xce\xbb/"])
        name = folder + (b"f%d\xff.bin" % i if rng.random() < 0.05 else b"f%d.jpg" % i)
        md5 = rng.randbytes(16)
        row = {"name": name.decode("utf-8", "backslashreplace"), "md5": md5.hex()}
        row["name_raw"] = None if row["name"].encode() == name else name
        parent = name.rsplit(b"/", 2)[-2] if b"/" in name else None
        row["label"] = None if parent is None else parent.decode("utf-8", "backslashreplace")
        media, kind, codec, meta = "unknown", KIND_IDS["blob"], 0, None
        if seed >= 2:
            media, codec = rng.choice(MEDIA_TYPES), rng.choice(sorted(CODEC_NAMES))
            kind = rng.choice(sorted(KIND_NAMES))
            pick = rng.random()
            if pick < 0.4:
                meta = {
                    "width": rng.randrange(1, 5000),
                    "height": rng.randrange(1, 5000),
                    "mode": rng.choice("L RGB P".split()),
                }
            elif pick < 0.7:
                meta = {
                    "source": rng.choice(["a.mp4", "b.mkv"]),
                    "frame_index": rng.randrange(0, 9),
                    "keyframe": rng.random() < 0.5,
                }
                if rng.random() < 0.8:
                    meta["pts_s"] = rng.randrange(0, 900) / 30
                if rng.random() < 0.5:
                    meta["split"] = rng.choice(["train", "val"])
                if rng.random() < 0.5:
                    meta["label"] = rng.choice([None, "x", "y"])
                    row["label"] = meta["label"]
        offset, length = 64 + i * 100, rng.randrange(0, 90)
        b.append(
            name=name, offset=offset, length=length, md5=md5, media_type=media, kind=kind, codec=codec,
            raw_length=length + codec, source_size=length * 2, mtime_ns=1_700_000_000_123_456_789 + i,
            record_offset=offset - 10, meta=meta,
        )  # fmt: skip
        meta = meta or {}
        row.update(
            frame_id=i, offset=offset, length=length, media_type=media, kind=KIND_NAMES[kind],
            codec=CODEC_NAMES[codec], raw_length=length + codec, source_size=length * 2,
            source_mtime=datetime.fromtimestamp((1_700_000_000_123_456_789 + i) // 1000 / 1e6, timezone.utc),
            record_offset=offset - 10,
            **{k: meta.get(k) for k in ("width", "height", "mode", "source", "frame_index", "pts_s", "keyframe", "split")},
        )  # fmt: skip
        want.append(row)
    path = tmp_path / "i.parquet"
    write_index(b.to_table(IndexMeta("1.1", "1.1", "0" * 32, "t", n, 1, 1, 1, "x")), path)
    cur = duckdb.connect().execute(f"SELECT * FROM read_parquet('{path}') ORDER BY frame_id")
    got = [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]
    assert len(got) == n
    for g, w in zip(got, want):
        g["source_mtime"] = g["source_mtime"].astimezone(timezone.utc)
        assert {k: g[k] for k in w} == w


def test_packing_does_not_import_pyarrow_compute_or_numpy(tmp_path):
    """Importing pyarrow.compute costs ~40 ms, a fifth of packing a few files: the index is
    built without it. numpy, which pyarrow imports as it starts, costs 70-110 ms more: the
    command's pyarrow goes without."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(5):
        (src / "a" / f"{i}.bin").write_bytes(os.urandom(40))
    # the command: pyarrow would import pandas (and pyarrow.compute) at its first array of Python
    # values, were pandas installed (a test extra installs it)
    run = [sys.executable, "-X", "importtime", "-m", "hframe_cli", "pack", str(src), "-o", str(tmp_path / "p.hframe")]
    err = subprocess.run(run, capture_output=True, text=True, check=True).stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert "pyarrow" in imported and "pyarrow.compute" not in imported
    assert not any(m.startswith("pandas.") for m in imported)  # (its import is tried, and fails at once)
    # nor numpy: pyarrow's extension module would import it (and its BLAS) as it starts
    assert not any(m.startswith("numpy.") for m in imported)
    assert pq.read_table(tmp_path / "p.hframe.index.parquet").column("label").to_pylist() == ["a"] * 5


def test_a_dataset_without_filters_does_not_import_pyarrow_compute(tmp_path):
    """A training job's first batch waits for ``FrameDataset``: importing pyarrow.compute there
    took 40-100 ms of it (more than the open's round trip). Only a filter computes a column."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(5):
        (src / "a" / f"{i}.bin").write_bytes(os.urandom(40))
    h.pack([src], tmp_path / "p.hframe")
    probe = (
        "import sys\n"
        "from hframe_cli.training.dataset import FrameDataset\n"
        "ds = FrameDataset(sys.argv[1], match=sys.argv[2] or None)\n"
        "assert len(ds) == 5 and ds[4][1] == 0\n"
        "print('pyarrow.compute' in sys.modules)\n"
    )
    for match, computed in (("", "False"), ("a/*", "True")):
        out = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / "p.hframe"), match], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == computed
