"""Readers and writers that overlap: one snapshot per reader, one writer per output decided
first, publishing as one step for readers, and every signal at every moment (issue 11).

Overlaps are made deterministic by pausing a real ``hframe`` run at a named point
(``HFRAME_FAULT=point:n:stop`` sends it SIGSTOP there) and acting while it is paused.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import hframe_bin, lock_held_elsewhere, make_photos, run_bin

import hframe_cli as h
from hframe_cli.errors import IndexMismatch, PackReplaced
from hframe_cli.names import LEFTOVER_SUFFIXES

CREATED = ["--created", "1700000000"]


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def source_md5s(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): md5(p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


def start(args: list[str], fault: str | None = None, **kw) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HFRAME_TTY": "0"}
    if fault:
        env["HFRAME_FAULT"] = fault
    return subprocess.Popen([hframe_bin(), *args], stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env, **kw)


def wait_stopped(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until ``proc`` has stopped itself at its fault point (state T in /proc/PID/stat)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError("the run never reached its fault point")


def signal_when_paused(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> bytes:
    """Wait for ``proc`` to stop at its fault point, send ``sig`` and let it go on; its stderr."""
    wait_stopped(proc)
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    return proc.communicate(timeout=60)[1]


def leftovers(folder: Path) -> list[str]:
    """Files a finished run must not leave: locks, partial files, checkpoints, saved lists and
    plans (``names.LEFTOVER_SUFFIXES``, the one list of them)."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(LEFTOVER_SUFFIXES))


