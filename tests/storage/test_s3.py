"""Packs in object stores: S3 (moto's S3 server on loopback), GCS (an emulator on loopback) and
S3 faults (``range_server.RangeServer`` answering as a misbehaving S3), all through the real
``pyarrow.fs`` clients that hframe uses. Every command must work on an ``s3://`` location as on
the file; every fault must end in bounded retries, then the bytes or one line with exit 3 or 2;
and a pack replaced while a reader holds it must never give that reader another version's bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import (
    assert_commands_agree,
    assert_ctrl_c_ends_a_stuck_read,
    gcs_emulator,
    hframe_bin,
    make_photos,
    moto_s3,
    moto_s3_process,
    run_bin,
)
from range_server import RangeServer

import hframe_cli as h
from hframe_cli.errors import InputError, PackReplaced, StorageError
from hframe_cli.read.reader import PackReader
from hframe_cli.storage.objectstore import join

FAST_FAIL = {"HFRAME_IO_ATTEMPTS": "3", "HFRAME_IO_REQUEST_TIMEOUT": "1", "HFRAME_IO_TIMEOUT": "5"}


def md5s(pack: Path) -> list[str]:
    return pq.read_table(f"{pack}.index.parquet", columns=["md5"]).column("md5").to_pylist()


def upload(fs: pafs.FileSystem, files: list[Path], prefix: str) -> None:
    """Copy files into the store with pyarrow (not hframe: the reading side is under test)."""
    for f in files:
        with f.open("rb") as src, fs.open_output_stream(f"{prefix}/{f.name}") as dst:
            shutil.copyfileobj(src, dst)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A pack of photos and 400 blobs (well past the first 64 KiB read), and a 3-shard dataset."""
    root = tmp_path_factory.mktemp("local")
    src = make_photos(root / "src", 30)
    rng = random.Random(3)
    (src / "blobs").mkdir()
    for i in range(400):
        (src / "blobs" / f"{i:03d}.bin").write_bytes(rng.randbytes(rng.randrange(500, 6000)))
    h.pack([src], root / "p.hframe", created_us=1_700_000_000_000_000)
    (root / "ds").mkdir()
    h.pack([src], root / "ds" / "d.hframe", created_us=1_700_000_000_000_000, max_pack_bytes=400_000)
    assert len(list((root / "ds").glob("d-*.hframe"))) > 1
    return root


@pytest.fixture(scope="module")
def s3(local, tmp_path_factory):
    """moto's S3 server holding bucket ``bkt``: p.hframe (+ index) and the dataset under ds/."""
    with moto_s3(tmp_path_factory.mktemp("moto")) as endpoint:
        host, _, port = endpoint.partition(":")
        fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
        fs.create_dir("bkt")
        upload(fs, [local / "p.hframe", local / "p.hframe.index.parquet"], "bkt")
        upload(fs, sorted((local / "ds").iterdir()), "bkt/ds")
        yield fs, endpoint


def s3_url(endpoint: str, key: str) -> str:
    return f"s3://bkt/{key}?endpoint_override={endpoint}&scheme=http"


