"""Remote packs over HTTP: every read a ranged GET against a real server on loopback
(``range_server.RangeServer``: the stdlib HTTP server with byte ranges, ETags, If-Match and
faults on cue). Each fault must end in bounded retries and then the documented answer: the
bytes, or one line with exit 3 (environment) or 2 (usage), never exit 1 (bad data), never a hang.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import assert_commands_agree, assert_ctrl_c_ends_a_stuck_read, make_photos, nginx_serving, run_bin
from range_server import RangeServer

import hframe_cli as h
from hframe_cli.errors import InputError, PackReplaced, StorageError
from hframe_cli.read.reader import PackReader
from hframe_cli.storage.http import PROBE_BYTES

FAST_FAIL = {"HFRAME_IO_ATTEMPTS": "3", "HFRAME_IO_REQUEST_TIMEOUT": "0.5", "HFRAME_IO_TIMEOUT": "5"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A pack of photos and 400 blobs (well past the 64 KiB first request), served over HTTP."""
    root = tmp_path_factory.mktemp("served")
    src = make_photos(root / "src", 30)
    rng = random.Random(3)
    for i in range(400):
        (src / "blobs" / f"{i:03d}.bin").parent.mkdir(exist_ok=True)
        (src / "blobs" / f"{i:03d}.bin").write_bytes(rng.randbytes(rng.randrange(500, 6000)))
    h.pack([src], root / "p.hframe", created_us=1_700_000_000_000_000)
    with RangeServer(root) as srv:
        yield srv, root / "p.hframe"


@pytest.fixture
def srv(served, monkeypatch):
    server, _ = served
    server.faults.clear()
    server.path_faults.clear()
    server.range_faults.clear()
    server.latency_s = 0.0
    server.hang_s = 30.0
    server.weak_etag = False
    server.reset_counts()
    for k, v in FAST_FAIL.items():
        monkeypatch.setenv(k, v)
    return server


def md5s(pack: Path) -> list[str]:
    return pq.read_table(f"{pack}.index.parquet", columns=["md5"]).column("md5").to_pylist()


def test_open_and_read_every_frame_with_few_requests(srv, served):
    _, local = served
    want = md5s(local)
    with h.open_pack(srv.url("p.hframe")) as p:
        opened = srv.total_requests()
        assert opened <= 4  # the manifest probe; the pack's first 64 KiB (header, size, ETag) and trailer; the index
        assert len(p) == len(want)
        frames = p.read_many(list(range(len(p))))
        assert [hashlib.md5(f).hexdigest() for f in frames] == want
        srv.reset_counts()
        before = p.storage_counters().bytes
        ids = random.Random(1).sample(range(len(p)), 64)
        got = p.read_many(ids)
        assert [hashlib.md5(f).hexdigest() for f in got] == [want[i] for i in ids]
        runs = p._coalesce([p._offsets[i] for i in ids], [p._lengths[i] for i in ids])
        beyond_first_request = [r for r in runs if r[0] + r[1] > PROBE_BYTES]  # the rest came with the open
        assert srv.total_requests() == len(beyond_first_request)  # one GET per planned read
        assert all(r and r.startswith("bytes=") for _, r in srv.log)  # every read a bounded range
        wanted = sum(len(f) for f in got)
        assert p.storage_counters().bytes - before <= 1.1 * wanted  # gaps read for nothing: <= 10%


def test_a_reader_opened_again_in_a_worker_asks_for_pack_and_index_at_once(srv, served):
    """A DataLoader worker's copy of a remote reader (unpickled) opens the same generation again:
    the pack's head and trailer and the whole index, in flight together (one round trip, where
    one after the other took four)."""
    import pickle

    with h.open_pack(srv.url("p.hframe")) as p:
        data = pickle.dumps(p)
        want = p.read_many([0, len(p) - 1])
    srv.reset_counts()
    srv.latency_s = 0.3
    with pickle.loads(data) as q:
        assert srv.peak_waiting == 3
        assert srv.requests["/p.hframe.index.parquet"] == 1 and srv.requests["/p.hframe"] == 2
        srv.latency_s = 0.0
        assert q.read_many([0, len(q) - 1]) == want


