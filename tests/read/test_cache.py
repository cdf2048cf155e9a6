"""The node-local cache of remote packs (``read/cache.py``): against a real nginx and moto's S3
on loopback, with real images; processes filling the same frames at once, a fill killed with
SIGKILL, a flipped byte, a full disk, a pack replaced between epochs, two packs of one name."""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from conftest import make_photos, moto_s3, nginx_serving, real_media, run_bin

import hframe_cli as h
import hframe_cli.read.cache as cache_mod
from hframe_cli.read.cache import CacheWarning
from hframe_cli.storage.access import evict_from_page_cache


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A pack of real images made by others, and of our photos, served by nginx; yields
    (its URL, the local pack, the served folder)."""
    root = tmp_path_factory.mktemp("cache")
    src = make_photos(root / "src", 20)
    for i, p in enumerate(real_media(60)):
        shutil.copyfile(p, src / f"real{i:03d}{p.suffix}")
    www = root / "www"
    www.mkdir()
    assert run_bin(["pack", str(src), "-o", str(www / "p.hframe"), "-q"]).returncode == 0
    with nginx_serving(www, root / "nginx") as base:
        yield f"{base}/p.hframe", www / "p.hframe", www


def segments(cache: Path) -> list[str]:
    return sorted(glob.glob(str(cache / "hframe-cache-2" / "packs" / "*" / "seg" / "*")))


def test_a_second_epoch_reads_every_frame_from_the_cache_and_each_is_right(served, tmp_path):
    url, local, _ = served
    cache = tmp_path / "cache"
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
    ids = list(range(len(want)))
    random.Random(2).shuffle(ids)
    for epoch in range(2):
        with h.open_pack(url, cache_dir=cache) as p:
            opened = p.storage_counters().requests
            got = [data for k in range(0, len(ids), 16) for data in p.read_many(ids[k : k + 16])]
            assert got == [want[i] for i in ids]
            assert p[3] == want[3]
            counts, requests = p._cache.counts, p.storage_counters().requests - opened
        if epoch == 0:
            assert counts["misses"] == len(ids) and counts["filled_bytes"] == sum(map(len, want)) and requests > 0
        else:
            assert counts["hits"] == len(ids) + 1 and counts["misses"] == 0 and requests == 0
    # the same through the CLI, with the cache from the environment
    r = run_bin(["get", url, "7"], env={"HFRAME_CACHE_DIR": str(cache)})
    assert r.returncode == 0 and r.stdout == want[7]
    r = run_bin(["cache", "--cache-dir", str(cache), "--json"])
    doc = json.loads(r.stdout)
    assert (
        r.returncode == 0 and doc["packs"][0]["url"] == url and doc["packs"][0]["hits"] == len(ids) + 3
    )  # (p[3] hit in both epochs, and get 7)


def test_an_older_hframes_cache_beside_it_is_never_read_and_clear_removes_it(served, tmp_path):
    """A cache folder of the layout before (``hframe-cache-1``: 8-byte records, crc32) holding
    this very pack generation, every byte of it wrong: nothing of it is served or counted;
    ``hframe cache`` names it with its size, ``--clear`` removes it."""
    url, local, _ = served
    cache = tmp_path / "cache"
    with h.open_pack(url, cache_dir=cache) as p:
        want = p.read_many(list(range(len(p))))
    current = cache / "hframe-cache-2"
    old = cache / "hframe-cache-1"
    shutil.copytree(current, old)
    shutil.rmtree(current)
    for seg in old.rglob("seg/*"):
        seg.write_bytes(bytes(255 - b for b in seg.read_bytes()))
    with h.open_pack(url, cache_dir=cache) as p:
        assert p.read_many(list(range(len(p)))) == want
        assert p._cache.counts["hits"] == 0 and p._cache.counts["misses"] == len(want)
    r = run_bin(["cache", "--cache-dir", str(cache), "--json"])
    doc = json.loads(r.stdout)
    olds = doc["old_layouts"]
    assert len(olds) == 1 and olds[0]["folder"] == str(old) and olds[0]["bytes"] >= sum(map(len, want))
    r = run_bin(["cache", "--cache-dir", str(cache)])
    assert f"{old}:" in r.stdout.decode() and "--clear removes it" in r.stdout.decode()
    r = run_bin(["cache", "--cache-dir", str(cache), "--clear", "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and not old.exists() and doc["old_layouts"] == [] and doc["freed"] >= olds[0]["bytes"]


def test_a_flipped_byte_or_an_evicted_segment_is_fetched_again_never_served(served, tmp_path):
    url, local, _ = served
    cache = tmp_path / "cache"
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
        offsets = p.read_index_columns(["offset"]).column(0).to_pylist()
    with h.open_pack(url, cache_dir=cache) as p:
        p.read_many(list(range(len(want))))
    (seg,) = segments(cache)
    with open(seg, "r+b") as f:  # one bit of frame 5's bytes
        f.seek(offsets[5] + 3)
        b = f.read(1)
        f.seek(offsets[5] + 3)
        f.write(bytes([b[0] ^ 0x10]))
    with h.open_pack(url, cache_dir=cache) as p:
        assert p.read_many(list(range(len(want)))) == want
        assert p._cache.counts["dropped"] == 1 and p._cache.counts["misses"] == 1
    with h.open_pack(url, cache_dir=cache) as p:  # fetched again, and kept: all hits now
        assert p.read_many(list(range(len(want)))) == want and p._cache.counts["hits"] == len(want)
    os.unlink(seg)  # evicted under the records
    with h.open_pack(url, cache_dir=cache) as p:
        assert p.read_many(list(range(len(want)))) == want and p._cache.counts["misses"] == len(want)


def _fill(url: str, cache: str, seed: int, rounds: int, spread: bool = False) -> None:
    """A process reading random batches through the cache, checking every frame's md5;
    ``spread``: each batch first fetched as the sampler's read-ahead does, spread over the
    frames after it (``fill_cache(later=, run=)``)."""
    import hashlib

    with h.open_pack(url, cache_dir=cache) as p:
        md5s = p.read_index_columns(["md5"]).column(0).to_pylist()
        rng = random.Random(seed)
        everything = bytearray([1]) * len(p)
        for _ in range(rounds):
            batch = rng.sample(range(len(p)), 12)
            if spread:
                p.fill_cache(batch, later=everything, run=256 << 10)
            for i, data in zip(batch, p.read_many(batch)):
                assert hashlib.md5(data).hexdigest() == md5s[i], i
            i = rng.randrange(len(p))
            assert hashlib.md5(p[i]).hexdigest() == md5s[i]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_processes_filling_the_same_frames_at_once_never_read_a_wrong_byte(served, tmp_path, method):
    """Bounded stress: four processes (forked or spawned, as DataLoader workers are) reading
    random batches of the same frames through one cache at the same time, then a reader that
    finds every frame there."""
    url = served[0]
    held, frames = _run_then_read_all(served, tmp_path, method, [(url, seed, 60) for seed in range(4)])
    assert held > frames // 2  # (what the four sampled is there)


def test_spread_fills_and_readers_in_other_processes_at_once_never_read_a_wrong_byte(served, tmp_path):
    """Bounded stress: two processes filling spread runs (claimed and kept 8 MiB at a time, here
    a few frames) while two others read random batches of the same frames through one cache."""
    url = served[0]
    held, frames = _run_then_read_all(served, tmp_path, "fork", [(url, seed, 40, seed % 2 == 0) for seed in range(4)])
    assert held == frames  # (160 batches of 12 of 80 frames: all held)


def _run_then_read_all(served, tmp_path, method: str, jobs: list[tuple]) -> tuple[int, int]:
    """Run ``_fill(url, cache, *rest)`` for each job ``(url, *rest)`` in its own process (forked
    or spawned), all at once through one cache; then read every frame through that cache and
    compare it with the local pack's. Returns (frames found in the cache, frames)."""
    _, local, _ = served
    cache = str(tmp_path / "cache")
    ctx = multiprocessing.get_context(method)
    procs = [ctx.Process(target=_fill, args=(url, cache, *rest)) for url, *rest in jobs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
    with h.open_pack(jobs[0][0], cache_dir=cache) as p:
        assert p.read_many(list(range(len(want)))) == want
        return p._cache.counts["hits"], len(want)


def test_a_reader_pickled_into_a_spawned_process_keeps_its_cache(served, tmp_path):
    url, _, _ = served
    cache = tmp_path / "cache"
    with h.open_pack(url, cache_dir=cache) as p:
        p.read_many(list(range(10)))
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            counts = pool.apply(_hits_of_first_ten, (p,))
    assert counts["hits"] == 10 and counts["misses"] == 0


def _hits_of_first_ten(reader) -> dict:
    reader.read_many(list(range(10)))
    return reader._cache.counts


def test_a_fill_killed_between_bytes_and_records_leaves_nothing_trusted(served, tmp_path):
    url, local, _ = served
    cache = tmp_path / "cache"
    code = "import sys, hframe_cli as h; p = h.open_pack(sys.argv[1], cache_dir=sys.argv[2]); p.read_many(list(range(len(p))))"
    r = subprocess.run(
        [sys.executable, "-c", code, url, str(cache)], env={**os.environ, "HFRAME_FAULT": "cache-fill"}, timeout=120
    )
    assert r.returncode == -signal.SIGKILL
    assert segments(cache) and os.path.getsize(segments(cache)[0]) > 0  # the bytes were written ...
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
    with h.open_pack(url, cache_dir=cache) as p:  # ... but no record: nothing is read from them
        assert p.read_many(list(range(len(want)))) == want
        assert p._cache.counts["hits"] == 0 and p._cache.counts["misses"] == len(want)


def _read_with_a_small_file_size_limit(url: str, cache: str, want: list[bytes]) -> list[str]:
    """In a child: files may not grow past 64 KiB (EFBIG, as a full disk gives ENOSPC)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            with h.open_pack(url, cache_dir=cache) as p:
                assert p.read_many(list(range(len(want)))) == want
                assert p[0] == want[0]
    return [str(w.message) for w in seen if issubclass(w.category, CacheWarning)]


def test_a_full_or_unwritable_cache_warns_once_and_reads_go_on(served, tmp_path):
    url, local, _ = served
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        said = pool.apply(_read_with_a_small_file_size_limit, (url, str(tmp_path / "full"), want))
    # (a write cut short at the limit reads as a full disk; one refused outright, as EFBIG)
    assert len(said) == 1 and "reading on without it" in said[0], said
    assert "No space left on device" in said[0] or "File too large" in said[0], said
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"x")
    r = run_bin(["get", url, "4", "--cache-dir", str(blocked / "cache")])
    err = r.stderr.decode()
    assert r.returncode == 0 and r.stdout == want[4], err
    assert err.count("\n") == 1 and "warning: cache" in err and "reading on without it" in err, err


def test_a_pack_replaced_between_epochs_and_two_packs_of_one_name_each_get_their_own_bytes(served, tmp_path):
    url, local, www = served
    cache = tmp_path / "cache"
    other = make_photos(tmp_path / "other", 12)
    second = tmp_path / "www2"
    second.mkdir()
    assert run_bin(["pack", str(other), "-o", str(second / "p.hframe"), "-q"]).returncode == 0
    with h.open_pack(second / "p.hframe") as p:
        want_b = [p[i] for i in range(len(p))]
    with h.open_pack(local) as p:
        want_a = [p[i] for i in range(len(p))]
    with nginx_serving(second, tmp_path / "nginx2") as base:  # the same name on another server
        for _ in range(2):
            with h.open_pack(url, cache_dir=cache) as a, h.open_pack(f"{base}/p.hframe", cache_dir=cache) as b:
                assert a.read_many(list(range(len(a)))) == want_a
                assert b.read_many(list(range(len(b)))) == want_b
    # republished at the first URL (another pack, same name): its bytes, never the cached ones
    replaced = tmp_path / "www3"
    shutil.copytree(www, replaced)
    for suffix in ("", ".index.parquet"):
        shutil.copyfile(second / f"p.hframe{suffix}", replaced / f"p.hframe{suffix}")
    with nginx_serving(replaced, tmp_path / "nginx3") as base:
        with h.open_pack(f"{base}/p.hframe", cache_dir=cache) as b:
            # (the same generation as b's at the other server when nginx gives it the same ETag:
            # the same bytes; the cache keeps one folder per pack UUID, size and ETag)
            assert b.read_many(list(range(len(b)))) == want_b
    held = glob.glob(str(cache / "hframe-cache-2" / "packs" / "*"))
    assert len(held) in (2, 3) and len({os.path.basename(f)[:36] for f in held}) == 2  # two pack UUIDs


def test_an_s3_pack_epoch_two_makes_no_request_and_prefetch_and_prune_work(tmp_path):
    photos = make_photos(tmp_path / "photos", 40)
    local = tmp_path / "p.hframe"
    assert run_bin(["pack", str(photos), "-o", str(local), "-q"]).returncode == 0
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
    with moto_s3(tmp_path / "moto") as endpoint:
        fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
        fs.create_dir("bkt")
        for suffix in ("", ".index.parquet"):
            with fs.open_output_stream(f"bkt/p.hframe{suffix}") as f:
                f.write((tmp_path / f"p.hframe{suffix}").read_bytes())
        url = f"s3://bkt/p.hframe?endpoint_override={endpoint}&scheme=http"
        cache = tmp_path / "cache"
        r = run_bin(["prefetch", url, "--sample", "10", "--seed", "3", "--cache-dir", str(cache), "--json"])
        doc = json.loads(r.stdout)
        assert r.returncode == 0 and doc["frames"] == 10 and doc["fetched"] == 10, r.stderr
        r = run_bin(["prefetch", url, "--cache-dir", str(cache), "--json"])
        doc = json.loads(r.stdout)
        assert doc["fetched"] == len(want) - 10 and doc["held_already"] == 10
        with h.open_pack(url, cache_dir=cache) as p:
            opened = p.storage_counters().requests
            assert p.read_many(list(range(len(want)))) == want
            assert p.storage_counters().requests == opened and p._cache.counts["hits"] == len(want)
    r = run_bin(["cache", "--cache-dir", str(cache), "--prune", "--cache-limit", "1", "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["freed"] > 0 and doc["bytes"] == 0 and segments(cache) == []
    r = run_bin(["prefetch", str(local), "--cache-dir", str(cache)])
    assert r.returncode == 2 and b"prefetch is for remote packs" in r.stderr


def test_an_s3_packs_frames_through_the_cache_are_md5_checked_once_and_damage_still_fails(tmp_path, monkeypatch):
    """S3 reads are not pinned to the version opened, so every frame a reader returns has the
    index's md5: a frame through the node cache had it checked when it arrived (and its hash
    when read back), and is not hashed again; a frame whose md5 fails on arrival is not kept,
    and the read fails, naming it."""
    from hframe_cli.errors import ChecksumMismatch

    photos = make_photos(tmp_path / "photos", 30)
    local = tmp_path / "p.hframe"
    assert run_bin(["pack", str(photos), "-o", str(local), "-q"]).returncode == 0
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
        at7 = p._offsets[7]
    damaged = bytearray(local.read_bytes())
    damaged[at7 + 100] ^= 0xFF
    hashed: list[int] = []
    real = h.PackReader._check_md5

    def counted(self, ids, frames):
        hashed.extend(ids)
        return real(self, ids, frames)

    monkeypatch.setattr(h.PackReader, "_check_md5", counted)
    with moto_s3(tmp_path / "moto") as endpoint:
        fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
        fs.create_dir("bkt")
        for name, data in (("p", bytes(local.read_bytes())), ("bad", bytes(damaged))):
            for suffix, body in (("", data), (".index.parquet", (tmp_path / "p.hframe.index.parquet").read_bytes())):
                with fs.open_output_stream(f"bkt/{name}.hframe{suffix}") as f:
                    f.write(body)
        url = f"s3://bkt/p.hframe?endpoint_override={endpoint}&scheme=http"
        cache = tmp_path / "cache"
        ids = list(range(len(want)))
        for _ in range(2):  # (fetched and kept; then all from the cache)
            with h.open_pack(url, cache_dir=cache) as p:
                assert p.checks_md5 and p.read_many(ids) == want
        assert hashed == []
        with h.open_pack(url) as p:  # (without a cache: every frame checked as it comes)
            assert p.read_many(ids) == want
        assert sorted(hashed) == ids
        bad = f"s3://bkt/bad.hframe?endpoint_override={endpoint}&scheme=http"
        with h.open_pack(bad, cache_dir=cache) as p:
            assert p.read_many([6, 8]) == [want[6], want[8]]
            with pytest.raises(ChecksumMismatch, match="frame 7"):
                p.read_many([6, 7, 8])
            assert p._pack_cache().missing([6, 7, 8]) == [7]  # (never kept)


def test_the_samplers_read_ahead_fills_the_cache_ahead_of_the_items_handed_out_and_stops(served, tmp_path):
    import time

    from hframe_cli.errors import InputError
    from hframe_cli.training import BlockShuffleSampler, FrameDataset

    url, local, _ = served
    ds = FrameDataset(url, target=None, cache_dir=tmp_path / "cache")
    sampler = BlockShuffleSampler(  # (not spread: the frames past the window stay where they are)
        ds, seed=1, block=4, window=2, read_ahead=24, read_ahead_batch=8, read_ahead_run=0
    )
    it = iter(sampler)
    first = [next(it) for _ in range(16)]  # handed out: 16; read-ahead may fetch up to 16 + 24
    assert sampler.ahead.behind == 12  # (read_ahead // 2 of those handed out: a DataLoader's queue)
    cache = ds.reader._pack_cache()
    order = sampler.part()
    deadline = time.monotonic() + 30
    while cache.missing([ds.frame_ids[k] for k in order[16:40]]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cache.missing([ds.frame_ids[k] for k in order[16:40]]) == []  # the next 24, fetched
    assert len(cache.missing([ds.frame_ids[k] for k in order[40:]])) == len(order) - 40  # nothing past them
    rest = list(it)  # the epoch's end stops it
    assert first + rest == order and not sampler.ahead._thread.is_alive() and sampler.ahead.error is None
    with h.open_pack(local) as p:
        assert ds.__getitems__(order[16:40]) == p.read_many([ds.frame_ids[k] for k in order[16:40]])
    # a dropped iteration (set_epoch, a break) stops its read-ahead too
    sampler.set_epoch(1)
    it = iter(sampler)
    next(it)
    ahead = sampler.ahead
    it.close()
    assert not ahead._thread.is_alive()
    with pytest.raises(InputError, match="read_ahead needs"):
        BlockShuffleSampler(FrameDataset(local, target=None), read_ahead=8)


def test_a_spread_fill_takes_the_frames_read_later_right_after_each_and_nothing_else(served, tmp_path):
    """``fill_cache(later=, run=)``: after each frame asked for, the pack's next frames that the
    mask holds and the cache lacks, within ``run`` bytes of its start; never a frame the mask
    leaves out or one already held; in fewer requests than a frame each; every byte right."""
    url, local, _ = served
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
        offs = [p.range_of(i) for i in range(len(p))]
    n = len(want)
    later = bytearray(n)
    for i in [*range(4, 12), *range(41, 60), 70, 71]:
        later[i] = 1
    with h.open_pack(url, cache_dir=tmp_path / "cache") as p:
        p.read_many([6])  # held already: the run from 3 stops before it
        cache = p._pack_cache()
        before = p.storage_counters().requests
        fetched = p.fill_cache([3, 40, 69], later=later, run=1 << 30)
        requests = p.storage_counters().requests - before
        held = [i for i in range(n) if not cache.missing([i])]
        assert held == [3, 4, 5, 6, 40, *range(41, 60), 69, 70, 71] and fetched == len(held) - 1
        assert requests <= 3  # (a run each, where the frames lie back to back)
        # a run ends where ``run`` bytes from its frame's start would be passed
        end_of_9 = offs[9][0] + offs[9][1]
        assert p.fill_cache([7], later=later, run=end_of_9 - offs[7][0]) == 3
        assert [i for i in range(7, 12) if not cache.missing([i])] == [7, 8, 9]
        assert p.read_many(list(range(n))) == want
    # a frame outside the mask, and one past its end, are never taken
    with h.open_pack(url, cache_dir=tmp_path / "cache2") as p:
        cache = p._pack_cache()
        p.fill_cache([n - 2], later=bytearray(n - 1), run=1 << 30)
        assert [i for i in range(n) if not cache.missing([i])] == [n - 2]
        # a run of frames asked for that is already ``run`` long gets nothing (a block shuffle's)
        later = bytearray([1]) * n
        whole = offs[22][0] + offs[22][1] - offs[20][0]
        assert p.fill_cache([21, 20, 22], later=later, run=whole) == 3
        assert p.fill_cache([30, 31], later=later, run=whole) > 2
        assert [i for i in range(19, 24) if not cache.missing([i])] == [20, 21, 22]


@pytest.mark.parametrize("run", [0, 1 << 30])
def test_the_samplers_read_ahead_spreads_its_fetches_over_the_epochs_own_frames_only(served, tmp_path, run):
    """A plain shuffle's read-ahead (``read_ahead_run``): each fetch also takes the frames right
    after its own that the epoch reads later, so the cache holds more than the items fetched
    ahead, and never a frame the dataset leaves out (``match``); 0 turns it off."""
    import time

    from hframe_cli.training import BlockShuffleSampler, FrameDataset

    url, local, _ = served
    ds = FrameDataset(url, target=None, match="real*", cache_dir=tmp_path / "cache")
    sampler = BlockShuffleSampler(ds, seed=3, block=1, window=1, read_ahead=8, read_ahead_batch=4, read_ahead_run=run)
    it = iter(sampler)
    [next(it) for _ in range(4)]  # handed out: 4; read-ahead fetches the next 8 and, spread, their neighbours
    cache = ds.reader._pack_cache()
    order = sampler.part()

    def held_now() -> set[int]:
        return {i for i in range(len(ds.reader)) if not cache.missing([i])}

    deadline = time.monotonic() + 30  # (a hang's bound: what is in flight lands long before)
    while (cache.missing(ds.frames_of(order[4:12])) or (run and len(held_now()) <= 20)) and time.monotonic() < deadline:
        time.sleep(0.02)
    held = held_now()
    assert set(ds.frames_of(order[4:12])) <= held <= set(ds.frame_ids)  # never a frame the epoch does not read
    if run:
        assert len(held) > 20  # (the 60 real images lie back to back: runs of them)
    else:
        assert held <= set(ds.frames_of(order[:12]))
    rest = list(it)
    assert len(rest) == len(order) - 4 and sampler.ahead.error is None
    with h.open_pack(local) as p:
        assert ds.__getitems__(order) == p.read_many(ds.frames_of(order))


def test_a_frame_another_reader_is_fetching_is_waited_for_not_fetched_twice(tmp_path):
    """A claim (another process or thread fetching a frame now) makes a second reader wait for
    its bytes instead of asking the server again; a claim whose owner died is not waited for."""
    import threading
    import time

    from range_server import RangeServer

    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for i in range(40):  # (more than opening the pack reads)
        (blobs / f"{i:02d}.bin").write_bytes(os.urandom(40_000))
    www = tmp_path / "www"
    www.mkdir()
    h.pack([blobs], www / "p.hframe")
    cache = tmp_path / "cache"
    with RangeServer(www) as srv, h.open_pack(srv.url("p.hframe"), cache_dir=cache) as a:
        with h.open_pack(srv.url("p.hframe"), cache_dir=cache) as b:
            ca, ids = a._pack_cache(), [3, 4, 5, 30]
            assert ca.claim(ids) == (ids, [])
            data = a._read_batch(ids, None, None)
            offs = [a._offsets[i] for i in ids]
            before = srv.total_requests()
            filler = threading.Timer(0.3, ca.put_many, (ids, offs, data))
            filler.start()
            t0 = time.monotonic()
            assert b.read_many(ids) == data
            assert srv.total_requests() == before and time.monotonic() - t0 >= 0.25  # waited, asked nothing
            filler.join()
            # a claim left by a process that died: fetched at once
            dead = subprocess.Popen([sys.executable, "-c", "pass"])
            dead.wait()
            frames, size = b._pack_cache()._frames, cache_mod._RECORD.size
            frames[size * 9 : size * 10] = cache_mod._RECORD.pack(cache_mod._FILLING, dead.pid, 0)
            assert b._pack_cache().missing([9]) == [9]  # (the claim is there, its owner gone)
            t0 = time.monotonic()
            assert b.read_many([9]) == a._read_batch([9], None, None)
            assert time.monotonic() - t0 < cache_mod.FILLING_FOR / 2  # (not the wait for a live claim)


def test_small_neighbours_are_read_together_and_a_big_frame_alone():
    """``get_many``'s reads: frames under 8 KiB close to each other in one ``pread``; a big frame
    by itself, straight into the bytes returned (a run of big frames costs a buffer and copies)."""
    from hframe_cli.read.cache import _runs

    lens = [100, 200, 300, 40_000, 50, 60, 9_000]
    offs = [0, 100, 400, 700, 40_700, 40_750, 40_810]
    js = [6, 5, 4, 3, 2, 1, 0]  # (any order in: the big ones as asked, then the small in offset order)
    assert _runs(js, offs, lens) == [
        (40_810, 49_810, [6]),
        (700, 40_700, [3]),
        (0, 700, [0, 1, 2]),
        (40_700, 40_810, [4, 5]),
    ]
    far = [0, 100, 200_000]  # (small, but far apart: not merged)
    assert _runs([0, 1, 2], far, [10, 10, 10]) == [(0, 110, [0, 1]), (200_000, 200_010, [2])]


def test_neighbours_in_the_pack_are_written_to_the_cache_together_with_zeros_between():
    """``put_many``'s writes: a frame right after the one before in the pack (the next frame id,
    its record header apart) joins that write, the gap a part of zeros; a frame that is not
    the next one, one farther than a header away, or any frame of a pack whose offsets do not
    grow with the id (``ids`` None) is written alone."""
    from hframe_cli.read.cache import _WRITE_GAP, _writes

    offs = [100, 170, 210, 300, 300 + 40 + _WRITE_GAP + 1]
    datas = [b"a" * 50, b"b" * 30, b"c" * 40, b"d" * 40, b"e" * 10]
    ids = [0, 1, 2, 4, 5]  # (frame 3, between 2 and 4, is not among them)
    js = [4, 3, 2, 1, 0]  # (any order in: offset order out)
    assert list(_writes(js, ids, offs, datas)) == [
        (100, [datas[0], bytes(20), datas[1], bytes(10), datas[2]]),
        (300, [datas[3]]),  # (not frame 3: not merged, however close)
        (offs[4], [datas[4]]),  # (too far after frame 4)
    ]
    assert list(_writes(js, None, offs, datas)) == [(o, [d]) for o, d in zip(offs, datas)]


def test_a_frame_cached_between_two_filled_later_keeps_its_bytes(served, tmp_path, monkeypatch):
    """Frames 0 and 2 filled after frame 1 (not neighbours: written apart) leave frame 1's
    bytes as they were; neighbours filled together are one write holding every byte of each;
    a reader whose pack's offsets do not grow with the frame id writes frame by frame."""
    url, local, _ = served
    cache = tmp_path / "cache"
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
    writes: list[int] = []
    real = os.pwritev

    def counted(fd, parts, offset):
        writes.append(len(parts))
        return real(fd, parts, offset)

    monkeypatch.setattr(os, "pwritev", counted)
    with h.open_pack(url, cache_dir=cache) as p:
        assert p._pack_cache().in_order  # (a pack hframe writes)
        p.read_many([1])
        p.read_many([0, 2])
        assert writes == [1, 1, 1]
        p.read_many(list(range(3, 12)))
        assert writes[3:] == [9 + 8]  # (one write: nine frames, eight gaps)
        seg = segments(cache)[0]
        with open(seg, "rb") as f:
            held = f.read()
        for i in range(12):
            at = p._offsets[i]
            assert held[at : at + len(want[i])] == want[i], i
    with h.open_pack(url, cache_dir=cache) as p:
        assert p.read_many(list(range(12))) == want[:12]
        assert p._cache.counts["hits"] == 12 and p._cache.counts["dropped"] == 0
    writes.clear()
    with h.open_pack(url, cache_dir=tmp_path / "other") as p:
        p._pack_cache().in_order = False
        assert p.read_many(list(range(12, 20))) == want[12:20]
    assert writes == [1] * 8


