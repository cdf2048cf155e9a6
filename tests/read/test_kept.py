"""Kept copies of remote opens (``storage/kept.py``): an open through the node cache asks the
store only whether the index (and, on an object store, the pack's header and trailer) is still
the version kept; a replaced, damaged or mismatched copy is never what a reader uses."""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from conftest import make_photos, moto_s3, nginx_serving, real_media, run_bin

import hframe_cli as h
from hframe_cli.errors import ChecksumMismatch
from hframe_cli.read.cache import NodeCache
from hframe_cli.storage.kept import Copy, KeptCopies


def kept_of(cache: Path) -> KeptCopies:
    return KeptCopies(NodeCache(cache).kept_folder)


def frames_of(pack: Path) -> list[bytes]:
    with h.open_pack(pack) as p:
        return [p[i] for i in range(len(p))]


def packed(tmp_path: Path, name: str, count: int, real: int = 0) -> Path:
    src = make_photos(tmp_path / f"{name}-src", count)
    for i, p in enumerate(real_media(real)):
        shutil.copyfile(p, src / f"real{i:03d}{p.suffix}")
    out = tmp_path / f"{name}.hframe"
    assert run_bin(["pack", str(src), "-o", str(out), "-q"]).returncode == 0
    return out


def publish(pack: Path, www: Path) -> None:
    """``pack`` and its index at ``www/p.hframe`` (renamed into place, as a publish does)."""
    for suffix in ("", ".index.parquet"):
        tmp = www / f".tmp{suffix}"
        shutil.copyfile(f"{pack}{suffix}", tmp)
        os.replace(tmp, www / f"p.hframe{suffix}")


