"""Versions a web server names alike: nginx's ETag is a file's mtime in whole seconds and its
size, so two packs of one size written within a second share it, and ``If-Match`` would let the
second's bytes through to a reader of the first at the first's offsets. hframe's publishes give
each version a later second; a reader of a pack written a moment ago checks every frame's md5;
a frame the node cache found wrong is never returned (``man/hframe.5``, PUBLISHING AND READERS).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import nginx_serving, run_bin

import hframe_cli as h
from hframe_cli.durable import later_than_replaced, write_atomically
from hframe_cli.errors import ChecksumMismatch, PackReplaced
from hframe_cli.storage.http import TAG_SETTLED_S, tag_may_repeat
from hframe_cli.storage.wire import Answer


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two packs of one size whose frames differ at every offset (the same files, each holding
    its neighbour's bytes): (folder A, pack A, folder B, pack B)."""
    root = tmp_path_factory.mktemp("pair")
    a, b = root / "a", root / "b"
    a.mkdir()
    rng = random.Random(5)
    for k in range(60):  # ~2 MB: most frames lie past the open's first 64 KiB
        (a / f"{k:03d}.bin").write_bytes(rng.randbytes(rng.randrange(20_000, 45_000)))
    files = sorted(p for p in a.rglob("*") if p.is_file())
    for k, f in enumerate(files):
        (b / f.relative_to(a)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files[(k + 1) % len(files)], b / f.relative_to(a))
    packs = []
    for src in (a, b):
        assert run_bin(["pack", str(src), "-o", str(root / f"{src.name}.hframe"), "-q"]).returncode == 0
        packs.append(root / f"{src.name}.hframe")
    assert packs[0].stat().st_size == packs[1].stat().st_size
    with h.open_pack(packs[0]) as pa_, h.open_pack(packs[1]) as pb:
        assert all(pa_[i] != pb[i] for i in range(len(pa_)))
    return a, packs[0], b, packs[1]


def etag(url: str) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as r:
        return r.headers["ETag"]


def frames(pack: Path) -> list[bytes]:
    with h.open_pack(pack) as p:
        return [p[i] for i in range(len(p))]


def place(pack: Path, site: Path, mtime: float) -> Path:
    """A copy of ``pack`` and its index in ``site`` as ``p.hframe``, both modified at ``mtime``."""
    out = site / "p.hframe"
    for suffix in ("", ".index.parquet"):
        shutil.copyfile(f"{pack}{suffix}", f"{out}{suffix}")
        os.utime(f"{out}{suffix}", (mtime, mtime))
    return out


