"""Datasets of several packs: size-capped shards, job-array parts + merge, one reader, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import hframe_bin, run_bin

import hframe_cli as h
from hframe_cli.errors import InputError
from hframe_cli.read.dataset import DatasetReader
from hframe_cli.sources.sourcelist import Source, SourceList
from hframe_cli.write.shards import parse_shard_of, plan_shards, split_for_worker


def files_of(dataset: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dataset.parent.iterdir()) if p.name.startswith(dataset.stem)}


def test_plan_and_split_are_deterministic_and_cover_everything():
    srcs = [Source(f"/x/{i}", b"%03d" % i, 1000 + i, 0) for i in range(100)]
    ranges = plan_shards(srcs, 20_000)
    assert ranges[0][0] == 0 and ranges[-1][1] == 100
    assert all(a < b for a, b in ranges) and all(r[1] == s[0] for r, s in zip(ranges, ranges[1:]))
    assert plan_shards(srcs, 20_000) == ranges and len(plan_shards(srcs, 1 << 40)) == 1
    listed = SourceList(list(srcs))
    listed.columns()  # read by its columns
    assert plan_shards(listed, 20_000) == ranges and plan_shards(listed, 1 << 40) == [(0, 100)]
    parts = [split_for_worker(srcs, i, 8) for i in range(8)]
    assert [s for p in parts for s in p] == srcs and parse_shard_of("3/8") == (3, 8)


def test_max_pack_bytes_makes_shards_read_as_one_dataset(cli, photos, tmp_path):
    out = tmp_path / "ds.hframe"
    r = cli(["pack", str(photos), "-o", str(out), "--max-pack-bytes", "15kB", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["shards"]) > 2 and doc["frame_count"] == 30 and not out.exists()
    assert all(e["pack_bytes"] <= 15_000 or e["frame_count"] == 1 for e in doc["shards"])
    with h.open_pack(out) as ds:
        assert isinstance(ds, DatasetReader) and len(ds) == 30
        names = ds.table.column("name").to_pylist()
        assert names == sorted(names) and ds.table.column("frame_id").to_pylist() == list(range(30))
        for i, name in enumerate(names):
            assert ds[i] == (photos / name).read_bytes() == ds[name]
        assert ds.read_many([29, 0, 15, 15]) == [ds[29], ds[0], ds[15], ds[15]]
    assert cli(["get", str(out), "dogs/001.jpg"]).stdout_bytes == (photos / "dogs/001.jpg").read_bytes()
    rows = cli(["index", str(out), "-c", "frame_id,name,shard", "-f", "jsonl"]).stdout.splitlines()
    assert len(rows) == 30 and json.loads(rows[-1])["shard"] == doc["shards"][-1]["path"]
    r = cli(["verify", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["packs_total"] == len(doc["shards"])
    d = json.loads(cli(["dump-header", str(out), "--json"]).stdout)
    assert d["frame_count"] == 30 and [s["uuid"] for s in d["shards"]] == [s["uuid"] for s in doc["shards"]]


def test_job_array_parts_then_merge(cli, photos, tmp_path):
    out = tmp_path / "arr.hframe"
    for i in range(3):
        r = cli(["pack", str(photos), "-o", str(out), "--shard-of", f"{i}/3", "-q"])
        assert r.exit_code == 0, r.stderr
    r = cli(["index", str(out), "--merge", str(tmp_path / "arr-*.hframe")])
    assert r.exit_code == 0 and "3 shards, 30 frames" in r.stderr
    with h.open_pack(out) as ds:
        names = ds.table.column("name").to_pylist()
        assert names == sorted(names) and len(set(names)) == 30
    assert cli(["pack", str(photos), "-o", str(out), "--shard-of", "3/3"]).exit_code == 2


def test_interrupted_sharded_run_resumes_to_the_same_bytes(photos, tmp_path):
    clean = tmp_path / "clean" / "ds.hframe"
    clean.parent.mkdir()
    args = ["pack", str(photos), "--max-pack-bytes", "15kB", "--created", "0", "--checkpoint-every", "2", "-q"]
    assert run_bin([*args, "-o", str(clean)]).returncode == 0
    out = tmp_path / "run" / "ds.hframe"
    out.parent.mkdir()
    r = run_bin([*args, "-o", str(out)], env={"HFRAME_FAULT": "after-frame:17"})
    assert r.returncode == -signal.SIGKILL
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0, r.stderr
    assert b"already complete" in r.stderr and b"resuming" in r.stderr
    assert files_of(out) == files_of(clean)
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(p.name for p in clean.parent.iterdir())


@pytest.mark.parametrize(
    "env, text, want",
    [
        ({"SLURM_ARRAY_TASK_ID": "12", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_COUNT": "4"}, "env", (2, 4)),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8"}, "env/8", (3, 8)),
        ({"JOB_COMPLETION_INDEX": "5"}, "env/6", (5, 6)),
    ],
)
def test_shard_of_env_reads_the_job_array(env, text, want):
    assert parse_shard_of(text, env) == want


@pytest.mark.parametrize(
    "env, text, words",
    [
        ({}, "env", "no job-array index in the environment"),
        ({"JOB_COMPLETION_INDEX": "1"}, "env", "gives no count; use env/N"),
        ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, "env/5", "has 4 tasks, not 5"),
        (
            {"SLURM_ARRAY_TASK_ID": "14", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "8"},
            "env",
            "with a step",
        ),
        ({"JOB_COMPLETION_INDEX": "x"}, "env/4", "is not a number"),
        ({"JOB_COMPLETION_INDEX": "4"}, "env/4", "I must be in 0..N-1"),
    ],
)
def test_shard_of_env_refusals_are_one_clear_line(env, text, words):
    with pytest.raises(InputError, match=words):
        parse_shard_of(text, env)


@pytest.mark.parametrize("engine", ["slurm", "kubernetes"])
def test_a_job_array_of_subprocesses_packs_what_one_process_packs(photos, tmp_path, engine):
    """Three parts as separate processes, each told its index only by the job array's
    environment, then the merge: the same frames, in the same order, as one pack of it all."""
    single = tmp_path / "single.hframe"
    h.pack([photos], single, created_us=1_700_000_000_000_000)
    (tmp_path / "parts").mkdir()
    out = tmp_path / "parts" / "ds.hframe"
    procs = []
    for i in range(3):
        env = {**os.environ}
        if engine == "slurm":
            env.update(SLURM_ARRAY_TASK_ID=str(100 + i), SLURM_ARRAY_TASK_MIN="100", SLURM_ARRAY_TASK_COUNT="3")
            spec = "env"
        else:
            env.update(JOB_COMPLETION_INDEX=str(i))
            spec = "env/3"
        argv = [
            hframe_bin(),
            "pack",
            str(photos),
            "-o",
            str(out),
            "--shard-of",
            spec,
            "--created",
            "2023-11-14T22:13:20Z",
        ]
        procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert sorted(x.name for x in (tmp_path / "parts").glob("ds-*.hframe")) == [f"ds-0000{i}.hframe" for i in range(3)]
    r = run_bin(["index", str(out), "--merge", str(tmp_path / "parts" / "ds-*.hframe")])
    assert r.returncode == 0, r.stderr
    with h.open_pack(out) as merged, h.open_pack(single) as one:
        cols = ["name", "md5", "length"]
        assert merged.table.select(cols).to_pylist() == one.table.select(cols).to_pylist()
        assert merged.read_many(list(range(len(one)))) == one.read_many(list(range(len(one))))
    assert run_bin(["verify", str(out)]).returncode == 0


def test_verify_as_a_job_array_then_merge_is_one_verdict(photos, tmp_path):
    """Three verify parts, each told its index by Slurm's variables, each writing its own JSON
    and JUnit; the merge gives the verdict one run would: clean, then exit 1 once a frame of any
    shard is damaged, and a missing part is refused rather than passed."""
    out = tmp_path / "ds.hframe"
    h.pack([photos], out, max_pack_bytes=12_000)
    shards = sorted(tmp_path.glob("ds-*.hframe"))
    assert len(shards) >= 4

    def run_parts(tag: str) -> list[Path]:
        reports, procs = [], []
        for i in range(3):
            env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(i), "SLURM_ARRAY_TASK_COUNT": "3"}
            rep = tmp_path / f"{tag}-{i}.json"
            argv = [hframe_bin(), "verify", str(out), "--shard-of", "env", "--json", "--junit", f"{rep}.xml"]
            procs.append((subprocess.Popen(argv, env=env, stdout=rep.open("wb"), stderr=subprocess.PIPE), rep))
        for p, rep in procs:
            p.wait(timeout=120)
            reports.append(rep)
        return reports

    parts = run_parts("clean")
    docs = [json.loads(r.read_text()) for r in parts]
    names = [p["pack"] for d in docs for p in d["packs"]]
    assert sorted(names) == sorted(map(str, shards)) and len(set(names)) == len(names)  # each shard once
    assert all(d["part"]["count"] == 3 and d["part"]["packs_in_all_parts"] == len(shards) for d in docs)
    r = run_bin(["verify", "--merge", *map(str, parts), "--json", "--junit", str(tmp_path / "all.xml")])
    assert r.returncode == 0 and json.loads(r.stdout)["packs_ok"] == len(shards), r.stderr
    assert (tmp_path / "all.xml").read_text().count("<testcase") == len(shards)

    victim = shards[-1]
    with h.open_pack(victim) as p:
        off, _ = p.range_of(0)
    data = bytearray(victim.read_bytes())
    data[off + 3] ^= 0xFF
    victim.write_bytes(bytes(data))
    parts = run_parts("damaged")
    r = run_bin(["verify", "--merge", *map(str, parts)])
    assert r.returncode == 1 and victim.name.encode() in r.stdout + r.stderr
    r = run_bin(["verify", "--merge", str(parts[0]), str(parts[2])])
    assert r.returncode == 2 and r.stderr == b"hframe: error: parts of 3: part 1 missing\n"
    r = run_bin(["verify", "--merge", str(parts[0]), str(parts[0]), str(parts[1]), str(parts[2])])
    assert r.returncode == 2 and b"part 0 given twice" in r.stderr
    broken = json.loads(parts[1].read_text())
    del broken["part"]["count"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    r = run_bin(["verify", "--merge", str(parts[0]), str(tmp_path / "broken.json"), str(parts[2])])
    assert r.returncode == 2 and b"is not one verify --shard-of writes" in r.stderr and b"Traceback" not in r.stderr


def test_verify_parts_are_contiguous_balanced_and_cover_every_pack():
    from hframe_cli.parts import balanced_part as _part_of

    for weights in ([1] * 10, [5, 1, 1, 1, 1, 1], [1, 1], [10, 1, 1, 1], [3, 9, 2, 7, 7, 1, 4], [1]):
        for n in (1, 2, 3, 4, 7):
            spans = [_part_of(weights, i, n) for i in range(n)]
            assert spans[0][0] == 0 and spans[-1][1] == len(weights)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, disjoint, in order
            if n <= len(weights) and len(set(weights)) == 1:
                sizes = [b - a for a, b in spans]
                assert max(sizes) - min(sizes) <= 1  # equal weights: equal counts


def test_a_dataset_and_a_single_pack_do_not_replace_each_other_without_force(photos, tmp_path):
    out = tmp_path / "u.hframe"
    h.pack([photos], out, max_pack_bytes=20_000)
    before = files_of(out)
    with pytest.raises(InputError, match="already exists as a dataset"):
        h.pack([photos / "cats"], out)
    assert files_of(out) == before  # nothing deleted
    other = tmp_path / "v.hframe"
    h.pack([photos / "cats"], other)
    with pytest.raises(InputError, match="already exists as a single pack"):
        h.pack([photos], other, max_pack_bytes=20_000)
    assert other.exists()


def test_a_repack_never_deletes_packs_a_merge_gathered_from_elsewhere(photos, tmp_path):
    (tmp_path / "keep").mkdir()
    for name in ("cats", "dogs"):
        h.pack([photos / name], tmp_path / "keep" / f"{name}.hframe")
    kept = sorted(p.name for p in (tmp_path / "keep").iterdir())
    r = run_bin(["index", str(tmp_path / "all.hframe"), "--merge", str(tmp_path / "keep" / "*.hframe")])
    assert r.returncode == 0, r.stderr
    h.pack([photos], tmp_path / "all.hframe", force=True)  # the dataset replaced by one pack
    assert sorted(p.name for p in (tmp_path / "keep").iterdir()) == kept
    assert not (tmp_path / "all.hframe.dataset.json").exists()
    with h.open_pack(tmp_path / "all.hframe") as p:
        assert len(p) == 30


def test_slurm_arrays_with_a_step_or_a_list_are_refused_on_every_task():
    for task in ("0", "2", "4", "6"):  # --array=0-6:2
        env = {
            "SLURM_ARRAY_TASK_ID": task,
            "SLURM_ARRAY_TASK_MIN": "0",
            "SLURM_ARRAY_TASK_MAX": "6",
            "SLURM_ARRAY_TASK_STEP": "2",
            "SLURM_ARRAY_TASK_COUNT": "4",
        }
        with pytest.raises(InputError, match="step or a list"):
            parse_shard_of("env", env)
    for task in ("1", "3", "5"):  # --array=1,3,5 (no step variable; max - min + 1 != count)
        env = {
            "SLURM_ARRAY_TASK_ID": task,
            "SLURM_ARRAY_TASK_MIN": "1",
            "SLURM_ARRAY_TASK_MAX": "5",
            "SLURM_ARRAY_TASK_COUNT": "3",
        }
        with pytest.raises(InputError, match="step or a list"):
            parse_shard_of("env", env)


def test_shard_of_cannot_be_combined_with_update(photos, tmp_path):
    with pytest.raises(InputError, match="--update"):
        h.pack([photos], tmp_path / "p.hframe", shard_of="0/2", update=True)


def test_a_reader_whose_dataset_lost_shards_to_a_repack_is_told_it_was_rebuilt(photos, tmp_path):
    out = tmp_path / "ds.hframe"
    h.pack([photos], out, max_pack_bytes=12_000)
    n_before = len(list(tmp_path.glob("ds-*.hframe")))
    with h.open_pack(out) as d:
        d[0]
        # another process repacks it, with fewer shards
        r = run_bin(["pack", str(photos / "cats"), "-o", str(out), "--max-pack-bytes", "12000", "--force"])
        assert r.returncode == 0, r.stderr
        assert len(list(tmp_path.glob("ds-*.hframe"))) < n_before
        from hframe_cli.errors import PackReplaced

        with pytest.raises(PackReplaced, match="rebuilt"):
            d[len(d) - 1]


def test_a_plan_lists_once_and_parts_read_it_reproducibly_balanced_by_bytes(tmp_path):
    """--plan-only writes the sorted source list; parts packed from it (as subprocesses told
    their index by Slurm's variables) are balanced by bytes, merge into what one pack of it all
    holds, and a part packed again is the same bytes."""
    import random

    rng = random.Random(4)
    src = tmp_path / "src"
    for i in range(60):  # sizes spread widely, so that a split by count would be unbalanced
        p = src / f"d{i % 3}" / f"{i:03d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(200 if i < 40 else 20_000))
    out = tmp_path / "ds.hframe"
    r = run_bin(["pack", str(src), "-o", str(out), "--plan-only", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    plan = tmp_path / "ds.hframe.plan.parquet"
    assert doc["plan"] == str(plan) and doc["files"] == 60 and not list(tmp_path.glob("ds-*"))
    (src / "d0" / "late.bin").write_bytes(b"added after the plan")  # parts must not see it
    created = "2024-01-01T00:00:00Z"
    procs = []
    for i in range(3):
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(i), "SLURM_ARRAY_TASK_COUNT": "3"}
        argv = [hframe_bin(), "pack", "--plan", str(plan), "-o", str(out), "--shard-of", "env", "--created", created]
        procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    sizes = [(tmp_path / f"ds-0000{i}.hframe").stat().st_size for i in range(3)]
    assert max(sizes) < 2 * min(sizes), sizes  # by bytes: a split by count would give 8 KB vs 800 KB
    first = (tmp_path / "ds-00001.hframe").read_bytes()
    r = run_bin(["pack", "--plan", str(plan), "-o", str(out), "--shard-of", "1/3", "--created", created, "--force"])
    assert r.returncode == 0 and (tmp_path / "ds-00001.hframe").read_bytes() == first  # re-run: same bytes
    assert run_bin(["index", str(out), "--merge", str(tmp_path / "ds-*.hframe")]).returncode == 0
    (src / "d0" / "late.bin").unlink()
    h.pack([src], tmp_path / "one.hframe")
    with h.open_pack(out) as merged, h.open_pack(tmp_path / "one.hframe") as one:
        cols = ["name", "md5"]
        assert merged.table.select(cols).to_pylist() == one.table.select(cols).to_pylist()
    r = run_bin(["pack", "--plan", str(plan), "x", "-o", str(tmp_path / "y.hframe")])
    assert r.returncode == 2 and b"one SOURCE" in r.stderr