def test_over_http_a_second_open_takes_the_index_from_the_cache_and_a_changed_or_damaged_one_never(tmp_path):
    a = packed(tmp_path, "a", 30, real=20)
    b = packed(tmp_path, "b", 12)
    want_a, want_b = frames_of(a), frames_of(b)
    www = tmp_path / "www"
    www.mkdir()
    publish(a, www)
    cache = tmp_path / "cache"
    kept = kept_of(cache)
    with nginx_serving(www, tmp_path / "nginx") as base:
        url = f"{base}/p.hframe"
        index_url = url + ".index.parquet"
        with h.open_pack(url, cache_dir=cache) as p:  # (fetched, then kept)
            assert not p._index.from_copy and p._index.counters.bytes == os.path.getsize(f"{a}.index.parquet")
            assert p.read_many(list(range(len(p)))) == want_a
        assert kept.holds(index_url) and not kept.holds(url)  # (over HTTP a pack's header is always fetched)
        for _ in range(2):
            with h.open_pack(url, cache_dir=cache) as p:
                assert p._index.from_copy and p._index.counters.bytes == 0 and p._index.counters.requests == 1
                assert not p._storage.from_copy
                assert p.read_many(list(range(len(p)))) == want_a
        # a byte flipped in the copy: found by its hash, deleted, fetched and kept again
        path = kept.path_of(index_url)
        data = bytearray(Path(path).read_bytes())
        data[len(data) // 2] ^= 0x01
        Path(path).write_bytes(bytes(data))
        with h.open_pack(url, cache_dir=cache) as p:
            assert not p._index.from_copy and p.read_many(list(range(len(p)))) == want_a
        assert kept.get(index_url) is not None
        # republished at the URL: the new pack's bytes, never the copy's index
        publish(b, www)
        with h.open_pack(url, cache_dir=cache) as p:
            assert not p._index.from_copy and p.read_many(list(range(len(p)))) == want_b
        # a copy under the ETag the server gives now that holds another pack's index (two
        # versions with one ETag: nginx's is the modification second and the size) does not
        # belong with the pack's header: dropped, and the index fetched
        now = kept.get(index_url)
        assert now is not None
        foreign = Path(f"{a}.index.parquet").read_bytes()
        for size in (now.size, len(foreign)):  # (a copy said to be the object's size, or its own)
            kept.put(index_url, Copy(now.etag, size, foreign))
            with h.open_pack(url, cache_dir=cache) as p:
                assert not p._index.from_copy and p.read_many(list(range(len(p)))) == want_b
            assert kept.get(index_url).head == Path(f"{b}.index.parquet").read_bytes()
        # the same where the copy cannot be deleted (a read-only cache; here an immutable file,
        # which root cannot delete either): refused by this open, never used, never a failure
        kept.put(index_url, Copy(now.etag, now.size, foreign))
        copy_file = kept.path_of(index_url)
        if subprocess.run(["chattr", "+i", copy_file], capture_output=True).returncode == 0:
            try:
                with h.open_pack(url, cache_dir=cache) as p:
                    assert not p._index.from_copy and p.read_many(list(range(len(p)))) == want_b
                assert Path(copy_file).read_bytes().endswith(foreign)  # (still there, untouched)
            finally:
                subprocess.run(["chattr", "-i", copy_file], check=True)
        # what the CLI shows, and --clear removes them
        r = run_bin(["cache", "--cache-dir", str(cache), "--json"])
        doc = json.loads(r.stdout)
        assert r.returncode == 0 and doc["kept"]["files"] == 1 and doc["kept"]["bytes"] > 0
        r = run_bin(["get", url, "3"], env={"HFRAME_CACHE_DIR": str(cache)})
        assert r.returncode == 0 and r.stdout == want_b[3]
        r = run_bin(["cache", "--cache-dir", str(cache), "--clear", "--json"])
        assert r.returncode == 0 and json.loads(r.stdout)["kept"]["files"] == 0 and not kept.holds(index_url)


def _s3_put(fs, key: str, data: bytes) -> None:
    with fs.open_output_stream(key) as f:
        f.write(data)


def test_on_s3_a_second_open_asks_only_for_metadata_and_a_copy_that_fails_a_check_is_dropped(tmp_path):
    local = packed(tmp_path, "p", 40, real=10)
    want = frames_of(local)
    index = Path(f"{local}.index.parquet").read_bytes()
    with moto_s3(tmp_path / "moto") as endpoint:
        fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
        fs.create_dir("bkt")
        _s3_put(fs, "bkt/p.hframe", local.read_bytes())
        _s3_put(fs, "bkt/p.hframe.index.parquet", index)
        url = f"s3://bkt/p.hframe?endpoint_override={endpoint}&scheme=http"
        cache = tmp_path / "cache"
        kept = kept_of(cache)
        with h.open_pack(url, cache_dir=cache) as p:
            assert not p._storage.from_copy and p.read_many(list(range(len(p)))) == want
        for _ in range(2):  # every frame from the cache, and the open: two metadata requests, no data
            with h.open_pack(url, cache_dir=cache) as p:
                assert p._storage.from_copy and p._index.from_copy
                assert p._storage.counters.bytes == 0 and p._index.counters.bytes == 0
                assert p.read_many(list(range(len(p)))) == want
                assert p._storage.counters.bytes == 0
        # a frame that fails its md5 in a pack opened from copies: the error as ever (damage is
        # damage), and the copies dropped (had a publish raced the open that kept them, they
        # could name other bytes): the next open fetches both
        with h.open_pack(local) as p:
            at7 = p._offsets[7]
        damaged = bytearray(local.read_bytes())
        damaged[at7 + 50] ^= 0xFF
        _s3_put(fs, "bkt/bad.hframe", bytes(damaged))
        _s3_put(fs, "bkt/bad.hframe.index.parquet", index)
        bad = f"s3://bkt/bad.hframe?endpoint_override={endpoint}&scheme=http"
        bad_index = f"s3://bkt/bad.hframe.index.parquet?endpoint_override={endpoint}&scheme=http"
        with h.open_pack(bad, cache_dir=cache) as p:
            assert p.read_many([6, 8]) == [want[6], want[8]]
        assert kept.holds(bad) and kept.holds(bad_index)
        with h.open_pack(bad, cache_dir=cache) as p:
            assert p._storage.from_copy and p._index.from_copy
            with pytest.raises(ChecksumMismatch, match="frame 7"):
                p.read_many([6, 7])
        assert not kept.holds(bad) and not kept.holds(bad_index) and kept.holds(url)
        with h.open_pack(bad, cache_dir=cache) as p:
            assert not p._index.from_copy and p.read_many([6, 8]) == [want[6], want[8]]
        # republished under the same key: other bytes, another ETag: fetched, never the copy
        other = packed(tmp_path, "q", 9)
        _s3_put(fs, "bkt/p.hframe", other.read_bytes())
        _s3_put(fs, "bkt/p.hframe.index.parquet", Path(f"{other}.index.parquet").read_bytes())
        with h.open_pack(url, cache_dir=cache) as p:
            assert not p._storage.from_copy and not p._index.from_copy
            assert p.read_many(list(range(len(p)))) == frames_of(other)


def test_a_reader_pickled_into_a_spawned_worker_opens_from_the_copies(tmp_path):
    local = packed(tmp_path, "p", 20)
    www = tmp_path / "www"
    www.mkdir()
    publish(local, www)
    cache = tmp_path / "cache"
    with nginx_serving(www, tmp_path / "nginx") as base:
        code = (
            "import pickle, sys\n"
            "p = pickle.loads(sys.stdin.buffer.read())\n"
            "sys.stdout.write(f'{p._index.from_copy} {p._index.counters.bytes} {len(p.read_many([0, 5, 9]))}')\n"
        )
        import pickle

        with h.open_pack(f"{base}/p.hframe", cache_dir=cache) as p:
            r = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(p), capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout.decode() == "True 0 3", r.stderr.decode()[-2000:]


_READER = r"""
import hashlib, random, sys, time
import hframe_cli as h
from hframe_cli.errors import HframeError
url, cache, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng, end = random.Random(seed), time.monotonic() + 5
reads = copies = refused = 0
while time.monotonic() < end:
    try:
        with h.open_pack(url, cache_dir=cache) as p:
            copies += p._index.from_copy
            want = p.table.column("md5").to_pylist()
            ids = rng.sample(range(len(p)), min(16, len(p)))
            for i, data in zip(ids, p.read_many(ids)):
                if hashlib.md5(data).hexdigest() != want[i]:
                    sys.exit(f"frame {i}: another version's bytes")
                reads += 1
    except HframeError:
        refused += 1  # refused as replaced, or caught mid-publish: never data
print(reads, copies, refused)
"""


def test_readers_through_one_cache_while_the_pack_is_republished_never_get_wrong_bytes(tmp_path):
    """Two reader processes open the pack over nginx through one node cache (taking the index
    from its copy when they can, keeping it when they fetch it) while this process republishes
    it, alternating two versions: every frame read is its version's bytes, or the read is
    refused. Bounded: 5 s."""
    versions = []
    for v in range(2):
        src = tmp_path / f"src{v}"
        src.mkdir()
        for i in range(80):  # the same names, other bytes (and sizes: nginx's ETags then differ)
            (src / f"{i:03d}.bin").write_bytes(bytes([v]) * (100 + v) + random.Random(i).randbytes(900 + 7 * i))
        out = tmp_path / f"v{v}.hframe"
        h.pack([src], out)
        versions.append(out)
    www = tmp_path / "www"
    www.mkdir()
    publish(versions[0], www)
    cache = tmp_path / "cache"
    with nginx_serving(www, tmp_path / "nginx") as base:
        readers = [
            subprocess.Popen(
                [sys.executable, "-c", _READER, f"{base}/p.hframe", str(cache), str(seed)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for seed in range(2)
        ]
        n = 0
        while any(r.poll() is None for r in readers):
            n += 1
            publish(versions[n % 2], www)
            # (a pause: opens between publishes find the copy the one before kept)
            for r in readers:
                try:
                    r.wait(0.25)
                except subprocess.TimeoutExpired:
                    pass
        outs = [r.communicate(timeout=30) for r in readers]
    assert n >= 3  # it did republish, several times
    for r, (out, err) in zip(readers, outs):
        assert r.returncode == 0, err.decode()[-2000:]
        reads, copies, _ = map(int, out.split())
        assert reads > 0 and copies > 0, out
    assert glob.glob(str(cache / "hframe-cache-2" / "kept" / "*"))


def test_kept_copies_are_whole_or_nothing():
    """The file format: a copy read back is the one written; torn, damaged or foreign bytes
    are no copy (and deleted)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        kept = KeptCopies(os.path.join(d, "kept"))
        assert kept.get("http://x/a") is None and not kept.holds("http://x/a")
        copy = Copy('"abc"', 1000, os.urandom(300), os.urandom(40))
        kept.put("http://x/a", copy)
        assert kept.get("http://x/a") == copy and kept.get("http://y/a") is None  # (another server)
        kept.put("http://x/b", Copy("", 10, b"x"))  # (no ETag: nothing to keep it under)
        assert not kept.holds("http://x/b")
        path = Path(kept.path_of("http://x/a"))
        inode = path.stat().st_ino
        kept.put("http://x/a", copy)  # (the same copy again, as ranks opening at once do: not rewritten)
        assert path.stat().st_ino == inode
        kept.put("http://x/a", Copy('"abd"', 1000, copy.head, copy.tail))  # (another version: replaced)
        assert path.stat().st_ino != inode and kept.get("http://x/a").etag == '"abd"'
        kept.put("http://x/a", copy)
        whole = path.read_bytes()
        for broken in (whole[:-1], whole + b"x", b"HFK2" + whole[4:], whole[:10]):
            path.write_bytes(broken)
            assert kept.get("http://x/a") is None and not path.exists()
        kept.put("http://x/a", copy)
        kept.forget("http://x/a")
        assert not kept.holds("http://x/a")


def test_prefetch_of_a_sample_keeps_many_requests_in_flight_and_fetches_only_the_sample(tmp_path):
    """A sample's frames are scattered, a request each, and each waits a round trip: prefetch
    keeps up to 64 in flight (a reader's default is 16), and fetches the sample's bytes only."""
    from range_server import RangeServer

    from hframe_cli.read.warm import IN_FLIGHT, prefetch

    src = tmp_path / "src"
    src.mkdir()
    for i in range(600):  # (3 KB apart: a sample of 1 in 4 leaves gaps no request bridges)
        (src / f"{i:04d}.bin").write_bytes(random.Random(i).randbytes(3000))
    (tmp_path / "www").mkdir()
    h.pack([src], tmp_path / "www" / "p.hframe")
    want = frames_of(tmp_path / "www" / "p.hframe")
    with RangeServer(tmp_path / "www") as srv:
        srv.latency_s = 0.05
        doc = prefetch(srv.url("p.hframe"), cache_dir=str(tmp_path / "cache"), sample=150, seed=4)
        peak = srv.peak_waiting
        with h.open_pack(srv.url("p.hframe"), cache_dir=tmp_path / "cache") as p:
            ids = sorted(random.Random(4).sample(range(600), 150))
            assert p.read_many(ids) == [want[i] for i in ids] and p._cache.counts["hits"] == 150
    assert doc["fetched"] == 150 and doc["fetched_bytes"] == 150 * 3000
    assert 16 < peak <= IN_FLIGHT, peak
