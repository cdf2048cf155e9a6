"""Packing: round trips checked with an independent reader, determinism, alignment, self-check."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import same_pack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hframe_cli as h
from hframe_cli.errors import ChecksumMismatch, MagicMismatch
from hframe_cli.format.layout import HEADER_SIZE
from hframe_cli.write.writer import PackWriter


def independent_frames(pack: Path) -> dict[str, bytes]:
    """Frames read with plain seek/read at the offsets pyarrow finds in the index."""
    rows = pq.read_table(f"{pack}.index.parquet", columns=["name", "offset", "length"]).to_pylist()
    out = {}
    with open(pack, "rb") as f:
        for r in rows:
            f.seek(r["offset"])
            out[r["name"]] = f.read(r["length"])
    return out


def source_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_frame_round_trips_byte_for_byte(photos, tmp_path):
    out = tmp_path / "p.hframe"
    result = h.pack([photos], out)
    src = source_files(photos)
    assert result.frame_count == len(src) == 30
    got = independent_frames(out)
    assert got.keys() == src.keys()
    for name, data in src.items():
        assert hashlib.md5(got[name]).digest() == hashlib.md5(data).digest(), name
    md5s = dict(zip(*pq.read_table(f"{out}.index.parquet", columns=["name", "md5"]).to_pydict().values()))
    assert md5s == {n: hashlib.md5(d).hexdigest() for n, d in src.items()}


def test_frames_are_sorted_by_name_and_ids_are_row_numbers(photos, tmp_path):
    out = tmp_path / "p.hframe"
    h.pack([photos], out)
    t = pq.read_table(f"{out}.index.parquet").to_pydict()
    assert t["frame_id"] == list(range(30))
    assert t["name"] == sorted(t["name"], key=lambda s: s.encode())
    assert t["label"][:3] == ["birds"] * 3 and set(t["label"]) == {"birds", "cats", "dogs"}


def test_offset_is_recorded_before_the_payload_is_appended(photos, tmp_path):
    out = tmp_path / "p.hframe"
    h.pack([photos], out)
    rows = pq.read_table(f"{out}.index.parquet").to_pylist()
    data = out.read_bytes()
    for r in rows:
        head = data[r["offset"] : r["offset"] + 8]
        assert head.startswith(b"\xff\xd8\xff" if r["media_type"] == "jpeg" else b"\x89PNG\r\n\x1a\n"), r["name"]
    # and the offsets and record headers tile the file with no gaps
    assert rows[0]["record_offset"] == HEADER_SIZE
    for a, b in zip(rows, rows[1:]):
        assert b["record_offset"] == a["offset"] + a["length"]


def test_same_inputs_and_time_give_identical_bytes(photos, tmp_path):
    a, b, c = tmp_path / "a.hframe", tmp_path / "b.hframe", tmp_path / "c.hframe"
    h.pack([photos], a, created_us=1_700_000_000_000_000)
    h.pack([photos], b, created_us=1_700_000_000_000_000, workers=1)
    h.pack([photos], c)
    assert a.read_bytes() == b.read_bytes()
    assert Path(f"{a}.index.parquet").read_bytes() == Path(f"{b}.index.parquet").read_bytes()
    assert a.read_bytes() != c.read_bytes()  # random UUID and current time without a fixed time


def test_alignment_puts_every_payload_on_the_boundary(photos, tmp_path):
    out = tmp_path / "p.hframe"
    h.pack([photos], out, alignment=4096)
    rows = pq.read_table(f"{out}.index.parquet", columns=["offset"]).column("offset").to_pylist()
    assert all(o % 4096 == 0 for o in rows)
    assert independent_frames(out) == source_files(photos)


def test_large_frame_is_streamed_and_round_trips(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(40 << 20)  # above the 32 MiB streaming threshold
    (src / "big.bin").write_bytes(big)
    (src / "small.bin").write_bytes(b"tiny")
    out = tmp_path / "big.hframe"
    h.pack([src], out)
    with h.open_pack(out) as p:
        assert p["big.bin"] == big
        assert p["small.bin"] == b"tiny"
        assert p.read_many([1, 0]) == [b"tiny", big]


def test_empty_file_packs_with_allow_empty(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "empty").write_bytes(b"")
    (src / "x").write_bytes(b"x")
    out = tmp_path / "e.hframe"
    h.pack([src], out, allow_empty=True)
    with h.open_pack(out) as p:
        assert p.read_many(["empty", "x"]) == [b"", b"x"]


def corrupt_payload(frame: int, media_type_too: bool = False):
    def hook(sealed):
        t = pq.read_table(sealed.partial_index_path, columns=["offset", "length"]).to_pylist()[frame]
        with open(sealed.partial_path, "r+b") as f:
            pos = t["offset"] + (0 if media_type_too else t["length"] // 2)
            f.seek(pos)
            b = f.read(1)
            f.seek(pos)
            f.write(bytes([b[0] ^ 0xFF]))

    return hook


@pytest.mark.parametrize(
    ("frame", "magic", "exc", "msg"),
    [
        (
            3,
            False,
            ChecksumMismatch,
            r"frame 3 '[^']+' \(offset \d+, length \d+\): md5 mismatch \(index [0-9a-f]{32}, read [0-9a-f]{32}\)",
        ),
        (19, True, MagicMismatch, r"frame 19 .*magic bytes mismatch"),
    ],
)
def test_self_check_failure_publishes_nothing(photos, tmp_path, frame, magic, exc, msg):
    out = tmp_path / "p.hframe"
    srcs = h.collect_sources([str(photos)])
    with pytest.raises(exc, match=msg):
        h.pack_sources(srcs, out, after_seal=corrupt_payload(frame, magic))
    assert not out.exists()
    assert not Path(f"{out}.index.parquet").exists()
    assert Path(f"{out}.partial").exists()  # kept for inspection, clearly unfinished


def test_corruption_past_the_self_checked_frames_is_not_what_it_checks(photos, tmp_path):
    out = tmp_path / "p.hframe"
    srcs = h.collect_sources([str(photos)])
    h.pack_sources(srcs, out, after_seal=corrupt_payload(25), self_check_frames=20)  # frame 25 not read back
    with pytest.raises(ChecksumMismatch):
        h.pack_sources(srcs, tmp_path / "q.hframe", after_seal=corrupt_payload(25), self_check_frames=30)


def test_failed_pack_never_replaces_an_existing_good_pack(photos, tmp_path):
    out = tmp_path / "p.hframe"
    h.pack([photos], out)
    before = out.read_bytes()
    srcs = h.collect_sources([str(photos)])
    with pytest.raises(ChecksumMismatch):
        h.pack_sources(srcs, out, force=True, after_seal=corrupt_payload(0))
    assert out.read_bytes() == before
    with h.open_pack(out) as p:
        assert len(p) == 30


def test_writer_exception_leaves_no_index(tmp_path):
    out = tmp_path / "w.hframe"
    with pytest.raises(RuntimeError):
        with PackWriter(out) as w:
            w.add(b"a", b"data")
            raise RuntimeError("boom")
    assert not out.exists() and not Path(f"{out}.index.parquet").exists()
    with pytest.raises(h.FormatError):  # no trailer (or nothing flushed yet): never mistaken for a pack
        h.open_pack(f"{out}.partial")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blobs=st.lists(st.binary(max_size=3000), min_size=1, max_size=20), align=st.sampled_from([1, 8, 4096]))
def test_arbitrary_blobs_round_trip(tmp_path, blobs, align):
    out = tmp_path / f"h{align}.hframe"
    with PackWriter(out, alignment=align, force=True) as w:
        for i, b in enumerate(blobs):
            w.add(f"{i:04d}".encode(), b)
        w.seal()
        w.publish()
    rows = pq.read_table(f"{out}.index.parquet").to_pylist()
    with open(out, "rb") as f:
        for r, b in zip(rows, blobs, strict=True):
            f.seek(r["offset"])
            assert f.read(r["length"]) == b
            assert r["md5"] == hashlib.md5(b).hexdigest()
            assert r["offset"] % align == 0
    for a, b in zip(rows, rows[1:]):
        assert a["offset"] + a["length"] <= b["record_offset"] < a["offset"] + a["length"] + align
    with h.open_pack(out) as p:
        assert p.read_many(list(range(len(blobs)))[::-1]) == blobs[::-1]


def test_writer_refuses_an_unknown_media_type_and_the_pack_goes_on(tmp_path):
    out = tmp_path / "m.hframe"
    with PackWriter(out) as w:
        w.add(b"a", b"first")
        for bad in ({"media": "foo"}, {"kind": 99}):
            with pytest.raises(ValueError, match="not one of"):
                w.add(b"b", b"second", **bad)
        w.add(b"c", b"third")
        w.seal()
        w.publish()
    with h.open_pack(out) as p:
        assert [p.read(0), p.read(1)] == [b"first", b"third"]
    assert h.verify_pack(out).ok


_NAMES = st.lists(st.binary(min_size=1, max_size=40).filter(lambda n: b"\0" not in n), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    names=_NAMES,
    payloads=st.lists(
        st.one_of(st.binary(max_size=600), st.sampled_from([b"\xff\xd8\xff\xe0" + b"j" * 40, b"\x89PNG\r\n\x1a\n"])),
        min_size=12,
        max_size=12,
    ),
    mtime=st.integers(min_value=-(2**62), max_value=2**62),
    align=st.sampled_from([1, 64]),
)
def test_add_blob_writes_what_add_writes(tmp_path, names, payloads, mtime, align):
    """The plain-blob fast path (what small-file packs spend their time in) gives the same
    pack and index bytes as ``add``: folder labels, names that are not UTF-8, image bytes (which
    it hands to ``add``), aligned packs."""
    names = list(dict.fromkeys(b"d/" * (i % 2) + n for i, n in enumerate(names)))
    packs = []
    for how in ("add", "add_blob"):
        out = tmp_path / f"{how}{align}.hframe"
        with PackWriter(
            out, alignment=align, created_us=1, pack_uuid="00000000-0000-4000-8000-000000000001", force=True
        ) as w:
            for i, (name, data) in enumerate(zip(names, payloads)):
                if how == "add":
                    w.add(name, data, mtime_ns=mtime + i, md5=hashlib.md5(data).digest())
                else:
                    w.add_blob(name, data, hashlib.md5(data).digest(), mtime + i)
            w.seal()
            w.publish()
        packs.append(out)
    assert same_pack(*packs)


def test_a_sealed_writer_lets_go_of_its_rows(tmp_path):
    """Once the index is written, the writer keeps only the frame count (the rows cost ~95
    bytes a frame through the self-check); its index is whole on disk."""
    out = tmp_path / "r.hframe"
    with PackWriter(out) as w:
        for i in range(50):
            w.add_blob(b"d/%02d" % i, b"x" * i, hashlib.md5(b"x" * i).digest(), i)
        w.seal()
        assert len(w) == 50
        with pytest.raises(ValueError, match="released"):
            w._index.to_table(None)
        w.publish()
    assert pq.read_table(f"{out}.index.parquet").column("length").to_pylist() == list(range(50))
