"""Listing a big tree on several processes (``listing``): the same sources, the same rejections in
the same order and the same first error as one process, whatever happens to a helper; a helper
holds nothing of the caller's (the output's lock, its pipes); ``pack`` gives the same bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import hframe_bin, run_bin

import hframe_cli.sources.listing as listing
from hframe_cli.errors import InputError
from hframe_cli.processes import usable_cpus
from hframe_cli.sources.inputs import collect_sources

CREATED = ["--created", "1700000000"]


@pytest.fixture
def forked(monkeypatch) -> list[int]:
    """Every tree counts as big and is cut in slices of 7 files; returns the unit counts of the
    forked walks that ran (the real walk, only counted)."""
    if usable_cpus() < 2:
        pytest.skip("one usable CPU: the walk is never forked")
    runs: list[int] = []
    real = listing._found_forked

    def counted(col, units, workers):
        runs.append(len(units))
        return real(col, units, workers)

    monkeypatch.setattr(listing, "PARALLEL_LIST_MIN", 0)
    # earlier tests leave pyarrow's idle pool threads in this process, which makes forking unsafe
    # in general; the walk's helpers take no lock of theirs (the command, a fresh process with no
    # such threads, forks for real: the last test)
    monkeypatch.setattr(listing, "fork_is_safe", lambda: True)
    monkeypatch.setattr(listing, "_SLICE", 7)
    monkeypatch.setattr(listing, "_found_forked", counted)
    return runs


def in_one_process(args: list[str], **kw):
    """``collect_sources`` as on one CPU: one plain walk, never cut in units."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(listing, "usable_cpus", lambda: 1)
        return collect_sources(args, **kw)