@pytest.mark.parametrize("cold", [True, False])
def test_a_cold_batch_from_the_cache_is_asked_of_the_disk_at_once(served, tmp_path, monkeypatch, cold):
    """A batch whose first read from the cache came from the disk (``looks_cold``) has all its
    runs announced to the kernel at once (WILLNEED), as a cold ``read_many`` of a local pack; a
    warm one is read as it is. Either way every frame is right."""
    url, local, _ = served
    cache = tmp_path / "cache"
    with h.open_pack(local) as p:
        want = [p[i] for i in range(len(p))]
    ids = random.Random(4).sample(range(len(want)), 40)
    with h.open_pack(url, cache_dir=cache) as p:
        p.read_many(ids)  # fills the cache
    for seg in segments(cache):
        evict_from_page_cache(seg)
    announced: list[int] = []
    real = cache_mod._will_need
    monkeypatch.setattr(cache_mod, "looks_cold", lambda seconds, nbytes: cold)
    monkeypatch.setattr(
        cache_mod, "_will_need", lambda plan: (announced.extend(len(r) for _, _, r in plan), real(plan))
    )
    with h.open_pack(url, cache_dir=cache) as p:
        opened = p.storage_counters().requests
        assert p.read_many(ids) == [want[i] for i in ids]
        assert p._cache.counts["hits"] == len(ids) and p.storage_counters().requests == opened
    assert (sum(announced) > 2) if cold else announced == []
