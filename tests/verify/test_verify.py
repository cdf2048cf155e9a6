"""``hframe verify``: every kind of damage is found, attributed to exactly the damaged frames."""

from __future__ import annotations

import faulthandler
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hframe_cli as h
from hframe_cli.format.layout import HEADER_SIZE, TRAILER_SIZE
from hframe_cli.verify.check import verify_pack
from hframe_cli.write.writer import PackWriter


def make_pack(tmp_path: Path, photos: Path, name: str = "v.hframe", align: int = 1, blobs: int = 40) -> Path:
    """Images (so magic checks apply) plus random blobs of varied size."""
    src = tmp_path / f"src-{name.replace('.', '_')}"
    shutil.copytree(photos, src)
    rng = random.Random(5)
    for i in range(blobs):
        (src / "blobs").mkdir(exist_ok=True)
        (src / "blobs" / f"{i:03d}.bin").write_bytes(rng.randbytes(rng.randrange(1, 3000)))
    out = tmp_path / name
    h.pack([src], out, alignment=align)
    return out


def rows(pack: Path) -> list[dict]:
    return pq.read_table(f"{pack}.index.parquet").to_pylist()


def random_blobs_pack(pack: Path, frames: int, *, seed: int, size: int = 1 << 20) -> Path:
    """A published pack of ``frames`` random blobs of ``size`` bytes, ``000.bin``, ``001.bin``, ..."""
    rng = random.Random(seed)
    with PackWriter(pack) as w:
        for i in range(frames):
            w.add(f"{i:03d}.bin".encode(), rng.randbytes(size))
        w.seal()
        w.publish()
    return pack


def flip(pack: Path, pos: int) -> None:
    with open(pack, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x5A]))


@pytest.fixture
def vpack(tmp_path, photos):
    return make_pack(tmp_path, photos)


def test_clean_pack_verifies_clean(vpack, cli):
    r = cli(["verify", str(vpack), "--json"])
    assert r.exit_code == 0, r.stdout
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["exit_code"] == 0 and doc["problems"] == 0
    p = doc["packs"][0]
    assert p["frames_checked"] == p["frames_total"] == 70
    assert p["bytes_checked"] == sum(x["length"] for x in rows(vpack))
    r = cli(["verify", str(vpack)])
    assert r.exit_code == 0 and r.stdout.startswith(f"{vpack}: ok: 70 of 70 frames checked (full, index)")


