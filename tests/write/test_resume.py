"""Crash safety: SIGKILL at many moments then ``resume`` gives byte-identical output; SIGTERM,
changed inputs, torn checkpoints, disk full, and ``resume`` with nothing (or everything) done."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import hframe_bin, run_bin
from conftest import same_pack as same

import hframe_cli as h

FRAMES = 40


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume-src") / "data"
    rng = random.Random(9)
    for i in range(FRAMES):
        p = root / f"d{i % 4}" / f"{i:03d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randrange(1, 20_000)))
    return root


@pytest.fixture(scope="module")
def clean(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clean") / "clean.hframe"
    r = run_bin(["pack", str(src), "-o", str(out), "--created", "1700000000", "-q"])
    assert r.returncode == 0, r.stderr
    return out


def leftovers(out: Path) -> list[str]:
    return sorted(
        p.name
        for p in out.parent.iterdir()
        if p.name.startswith(out.name) and p != out and p.name != f"{out.name}.index.parquet"
    )


KILLS = (
    [f"after-frame:{k}" for k in random.Random(4).sample(range(1, FRAMES + 1), 12)]
    + [f"checkpoint-before-rename:{k}" for k in (2, 3, 5)]
    + [f"checkpoint-between-renames:{k}" for k in (2, 4, 6)]
    + ["after-seal", "publish-between-renames"]
)


@pytest.mark.parametrize("fault", KILLS)
def test_sigkill_then_resume_is_byte_identical(src, clean, tmp_path, fault):
    out = tmp_path / "k.hframe"
    args = ["pack", str(src), "-o", str(out), "--created", "1700000000", "--checkpoint-every", "3", "-q"]
    r = run_bin(args, env={"HFRAME_FAULT": fault})
    assert r.returncode == -signal.SIGKILL, (fault, r.stderr)
    assert not (out.exists() and Path(f"{out}.index.parquet").exists()) or fault == "publish-between-renames"
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, (fault, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["status"] == "resumed"
    if fault.startswith("after-frame"):
        k = int(fault.split(":")[1])
        assert doc["resumed_from_frame"] == ((k - 1) // 3) * 3  # the last checkpoint before the kill
    assert same(out, clean), fault
    assert leftovers(out) == []


@pytest.mark.parametrize("fault", ["checkpoint-before-rename:1", "checkpoint-between-renames:1"])
def test_kill_while_recording_the_intent_leaves_nothing_to_resume(src, clean, tmp_path, fault):
    out = tmp_path / "intent.hframe"
    args = ["pack", str(src), "-o", str(out), "--created", "1700000000", "-q"]
    assert run_bin(args, env={"HFRAME_FAULT": fault}).returncode == -signal.SIGKILL
    assert not Path(f"{out}.partial").exists()  # no frame was written before the intent was on disk
    r = run_bin(["resume", str(out)])
    assert r.returncode == 5 and b"nothing to resume" in r.stderr
    assert run_bin(args).returncode == 0
    assert same(out, clean) and leftovers(out) == []


def test_kill_before_anything_was_committed_and_random_uuid_mode(src, tmp_path):
    out = tmp_path / "r.hframe"
    r = run_bin(["pack", str(src), "-o", str(out), "--checkpoint-every", "100"], env={"HFRAME_FAULT": "after-frame:2"})
    assert r.returncode == -signal.SIGKILL
    ckpt = json.loads(Path(f"{out}.ckpt").read_text())["hframe_checkpoint"]
    assert ckpt["frames"] == 0 and ckpt["options"]["pack_uuid"]
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] == 0
    with h.open_pack(out) as p:
        assert len(p) == FRAMES and p.info.uuid == ckpt["options"]["pack_uuid"]
    assert h.verify_pack(out).ok


def test_sigterm_stops_cleanly_and_resumes(src, clean, tmp_path):
    out = tmp_path / "t.hframe"
    proc = subprocess.Popen(
        [
            hframe_bin(),
            "pack",
            str(src),
            "-o",
            str(out),
            "--created",
            "1700000000",
            "--checkpoint-every",
            "1",
            "--workers",
            "1",
        ],
        stderr=subprocess.PIPE,
        env={**os.environ, "HFRAME_TTY": "0", "HFRAME_FAULT": "none"},
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the first checkpoint line: it is mid-pack now
    assert first.startswith(b"hframe: checkpoint: 1 of ") and first.endswith(b"; 1 frame committed\n"), first
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert b"interrupted by SIGTERM after" in rest and b"hframe resume" in rest and b"Traceback" not in rest
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0, r.stderr
    assert b"resume: " in r.stderr and b"resumed from frame" in r.stderr
    assert same(out, clean)


def test_changed_inputs_are_refused_then_rescanned(src, tmp_path):
    data = tmp_path / "data"
    import shutil

    shutil.copytree(src, data)
    out = tmp_path / "c.hframe"
    r = run_bin(["pack", str(data), "-o", str(out), "--checkpoint-every", "2"], env={"HFRAME_FAULT": "after-frame:7"})
    assert r.returncode == -signal.SIGKILL
    (data / "d1" / "001.bin").write_bytes(b"changed!")
    (data / "d0" / "new.bin").write_bytes(b"new file")
    (data / "d2" / "002.bin").unlink()
    r = run_bin(["resume", str(out)])
    assert r.returncode == 2
    err = r.stderr.decode()
    assert (
        "inputs changed since the run started: 1 added: d0/new.bin; 1 removed: d2/002.bin; 1 changed: d1/001.bin" in err
    )
    assert "--rescan" in err
    r = run_bin(["resume", str(out), "--rescan", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "restarted" and doc["resumed_from_frame"] == 0 and doc["frame_count"] == FRAMES
    with h.open_pack(out) as p:
        assert p["d0/new.bin"] == b"new file" and p["d1/001.bin"] == b"changed!"


def test_torn_checkpoint_falls_back_to_the_previous_one(src, clean, tmp_path):
    out = tmp_path / "torn.hframe"
    args = ["pack", str(src), "-o", str(out), "--created", "1700000000", "--checkpoint-every", "4"]
    assert run_bin(args, env={"HFRAME_FAULT": "after-frame:30"}).returncode == -signal.SIGKILL
    ck = Path(f"{out}.ckpt")
    ck.write_text(ck.read_text()[:100])  # torn
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert b"torn or invalid checkpoint ignored" in r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] == 24  # from .prev, one checkpoint earlier
    assert same(out, clean)


def test_resume_with_nothing_or_everything_done(src, tmp_path, packed):
    r = run_bin(["resume", str(tmp_path / "none.hframe")])
    assert r.returncode == 5 and b"nothing to resume" in r.stderr
    r = run_bin(["resume", str(packed)])
    assert r.returncode == 0 and r.stderr.count(b"already complete; nothing to resume") == 1, r.stderr  # once


def test_pack_refuses_to_clobber_an_interrupted_run(src, tmp_path, cli):
    out = tmp_path / "i.hframe"
    args = ["pack", str(src), "-o", str(out), "--checkpoint-every", "2"]
    assert run_bin(args, env={"HFRAME_FAULT": "after-frame:5"}).returncode == -signal.SIGKILL
    r = cli(["pack", str(src), "-o", str(out)])
    assert r.exit_code == 2 and "an interrupted run left" in r.stderr and f"hframe resume {out}" in r.stderr
    r = cli(["pack", str(src), "-o", str(out), "--force", "-q"])
    assert r.exit_code == 0 and leftovers(out) == []


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def test_disk_full_then_resume(src, clean, tmp_path):
    small = tmp_path / "small"
    real = os.geteuid() == 0 and _tmpfs(small, "200k")
    if not real:
        small.mkdir(exist_ok=True)
    out = small / "full.hframe"
    env = {} if real else {"HFRAME_FAULT": "enospc:200000"}
    try:
        r = run_bin(["pack", str(src), "-o", str(out), "--created", "1700000000", "--checkpoint-every", "2"], env=env)
        assert r.returncode == 3, r.stderr
        err = r.stderr.decode()
        assert "disk full (no space left on device;" in err and "free); the partial pack and its last checkpoint" in err
        assert Path(f"{out}.ckpt").exists()
        if real:  # free some space: grow the filesystem
            subprocess.run(["mount", "-o", "remount,size=4m", str(small)], check=True)
        r = run_bin(["resume", str(out), "--json"])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["resumed_from_frame"] > 0
        assert same(out, clean)
    finally:
        if real:
            subprocess.run(["umount", str(small)], capture_output=True)


def test_checkpoints_off_leaves_nothing_to_resume(src, tmp_path):
    out = tmp_path / "off.hframe"
    r = run_bin(["pack", str(src), "-o", str(out), "--no-checkpoint"], env={"HFRAME_FAULT": "after-frame:5"})
    assert r.returncode == -signal.SIGKILL
    assert not Path(f"{out}.ckpt").exists()
    r = run_bin(["resume", str(out)])
    assert r.returncode == 1 and b"no usable checkpoint" in r.stderr


def test_update_appends_new_files_and_keeps_old_frame_ids(tmp_path, photos, cli):
    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    before = pq.read_table(f"{out}.index.parquet").select(["frame_id", "name", "offset", "md5"])
    mtime = out.stat().st_mtime_ns
    r = cli(["pack", str(photos), "-o", str(out), "--update"])
    assert r.exit_code == 0 and r.stderr == f"hframe: {out}: up to date (30 frames; nothing changed, nothing written)\n"
    assert out.stat().st_mtime_ns == mtime  # not rewritten
    (photos / "cats" / "zzz.bin").write_bytes(b"new")
    (photos / "aaa.bin").write_bytes(b"first by name")
    r = cli(["pack", str(photos), "-o", str(out), "--update", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["changed"] is True
    assert doc["update"] == {"status": "append", "added": 2, "changed": 0, "removed": 0, "existing_frames": 30}
    after = pq.read_table(f"{out}.index.parquet").select(["frame_id", "name", "offset", "md5"])
    assert after.slice(0, 30).equals(before)  # same ids, names, offsets
    assert after.column("name").to_pylist()[30:] == ["aaa.bin", "cats/zzz.bin"]
    assert h.verify_pack(out).ok


def test_update_with_changed_or_removed_files_repacks(tmp_path, photos, cli):
    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    (photos / "dogs" / "001.jpg").unlink()
    r = cli(["pack", str(photos), "-o", str(out), "--update", "--json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["update"]["status"] == "repack"
    with h.open_pack(out) as p:
        assert len(p) == 29
    # --checksum catches a change that keeps size and mtime
    victim = photos / "cats" / "003.jpg"
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[-3] ^= 1
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert json.loads(cli(["pack", str(photos), "-o", str(out), "--update", "--json"]).stdout)["changed"] is False
    r = cli(["pack", str(photos), "-o", str(out), "--update", "--checksum", "--json"])
    assert json.loads(r.stdout)["update"]["changed"] == 1
    with h.open_pack(out) as p:
        assert p["cats/003.jpg"] == bytes(data)


def test_pack_resume_flag_is_resume(src, clean, tmp_path, cli):
    out = tmp_path / "flag.hframe"
    args = ["pack", str(src), "-o", str(out), "--created", "1700000000", "--checkpoint-every", "5"]
    assert run_bin(args, env={"HFRAME_FAULT": "after-frame:12"}).returncode == -signal.SIGKILL
    r = cli(["pack", str(src), "-o", str(out), "--resume", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] == 10
    assert same(out, clean)


def _tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_update_dry_run_says_what_and_why_and_writes_nothing(tmp_path, photos, cli):
    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    r = cli(["pack", str(photos), "-o", str(out), "--update", "--dry-run"])
    assert (r.exit_code, r.stdout) == (0, "")
    assert r.stderr == f"hframe: dry run: {out} is up to date (30 frames): nothing would be written\n"
    (photos / "cats" / "new.jpg").write_bytes(b"\xff\xd8\xff new")
    r = cli(["pack", str(photos), "-o", str(out), "--update", "-n"])
    assert (r.exit_code, r.stdout) == (0, "new      cats/new.jpg\n")
    assert r.stderr == f"hframe: dry run: {out} would get 1 new file appended to its 30 frames (ids kept)\n"
    (photos / "dogs" / "001.jpg").write_bytes(b"\xff\xd8\xff other")
    os.utime(photos / "birds" / "002.jpg", ns=(0, 1_600_000_000_123_456_000))
    (photos / "cats" / "003.jpg").unlink()
    before = _tree_state(tmp_path)
    r = cli(["pack", str(photos), "-o", str(out), "--update", "--dry-run"])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "new      cats/new.jpg"
    assert re.fullmatch(
        r"changed  birds/002\.jpg  \(modified \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z -> 2020-09-13T12:26:40\.123456Z\)",
        lines[1],
    ), lines[1]
    assert re.fullmatch(r"changed  dogs/001\.jpg  \(size \d+ -> 9 bytes\)", lines[2]), lines[2]
    assert lines[3:] == ["removed  cats/003.jpg"]
    assert r.stderr == (f"hframe: dry run: {out} would be repacked (1 new, 2 changed, 1 removed; 30 frames now)\n")
    doc = json.loads(cli(["pack", str(photos), "-o", str(out), "--update", "--dry-run", "--json"]).stdout)
    assert doc["dry_run"] is True and doc["update"]["status"] == "repack"
    assert [f["change"] for f in doc["files"]] == ["new", "changed", "changed", "removed"]
    assert doc["files"][2] == {"change": "changed", "name": "dogs/001.jpg", "why": lines[2].split("(", 1)[1][:-1]}
    assert _tree_state(tmp_path) == before  # nothing written, no lock file, no checkpoint
    # a pack that does not exist yet: every file is new; --dry-run without --update is refused
    r = cli(["pack", str(photos), "-o", str(tmp_path / "none.hframe"), "--update", "-n", "-q"])
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 30 and r.stderr == ""
    r = cli(["pack", str(photos), "-o", str(tmp_path / "none.hframe"), "-n"])
    assert r.exit_code == 2 and "--dry-run only applies with --update" in r.stderr
    assert _tree_state(tmp_path) == before
    # what the dry run said is what the update does
    r = cli(["pack", str(photos), "-o", str(out), "--update", "--json"])
    assert json.loads(r.stdout)["update"] == doc["update"]


def test_update_dry_run_describes_an_interrupted_run_and_leaves_it(tmp_path, photos, cli):
    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    (photos / "cats" / "new.jpg").write_bytes(b"\xff\xd8\xff new")
    (photos / "dogs" / "001.jpg").unlink()
    r = run_bin(["pack", str(photos), "-o", str(out), "--update"], env={"HFRAME_FAULT": "after-frame:5"})
    assert r.returncode == -signal.SIGKILL
    assert Path(f"{out}.partial").exists()
    r = cli(["pack", str(photos), "-o", str(out), "--update", "-n"])
    assert r.exit_code == 0 and r.stderr.endswith("; an interrupted run's partial pack would be discarded first\n")
    assert Path(f"{out}.partial").exists()  # a dry run settles nothing


def test_update_of_a_list_pack_named_by_the_old_rule_says_every_name_changed(tmp_path, photos, cli):
    """A pack whose list-given files were named relative to their common parent (before names
    followed tar): --update repacks under the new names, and says why and how to keep the old."""
    files = sorted(str(p) for p in photos.rglob("*.jpg"))
    out = tmp_path / "old.hframe"
    assert cli(["pack", "-", "-o", str(out), "-q", "--base", str(photos)], input="\n".join(files)).exit_code == 0
    r = cli(["pack", "-", "-o", str(out), "--update", "-n"], input="\n".join(files))
    assert r.exit_code == 0 and "every name changed" in r.stderr and "--base DIR" in r.stderr
    r = cli(["pack", "-", "-o", str(out), "--update", "--base", str(photos), "-n"], input="\n".join(files))
    assert r.stderr == f"hframe: dry run: {out} is up to date ({len(files)} frames): nothing would be written\n"


CHECKPOINT_LINE = re.compile(
    r"hframe: checkpoint: (?P<files>[\d,]+) of (?P<total>[\d,]+) files \((?P<pct>\d+)%\), "
    r"(?P<done>[\d.]+ [kMG]?B) of (?P<all>[\d.]+ [kMG]?B)"
    r"(, [\d.]+ [kMG]?B/s, about (<1 s|\d+(\.\d)? (s|min|h)) left)?; (?P<frames>[\d,]+) frames committed( \((?P<why>.+)\))?"
)


def test_cron_log_lines_say_how_far_how_fast_and_how_long(src, tmp_path):
    """One line per checkpoint with done/total in files and bytes, rate and time left (they were
    raw byte counts with no total); the resume line says where it continues, in the same units."""
    from hframe_cli.units import format_bytes

    out = tmp_path / "log.hframe"
    total_bytes = sum(p.stat().st_size for p in src.rglob("*.bin"))
    r = run_bin(["pack", str(src), "-o", str(out), "--checkpoint-every", "10", "--workers", "1"])
    assert r.returncode == 0, r.stderr
    lines = r.stderr.decode().splitlines()
    assert lines[-1].startswith("hframe: packed ")
    marks = [CHECKPOINT_LINE.fullmatch(line) for line in lines[:-1]]
    assert marks and all(marks), lines
    files = [int(m["files"].replace(",", "")) for m in marks if m]
    assert files == list(range(10, FRAMES + 1, 10))
    for m in marks:
        assert m is not None and int(m["total"].replace(",", "")) == FRAMES and m["all"] == format_bytes(total_bytes)
        assert int(m["frames"].replace(",", "")) == int(m["files"].replace(",", ""))  # one frame per file here
    assert [int(m["pct"]) for m in marks if m] == sorted(int(m["pct"]) for m in marks if m)
    # killed, then resumed: the resume line, then checkpoints that count on from where it stopped
    r = run_bin(
        ["pack", str(src), "-o", str(out), "--force", "--checkpoint-every", "10", "--workers", "1"],
        env={"HFRAME_FAULT": "after-frame:25"},
    )
    assert r.returncode == -signal.SIGKILL
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.decode().splitlines() if x.startswith("hframe: resume: "))
    assert re.fullmatch(
        rf"hframe: resume: {re.escape(str(out))} from frame 20 \(file 20 of {FRAMES}; [\d.]+ [kMG]?B of the pack kept\)",
        line,
    ), line


def test_update_dry_run_takes_the_lock_as_the_update_does(tmp_path, photos, cli):
    from conftest import lock_held_elsewhere

    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    with lock_held_elsewhere(out):
        r = cli(["pack", str(photos), "-o", str(out), "--update", "-n"])
        assert r.exit_code == 3 and "locked by another hframe run" in r.stderr  # what --update says
        r = cli(["pack", str(photos), "-o", str(out), "--update", "-n", "--skip-if-locked"])
        assert r.exit_code == 0


def test_update_dry_run_compares_with_the_sealed_pack_an_interrupted_publish_left(tmp_path, photos, cli):
    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    (photos / "cats" / "000.png").unlink()
    r = run_bin(
        ["pack", str(photos), "-o", str(out), "--update", "-q"], env={"HFRAME_FAULT": "publish-between-renames"}
    )
    assert r.returncode == -signal.SIGKILL
    r = cli(["pack", str(photos), "-o", str(out), "--update", "-n"])
    assert r.exit_code == 0 and r.stdout == "", r.stdout  # the sealed pack already lacks that file
    assert "is up to date" in r.stderr and "sealed pack would be published first" in r.stderr
    r = cli(["pack", str(photos), "-o", str(out), "--update", "--json"])
    assert json.loads(r.stdout)["update"]["status"] == "up_to_date"


def disk_state(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder under ``root`` (itself included): inode, size, mtime."""
    paths = [root, *root.rglob("*")]
    return {str(p): (p.lstat().st_ino, p.lstat().st_size, p.lstat().st_mtime_ns) for p in paths}