def test_a_trailer_asked_for_ahead_that_fails_is_read_as_any_range(srv, served):
    """The trailer's suffix range is a hint: answered 500 it is not retried, and the trailer is
    then read as any other range, with the policy's retries, and the open succeeds."""
    srv.range_faults["bytes=-64"] = ["500"]
    size = served[1].stat().st_size
    with h.open_pack(srv.url("p.hframe")) as p:
        assert len(p) == len(md5s(served[1]))
    pack_ranges = [r for path, r in srv.log if path == "/p.hframe"]
    assert pack_ranges.count("bytes=-64") == 1  # never retried
    assert f"bytes={size - 64}-{size - 1}" in pack_ranges  # then read as a range


def test_opening_a_remote_pack_asks_for_manifest_pack_and_index_at_once(srv, served):
    """Is it a dataset? The pack's head, its trailer (a suffix range: no size needed), the whole
    index: four requests in flight together, one round trip, each made once; what the open did
    not use is not left open."""
    srv.latency_s = 0.3
    with h.open_pack(srv.url("p.hframe")) as p:
        assert len(p) == len(md5s(served[1]))
        assert srv.peak_waiting == 4  # all of them waiting at the server at once
        assert srv.requests["/p.hframe.dataset.json"] == 1 and srv.requests["/p.hframe.index.parquet"] == 1
        assert sorted(r for path, r in srv.log if path == "/p.hframe") == ["bytes=-64", f"bytes=0-{PROBE_BYTES - 1}"]
    srv.latency_s = 0.0
    deadline = time.monotonic() + 5
    while any(t.name.startswith("hframe-open") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("hframe-open")]


def test_a_remote_open_does_not_wait_for_the_manifest_probe(srv, served, monkeypatch):
    """A pack at the URL is a pack (as on a disk, where a file there is never a dataset): the
    open goes on as soon as pack and index are in, whatever the manifest probe still waits for
    (over S3 a missing object costs a second round trip). The probe here hangs for 5 s; the open
    used to wait for it: now it returns while the probe's thread is still waiting (no clock read)."""
    monkeypatch.setenv("HFRAME_IO_REQUEST_TIMEOUT", "20")
    srv.hang_s = 5.0
    srv.path_faults["/p.hframe.dataset.json"] = ["hang"]
    with h.open_pack(srv.url("p.hframe")) as p:
        assert len(p) == len(md5s(served[1]))
        assert any(t.name.startswith("hframe-open") for t in threading.enumerate())  # the probe, hanging
    assert srv.requests["/p.hframe.dataset.json"] >= 1  # it was asked (a dataset URL needs it)
    deadline = time.monotonic() + 20  # the abandoned probe ends with its hang, and is closed
    while any(t.name.startswith("hframe-open") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("hframe-open")]


def test_a_pack_with_a_manifest_beside_it_opens_as_the_pack_remotely_as_locally(srv, served):
    """Locally a path that is a file is a pack, even with ``NAME.dataset.json`` beside it; a URL
    now says the same, in every command (they used to read the manifest and fail on this one)."""
    _, local = served
    manifest = local.parent / "p.hframe.dataset.json"
    manifest.write_text("not a manifest\n")
    try:
        with h.open_pack(srv.url("p.hframe")) as remote, h.open_pack(local) as here:
            assert type(remote) is type(here) is PackReader
            assert remote.read_many([0, len(here) - 1]) == here.read_many([0, len(here) - 1])
        for command, pick in (
            (["verify", "--json"], lambda doc: (doc["frames_checked"], doc["packs"][0]["status"])),
            (["dump-header", "--json"], lambda doc: (doc["header"]["uuid"], doc["trailer"]["frame_count"])),
        ):
            there, here = run_bin([*command, srv.url("p.hframe")]), run_bin([*command, str(local)])
            assert there.returncode == here.returncode == 0, there.stderr
            assert pick(json.loads(there.stdout)) == pick(json.loads(here.stdout))
    finally:
        manifest.unlink()


