"""Crafted and damaged input: every one gets a one-line answer with its documented exit code
(1 for bad data, 2 for bad input) from the command, and an hframe exception from the library;
never "internal error", a raw OSError or a traceback. Each input is made here, in the test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hframe_cli as h
from hframe_cli.errors import HframeError
from hframe_cli.format.layout import HEADER_SIZE, RECORD_FIXED, Header, encode_record, record_fields
from hframe_cli.write.writer import PackWriter

FIELDS = (
    "magic",
    "size",
    "frame_id",
    "length",
    "raw_length",
    "md5",
    "mtime_ns",
    "codec",
    "kind",
    "name_len",
    "extra_len",
    "flags",
    "crc",
)


def small_pack(path: Path, names: list[bytes] | None = None) -> Path:
    names = names or [b"a.bin", b"b.bin", b"c.bin"]
    with PackWriter(path) as w:
        for i, name in enumerate(names):
            w.add(name, bytes([i % 256]) * (100 + i))
        w.seal()
        w.publish()
    return path


def record_offset(pack: Path, frame_id: int) -> int:
    return pq.read_table(f"{pack}.index.parquet").column("record_offset")[frame_id].as_py()


def rewrite_record(pack: Path, frame_id: int, **changes: int) -> None:
    """Change fixed fields of a record header and give it a valid CRC: a crafted record that
    every checksum accepts."""
    data = bytearray(pack.read_bytes())
    at = record_offset(pack, frame_id)
    f = dict(zip(FIELDS, record_fields(data, at)))
    f.update(changes)
    body = bytes(data[at + RECORD_FIXED : at + RECORD_FIXED + f["name_len"] + f["extra_len"]])
    name, extra = body[: f["name_len"]], body[f["name_len"] :]
    new = encode_record(
        f["size"],
        f["frame_id"],
        f["length"],
        f["raw_length"],
        f["md5"],
        f["mtime_ns"],
        f["codec"],
        f["kind"],
        name,
        extra,
        f["flags"],
    )
    data[at : at + len(new)] = new
    pack.write_bytes(bytes(data))


def rewrite_index_column(pack: Path, column: str, row: int, value: object) -> None:
    index = Path(f"{pack}.index.parquet")
    table = pq.read_table(index)
    values = table.column(column).to_pylist()
    values[row] = value
    i = table.schema.get_field_index(column)
    table = table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))
    pq.write_table(table, index)


def one_line_error(r, code: int) -> str:
    assert r.exit_code == code, (r.exit_code, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hframe: error: "), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"codec": 99}, "codec 99"),
        ({"kind": 65535}, "kind 65535"),
        ({"raw_length": 1 << 63}, "raw length"),
        ({"length": (1 << 64) - 1}, "length"),
    ],
)
def test_a_record_with_a_valid_crc_but_impossible_fields_is_bad_data(tmp_path, cli, changes, says):
    pack = small_pack(tmp_path / "p.hframe")
    rewrite_record(pack, 1, **changes)
    line = one_line_error(cli(["index", str(pack), "--rebuild"]), 1)
    assert "frame 1" in line and says in line
    with pytest.raises(HframeError, match=says):
        h.rebuild_index(pack, tmp_path / "rebuilt.parquet")
    r = cli(["verify", str(pack)])
    assert r.exit_code == 1 and "internal error" not in r.stderr
    r = cli(["verify", str(pack), "--no-index"])
    assert r.exit_code == 1 and "internal error" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("created_us", [(1 << 63) - 1, -(1 << 63)])
def test_an_extreme_creation_time_is_shown_not_a_crash(tmp_path, cli, created_us):
    pack = small_pack(tmp_path / "p.hframe")
    data = bytearray(pack.read_bytes())
    old = Header.decode(bytes(data[:HEADER_SIZE]), "p")
    data[:HEADER_SIZE] = Header(old.uuid, created_us, old.alignment, old.version, old.flags).encode()
    pack.write_bytes(bytes(data))
    r = cli(["dump-header", str(pack), "--json"])
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert str(created_us) in r.stdout
    r = cli(["index", str(pack), "--rebuild"])
    assert r.exit_code == 0, r.stderr
    assert pq.read_table(f"{pack}.index.parquet").num_rows == 3


def test_a_negative_length_in_the_index_is_out_of_range(tmp_path, cli):
    pack = small_pack(tmp_path / "p.hframe")
    rewrite_index_column(pack, "length", 1, -5)
    line = one_line_error(cli(["get", str(pack), "1"]), 1)
    assert "frame 1" in line and "length -5" in line
    with h.open_pack(pack) as reader:
        assert reader.read(0) == b"\0" * 100
        for workers in (1, 4):
            with pytest.raises(HframeError, match="frame 1"):
                reader.read_many([0, 1], workers=workers)
        with pytest.raises(HframeError, match="frame 1"):
            reader.read_stored(1)
    assert cli(["verify", str(pack)]).exit_code == 1


def test_a_name_that_cannot_be_a_file_name_is_one_line(tmp_path, cli):
    pack = small_pack(tmp_path / "p.hframe", [b"a.bin", b"b\0c.bin", b"d.bin"])
    line = one_line_error(cli(["get", str(pack), "--match", "*", "-o", str(tmp_path / "out")]), 2)
    assert "NUL" in line
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "out").rglob("*"))


def huge_zstd_pack(path: Path, raw_size: int) -> Path:
    """One legal zstd frame of ``raw_size`` zero bytes (a few KB stored), as a bomb would be."""
    import hashlib

    import zstandard as zstd

    raw = bytes(raw_size)
    stored = zstd.ZstdCompressor(level=1).compress(raw)
    with PackWriter(path) as w:
        w.add(b"small.bin", b"x" * 10)
        w.add(b"zeros.bin", stored, raw_length=raw_size, codec=1, md5=hashlib.md5(raw).digest(), kind=2)
        w.seal()
        w.publish()
    return path


def test_verify_hashes_a_huge_compressed_frame_in_bounded_memory(tmp_path):
    """A pack of a few KB that declares 768 MiB: verify checks it (md5 and all) in pieces; the
    process never holds the whole frame."""
    import subprocess
    import sys

    pack = huge_zstd_pack(tmp_path / "bomb.hframe", 768 << 20)
    assert pack.stat().st_size < 1 << 20
    # VmHWM, not getrusage: Linux carries ru_maxrss across exec, so a child of a big test process
    # would report its parent's size
    code = (
        "from hframe_cli.verify.check import verify_pack\n"
        f"r = verify_pack({str(pack)!r})\n"
        "hwm = next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
        "print(r.ok, r.frames_checked, hwm)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    ok, checked, peak_kib = out.stdout.split()
    assert ok == "True" and checked == "2"
    assert int(peak_kib) < 400 << 10, f"peak RSS {int(peak_kib) >> 10} MiB for a 768 MiB frame"


def test_a_frame_larger_than_memory_allows_is_one_line_exit_3(tmp_path):
    """Under a 1.5 GB address-space limit (a started hframe maps about 1 GB): get needs the
    whole 768 MiB frame and says it cannot have it; verify checks it in pieces and passes."""
    import resource
    import subprocess

    from conftest import hframe_bin

    pack = huge_zstd_pack(tmp_path / "big.hframe", 768 << 20)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1500 << 20, 1500 << 20))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [hframe_bin(), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=limit)

    r = run("get", str(pack), "1", "-o", str(tmp_path / "z"))
    assert r.returncode == 3, r.stderr
    assert "frame 1: not enough memory to decompress its 805306368 bytes" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "z").exists()
    r = run("verify", str(pack))
    assert r.returncode == 0, r.stderr + r.stdout


def test_one_glob_rule_a_newline_in_a_name_is_matched_by_star(tmp_path, cli):
    names = [b"a.bin", b"line\nbreak.bin", b"q\n.bin", b"z.bin"]
    pack = small_pack(tmp_path / "p.hframe", names)
    r = cli(["get", str(pack), "--match", "*", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name.encode() for p in (tmp_path / "out").iterdir()) == sorted(names)
    r = cli(["index", str(pack), "--name", "q?.bin", "-f", "jsonl", "-c", "frame_id"])
    assert [json.loads(line)["frame_id"] for line in r.stdout.splitlines()] == [2]
    # the same rule as pack --include
    src = tmp_path / "src"
    src.mkdir()
    for n in names:
        (src / os.fsdecode(n)).write_bytes(n)
    r = cli(["pack", str(src), "-o", str(tmp_path / "inc.hframe"), "--include", "*break*", "-q"])
    assert r.exit_code == 0 and h.open_pack(tmp_path / "inc.hframe").table.column("name").to_pylist() == [
        "line\nbreak.bin"
    ]


def test_a_non_utf8_name_as_index_prints_it_is_accepted_back(tmp_path, cli):
    pack = small_pack(tmp_path / "p.hframe", [b"bad\xff\xfe.png", b"good.png"])
    r = cli(["index", str(pack), "-c", "name", "--no-header", "-f", "csv"])
    shown = r.stdout.splitlines()[0]
    assert shown == "bad\\xff\\xfe.png"
    r = cli(["get", str(pack), shown])
    assert r.exit_code == 0 and r.stdout_bytes == b"\0" * 100
    r = cli(["get", str(pack), "--match", shown.replace("\\xfe", "*"), "-o", str(tmp_path / "o")])
    assert r.exit_code == 0 and (tmp_path / "o" / os.fsdecode(b"bad\xff\xfe.png")).read_bytes() == b"\0" * 100
    # a UTF-8 name that is literally the escaped text wins over the escape
    pack2 = small_pack(tmp_path / "q.hframe", [b"bad\\xff.png", b"bad\xff.png"])
    with h.open_pack(pack2) as reader:
        assert reader.frame_id("bad\\xff.png") == 0 and reader.frame_id(b"bad\xff.png") == 1


def jpeg_with_corrupt_exif() -> bytes:
    """A JPEG that decodes, whose EXIF segment promises more than it holds (Pillow warns)."""
    import io

    from PIL import Image

    b = io.BytesIO()
    Image.new("RGB", (16, 16), "red").save(b, "JPEG")
    jpeg = b.getvalue()
    seg = b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x05" + b"\xff" * 40
    return jpeg[:2] + b"\xff\xe1" + (len(seg) + 2).to_bytes(2, "big") + seg + jpeg[2:]


def test_pillow_warnings_stay_out_of_stderr_and_errors_name_the_file(tmp_path, cli):
    src = tmp_path / "src"
    src.mkdir()
    (src / "exif.jpg").write_bytes(jpeg_with_corrupt_exif())
    pack = tmp_path / "p.hframe"
    r = cli(["pack", str(src), "-o", str(pack), "-q"])
    assert r.exit_code == 0 and r.stderr == ""
    from conftest import run_bin  # a real process: pytest would catch the warning itself

    r = run_bin(["verify", str(pack), "--decode", "-q"])
    assert r.returncode == 0 and r.stderr == b"", r.stderr  # the image decodes: nothing to say
    (src / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    r = cli(["pack", str(src), "-o", str(tmp_path / "q.hframe"), "--strict-images"])
    line = one_line_error(r, 2)
    assert "garbage.png" in line and "BytesIO" not in line and "0x" not in line


def test_no_flipped_byte_in_an_index_passes_as_clean(tmp_path, cli):
    """Every page has a CRC and the file its md5: a flip anywhere (pages, page headers, the
    footer, the md5's own key or digits) is a problem of the index, never exit 0."""
    from hframe_cli.verify.check import verify_pack

    pack = small_pack(tmp_path / "p.hframe", [f"{i:03d}.bin".encode() for i in range(40)])
    index = Path(f"{pack}.index.parquet")
    good = index.read_bytes()
    assert verify_pack(pack).ok
    footer_start = len(good) - 8 - int.from_bytes(good[-8:-4], "little")
    positions = sorted({*range(0, len(good), 23), *range(footer_start, len(good))})
    passed = []
    for pos in positions:
        bad = bytearray(good)
        bad[pos] ^= 0x20
        index.write_bytes(bytes(bad))
        try:
            report = verify_pack(pack)
        except HframeError:
            continue  # cannot be read at all: the command says so (exit 1 or 2)
        if report.ok:
            passed.append(pos)
    assert passed == [], f"{len(passed)} of {len(positions)} flips passed as clean, at {passed[:10]}"
    index.write_bytes(good)
    bad = bytearray(good)
    bad[len(good) // 2] ^= 1
    index.write_bytes(bytes(bad))
    r = cli(["verify", str(pack)])
    assert r.exit_code in (1, 2) and "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_verify_checks_frame_id_kind_and_mtime_columns(tmp_path, cli):
    """An index rewritten with another tool (no md5 of its own) is still compared with the
    records: frame ids are row numbers, kind and source_mtime are the records'."""
    pack = small_pack(tmp_path / "p.hframe", [f"{i:03d}.bin".encode() for i in range(10)])
    index = Path(f"{pack}.index.parquet")
    good = pq.read_table(index)
    for column, row, value, says in (
        ("frame_id", 4, -8174439530702664010, "row 4 has frame_id -8174439530702664010"),
        ("kind", 6, "image", "index kind image disagrees"),
        ("source_mtime", 2, 1_000_000, "index source_mtime 1970-01-01T00:00:01.000000Z disagrees"),
    ):
        pq.write_table(good, index)
        rewrite_index_column(pack, column, row, value)
        r = cli(["verify", str(pack), "--json"])
        problems = json.loads(r.stdout)["packs"][0]["problems"]
        assert r.exit_code == 1 and [p["frame_id"] for p in problems] == [row], (column, problems)
        assert says in problems[0]["message"], problems[0]["message"]


def dictionary_pack(tmp_path: Path, cli) -> Path:
    from conftest import make_records

    src = make_records(tmp_path / "rec", n=200)
    pack = tmp_path / "d.hframe"
    r = cli(["pack", str(src), "-o", str(pack), "-q", "--compress", "zstd", "--zstd-dict", "auto"])
    assert r.exit_code == 0, r.stderr
    with h.open_pack(pack) as reader:
        assert reader.table.column("codec").to_pylist().count("zstd") > 150
    return pack


def test_a_damaged_header_of_a_dictionary_pack_is_one_problem_not_every_frame(tmp_path, cli):
    from hframe_cli.verify.check import verify_pack

    pack = dictionary_pack(tmp_path, cli)
    good = pack.read_bytes()
    for pos in range(0, HEADER_SIZE, 3):
        bad = bytearray(good)
        bad[pos] ^= 0x10
        pack.write_bytes(bytes(bad))
        try:
            report = verify_pack(pack)
        except HframeError as e:  # not a pack at all (the magic), or another major version
            assert pos < 12, (pos, e)
            continue
        assert not report.ok, pos
        assert {p.check for p in report.problems} == {"header"}, (pos, [p.message for p in report.problems][:3])
        assert report.frames_checked == report.frames_total, pos


def test_a_damaged_dictionary_record_leaves_the_other_frames_unblamed(tmp_path, cli):
    from hframe_cli.verify.check import verify_pack

    pack = dictionary_pack(tmp_path, cli)
    data = bytearray(pack.read_bytes())
    first_payload = pq.read_table(f"{pack}.index.parquet").column("offset")[0].as_py()
    data[first_payload - 100] ^= 0x01  # inside record 0's header: its extra field holds the dictionary
    pack.write_bytes(bytes(data))
    report = verify_pack(pack)
    assert not report.ok
    assert {p.frame_id for p in report.problems} == {0}, [p.message for p in report.problems][:5]
    assert any("dictionary" in p.message for p in report.problems)
    assert 0 < report.frames_checked < report.frames_total  # those needing the dictionary: not checked


def test_no_index_with_a_damaged_trailer_magic_blames_no_frame(tmp_path):
    from hframe_cli.format.layout import TRAILER_SIZE
    from hframe_cli.verify.check import verify_pack

    pack = small_pack(tmp_path / "p.hframe", [f"{i:03d}.bin".encode() for i in range(283)])
    good = pack.read_bytes()
    for pos in range(len(good) - TRAILER_SIZE, len(good), 5):
        bad = bytearray(good)
        bad[pos] ^= 0x01
        pack.write_bytes(bytes(bad))
        report = verify_pack(pack, use_index=False)
        assert not report.ok, pos
        assert {p.frame_id for p in report.problems} == {None}, (pos, [p.message for p in report.problems][:3])
        assert report.frames_checked == 283 and report.frames_total == 283, pos


def test_the_flip_campaign_script_runs_and_finds_everything(tmp_path):
    """A short run of scripts/flip_campaign.py (the full run's figures are in the CHANGELOG)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "flip_campaign.py"
    args = ["--flips", "15", "--index-flips", "5", "--footer-flips", "10", "--first-record-bytes", "16", "--seed", "3"]
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "w"), *args], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    total = r.stdout.strip().splitlines()[-1]
    assert "missed=0 false_alarms=0 crashes=0" in total and "result=PASS" in total
    assert r.stdout.count("part=index") == 3 and r.stdout.count("part=pack-no-index") == 3


def test_a_damaged_index_footer_is_an_index_problem_and_the_frames_are_still_checked(tmp_path, cli):
    pack = small_pack(tmp_path / "p.hframe", [f"{i:03d}.bin".encode() for i in range(12)])
    index = Path(f"{pack}.index.parquet")
    data = bytearray(index.read_bytes())
    data[-1] ^= 0xFF  # the closing PAR1: pyarrow cannot even find the footer
    index.write_bytes(bytes(data))
    r = cli(["verify", str(pack)])
    assert r.exit_code == 1, (r.stdout, r.stderr)
    assert "not a readable Parquet index" in r.stdout and "12 of 12 frames checked (full, no-index)" in r.stdout
    r = cli(["verify", str(pack), "--sample", "50%"])
    assert r.exit_code == 1 and "not a readable Parquet index" in r.stdout


def test_max_errors_keeps_the_earliest_problem_across_chunk_boundaries(tmp_path, monkeypatch):
    """Damage in frame k (md5) and k + 1 (magic), with --max-errors 1: frame k is the one told,
    wherever the chunk boundaries fall."""
    from conftest import make_photos

    from hframe_cli.verify import check as V
    from hframe_cli.verify import walk as walk_mod

    photos = make_photos(tmp_path / "photos", 24)
    pack = tmp_path / "p.hframe"
    h.pack([photos], pack)
    rows = pq.read_table(f"{pack}.index.parquet").to_pylist()
    good = pack.read_bytes()
    monkeypatch.setattr(walk_mod, "CHUNK_BYTES", 4096)
    for k in range(len(rows) - 1):
        bad = bytearray(good)
        bad[rows[k]["offset"] + rows[k]["length"] // 2] ^= 0x01
        bad[rows[k + 1]["offset"]] ^= 0x01
        pack.write_bytes(bytes(bad))
        report = V.verify_pack(pack, max_errors=1)
        assert [p.frame_id for p in report.problems] == [k], (k, [p.message for p in report.problems])
    pack.write_bytes(good)


def test_no_index_names_a_frame_cut_short_where_a_trailer_would_sit(tmp_path):
    from hframe_cli.format.layout import TRAILER_SIZE
    from hframe_cli.verify.check import verify_pack

    pack = small_pack(tmp_path / "p.hframe", [f"{i:03d}.bin".encode() for i in range(30)])
    cut = record_offset(pack, 20) + TRAILER_SIZE
    pack.write_bytes(pack.read_bytes()[:cut])
    report = verify_pack(pack, use_index=False)
    assert 20 in {p.frame_id for p in report.problems}, [p.message for p in report.problems]


def test_glob_sets_mean_the_same_in_every_command():
    import fnmatch
    import re

    from hframe_cli.format.index import glob_to_regex

    names = ["^x", "bx", "ax", "a\nb", "[x", "\\x", "a\\b", "cats/001.jpg"]
    for glob in ("[^a]*", "[!a]*", "[\\]*", "*", "?x", "cats/*", "[a-c]*", "[]x]*"):
        rx = re.compile(glob_to_regex(glob))
        assert [bool(rx.match(n)) for n in names] == [fnmatch.fnmatchcase(n, glob) for n in names], glob