def messy_tree(root: Path) -> Path:
    """Folders three deep, a folder of 40 files (six slices), an empty folder, a file whose name
    is not UTF-8, and every kind of bad entry: an empty file, a broken symlink, a symlink back to
    a folder above, a FIFO; plus a symlink to a folder (walked under its own name)."""
    for folder, count in (("a", 40), ("b/c", 5), ("b/d/e", 9), ("f", 3), ("", 2), ("h", 0)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (root / folder / f"{i:03d}.bin").write_bytes(os.urandom(1 + i))
    with open(os.fsencode(root / "b" / "c") + b"/caf\xe9.bin", "wb") as f:  # Latin-1, as old cameras write
        f.write(b"not utf-8")
    (root / "a" / "empty.bin").write_bytes(b"")
    (root / "b" / "broken").symlink_to(root / "nowhere")
    (root / "b" / "d" / "loop").symlink_to(root / "b")
    os.mkfifo(root / "f" / "pipe")
    (root / "g").symlink_to(root / "f")
    return root


@pytest.mark.parametrize("include", [(), ("*.bin", "*pipe", "*broken")])
def test_the_forked_walk_finds_what_one_process_does_rejections_in_order(tmp_path, forked, include):
    tree = messy_tree(tmp_path / "src")
    one = in_one_process([str(tree)], skip_bad=True, include=include)
    many = collect_sources([str(tree)], skip_bad=True, include=include)
    assert forked and forked[0] > 8  # it ran, on slices and subtrees
    assert many.sources == one.sources
    assert many.rejected == one.rejected
    reasons = {r.reason.split(" (")[0] for r in one.rejected}
    assert {"zero-byte file", "broken symlink", "symlink loop", "not a regular file"} <= reasons
    assert len(one.sources) == 40 + 5 + 9 + 3 + 3 + 2 + 1
    assert b"b/c/caf\xe9.bin" in {s.name for s in many.sources}  # the exact bytes, through a helper's answer


def test_without_skip_bad_the_first_error_is_the_one_process_walks_first(tmp_path, forked):
    tree = messy_tree(tmp_path / "src")
    with pytest.raises(InputError) as one:
        in_one_process([str(tree)])
    with pytest.raises(InputError) as many:
        collect_sources([str(tree)])
    assert forked
    assert str(many.value) == str(one.value)
    # and with the first bad entry fixed, the next one, again as one process finds it
    bad = str(one.value).split(":")[0]
    os.unlink(bad)
    with pytest.raises(InputError) as one:
        in_one_process([str(tree)])
    with pytest.raises(InputError) as many:
        collect_sources([str(tree)])
    assert str(many.value) == str(one.value) and not str(one.value).startswith(bad)


def test_an_unforeseen_error_is_raised_in_its_turn_too(tmp_path, forked, monkeypatch):
    """Not only InputError: an error the walk does not expect (here a PermissionError from a
    file's stat, as in a folder that can be read but not searched) is raised where the one walk
    would meet it, after the bad inputs it would have met first."""
    from hframe_cli.sources.inputs import _Collector

    tree = messy_tree(tmp_path / "src")
    (tree / "h" / "000link.bin").symlink_to(tree / "a" / "000.bin")  # the last folder walked, in name order
    real = _Collector.add_file

    def add_file(self, path, name, st=None):
        if path.endswith("000link.bin"):
            raise PermissionError(13, "Permission denied", path)
        return real(self, path, name, st)

    monkeypatch.setattr(_Collector, "add_file", add_file)
    for expect in (InputError, PermissionError):
        with pytest.raises(expect) as one:
            in_one_process([str(tree)])
        with pytest.raises(expect) as many:
            collect_sources([str(tree)])
        assert str(many.value) == str(one.value)
        if expect is InputError:
            for bad in ("b/broken", "b/d/loop", "f/pipe", "a/empty.bin"):  # the bad inputs met before it
                (tree / bad).unlink()
    assert len(forked) == 2


def test_a_helper_that_dies_leaves_its_units_to_the_parent(tmp_path, forked, monkeypatch):
    tree = messy_tree(tmp_path / "src")
    one = in_one_process([str(tree)], skip_bad=True)
    monkeypatch.setenv("HFRAME_FAULT", "listing-helper")  # SIGKILLs itself at its first unit
    many = collect_sources([str(tree)], skip_bad=True)
    assert forked
    assert (many.sources, many.rejected) == (one.sources, one.rejected)


def tiny_tree(root: Path, n: int) -> Path:
    """``n`` files of a few bytes in folders of 2,000: big enough to be listed forked."""
    for i in range(n):
        p = root / f"d{i // 2000:02d}" / f"{i:05d}.bin"
        if i % 2000 == 0:
            p.parent.mkdir(parents=True)
        p.write_bytes(i.to_bytes(4, "little"))
    return root


def _stopped_child(pid: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == pid and fields[0] == "T":
                    return int(d)
        time.sleep(0.05)
    raise AssertionError("no helper stopped itself")


@pytest.mark.skipif(usable_cpus() < 2, reason="one usable CPU: the walk is never forked")
def test_pack_of_a_big_tree_is_the_same_listed_by_one_process_and_a_helper_holds_nothing(tmp_path):
    src = tiny_tree(tmp_path / "src", listing.PARALLEL_LIST_MIN + 2000)
    one = tmp_path / "one.hframe"
    r = subprocess.run(
        [
            "taskset",
            "-c",
            str(min(os.sched_getaffinity(0))),
            hframe_bin(),
            "pack",
            str(src),
            "-o",
            str(one),
            "-q",
            *CREATED,
        ],
        capture_output=True,
        env={**os.environ, "HFRAME_TTY": "0"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    # the default run, its listing helper stopped at its first unit: what does it hold open?
    out = tmp_path / "many.hframe"
    proc = subprocess.Popen(
        [hframe_bin(), "pack", str(src), "-o", str(out), "-q", *CREATED],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HFRAME_TTY": "0", "HFRAME_FAULT": "listing-helper:1:stop"},
    )
    try:
        helper = _stopped_child(proc.pid, time.monotonic() + 60)
        held = {os.readlink(f"/proc/{helper}/fd/{fd}") for fd in os.listdir(f"/proc/{helper}/fd")}
        assert held - {os.devnull} and all(h.startswith("pipe:") for h in held - {os.devnull}), held
        assert len(held - {os.devnull}) == 2  # the queue of units and its answer
        os.kill(helper, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert out.read_bytes() == one.read_bytes()
    assert Path(f"{out}.index.parquet").read_bytes() == Path(f"{one}.index.parquet").read_bytes()
    assert run_bin(["verify", str(out), "-q"]).returncode == 0
    # the run killed while its helper is stopped: the helper goes with it (it must not keep
    # walking a big tree, or hold anything, for a process that is gone)
    proc = subprocess.Popen(
        [hframe_bin(), "pack", str(src), "-o", str(tmp_path / "killed.hframe"), "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HFRAME_TTY": "0", "HFRAME_FAULT": "listing-helper:1:stop"},
    )
    helper = _stopped_child(proc.pid, time.monotonic() + 60)
    try:
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 10
        while not _gone(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(helper), "the helper outlived its parent"
    finally:
        if not _gone(helper):
            os.kill(helper, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # dead, not yet reaped by init
    except FileNotFoundError:
        return True
