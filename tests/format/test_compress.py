"""Per-frame zstd compression with trained dictionaries: round trips, verify, rebuild, bombs."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import killed_and_resumed, make_records, run_bin, run_cli

import hframe_cli as h
from hframe_cli.errors import FormatError
from hframe_cli.format.codec import MAX_RAW_BYTES, Decompressor


@pytest.fixture
def records(tmp_path: Path) -> Path:
    return make_records(tmp_path / "rec")


def originals(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def pack(src: Path, out: Path, *extra: str) -> None:
    r = run_cli(["pack", str(src), "-o", str(out), "-q", *extra])
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("dict_mode", ["auto", "none"])
def test_compressed_pack_round_trips_through_reader_get_and_verify(records, tmp_path, dict_mode):
    out = tmp_path / "c.hframe"
    pack(records, out, "--compress", "zstd:5", "--zstd-dict", dict_mode)
    want = originals(records)
    rows = {r["name"]: r for r in pq.read_table(f"{out}.index.parquet").to_pylist()}
    assert rows["photo.jpg"]["codec"] == "none"  # already compressed: stored raw
    assert rows["flat.bmp"]["codec"] == "zstd" and rows["flat.bmp"]["media_type"] == "bmp"
    assert all(rows[n]["codec"] == "zstd" for n in want if n.endswith(".json"))
    for name, data in want.items():
        r = rows[name]
        assert r["raw_length"] == len(data) and r["md5"] == hashlib.md5(data).hexdigest()
    assert sum(r["length"] for r in rows.values()) < sum(map(len, want.values())) / 2
    with h.open_pack(out) as p:
        assert p.compressed
        assert p.read_many(list(want)) == list(want.values())
        assert [p[i] for i in range(len(p))] == [want[n] for n in sorted(want)]
        stored = p.read_stored("ann0001.json")
        assert stored[:4] == b"\x28\xb5\x2f\xfd" and len(stored) == rows["ann0001.json"]["length"]
    r = run_cli(["get", str(out), "ann0007.json"])
    assert r.exit_code == 0 and r.stdout_bytes == want["ann0007.json"]
    r = run_cli(["get", str(out), "flat.bmp", "--stored"])
    assert r.stdout_bytes != want["flat.bmp"]
    if dict_mode == "none":  # a plain zstd frame any zstd tool can read
        assert zstandard.ZstdDecompressor().decompress(r.stdout_bytes) == want["flat.bmp"]
    for extra in ([], ["--no-index"], ["--sample", "10%"]):
        r = run_cli(["verify", str(out), "--json", *extra])
        assert r.exit_code == 0 and json.loads(r.stdout)["ok"], (extra, r.stdout)
    header = json.loads(run_cli(["dump-header", str(out), "--json"]).stdout)
    assert header["header"]["format_version"] == "1.1" and header["header"]["compressed"] is True
    assert (
        (header["header"]["zstd_dict_bytes"] or 0) > 0
        if dict_mode == "auto"
        else header["header"]["zstd_dict_bytes"] is None
    )


def test_dictionary_beats_no_dictionary_on_small_records(tmp_path):
    src = tmp_path / "small"
    rng = random.Random(1)
    src.mkdir()
    keys = ["track", "artist", "album", "genre", "duration_ms", "explicit", "popularity", "tempo"]
    for i in range(400):
        (src / f"{i:04d}.json").write_text(json.dumps({k: rng.choice(["x", "yy", 1, 2.5, True]) for k in keys}))
    sizes = {}
    for mode in ("auto", "none"):
        out = tmp_path / f"{mode}.hframe"
        pack(src, out, "--compress", "zstd:3", "--zstd-dict", mode)
        sizes[mode] = pq.read_table(f"{out}.index.parquet", columns=["length"]).column("length").to_pylist()
    assert sum(sizes["auto"]) * 1.5 < sum(sizes["none"])


def test_dictionary_survives_index_rebuild_and_flips_are_found(records, tmp_path):
    out = tmp_path / "d.hframe"
    pack(records, out, "--compress", "zstd", "--zstd-dict", "auto")
    before = pq.read_table(f"{out}.index.parquet")
    Path(f"{out}.index.parquet").unlink()
    r = run_cli(["index", str(out), "--rebuild", "-q"])
    assert r.exit_code == 0, r.stderr
    assert pq.read_table(f"{out}.index.parquet").equals(before)
    with h.open_pack(out) as p:
        assert p.read_many(["ann0003.json", "flat.bmp"]) == [
            (records / "ann0003.json").read_bytes(),
            (records / "flat.bmp").read_bytes(),
        ]
    # flip one byte inside a compressed payload: exactly that frame is reported
    bad = tmp_path / "bad.hframe"
    shutil.copy(out, bad)
    shutil.copy(f"{out}.index.parquet", f"{bad}.index.parquet")
    row = before.to_pylist()[5]
    raw = bytearray(bad.read_bytes())
    raw[row["offset"] + row["length"] // 2] ^= 0x55
    bad.write_bytes(bytes(raw))
    for extra in ([], ["--no-index"]):
        doc = json.loads(run_cli(["verify", str(bad), "--json", *extra]).stdout)
        assert not doc["ok"]
        ids = {p["frame_id"] for pk in doc["packs"] for p in pk["problems"]}
        assert ids == {5}, (extra, doc)


def test_zstd_dict_from_a_file_and_bad_flags(records, tmp_path):
    samples = [p.read_bytes() for p in sorted(records.glob("*.json"))]
    dict_file = tmp_path / "my.dict"
    dict_file.write_bytes(zstandard.train_dictionary(4096, samples).as_bytes())
    out = tmp_path / "f.hframe"
    pack(records, out, "--compress", "zstd:3", "--zstd-dict", str(dict_file))
    with h.open_pack(out) as p:
        assert p["ann0010.json"] == (records / "ann0010.json").read_bytes()
    for args, words in (
        (["--zstd-dict", "auto"], "--compress"),
        (["--compress", "lz4"], "--compress"),
        (["--compress", "zstd:99"], "level"),
        (["--compress", "zstd", "--zstd-dict", str(tmp_path / "missing.dict")], "missing.dict"),
    ):
        r = run_cli(["pack", str(records), "-o", str(tmp_path / "x.hframe"), *args])
        assert r.exit_code == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_decompression_bombs_are_refused(records, tmp_path):
    d = Decompressor(None, "x")
    small = zstandard.ZstdCompressor().compress(b"a" * 1000)
    with pytest.raises(FormatError, match="decompression bomb"):
        d.decode(small, 1, 0, MAX_RAW_BYTES + 1, "frame 1")
    with pytest.raises(FormatError, match="declares 1000 bytes"):
        d.decode(small, 1, 0, 10, "frame 1")
    # an index that claims an absurd raw length: the reader refuses, naming the frame
    out = tmp_path / "b.hframe"
    pack(records, out, "--compress", "zstd")
    t = pq.read_table(f"{out}.index.parquet")
    raw = t.column("raw_length").to_pylist()
    raw[2] = 1 << 40
    t = t.set_column(t.schema.get_field_index("raw_length"), "raw_length", pa.array(raw, pa.int64()))
    pq.write_table(t, f"{out}.index.parquet")
    r = run_cli(["get", str(out), "2"])
    assert r.exit_code == 1 and "frame 2" in r.stderr and "bomb" in r.stderr and "Traceback" not in r.stderr


def test_compressed_pack_resumes_byte_identical_after_sigkill(records, tmp_path):
    args = ["--compress", "zstd:3", "--zstd-dict", "auto", "--created", "1700000000", "--checkpoint-every", "10", "-q"]
    clean, out, resumed = killed_and_resumed(records, tmp_path, args, "after-frame:57")
    assert resumed["resumed_from_frame"] == 50
    assert out.read_bytes() == clean.read_bytes()
    assert run_cli(["verify", str(out)]).exit_code == 0


def test_update_appends_with_the_packs_own_dictionary(records, tmp_path):
    out = tmp_path / "u.hframe"
    pack(records, out, "--compress", "zstd", "--zstd-dict", "auto")
    (records / "zzz.json").write_text(json.dumps({"image_id": 999, "bbox": [1, 2, 3, 4]}))
    r = run_cli(
        ["pack", str(records), "-o", str(out), "--update", "--compress", "zstd", "--zstd-dict", "auto", "--json"]
    )
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["update"]["status"] == "append"
    with h.open_pack(out) as p:
        assert p["zzz.json"] == (records / "zzz.json").read_bytes()
        assert p["ann0000.json"] == (records / "ann0000.json").read_bytes()


def test_parallel_verify_parts_decompress_in_the_children(records, tmp_path, monkeypatch):
    from hframe_cli.verify import check as verify_mod
    from hframe_cli.verify import parallel as parallel_mod
    from hframe_cli.verify import walk as walk_mod

    out = tmp_path / "p.hframe"
    pack(records, out, "--compress", "zstd", "--zstd-dict", "auto")
    monkeypatch.setattr(parallel_mod, "PART_MIN_BYTES", 1)  # walk even this small pack in parts
    walks = []
    real_walk = walk_mod.Verifier.walk
    monkeypatch.setattr(walk_mod.Verifier, "walk", lambda self, *a, **k: walks.append(a[1]) or real_walk(self, *a, **k))
    rep = verify_mod.verify_pack(out, workers=2)
    assert rep.ok and rep.frames_checked == rep.frames_total == 122
    assert walks == []  # every part walked in a child (none failed and came back to be walked here)
    # a damaged compressed frame in the child's part is reported by the child
    raw = bytearray(out.read_bytes())
    row = pq.read_table(f"{out}.index.parquet").to_pylist()[100]
    raw[row["offset"] + 3] ^= 0xFF
    out.write_bytes(bytes(raw))
    walks.clear()
    rep = verify_mod.verify_pack(out, workers=2)
    assert [p.frame_id for p in rep.problems] == [100] and walks == []


def test_sharded_compressed_run_resumes_byte_identical(records, tmp_path):
    # 100 kB: a few shards of some 30 frames, each with a dictionary (the planner keeps 64 KiB of
    # a shard for it: at 40 kB every frame was a shard of its own, and none had one)
    args = ["--max-pack-bytes", "100kB", "--compress", "zstd", "--zstd-dict", "auto", "--created", "1", "-q"]
    clean = tmp_path / "clean.hframe"
    assert run_bin(["pack", str(records), "-o", str(clean), *args]).returncode == 0
    shards = sorted(tmp_path.glob("clean-*.hframe"))
    assert 3 <= len(shards) <= 8
    for s in shards:
        assert json.loads(run_cli(["dump-header", str(s), "--json"]).stdout)["header"]["zstd_dict_bytes"] > 0
    out = tmp_path / "k.hframe"
    r = run_bin(
        ["pack", str(records), "-o", str(out), *args, "--checkpoint-every", "5"], env={"HFRAME_FAULT": "after-frame:70"}
    )
    assert r.returncode == -signal.SIGKILL
    assert run_bin(["resume", str(out), "-q"]).returncode == 0
    for s in shards:
        assert (tmp_path / s.name.replace("clean-", "k-")).read_bytes() == s.read_bytes(), s.name
    assert run_cli(["verify", str(out), "-q"]).exit_code == 0


@pytest.mark.parametrize(("column", "value"), [("codec", "none"), ("raw_length", 7)])
def test_verify_compares_the_index_codec_and_raw_length_with_the_records(records, tmp_path, column, value):
    out = tmp_path / "e.hframe"
    pack(records, out, "--compress", "zstd")
    t = pq.read_table(f"{out}.index.parquet")
    vals = t.column(column).to_pylist()
    vals[3] = value
    t = t.set_column(
        t.schema.get_field_index(column), t.schema.field(column), pa.array(vals, t.schema.field(column).type)
    )
    pq.write_table(t, f"{out}.index.parquet")
    doc = json.loads(run_cli(["verify", str(out), "--json"]).stdout)
    problems = doc["packs"][0]["problems"]
    assert not doc["ok"] and {p["frame_id"] for p in problems} == {3}
    assert any(p["check"] == "index" and column in p["message"] for p in problems)


@pytest.mark.parametrize("extra", [[], ["--workers", "1"], ["--decode"]])
def test_a_wrong_media_type_on_a_compressed_frame_is_a_magic_mismatch(records, tmp_path, extra):
    """hframe.1: compressed frames are checked after decompression. A JSON frame the index calls
    jpeg passed (the batch whose md5s all matched was taken as clean, its findings unread)."""
    out = tmp_path / "m.hframe"
    pack(records, out, "--compress", "zstd")
    t = pq.read_table(f"{out}.index.parquet")
    media = t.column("media_type").to_pylist()
    assert media[1] != "jpeg"
    media[1] = "jpeg"
    i = t.schema.get_field_index("media_type")
    pq.write_table(t.set_column(i, t.schema.field(i), pa.array(media, t.schema.field(i).type)), f"{out}.index.parquet")
    r = run_cli(["verify", str(out), "--json", *extra])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and not doc["ok"], r.stdout
    (problem,) = doc["packs"][0]["problems"]
    assert problem["frame_id"] == 1 and problem["check"] == "magic"
    assert "magic bytes mismatch after decompression (expected ff d8 ff" in problem["message"]


def test_shards_stay_under_max_pack_bytes_with_a_stored_dictionary(tmp_path):
    src = tmp_path / "rnd"
    src.mkdir()
    rng = random.Random(3)
    for i in range(40):
        (src / f"{i:02d}.bin").write_bytes(rng.randbytes(1000))  # incompressible: stored raw
    samples = [rng.randbytes(200) + b"common text " * 20 for _ in range(200)]
    (tmp_path / "big.dict").write_bytes(zstandard.train_dictionary(20000, samples).as_bytes())
    out = tmp_path / "r.hframe"
    r = run_cli(["pack", str(src), "-o", str(out), "--compress", "zstd", "--zstd-dict", str(tmp_path / "big.dict"),
                 "--max-pack-bytes", "30000", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.stderr
    sizes = [s["pack_bytes"] for s in json.loads(r.stdout)["shards"]]
    assert len(sizes) > 1 and max(sizes) <= 30000


def test_a_damaged_record_at_a_chunk_boundary_does_not_taint_the_next_compressed_frame(tmp_path, monkeypatch):
    from hframe_cli.verify import check as verify_mod
    from hframe_cli.verify import walk as walk_mod

    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(5)
    for i in range(300):  # compressible records of ~2-6 KB
        (src / f"{i:04d}.txt").write_text(
            " ".join(rng.choice(["alpha", "beta", "gamma"]) for _ in range(rng.randint(400, 1200)))
        )
    out = tmp_path / "c.hframe"
    pack(src, out, "--compress", "zstd:1")
    chunk = 64 << 10
    monkeypatch.setattr(walk_mod, "CHUNK_BYTES", chunk)  # small reads: many chunk boundaries
    rows = pq.read_table(f"{out}.index.parquet").to_pylist()
    i = max(k for k, r in enumerate(rows) if r["record_offset"] < 128 + chunk)  # straddles the first boundary
    raw = bytearray(out.read_bytes())
    raw[rows[i]["record_offset"] + 20] ^= 0x01  # inside the record header (its length field)
    out.write_bytes(bytes(raw))
    rep = verify_mod.verify_pack(out, workers=1)
    assert rep.bad_frames == [i], [(p.frame_id, p.message) for p in rep.problems]


def test_readers_decode_through_the_codec_registry(records, tmp_path, monkeypatch):
    """Every decode goes through the decoder registered for the frame's codec id."""
    from hframe_cli.format import codec

    calls = {"one": 0, "many": 0}

    class Counting(codec.ZstdDecoder):
        def decode(self, data, flags, raw_length, frame):
            calls["one"] += 1
            return super().decode(data, flags, raw_length, frame)

        def decode_many(self, datas, raw_lengths, with_dict):
            calls["many"] += len(datas)
            return super().decode_many(datas, raw_lengths, with_dict)

    out = tmp_path / "c.hframe"
    pack(records, out, "--compress", "zstd:3", "--zstd-dict", "auto")
    monkeypatch.setitem(codec._DECODERS, codec.ZSTD, Counting)
    want = originals(records)
    with h.open_pack(out) as p:
        names = p.table.column("name").to_pylist()
        assert p.read_many(names) == [want[n] for n in names]
        assert p[names[0]] == want[names[0]]
    assert calls["many"] > 0 and calls["one"] > 0
    monkeypatch.delitem(codec._DECODERS, codec.ZSTD)  # no decoder for zstd: refused by name
    with h.open_pack(out) as p, pytest.raises(h.FormatError, match="unknown codec 1"):
        p.read_many(list(range(len(p))))