def frames_by_name(pack: Path) -> dict[str, str]:
    with h.open_pack(pack) as p:
        return {r["name"]: r["md5"] for r in p.table.select(["name", "md5"]).to_pylist()}


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A folder of 12 real images and its published pack."""
    src = make_photos(tmp_path / "src", 12)
    out = tmp_path / "p.hframe"
    assert run_bin(["pack", str(src), "-o", str(out), "-q", *CREATED]).returncode == 0
    return src, out


def repack_without_one(src: Path, out: Path) -> None:
    victim = sorted(src.rglob("*.jpg"))[0]
    victim.unlink()
    r = run_bin(["pack", str(src), "-o", str(out), "--update", "-q"])
    assert r.returncode == 0, r.stderr


# -- one snapshot per reader -------------------------------------------------------------


def test_a_reader_keeps_the_generation_it_opened_across_a_repack(tree):
    src, out = tree
    want = source_md5s(src)
    with h.open_pack(out) as p:
        uuid, count = p.uuid, len(p)
        repack_without_one(src, out)  # frame ids shift in the new pack
        with h.open_pack(out) as fresh:
            assert fresh.uuid != uuid and len(fresh) == count - 1
        # names and the table load lazily, after the repack: still the generation opened
        assert {n: md5(p[n]) for n in want} == want
        assert [md5(p[i]) for i in range(len(p))] == p.table.column("md5").to_pylist()
        assert len(p) == p.table.num_rows == count == len(want)
        assert [md5(b) for b in p.read_many(list(range(count)))] == p.table.column("md5").to_pylist()
        name = next(iter(want))
        assert p.row(name)["md5"] == want[name] and p.uuid == uuid


def _read_all(reader, go, results) -> None:
    go.wait(60)
    try:
        if isinstance(reader, bytes):  # pickled: unpickled only now, after the repack
            reader = pickle.loads(reader)
        results.put([md5(reader[i]) for i in range(len(reader))])
    except Exception as e:  # noqa: BLE001 - the parent asserts on it
        results.put(f"{type(e).__name__}: {e}")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_started_before_a_repack_read_the_parents_generation(tree, method):
    src, out = tree
    ctx = mp.get_context(method)
    with h.open_pack(out) as p:
        want = p.table.column("md5").to_pylist()
        go, results = ctx.Event(), ctx.Queue()
        # a forked worker inherits the reader; a spawned one gets it pickled, and opens it after the repack
        worker = ctx.Process(target=_read_all, args=(p if method == "fork" else pickle.dumps(p), go, results))
        worker.start()
        repack_without_one(src, out)
        go.set()
        got = results.get(timeout=60)
        worker.join(30)
    assert got == want


def test_an_unpickled_reader_refuses_a_replaced_pack_naming_both_uuids(tree):
    src, out = tree
    with h.open_pack(out) as p:
        old = p.uuid
        state = pickle.dumps(p)
        assert [md5(b) for b in pickle.loads(state).read_many([0, 1])] == p.table.column("md5").to_pylist()[:2]
    # the reader that was pickled is closed: its generation is out of reach once replaced
    repack_without_one(src, out)
    with h.open_pack(out) as fresh:
        new = fresh.uuid
    with pytest.raises(PackReplaced) as e:
        pickle.loads(state)
    assert str(out) in str(e.value) and old in str(e.value) and new in str(e.value)
    assert e.value.exit_code == 3


# -- publishing is one step for readers ---------------------------------------------------


def test_opens_between_the_two_publish_renames_get_one_complete_generation(tree):
    src, out = tree
    old = frames_by_name(out)
    make_photos(src / "more", 3)
    proc = start(["pack", str(src), "-o", str(out), "--update", "-q"], fault="publish-between-renames:1:stop")
    wait_stopped(proc)  # the new pack is in place, its index is not yet
    with h.open_pack(out) as p:
        assert p.index_location.endswith(".index.parquet.partial")
        names = p.table.column("name").to_pylist()
        assert [md5(b) for b in p.read_many(names)] == p.table.column("md5").to_pylist()
        assert len(names) == len(old) + 3 and set(old) <= set(names)
    assert h.verify_pack(out).ok
    proc.kill()  # the writer dies between its renames
    proc.communicate()
    assert frames_by_name(out).keys() > old.keys()  # still the new generation, complete
    r = run_bin(["pack", str(src), "-o", str(out), "--update"])
    assert r.returncode == 0, r.stderr
    assert b"finished the publish of a run that died between its two renames" in r.stderr
    assert b"up to date" in r.stderr
    assert leftovers(out.parent) == []
    with h.open_pack(out) as p:
        assert p.index_location == f"{out}.index.parquet"


def test_a_genuinely_stray_index_still_gets_the_rebuild_advice(tree, tmp_path):
    src, out = tree
    other = tmp_path / "o.hframe"
    assert run_bin(["pack", str(src), "-o", str(other), "-q"]).returncode == 0
    os.replace(f"{other}.index.parquet", f"{out}.index.parquet")
    with pytest.raises(IndexMismatch, match="rebuild it with 'hframe index PACK --rebuild'"):
        h.open_pack(out)


# -- one writer, decided first -------------------------------------------------------------


def test_a_second_run_is_locked_out_at_once_before_it_lists_anything(tree):
    src, out = tree
    holder = start(
        ["pack", str(src), "-o", str(out), "--force", "--checkpoint-every", "1", *CREATED], fault="after-frame:3:stop"
    )
    wait_stopped(holder)  # mid-pack: OUT.partial and a checkpoint exist
    try:
        # the list on stdin is never closed: a run that listed before locking would hang here
        second = start(["pack", "-", "-o", str(out), "--force"], stdin=subprocess.PIPE)
        t0 = time.monotonic()
        _, err = second.communicate(timeout=30)
        assert second.returncode == 3, err
        assert f"locked by another hframe run (pid {holder.pid} on ".encode() in err
        assert time.monotonic() - t0 < 10
        # a plain pack (no --force) is told about the lock, not about an interrupted run
        r = run_bin(["pack", str(src), "-o", str(out)])
        assert r.returncode == 3 and b"locked by another hframe run" in r.stderr and b".partial" not in r.stderr
        r = run_bin(["resume", str(out)])
        assert r.returncode == 3 and b"locked" in r.stderr and b"packing the saved source list" not in r.stderr
        r = run_bin(["pack", str(src), "-o", str(out), "--update", "--wait", "0.3"])
        assert r.returncode == 3 and b"after waiting 0." in r.stderr
        r = run_bin(["pack", str(src), "-o", str(out), "--update", "--skip-if-locked"])
        assert r.returncode == 0 and r.stderr.count(b"\n") == 1 and b"hframe: skipped: " in r.stderr
        r = run_bin(["pack", str(src), "-o", str(out), "--update", "--skip-if-locked", "-q"])
        assert (r.returncode, r.stderr) == (0, b"")
        r = run_bin(["resume", str(out), "--skip-if-locked", "--json"])
        assert r.returncode == 0 and json.loads(r.stdout)["skipped"] == "locked"
        # the library decides the same way
        skipped = h.pack([src], out, update=True, skip_if_locked=True)
        assert skipped.mode == "skipped" and f"pid {holder.pid}" in skipped.skipped and skipped.results == []
        assert h.resume_pack(out, skip_if_locked=True).status == "skipped"
    finally:
        holder.send_signal(signal.SIGCONT)
    assert holder.wait(60) == 0, holder.communicate()
    assert leftovers(out.parent) == []


def test_overlapping_updates_plan_under_the_lock_and_keep_frame_ids(tree):
    src, out = tree
    make_photos(src / "g", 1)
    first = start(["pack", str(src), "-o", str(out), "--update"], fault="after-plan:1:stop")
    wait_stopped(first)  # it planned "append g" and holds the lock
    make_photos(src / "h", 2)  # then more files arrive, and the next cron run starts
    second = start(["pack", str(src), "-o", str(out), "--update", "--wait", "60"])
    time.sleep(0.5)
    assert second.poll() is None  # waiting for the lock, not planning
    first.send_signal(signal.SIGCONT)
    assert first.wait(60) == 0
    with h.open_pack(out) as p:
        after_first = {n: i for i, n in enumerate(p.table.column("name").to_pylist())}
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert f"appending 2 new files to {len(after_first)} existing frames".encode() in err
    with h.open_pack(out) as p:
        final = {n: i for i, n in enumerate(p.table.column("name").to_pylist())}
    assert {n: final[n] for n in after_first} == after_first  # every published id kept
    assert len(final) == len(after_first) + 2
    assert frames_by_name(out) == {**source_md5s(src)}


def test_a_stale_lock_is_taken_over_with_one_line_even_when_quiet(tree):
    src, out = tree
    Path(f"{out}.lock").write_text("pid 999999 on elsewhere since 2020-01-01T00:00:00Z\n")
    r = run_bin(["pack", str(src), "-o", str(out), "--update", "-q"])
    assert r.returncode == 0
    assert (
        r.stderr
        == (
            f"hframe: warning: {out}: took over a stale lock left by a run that died "
            "(pid 999999 on elsewhere since 2020-01-01T00:00:00Z)\n"
        ).encode()
    )
    assert leftovers(out.parent) == []


# -- every signal, every moment ------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, sig, expect",
    [
        ("after-lock", signal.SIGTERM, "nothing"),  # before the sources are listed
        ("after-lock", signal.SIGINT, "nothing"),
        ("checkpoint-before-rename", signal.SIGTERM, "resume"),  # while writing the intent
        ("after-frame:2", signal.SIGTERM, "resume"),
        ("after-seal", signal.SIGTERM, "resume"),  # sealed, not yet self-checked
        ("publish-between-renames", signal.SIGTERM, "published"),  # too late: it finishes
    ],
)
def test_a_signal_at_any_moment_of_pack_leaves_a_resumable_or_clean_state(tree, tmp_path, fault, sig, expect):
    src, clean = tree
    out = tmp_path / "s.hframe"
    name, _, count = fault.partition(":")
    proc = start(
        ["pack", str(src), "-o", str(out), "--checkpoint-every", "1", *CREATED], fault=f"{name}:{count or 1}:stop"
    )
    err = signal_when_paused(proc, sig)
    assert b"Traceback" not in err
    assert not Path(f"{out}.lock").exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    if expect == "published":
        assert proc.returncode == 0, err
        assert b"arrived while publishing; the pack was published first" in err
    else:
        assert proc.returncode == 130, err
        if expect == "nothing":
            assert b"nothing to resume (no checkpoint was written" in err
            assert leftovers(tmp_path) == []
            assert run_bin(["resume", str(out)]).returncode == 5
            assert run_bin(["pack", str(src), "-o", str(out), "-q", *CREATED]).returncode == 0
        else:
            assert f"run 'hframe resume {out}'".encode() in err
            r = run_bin(["resume", str(out)])
            assert r.returncode == 0, r.stderr
    assert out.read_bytes() == clean.read_bytes()
    assert leftovers(tmp_path) == []


def test_sigterm_during_resume_and_during_an_update_repack(tree, tmp_path):
    src, clean = tree
    out = tmp_path / "r.hframe"
    r = run_bin(
        ["pack", str(src), "-o", str(out), "--checkpoint-every", "1", *CREATED], env={"HFRAME_FAULT": "after-frame:3"}
    )
    assert r.returncode == -signal.SIGKILL
    proc = start(["resume", str(out)], fault="after-frame:2:stop")
    err = signal_when_paused(proc)
    assert proc.returncode == 130 and f"run 'hframe resume {out}'".encode() in err
    assert run_bin(["resume", str(out)]).returncode == 0
    assert out.read_bytes() == clean.read_bytes() and leftovers(tmp_path) == []
    # an --update that repacks, stopped mid-way: the published pack stays; the next run recovers
    published = frames_by_name(out)
    sorted(src.rglob("*.png"))[0].unlink()
    proc = start(["pack", str(src), "-o", str(out), "--update", "--checkpoint-every", "1"], fault="after-frame:2:stop")
    signal_when_paused(proc)
    assert proc.returncode == 130
    assert frames_by_name(out) == published and h.verify_pack(out).ok
    r = run_bin(["pack", str(src), "-o", str(out), "--update"])
    assert r.returncode == 0 and b"discarded the partial pack of an interrupted run" in r.stderr
    assert frames_by_name(out) == source_md5s(src) and leftovers(tmp_path) == []


def test_sigterm_between_shards_then_resume_leaves_no_lock_and_resume_again_says_complete(tmp_path):
    src = make_photos(tmp_path / "src", 12)
    out = tmp_path / "d.hframe"
    args = ["pack", str(src), "-o", str(out), "--max-pack-bytes", "6KB", *CREATED]
    # after-lock is passed by the command, then by each shard's run: the 3rd is before shard 2
    proc = start(args, fault="after-lock:3:stop")
    err = signal_when_paused(proc)
    assert proc.returncode == 130 and f"run 'hframe resume {out}'".encode() in err, err
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("*.lock")) and leftovers(tmp_path) == []
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0 and b"already complete" in r.stderr
    with h.open_pack(out) as d:
        assert sorted(d.table.column("md5").to_pylist()) == sorted(source_md5s(src).values())


# -- kill -9 at any moment of --update ------------------------------------------------------


@pytest.mark.parametrize("change", ["append", "repack"])
@pytest.mark.parametrize(
    "fault", ["after-plan", "after-frame:2", "checkpoint-before-rename:2", "after-seal", "publish-between-renames"]
)
def test_kill_9_during_update_leaves_the_published_pack_and_the_next_run_recovers(tree, change, fault):
    src, out = tree
    published = frames_by_name(out)
    if change == "append":
        make_photos(src / "new", 3)
    else:
        sorted(src.rglob("*.jpg"))[0].unlink()
    r = run_bin(["pack", str(src), "-o", str(out), "--update", "--checkpoint-every", "1"], env={"HFRAME_FAULT": fault})
    if r.returncode != -signal.SIGKILL:  # an append writes no checkpoints: that point is not passed
        assert change == "append" and fault.startswith("checkpoint") and r.returncode == 0
    else:
        now = frames_by_name(out)  # the old generation, or the new one if it died between renames
        assert now == published or (fault == "publish-between-renames" and now == source_md5s(src))
        assert h.verify_pack(out).ok
    r = run_bin(["pack", str(src), "-o", str(out), "--update"])
    assert r.returncode == 0, r.stderr
    assert frames_by_name(out) == source_md5s(src)
    assert h.verify_pack(out).ok and leftovers(out.parent) == []


# -- bounded stress: readers during ~25 publishes ---------------------------------------------


@pytest.mark.slow
def test_stress_readers_see_no_wrong_bytes_and_no_failed_opens_while_updates_publish(tmp_path):
    """scripts/stress_publish.py, small: 2 writers (some killed with SIGKILL) publish 25 times
    while a reader process opens and reads, and forks and spawns workers across repacks. (25
    publishes give some 100,000 reads, and kills: the bounds below hold with room to spare.)"""
    script = Path(__file__).resolve().parents[2] / "scripts" / "stress_publish.py"
    r = subprocess.run(
        [sys.executable, str(script), "--publishes", "25", "--readers", "1", "--writers", "2", "--kill-rate", "0.1"]
        + ["--files", "40", "--max-seconds", "300", "--dir", str(tmp_path)],
        capture_output=True,
        timeout=600,
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 0, (doc, r.stderr[-2000:])
    assert doc["publishes"] >= 25 and doc["reads"] > 1000 and doc["opens"] > 20
    assert doc["wrong_reads"] == 0 and doc["failed_opens"] == 0 and doc["writer_errors"] == []
    assert doc["workers_forked_and_spawned"] >= 2
    assert doc["final_update_exit"] == 0 and doc["final_verify_exit"] == 0


def test_a_dataset_reader_keeps_its_manifest_when_pickled_and_refuses_a_rebuilt_dataset(tmp_path):
    src = make_photos(tmp_path / "src", 12)
    out = tmp_path / "d.hframe"
    assert run_bin(["pack", str(src), "-o", str(out), "--max-pack-bytes", "6KB", "-q"]).returncode == 0
    with h.open_pack(out) as d:
        want = [md5(d[i]) for i in range(len(d))]
        state = pickle.dumps(d)
    assert [md5(b) for b in pickle.loads(state).read_many(list(range(len(want))))] == want
    sorted(src.rglob("*.jpg"))[0].unlink()  # rebuild: shard contents and frame ids move
    assert run_bin(["pack", str(src), "-o", str(out), "--max-pack-bytes", "6KB", "--force", "-q"]).returncode == 0
    clone = pickle.loads(state)
    assert len(clone) == len(want)  # the parent's frame numbering, not the rebuilt one's
    with pytest.raises(PackReplaced, match="the dataset was rebuilt since this reader opened it"):
        clone.read_many(list(range(len(want))))


def test_a_closed_reader_used_again_after_a_repack_refuses_the_new_pack(tree):
    src, out = tree
    p = h.open_pack(out)
    old = p.uuid
    p.close()  # handles are released; they reopen on next use
    repack_without_one(src, out)
    with pytest.raises(PackReplaced, match=f"it holds pack {old}, the path now has pack "):
        p[0]


def test_dump_header_and_index_rebuild_between_the_publish_renames(tree):
    src, out = tree
    make_photos(src / "more", 2)
    proc = start(["pack", str(src), "-o", str(out), "--update", "-q"], fault="publish-between-renames:1:stop")
    wait_stopped(proc)
    try:
        r = run_bin(["dump-header", str(out), "--json"])
        doc = json.loads(r.stdout)
        assert r.returncode == 0 and doc["ok"] and doc["index"]["pack_uuid"] == doc["header"]["uuid"], doc
        # a rebuild writes INDEX.partial too: it must wait for the writer, not race it
        r = run_bin(["index", str(out), "--rebuild"])
        assert r.returncode == 3 and b"locked by another hframe run" in r.stderr
    finally:
        proc.send_signal(signal.SIGCONT)
    assert proc.wait(60) == 0
    assert frames_by_name(out) == source_md5s(src) and leftovers(out.parent) == []


def test_index_reads_without_proc_go_through_the_pread_stream(tree, monkeypatch):
    """Where there is no /proc (macOS, some containers) the pinned index is read through a
    pread-backed Python stream: the same rows, and still the generation opened."""
    src, out = tree
    import hframe_cli.storage.access as storage

    real_isdir = os.path.isdir
    monkeypatch.setattr(storage.os.path, "isdir", lambda p: False if p == "/proc/self/fd" else real_isdir(p))
    with h.open_pack(out) as p:
        assert type(p._index.stream()).__name__ == "_PreadStream"
        want = p.table.column("md5").to_pylist()
        repack_without_one(src, out)
        assert p.read_index_columns(["md5"]).column("md5").to_pylist() == want  # read again, after the repack
        assert [md5(b) for b in p.read_many(list(range(len(p))))] == want


# -- found by review: closed readers, mid-publish readers, datasets, partial files, the lock ----


def test_a_closed_reader_refuses_a_new_generation_even_on_the_same_inode(tree, tmp_path):
    """A freed inode number is soon reused by a newer pack: the generation, not the inode, decides."""
    src, out = tree
    p = h.open_pack(out)
    old = p.uuid
    p.close()
    other = tmp_path / "other.hframe"
    sorted(src.rglob("*.jpg"))[0].unlink()
    assert run_bin(["pack", str(src), "-o", str(other), "-q"]).returncode == 0
    ino = os.stat(out).st_ino
    with open(out, "r+b") as f:  # another generation's bytes in the very same inode
        f.truncate(0)
        f.write(other.read_bytes())
    os.replace(f"{other}.index.parquet", f"{out}.index.parquet")
    assert os.stat(out).st_ino == ino
    with pytest.raises(PackReplaced, match=f"it holds pack {old}"):
        p[0]


def test_a_reader_opened_mid_publish_survives_close_after_the_publish_finished(tree):
    src, out = tree
    make_photos(src / "more", 2)
    proc = start(["pack", str(src), "-o", str(out), "--update", "-q"], fault="publish-between-renames:1:stop")
    wait_stopped(proc)
    p = h.open_pack(out)
    assert p.index_location.endswith(".partial")
    want = p.table.column("md5").to_pylist()
    proc.send_signal(signal.SIGCONT)
    assert proc.wait(60) == 0
    p.close()  # its INDEX.partial is now INDEX: the same generation, found where it went
    p._table = p._names = None
    assert p.read_index_columns(["md5"]).column("md5").to_pylist() == want
    assert [md5(b) for b in p.read_many(list(range(len(p))))] == want
    p.close()


def test_a_dataset_being_rebuilt_is_refused_as_replaced_not_as_damaged(tmp_path):
    src = make_photos(tmp_path / "src", 12)
    out = tmp_path / "d.hframe"
    args = ["pack", str(src), "-o", str(out), "--max-pack-bytes", "6KB", "-q"]
    assert run_bin(args).returncode == 0
    before = h.open_pack(out)
    proc = start([*args, "--force"], fault="after-lock:3:stop")  # shard 0 republished, manifest not yet
    wait_stopped(proc)
    try:
        for reader in (h.open_pack(out), before):
            with pytest.raises(PackReplaced, match="the dataset is being rebuilt by a sharded pack run"):
                reader.read(0)
        # writing the manifest by hand meanwhile would publish a mix of old and new shards
        r = run_bin(["index", str(out), "--merge", str(tmp_path / "d-*.hframe")])
        assert r.returncode == 3 and b"locked by another hframe run" in r.stderr
    finally:
        proc.send_signal(signal.SIGCONT)
    assert proc.wait(60) == 0
    with pytest.raises(PackReplaced, match="the dataset was rebuilt since this reader opened it"):
        before.read(0)
    assert len(h.open_pack(out)) == 12


@pytest.mark.parametrize("args", [["--update"], ["--force", "--no-checkpoint"]])
def test_a_signal_in_a_run_without_checkpoints_leaves_no_partial_pack(tree, args):
    src, out = tree
    make_photos(src / "more", 4)
    published = frames_by_name(out)
    for fault in ("after-frame:2:stop", "after-seal:1:stop"):
        proc = start(["pack", str(src), "-o", str(out), *args], fault=fault)
        err = signal_when_paused(proc)
        assert proc.returncode == 130 and b"run the same command again" in err, err
        assert leftovers(out.parent) == [] and frames_by_name(out) == published
    assert run_bin(["resume", str(out)]).returncode == 0  # already complete: nothing half-done


def test_a_signal_while_taking_the_lock_leaves_no_lock_file(tmp_path, monkeypatch):
    from hframe_cli.errors import Interrupted
    from hframe_cli.write import lock as lock_module
    from hframe_cli.write.guard import writer_run

    out = tmp_path / "x.hframe"
    real = lock_module.socket.gethostname

    def slow_hostname() -> str:  # SIGTERM arrives while the lock file is being written
        os.kill(os.getpid(), signal.SIGTERM)
        return real()

    monkeypatch.setattr(lock_module.socket, "gethostname", slow_hostname)
    with pytest.raises(Interrupted, match="interrupted by SIGTERM"):
        with writer_run(out, handle_signals=True):
            pytest.fail("the body must not run after a signal")
    assert not Path(f"{out}.lock").exists()


def test_a_signal_while_waiting_for_the_lock_ends_the_wait(tree, monkeypatch):
    src, out = tree
    with lock_held_elsewhere(out):
        proc = start(["pack", str(src), "-o", str(out), "--update", "--wait", "60"])
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert b"interrupted by SIGTERM while waiting for the lock; nothing was done" in err


def wait_handling_signals(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until ``proc`` runs hframe's first line (its SIGTERM handler is in /proc/PID/status).
    Before that the interpreter itself is starting: a signal then gets Python's default."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.002)
    pytest.fail("the command never installed its signal handlers")


@pytest.mark.parametrize("delay", [0.0, 0.03, 0.08, 0.25])
def test_a_signal_in_the_first_moments_exits_130_without_a_traceback(tree, delay):
    src, out = tree
    for sig in (signal.SIGINT, signal.SIGTERM):
        # a list on stdin that never ends: the run cannot finish before the signal comes
        proc = start(["pack", "-", "-o", str(out), "--update"], stdin=subprocess.PIPE)
        wait_handling_signals(proc)
        time.sleep(delay)  # while modules load, then while the list is read
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, (sig, err)
        assert b"Traceback" not in err and not Path(f"{out}.lock").exists()


def test_a_signal_lost_where_it_was_raised_still_stops_the_run(tree):
    """CPython runs a handler wherever the main thread is; raised inside a weakref callback (the
    import system's module locks have them) the KeyboardInterrupt is printed and dropped. The
    run must stop all the same, not go on to fail for a reason the stop caused (exit 2)."""
    src, out = tree
    before = out.read_bytes() if out.exists() else None
    code = textwrap.dedent(
        f"""
        import signal, sys, weakref
        from hframe_cli import signals
        signals.install_early()

        class Thing:
            pass

        thing = Thing()
        ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))
        del thing  # the handler raises inside the callback: "Exception ignored", and lost
        print("lost", signals.pending_signal(), flush=True)  # (not raised here: it was lost)
        sys.argv = ["hframe", "pack", "-", "-o", {str(out)!r}, "--update"]
        from hframe_cli.cli.app import main
        main()
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], input=b"", capture_output=True, timeout=60)
    assert proc.stdout.startswith(f"lost {int(signal.SIGINT)}".encode())  # the premise: lost
    assert b"Exception ignored" not in proc.stderr and b"Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 130, proc.stderr
    assert b"interrupted by SIGINT before it started; nothing was done" in proc.stderr
    assert not Path(f"{out}.lock").exists()
    assert (out.read_bytes() if out.exists() else None) == before