def test_a_missing_remote_pack_is_still_one_line_naming_it(srv):
    r = run_bin(["index", srv.url("nothing.hframe")])
    assert r.returncode == 2 and "nothing.hframe" in r.stderr.decode() and "Traceback" not in r.stderr.decode()


def test_the_commands_work_on_a_url_as_on_the_file(srv, served, tmp_path):
    _, local = served
    url = srv.url("p.hframe")
    assert_commands_agree(
        url, local, [["get", "{}", "7"], ["index", "{}", "-c", "name,md5"], ["dump-header", "{}", "--frame", "3"]]
    )
    r = run_bin(["verify", url, "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["frames_checked"] == len(md5s(local)) and doc["ok"]
    counters = doc["packs"][0]["remote"]
    assert counters["requests"] >= 2 and counters["bytes"] >= local.stat().st_size and counters["retries"] == 0
    r = run_bin(["bench-warm", url, "--frames", "16", "--batches", "3", "--md5", "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] and doc["remote"]["requests"] > 0 and doc["coalesce_gap"] == 65536


def test_two_server_errors_then_success_is_a_read(srv, served):
    _, local = served
    with h.open_pack(srv.url("p.hframe")) as p:
        srv.faults.extend(["500", "503"])
        assert hashlib.md5(p[200]).hexdigest() == md5s(local)[200]
        c = p.storage_counters()
        assert (c.retries, c.throttles) == (2, 1)


@pytest.mark.parametrize("fault", ["500", "503", "hang", "stall", "truncate", "reset"])
def test_a_fault_that_lasts_is_exit_3_naming_the_url_and_attempts_without_hanging(srv, served, fault):
    url = srv.url("p.hframe")
    with h.open_pack(url) as p:
        srv.faults.extend([fault] * 10)
        srv.hang_s = 3
        t0 = time.monotonic()
        with pytest.raises(StorageError) as e:
            p[250]
        assert time.monotonic() - t0 < 8
        assert str(e.value).startswith(f"{url}: ") and "after 3 attempts" in str(e.value)
    srv.faults[:] = [fault] * 10
    r = run_bin(["get", url, "250", "-o", "/dev/null"], env=FAST_FAIL)
    assert r.returncode == 3 and r.stderr.count(b"\n") == 1 and b"Traceback" not in r.stderr, r.stderr


def test_a_short_body_is_retried_and_never_returned_as_data(srv, served):
    _, local = served
    with h.open_pack(srv.url("p.hframe")) as p:
        srv.faults.append("truncate")
        assert hashlib.md5(p[300]).hexdigest() == md5s(local)[300]
        assert p.storage_counters().retries >= 1


def test_missing_denied_and_rangeless_answers(srv, served, tmp_path):
    r = run_bin(["verify", srv.url("nope.hframe")])
    assert r.returncode == 2 and b"no such file (HTTP 404)" in r.stderr
    r = run_bin(["get", srv.url("nope.hframe"), "1"])
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1
    srv.range_faults[f"bytes=0-{PROBE_BYTES - 1}"] = ["ignore-range"]  # (the trailer's is asked for at once)
    with pytest.raises(InputError, match="ignores Range requests"):
        PackReader(srv.url("p.hframe"))  # open_pack would first ask for a dataset manifest
    # (the trailer's request, made with the refused one, may still be on its way: let it end)
    deadline = time.monotonic() + 10
    while any(t.name.startswith("hframe-remote") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    srv.faults.extend(["500", "500"])  # the dataset check meets the first (and takes it as no dataset)
    r = run_bin(["verify", srv.url("p.hframe")], env={**FAST_FAIL, "HFRAME_IO_ATTEMPTS": "1"})
    assert r.returncode == 3 and b"HTTP 500 after 1 attempt" in r.stderr  # not "bad data"


def test_a_pack_replaced_while_open_is_refused_not_read(srv, served, tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    src = make_photos(tmp_path / "src", 6)
    for i in range(60):
        (src / f"big{i}.bin").write_bytes(os.urandom(3000))
    h.pack([src], root / "q.hframe")
    with RangeServer(root) as other:
        with h.open_pack(other.url("q.hframe")) as p:
            uuid = p.uuid
            p[50]
            (src / "new.bin").write_bytes(b"x" * 100)
            h.pack([src], root / "q.hframe", update=True)  # republished: another object at the URL
            with pytest.raises(PackReplaced, match="replaced since this reader opened it"):
                p[51]
        with h.open_pack(other.url("q.hframe")) as p:  # opened again: the new pack, whole
            assert p.uuid != uuid and p[len(p) - 1] == b"x" * 100


def test_remote_verify_finds_damage_and_a_network_failure_is_not_damage(srv, served, tmp_path):
    _, local = served
    root = tmp_path / "site"
    root.mkdir()
    data = bytearray(local.read_bytes())
    row = pq.read_table(f"{local}.index.parquet").to_pylist()[100]
    data[row["offset"] + 5] ^= 0xFF
    (root / "d.hframe").write_bytes(bytes(data))
    (root / "d.hframe.index.parquet").write_bytes(Path(f"{local}.index.parquet").read_bytes())
    with RangeServer(root) as other:
        r = run_bin(["verify", other.url("d.hframe"), "--json"])
        doc = json.loads(r.stdout)
        assert r.returncode == 1 and doc["packs"][0]["bad_frames"] == [100]
        other.faults.extend(["500"] * 10)
        r = run_bin(["verify", other.url("d.hframe")], env=FAST_FAIL)
        assert r.returncode == 3, r.stderr


def test_ctrl_c_ends_a_stuck_remote_command_within_a_second(srv, served):
    assert_ctrl_c_ends_a_stuck_read(srv, ["verify", srv.url("p.hframe")])


@pytest.fixture(scope="module")
def nginx(served, tmp_path_factory):
    _, local = served
    with nginx_serving(local.parent, tmp_path_factory.mktemp("nginx")) as base:
        yield base, local


def test_a_pack_on_nginx_reads_verifies_and_benches_like_the_file(nginx):
    base, local = nginx
    url = f"{base}/p.hframe"
    want = md5s(local)
    with h.open_pack(url) as p:
        got = p.read_many(list(range(len(p))))
        assert [hashlib.md5(f).hexdigest() for f in got] == want
        ids = random.Random(4).sample(range(len(p)), 100)
        assert [hashlib.md5(f).hexdigest() for f in p.read_many(ids)] == [want[i] for i in ids]
    for args in (["get", "{}", "11"], ["index", "{}", "-f", "jsonl"], ["dump-header", "{}", "--json"]):
        remote = run_bin([a.format(url) for a in args])
        here = run_bin([a.format(local) for a in args])
        assert remote.returncode == 0, remote.stderr
        assert remote.stdout.replace(url.encode(), b"P") == here.stdout.replace(str(local).encode(), b"P")
    r = run_bin(["verify", url, "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["frames_checked"] == len(want)
    r = run_bin(["bench-cold", url, "--frames", "32", "--batches", "2", "--md5", "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] and doc["cache_method"] == "remote (no client cache)"


def test_nginx_refuses_a_read_of_a_replaced_pack(nginx, tmp_path):
    base, local = nginx
    site = local.parent
    copy = site / "r.hframe"
    copy.write_bytes(local.read_bytes())
    Path(f"{copy}.index.parquet").write_bytes(Path(f"{local}.index.parquet").read_bytes())
    try:
        with h.open_pack(f"{base}/r.hframe") as p:
            p[300]
            time.sleep(0.01)
            data = bytearray(copy.read_bytes())
            copy.write_bytes(bytes(data))  # the same bytes, a new version (mtime: a new ETag)
            os.utime(copy, ns=(1, 1))
            with pytest.raises(PackReplaced):
                p[301]
    finally:
        copy.unlink()
        Path(f"{copy}.index.parquet").unlink()


def test_a_batch_read_after_a_replace_on_nginx_is_always_pack_replaced(tmp_path):
    """nginx answers a stale If-Match with 412 and then closes the connection, though its answer
    said keep-alive: the next request on it meets a closed connection. Code that catches
    ``PackReplaced`` to open the pack again must get it every time, never a "connection failed
    ... retry budget spent" ``StorageError``; and once it has it, no more requests are made."""
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(3)
    for i in range(600):  # scattered 256-frame samples: one request per frame, a batch at once
        (src / f"{i:03d}.bin").write_bytes(rng.randbytes(rng.randrange(20_000, 40_000)))
    site = tmp_path / "site"
    site.mkdir()
    h.pack([src], site / "p.hframe")
    data = (site / "p.hframe").read_bytes()
    with nginx_serving(site, tmp_path / "nginx") as base:
        for run in range(20):
            with h.open_pack(f"{base}/p.hframe") as p:
                p.read_many(rng.sample(range(len(p)), 64))
                (site / "p.hframe").write_bytes(data)  # the same bytes, a new version (nginx's ETag:
                os.utime(site / "p.hframe", (1000 * (run + 1),) * 2)  # mtime in seconds and size)
                for _ in range(2):  # and again: the version is still gone
                    with pytest.raises(PackReplaced, match="replaced since this reader opened it"):
                        p.read_many(rng.sample(range(len(p)), 256))
                before = p.storage_counters().requests
                with pytest.raises(PackReplaced):
                    p[len(p) - 1]
                assert p.storage_counters().requests == before  # known gone: not asked for again


def test_io_timeout_bounds_a_read_before_or_after_the_command(srv):
    srv.faults.extend(["hang"] * 10)
    srv.hang_s = 10
    env = {"HFRAME_IO_REQUEST_TIMEOUT": "60", "HFRAME_IO_ATTEMPTS": "5"}
    for args in (
        ["--io-timeout", "1", "verify", srv.url("p.hframe")],
        ["verify", srv.url("p.hframe"), "--io-timeout", "1"],
    ):
        srv.faults[:] = ["hang"] * 10
        t0 = time.monotonic()
        r = run_bin(args, env=env)
        # without the 1 s deadline, five attempts each hang 10 s: a bound far from both catches
        # a hang without timing the command (it took 5.2 s against a bound of 5 under load)
        assert r.returncode == 3 and time.monotonic() - t0 < 25, r.stderr
        assert b"timed out" in r.stderr and b"deadline of this read was reached" in r.stderr


def test_a_weak_etag_is_read_unpinned_not_refused(srv, served):
    _, local = served
    srv.weak_etag = True
    with h.open_pack(srv.url("p.hframe")) as p:
        assert hashlib.md5(p[350]).hexdigest() == md5s(local)[350]  # no If-Match sent: no 412


def test_a_sharded_dataset_behind_a_url_reads_as_one_pack(srv, tmp_path):
    """The manifest's shards resolve against the manifest's URL; every command and the reader
    see the dataset as locally."""
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    src = make_photos(tmp_path / "src", 30)
    h.pack([src], site / "sub" / "ds.hframe", max_pack_bytes=30_000)
    shards = sorted((site / "sub").glob("ds-*.hframe"))
    assert len(shards) > 1 and not (site / "sub" / "ds.hframe").exists()
    with RangeServer(site) as other:
        url = other.url("sub/ds.hframe")
        with h.open_pack(site / "sub" / "ds.hframe") as local, h.open_pack(url) as remote:
            assert len(remote) == len(local) == 30
            assert remote.read_many(list(range(30))) == local.read_many(list(range(30)))
        r = run_bin(["verify", url, "--json"])
        doc = json.loads(r.stdout)
        assert r.returncode == 0 and len(doc["packs"]) == len(shards) and doc["frames_checked"] == 30
        assert [p["pack"] for p in doc["packs"]] == [other.url(f"sub/{s.name}") for s in shards]
        for args in (["get", url, "29"], ["index", url, "-c", "name,md5,shard"]):
            r = run_bin(args)
            assert r.returncode == 0, r.stderr
            assert r.stdout == run_bin([str(site / "sub" / "ds.hframe") if a == url else a for a in args]).stdout
        r = run_bin(["dump-header", url, "--json"])
        doc = json.loads(r.stdout)
        assert r.returncode == 0 and doc["dataset"] == url and len(doc["shards"]) == len(shards)


def test_prefetched_reads_nobody_asked_for_do_not_pile_up(srv, served, monkeypatch):
    import hframe_cli.storage.http as remote

    monkeypatch.setattr(remote, "MAX_PENDING", 10)
    _, local = served
    size = local.stat().st_size
    with remote.RemoteFile(srv.url("p.hframe")) as f:
        for batch in range(5):  # five batches of 8 reads started, none read
            offs = [size - 1000 * (batch * 8 + k + 1) for k in range(8)]
            f.prefetch(offs, [100] * 8)
        assert len(f._pending) <= 10 + 8
        assert f.read_at(size - 1000, 100) == local.read_bytes()[size - 1000 : size - 900]


@pytest.mark.parametrize(
    "args",
    [
        ["index", "{u}", "--rebuild"],
        ["pack", "{src}", "-o", "{u}"],
        ["resume", "{u}"],
        ["index", "{u}", "--merge", "x*"],
    ],
)
def test_writing_to_a_url_is_refused_clearly(srv, served, args, tmp_path):
    url = srv.url("x.hframe")
    r = run_bin([a.format(u=url, src=tmp_path) for a in args], cwd=tmp_path)
    assert (
        r.returncode == 2
        and r.stderr
        == (
            f"hframe: error: {url}: writing to a remote location (http://) is not supported yet; "
            "write the pack locally, then upload it and its index\n"
        ).encode()
    )
    assert list(tmp_path.iterdir()) == []  # no local folder named "http:"


def test_verify_progress_of_a_remote_pack_has_its_totals(srv, served):
    import contextlib

    import hframe_cli.verify.many as verify_mod

    _, local = served
    seen: list[tuple[int, int]] = []
    totals: list[tuple[int, int]] = []

    def progress(frames: int, nbytes: int):
        totals.append((frames, nbytes))
        return contextlib.nullcontext(lambda f, b: seen.append((f, b)))

    rep = verify_mod.verify_packs([srv.url("p.hframe")], progress=progress)
    want = (
        len(md5s(local)),
        sum(pq.read_table(f"{local}.index.parquet", columns=["length"]).column("length").to_pylist()),
    )
    assert rep.exit_code == 0 and totals == [want] and seen[-1] == want


def _replace_site_pack(tmp_path: Path, served_pack: Path) -> tuple[Path, Path]:
    site = tmp_path / "site"
    site.mkdir()
    copy = site / "r.hframe"
    copy.write_bytes(served_pack.read_bytes())
    Path(f"{copy}.index.parquet").write_bytes(Path(f"{served_pack}.index.parquet").read_bytes())
    return site, copy


def test_without_a_strong_etag_a_replaced_pack_is_still_refused(served, tmp_path):
    """The review's case: weak ETags cannot be matched, so every answer's size and ETag are
    compared with the first one's: another version is refused, not read."""
    _, local = served
    site, copy = _replace_site_pack(tmp_path, local)
    with RangeServer(site) as other:
        other.weak_etag = True
        with h.open_pack(other.url("r.hframe")) as p:
            p[200]
            copy.write_bytes(copy.read_bytes() + b"appended")  # another object at the URL
            with pytest.raises(PackReplaced, match="was replaced"):
                p.read_many(list(range(200, 260)))


def test_another_range_than_asked_is_never_data(srv, served):
    _, local = served
    with h.open_pack(srv.url("p.hframe")) as p:
        srv.faults.append("shift")
        assert hashlib.md5(p[420]).hexdigest() == md5s(local)[420]  # retried
        srv.faults.extend(["shift"] * 10)
        with pytest.raises(StorageError, match="answered bytes"):
            p[421]
    srv.faults[:] = ["shift"] * 10
    r = run_bin(["verify", srv.url("p.hframe")], env=FAST_FAIL)
    assert r.returncode == 3, r.stderr  # a protocol fault, not damaged data


def test_a_trickling_server_cannot_stretch_a_read_past_its_deadline(srv):
    srv.faults.extend(["trickle"] * 3)
    t0 = time.monotonic()
    r = run_bin(
        ["get", srv.url("p.hframe"), "100", "-o", "/dev/null", "--io-timeout", "2"],
        env={"HFRAME_IO_REQUEST_TIMEOUT": "60"},
    )
    assert r.returncode == 3 and time.monotonic() - t0 < 8, r.stderr


def test_a_failed_prefetch_is_asked_again_once_the_store_recovers(srv, served, monkeypatch):
    _, local = served
    monkeypatch.setenv("HFRAME_IO_ATTEMPTS", "1")
    ids = list(range(100, 420, 5))
    with h.open_pack(srv.url("p.hframe")) as p:
        srv.faults.extend(["500"] * 200)
        with pytest.raises(StorageError):
            p.read_many(ids)
        srv.faults.clear()
        got = p.read_many(ids)  # at once: no stale failure handed back
    assert [hashlib.md5(f).hexdigest() for f in got] == [md5s(local)[i] for i in ids]


def test_a_remote_sample_reads_its_runs_not_the_whole_pack(srv, served):
    _, local = served
    r = run_bin(["verify", srv.url("p.hframe"), "--sample", "5", "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["frames_checked"] >= 5
    assert doc["packs"][0]["remote"]["bytes"] < local.stat().st_size / 2


@pytest.mark.parametrize(
    ("fault", "code", "words"),
    [("gzip", 2, b"gzip-encoded"), ("302", 2, b"redirected to http://127.0.0.1:1/elsewhere; give that URL")],
)
def test_answers_hframe_cannot_use_are_one_line_exit_2(srv, fault, code, words):
    srv.faults.extend([fault] * 3)
    r = run_bin(["dump-header", srv.url("p.hframe")])
    assert r.returncode == code and words in r.stderr and r.stderr.count(b"\n") == 1, r.stderr


def test_a_403_for_the_manifest_does_not_hide_the_pack(srv, served):
    _, local = served
    # the dataset check meets it, as on a store without list rights
    srv.path_faults["/p.hframe.dataset.json"] = ["403"]
    r = run_bin(["get", srv.url("p.hframe"), "7"])
    assert r.returncode == 0 and r.stdout == run_bin(["get", str(local), "7"]).stdout


def test_a_url_query_stays_on_the_url_and_out_of_messages(srv, served):
    _, local = served
    r = run_bin(["get", srv.url("p.hframe?versionId=3"), "9"])
    assert r.returncode == 0 and r.stdout == run_bin(["get", str(local), "9"]).stdout
    assert srv.log[-1][0].startswith("/p.hframe") and any(
        path == "/p.hframe.index.parquet?versionId=3" for path, _ in srv.log
    )
    r = run_bin(["verify", srv.url("nope.hframe?X-Amz-Signature=SECRET")])
    assert r.returncode == 2 and b"SECRET" not in r.stderr and b"nope.hframe?..." in r.stderr


def test_an_empty_object_is_what_an_empty_file_is(srv, served, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "e.hframe").write_bytes(b"")
    with RangeServer(site) as other:
        remote = run_bin(["dump-header", other.url("e.hframe")])
    here = run_bin(["dump-header", str(site / "e.hframe")])
    assert remote.returncode == here.returncode != 3
    assert remote.stderr.replace(other.url("e.hframe").encode(), b"P") == here.stderr.replace(
        str(site / "e.hframe").encode(), b"P"
    )


def test_a_remote_manifest_cannot_point_at_local_files(srv, tmp_path):
    from hframe_cli.read.dataset import Manifest, ShardEntry

    site = tmp_path / "site"
    site.mkdir()
    m = Manifest([ShardEntry("file:///etc/passwd", "u", 1, 1, 0)], 1)
    (site / "d.hframe.dataset.json").write_text(m.to_json())
    with RangeServer(site) as other:
        r = run_bin(["verify", other.url("d.hframe")])
    assert r.returncode in (1, 2) and b"is not a remote location" in r.stderr and b"passwd:" not in r.stderr


def test_readers_over_http_while_another_process_republishes_never_get_wrong_bytes(tmp_path):
    """A second process republishes the pack (two alternating contents) in a loop while this one
    opens it over HTTP and reads: every frame is its version's bytes (by the md5 of the index it
    opened with) or the read is refused as replaced; never another version's bytes. Bounded: 6 s."""
    site = tmp_path / "site"
    site.mkdir()
    srcs = []
    for v in range(2):
        src = tmp_path / f"src{v}"
        src.mkdir()
        for i in range(120):  # the same names, other bytes: only the version tells them apart
            (src / f"{i:03d}.bin").write_bytes(bytes([v]) * 100 + os.urandom(random.Random(i).randrange(800, 3000)))
        srcs.append(src)
    h.pack([srcs[0]], site / "p.hframe")
    code = (
        "import sys, time; import hframe_cli as h\n"
        "a, b, out = sys.argv[1:4]; end = time.monotonic() + 6; n = 0\n"
        "while time.monotonic() < end:\n"
        "    h.pack([b if n % 2 == 0 else a], out, force=True); n += 1\n"
        "print(n, flush=True)\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", code, str(srcs[0]), str(srcs[1]), str(site / "p.hframe")], stdout=subprocess.PIPE
    )
    reads = replaced = 0
    try:
        with RangeServer(site) as srv:
            rng = random.Random(5)
            while writer.poll() is None:
                try:
                    with h.open_pack(srv.url("p.hframe")) as p:
                        want = p.table.column("md5").to_pylist()
                        ids = rng.sample(range(len(p)), 24)
                        for i, data in zip(ids, p.read_many(ids)):
                            assert hashlib.md5(data).hexdigest() == want[i], "another version's bytes"
                            reads += 1
                except (PackReplaced, InputError, StorageError):
                    replaced += 1  # refused (or caught mid-publish and opened again later): never data
    finally:
        out, _ = writer.communicate(timeout=30)
    assert writer.returncode == 0 and int(out) >= 3  # it did republish, several times
    assert reads > 0, (reads, replaced)


def test_a_pack_deleted_under_an_open_reader_is_replaced_not_missing(tmp_path):
    """A 404 for an object that answered when it was opened is the pack removed or replaced
    (exit 3), not a location that never existed (exit 2)."""
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(5)
    for i in range(100):  # well past the first 64 KiB read
        (src / f"{i:03d}.bin").write_bytes(rng.randbytes(3000))
    site = tmp_path / "site"
    site.mkdir()
    h.pack([src], site / "p.hframe")
    with RangeServer(site) as srv, h.open_pack(srv.url("p.hframe")) as p:
        far = max(range(len(p)), key=lambda i: p.range_of(i)[0])  # past the first 64 KiB read
        (site / "p.hframe").unlink()
        with pytest.raises(PackReplaced, match="removed or replaced"):
            p[far]
