"""``bench-cold`` / ``bench-warm``: functional checks only (never timing thresholds)."""

from __future__ import annotations

import json
import shutil

import pytest

import hframe_cli as h
from hframe_cli.errors import InputError
from hframe_cli.read.bench import evict, run_bench, sample_batches


def test_samplers_are_seeded_once_and_shaped_as_asked():
    a = sample_batches(1000, 50, 4, "random", seed=3)
    assert a == sample_batches(1000, 50, 4, "random", seed=3)
    assert a != sample_batches(1000, 50, 4, "random", seed=4)
    assert a[0] != a[1]  # not re-seeded before every batch
    assert all(len(b) == 50 and len(set(b)) == 50 for b in a)
    seq = sample_batches(100, 30, 4, "sequential", seed=0)
    assert seq[0] == list(range(30)) and seq[3] == [(90 + k) % 100 for k in range(30)]
    bl = sample_batches(1000, 100, 3, "block-local", seed=1, block_size=100)
    assert all(len({i // 100 for i in b}) == 1 for b in bl)  # each batch stays inside one block
    assert sorted(bl[0]) == list(range(min(bl[0]), min(bl[0]) + 100))


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        ((10, 0, 1, "random"), "--frames and --batches must be at least 1"),
        ((10, 20, 1, "random"), "the pack has 10 frames, fewer than one batch of --frames 20"),
        ((10, 5, 1, "zigzag"), "unknown sampler 'zigzag'"),
    ],
)
def test_sampler_refusals(args, msg):
    with pytest.raises(InputError, match=msg):
        sample_batches(*args, seed=0)


def test_warm_json_is_consistent(cli, packed):
    r = cli(["bench-warm", str(packed), "--frames", "8", "--batches", "5", "--seed", "1", "--md5", "--json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["mode"] == "warm" and d["cold"] is False and d["ok"] is True
    hf = d["hframe"]
    assert hf["frames"] == 8 * 5 and hf["md5_checked"] == 40 and hf["md5_mismatches"] == 0
    assert hf["bytes_read"] >= hf["bytes_requested"] > 0
    assert hf["frame_latency_ms"]["p50"] <= hf["frame_latency_ms"]["p99"] <= hf["frame_latency_ms"]["max"]
    assert hf["batch_latency_ms"]["p50"] <= hf["batch_latency_ms"]["p99"]
    assert 1 <= hf["read_calls"] <= 40
    assert d["workers"] == 2 and d["host"]["cpu_count"] >= 1 and d["host"]["pack_bytes"] == packed.stat().st_size
    again = json.loads(
        cli(["bench-warm", str(packed), "--frames", "8", "--batches", "5", "--seed", "1", "--json"]).stdout
    )
    assert again["hframe"]["bytes_requested"] == hf["bytes_requested"]  # same seed, same frames


def test_cold_reports_its_method_and_compares_with_loose_files(cli, packed, photos):
    r = cli(
        [
            "bench-cold",
            str(packed),
            "--frames",
            "8",
            "--batches",
            "3",
            "--compare",
            str(photos),
            "--method",
            "fadvise",
            "--json",
        ]
    )
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["cache_method"] == "fadvise" and d["cold"] is True
    assert d["loose"]["frames"] == 24 and d["loose"]["bytes_requested"] == d["hframe"]["bytes_requested"]
    assert d["ratio_vs_loose"] > 0
    r = cli(["bench-cold", str(packed), "--frames", "8", "--batches", "2", "--method", "none"])
    assert "these numbers are NOT cold" in r.stdout
    assert evict("fadvise", [str(packed)]) == "fadvise" and evict("none", [str(packed)]) == "none"


def test_coalescing_shows_in_read_calls(packed):
    merged = run_bench(packed, mode="warm", frames=30, batches=1, sampler="sequential", coalesce_gap=1 << 20)
    single = run_bench(packed, mode="warm", frames=30, batches=1, sampler="sequential", coalesce_gap=0)
    assert merged.pack_side.read_calls == 1 and single.pack_side.read_calls == 30
    assert single.pack_side.bytes_read == single.pack_side.bytes_requested


def test_decode_is_timed_separately(packed):
    res = run_bench(packed, mode="warm", frames=10, batches=2, decode=True)
    assert res.pack_side.decode_s is not None and res.pack_side.decode_s > 0


def test_compare_with_a_missing_file_refuses(cli, packed, photos, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(photos, copy)
    (copy / "cats" / "000.png").unlink()
    r = cli(["bench-cold", str(packed), "--frames", "30", "--batches", "1", "--compare", str(copy)])
    assert r.exit_code == 2
    assert f"--compare {copy}: 1 of 30 sampled frames have no file there (first: {copy}/cats/000.png)" in r.stderr


def test_bench_refusals(cli, packed):
    assert "fewer than one batch" in cli(["bench-warm", str(packed), "--frames", "31"]).stderr
    assert cli(["bench-warm", str(packed), "--frames", "0"]).exit_code == 2
    r = cli(["bench-warm", str(packed), "--sampler", "zigzag"])
    assert r.exit_code == 2 and "zigzag" in r.stderr
    r = cli(["bench-warm", str(packed), "--method", "fadvise"])
    assert r.exit_code == 2 and "--method applies to bench-cold only" in r.stderr
    r = cli(["bench-cold", str(packed), "--memory-map"])
    assert r.exit_code == 2 and "--memory-map applies to bench-warm only" in r.stderr
    r = cli(["bench-warm", "http://127.0.0.1:9/p.hframe", "--memory-map"])
    assert r.exit_code == 2 and "--memory-map applies to local packs only" in r.stderr


def test_bench_warm_through_a_memory_map_reads_the_same_frames(cli, packed, monkeypatch):
    mapped = []
    real = h.PackReader._arm_fast_read

    def arm(self):
        real(self)
        mapped.append(self._map is not None)

    monkeypatch.setattr(h.PackReader, "_arm_fast_read", arm)
    args = ["bench-warm", str(packed), "--frames", "8", "--batches", "5", "--seed", "1", "--md5", "--json"]
    plain, mm = (json.loads(cli(args + extra).stdout) for extra in ([], ["--memory-map"]))
    assert mapped == [False, True]  # the second run's reader really mapped the pack
    assert plain["memory_map"] is False and mm["memory_map"] is True and mm["ok"] is True
    assert mm["hframe"]["md5_checked"] == 40 and mm["hframe"]["md5_mismatches"] == 0
    assert mm["hframe"]["bytes_requested"] == plain["hframe"]["bytes_requested"]  # the same frames


def test_bench_reads_a_sharded_dataset_as_one_pack(photos, tmp_path):
    """bench-cold and bench-warm take a dataset: frames sampled over every shard, each one's
    md5 checked, cold batches evicting every shard file."""
    h.pack([photos], tmp_path / "ds.hframe", max_pack_bytes=20_000)
    shards = sorted(tmp_path.glob("ds-*.hframe"))
    assert len(shards) > 2
    for mode in ("warm", "cold"):
        r = run_bench(
            tmp_path / "ds.hframe",
            mode=mode,
            frames=20,
            batches=3,
            seed=1,
            md5=True,
            method="fadvise" if mode == "cold" else "auto",
        )
        doc = r.to_dict()
        assert doc["ok"] and r.pack_side.md5_checked == 60 and r.pack_side.md5_mismatches == 0
        assert doc["host"]["pack_bytes"] == sum(s.stat().st_size for s in shards)