def test_an_open_overtaken_by_a_publish_looks_again_and_gives_up_after_a_bound(tree, tmp_path):
    """The pack was replaced between opening it and opening the index: look again, not fail."""
    from hframe_cli.errors import StorageError
    from hframe_cli.read.snapshot import Overtaken, pinned_index, read_pack_info, until_settled
    from hframe_cli.storage.access import open_storage

    src, out = tree
    other = tmp_path / "other.hframe"
    sorted(src.rglob("*.jpg"))[0].unlink()
    assert run_bin(["pack", str(src), "-o", str(other), "-q"]).returncode == 0
    with open_storage(out) as old:
        uuid = read_pack_info(old).uuid
        os.replace(other, out)  # a publish: pack first...
        os.replace(f"{other}.index.parquet", f"{out}.index.parquet")  # ...then index
        with pytest.raises(Overtaken):
            pinned_index(old, f"{out}.index.parquet", {uuid})
    tries = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise Overtaken
        return "settled"

    assert until_settled(flaky, str(out)) == "settled" and len(tries) == 3

    def never() -> str:
        raise Overtaken

    with pytest.raises(StorageError, match="kept changing while being opened"):
        until_settled(never, str(out))
    with h.open_pack(out) as p:  # and a fresh open finds the new generation whole
        assert len(p) == len(source_md5s(src)) and h.verify_pack(out).ok


def test_the_wait_line_is_printed_only_after_waiting_for_another_run(tree):
    """An uncontended lock prints nothing however slow the machine; a real wait says how long."""
    src, out = tree
    r = run_bin(["pack", str(src), "-o", str(out), "--force", "--update"])
    assert r.returncode == 0 and b"for the lock" not in r.stderr
    with lock_held_elsewhere(out):
        proc = start(["pack", str(src), "-o", str(out), "--update", "--wait", "60"])
        time.sleep(0.6)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    waited = [line for line in err.decode().splitlines() if "for the lock" in line]
    assert len(waited) == 1 and float(waited[0].split("waited ")[1].split(" s")[0]) > 0.05, err  # minus start-up


def test_an_interrupt_in_the_first_lines_of_main_is_one_line_and_exit_130(monkeypatch, capsys):
    """A signal while main hoists its options (or sets its warning filters) was an uncaught
    KeyboardInterrupt: a traceback and exit -2 (seen in 2 of 300 runs signalled at start)."""
    from hframe_cli.cli import app as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_hoist_global_options", interrupted)
    with pytest.raises(SystemExit) as e:
        cli.main(["pack", "-", "-o", "x.hframe"])
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