def test_update_dry_run_changes_nothing_on_disk_after_a_writer_died_between_its_renames(tmp_path, photos, cli):
    """hframe.1: a dry run writes nothing and only describes an interrupted run's leftovers. It
    used to finish the dead run's publish (the index renamed over) and take over its lock."""
    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    (photos / "cats" / "000.png").unlink()
    (photos / "dogs" / "new.bin").write_bytes(b"new")
    r = run_bin(
        ["pack", str(photos), "-o", str(out), "--update", "-q"], env={"HFRAME_FAULT": "publish-between-renames"}
    )
    assert r.returncode == -signal.SIGKILL
    assert Path(f"{out}.index.parquet.partial").exists() and Path(f"{out}.lock").exists()
    before = disk_state(tmp_path)
    r = cli(["pack", str(photos), "-o", str(out), "--update", "-n"])
    assert r.exit_code == 0, r.stderr
    assert "sealed pack would be published first" in r.stderr and "stale lock" in r.stderr
    assert disk_state(tmp_path) == before
    r = cli(["pack", str(photos), "-o", str(out), "--update", "-n", "--json"])
    assert json.loads(r.stdout)["update"]["status"] == "up_to_date" and disk_state(tmp_path) == before
    # the real update then finishes the publish and finds nothing left to do
    r = cli(["pack", str(photos), "-o", str(out), "--update"])
    assert r.exit_code == 0 and "finished the publish" in r.stderr, r.stderr
    assert not Path(f"{out}.index.parquet.partial").exists() and not Path(f"{out}.lock").exists()


