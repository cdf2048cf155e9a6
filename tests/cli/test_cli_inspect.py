"""``hframe get``, ``index`` and ``dump-header``: exact bytes, row formats, header views."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
from conftest import hframe_bin, run_bin

import hframe_cli as h


def test_get_by_id_and_name(cli, packed, photos, tmp_path):
    r = cli(["get", str(packed), "0"])
    first = pq.read_table(f"{packed}.index.parquet").column("name")[0].as_py()
    assert r.exit_code == 0 and r.stdout_bytes == (photos / first).read_bytes() and r.stderr == ""
    out = tmp_path / "b.jpg"
    r = cli(["get", str(packed), "cats/003.jpg", "-o", str(out)])
    assert r.exit_code == 0 and out.read_bytes() == (photos / "cats/003.jpg").read_bytes()


def test_get_refuses_a_terminal_and_unknown_frames(cli, packed):
    r = cli(["get", str(packed), "0"], env={"HFRAME_TTY": "1"})
    assert r.exit_code == 2 and r.stdout_bytes == b""
    assert "refusing to write binary frame data to a terminal; redirect stdout or use -o FILE" in r.stderr
    r = cli(["get", str(packed), "99"])
    assert r.exit_code == 2 and "frame 99 does not exist (pack has 30 frames, ids 0..29)" in r.stderr
    r = cli(["get", str(packed), "12", "--name"])
    assert r.exit_code == 2 and "no frame named '12'" in r.stderr


def test_index_tsv_on_a_pipe_with_columns_and_glob(cli, packed):
    r = cli(["index", str(packed), "--columns", "frame_id,name,md5", "--name", "cats/*.png"])
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0] == "frame_id\tname\tmd5"
    rows = [line.split("\t") for line in lines[1:]]
    t = pq.read_table(f"{packed}.index.parquet").to_pylist()
    want = [
        [str(x["frame_id"]), x["name"], x["md5"]]
        for x in t
        if x["name"].startswith("cats/") and x["name"].endswith(".png")
    ]
    assert rows == want and rows


def test_index_csv_and_jsonl_match_parquet(cli, packed):
    t = pq.read_table(f"{packed}.index.parquet").to_pylist()
    r = cli(["index", str(packed), "-f", "csv", "-c", "name,offset,length"])
    got = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(g["name"], int(g["offset"]), int(g["length"])) for g in got] == [
        (x["name"], x["offset"], x["length"]) for x in t
    ]
    r = cli(["index", str(packed), "-f", "jsonl"])
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["md5"] for d in docs] == [x["md5"] for x in t]
    assert docs[0]["source_mtime"].endswith("Z") and docs[0]["width"] is not None and docs[0]["split"] is None
    r = cli(["index", str(packed), "-f", "json", "-c", "frame_id,md5"])
    assert json.loads(r.stdout) == [{"frame_id": x["frame_id"], "md5": x["md5"]} for x in t]


def test_index_escapes_tabs_and_newlines_in_tsv(cli, tmp_path):
    src = tmp_path / "s"
    src.mkdir()
    (src / "a\tb\nc.bin").write_bytes(b"x")
    out = tmp_path / "t.hframe"
    h.pack([src], out)
    r = cli(["index", str(out), "-c", "name", "--no-header"])
    assert r.stdout == "a\\tb\\nc.bin\n"


def test_index_on_a_terminal_is_a_readable_table_that_says_how_to_see_the_rest(cli, packed):
    t = pq.read_table(f"{packed}.index.parquet").to_pylist()
    r = cli(["index", str(packed)], env={"HFRAME_TTY": "1"})
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    # the columns that hold a value (no split, no pts_s in this pack), the name last
    assert lines[0].split() == ["frame_id", "length", "media_type", "width", "height", "label", "name"]
    assert len(lines) == 1 + len(t)
    for line, row in zip(lines[1:], t):
        want = [
            row["frame_id"],
            row["length"],
            row["media_type"],
            row["width"],
            row["height"],
            row["label"],
            row["name"],
        ]
        assert line.split() == [str(v) for v in want]
    # aligned: every row's name starts where the header's does; numbers are right-aligned
    start = lines[0].index("name")
    assert all(line[start:] == row["name"] for line, row in zip(lines[1:], t))
    width = len("frame_id")
    assert [line[:width] for line in lines[1:3]] == [f"{0:>{width}}", f"{1:>{width}}"]
    assert r.stderr == (
        f"hframe: {len(t)} frames; 7 of 22 columns shown; more with -c (e.g. -c name,offset,md5), all with -f tsv\n"
    )
    # chosen columns: those, in that order (the name still last), no hint; --no-header drops the header
    r = cli(["index", str(packed), "-c", "name,md5", "--no-header"], env={"HFRAME_TTY": "1"})
    assert r.stderr == "" and r.stdout.splitlines()[0] == f"{t[0]['md5']}  {t[0]['name']}"
    # -f table is the table on a pipe too; a pipe's default stays the full TSV
    assert (
        cli(["index", str(packed), "-f", "table"]).stdout == cli(["index", str(packed)], env={"HFRAME_TTY": "1"}).stdout
    )
    assert cli(["index", str(packed)]).stdout.splitlines()[0].count("\t") == 21


def test_index_table_escapes_control_characters_and_streams_in_chunks(tmp_path):
    from hframe_cli.cli import rows

    src = tmp_path / "s"
    src.mkdir()
    (src / "evil\x1b[2Jname.bin").write_bytes(b"x")
    for i in range(2500):
        (src / f"f{i:04d}.bin").write_bytes(b"y")
    out = tmp_path / "t.hframe"
    h.pack([src], out)
    with h.open_pack(out) as p:
        table = p.table.select(["frame_id", "name"])

    class Recorder(io.StringIO):
        writes = 0

        def write(self, text: str) -> int:
            self.writes += 1
            return super().write(text)

    stream = Recorder()
    rows.write_rows(table, "table", stream)
    lines = stream.getvalue().splitlines()
    assert "\x1b" not in stream.getvalue() and lines[1].endswith("evil\\x1b[2Jname.bin")
    assert len(lines) == 2502 and stream.writes == 1 + 3  # the header, then one write per 1024 rows


def test_index_unknown_column_lists_valid_ones(cli, packed):
    r = cli(["index", str(packed), "-c", "name,colour"])
    assert r.exit_code == 2 and "unknown column 'colour' (columns: frame_id, name," in r.stderr
    r = cli(["index", str(packed), "-f", "xml"])
    assert r.exit_code == 2 and "xml" in r.stderr


def test_index_rebuild_recovers_a_lost_index(cli, packed):
    idx = Path(f"{packed}.index.parquet")
    before = cli(["index", str(packed), "-f", "jsonl"]).stdout
    idx.unlink()
    r = cli(["index", str(packed)])
    assert r.exit_code == 2 and "index not found (rebuild it with 'hframe index PACK --rebuild')" in r.stderr
    r = cli(["index", str(packed), "--rebuild"])
    assert r.exit_code == 0 and r.stderr == f"hframe: rebuilt {idx}: 30 frames\n"
    assert cli(["index", str(packed), "-f", "jsonl"]).stdout == before


def test_dump_header_plain_and_json(cli, packed):
    r = cli(["dump-header", str(packed)])
    assert r.exit_code == 0
    fields = dict(line.split("\t", 1) for line in r.stdout.splitlines())
    assert fields["header.magic"] == "89 48 46 52 41 4d 45 0a"
    assert fields["complete"] == "true" and fields["trailer.frame_count"] == "30"
    assert fields["index.pack_uuid"] == fields["header.uuid"]
    doc = json.loads(cli(["dump-header", str(packed), "--json"]).stdout)
    assert doc["ok"] is True and doc["header"]["format_version"] == "1.1"  # image metadata in record extras
    assert doc["trailer"]["data_end"] == packed.stat().st_size - 64


def test_dump_header_frame_hex(cli, packed):
    r = cli(["dump-header", str(packed), "--frame", "cats/003.jpg", "--bytes", "4"])
    assert r.exit_code == 0
    first, dump = r.stdout.splitlines()
    assert first.startswith("frame ") and first.endswith("index type jpeg, sniffed jpeg")
    assert dump.split("  ")[1].strip() == "ff d8 ff e0"
    doc = json.loads(cli(["dump-header", str(packed), "--frame", "0", "--bytes", "8", "--json"]).stdout)
    assert doc["frame_id"] == 0 and len(bytes.fromhex(doc["hex"].replace(" ", ""))) == 8


def test_dump_header_index_mismatch_exits_1(cli, packed, photos, tmp_path):
    other = tmp_path / "o.hframe"
    h.pack([photos], other)
    Path(f"{other}.index.parquet").replace(f"{packed}.index.parquet")
    r = cli(["dump-header", str(packed), "--json"])
    assert r.exit_code == 1
    assert "index does not belong to this pack" in json.loads(r.stdout)["index_problem"]


def test_installed_command_end_to_end_with_pipes(photos, tmp_path):
    out = tmp_path / "e.hframe"
    listing = "\n".join(str(p) for p in sorted(photos.rglob("*.jpg"))).encode()
    r = run_bin(["pack", "-", "-o", str(out), "--base", str(photos)], input=listing)
    assert r.returncode == 0 and b"self-check of 20 frames ok" in r.stderr and r.stdout == b""
    r = run_bin(["get", str(out), "cats/003.jpg"])
    assert r.returncode == 0 and r.stdout == (photos / "cats/003.jpg").read_bytes()
    r = run_bin(["get", str(out), "nope"])
    assert r.returncode == 2 and r.stderr.decode().count("\n") == 1 and b"Traceback" not in r.stderr
    r = run_bin(["--debug", "get", str(out), "nope"])
    assert r.returncode != 0 and b"Traceback" in r.stderr
    r = run_bin(["--version"])
    assert r.returncode == 0 and r.stdout.decode().startswith(f"hframe {h.__version__} (compiled: ")
    assert r.stdout.count(b"\n") == 1  # one line: scripts read the version from it


def _pack_of_tiny_frames(tmp_path: Path, n: int) -> Path:
    """A pack of ``n`` tiny frames named 00000.bin ...: listings and reports longer than a pipe holds."""
    src = tmp_path / "many"
    src.mkdir()
    for i in range(n):
        (src / f"{i:05d}.bin").write_bytes(b"frame %05d" % i)
    out = tmp_path / "many.hframe"
    assert run_bin(["pack", str(src), "-o", str(out), "-q"]).returncode == 0
    return out


def test_installed_command_flushes_everything_and_a_closed_pipe_is_not_an_error(tmp_path):
    """The console script skips interpreter teardown (os._exit): all output must still arrive;
    a reader that stops early (``| head``) ends the command quietly with exit 0."""
    out = _pack_of_tiny_frames(tmp_path, 3000)
    r = run_bin(["index", str(out), "--format", "jsonl"])  # ~600 KB: many buffer flushes
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 0 and len(lines) == 3000 and json.loads(lines[-1])["name"] == "02999.bin"
    env = {**os.environ, "HFRAME_TTY": "0"}
    proc = subprocess.Popen([hframe_bin(), "index", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"frame_id\t")
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and err == b""


def test_verify_keeps_its_verdict_when_the_reader_stops_early_and_survives_closed_streams(tmp_path):
    """`hframe verify bad --jsonl | head -1` still exits 1 (problems found); a closed stdout or
    stderr (`>&-`) is no reason for a traceback: what would go there goes nowhere."""
    out = _pack_of_tiny_frames(tmp_path, 3000)
    env = {**os.environ, "HFRAME_TTY": "1"}  # rich tables (and a progress bar) on a pipe closed at once
    proc = subprocess.Popen([hframe_bin(), "verify", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and b"Traceback" not in err and b"error" not in err, err
    data = bytearray(out.read_bytes())
    for r in pq.read_table(f"{out}.index.parquet", columns=["offset"]).to_pylist()[:2000]:
        data[r["offset"]] ^= 0xFF  # 2000 bad frames: far more JSONL than a pipe buffer holds
    out.write_bytes(bytes(data))
    env = {**os.environ, "HFRAME_TTY": "0"}
    proc = subprocess.Popen(
        [hframe_bin(), "verify", str(out), "--jsonl"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert json.loads(proc.stdout.readline())["check"] == "md5"
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == b""
    for fd, args in ((1, ["dump-header", str(out)]), (2, ["dump-header", str(out)]), (1, ["verify", str(out), "-q"])):
        r = subprocess.run(
            [hframe_bin(), *args],
            capture_output=False,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=lambda fd=fd: os.close(fd),
            timeout=120,
        )
        assert r.returncode == (1 if args[0] == "verify" else 0), (fd, args)


def test_get_into_a_missing_folder_is_one_line_exit_2(cli, packed, tmp_path):
    r = cli(["get", str(packed), "0", "-o", str(tmp_path / "no" / "such" / "x.png")])
    assert r.exit_code == 2
    assert r.stderr == f"hframe: error: {tmp_path / 'no' / 'such' / 'x.png'}: cannot write: No such file or directory\n"
    assert not list((tmp_path).glob("**/*.partial"))


def test_get_dash_is_stdout_no_clobber_and_an_empty_selection_is_exit_2(cli, packed, photos, tmp_path):
    first = pq.read_table(f"{packed}.index.parquet").column("name")[0].as_py()
    r = run_bin(["get", str(packed), "0", "-o", "-"], cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == (photos / first).read_bytes() and not (tmp_path / "-").exists()
    out = tmp_path / "a.jpg"
    out.write_bytes(b"keep me")
    r = cli(["get", str(packed), "0", "-o", str(out), "--no-clobber"])
    assert r.exit_code == 2 and r.stderr == f"hframe: error: {out}: already exists (--no-clobber)\n"
    assert out.read_bytes() == b"keep me" and not Path(f"{out}.partial").exists()
    assert cli(["get", str(packed), "0", "-o", str(out)]).exit_code == 0  # the default: replace
    assert out.read_bytes() == (photos / first).read_bytes()
    folder = tmp_path / "cats"
    assert cli(["get", str(packed), "--label", "cats", "-o", str(folder), "-q"]).exit_code == 0
    (folder / "cats" / "003.jpg").write_bytes(b"mine")
    r = cli(["get", str(packed), "--label", "cats", "-o", str(folder), "--no-clobber"])
    assert r.exit_code == 2 and "already exists (--no-clobber); nothing was written" in r.stderr
    assert (folder / "cats" / "003.jpg").read_bytes() == b"mine"
    r = cli(["get", str(packed), "--label", "typo", "-o", str(tmp_path / "none")])
    assert r.exit_code == 2 and r.stderr == f"hframe: error: {packed}: no frame matches --label 'typo'\n"
    assert not (tmp_path / "none").exists()
    r = cli(["index", str(packed), "--split", "train"])
    assert r.exit_code == 2 and r.stderr == f"hframe: error: {packed}: no frame matches --split 'train'\n"
    assert r.stdout == ""


def test_version_short_flag(cli):
    for flag in ("-V", "--version"):
        r = cli([flag])
        assert r.exit_code == 0 and r.stdout.startswith(f"hframe {h.__version__} (compiled: ")


def test_get_many_frames_per_call_into_a_folder_or_one_tar_stream(cli, packed, photos, tmp_path):
    import tarfile

    names = pq.read_table(f"{packed}.index.parquet").column("name").to_pylist()
    # several ids and names in one call (what xargs hands over), into a folder
    r = cli(["get", str(packed), "0", "1", names[5], "-o", str(tmp_path / "out"), "-q"])
    assert r.exit_code == 0, r.stderr
    for n in (names[0], names[1], names[5]):
        assert (tmp_path / "out" / n).read_bytes() == (photos / n).read_bytes()
    # -T -: a list on stdin, as tar -T; to stdout as one tar stream any tool unpacks
    wanted = [names[3], "7", names[9]]
    r = run_bin(["get", str(packed), "-T", "-", "--format", "tar"], input="\n".join(wanted).encode())
    assert r.returncode == 0, r.stderr
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [names[3], names[7], names[9]]
        for m in members:
            assert tar.extractfile(m).read() == (photos / m.name).read_bytes()
    unpacked = tmp_path / "untar"
    unpacked.mkdir()
    subprocess.run(["tar", "xf", "-"], input=r.stdout, cwd=unpacked, check=True)
    assert (unpacked / names[9]).read_bytes() == (photos / names[9]).read_bytes()
    # -0 lists and filters into a tar file
    (tmp_path / "list0").write_bytes(b"\0".join(n.encode() for n in names[:2]))
    r = cli(["get", str(packed), "-T", str(tmp_path / "list0"), "-0", "-o", str(tmp_path / "two"), "-q"])
    assert r.exit_code == 0 and sorted(p.name for p in (tmp_path / "two").rglob("*") if p.is_file()) == sorted(
        Path(n).name for n in names[:2]
    )
    r = cli(["get", str(packed), "--label", "cats", "--format", "tar", "-o", str(tmp_path / "cats.tar")])
    assert r.exit_code == 0, r.stderr
    with tarfile.open(tmp_path / "cats.tar") as tar:
        assert all(m.name.startswith("cats/") for m in tar.getmembers()) and len(tar.getmembers()) > 1
    # several frames need somewhere to go
    r = cli(["get", str(packed), "0", "1"])
    assert r.exit_code == 2 and "several frames: give -o FOLDER, or --format tar" in r.stderr
    r = cli(["get", str(packed), "0", "nope", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "no frame named 'nope'" in r.stderr


def test_debug_is_accepted_after_the_command_too(tmp_path):
    """Errors say "rerun with --debug": adding it at the end of the line must work."""
    for args in (
        ["--debug", "get", str(tmp_path / "nope.hframe"), "1"],
        ["get", str(tmp_path / "nope.hframe"), "1", "--debug"],
    ):
        r = run_bin(args)
        assert r.returncode != 0 and b"Traceback" in r.stderr and b"No such option" not in r.stderr, r.stderr
    r = run_bin(["get", str(tmp_path / "nope.hframe"), "1"])
    assert r.returncode == 2 and b"Traceback" not in r.stderr


def test_index_table_never_cuts_a_number_and_aligns_escaped_and_wide_text():
    import pyarrow as pa

    from hframe_cli.cli import rows

    n = 6000
    table = pa.table(
        {
            "frame_id": pa.array(range(n), pa.int64()),
            "pts_s": pa.array([i * 2.0 for i in range(n)], pa.float64()),  # past 10,000 after row 4,096
            "label": pa.array(["x\\y" if i % 2 else "猫猫猫" for i in range(n)]),
            "name": pa.array([f"n{i}" for i in range(n)]),
        }
    )
    out = io.StringIO()
    rows.write_rows(table, "table", out)
    lines = out.getvalue().splitlines()
    assert lines[-1].split() == ["5999", "11998.0", "x\\\\y", "n5999"]  # not "11998…", not "x\\…"
    starts = {rows.display_width(line[: line.index(" n")]) for line in lines[1:]}
    assert len(starts) == 1  # the name column starts at the same terminal column on every row


def test_index_of_an_empty_pack_shows_the_header_and_says_zero_frames(cli, tmp_path):
    from hframe_cli.write.writer import PackWriter

    out = tmp_path / "e.hframe"
    with PackWriter(out) as w:
        w.seal()
        w.publish()
    r = cli(["index", str(out)], env={"HFRAME_TTY": "1"})
    assert r.exit_code == 0 and r.stdout == "frame_id  length  media_type  name\n"
    assert r.stderr.startswith("hframe: 0 frames; 4 of 22 columns shown")


def test_the_glob_filter_is_spelled_match_in_every_command(cli, packed, tmp_path):
    """One spelling for one idea: ``--match GLOB`` selects by name in index and get (index's
    ``--name GLOB`` stays as an alias); ``--by-name`` says a FRAME is a name (``--name`` too)."""
    for option in ("--match", "--name"):
        r = cli(["index", str(packed), option, "nomatch*"])
        assert (r.exit_code, r.stderr) == (2, f"hframe: error: {packed}: no frame matches --match 'nomatch*'\n")
    r = cli(["get", str(packed), "--match", "nomatch*", "-o", str(tmp_path / "out")])
    assert (r.exit_code, r.stderr) == (2, f"hframe: error: {packed}: no frame matches --match 'nomatch*'\n")
    index = cli(["index", str(packed), "--match", "cats/*", "-c", "name", "--no-header"])
    assert index.exit_code == 0 and len(index.stdout.splitlines()) == 10
    # get PACK --name 'cats/*' (a flag and a FRAME) says what the user meant
    for flag in ("--name", "--by-name"):
        r = cli(["get", str(packed), flag, "cats/*"])
        assert r.exit_code == 2, r.stderr
        assert r.stderr == (
            f"hframe: error: {packed}: no frame named 'cats/*' "
            "(a FRAME is an exact name; to select by a glob use --match 'cats/*')\n"
        )
    first = index.stdout.splitlines()[0]
    r = cli(["dump-header", str(packed), "--frame", first, "--by-name", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["name"] == first


def test_outputs_that_are_devices_or_pipes_are_written_into_never_replaced(packed, tmp_path):
    """``-o /dev/null`` (or a named pipe, or ``/dev/stdout``) gets the bytes; it is never swapped
    for a regular file by the atomic rename every other output gets (as root, a rename over
    ``/dev/null`` would leave a file there), and a pack is never written over one."""
    import stat
    import threading

    with h.open_pack(packed) as p:
        frame = p[1]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    drain = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    drain.start()
    r = run_bin(["get", str(packed), "1", "-o", str(fifo)])
    drain.join(30)
    assert r.returncode == 0, r.stderr
    assert got == [frame] and stat.S_ISFIFO(fifo.stat().st_mode)
    nodes = [fifo]
    if os.geteuid() == 0:  # a null device of our own (mknod): what /dev/null is
        null = tmp_path / "null"
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        nodes.append(null)
        for args in (
            ["get", str(packed), "1", "-o", str(null)],
            ["get", str(packed), "--match", "*", "--format", "tar", "-o", str(null)],
            ["verify", str(packed), "--junit", str(null), "-q"],
        ):
            r = run_bin(args)
            assert r.returncode == 0, (args, r.stderr)
            assert stat.S_ISCHR(null.stat().st_mode), args
    for node in nodes:
        r = run_bin(["pack", str(packed.parent), "-o", str(node), "--force", "-q"])
        assert r.returncode == 2 and b"is not a regular file" in r.stderr, r.stderr
        assert not stat.S_ISREG(node.stat().st_mode) and not Path(f"{node}.index.parquet").exists()
