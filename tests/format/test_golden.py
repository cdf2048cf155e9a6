"""Packs written by earlier releases stay readable (tests/data/v1, never regenerated)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import hframe_cli as h

V1 = Path(__file__).resolve().parents[1] / "data" / "v1" / "golden.hframe"


def test_v1_pack_file_is_unchanged():
    assert hashlib.md5(V1.read_bytes()).hexdigest() == "2ce3a832ddec6cb3b472c4c86696b628"


def test_v1_frames_read_back_exactly():
    with h.open_pack(V1) as p:
        assert len(p) == 4
        assert p["blob.bin"] == bytes(range(256)) * 3
        assert p[b"caf\xe9.bin"] == b"latin-1 name"
        jpg, png = p.read_many(["imgs/red.jpg", "imgs/red.png"])
        assert jpg.startswith(b"\xff\xd8\xff") and hashlib.md5(jpg).hexdigest() == "14ce370d60eb671b52fd20bbcdec8126"
        assert png.startswith(b"\x89PNG") and hashlib.md5(png).hexdigest() == "79755cbf586b496d7da731a0bf4c326d"
        assert p.info.header.alignment == 64 and p.info.pack_time == "2023-11-14T22:13:20.000000Z"
        assert p.meta.format_version == "1.0" and p.meta.index_schema_version == "1.0"
        assert h.self_check(V1, f"{V1}.index.parquet", 20) == 4


def test_v1_index_rebuilds_to_the_same_rows(tmp_path):
    pack = tmp_path / "g.hframe"
    shutil.copy(V1, pack)
    h.rebuild_index(pack, f"{pack}.index.parquet")
    rebuilt, stored = pq.read_table(f"{pack}.index.parquet"), pq.read_table(f"{V1}.index.parquet")
    # index schema 1.1 added columns; the 1.0 columns are unchanged and the new ones are null
    assert rebuilt.select(stored.column_names).equals(stored)
    assert rebuilt.column("mode").null_count == rebuilt.num_rows
    # reading the 1.0 index through hframe gives the 1.1 columns as nulls
    with h.open_pack(V1) as p:
        assert p.table.column("mode").null_count == 4 and p.table.num_rows == 4


V11 = Path(__file__).resolve().parents[1] / "data" / "v1" / "golden-1.1.hframe"


def test_v1_1_pack_file_is_unchanged():
    assert hashlib.md5(V11.read_bytes()).hexdigest() == "ea7a3ea122dd00f9705c27fde6fcc366"


def test_v1_1_frames_metadata_and_dictionary_read_back(tmp_path):
    with h.open_pack(V11) as p:
        assert len(p) == 15 and p.compressed and p.meta.format_version == "1.1"
        rec = p["recs/r05.json"]
        assert hashlib.md5(rec).hexdigest() == "338e2af4c2fcb864d3a7ae480d8b6eec" and rec.startswith(b'{"image_id": 5')
        assert hashlib.md5(p["imgs/red.png"]).hexdigest() == "351034bb2fda1c60cb37c72305af6c27"
        assert p["clips/tiny.mp4#frame=3"].startswith(b"\xff\xd8\xff")
        row = p.row("clips/tiny.mp4#frame=3")
        assert (row["source"], row["frame_index"], row["pts_s"], row["keyframe"]) == ("clips/tiny.mp4", 3, 0.6, True)
        assert (row["kind"], row["label"], row["width"], row["mode"]) == ("video_frame", "tiny", 16, "RGB")
        assert p.row("recs/r05.json")["codec"] == "zstd" and p.row("imgs/red.png")["label"] == "red"
        assert [p.row(i)["split"] for i in range(3)] == ["train", "train", "val"]
    assert h.verify_pack(V11).ok
    pack = tmp_path / "g.hframe"
    shutil.copy(V11, pack)
    h.rebuild_index(pack, f"{pack}.index.parquet")
    assert pq.read_table(f"{pack}.index.parquet").equals(pq.read_table(f"{V11}.index.parquet"))


@pytest.mark.parametrize("golden", [V1, V11])
def test_read_many_into_reads_packs_of_earlier_releases_as_read_many_does(golden):
    with h.open_pack(golden) as p:
        keys = list(range(len(p)))[::-1] + [0]
        want = p.read_many(keys)
        got = p.read_many_into(keys, bytearray(sum(map(len, want))))
        assert [bytes(v) for v in got] == want and p.frame_sizes(keys) == [len(w) for w in want]