def test_update_dry_run_escapes_names_so_none_can_fake_a_line(tmp_path, photos, cli):
    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "-q"]).exit_code == 0
    (photos / "cats" / "evil\nremoved  000.png").write_bytes(b"x")
    r = cli(["pack", str(photos), "-o", str(out), "--update", "-n"])
    assert r.stdout == "new      cats/evil\\nremoved  000.png\n"


def test_checkpoint_lines_count_skipped_files_as_done(tmp_path):
    src = tmp_path / "sb"
    src.mkdir()
    for i in range(10):  # bad images first (by name): skipped with --strict-images --skip-bad
        (src / f"-0b{i:02d}.jpg").write_bytes(b"\xff\xd8\xff" + os.urandom(20_000))
    for i in range(7):
        (src / f"g{i}.bin").write_bytes(os.urandom(100))
    r = run_bin(
        [
            "pack",
            str(src),
            "-o",
            str(tmp_path / "sb.hframe"),
            "--strict-images",
            "--skip-bad",
            "--checkpoint-every",
            "4",
            "--workers",
            "1",
        ]
    )
    assert r.returncode == 0, r.stderr
    marks = [m for m in map(CHECKPOINT_LINE.fullmatch, r.stderr.decode().splitlines()) if m]
    assert marks, r.stderr
    for m in marks:  # 4 frames in: 10 skipped files and 4 small ones are behind it
        files = int(m["files"].replace(",", ""))
        assert files >= 14 and int(m["pct"]) >= 95, m.group(0)