def place_damaged(pack: Path, site: Path, frame: int) -> Path:
    """``place`` of ``pack`` with one byte of ``frame`` flipped in place, modified long ago (its
    ETag settled: a reader of it is pinned)."""
    with h.open_pack(pack) as p:
        at = p._offsets[frame] + 10
    published = place(pack, site, time.time())
    with open(published, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    settled = time.time() - 100
    os.utime(published, (settled, settled))
    return published


def test_a_same_size_pack_published_within_the_same_second_gets_another_etag(pair, tmp_path):
    """``hframe pack --force`` over a pack of the same size whose mtime is this second (here: a
    minute ahead, as a clock step would leave it) publishes with a later second: nginx's ETag
    changes, and a reader of the old pack gets PackReplaced, never the new one's bytes."""
    a, pack_a, b, _ = pair
    site = tmp_path / "site"
    site.mkdir()
    ahead = int(time.time()) + 60
    published = place(pack_a, site, ahead)
    want = frames(pack_a)
    with nginx_serving(site, tmp_path / "nginx") as base:
        url = f"{base}/p.hframe"
        before = etag(url)
        with h.open_pack(url) as p:
            assert p[3] == want[3]
            assert run_bin(["pack", str(b), "-o", str(published), "--force", "-q"]).returncode == 0
            assert published.stat().st_size == pack_a.stat().st_size
            assert int(published.stat().st_mtime) == ahead + 1
            assert int(Path(f"{published}.index.parquet").stat().st_mtime) == ahead + 1
            assert etag(url) != before
            for read in (lambda: p[50], lambda: p.read_many(list(range(len(want))))):
                with pytest.raises(PackReplaced):
                    read()
        with h.open_pack(url) as p:  # (the new version, opened again, reads as itself)
            assert [p[i] for i in range(len(p))] == frames(published)


def test_a_reader_of_a_pack_written_a_moment_ago_checks_md5s_and_tells_a_same_etag_replace(pair, tmp_path):
    """A pack moved into place by another tool (``mv``) over one of the same size written in the
    same second keeps its ETag: a reader that opened it within ``TAG_SETTLED_S`` checks each
    frame's md5, and a frame that fails from a pack whose header names another one now is
    PackReplaced (exit 3), not damage. A pack written earlier is read pinned, unchecked."""
    _, pack_a, _, pack_b = pair
    site = tmp_path / "site"
    site.mkdir()
    now = int(time.time()) + 60  # ("a moment ago" however long the set-up takes: any second not yet past)
    published = place(pack_a, site, now)
    staged = tmp_path / "staged.hframe"
    place(pack_b, tmp_path, now).rename(staged)  # (place names it p.hframe: the index goes along)
    os.replace(tmp_path / "p.hframe.index.parquet", f"{staged}.index.parquet")
    want = frames(pack_a)
    ids = list(range(len(want)))
    with nginx_serving(site, tmp_path / "nginx") as base:
        url = f"{base}/p.hframe"
        before = etag(url)
        with h.open_pack(url) as p, h.open_pack(url, cache_dir=tmp_path / "cache") as c:
            assert p.checks_md5 and not p._storage.pinned and c.checks_md5
            assert p.read_many(ids[:10]) == want[:10] and c.read_many(ids[:10]) == want[:10]
            os.replace(staged, published)
            os.replace(f"{staged}.index.parquet", f"{published}.index.parquet")
            assert etag(url) == before  # (the case: If-Match cannot tell)
            for reader in (p, c):
                for read in (
                    lambda r=reader: r[20],
                    lambda r=reader: r.read_many(ids),
                    lambda r=reader: r.read_many_into(ids),
                ):
                    with pytest.raises(PackReplaced, match="replaced since this reader opened it"):
                        read()
        settled = time.time() - 2 * TAG_SETTLED_S - 5
        for suffix in ("", ".index.parquet"):
            os.utime(f"{published}{suffix}", (settled, settled))
        with h.open_pack(url) as p:
            assert p._storage.pinned and not p.checks_md5


def test_a_pinned_reader_never_returns_a_frame_the_node_cache_found_wrong(pair, tmp_path):
    """Reads pinned by a settled ETag are not md5-checked, but a frame that arrives for the node
    cache is: one that fails is neither kept nor returned; the read fails naming it."""
    _, pack_a, _, _ = pair
    site = tmp_path / "site"
    site.mkdir()
    want = frames(pack_a)
    place_damaged(pack_a, site, frame=7)
    with nginx_serving(site, tmp_path / "nginx") as base:
        with h.open_pack(f"{base}/p.hframe", cache_dir=tmp_path / "cache") as p:
            assert p._storage.pinned and not p.checks_md5
            assert p.read_many([6, 8]) == [want[6], want[8]]
            for read in (lambda: p.read_many([6, 7, 8]), lambda: p[7], lambda: p.read_many_into([7])):
                with pytest.raises(ChecksumMismatch, match="frame 7: md5 mismatch"):
                    read()
            assert p._pack_cache().missing([6, 7, 8]) == [7]  # (never kept)
        r = run_bin(["--cache-dir", str(tmp_path / "cache"), "get", f"{base}/p.hframe", "7"])
        assert r.returncode == 1 and b"frame 7" in r.stderr and not r.stdout


def test_a_same_etag_swap_under_a_pinned_reader_with_a_cache_is_pack_replaced(pair, tmp_path):
    """A pack written long ago replaced by one staged in its second (moved in with its mtime
    kept: what hframe's publishes never do) carries its ETag, and a reader opened on the first
    is pinned; through the node cache every frame is md5-checked on arrival, and one that fails
    from a pack whose header names another one now is PackReplaced, not damage."""
    _, pack_a, _, pack_b = pair
    site = tmp_path / "site"
    site.mkdir()
    long_ago = time.time() - 3600
    published = place(pack_a, site, long_ago)
    staged = tmp_path / "staged.hframe"
    place(pack_b, tmp_path, long_ago).rename(staged)
    os.replace(tmp_path / "p.hframe.index.parquet", f"{staged}.index.parquet")
    want = frames(pack_a)
    with nginx_serving(site, tmp_path / "nginx") as base:
        url = f"{base}/p.hframe"
        before = etag(url)
        with h.open_pack(url, cache_dir=tmp_path / "cache") as p:
            assert p._storage.pinned and not p.checks_md5
            assert p.read_many(list(range(10))) == want[:10]
            os.replace(staged, published)
            assert etag(url) == before
            for read in (lambda: p[30], lambda: p.read_many(list(range(len(want))))):
                with pytest.raises(PackReplaced, match="replaced since this reader opened it"):
                    read()


def test_a_frame_another_process_gave_up_is_checked_before_a_pinned_reader_returns_it(pair, tmp_path):
    """A frame another process had claimed for the cache and gave up (its fetch failed, or its
    md5 did) is fetched by the reader that waited for it: checked like its own, never returned
    wrong."""
    _, pack_a, _, _ = pair
    site = tmp_path / "site"
    site.mkdir()
    place_damaged(pack_a, site, frame=7)
    cache = tmp_path / "cache"
    code = (
        "import sys, hframe_cli as h\n"
        "p = h.open_pack(sys.argv[1], cache_dir=sys.argv[2])\n"
        "c = p._pack_cache()\n"
        "assert c.claim([7]) == ([7], [])\n"
        "print('claimed', flush=True)\n"
        "sys.stdin.readline()\n"
        "c.release([7])\n"
    )
    with nginx_serving(site, tmp_path / "nginx") as base:
        url = f"{base}/p.hframe"
        with h.open_pack(url, cache_dir=cache) as p:
            assert p._storage.pinned and not p.checks_md5
            holder = subprocess.Popen(
                [sys.executable, "-c", code, url, str(cache)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            try:
                assert holder.stdout is not None and holder.stdout.readline() == b"claimed\n"
                outcome: list[BaseException | list[bytes]] = []

                def read() -> None:
                    try:
                        outcome.append(p.read_many([6, 7, 8]))
                    except BaseException as e:  # noqa: BLE001 - the outcome is the test's
                        outcome.append(e)

                reader = threading.Thread(target=read)
                reader.start()
                time.sleep(0.3)  # (waiting for the claim: nothing returned yet)
                assert not outcome
                holder.communicate(b"\n", timeout=30)  # given up unfilled
                reader.join(30)
            finally:
                if holder.poll() is None:
                    holder.kill()
            assert len(outcome) == 1 and isinstance(outcome[0], ChecksumMismatch), outcome
            assert "frame 7" in str(outcome[0])


def test_verify_calls_problems_found_after_a_same_etag_swap_a_publish_not_damage(pair, tmp_path):
    """verify's frames that fail from a pack whose header names another pack now (an ETag both
    versions carry) are "replaced while it was verified" (exit 3), not damage; with the pack
    still the one opened, the problems stand."""
    from hframe_cli.storage.access import open_storage
    from hframe_cli.verify.check import _replaced_while_read
    from hframe_cli.verify.report import PackReport, Problem

    _, pack_a, _, pack_b = pair
    site = tmp_path / "site"
    site.mkdir()
    long_ago = time.time() - 3600
    published = place(pack_a, site, long_ago)
    staged = tmp_path / "staged.hframe"
    shutil.copyfile(pack_b, staged)
    os.utime(staged, (long_ago, long_ago))

    def report() -> PackReport:
        r = PackReport(str(published), None, "index", "full")
        r.problems.append(Problem("md5", "frame 30: md5 mismatch", frame_id=30))
        return r

    with nginx_serving(site, tmp_path / "nginx") as base, open_storage(f"{base}/p.hframe") as storage:
        assert storage.pinned
        same = report()
        _replaced_while_read(same, storage)
        assert same.problems and same.error is None  # (the pack opened: damage stands)
        os.replace(staged, published)
        swapped = report()
        _replaced_while_read(swapped, storage)
        assert not swapped.problems and swapped.error_is_storage
        assert "replaced while it was verified" in (swapped.error or "")


def test_a_compressed_frame_that_does_not_decode_says_so_through_a_pinned_readers_cache(tmp_path):
    """A frame that fails on arrival for the node cache is reported with what is wrong with it:
    zstd data that does not decompress says that, not "md5 mismatch"."""
    from hframe_cli.errors import FormatError

    src = tmp_path / "src"
    src.mkdir()
    for k in range(8):
        (src / f"{k}.txt").write_bytes(f"line {k} of a frame that compresses well\n".encode() * 2000)
    site = tmp_path / "site"
    site.mkdir()
    pack = site / "p.hframe"
    assert run_bin(["pack", str(src), "-o", str(pack), "--compress", "zstd", "-q"]).returncode == 0
    with h.open_pack(pack) as p:
        assert p.compressed
        at = p._offsets[3]
    with open(pack, "r+b") as f:  # frame 3's zstd magic number
        f.seek(at)
        f.write(b"\x00" * 4)
    settled = time.time() - 100
    os.utime(pack, (settled, settled))
    with nginx_serving(site, tmp_path / "nginx") as base:
        with h.open_pack(f"{base}/p.hframe", cache_dir=tmp_path / "cache") as p:
            assert p._storage.pinned and not p.checks_md5
            with pytest.raises(FormatError, match="frame 3") as raised:
                p.read_many([2, 3, 4])
            assert "md5" not in str(raised.value)


def answer(headers: dict[str, str]) -> Answer:
    return Answer(200, "OK", {k.lower(): v for k, v in headers.items()}, True)


def test_which_etags_may_name_a_later_version():
    now = 1_800_000_000
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now))
    size = 123456
    nginx = f'"{now:x}-{size:x}"'
    assert tag_may_repeat(nginx, size, answer({"Date": date}))  # written this second
    assert tag_may_repeat(f'"{now - 1:x}-{size:x}"', size, answer({"Date": date}))
    assert not tag_may_repeat(f'"{now - TAG_SETTLED_S:x}-{size:x}"', size, answer({"Date": date}))
    assert tag_may_repeat(nginx, -1, answer({"Date": date}))  # (a 304: no size said)
    assert tag_may_repeat(nginx, size, answer({}))  # no clock to say the second is past
    assert not tag_may_repeat(f'"{now:x}-{size + 1:x}"', size, answer({"Date": date}))  # (not the size: not nginx's)
    for other in (f'"{now:x}-{size:x}-5f3a"', f'W/"{now:x}-{size:x}"', '"d41d8cd98f00b204e9800998ecf8427e"', None):
        assert not tag_may_repeat(other, size, answer({"Date": date}))


def test_a_replacing_file_of_the_same_size_gets_a_later_second(tmp_path):
    old, new = tmp_path / "f", tmp_path / "f.partial"
    old.write_bytes(b"x" * 10)
    t = int(time.time()) + 30
    os.utime(old, (t, t))
    new.write_bytes(b"y" * 10)
    later_than_replaced(new, old)
    assert int(new.stat().st_mtime) == t + 1
    new.write_bytes(b"y" * 11)  # another size too (S, S', S in one second: S's ETag again)
    os.utime(new, (t - 5, t - 5))
    later_than_replaced(new, old, durable=True)
    assert int(new.stat().st_mtime) == t + 1
    os.utime(new, (t + 7, t + 7))  # already later: left as it is
    later_than_replaced(new, old)
    assert int(new.stat().st_mtime) == t + 7
    later_than_replaced(new, tmp_path / "none")  # (nothing replaced: nothing to do)
    write_atomically(old, b"z" * 10)  # every atomic replace does it
    assert int(old.stat().st_mtime) == t + 1
