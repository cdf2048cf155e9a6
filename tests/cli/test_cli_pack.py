"""``hframe pack``: sources, options, summaries, and every bad-input case with its exit code."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import hframe_bin, lock_held_elsewhere, run_bin

import hframe_cli as h


def names(pack: Path) -> list[str]:
    return pq.read_table(f"{pack}.index.parquet", columns=["name"]).column("name").to_pylist()


def test_pack_folder_prints_one_summary_line_on_a_pipe(cli, photos, tmp_path):
    out = tmp_path / "p.hframe"
    r = cli(["pack", str(photos), "-o", str(out)])
    assert r.exit_code == 0
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("hframe: packed 30 frames (")
    assert f"into {out} in " in lines[0] and lines[0].endswith("self-check of 20 frames ok")
    assert "\r" not in r.stderr  # no progress bar off a terminal


def test_quiet_prints_nothing_and_json_prints_a_document(cli, photos, tmp_path):
    r = cli(["pack", str(photos), "-o", str(tmp_path / "q.hframe"), "-q"])
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    r = cli(["pack", str(photos), "-o", str(tmp_path / "j.hframe"), "--json"])
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["frame_count"] == 30 and doc["self_checked"] == 20
    assert doc["pack_bytes"] == os.path.getsize(tmp_path / "j.hframe")
    assert doc["format_version"] == "1.0" and doc["skipped"] == []
    assert r.stderr == ""


def test_list_names_are_the_paths_as_given_like_tar(cli, photos, tmp_path, monkeypatch):
    files = sorted(str(p) for p in photos.rglob("*.jpg"))
    out = tmp_path / "s.hframe"
    r = cli(["pack", "-", "-o", str(out)], input="\n".join(files) + "\n")
    assert r.exit_code == 0, r.stderr
    assert names(out) == [f.lstrip("/") for f in files]  # absolute: the leading / goes, as in tar
    out0 = tmp_path / "s0.hframe"
    r = cli(["pack", "-", "-0", "-o", str(out0), "--created", "0"], input="\0".join(files) + "\0")
    assert r.exit_code == 0 and names(out0) == names(out)
    # relative paths are kept as given, normalized; a leading ../ goes
    monkeypatch.chdir(photos)
    rel = ["./cats/000.png", "dogs/../birds/002.jpg", "../photos/cats/003.jpg"]
    r = cli(["pack", "-", "-o", str(tmp_path / "r.hframe")], input="\n".join(rel))
    assert r.exit_code == 0, r.stderr
    assert names(tmp_path / "r.hframe") == ["birds/002.jpg", "cats/000.png", "photos/cats/003.jpg"]
    # --base names them relative to a folder
    r = cli(["pack", "-", "-o", str(tmp_path / "b.hframe"), "--base", "."], input="\n".join(files))
    assert r.exit_code == 0 and names(tmp_path / "b.hframe") == sorted(str(Path(f).relative_to(photos)) for f in files)


def test_a_listed_file_that_is_base_itself_is_refused(cli, photos, tmp_path):
    f = photos / "cats" / "000.png"
    r = cli(["pack", "-", "-o", str(tmp_path / "l.hframe"), "--base", str(f)], input=str(f))
    assert (
        r.exit_code == 2
        and r.stderr == f"hframe: error: {f}: is --base itself, so it would have no name; give its folder as --base\n"
    )


def test_a_listed_files_name_does_not_depend_on_what_else_is_listed(cli, photos, tmp_path):
    """The issue's case: one file from another folder added to a list renamed every frame
    (longest common parent: 'a b.png' became 'cats/a b.png') and made --update a full repack."""
    (photos / "cats" / "a b.png").write_bytes((photos / "cats" / "000.png").read_bytes())
    cats = sorted(str(p) for p in (photos / "cats").iterdir())
    out = tmp_path / "u.hframe"
    r = cli(["pack", "-", "-o", str(out)], input="\n".join(cats))
    assert r.exit_code == 0, r.stderr
    before = names(out)
    assert f"{photos}/cats/a b.png".lstrip("/") in before
    other = tmp_path / "elsewhere" / "x.jpg"
    other.parent.mkdir()
    other.write_bytes(b"\xff\xd8\xff" + b"x" * 100)
    r = cli(["pack", "-", "-o", str(out), "--update", "--json"], input="\n".join([*cats, str(other)]))
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["update"]["status"] == "append"  # not a repack
    after = names(out)
    assert after[: len(before)] == before and after[len(before) :] == [str(other).lstrip("/")]


def test_include_exclude_and_base(cli, photos, tmp_path):
    out = tmp_path / "ie.hframe"
    r = cli(["pack", str(photos), "-o", str(out), "--include", "*.png", "--exclude", "dogs/*"])
    assert r.exit_code == 0
    got = names(out)
    assert got and all(n.endswith(".png") and not n.startswith("dogs/") for n in got)
    out2 = tmp_path / "b.hframe"
    r = cli(["pack", str(photos / "cats"), "-o", str(out2), "--base", str(photos.parent)])
    assert r.exit_code == 0 and all(n.startswith("photos/cats/") for n in names(out2))


def test_existing_output_is_refused_unless_force(cli, photos, tmp_path, packed):
    before = packed.read_bytes()
    r = cli(["pack", str(photos), "-o", str(packed)])
    assert r.exit_code == 2
    assert r.stderr == f"hframe: error: {packed}: already exists (use --force to replace it)\n"
    assert packed.read_bytes() == before
    r = cli(["pack", str(photos), "-o", str(packed), "--force", "-q"])
    assert r.exit_code == 0 and packed.read_bytes() != before


@pytest.mark.parametrize("extra", [[], ["--force"], ["--max-pack-bytes", "20000"], ["--shard-of", "1/2"]])
def test_a_folder_as_output_is_bad_input_before_any_work(cli, photos, tmp_path, extra):
    """It used to say "use --force", then with --force pack everything, fail with exit 3 "Is a
    directory" and leave .partial, .ckpt, .ckpt.prev, .index.parquet.partial and .sources.parquet."""
    out = tmp_path / "out"
    (out / "inside").mkdir(parents=True)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = cli(["pack", str(photos), "-o", str(out), *extra])
    assert r.exit_code == 2, r.stderr
    assert (
        r.stderr == f"hframe: error: {out}: is a folder; -o names the pack file to write (e.g. -o {out}/NAME.hframe)\n"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_one_of_a_thing_is_singular(cli, tmp_path):
    """ "packed 1 frames", "1 problems in 1 frames" read as a program that did not look."""
    src = tmp_path / "one"
    src.mkdir()
    (src / "a.bin").write_bytes(b"just one frame of bytes")
    out = tmp_path / "one.hframe"
    r = cli(["pack", str(src), "-o", str(out)])
    assert r.exit_code == 0 and r.stderr.startswith("hframe: packed 1 frame (23 B) into "), r.stderr
    assert r.stderr.rstrip().endswith("self-check of 1 frame ok"), r.stderr
    r = cli(["index", str(out), "--rebuild"])
    assert r.stderr == f"hframe: rebuilt {out}.index.parquet: 1 frame\n"
    r = cli(["verify", str(out)])
    assert r.exit_code == 0 and "ok: 1 of 1 frame checked" in r.stdout, r.stdout
    data = bytearray(out.read_bytes())
    data[data.index(b"just one")] ^= 0xFF
    out.write_bytes(bytes(data))
    r = cli(["verify", str(out)])
    assert r.exit_code == 1 and f"{out}: 1 problem in 1 frame: 1 of 1 frame checked" in r.stdout, r.stdout
    assert cli(["get", str(out), "--match", "*", "-o", str(tmp_path / "x")]).stderr == (
        f"hframe: wrote 1 frame under {tmp_path / 'x'}\n"
    )


def test_output_inside_input_tree_is_refused(cli, photos):
    r = cli(["pack", str(photos), "-o", str(photos / "cats" / "x.hframe")])
    assert r.exit_code == 2
    assert "output is inside the input folder" in r.stderr


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: (d / "empty.jpg").write_bytes(b""), "zero-byte file (use --allow-empty to pack it)"),
        (lambda d: (d / "loop").symlink_to(d), "symlink loop (links back to a folder above it)"),
        (lambda d: (d / "self").symlink_to(d / "self"), "symlink loop"),
        (lambda d: (d / "dangling").symlink_to(d / "missing"), "broken symlink"),
        (lambda d: os.mkfifo(d / "fifo"), "not a regular file"),
    ],
)
def test_bad_inputs_fail_naming_the_path_or_are_skipped(cli, photos, tmp_path, make, reason):
    make(photos / "cats")
    out = tmp_path / "bad.hframe"
    r = cli(["pack", str(photos), "-o", str(out)])
    assert r.exit_code == 2, r.stderr
    assert r.stderr.startswith(f"hframe: error: {photos / 'cats'}/")
    assert f": {reason} (use --skip-bad to leave it out)" in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()
    r = cli(["pack", str(photos), "-o", str(out), "--skip-bad", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["frame_count"] == 30 and len(doc["skipped"]) == 1 and doc["skipped"][0]["reason"].startswith(reason)


def test_a_json_run_that_fails_prints_a_json_verdict_too(cli, photos, tmp_path):
    """``--json | jq`` reads a document whatever happens: a failure before the command's own
    document prints {"ok": false, "error", "exit_code"}, beside the one stderr line."""
    out = tmp_path / "x.hframe"
    (photos / "cats" / "empty.jpg").write_bytes(b"")
    r = cli(["pack", str(photos), "-o", str(out), "--json"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert json.loads(r.stdout) == {"ok": False, "error": r.stderr[len("hframe: error: ") : -1], "exit_code": 2}
    r = cli(["pack", str(photos), "-o", str(out)])  # (without --json: stdout stays empty)
    assert r.exit_code == 2 and r.stdout == ""
    r = cli(["pack", str(photos), "--json"])  # a usage error
    assert r.exit_code == 2 and json.loads(r.stdout)["error"] == r.stderr[len("hframe: error: ") : -1]
    r = cli(["verify", str(tmp_path / "missing.hframe"), "--json"])  # its own report, and only that
    doc = json.loads(r.stdout)
    assert r.exit_code == 2 and doc["ok"] is False and doc["packs_total"] == 1
    r = cli(["pack", str(photos), "-o", str(out), "--json", "--skip-bad"])  # success: its own document
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"] is True
    run = subprocess.run(  # the installed command, as a pipeline runs it
        [hframe_bin(), "pack", str(photos), "-o", str(tmp_path / "y.hframe"), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2 and json.loads(run.stdout)["exit_code"] == 2 and "empty.jpg" in run.stderr


def test_unix_socket_is_not_a_regular_file(cli, photos, tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    path = tempfile.mktemp(dir="/tmp", prefix="hf")  # socket paths must be short
    sock.bind(path)
    try:
        r = cli(["pack", str(photos), path, "-o", str(tmp_path / "s.hframe")])
        assert r.exit_code == 2 and f"{path}: not a regular file" in r.stderr
    finally:
        sock.close()
        os.unlink(path)


def test_oversized_and_missing_inputs(cli, photos, tmp_path):
    r = cli(["pack", str(photos), "-o", str(tmp_path / "o.hframe"), "--max-frame-bytes", "1kB"])
    assert r.exit_code == 2 and "is larger than --max-frame-bytes 1000" in r.stderr
    r = cli(["pack", str(tmp_path / "nope.jpg"), "-o", str(tmp_path / "o.hframe")])
    assert r.exit_code == 2 and "nope.jpg: no such file" in r.stderr
    r = cli(["pack", str(photos), "-o", str(tmp_path / "o.hframe"), "--max-frame-bytes", "lots"])
    assert r.exit_code == 2 and "--max-frame-bytes: 'lots' is not a size" in r.stderr


def test_a_name_that_appears_twice(cli, tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.jpg").write_bytes(d.encode())
    r = cli(["pack", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "d.hframe")])
    assert r.exit_code == 2 and "name 'x.jpg' appears twice" in r.stderr
    r = cli(
        ["pack", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "d.hframe"), "--base", str(tmp_path)]
    )
    assert r.exit_code == 0 and names(tmp_path / "d.hframe") == ["a/x.jpg", "b/x.jpg"]


def test_file_changed_while_packing(cli, tmp_path):
    # /proc files stat as 0 bytes but read as more: exactly a file that changed under us
    r = cli(["pack", "/proc/self/status", "-o", str(tmp_path / "c.hframe"), "--allow-empty"])
    assert r.exit_code == 2
    assert "/proc/self/status: changed while packing (listed 0 bytes, read" in r.stderr


def test_file_vanished_while_packing_is_skipped_with_skip_bad(photos, tmp_path):
    srcs = h.collect_sources([str(photos)], skip_bad=True)
    victim = photos / "dogs" / "025.jpg"

    def delete_later(frames: int, _bytes: int) -> None:
        if frames == 1 and victim.exists():
            victim.unlink()

    res = h.pack_sources(srcs, tmp_path / "v.hframe", skip_bad=True, workers=1, on_progress=delete_later)
    assert res.frame_count == 29
    assert [(s.path, s.reason) for s in res.skipped] == [(str(victim), "vanished while packing")]
    (victim).write_bytes(b"back")
    srcs = h.collect_sources([str(photos)])
    victim.unlink()
    with pytest.raises(h.InputError, match=r"025.jpg: vanished while packing \(use --skip-bad"):
        h.pack_sources(srcs, tmp_path / "w.hframe", workers=1)
    assert not (tmp_path / "w.hframe").exists()


def test_unreadable_file(cli, photos, tmp_path):
    if os.geteuid() != 0:
        secret = photos / "cats" / "secret.jpg"
        secret.write_bytes(b"\xff\xd8\xffsecret")
        secret.chmod(0)
        r = cli(["pack", str(photos), "-o", str(tmp_path / "u.hframe")])
        assert r.exit_code == 2
        assert "secret.jpg: cannot read: Permission denied (use --skip-bad to leave it out)" in r.stderr
        return
    # root reads any file despite chmod 000; /proc/self/mem opens fine but fails to read at offset 0 (EIO)
    r = cli(["pack", str(photos), "/proc/self/mem", "-o", str(tmp_path / "u.hframe"), "--allow-empty"])
    assert r.exit_code == 2
    assert "/proc/self/mem: cannot read: Input/output error (use --skip-bad to leave it out)" in r.stderr
    r = cli(
        [
            "pack",
            str(photos / "cats"),
            "/proc/self/mem",
            "-o",
            str(tmp_path / "u.hframe"),
            "--allow-empty",
            "--skip-bad",
            "--json",
        ]
    )
    assert r.exit_code == 0
    assert json.loads(r.stdout)["skipped"] == [{"path": "/proc/self/mem", "reason": "cannot read: Input/output error"}]


def test_second_writer_is_locked_out_and_told_who_holds_it(cli, photos, tmp_path):
    out = tmp_path / "l.hframe"
    with lock_held_elsewhere(out) as pid:
        r = cli(["pack", str(photos), "-o", str(out)])
    assert r.exit_code == 3
    assert f"{out}: locked by another hframe run (pid {pid} on {socket.gethostname()} since " in r.stderr
    assert not out.exists()
    # a lock file left by a dead process (no flock held) is stale and taken over
    Path(f"{out}.lock").write_text("pid 999999 on elsewhere since 2020-01-01T00:00:00Z\n")
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    assert not Path(f"{out}.lock").exists()


@pytest.mark.parametrize(
    "args", [["pack", "{src}", "-o", "{out}"], ["pack", "{src}", "-o", "{out}", "--update"], ["resume", "{out}"]]
)
def test_a_locked_run_gives_up_before_pyarrow_is_imported(photos, tmp_path, args):
    """The lock is decided before anything heavy loads: a cron run that finds its output locked
    costs a few milliseconds, not pyarrow's import (hframe.1, CONCURRENCY AND SIGNALS)."""
    out = tmp_path / "l.hframe"
    argv = [a.format(src=photos, out=out) for a in args]
    with lock_held_elsewhere(out):
        r = run_bin(argv, env={"PYTHONPROFILEIMPORTTIME": "1"})
    err = r.stderr.decode()
    assert r.returncode == 3 and "locked by another hframe run" in err, err
    imported = {line.rpartition("|")[2].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert "hframe_cli" in imported  # the report is there to be read
    assert not {m for m in imported if m.split(".")[0] in ("pyarrow", "numpy", "PIL", "av")}


def test_bad_flags_are_usage_errors(cli, photos, tmp_path):
    r = cli(["pack", str(photos), "-o", str(tmp_path / "a.hframe"), "--align", "3"])
    assert r.exit_code == 2 and "--align must be a power of two" in r.stderr
    r = cli(["pack", str(photos), "-o", str(tmp_path / "a.hframe"), "--frobnicate"])
    assert (r.exit_code, r.stderr) == (
        2,
        "hframe: error: pack: no such option: --frobnicate (Possible options: --force) (see 'hframe pack -h')\n",
    )
    r = cli(["pack", str(photos)])
    assert (r.exit_code, r.stderr) == (
        2,
        "hframe: error: pack: missing option '--output' / '-o' (see 'hframe pack -h')\n",
    )
    r = cli(["pack", str(photos), "-o", str(tmp_path / "a.hframe"), "--created", "yesterday"])
    assert r.exit_code == 2 and "--created: 'yesterday' is neither epoch seconds nor an ISO 8601 time" in r.stderr


def test_source_date_epoch_makes_packs_reproducible(cli, photos, tmp_path):
    env = {"SOURCE_DATE_EPOCH": "1700000000"}
    a, b = tmp_path / "a.hframe", tmp_path / "b.hframe"
    assert cli(["pack", str(photos), "-o", str(a)], env=env).exit_code == 0
    assert cli(["pack", str(photos), "-o", str(b), "--workers", "1"], env=env).exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    assert Path(f"{a}.index.parquet").read_bytes() == Path(f"{b}.index.parquet").read_bytes()
    assert pq.read_schema(f"{a}.index.parquet").metadata[b"hframe.pack_time"] == b"2023-11-14T22:13:20.000000Z"


def test_interrupt_exits_130_and_publishes_nothing(tmp_path):
    out = tmp_path / "i.hframe"
    proc = subprocess.Popen(
        [hframe_bin(), "pack", "-", "-o", str(out)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HFRAME_TTY": "0"},
    )
    time.sleep(2.0)  # let it start and block reading the list on stdin
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    proc.stdin.close() if proc.stdin else None
    assert proc.returncode == 130, err
    assert b"interrupted" in err and b"Traceback" not in err
    assert not out.exists()


def test_a_missing_argument_or_output_folder_is_one_plain_line(cli, photos, tmp_path):
    """A typo on the command line is not a bad file in a tree: no --skip-bad hint; an output in
    a folder that does not exist says so (exit 2, not 'cannot create lock file', exit 3)."""
    r = cli(["pack", str(tmp_path / "nonexist"), "-o", str(tmp_path / "x.hframe")])
    assert r.exit_code == 2 and r.stderr == f"hframe: error: {tmp_path / 'nonexist'}: no such file or folder\n"
    out = tmp_path / "nodir" / "x.hframe"
    r = cli(["pack", str(photos), "-o", str(out)])
    assert r.exit_code == 2 and r.stderr == f"hframe: error: {out}: the folder {tmp_path / 'nodir'} does not exist\n"