def test_verifying_a_local_pack_imports_neither_the_listing_nor_the_http_client(vpack):
    """``verify`` starts before it hashes: the packing side's listing (sources.inputs, with
    the object-store and archive readers it brings) and the HTTP client (and ssl) cost a local
    verify 30-40 ms it does not need (a pack behind a URL imports the client when it opens it)."""
    run = [sys.executable, "-X", "importtime", "-m", "hframe_cli", "verify", str(vpack), "-q"]
    done = subprocess.run(run, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "hframe_cli.verify.walk" in imported  # (the list is the verify's own)
    assert not imported & {"hframe_cli.sources.inputs", "hframe_cli.sources.listing", "hframe_cli.storage.http"}


@pytest.mark.parametrize("align", [1, 512])
@pytest.mark.parametrize("seed", range(6))
def test_payload_flips_are_found_in_exactly_those_frames(tmp_path, photos, seed, align):
    pack = make_pack(tmp_path, photos, align=align)
    rs = rows(pack)
    rng = random.Random(seed)
    damaged = set(rng.sample(range(len(rs)), rng.randrange(1, 5)))
    for i in damaged:
        flip(pack, rs[i]["offset"] + rng.randrange(rs[i]["length"]))
    for use_index in (True, False):
        rep = verify_pack(pack, use_index=use_index)
        assert set(rep.bad_frames) == damaged, (use_index, rep.problems)
        assert not rep.ok and rep.error is None


@pytest.mark.parametrize("align", [1, 512])
@pytest.mark.parametrize("seed", range(6))
def test_record_header_flips_are_found_in_exactly_those_frames(tmp_path, photos, seed, align):
    pack = make_pack(tmp_path, photos, align=align)
    rs = rows(pack)
    rng = random.Random(100 + seed)
    damaged = set(rng.sample(range(len(rs)), rng.randrange(1, 4)))
    for i in damaged:
        flip(pack, rs[i]["record_offset"] + rng.randrange(rs[i]["offset"] - rs[i]["record_offset"]))
    rep = verify_pack(pack)
    assert set(rep.bad_frames) == damaged, rep.problems
    rep = verify_pack(pack, use_index=False)  # from record headers alone: resynchronises on the next header
    assert set(rep.bad_frames) == damaged, rep.problems


@pytest.mark.parametrize("seed", range(8))
def test_header_and_trailer_flips_are_pack_level_problems(vpack, seed):
    rng = random.Random(seed)
    size = vpack.stat().st_size
    pos = rng.randrange(HEADER_SIZE) if seed % 2 == 0 else size - TRAILER_SIZE + rng.randrange(TRAILER_SIZE)
    flip(vpack, pos)
    rep = verify_pack(vpack)
    assert rep.problems and rep.bad_frames == [], (pos, rep.problems)
    assert {p.check for p in rep.problems} <= {"header", "trailer", "index"}


def test_damaged_magic_in_header_and_trailer_at_once_is_not_a_pack(vpack, cli):
    flip(vpack, 0)
    flip(vpack, vpack.stat().st_size - TRAILER_SIZE)
    r = cli(["verify", str(vpack)])
    assert r.exit_code == 2 and "cannot verify" in r.stderr and "not a frame pack" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("seed", range(10))
def test_truncation_reports_exactly_the_frames_cut_off(vpack, tmp_path, seed):
    rs = rows(vpack)
    data = vpack.read_bytes()
    cut = random.Random(seed).randrange(9, len(data))
    vpack.write_bytes(data[:cut])
    rep = verify_pack(vpack)
    assert set(rep.bad_frames) == {r["frame_id"] for r in rs if r["offset"] + r["length"] > cut}, (cut, rep.problems)
    assert not rep.ok


def test_appended_garbage(vpack, cli):
    with open(vpack, "ab") as f:
        f.write(b"x" * 100)
    rep = verify_pack(vpack)
    assert rep.bad_frames == []
    assert any("100 unexpected bytes after the trailer" in p.message for p in rep.problems)
    assert cli(["verify", str(vpack)]).exit_code == 1


def test_swapped_index_cannot_be_verified(vpack, tmp_path, photos, cli):
    other = make_pack(tmp_path, photos, "other.hframe")
    shutil.copy(f"{other}.index.parquet", f"{vpack}.index.parquet")
    r = cli(["verify", str(vpack), "--json"])
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["packs"][0]["status"] == "error" and "index belongs to another pack" in doc["packs"][0]["error"]


@pytest.mark.parametrize("column", ["offset", "length", "md5", "record_offset"])
def test_edited_index_row_is_found(vpack, column):
    t = pq.read_table(f"{vpack}.index.parquet")
    values = t.column(column).to_pylist()
    victim = 17
    values[victim] = ("0" * 32) if column == "md5" else values[victim] + 3
    t = t.set_column(
        t.schema.get_field_index(column), t.schema.field(column), pa.array(values, t.schema.field(column).type)
    )
    pq.write_table(t, f"{vpack}.index.parquet")  # metadata kept: the index still claims this pack
    rep = verify_pack(vpack)
    assert rep.bad_frames == [victim], rep.problems


def test_no_index_finds_bad_frames_when_the_index_is_gone(vpack, cli):
    rs = rows(vpack)
    for i in (3, 44):
        flip(vpack, rs[i]["offset"] + rs[i]["length"] // 2)
    os.unlink(f"{vpack}.index.parquet")
    r = cli(["verify", str(vpack)])
    assert r.exit_code == 2 and "index not found" in r.stderr
    r = cli(["verify", str(vpack), "--no-index", "--jsonl"])
    assert r.exit_code == 1
    assert sorted(json.loads(line)["frame_id"] for line in r.stdout.splitlines()) == [3, 44]


def test_decode_finds_a_source_that_was_broken_before_packing(tmp_path, photos, cli):
    jpg = photos / "cats" / "003.jpg"
    jpg.write_bytes(jpg.read_bytes()[: jpg.stat().st_size // 2])  # truncated JPEG: right magic, right md5
    out = tmp_path / "d.hframe"
    h.pack([photos], out)
    assert cli(["verify", str(out)]).exit_code == 0
    r = cli(["verify", str(out), "--decode", "--json"])
    assert r.exit_code == 1
    probs = json.loads(r.stdout)["packs"][0]["problems"]
    assert [(p["check"], p["name"] is None) for p in probs] == [("decode", True)]
    idx = pq.read_table(f"{out}.index.parquet").column("name").to_pylist().index("cats/003.jpg")
    assert probs[0]["frame_id"] == idx and "image does not decode" in probs[0]["message"]
    assert "0x" not in probs[0]["message"]  # no object addresses: the same damage, the same report
    # without the index the record headers' kinds say which frames are images: blobs are not decoded
    (photos / "notes.bin").write_bytes(b"not an image" * 10)
    out2 = tmp_path / "d2.hframe"
    h.pack([photos], out2)
    r = cli(["verify", str(out2), "--decode", "--no-index", "--json"])
    probs = json.loads(r.stdout)["packs"][0]["problems"]
    names = pq.read_table(f"{out2}.index.parquet").column("name").to_pylist()
    assert [(p["check"], names[p["frame_id"]]) for p in probs] == [("decode", "cats/003.jpg")]


def test_sample_is_seeded_and_cheaper(tmp_path):
    out = tmp_path / "s.hframe"
    with PackWriter(out) as w:
        for i in range(20_000):
            w.add(f"{i:06d}".encode(), os.urandom(200))
        w.seal()
        w.publish()
    a = verify_pack(out, sample=("percent", 5), seed=7)
    b = verify_pack(out, sample=("percent", 5), seed=7)
    c = verify_pack(out, sample=("percent", 5), seed=8)
    assert a.ok and 1000 <= a.frames_checked < 2000 and a.selection == "sample 5% (seed 7)"
    assert a.frames_checked == b.frames_checked
    flip(out, rows(out)[0]["offset"])  # frame 0: found by a sample only if its run was chosen
    hits = {seed: bool(verify_pack(out, sample=("percent", 5), seed=seed).problems) for seed in range(40)}
    assert any(hits.values()) and not all(hits.values())
    assert c.frames_checked > 0
    f = verify_pack(out, frames=(100, 250))
    assert f.frames_checked == 150 and f.selection == "frames 100:250"


def test_clean_pack_of_100k_tiny_frames(tmp_path):
    out = tmp_path / "tiny.hframe"
    rng = random.Random(1)
    with PackWriter(out) as w:
        for i in range(100_000):
            w.add(b"%06d" % i, rng.randbytes(rng.randrange(1, 12)))
        w.seal()
        w.publish()
    rep = verify_pack(out)
    assert rep.ok and rep.frames_checked == 100_000, rep.problems[:3]


def test_a_junit_report_that_cannot_be_written_is_one_line_not_an_internal_error(vpack, tmp_path, cli):
    """It was exit 4, "internal error: FileNotFoundError"; nothing is left where it was asked for."""
    junit = tmp_path / "no" / "such" / "junit.xml"
    r = cli(["verify", str(vpack), "--junit", str(junit)])
    assert r.exit_code == 2, r.stderr
    assert r.stderr == f"hframe: error: {junit}: cannot write the JUnit report (No such file or directory)\n"
    assert not (tmp_path / "no").exists()


def test_json_jsonl_junit_and_many_packs(vpack, tmp_path, photos, cli):
    bad = make_pack(tmp_path, photos, "bad.hframe")
    flip(bad, rows(bad)[5]["offset"] + 1)
    junit = tmp_path / "junit.xml"
    r = cli(["verify", str(tmp_path / "*.hframe"), str(tmp_path / "missing.hframe"), "--junit", str(junit)])
    assert r.exit_code == 1
    assert r.stdout.splitlines()[-1].startswith("verified 3 packs: 1 ok, 1 with problems, 1 not verified")
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases[str(bad)].find("failure") is not None and "frame 5" in cases[str(bad)].find("failure").text
    assert cases[str(vpack)].find("failure") is None and cases[str(vpack)].find("error") is None
    assert "no such file" in cases[str(tmp_path / "missing.hframe")].find("error").get("message")
    r = cli(["verify", str(bad), "--jsonl"])
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert {x["frame_id"] for x in lines} == {5} and all(x["pack"] == str(bad) for x in lines)


def test_max_errors_stops_early(vpack, cli):
    for r in rows(vpack)[:10]:
        flip(vpack, r["offset"] + r["length"] - 1)
    r = cli(["verify", str(vpack), "--max-errors", "3", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["problems"] == 3 and doc["packs"][0]["stopped_early"] is True


def test_bad_flags_and_quiet(vpack, cli):
    for args, msg in (
        (["--sample", "0%"], "--sample: '0%' is not a percentage"),
        (["--frames", "9:3"], "--frames: '9:3' is an empty or negative range"),
        (["--no-index", "--sample", "5%"], "--sample and --frames need the index"),
    ):
        r = cli(["verify", str(vpack), *args])
        assert r.exit_code == 2 and msg in (r.stderr + r.stdout), (args, r.stderr, r.stdout)
    r = cli(["verify", str(vpack), "-q"])
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")


def test_large_pack_is_checked_in_parallel_parts_with_exact_results(tmp_path):
    out = tmp_path / "big.hframe"
    rng = random.Random(11)
    with PackWriter(out) as w:  # 72 frames of ~1 MiB: parts of at least 8 MiB, up to 3 of them
        for i in range(72):
            w.add(b"%03d.bin" % i, rng.randbytes(1_000_000 + rng.randrange(100_000)))
        w.seal()
        w.publish()
    clean = verify_pack(out, workers=2)
    assert clean.ok and clean.frames_checked == 72 and clean.bytes_checked == sum(r["length"] for r in rows(out))
    rs = rows(out)
    damaged = {3, 40, 41, 70}
    for i in (3, 40, 70):
        flip(out, rs[i]["offset"] + rs[i]["length"] // 3)
    flip(out, rs[41]["record_offset"] + 10)  # a record header in the second half
    for workers in (1, 2, 3):
        rep = verify_pack(out, workers=workers)
        assert set(rep.bad_frames) == damaged, (workers, rep.problems)
        assert [p.frame_id for p in rep.problems] == sorted(p.frame_id for p in rep.problems)  # frame order
    rep = verify_pack(out, workers=2, max_errors=2)
    assert len(rep.problems) == 2 and rep.stopped_early


@pytest.mark.parametrize("edit", ["large_string_names", "int32_offsets", "dictionary_codec", "null_length"])
def test_index_columns_rewritten_by_other_tools(tmp_path, packed, cli, edit):
    """Another tool may rewrite the index with other Arrow types: read as the schema's types;
    nulls in a required column make the index unusable: a problem of the index (exit 1; a full
    check then checks the frames from the pack alone), never a traceback."""
    t = pq.read_table(f"{packed}.index.parquet")

    def replace(name: str, arr: pa.Array) -> pa.Table:
        return t.set_column(t.schema.get_field_index(name), pa.field(name, arr.type), arr)

    if edit == "large_string_names":
        t = replace("name", t.column("name").cast(pa.large_string()))
    elif edit == "int32_offsets":
        t = replace("offset", t.column("offset").cast(pa.int32()))
    elif edit == "dictionary_codec":
        t = replace("codec", t.column("codec").combine_chunks().dictionary_encode())
    else:
        lengths = t.column("length").to_pylist()
        lengths[3] = None
        t = replace("length", pa.array(lengths, pa.int64()))
    pq.write_table(t, f"{packed}.index.parquet")
    for extra in ([], ["--frames", "2:6"], ["--sample", "20%"]):
        r = cli(["verify", str(packed), *extra])
        if edit == "null_length":
            assert r.exit_code == 1 and "null" in r.stdout + r.stderr, (extra, r.stdout, r.stderr)
            if not extra:
                assert "30 of 30 frames checked (full, no-index)" in r.stdout, r.stdout
        else:
            assert r.exit_code == 0, (extra, r.stdout, r.stderr)
    if edit != "null_length":
        with h.open_pack(packed) as p:
            assert p[5] and p.read_many([1, 2]) and p.frame_id(p.table.column("name")[4].as_py()) == 4


@pytest.mark.parametrize("bad_offset", [0, -5, 50])
def test_an_index_offset_pointing_before_its_record_is_reported_not_a_crash(tmp_path, bad_offset):
    out = tmp_path / "o.hframe"
    with PackWriter(out) as w:
        for i in range(40):
            w.add(f"{i:03d}".encode(), bytes([i]) * 100)
        w.seal()
        w.publish()
    t = pq.read_table(f"{out}.index.parquet")
    offs = t.column("offset").to_pylist()
    offs[19] = bad_offset  # the last frame of the run checked below
    t = t.set_column(t.schema.get_field_index("offset"), t.schema.field("offset"), pa.array(offs, pa.int64()))
    pq.write_table(t, f"{out}.index.parquet")
    rep = verify_pack(out, frames=(10, 20))
    assert rep.error is None and rep.bad_frames == [19]


def _damage(pack: Path, kind: str, rng: random.Random) -> set[int]:
    """Damage ``pack`` (or its index) one way; return the frame ids that must be reported."""
    rs = rows(pack)
    if kind == "payload":
        hit = set(rng.sample(range(len(rs)), 4))
        for i in hit:
            flip(pack, rs[i]["offset"] + rng.randrange(rs[i]["length"]))
        return hit
    if kind == "record_header":
        hit = set(rng.sample(range(len(rs)), 3))
        for i in hit:
            flip(pack, rs[i]["record_offset"] + rng.randrange(rs[i]["offset"] - rs[i]["record_offset"]))
        return hit
    if kind == "truncate":
        data = pack.read_bytes()
        cut = rng.randrange(len(data) // 3, len(data))
        pack.write_bytes(data[:cut])
        return {r["frame_id"] for r in rs if r["offset"] + r["length"] > cut}
    t = pq.read_table(f"{pack}.index.parquet")  # an index row edited: md5, offset or length
    victim = rng.randrange(len(rs))
    values = t.column(kind).to_pylist()
    values[victim] = ("0" * 32) if kind == "md5" else values[victim] + 1
    field = t.schema.field(kind)
    pq.write_table(
        t.set_column(t.schema.get_field_index(kind), field, pa.array(values, field.type)), f"{pack}.index.parquet"
    )
    return {victim}


@pytest.mark.parametrize("kind", ["payload", "record_header", "truncate", "md5", "offset", "length"])
@pytest.mark.parametrize("seed", range(3))
def test_parallel_parts_and_small_chunks_report_exactly_what_one_walk_does(tmp_path, photos, monkeypatch, kind, seed):
    """A full verify is split into parts (each converting only its own index rows) and read in
    chunks that sound records must lie wholly inside: neither may change what is found."""
    import hframe_cli.verify.parallel as parallel_mod
    import hframe_cli.verify.walk as walk_mod

    pack = make_pack(tmp_path, photos, blobs=200)
    damaged = _damage(pack, kind, random.Random(seed))
    one = verify_pack(pack, workers=1)
    assert set(one.bad_frames) == damaged, one.problems
    monkeypatch.setattr(parallel_mod, "PART_MIN_BYTES", 1)
    monkeypatch.setattr(walk_mod, "CHUNK_BYTES", 5000)  # frames straddle chunk ends all the time
    for workers in (1, 2, 3):
        rep = verify_pack(pack, workers=workers)
        assert [(p.check, p.frame_id, p.message) for p in rep.problems] == [
            (p.check, p.frame_id, p.message) for p in one.problems
        ], (workers, rep.problems, one.problems)
        assert rep.frames_checked == one.frames_checked and rep.bytes_checked == one.bytes_checked


def _small_big_small(tmp_path: Path) -> tuple[Path, list[dict]]:
    """10 small frames, one big, 10 small: with 3 parts, the cuts fall right after the big one."""
    src = tmp_path / "sbs"
    src.mkdir()
    rng = random.Random(1)
    for i in range(10):
        (src / f"a{i}.bin").write_bytes(rng.randbytes(500))
        (src / f"c{i}.bin").write_bytes(rng.randbytes(500))
    (src / "b_big.bin").write_bytes(rng.randbytes(100_000))
    out = tmp_path / "sbs.hframe"
    h.pack([src], out)
    return out, rows(out)


def _problems(rep) -> list[tuple]:
    return [(p.check, p.frame_id, p.name, p.offset, p.length, p.message) for p in rep.problems]


@pytest.mark.parametrize(
    "damage", ["cut_in_record_header", "cut_after_big", "part_start_record_offset", "part_start_offset"]
)
def test_parallel_parts_at_damaged_seams_match_one_walk(tmp_path, monkeypatch, damage):
    """Damage where one part ends and the next begins: the parallel report (names, offsets,
    messages, counts) is exactly one walk's; no placeholder rows, no frame reported twice."""
    import hframe_cli.verify.parallel as parallel_mod

    pack, rs = _small_big_small(tmp_path)
    if damage == "cut_in_record_header":
        os.truncate(pack, rs[11]["record_offset"] + 10)
    elif damage == "cut_after_big":
        os.truncate(pack, rs[11]["record_offset"])
    else:
        col = "record_offset" if damage == "part_start_record_offset" else "offset"
        t = pq.read_table(f"{pack}.index.parquet")
        values = t.column(col).to_pylist()
        for k in (11, 12):  # the first rows of parts 2 and 3
            values[k] += 1
        field = t.schema.field(col)
        pq.write_table(
            t.set_column(t.schema.get_field_index(col), field, pa.array(values, field.type)), f"{pack}.index.parquet"
        )
    one = verify_pack(pack, workers=1)
    assert one.problems and all(p.name != "" for p in one.problems)
    monkeypatch.setattr(parallel_mod, "PART_MIN_BYTES", 1)
    for workers in (2, 3):
        rep = verify_pack(pack, workers=workers)
        assert _problems(rep) == _problems(one), workers
        assert (rep.frames_checked, rep.bytes_checked) == (one.frames_checked, one.bytes_checked)


def test_a_selection_reports_only_its_own_frames(tmp_path):
    pack, rs = _small_big_small(tmp_path)
    os.truncate(pack, rs[13]["record_offset"] + 10)
    rep = verify_pack(pack, frames=(12, 16))
    assert rep.bad_frames == [13, 14, 15], rep.problems
    for p in rep.problems:
        if p.frame_id is not None:
            assert (p.name, p.offset, p.length) == (
                rs[p.frame_id]["name"],
                rs[p.frame_id]["offset"],
                rs[p.frame_id]["length"],
            )


def test_max_errors_counts_only_frames_really_hashed(tmp_path):
    pack, rs = _small_big_small(tmp_path)
    t = pq.read_table(f"{pack}.index.parquet")
    names = t.column("name").to_pylist()
    names[15] = "renamed.bin"  # a layout problem found before frame 15's batch is hashed
    field = t.schema.field("name")
    pq.write_table(
        t.set_column(t.schema.get_field_index("name"), field, pa.array(names, field.type)), f"{pack}.index.parquet"
    )
    flip(pack, rs[3]["offset"] + 7)
    rep = verify_pack(pack, max_errors=1)
    assert rep.stopped_early and len(rep.problems) == 1
    # frame 3 is damaged and unreported: it was never hashed, so it must not count as checked
    could_be_hashed = [r["length"] for r in rs[:15] if r["frame_id"] != 3]
    assert rep.frames_checked <= len(could_be_hashed) and rep.bytes_checked <= sum(could_be_hashed)


def test_max_errors_gives_the_same_problems_whatever_the_workers(tmp_path, monkeypatch):
    import hframe_cli.verify.parallel as parallel_mod

    pack, rs = _small_big_small(tmp_path)
    flip(pack, rs[3]["offset"] + 5)
    flip(pack, rs[15]["record_offset"] + 9)
    monkeypatch.setattr(parallel_mod, "PART_MIN_BYTES", 1)
    for n in (1, 2):
        reps = [verify_pack(pack, workers=w, max_errors=n) for w in (1, 2, 3)]
        assert len({(tuple(_problems(r)), r.frames_checked, r.bytes_checked) for r in reps}) == 1, n


def test_a_frame_shorter_than_its_magic_is_judged_on_its_own_bytes(tmp_path, monkeypatch):
    """A 3-byte frame the index calls a PNG (8 magic bytes): the bytes found are its own, never
    the next record's header, in one walk and in parts."""
    import hframe_cli.verify.parallel as parallel_mod

    src = tmp_path / "zeros"
    src.mkdir()
    for i in range(12):
        (src / f"{i:02d}.bin").write_bytes(b"abc")
    pack = tmp_path / "z.hframe"
    h.pack([src], pack)
    t = pq.read_table(f"{pack}.index.parquet")
    media = t.column("media_type").to_pylist()
    media[7] = "png"
    field = t.schema.field("media_type")
    pq.write_table(
        t.set_column(t.schema.get_field_index("media_type"), field, pa.array(media, field.type)),
        f"{pack}.index.parquet",
    )
    monkeypatch.setattr(parallel_mod, "PART_MIN_BYTES", 1)
    for workers in (1, 3):
        rep = verify_pack(pack, workers=workers)
        assert [(p.check, p.frame_id, p.found) for p in rep.problems] == [("magic", 7, "61 62 63")], workers


def test_every_one_frame_selection_reports_only_its_own_frame(tmp_path):
    """1000 bytes cut out of frame 20 shift every later record off its index position. At the
    end the index points past the data, so the walk resynchronises on a shifted header and finds
    records "lost" in between. A --frames selection still reports only its own frames."""
    src = tmp_path / "varied"
    src.mkdir()
    rng = random.Random(3)
    sizes = [rng.randrange(50, 1500) for _ in range(57)] + [820, 400, 100]  # see the docstring
    for i, size in enumerate(sizes):
        (src / f"{i:02d}.bin").write_bytes(rng.randbytes(size))
    pack = tmp_path / "varied.hframe"
    h.pack([src], pack)
    rs = rows(pack)
    data = bytearray(pack.read_bytes())
    del data[rs[20]["offset"] + 5 : rs[20]["offset"] + 1005]
    pack.write_bytes(bytes(data))
    assert any("record not found" in p.message for p in verify_pack(pack, frames=(57, 60)).problems)
    for i in range(60):
        rep = verify_pack(pack, frames=(i, i + 1))
        assert set(rep.bad_frames) <= {i}, (i, [(p.frame_id, p.message) for p in rep.problems])


def test_a_pack_that_cannot_be_read_exits_3_even_beside_good_ones(packed, cli):
    """Storage failing (here: EIO) is the environment, not bad input: exit 3, as every command."""
    r = cli(["verify", str(packed), "/proc/self/mem", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 3 == doc["exit_code"], r.stdout
    assert [p["status"] for p in doc["packs"]] == ["ok", "error"] or [p["status"] for p in doc["packs"]] == [
        "error",
        "ok",
    ]
    assert "Input/output error" in r.stdout
    r = cli(["verify", str(packed), str(packed) + ".missing"])
    assert r.exit_code == 2  # could not be verified for another reason


def test_every_output_names_the_damaged_frame(vpack, tmp_path, cli):
    """Plain text, JSON and JUnit all carry the frame's name, not only its id and offset."""
    row = rows(vpack)[7]
    flip(vpack, row["offset"] + row["length"] // 2)
    junit = tmp_path / "j.xml"
    r = cli(["verify", str(vpack), "--junit", str(junit)])
    assert r.exit_code == 1
    line = next(x for x in r.stdout.splitlines() if "md5 mismatch" in x)
    assert f"frame 7 {row['name']!r} (offset {row['offset']}, length {row['length']})" in line, line
    assert repr(row["name"]) in junit.read_text()
    doc = json.loads(cli(["verify", str(vpack), "--json"]).stdout)
    assert doc["packs"][0]["problems"][0]["name"] == row["name"]


class _Bar:
    """What the CLI's progress bar is told: the totals once, then running (frames, bytes)."""

    def __init__(self) -> None:
        self.total: tuple[int, int] | None = None
        self.updates: list[tuple[int, int]] = []

    def __call__(self, frames: int, nbytes: int):
        import contextlib

        self.total = (frames, nbytes)
        return contextlib.nullcontext(lambda f, b: self.updates.append((f, b)))


@pytest.mark.parametrize("workers", [1, 3])
def test_progress_has_the_right_total_for_globs_datasets_samples_and_parallel_parts(
    tmp_path, photos, monkeypatch, workers
):
    """The bar showed '0/0 frames' on datasets and globs and the file size as total with --sample."""
    import hframe_cli.verify.many as many_mod
    import hframe_cli.verify.parallel as parallel_mod

    monkeypatch.setattr(parallel_mod, "PART_MIN_BYTES", 1)  # big packs' parts report from forked walkers
    a = make_pack(tmp_path, photos, "a.hframe", blobs=300)
    b = make_pack(tmp_path, photos, "b.hframe", blobs=10)
    h.pack([photos], tmp_path / "ds.hframe", max_pack_bytes=20_000)
    assert not (tmp_path / "ds.hframe").exists()
    payload = {p: sum(r["length"] for r in rows(p)) for p in (a, b)}
    shards = sorted(tmp_path.glob("ds-*.hframe"))
    shard_frames = sum(len(rows(s)) for s in shards)
    shard_bytes = sum(sum(r["length"] for r in rows(s)) for s in shards)

    bar = _Bar()
    rep = many_mod.verify_packs(
        [str(tmp_path / "?.hframe"), str(tmp_path / "ds.hframe")], workers=workers, progress=bar
    )
    assert rep.exit_code == 0 and len(rep.packs) == 2 + len(shards)
    want = (len(rows(a)) + len(rows(b)) + shard_frames, payload[a] + payload[b] + shard_bytes)
    assert bar.total == want
    assert bar.updates[-1] == want and bar.updates == sorted(bar.updates)  # ends at the total, never goes back
    assert len(bar.updates) > 2 + len(shards)  # progress within packs, not only at their ends

    # unclamped: what one pack's walkers (forked ones too) report adds up to what they checked
    deltas: list[tuple[int, int]] = []
    rep1 = verify_pack(a, workers=workers, on_progress=lambda f, n: deltas.append((f, n)))
    assert (sum(f for f, _ in deltas), sum(n for _, n in deltas)) == (rep1.frames_checked, rep1.bytes_checked)
    assert rep1.frames_checked == len(rows(a)) and all(f >= 0 and n >= 0 for f, n in deltas)

    bar = _Bar()
    rep = many_mod.verify_packs([str(a)], sample=("count", 50), seed=3, progress=bar)
    assert bar.total is not None and bar.total[0] == rep.packs[0].frames_checked >= 50  # runs of neighbours
    assert bar.updates[-1] == bar.total
    bar = _Bar()
    many_mod.verify_packs([str(a)], frames=(10, 30), progress=bar)
    assert bar.total is not None and bar.total[0] == 20  # its bytes are estimated from the mean frame
    assert bar.updates[-1] == bar.total
    bar = _Bar()
    many_mod.verify_packs([str(a)], use_index=False, workers=workers, progress=bar)
    assert bar.total is not None and bar.total[0] == len(rows(a)) and bar.updates[-1] == bar.total


def test_a_glob_that_matches_nothing_says_so_once(cli, tmp_path):
    r = cli(["verify", str(tmp_path / "zz-*.hframe")])
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == f"{tmp_path}/zz-*.hframe: cannot verify: no file matches this pattern\n"
    doc = json.loads(cli(["verify", str(tmp_path / "zz-*.hframe"), "--json"]).stdout)
    assert doc["packs"][0]["index"] is None and doc["packs"][0]["error"] == "no file matches this pattern"
    r = cli(["verify", str(tmp_path / "none.hframe")])
    assert r.stderr == f"{tmp_path}/none.hframe: cannot verify: no such file\n"


def test_progress_of_a_truncated_pack_without_index_still_moves(tmp_path, photos):
    import hframe_cli.verify.many as many_mod

    pack = make_pack(tmp_path, photos, blobs=200)
    cut = tmp_path / "cut.hframe"
    cut.write_bytes(pack.read_bytes()[: pack.stat().st_size * 2 // 3])  # no trailer
    bar = _Bar()
    rep = many_mod.verify_packs([str(cut)], use_index=False, progress=bar)
    assert rep.exit_code == 1 and rep.packs[0].frames_checked > 0
    assert bar.total == (0, cut.stat().st_size - HEADER_SIZE)  # frames unknown, bytes bounded by the file
    assert bar.updates[-1][0] == rep.packs[0].frames_checked and bar.updates[-1][1] > 0


@pytest.mark.parametrize(("frames", "forks"), [(7, 0), (17, 2), (40, 2)])
def test_a_pack_is_split_into_parts_of_at_least_8_mib(tmp_path, monkeypatch, frames, forks):
    """Parts pay from 16 MiB of data on (forking a walker costs what hashing a few MiB does):
    a 7 MiB pack is walked in one process, 17 MiB in two parts (each in its own forked walker),
    and never more parts than workers; every frame is checked either way."""
    import hframe_cli.verify.parallel as parallel_mod

    pack = random_blobs_pack(tmp_path / "p.hframe", frames, seed=frames)
    calls = []
    real_fork = os.fork

    def fork():
        calls.append(1)
        return real_fork()

    monkeypatch.setattr(parallel_mod.os, "fork", fork)
    rep = verify_pack(pack, workers=2)
    assert not rep.problems and rep.frames_checked == frames
    assert len(calls) == forks


def test_parts_are_taken_when_the_host_ignores_sigchld(tmp_path):
    """With SIGCHLD ignored the kernel reaps the walkers itself (no exit status to wait for):
    their reports still count, and damage in their parts is still found."""
    pack = random_blobs_pack(tmp_path / "p.hframe", 20, seed=5)
    rs = rows(pack)
    flip(pack, rs[15]["offset"] + 7)  # in the second part
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        rep = verify_pack(pack, workers=2)
    finally:
        signal.signal(signal.SIGCHLD, old)
    assert rep.frames_checked == 20 and rep.bad_frames == [15], rep.problems


def test_a_pack_cut_short_under_the_walkers_maps_is_reported_not_crashed(tmp_path, monkeypatch):
    """The parallel walkers read the pack through a map. A pack cut short while they walk it
    kills a walker with SIGBUS (a real one: here each walker cuts the file right after mapping
    it); its part is walked again in the parent with reads, which report the pack as it is now
    (frames missing, not a crash)."""
    import hframe_cli.verify.parallel as parallel_mod
    import hframe_cli.verify.walk as walk_mod

    pack = random_blobs_pack(tmp_path / "p.hframe", 20, seed=7)
    size = pack.stat().st_size
    real_map = walk_mod.Verifier._map

    def map_then_cut(self):
        faulthandler.disable()  # (in the walker: pytest's handler would print its SIGBUS)
        m = real_map(self)
        if m is not None and len(m) == size:  # (the whole pack mapped: cut it under the map)
            os.truncate(pack, size // 3)
        return m

    statuses = []
    real_reap = parallel_mod.reap

    def reap(pid):
        statuses.append(real_reap(pid))
        return statuses[-1]

    monkeypatch.setattr(walk_mod.Verifier, "_map", map_then_cut)
    monkeypatch.setattr(parallel_mod, "reap", reap)
    rep = verify_pack(pack, workers=2)
    assert any(os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGBUS for s in statuses), statuses
    assert not rep.ok and rep.frames_checked < 20
    assert any("missing" in p.message or "end" in p.message for p in rep.problems), rep.problems


@pytest.mark.parametrize("use_index", [True, False])
def test_a_walk_through_a_map_goes_a_chunk_at_a_time(tmp_path, monkeypatch, use_index):
    """Through a map the whole pack is in memory at once, but a run of sound frames still stops
    every chunk (``_Window.bound``): progress is reported, and signals taken, as the walk goes,
    not once at the end of a part; every frame is checked and a flipped byte found."""
    import mmap

    import hframe_cli.verify.walk as walk_mod

    pack = random_blobs_pack(tmp_path / "p.hframe", 80, seed=11, size=256 << 10)
    flip(pack, rows(pack)[70]["offset"] + 3)
    maps = []

    def mapped(self):  # (in this process: what the forked walkers do)
        maps.append(mmap.mmap(self.storage.fileno(), 0, prot=mmap.PROT_READ))
        return maps[-1]

    monkeypatch.setattr(walk_mod, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(walk_mod.Verifier, "_map", mapped)
    updates = []
    rep = verify_pack(pack, workers=1, use_index=use_index, on_progress=lambda f, b: updates.append((f, b)))
    assert maps, "the walk did not read through the map"
    assert rep.frames_checked == 80 and rep.bad_frames == [70], rep.problems
    assert len([u for u in updates if u[0]]) >= 15  # 20 MiB a chunk (1 MiB) at a time, not one report
