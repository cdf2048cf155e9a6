"""Job arrays after a crash: a killed part run again by its own command line, ``resume`` of the
dataset, missing parts never taken for a complete dataset, the plan fixing the creation time,
and what a killed sharded run leaves behind (issue #31)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import run_bin, same_pack

import hframe_cli as h
from hframe_cli.read.dataset import shard_path


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def make_plan(photos: Path, folder: Path, *extra: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    r = run_bin(["pack", str(photos), "-o", str(folder / "ds.hframe"), "--plan-only", "-q", *extra])
    assert r.returncode == 0, r.stderr
    return folder / "ds.hframe.plan.parquet"


def part(plan: Path, out: Path, i: int, *extra: str, env: dict[str, str] | None = None):
    args = ["pack", "--plan", str(plan), "-o", str(out), "--shard-of", f"{i}/4", "--checkpoint-every", "1", "-q"]
    return run_bin([*args, *extra], env=env or {})


def killed_part(plan: Path, out: Path, i: int, fault: str = "after-frame:3") -> None:
    r = part(plan, out, i, env={"HFRAME_FAULT": fault})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert Path(f"{shard_path(out, i)}.ckpt").exists() or fault == "after-lock"


def clean_parts(plan: Path, out: Path, parts=range(4)) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    for i in parts:
        r = part(plan, out, i)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("again", [[], ["--resume"]], ids=["same-command", "with-resume"])
@pytest.mark.parametrize("fault", ["after-frame:3", "after-seal", "after-lock"])
def test_a_killed_part_run_again_by_its_own_command_is_the_same_bytes(photos, tmp_path, again, fault):
    """kill -9 of part 2 of 4, then the task's own command line again (as a scheduler reruns
    it), or with --resume: exit 0, and the shard and its index are the bytes of a part that was
    never interrupted (packed in another folder from the same plan, at another time)."""
    plan = make_plan(photos, tmp_path / "plan")  # no --created: the plan fixes the time
    clean = tmp_path / "clean" / "ds.hframe"
    clean_parts(plan, clean, [2])
    out = tmp_path / "run" / "ds.hframe"
    out.parent.mkdir()
    killed_part(plan, out, 2, fault)
    if fault == "after-lock" and again:  # nothing of the part was written: nothing to resume
        r = part(plan, out, 2, *again)
        assert r.returncode == 5 and r.stderr.decode().count("error:") == 1, r.stderr
        assert b"ds-00002.hframe: nothing to resume" in r.stderr
        again = []
    r = part(plan, out, 2, *again)
    assert r.returncode == 0, r.stderr
    assert same_pack(shard_path(out, 2), shard_path(clean, 2))
    assert listing(out.parent) == listing(clean.parent)


def test_resume_of_the_dataset_finishes_an_interrupted_part(photos, tmp_path):
    plan = make_plan(photos, tmp_path / "plan")
    clean = tmp_path / "clean" / "ds.hframe"
    clean_parts(plan, clean)
    out = tmp_path / "run" / "ds.hframe"
    clean_parts(plan, out, [0, 1, 3])
    killed_part(plan, out, 2)
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0, r.stderr
    assert b"ds-00002.hframe" in r.stderr
    for i in range(4):
        assert same_pack(shard_path(out, i), shard_path(clean, i))
    assert listing(out.parent) == listing(clean.parent)
    r = run_bin(["resume", str(out)])  # nothing left to do: says so, and not "complete" (no manifest)
    assert r.returncode == 5 and b"merge" in r.stderr, r.stderr
    assert run_bin(["index", str(out), "--merge", str(out.parent / "ds-*.hframe")]).returncode == 0
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0 and b"already complete" in r.stderr, r.stderr
    assert run_bin(["verify", str(out)]).returncode == 0


def test_a_missing_part_is_named_with_the_command_that_makes_it(photos, tmp_path):
    """Part 2 never ran (or left nothing): resume says which part and how to run it, one line,
    exit 5; the merge refuses to make a dataset without it."""
    plan = make_plan(photos, tmp_path / "plan")
    out = tmp_path / "run" / "ds.hframe"
    clean_parts(plan, out, [0, 1, 3])
    r = run_bin(["resume", str(out)])
    err = r.stderr.decode()
    assert r.returncode == 5 and err.count("\n") == 1, err
    assert "part 2 (" in err and "ds-00002.hframe) is missing" in err and "--shard-of 2/N" in err, err
    r = run_bin(["index", str(out), "--merge", str(out.parent / "ds-*.hframe")])
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1 and "part 2 (" in err, err
    assert not Path(f"{out}.dataset.json").exists()


def test_a_merge_refuses_an_interrupted_part(photos, tmp_path):
    plan = make_plan(photos, tmp_path / "plan")
    out = tmp_path / "run" / "ds.hframe"
    clean_parts(plan, out, [0, 1, 3])
    killed_part(plan, out, 2)
    r = run_bin(["index", str(out), "--merge", str(out.parent / "ds-*.hframe")])
    err = r.stderr.decode()
    assert r.returncode == 2 and "ds-00002.hframe" in err and "hframe resume" in err, err
    assert not Path(f"{out}.dataset.json").exists()


def test_after_a_merge_a_missing_or_interrupted_shard_is_never_complete(photos, tmp_path):
    plan = make_plan(photos, tmp_path / "plan")
    clean = tmp_path / "clean" / "ds.hframe"
    clean_parts(plan, clean)
    out = tmp_path / "run" / "ds.hframe"
    clean_parts(plan, out)
    assert run_bin(["index", str(out), "--merge", str(out.parent / "ds-*.hframe")]).returncode == 0
    assert run_bin(["index", str(clean), "--merge", str(clean.parent / "ds-*.hframe")]).returncode == 0
    # part 2 packed again over its shard, and killed: resume finishes it and the manifest agrees
    r = part(plan, out, 2, "--force", env={"HFRAME_FAULT": "after-frame:3"})
    assert r.returncode == -signal.SIGKILL
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0 and b"already complete" not in r.stderr, r.stderr
    assert run_bin(["verify", str(out)]).returncode == 0
    assert listing(out.parent) == listing(clean.parent)
    assert Path(f"{out}.dataset.json").read_bytes() == Path(f"{clean}.dataset.json").read_bytes()
    # the shard gone altogether: not complete, for resume (of the dataset or of the part) nor verify
    shard_path(out, 2).unlink()
    for args in (["resume", str(out)], ["pack", "--plan", str(plan), "-o", str(out), "--shard-of", "2/4", "--resume"]):
        r = run_bin(args)
        err = r.stderr.decode()
        assert r.returncode == 5 and "complete" not in err and err.count("\n") == 1, err
        assert "ds-00002.hframe" in err
    assert run_bin(["verify", str(out)]).returncode != 0
    # and the part's own command brings it back
    assert part(plan, out, 2).returncode == 0
    assert run_bin(["resume", str(out)]).returncode == 0 and run_bin(["verify", str(out)]).returncode == 0


def test_the_plan_fixes_the_creation_time_of_every_part(photos, tmp_path):
    plan = make_plan(photos, tmp_path / "plan", "--created", "2024-05-06T07:08:09Z")
    out = tmp_path / "run" / "ds.hframe"
    clean_parts(plan, out, [1])
    with h.open_pack(shard_path(out, 1)) as p:
        assert p.info.pack_time.startswith("2024-05-06T07:08:09")
    # a plan without --created records when it was made: parts packed apart are the same bytes
    plan2 = make_plan(photos, tmp_path / "plan2")
    a, b = tmp_path / "a" / "ds.hframe", tmp_path / "b" / "ds.hframe"
    clean_parts(plan2, a, [3])
    clean_parts(plan2, b, [3])
    assert same_pack(shard_path(a, 3), shard_path(b, 3))
    # --created on the part still wins (what the command says)
    c = tmp_path / "c" / "ds.hframe"
    c.parent.mkdir()
    assert part(plan, c, 1, "--created", "0").returncode == 0
    with h.open_pack(shard_path(c, 1)) as p:
        assert p.info.pack_time.startswith("1970-01-01T00:00:00")


def test_a_sharded_run_killed_after_its_manifest_leaves_no_source_list(photos, tmp_path):
    """Killed after the manifest was published and the plan removed, before the saved source
    list went: resume finds the dataset complete and removes what the run left."""
    args = ["pack", str(photos), "--max-pack-bytes", "15kB", "--created", "0", "-q"]
    clean = tmp_path / "clean" / "sh.hframe"
    clean.parent.mkdir()
    assert run_bin([*args, "-o", str(clean)]).returncode == 0
    out = tmp_path / "run" / "sh.hframe"
    out.parent.mkdir()
    r = run_bin([*args, "-o", str(out)], env={"HFRAME_FAULT": "after-manifest"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert Path(f"{out}.sources.parquet").exists()
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0 and b"already complete" in r.stderr, r.stderr
    assert listing(out.parent) == listing(clean.parent)


def test_a_part_run_again_as_another_part_starts_over(photos, tmp_path):
    """The checkpoint left is of other sources (the task was part 2 of 4, its rerun is part 2 of
    5): the part is packed again from the start, one line says so."""
    plan = make_plan(photos, tmp_path / "plan")
    out = tmp_path / "run" / "ds.hframe"
    out.parent.mkdir()
    killed_part(plan, out, 2)
    args = ["pack", "--plan", str(plan), "--shard-of", "2/5", "-o"]
    r = run_bin([*args, str(out)])
    assert r.returncode == 0 and b"packing other sources or options; packing it again" in r.stderr, r.stderr
    clean = tmp_path / "clean" / "ds.hframe"
    clean.parent.mkdir()
    assert run_bin([*args, str(clean)]).returncode == 0
    assert same_pack(shard_path(out, 2), shard_path(clean, 2))
    assert listing(out.parent) == listing(clean.parent)


def test_resume_never_adds_part_files_the_manifest_does_not_list(photos, tmp_path):
    """A folder that held a job array of 8 parts, repacked as 4 and merged by name: the 4 old
    part files beside it are finished packs, but not the dataset's. resume used to write the
    manifest again over all 8 (duplicated, stale frames; exit 0)."""
    out = tmp_path / "d.hframe"
    for i in range(8):
        assert run_bin(["pack", str(photos), "-o", str(out), "--shard-of", f"{i}/8", "-q"]).returncode == 0
    for i in range(4):
        assert run_bin(["pack", str(photos), "-o", str(out), "--shard-of", f"{i}/4", "--force", "-q"]).returncode == 0
    parts = [str(shard_path(out, i)) for i in range(4)]
    assert run_bin(["index", str(out), *(a for p in parts for a in ("--merge", p))]).returncode == 0
    with h.open_pack(out) as ds:
        assert len(ds) == 30
    manifest = Path(f"{out}.dataset.json").read_bytes()
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0 and b"already complete" in r.stderr, r.stderr
    assert b"4 part file(s) beside the dataset are not in its manifest" in r.stderr
    assert Path(f"{out}.dataset.json").read_bytes() == manifest
    # an interrupted listed part is resumed and the manifest written again over the same 4
    killed = run_bin(
        ["pack", str(photos), "-o", str(out), "--shard-of", "1/4", "--force", "--checkpoint-every", "1"],
        env={"HFRAME_FAULT": "after-frame:3"},
    )
    assert killed.returncode == -signal.SIGKILL
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0, r.stderr
    with h.open_pack(out) as ds:
        assert len(ds) == 30 and sorted(ds.table.column("name").to_pylist()) == sorted(
            str(p.relative_to(photos)) for p in photos.rglob("*") if p.is_file()
        )


def test_a_killed_part_with_a_labels_csv_run_again_continues_it(photos, tmp_path):
    """The checkpoint keeps the labels CSV as the run saw it (absolute path and SHA-256): the
    rerun compares the same, not the relative path as typed (review: every rerun started over,
    saying the part was "interrupted packing other sources or options")."""
    (tmp_path / "labels.csv").write_text("cats/000.png,first\n")
    plan = make_plan(photos, tmp_path / "plan")
    clean = tmp_path / "clean" / "ds.hframe"
    clean.parent.mkdir()
    r = run_bin(
        ["pack", "--plan", str(plan), "-o", str(clean), "--shard-of", "2/4", "--label-from", "../labels.csv", "-q"],
        cwd=clean.parent,
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "run" / "ds.hframe"
    out.parent.mkdir()
    args = [
        "pack",
        "--plan",
        str(plan),
        "-o",
        str(out),
        "--shard-of",
        "2/4",
        "--label-from",
        "../labels.csv",
        "--checkpoint-every",
        "1",
    ]
    r = run_bin(args, env={"HFRAME_FAULT": "after-frame:3"}, cwd=out.parent)
    assert r.returncode == -signal.SIGKILL
    r = run_bin(args, cwd=out.parent)
    assert r.returncode == 0 and b"continuing the interrupted run" in r.stderr, r.stderr
    assert same_pack(shard_path(out, 2), shard_path(clean, 2))