def test_every_command_works_on_s3_as_on_the_file(s3, local):
    _, endpoint = s3
    url, pack = s3_url(endpoint, "p.hframe"), local / "p.hframe"
    assert_commands_agree(
        url, pack, [["get", "{}", "7"], ["index", "{}", "-c", "name,md5"], ["dump-header", "{}", "--frame", "3"]]
    )
    r = run_bin(["verify", url, "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] and doc["frames_checked"] == len(md5s(pack))
    assert doc["packs"][0]["remote"]["bytes"] >= pack.stat().st_size
    for bench in ("bench-warm", "bench-cold"):
        r = run_bin([bench, url, "--frames", "16", "--batches", "2", "--md5", "--json"])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["remote"]["requests"] > 0


def test_open_and_random_reads_cost_what_the_plan_says(s3, local):
    _, endpoint = s3
    want = md5s(local / "p.hframe")
    with h.open_pack(s3_url(endpoint, "p.hframe")) as p:
        assert p.checks_md5  # S3 reads through pyarrow cannot carry If-Match: frames are checked
        counters = p.storage_counters()
        assert counters.requests <= 3  # metadata + first 64 KiB (+ trailer); the index: about as many
        frames = p.read_many(list(range(len(p))))
        assert [hashlib.md5(f).hexdigest() for f in frames] == want
        ids = random.Random(5).sample(range(len(p)), 64)
        before = counters.requests
        runs = p._coalesce([p._offsets[i] for i in ids], [p._lengths[i] for i in ids])
        got = p.read_many(ids)
        assert [hashlib.md5(f).hexdigest() for f in got] == [want[i] for i in ids]
        assert counters.requests - before == len([r for r in runs if r[0] + r[1] > 64 * 1024])


def test_the_aws_endpoint_variables_are_honoured_as_the_aws_tools_do(s3, local, monkeypatch):
    _, endpoint = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{endpoint}")
    r = run_bin(["get", "s3://bkt/p.hframe", "3"])
    assert r.returncode == 0, r.stderr
    assert hashlib.md5(r.stdout).hexdigest() == md5s(local / "p.hframe")[3]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")  # the S3 one wins: nothing there
    r = run_bin(["get", "s3://bkt/p.hframe", "3"], env={**FAST_FAIL})
    assert r.returncode == 3 and b"s3://bkt/p.hframe" in r.stderr


@pytest.mark.parametrize(
    "location, code, words",
    [
        ("s3://bkt/nothing.hframe", 2, "no such file"),
        ("s3://no-such-bucket/p.hframe", 2, "no such file"),
        ("s3://bkt/p.hframe?endpoint={e}", 2, "unknown option endpoint"),
        ("s3://bkt/", 2, "not an object location"),
    ],
)
def test_what_cannot_be_read_is_one_line_with_its_exit_code(s3, location, code, words):
    _, endpoint = s3
    loc = location.format(e=endpoint)
    if "endpoint_override" not in loc and "endpoint=" not in loc:
        loc += f"?endpoint_override={endpoint}&scheme=http"
    r = run_bin(["verify", loc])
    err = r.stderr.decode()
    assert r.returncode == code, err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_dead_endpoint_fails_fast_with_exit_3_naming_the_url_and_attempts():
    t0 = time.monotonic()
    r = run_bin(["get", "s3://bkt/p.hframe?endpoint_override=127.0.0.1:1&scheme=http", "0"], env=FAST_FAIL)
    err = r.stderr.decode()
    assert r.returncode == 3 and "s3://bkt/p.hframe" in err and "3 attempts" in err
    assert time.monotonic() - t0 < 10


def test_a_pack_replaced_in_the_bucket_is_refused_never_read(s3, local, tmp_path):
    fs, endpoint = s3
    other = tmp_path / "other"
    make_photos(other, 30)
    h.pack([other], tmp_path / "p.hframe", created_us=1_600_000_000_000_000)
    upload(fs, [local / "p.hframe", local / "p.hframe.index.parquet"], "bkt/replaced")
    url = s3_url(endpoint, "replaced/p.hframe")
    want = md5s(local / "p.hframe")
    with h.open_pack(url) as p:
        assert hashlib.md5(p[100]).hexdigest() == want[100]
        upload(fs, [tmp_path / "p.hframe"], "bkt/replaced")  # another pack under the same key
        for read in (lambda: p[150], lambda: p.read_many([5, 150, 300])):
            with pytest.raises(PackReplaced, match="replaced"):
                read()
    r = run_bin(["get", url, "150"])  # a fresh open: the new pack and the old index do not pair
    assert r.returncode in (1, 3) and r.stdout == b""


def test_a_sharded_dataset_in_a_bucket_reads_as_one_pack(s3, local):
    _, endpoint = s3
    manifest = s3_url(endpoint, "ds/d.hframe")
    here = local / "ds" / "d.hframe"
    r = run_bin(["verify", manifest, "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["frames_checked"] == len(md5s(local / "p.hframe"))
    assert_commands_agree(
        manifest,
        here,
        [["index", "{}", "-c", "name,md5"], ["get", "{}", "0", "250", "429", "--format", "tar"], ["dump-header", "{}"]],
    )
    r = run_bin(["bench-warm", manifest, "--frames", "16", "--batches", "2", "--md5", "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stderr
    with h.open_pack(manifest) as d, h.open_pack(here) as ref:
        ids = random.Random(2).sample(range(len(ref)), 50)
        assert d.read_many(ids) == ref.read_many(ids)


def test_shard_paths_resolve_against_the_manifest_and_keep_its_options():
    base = "s3://bkt/a/b/d.dataset.json?endpoint_override=h:1&scheme=http"
    assert join(base, "d-00000.hframe") == "s3://bkt/a/b/d-00000.hframe?endpoint_override=h:1&scheme=http"
    assert join(base, "../x/d-1.hframe").startswith("s3://bkt/a/x/d-1.hframe?")
    assert join("gs://b/d.dataset.json", "s/d-0.hframe") == "gs://b/s/d-0.hframe"
    with pytest.raises(InputError, match="outside the bucket"):
        join("s3://bkt/d.dataset.json", "../../etc/passwd")


def as_list(batch: list) -> list:
    return batch


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_2_worker_dataloader_over_s3_reads_every_frame_once(s3, local, context):
    torch = pytest.importorskip("torch")
    from hframe_cli.training.dataset import FrameDataset

    _, endpoint = s3
    want = md5s(local / "p.hframe")
    ds = FrameDataset(s3_url(endpoint, "p.hframe"), target=None)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, shuffle=True, num_workers=2, multiprocessing_context=context, collate_fn=as_list
    )
    got = [hashlib.md5(sample).hexdigest() for batch in loader for sample in batch]
    assert sorted(got) == sorted(want) and len(set(want)) == len(want)


# -- faults: RangeServer answering as a misbehaving S3 ----------------------------------------


@pytest.fixture(scope="module")
def fake_s3(local, tmp_path_factory):
    root = tmp_path_factory.mktemp("fake_s3")
    (root / "bkt").mkdir()
    for name in ("p.hframe", "p.hframe.index.parquet"):
        shutil.copy(local / name, root / "bkt" / name)
    with RangeServer(root) as srv:
        yield srv


@pytest.fixture
def flaky(fake_s3, monkeypatch):
    fake_s3.faults.clear()
    fake_s3.hang_s = 30.0
    fake_s3.reset_counts()
    for k, v in FAST_FAIL.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return fake_s3


def fake_url(srv: RangeServer) -> str:
    return f"s3://bkt/p.hframe?endpoint_override=127.0.0.1:{srv.port}&scheme=http"


def test_an_s3_open_asks_for_the_trailer_with_the_first_read(flaky, local):
    """In S3 the size comes with the object's metadata (HEAD); the pack's first read and its
    trailer are then asked for together: two round trips to open, not three."""
    flaky.latency_s = 0.2
    try:
        with h.open_pack(fake_url(flaky)) as p:
            assert len(p) == len(md5s(local / "p.hframe"))
    finally:
        flaky.latency_s = 0.0
    size = (local / "p.hframe").stat().st_size
    gets = [(r, waiting) for path, method, r, waiting in flaky.arrivals if path == "/bkt/p.hframe" and method == "GET"]
    tail = f"bytes={size - 64}-{size - 1}"
    assert [r for r, _ in gets].count(tail) == 1, gets
    # the two overlapped: whichever arrived second found the other waiting at the server
    second = gets[1] if gets[0][0] in (tail, "bytes=0-65535") else None
    assert second is not None and {second[0], *(r for m, r in second[1] if m == "GET")} == {tail, "bytes=0-65535"}, gets


def test_two_s3_errors_then_success_is_a_read(flaky, local):
    flaky.faults.extend(["503", "500"])  # the first request (the pack's metadata) meets them
    with PackReader(fake_url(flaky)) as p:
        c = p.storage_counters()
        assert (c.retries, c.throttles) == (2, 1)
        flaky.faults.extend(["500", "500"])  # a ranged read meets them
        assert hashlib.md5(p[200]).hexdigest() == md5s(local / "p.hframe")[200]
        assert c.retries == 4


@pytest.mark.parametrize("fault", ["500", "503", "hang", "stall", "truncate", "reset"])
def test_an_s3_fault_that_lasts_is_exit_3_without_hanging(flaky, fault):
    with h.open_pack(fake_url(flaky)) as p:
        flaky.hang_s = 4.0
        flaky.faults.extend([fault] * 10)
        t0 = time.monotonic()
        with pytest.raises(StorageError, match=r"s3://bkt/p\.hframe.*attempt") as e:
            p[300]
        assert time.monotonic() - t0 < 9
        assert not isinstance(e.value, PackReplaced)


def test_s3_access_denied_is_exit_3_and_never_retried(flaky):
    flaky.faults.extend(["403"] * 5)
    t0 = time.monotonic()
    r = run_bin(["get", fake_url(flaky), "1"], env=FAST_FAIL)
    assert r.returncode == 3 and b"s3://bkt/p.hframe" in r.stderr and time.monotonic() - t0 < 5
    # the dataset manifest (none: a plain pack), the pack and its index, asked at once: each at
    # most once, never retried (the first 403 ends the command: an open still starting on its
    # thread may not have reached the server by then, as seen once under load)
    assert set(flaky.requests.values()) == {1} and any(k.endswith("/p.hframe") for k in flaky.requests)
    assert len(flaky.requests) <= 3, flaky.requests


# -- GCS (emulator) and HDFS ----------------------------------------------------------------------


def test_a_pack_on_gcs_reads_verifies_and_is_pinned_to_its_generation(local, tmp_path):
    with gcs_emulator(tmp_path / "gcs", "gbkt") as endpoint:
        fs = pafs.GcsFileSystem(anonymous=True, endpoint_override=endpoint, scheme="http")
        upload(fs, [local / "p.hframe", local / "p.hframe.index.parquet"], "gbkt")
        url = f"gs://gbkt/p.hframe?endpoint_override={endpoint}&scheme=http&anonymous=true"
        r = run_bin(["verify", url, "--json"])
        assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stderr
        want = md5s(local / "p.hframe")
        with h.open_pack(url) as p:
            assert not p.checks_md5  # pyarrow reads the generation it opened
            assert hashlib.md5(p[10]).hexdigest() == want[10]
            other = tmp_path / "o"
            make_photos(other, 30)
            h.pack([other], tmp_path / "p.hframe")
            upload(fs, [tmp_path / "p.hframe"], "gbkt")
            try:
                data = p[250]
            except (PackReplaced, StorageError, InputError):
                pass  # refused: never the new object's bytes
            else:
                assert hashlib.md5(data).hexdigest() == want[250]


def test_pack_to_gcs_publishes_and_reads_back(local, tmp_path, monkeypatch):
    monkeypatch.setenv("HFRAME_STAGE", str(tmp_path / "stage"))
    with gcs_emulator(tmp_path / "gcs", "wbkt") as endpoint:
        url = f"gs://wbkt/sub/p.hframe?endpoint_override={endpoint}&scheme=http&anonymous=true"
        r = run_bin(["pack", str(local / "src"), "-o", url])
        assert r.returncode == 0, r.stderr
        with h.open_pack(url) as p, h.open_pack(local / "p.hframe") as here:
            assert sorted(hashlib.md5(f).hexdigest() for f in p.read_many(list(range(len(p))))) == sorted(
                md5s(local / "p.hframe")
            )
            assert len(p) == len(here)
        fs = pafs.GcsFileSystem(anonymous=True, endpoint_override=endpoint, scheme="http")
        assert keys(fs, "wbkt/sub") == ["wbkt/sub/p.hframe", "wbkt/sub/p.hframe.index.parquet"]


GCS_FAST = {"HFRAME_IO_REQUEST_TIMEOUT": "1", "HFRAME_IO_ATTEMPTS": "2", "HFRAME_IO_TIMEOUT": "10"}


def test_a_gcs_store_that_stops_answering_mid_read_fails_the_attempt_at_the_request_timeout(
    local, tmp_path, monkeypatch
):
    """pyarrow's GCS client takes no request timeout (its own: 120 s without a byte, built into
    google-cloud-cpp): a store that goes silent mid-read must still fail each attempt at
    HFRAME_IO_REQUEST_TIMEOUT, as over S3 and HTTP, and the read with exit 3's error."""
    for k, v in GCS_FAST.items():
        monkeypatch.setenv(k, v)
    proxy_code = Path(__file__).resolve().parents[1] / "range_server.py"
    with gcs_emulator(tmp_path / "gcs", "gbkt") as endpoint:
        # (the proxy in a process of its own, as a store is: nothing it does waits for this one)
        proxy = subprocess.Popen([sys.executable, str(proxy_code), "stall-proxy", endpoint], stdout=subprocess.PIPE)
        try:
            assert proxy.stdout is not None
            port = int(proxy.stdout.readline())
            fs = pafs.GcsFileSystem(anonymous=True, endpoint_override=endpoint, scheme="http")
            upload(fs, [local / "p.hframe", local / "p.hframe.index.parquet"], "gbkt")
            url = f"gs://gbkt/p.hframe?endpoint_override=127.0.0.1:{port}&scheme=http&anonymous=true"
            with h.open_pack(url) as p:
                want = md5s(local / "p.hframe")
                assert hashlib.md5(p[len(p) - 1]).hexdigest() == want[-1]
                proxy.send_signal(signal.SIGUSR1)  # the store goes silent
                time.sleep(0.2)
                outcome: list[BaseException | bytes] = []
                t0 = time.monotonic()
                reader = threading.Thread(target=lambda: outcome.append(_try(lambda: p[len(p) - 2])), daemon=True)
                reader.start()
                reader.join(30)  # 2 attempts of 1 s (and a pause): seconds, not the client's 120 s
                took = time.monotonic() - t0
                assert not reader.is_alive(), "the read still waits for the stalled store after 30 s"
        finally:
            proxy.kill()
            proxy.wait()
    err = outcome[0]
    assert isinstance(err, StorageError) and not isinstance(err, PackReplaced), err
    assert str(err).startswith("gs://gbkt/p.hframe") and "timed out" in str(err) and "2 attempts" in str(err)
    assert took < 30


def _try(read):
    try:
        return read()
    except BaseException as e:  # noqa: BLE001 - handed to the test thread
        return e


def test_a_gcs_endpoint_that_accepts_and_never_answers_is_exit_3_in_seconds(tmp_path):
    """The first request (the object's metadata) to a listener that accepts and never answers:
    exit 3 naming the location and its attempts, bounded by the request timeout (it ran past
    150 s with the request timeout at 1 s)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.listen(64)
        port = silent.getsockname()[1]
        url = f"gs://bkt/p.hframe?endpoint_override=127.0.0.1:{port}&scheme=http&anonymous=true"
        t0 = time.monotonic()
        try:
            r = subprocess.run(
                [hframe_bin(), "get", url, "0"],
                capture_output=True,
                env={**os.environ, "HFRAME_TTY": "0", **GCS_FAST},
                timeout=60,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("hframe get still waits for a silent GCS endpoint after 60 s")
    err = r.stderr.decode()
    assert r.returncode == 3 and err.startswith("hframe: error: gs://bkt/p.hframe"), err
    assert "timed out" in err and "2 attempts" in err and err.count("\n") == 1, err
    assert time.monotonic() - t0 < 60


def test_hdfs_without_libhdfs_is_refused_in_one_line(tmp_path):
    try:
        pafs.HadoopFileSystem("127.0.0.1", 1)
    except OSError:
        pass
    else:
        pytest.skip("this machine has libhdfs")
    r = run_bin(["verify", "hdfs://127.0.0.1:1/data/p.hframe"])
    err = r.stderr.decode()
    assert r.returncode == 3 and "libhdfs" in err and len(err.strip().splitlines()) == 1


# -- writing: pack -o s3://, --update, resume ---------------------------------------------------


def keys(fs: pafs.FileSystem, prefix: str) -> list[str]:
    return sorted(i.path for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True)))


@pytest.fixture
def staging(tmp_path, monkeypatch):
    monkeypatch.setenv("HFRAME_STAGE", str(tmp_path / "stage"))
    return tmp_path / "stage"


def test_pack_to_s3_publishes_a_pack_every_reader_reads_as_the_local_one(s3, staging, tmp_path):
    fs, endpoint = s3
    src = make_photos(tmp_path / "src", 20)
    url = s3_url(endpoint, "w1/p.hframe")
    r = run_bin(["pack", str(src), "-o", url, "--created", "2024-01-01T00:00:00Z", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["frame_count"] == 20 and doc["pack"] == "s3://bkt/w1/p.hframe?..."  # the query is not printed
    assert [o["location"].split("?")[0] for o in doc["published"]["objects"]] == [
        "s3://bkt/w1/p.hframe.index.parquet.partial",
        "s3://bkt/w1/p.hframe",
        "s3://bkt/w1/p.hframe.index.parquet",
    ]
    assert keys(fs, "bkt/w1") == ["bkt/w1/p.hframe", "bkt/w1/p.hframe.index.parquet"]  # no .partial left
    # the same sources packed here are the same bytes: pack and index, read back with pyarrow
    h.pack([src], tmp_path / "here.hframe", created_us=1_704_067_200_000_000)
    with fs.open_input_file("bkt/w1/p.hframe") as f:
        assert f.read() == (tmp_path / "here.hframe").read_bytes()
    with fs.open_input_file("bkt/w1/p.hframe.index.parquet") as f:
        remote_md5 = pq.read_table(f, columns=["md5"]).column("md5").to_pylist()
    assert remote_md5 == md5s(tmp_path / "here.hframe")
    assert run_bin(["verify", url]).returncode == 0
    again = run_bin(["pack", str(src), "-o", url])
    assert again.returncode == 2 and b"already exists" in again.stderr and b"scheme=http" not in again.stderr


def test_update_of_an_s3_pack_appends_even_from_an_empty_staging_folder(s3, staging, tmp_path):
    fs, endpoint = s3
    src = make_photos(tmp_path / "src", 12)
    url = s3_url(endpoint, "w2/p.hframe")
    assert run_bin(["pack", str(src), "-o", url]).returncode == 0
    before = {r["name"]: r["md5"] for r in h.open_pack(url).table.select(["name", "md5"]).to_pylist()}
    shutil.rmtree(staging)  # another machine (or a wiped cache): the update downloads the pack first
    (src / "extra").mkdir()
    (src / "extra" / "new.bin").write_bytes(b"new frame" * 100)
    r = run_bin(["pack", str(src), "-o", url, "--update"])
    assert r.returncode == 0, r.stderr
    assert b"downloading" in r.stderr and b"appended 1 new files" in r.stderr
    with h.open_pack(url) as p:
        rows = p.table.select(["frame_id", "name", "md5"]).to_pylist()
        assert len(p) == 13 and {r["name"]: r["md5"] for r in rows[:12]} == before  # ids kept
        assert p[12] == b"new frame" * 100
    r = run_bin(["pack", str(src), "-o", url, "--update"])  # nothing changed: nothing sent
    assert r.returncode == 0 and b"up to date" in r.stderr and b"uploaded 0 objects" in r.stderr


def test_a_dataset_packed_to_s3_reads_as_one_pack(s3, staging, local):
    fs, endpoint = s3
    url = s3_url(endpoint, "w3/d.hframe")
    r = run_bin(["pack", str(local / "src"), "-o", url, "--max-pack-bytes", "400K", "--json"])
    assert r.returncode == 0, r.stderr
    names = keys(fs, "bkt/w3")
    assert "bkt/w3/d.hframe.dataset.json" in names and len([n for n in names if n.endswith("0.hframe")]) >= 1
    assert not [n for n in names if n.endswith(".partial")]
    with h.open_pack(url) as remote, h.open_pack(local / "p.hframe") as here:
        got = sorted(hashlib.md5(f).hexdigest() for f in remote.read_many(list(range(len(remote)))))
        assert got == sorted(md5s(local / "p.hframe")) and len(remote) == len(here)


def test_an_upload_killed_before_the_pack_completes_leaves_the_old_version_and_resume_publishes(s3, staging, tmp_path):
    fs, endpoint = s3
    old, new = make_photos(tmp_path / "old", 10), make_photos(tmp_path / "new", 25)
    url = s3_url(endpoint, "w4/p.hframe")
    assert run_bin(["pack", str(old), "-o", url]).returncode == 0
    old_md5 = sorted(md5s_remote(url))
    # the child dies before completing its 2nd object (the pack): only the .partial index is new
    env = {"HFRAME_FAULT": "upload-before-complete:2", "HFRAME_IO_ATTEMPTS": "1"}
    r = run_bin(["pack", str(new), "-o", url, "--force"], env=env)
    assert r.returncode == 3 and b"upload failed" in r.stderr and b"Traceback" not in r.stderr
    assert sorted(md5s_remote(url)) == old_md5  # readers still get the old version, whole
    assert run_bin(["verify", url]).returncode == 0
    r = run_bin(["resume", url])
    assert r.returncode == 0, r.stderr
    got = sorted(md5s_remote(url))
    assert len(got) == 25 and got != old_md5 and run_bin(["verify", url]).returncode == 0
    r = run_bin(["resume", url])  # published: nothing left to do, nothing sent
    assert r.returncode == 0 and b"already complete" in r.stderr and b"uploaded 0 objects" in r.stderr


def test_a_publish_cut_between_pack_and_index_is_read_through_the_partial_index(s3, staging, tmp_path):
    fs, endpoint = s3
    old, new = make_photos(tmp_path / "old", 10), make_photos(tmp_path / "new", 25)
    url = s3_url(endpoint, "w5/p.hframe")
    assert run_bin(["pack", str(old), "-o", url]).returncode == 0
    env = {"HFRAME_FAULT": "upload-after-object:2", "HFRAME_IO_ATTEMPTS": "1"}  # the pack is up, its index not
    assert run_bin(["pack", str(new), "-o", url, "--force"], env=env).returncode == 3
    assert "bkt/w5/p.hframe.index.parquet.partial" in keys(fs, "bkt/w5")
    with h.open_pack(url) as p:  # the new pack, paired with its .partial index: every frame right
        assert len(p) == 25 and p.index_location.endswith(".partial?...")
        assert [hashlib.md5(f).hexdigest() for f in p.read_many(list(range(25)))] == md5s_remote(url)
    assert run_bin(["resume", url]).returncode == 0
    assert keys(fs, "bkt/w5") == ["bkt/w5/p.hframe", "bkt/w5/p.hframe.index.parquet"]


def md5s_remote(url: str) -> list[str]:
    with h.open_pack(url) as p:
        return p.read_index_columns(["md5"]).column("md5").to_pylist()


def test_two_runs_to_one_s3_location_from_one_machine_take_turns(s3, staging, tmp_path):
    _, endpoint = s3
    src = make_photos(tmp_path / "src", 5)
    url = s3_url(endpoint, "w6/p.hframe")
    env = {**os.environ, "HFRAME_FAULT": "after-lock:1:stop"}  # the first run pauses holding the lock
    first = subprocess.Popen([hframe_bin(), "pack", str(src), "-o", url], env=env)
    try:
        deadline = time.monotonic() + 20
        while not list(staging.glob("*/p.hframe.lock")) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = run_bin(["pack", str(src), "-o", url])
        assert second.returncode == 3 and b"lock" in second.stderr.lower()
    finally:
        first.send_signal(signal.SIGCONT)
        first.wait(timeout=60)
    assert first.returncode == 0 and run_bin(["verify", url]).returncode == 0


def test_readers_while_another_process_republishes_to_s3_never_get_wrong_bytes(s3, staging, tmp_path):
    """A second process publishes two versions in turn (pack --force) while this one opens and
    reads: every frame returned is the one the reader's own index lists (checked here with md5,
    independently of the reader's own check), or the read is refused as replaced."""
    _, endpoint = s3
    versions = [make_photos(tmp_path / "a", 12), make_photos(tmp_path / "b", 30)]
    for i, d in enumerate(versions):  # make the two versions' frames differ at every id
        for f in sorted(d.rglob("*.*"))[:3]:
            f.rename(f.with_name(f"v{i}-{f.name}"))
    url = s3_url(endpoint, "w7/p.hframe")
    assert run_bin(["pack", str(versions[0]), "-o", url]).returncode == 0
    script = (
        "import subprocess, sys\n"
        "for d in sys.argv[2:]:\n"
        "    subprocess.run([sys.argv[1], 'pack', d, '-o', " + repr(url) + ", '--force', '-q'], check=True)\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", script, hframe_bin(), *[str(versions[i % 2]) for i in (1, 0, 1, 0)]]
    )
    held = h.open_pack(url)
    reads = refused = 0
    rng = random.Random(9)
    try:
        deadline = time.monotonic() + 60
        while writer.poll() is None and time.monotonic() < deadline:
            try:
                with h.open_pack(url) as p:
                    want = p.read_index_columns(["md5"]).column("md5").to_pylist()
                    ids = rng.sample(range(len(p)), min(8, len(p)))
                    got = p.read_many(ids)
                    assert [hashlib.md5(f).hexdigest() for f in got] == [want[i] for i in ids]
                    reads += 1
            except (PackReplaced, StorageError):
                refused += 1
            try:
                data = held[rng.randrange(len(held))]
            except (PackReplaced, StorageError):
                refused += 1
            else:
                assert hashlib.md5(data).hexdigest() in set(md5s_of(held))
    finally:
        held.close()
        writer.wait(timeout=120)
    assert writer.returncode == 0 and reads > 0
    assert run_bin(["verify", url]).returncode == 0


def md5s_of(p: h.PackReader) -> list[str]:
    return p.read_index_columns(["md5"]).column("md5").to_pylist()


def test_ctrl_c_ends_a_stuck_s3_read_within_a_second(flaky):
    assert_ctrl_c_ends_a_stuck_read(flaky, ["get", fake_url(flaky), "5"])


# -- a store that dies or is interrupted while a command reads ----------------------------------


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 96 MiB pack of incompressible 1 MiB frames (and its index): reading it takes moto a
    while, so a command is still reading it when the test acts."""
    root = tmp_path_factory.mktemp("big")
    src = root / "src"
    src.mkdir()
    rng = random.Random(7)
    for i in range(96):
        (src / f"{i:03d}.bin").write_bytes(rng.randbytes(1 << 20))
    h.pack([src], root / "big.hframe")
    shutil.rmtree(src)
    return root / "big.hframe"


def moto_holding(pack: Path, workdir: Path):
    """A moto server of its own (the test kills it or reads its log) holding ``pack`` in bkt."""
    ctx = moto_s3_process(workdir)
    endpoint, proc, log = ctx.__enter__()
    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
    fs.create_dir("bkt")
    upload(fs, [pack, Path(f"{pack}.index.parquet")], "bkt")
    return ctx, endpoint, proc, log


def ranged_gets(log: Path, key: str) -> int:
    """Requests for ``key`` in moto's log (one line per request answered)."""
    return sum(1 for line in log.read_text(errors="replace").splitlines() if f"GET /bkt/{key}" in line)


def test_an_s3_store_that_dies_mid_verify_is_a_connection_failure_not_a_replaced_pack(big, tmp_path):
    ctx, endpoint, proc, log = moto_holding(big, tmp_path / "moto")
    try:
        url = s3_url(endpoint, big.name)
        v = subprocess.Popen(
            [hframe_bin(), "verify", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, **FAST_FAIL, "HFRAME_TTY": "0"},
        )
        deadline = time.monotonic() + 60
        while ranged_gets(log, big.name) < 4 and v.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the pack's metadata, probe and trailer, the index: then its blocks
        assert v.poll() is None, "verify ended before the store could be killed: make the pack bigger"
        proc.kill()  # the store dies mid-verify
        proc.wait(timeout=10)
        _, err = v.communicate(timeout=60)
    finally:
        ctx.__exit__(None, None, None)
    line = err.decode()
    assert v.returncode == 3, line
    assert line.count("\n") == 1 and line.startswith(f"s3://bkt/{big.name}"), line
    assert "replaced" not in line and "connection failed" in line, line


# -- review findings: forms, orphans, interrupted publishes, replaced compressed packs -----------


def write_texts(root: Path, tag: str, n: int = 40) -> Path:
    """Compressible text files (same names, different bytes per tag)."""
    for i in range(n):
        p = root / "cls" / f"f{i:03d}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{tag} {i} " * 400)
    return root


@pytest.mark.parametrize("remote", [True, False])
def test_a_location_can_change_between_one_pack_and_a_dataset_both_ways(s3, staging, tmp_path, remote):
    fs, endpoint = s3
    a, c = write_texts(tmp_path / "a", "AAA"), write_texts(tmp_path / "c", "CCC")
    out = s3_url(endpoint, f"form{int(remote)}/m.hframe") if remote else str(tmp_path / "m.hframe")

    def first_frame() -> bytes:
        r = run_bin(["get", out, "cls/f001.txt"])
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert run_bin(["pack", str(a), "-o", out]).returncode == 0
    assert first_frame().startswith(b"AAA")
    r = run_bin(["pack", str(c), "-o", out, "--force", "--max-pack-bytes", "40K"])
    assert r.returncode == 0, r.stderr
    assert first_frame().startswith(b"CCC")  # the dataset, not the single pack left under it
    assert run_bin(["dump-header", out]).stdout.startswith(b"ok\ttrue\ndataset")
    r = run_bin(["pack", str(a), "-o", out, "--force"])
    assert r.returncode == 0, r.stderr
    assert first_frame().startswith(b"AAA")  # the pack, not the manifest left beside it
    if remote:
        assert keys(fs, f"bkt/form{int(remote)}") == ["bkt/form1/m.hframe", "bkt/form1/m.hframe.index.parquet"]
    else:
        assert sorted(p.name for p in tmp_path.glob("m*")) == ["m.hframe", "m.hframe.index.parquet"]


def test_readers_while_a_dataset_and_a_pack_take_turns_at_one_s3_location_never_get_wrong_bytes(s3, staging, tmp_path):
    """A second process publishes, at one location, a single pack and a 3-shard dataset in turn
    (``--force``) while this one opens and reads: every open is one of the two whole (all its
    frames one version's: never a shard of one beside frames of the other), every frame is the
    one the reader's own index lists (md5 checked here), or the open or read is refused as
    replaced or failed. Bounded: four publishes, 60 s."""
    fs, endpoint = s3
    a, c = write_texts(tmp_path / "a", "AAA"), write_texts(tmp_path / "c", "CCC")
    url = s3_url(endpoint, "turns/m.hframe")
    assert run_bin(["pack", str(a), "-o", url]).returncode == 0
    script = (
        "import subprocess, sys\n"
        "for d, extra in zip(sys.argv[2:], [['--max-pack-bytes', '40K'], []] * 2):\n"
        "    subprocess.run([sys.argv[1], 'pack', d, '-o', " + repr(url) + ", '--force', '-q', *extra], check=True)\n"
    )
    writer = subprocess.Popen([sys.executable, "-c", script, hframe_bin(), str(c), str(a), str(c), str(a)])
    seen, refused = set(), 0
    rng = random.Random(5)
    try:
        deadline = time.monotonic() + 60
        while writer.poll() is None and time.monotonic() < deadline:
            try:
                with h.open_pack(url) as p:  # (a PackReader or a DatasetReader: ``table`` either way)
                    want = p.table.column("md5").to_pylist()
                    ids = rng.sample(range(len(p)), 12)
                    got = p.read_many(ids)
                    assert [hashlib.md5(f).hexdigest() for f in got] == [want[i] for i in ids]
                    tags = {f[:3] for f in got}
                    assert len(tags) == 1 and tags <= {b"AAA", b"CCC"}, tags  # one version, whole
                    seen |= tags
            except (PackReplaced, StorageError):
                refused += 1
    finally:
        writer.wait(timeout=120)
    assert writer.returncode == 0 and seen  # (which versions a run sees depends on timing)
    assert run_bin(["verify", url]).returncode == 0
    assert run_bin(["get", url, "cls/f001.txt"]).stdout.startswith(b"AAA")  # the last publish: the pack


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_an_upload_never_outlives_its_writer(s3, staging, tmp_path):
    """The writer killed (SIGKILL: no clean-up runs) while its upload child is about to complete
    the pack: the child dies with it, and the pack it was sending never appears."""
    fs, endpoint = s3
    old, new = write_texts(tmp_path / "a", "OLD"), write_texts(tmp_path / "c", "NEW")
    url = s3_url(endpoint, "orphan/p.hframe")
    assert run_bin(["pack", str(old), "-o", url]).returncode == 0
    env = {**os.environ, "HFRAME_FAULT": "upload-before-complete:2:stop"}  # the child pauses there
    writer = subprocess.Popen([hframe_bin(), "pack", str(new), "-o", url, "--force"], env=env)
    deadline = time.monotonic() + 30
    child = None
    while child is None and time.monotonic() < deadline:
        kids = _children(writer.pid)
        if kids and (Path(f"/proc/{kids[0]}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"):
            child = kids[0]
        time.sleep(0.05)
    assert child is not None, "the upload child never reached the fault point"
    writer.kill()
    writer.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":  # dead, not yet reaped (its parent is gone: init reaps it)
            break
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{child}").exists()
    r = run_bin(["get", url, "cls/f001.txt"])
    assert r.returncode == 0 and r.stdout.startswith(b"OLD")


def test_a_publish_left_between_pack_and_index_is_finished_before_the_next_one(s3, staging, tmp_path):
    fs, endpoint = s3
    v1, v2, v3 = (write_texts(tmp_path / t, t.upper()) for t in ("one", "two", "three"))
    url = s3_url(endpoint, "halfway/p.hframe")
    assert run_bin(["pack", str(v1), "-o", url]).returncode == 0
    cut = {"HFRAME_FAULT": "upload-after-object:2", "HFRAME_IO_ATTEMPTS": "1"}  # v2's pack is up, its index not
    assert run_bin(["pack", str(v2), "-o", url, "--force"], env=cut).returncode == 3
    assert run_bin(["get", url, "cls/f001.txt"]).stdout.startswith(b"TWO")  # through the .partial index
    # the next run pauses before its pack completes: readers must still get a whole version
    env = {**os.environ, "HFRAME_FAULT": "upload-before-complete:2:stop"}
    writer = subprocess.Popen([hframe_bin(), "pack", str(v3), "-o", url, "--force"], env=env)
    try:
        deadline = time.monotonic() + 30
        paused = None
        while paused is None and time.monotonic() < deadline:
            for kid in _children(writer.pid):
                if Path(f"/proc/{kid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                    paused = kid
            time.sleep(0.05)
        assert paused is not None
        r = run_bin(["get", url, "cls/f001.txt"])
        assert r.returncode == 0 and r.stdout.startswith(b"TWO"), r.stderr
        os.kill(paused, signal.SIGCONT)
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0
    assert run_bin(["get", url, "cls/f001.txt"]).stdout.startswith(b"THREE")
    assert keys(fs, "bkt/halfway") == ["bkt/halfway/p.hframe", "bkt/halfway/p.hframe.index.parquet"]


def test_update_after_a_publish_cut_between_pack_and_index(s3, staging, tmp_path):
    fs, endpoint = s3
    v1, v2 = write_texts(tmp_path / "one", "ONE"), write_texts(tmp_path / "two", "TWO")
    url = s3_url(endpoint, "halfupd/p.hframe")
    assert run_bin(["pack", str(v1), "-o", url]).returncode == 0
    cut = {"HFRAME_FAULT": "upload-after-object:2", "HFRAME_IO_ATTEMPTS": "1"}
    assert run_bin(["pack", str(v2), "-o", url, "--force"], env=cut).returncode == 3
    shutil.rmtree(staging)
    (v2 / "more.txt").write_text("more " * 100)
    r = run_bin(["pack", str(v2), "-o", url, "--update"])
    assert r.returncode == 0, r.stderr
    with h.open_pack(url) as p:
        assert len(p) == 41 and p["more.txt"] == b"more " * 100 and p["cls/f001.txt"].startswith(b"TWO")


def test_a_dataset_republished_under_a_reader_is_exit_3_not_damage(s3, staging, tmp_path):
    fs, endpoint = s3
    a, c = write_texts(tmp_path / "a", "AAA"), write_texts(tmp_path / "c", "CCC")
    url = s3_url(endpoint, "dsrep/d.hframe")
    assert run_bin(["pack", str(a), "-o", url, "--max-pack-bytes", "40K"]).returncode == 0
    cut = {"HFRAME_FAULT": "upload-after-object:2", "HFRAME_IO_ATTEMPTS": "1"}  # shard 0 replaced, no manifest
    assert run_bin(["pack", str(c), "-o", url, "--force", "--max-pack-bytes", "40K"], env=cut).returncode == 3
    r = run_bin(["get", url, "cls/f001.txt"])
    assert r.returncode == 3 and b"being republished" in r.stderr and b"scheme=http" not in r.stderr
    assert run_bin(["resume", url]).returncode == 0
    assert run_bin(["get", url, "cls/f001.txt"]).stdout.startswith(b"CCC")


def test_a_compressed_s3_pack_replaced_under_a_reader_is_replaced_not_damaged(s3, staging, tmp_path):
    fs, endpoint = s3
    a, c = tmp_path / "a", tmp_path / "c"
    for root, tag in ((a, "AAA"), (c, "CCC")):  # compressible, and well past the first 64 KiB read
        rng = random.Random(tag)
        for i in range(200):
            p = root / "cls" / f"f{i:03d}.txt"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(tag + rng.randbytes(3000).hex())
    url = s3_url(endpoint, "zrep/p.hframe")
    assert run_bin(["pack", str(a), "-o", url, "--compress", "zstd:1"]).returncode == 0
    with h.open_pack(url) as p:
        assert p.compressed and p.checks_md5 and p[1].startswith(b"AAA")
        assert run_bin(["pack", str(c), "-o", url, "--force", "--compress", "zstd:19"]).returncode == 0
        for read in (lambda: p[130], lambda: p.read_stored(131), lambda: p.read_many([5, 132]), lambda: p.head(134, 8)):
            with pytest.raises(PackReplaced):
                read()


@pytest.mark.parametrize(
    "location, words",
    [
        ("s3://no-such-bucket/x.hframe?endpoint_override={e}&scheme=http", "the bucket no-such-bucket does not exist"),
        ("s3://bkt/x.hframe?endpoint_override={e}&scheme=ftp", "scheme must be http or https"),
        ("s3://bkt/x.hframe?endpoint_override={e}&scheme=http&anonymous=maybe", "anonymous='maybe'"),
        ("s3://bkt//x.hframe?endpoint_override={e}&scheme=http", "no empty path parts"),
        ("s3://bkt/x.hframe?endpoint_override={e}&scheme=http&secret=S3CR3T", "unknown option secret"),
    ],
)
def test_a_location_that_cannot_be_written_is_refused_before_building(s3, staging, tmp_path, location, words):
    _, endpoint = s3
    src = write_texts(tmp_path / "src", "X", 3)
    t0 = time.monotonic()
    r = run_bin(["pack", str(src), "-o", location.format(e=endpoint)], env={"HFRAME_IO_ATTEMPTS": "5"})
    err = r.stderr.decode()
    assert r.returncode == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert "S3CR3T" not in err and endpoint not in err  # the query is never printed
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("remote", [False, True])
def test_verify_finds_a_shard_that_is_not_the_one_its_manifest_names(s3, staging, tmp_path, remote):
    fs, endpoint = s3
    a = write_texts(tmp_path / "a", "AAA")
    (tmp_path / "ds").mkdir()
    h.pack([a], tmp_path / "ds" / "d.hframe", max_pack_bytes=40_000)
    h.pack([write_texts(tmp_path / "o", "OTHER", 5)], tmp_path / "o.hframe")
    for suffix in ("", ".index.parquet"):  # a shard swapped for another pack (index and all)
        shutil.copy(tmp_path / f"o.hframe{suffix}", tmp_path / "ds" / f"d-00001.hframe{suffix}")
    target = str(tmp_path / "ds" / "d.hframe")
    if remote:
        upload(fs, sorted((tmp_path / "ds").iterdir()), "bkt/swapped")
        target = s3_url(endpoint, "swapped/d.hframe")
    r = run_bin(["verify", target, "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and not doc["ok"], r.stderr
    found = [p for pack in doc["packs"] for p in pack["problems"] if p["check"] == "manifest"]
    assert len(found) == 1 and "d-00001.hframe" in found[0]["message"]


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A pack of 1500 frames of 16 KiB: a bench batch of 256 of them is 256 requests."""
    root = tmp_path_factory.mktemp("many")
    src = root / "src"
    src.mkdir()
    rng = random.Random(8)
    for i in range(1500):
        (src / f"{i:04d}.bin").write_bytes(rng.randbytes(16 << 10))
    h.pack([src], root / "many.hframe")
    shutil.rmtree(src)
    return root / "many.hframe"


@pytest.mark.parametrize("bench", ["bench-warm", "bench-cold"])
def test_ctrl_c_stops_an_s3_bench_and_its_requests(many, tmp_path, bench):
    """SIGINT while a bench reads over S3 ends it with exit 130, and the store gets no more
    requests than were in flight at the signal: a batch's queued reads are not made after it
    (they were: 128 GETs, 2-30 s, while the reader's threads waited for them)."""
    in_flight = 4
    ctx, endpoint, proc, log = moto_holding(many, tmp_path / "moto")
    try:
        env = {**os.environ, "HFRAME_TTY": "0", "HFRAME_IO_IN_FLIGHT": str(in_flight)}
        cmd = [hframe_bin(), bench, s3_url(endpoint, many.name), "--frames", "256", "--batches", "1000"]
        b = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        deadline = time.monotonic() + 60
        while ranged_gets(log, many.name) < 40 and b.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # well into the first batch
        assert b.poll() is None, b.stderr.read() if b.stderr else ""
        before = ranged_gets(log, many.name)
        t0 = time.monotonic()
        b.send_signal(signal.SIGINT)
        _, err = b.communicate(timeout=60)
        took = time.monotonic() - t0
        time.sleep(1.0)  # what was in flight is answered (and logged) by now
        after = ranged_gets(log, many.name) - before
    finally:
        ctx.__exit__(None, None, None)
    assert b.returncode == 130 and err == b"hframe: error: interrupted\n", err
    assert took < 10  # (1 s as a rule; this catches a wait for the batch, not a slow machine)
    # at most what was in flight, and what the reader's threads started in the moment between
    # the count and the main thread's handling of the signal (each thread at most once more:
    # 5 and 6 seen on a loaded machine); the bug this guards against made 128
    assert after <= 2 * in_flight, f"{after} GETs after the signal"
