"""Credentials in a location (``http://USER:PASSWORD@HOST/...``, ``s3://KEY:SECRET@BUCKET/...``).

An http(s) URL's user name and password are sent as HTTP Basic credentials on every request to
that origin (the pack, its index, a dataset manifest and the shards it names there) and never
elsewhere; an object-store location with credentials is refused (exit 2) before any request, with
where credentials go instead. Either way no byte hframe prints -- an error line, a ``--json``
document, a progress or summary line, a ``--debug`` traceback -- holds the password: a URL is
shown as ``http://alice:***@HOST/...``.

The servers demand the credentials (a ``RangeServer`` with ``auth``, and nginx with
``auth_basic``): a command that works proves they were sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket

import pytest
from conftest import make_photos, nginx_serving, run_bin, run_bins
from range_server import RangeServer

import hframe_cli as h
from hframe_cli.errors import HframeError, InputError, StorageError
from hframe_cli.locations import shown_url
from hframe_cli.read.dataset import Manifest, ShardEntry
from hframe_cli.storage.http import PROBE_BYTES

CANARY = "Zq9canaryPW"
WRONG = "Wr0ngCanaryPW"  # a wrong password is a secret too (often a typo of the right one)
SECRETS = (CANARY.encode(), WRONG.encode())
FAST_FAIL = {"HFRAME_IO_ATTEMPTS": "2", "HFRAME_IO_REQUEST_TIMEOUT": "1", "HFRAME_IO_TIMEOUT": "5"}


def assert_no_secret(r, what) -> None:
    for stream in (r.stdout, r.stderr):
        for secret in SECRETS:
            assert secret not in stream, (what, r.stdout[-2000:], r.stderr[-2000:])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A pack (past the first 64 KiB request) and a sharded dataset, served by a server that
    answers 401 to every request without alice's password."""
    root = tmp_path_factory.mktemp("site")
    src = make_photos(root / "src", 24)
    for i in range(60):
        (src / "blobs" / f"{i:03d}.bin").parent.mkdir(exist_ok=True)
        (src / "blobs" / f"{i:03d}.bin").write_bytes(hashlib.sha256(b"%d" % i).digest() * 100)
    h.pack([src], root / "p.hframe", created_us=1_700_000_000_000_000)
    (root / "ds").mkdir()
    h.pack([src], root / "ds" / "ds.hframe", max_pack_bytes=60_000, created_us=1_700_000_000_000_000)
    assert len(list((root / "ds").glob("ds-*.hframe"))) > 1
    with RangeServer(root) as srv:
        srv.auth = ("alice", CANARY)
        yield srv, root


@pytest.fixture
def srv(site):
    server, _ = site
    server.auth = ("alice", CANARY)
    server.faults.clear()
    server.reset_counts()
    return server


def with_user(srv: RangeServer, name: str, userinfo: str = f"alice:{CANARY}") -> str:
    return f"http://{userinfo}@127.0.0.1:{srv.port}/{name}"


def shown(srv: RangeServer, name: str) -> str:
    return f"http://alice:***@127.0.0.1:{srv.port}/{name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- how a location is shown ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("http://alice:pw@h:8080/p.hframe", "http://alice:***@h:8080/p.hframe"),
        ("https://alice:pw@h/p.hframe?X-Amz-Signature=s", "https://alice:***@h/p.hframe?..."),
        ("http://al%20ice:p%40ss%3A@h/p", "http://al%20ice:***@h/p"),
        ("http://alice:p@ss@h/p", "http://alice:***@h/p"),  # an unencoded @: the last one ends it
        ("http://alice:pa?ss@h/p?q=1", "http://alice:***@h/p?..."),  # an unencoded ?: still hidden
        ("http://token@h/p", "http://***@h/p"),  # a lone user name is often a token
        ("s3://KEY:SECRET@bucket/k", "s3://KEY:***@bucket/k"),
        ("http://h/p?mail=a@b", "http://h/p?..."),
        ("s3://KEY:se/cr/et@bucket/k", "s3://KEY:***@bucket/k"),  # an unencoded / (AWS secret keys hold them)
        ("http://alice:se/cret@h:81/p", "http://alice:***@h:81/p"),
        ("http://h:8080/a@b/p", "http://h:8080/a@b/p"),  # a port, then a path holding an @: no password
        ("s3://bucket/user@x/p", "s3://bucket/user@x/p"),
        ("http://h/p", "http://h/p"),
        ("/local/dir@x/p.hframe", "/local/dir@x/p.hframe"),
        ("file:///a@b/p", "file:///a@b/p"),
    ],
)
def test_a_location_is_shown_without_its_password_or_query(url, want):
    assert shown_url(url) == want


# -- HTTP: the credentials are sent, and never shown --------------------------------------------


def test_every_command_on_a_url_with_credentials_authenticates_and_never_prints_the_password(srv, site):
    _, root = site
    url = with_user(srv, "p.hframe")
    local = str(root / "p.hframe")
    same = [  # the same bytes as on the local file, the location aside
        ["get", "{}", "7"],
        ["get", "{}", "30", "--stored"],
        ["index", "{}", "-c", "name,md5,length"],
        ["dump-header", "{}", "--frame", "3"],
        ["dump-header", "{}"],
        ["verify", "{}"],
    ]
    for args in same:
        for debug in ([], ["--debug"]):
            r = run_bin([*debug, *(a.format(url) for a in args)])
            here = run_bin([a.format(local) for a in args])
            assert r.returncode == 0, (args, r.stderr)
            assert_no_secret(r, args)
            if args[0] != "verify":  # (verify prints the time it took)
                assert r.stdout.replace(shown(srv, "p.hframe").encode(), b"P") == here.stdout.replace(
                    local.encode(), b"P"
                ), args
    r = run_bin(["verify", url, "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"] and doc["frames_checked"] == 84, r.stderr
    assert doc["packs"][0]["pack"] == shown(srv, "p.hframe")
    assert doc["packs"][0]["index"] == shown(srv, "p.hframe.index.parquet")
    assert_no_secret(r, "verify --json")
    r = run_bin(["dump-header", url, "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["pack"] == shown(srv, "p.hframe")
    assert_no_secret(r, "dump-header --json")
    for mode in ("bench-cold", "bench-warm"):
        r = run_bin([mode, url, "--frames", "8", "--batches", "2", "--md5", "--json"])
        doc = json.loads(r.stdout)
        assert r.returncode == 0 and doc["ok"] and doc["pack"] == shown(srv, "p.hframe"), r.stderr
        assert doc["host"]["mount"] == f"127.0.0.1:{srv.port}"
        assert_no_secret(r, mode)
        r = run_bin([mode, url, "--frames", "8", "--batches", "2"])
        assert r.returncode == 0 and r.stdout.startswith(f"{mode} {shown(srv, 'p.hframe')}: ".encode()), r.stderr
        assert_no_secret(r, mode)
    # every request carried alice's credentials: the server refused none
    assert srv.authorization and set(srv.authorization) == {srv.basic()}


def test_the_library_sends_the_credentials_on_every_request_of_a_remote_read(srv, site):
    _, root = site
    with h.open_pack(with_user(srv, "p.hframe")) as p, h.open_pack(root / "p.hframe") as local:
        assert p.read_many(list(range(len(p)))) == local.read_many(list(range(len(local))))
        assert p.path == with_user(srv, "p.hframe")  # kept, to open it again (a DataLoader worker)
    paths = {path for path, _ in srv.log}
    assert {"/p.hframe", "/p.hframe.index.parquet"} <= paths and len(srv.log) > 3
    assert set(srv.authorization) == {srv.basic()}


def test_a_dataset_behind_credentials_reads_its_shards_with_them(srv, site):
    _, root = site
    url = with_user(srv, "ds/ds.hframe")
    r = run_bin(["verify", url, "--json"])
    doc = json.loads(r.stdout)
    shards = sorted(p.name for p in (root / "ds").glob("ds-*.hframe"))
    assert r.returncode == 0 and doc["frames_checked"] == 84, r.stderr
    assert [p["pack"] for p in doc["packs"]] == [shown(srv, f"ds/{s}") for s in shards]
    assert_no_secret(r, "verify dataset")
    r = run_bin(["dump-header", url, "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["dataset"] == shown(srv, "ds/ds.hframe")
    assert doc["manifest"] == shown(srv, "ds/ds.hframe.dataset.json")
    assert_no_secret(r, "dump-header dataset")
    r = run_bin(["get", url, "83"])
    assert r.returncode == 0 and r.stdout == run_bin(["get", str(root / "ds" / "ds.hframe"), "83"]).stdout
    assert {f"/ds/{s}" for s in shards} <= {path for path, _ in srv.log}
    assert set(srv.authorization) == {srv.basic()}


def test_credentials_go_to_the_manifests_origin_only(srv, site, tmp_path):
    """A manifest naming its shards by absolute URL: those on the manifest's own origin get its
    credentials, those on another host never do."""
    _, root = site
    manifest = json.loads((root / "ds" / "ds.hframe.dataset.json").read_text())
    other_root = tmp_path / "other"
    other_root.mkdir()
    with RangeServer(other_root) as other:
        shards = []
        for k, entry in enumerate(manifest["shards"]):
            name = entry["path"]
            if k % 2:  # every other shard on another host, which asks for no credentials
                for suffix in ("", ".index.parquet"):
                    (other_root / f"{name}{suffix}").write_bytes((root / "ds" / f"{name}{suffix}").read_bytes())
                entry["path"] = other.url(name)
            else:  # the others named by absolute URL on the manifest's origin (no credentials in it)
                entry["path"] = f"http://127.0.0.1:{srv.port}/ds/{name}"
            shards.append(entry)
        m = Manifest([ShardEntry(**e) for e in shards], manifest["frame_count"])
        (root / "ds" / "abs.hframe.dataset.json").write_text(m.to_json())
        try:
            r = run_bin(["verify", with_user(srv, "ds/abs.hframe"), "--json"])
            doc = json.loads(r.stdout)
            assert r.returncode == 0 and doc["frames_checked"] == 84, r.stderr
            assert_no_secret(r, "verify")
        finally:
            (root / "ds" / "abs.hframe.dataset.json").unlink()
        assert other.total_requests() > 0 and set(other.authorization) == {None}
    assert set(srv.authorization) == {srv.basic()}


def test_a_percent_encoded_user_and_password_are_sent_decoded(srv, site):
    _, root = site
    srv.auth = ("al ice", "p@ss:w/rd é")
    url = with_user(srv, "p.hframe", "al%20ice:p%40ss%3Aw%2Frd%20%C3%A9")
    r = run_bin(["get", url, "5"])
    assert r.returncode == 0 and r.stdout == run_bin(["get", str(root / "p.hframe"), "5"]).stdout, r.stderr
    r = run_bin(["dump-header", url, "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["pack"] == f"http://al%20ice:***@127.0.0.1:{srv.port}/p.hframe"
    assert b"p%40ss" not in r.stdout + r.stderr
    assert set(srv.authorization) == {"Basic " + base64.b64encode("al ice:p@ss:w/rd é".encode()).decode()}


def test_the_index_of_a_url_with_credentials_and_a_query_is_asked_with_both(srv, site):
    """dump-header finds the index at the pack's own URL + .index.parquet (credentials and query
    kept), not at the URL as shown."""
    r = run_bin(["dump-header", with_user(srv, "p.hframe?versionId=3"), "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["index"]["path"] == shown(srv, "p.hframe.index.parquet?..."), r.stdout
    assert "/p.hframe.index.parquet?versionId=3" in {path for path, _ in srv.log}
    assert set(srv.authorization) == {srv.basic()}
    assert_no_secret(r, "dump-header")


def test_a_user_name_alone_is_sent_with_an_empty_password_and_never_shown(srv, site):
    _, root = site
    srv.auth = (CANARY, "")  # a token given as the user name
    r = run_bin(["dump-header", with_user(srv, "p.hframe", CANARY), "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["pack"] == f"http://***@127.0.0.1:{srv.port}/p.hframe"
    assert_no_secret(r, "dump-header")


def _failing_cases(srv: RangeServer) -> list[tuple[str, str, int, bytes]]:
    """(what, URL, exit code, words on stderr) of a URL with credentials that cannot be read."""
    down = free_port()
    return [
        ("missing", with_user(srv, "nope.hframe"), 2, b"no such file (HTTP 404)"),
        ("wrong password", with_user(srv, "p.hframe", f"alice:{WRONG}"), 3, b"HTTP 401"),
        ("server down", f"http://alice:{CANARY}@127.0.0.1:{down}/p.hframe", 3, b"connection failed"),
    ]


READS = [
    ["get", "{u}", "1"],
    ["index", "{u}"],
    ["verify", "{u}", "--json"],
    ["dump-header", "{u}", "--json"],
    ["dump-header", "{u}", "--frame", "2"],
    ["bench-cold", "{u}", "--frames", "4", "--batches", "1", "--json"],
    ["bench-warm", "{u}", "--frames", "4", "--batches", "1"],
]
WRITES = [  # what cannot write to a URL says so, whatever the server
    ["pack", "{src}", "-o", "{u}", "--json"],
    ["resume", "{u}", "--json"],
    ["index", "{u}", "--rebuild"],
    ["index", "{u}", "--merge", "x*"],
    ["pack", "{u}", "-o", "{out}", "--json"],  # a file at a URL as a source (fails: nothing is written)
]


def test_failing_commands_print_the_url_without_its_password(srv, site, tmp_path):
    _, root = site
    for what, url, code, words in _failing_cases(srv):
        plain = run_bins([([a.format(u=url) for a in args], {"env": FAST_FAIL}) for args in READS])
        debugged = run_bins([(["--debug", *(a.format(u=url) for a in args)], {"env": FAST_FAIL}) for args in READS])
        for args, r, rd in zip(READS, plain, debugged):
            assert r.returncode == code, (what, args, r.stderr)
            lines = r.stderr.decode().splitlines()
            if args[0] == "verify":  # verify --json tells it in its document, and nothing on stderr
                doc = json.loads(r.stdout)
                lines = [doc["packs"][0]["error"]]
                assert doc["packs"][0]["pack"] == shown_url(url) and not r.stderr
            assert len(lines) == 1 and words.decode() in lines[0] and "alice:***@127.0.0.1:" in lines[0], (what, args)
            if "--json" in args:
                assert json.loads(r.stdout)["ok"] is False
            assert_no_secret(r, (what, args))
            assert rd.returncode != 0 and (b"Traceback" in rd.stderr or args[0] == "verify"), rd.stderr
            assert_no_secret(rd, (what, "--debug", args))
        for args in WRITES:
            full = [a.format(u=url, src=root / "src", out=tmp_path / "o.hframe") for a in args]
            for debug in ([], ["--debug"]):
                r = run_bin([*debug, *full], env=FAST_FAIL, cwd=tmp_path)
                if args[1] == "{u}":  # a file at a URL as a source: read, so it fails as reading does
                    assert r.returncode in ((2, 3) if not debug else (1,)), (what, args, r.stderr)
                else:
                    assert r.returncode == (2 if not debug else 1), (what, args, r.stderr)
                assert_no_secret(r, (what, debug, args))
    assert list(tmp_path.iterdir()) == []


def test_a_reader_opened_again_in_a_worker_sends_the_password_not_its_shown_form(srv, site):
    """A DataLoader worker's copy of a reader (unpickled) opens pack and index at their URLs
    whole: the index was opened again at the URL as messages show it (password as ***) and
    refused with 401."""
    import pickle

    with h.open_pack(with_user(srv, "p.hframe")) as p:
        data, want = pickle.dumps(p), p.read_many([0, 3])
    srv.reset_counts()
    with pickle.loads(data) as q:
        assert q.read_many([0, 3]) == want
    assert set(srv.authorization) == {srv.basic()}, "a request without alice's password"


def test_a_wrong_or_missing_password_is_one_line_exit_3_that_says_so(srv, site):
    url = with_user(srv, "p.hframe", f"alice:{WRONG}")
    r = run_bin(["get", url, "1"], env=FAST_FAIL)
    assert (
        r.returncode == 3
        and r.stderr
        == (
            f"hframe: error: http://alice:***@127.0.0.1:{srv.port}/p.hframe: HTTP 401 Unauthorized: "
            "the server refused the user name and password in the URL\n"
        ).encode()
    )
    r = run_bin(["get", srv.url("p.hframe"), "1"], env=FAST_FAIL)
    assert (
        r.returncode == 3
        and r.stderr
        == (
            f"hframe: error: {srv.url('p.hframe')}: HTTP 401 Unauthorized: the server asks for a user name and "
            "password (put USER:PASSWORD@ before the host in the URL)\n"
        ).encode()
    )
    # refused at once, not retried: each command asked once for the head (and, at the same time,
    # may have asked for the trailer: a refused hint is not retried either)
    pack_ranges = [r for path, r in srv.log if path == "/p.hframe"]
    assert pack_ranges.count(f"bytes=0-{PROBE_BYTES - 1}") == 2 and pack_ranges.count("bytes=-64") <= 2
    assert len(pack_ranges) <= 4


def test_library_errors_do_not_hold_the_password(srv, site):
    for what, url, _, words in _failing_cases(srv):
        with pytest.raises(HframeError) as e:
            h.open_pack(url)
        assert words.decode() in str(e.value) and CANARY not in str(e.value) and WRONG not in str(e.value), what
        assert isinstance(e.value, (InputError, StorageError))


def test_nginx_with_auth_basic_serves_the_pack_to_the_right_password_only(site, tmp_path):
    _, root = site
    salt = os.urandom(4)  # {SSHA}: base64(sha1(password + salt) + salt), one of nginx's htpasswd schemes
    digest = hashlib.sha1(CANARY.encode() + salt).digest()
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(f"alice:{{SSHA}}{base64.b64encode(digest + salt).decode()}\n")
    log = tmp_path / "access.log"
    directives = f'auth_basic "hframe"; auth_basic_user_file {htpasswd}; access_log {log};'
    with nginx_serving(root, tmp_path / "nginx", directives) as base:
        port = base.rpartition(":")[2]
        good = f"http://alice:{CANARY}@127.0.0.1:{port}/p.hframe"
        for args in (["get", good, "9"], ["index", good, "-c", "name,md5"], ["dump-header", good, "--frame", "4"]):
            r = run_bin(args)
            assert r.returncode == 0, r.stderr
            assert r.stdout == run_bin([str(root / "p.hframe") if a == good else a for a in args]).stdout
            assert_no_secret(r, args)
        r = run_bin(["verify", good, "--json"])
        assert r.returncode == 0 and json.loads(r.stdout)["frames_checked"] == 84, r.stderr
        assert_no_secret(r, "verify")
        served = [line for line in log.read_text().splitlines() if " 206 " in line or " 200 " in line]
        assert served and all(" alice [" in line for line in served)  # nginx's $remote_user
        for url, why in (
            (f"http://alice:{WRONG}@127.0.0.1:{port}/p.hframe", b"refused the user name and password"),
            (f"{base}/p.hframe", b"asks for a user name and password"),
        ):
            for args in (["get", url, "9"], ["verify", url], ["--debug", "dump-header", url]):
                r = run_bin(args, env=FAST_FAIL)
                assert r.returncode == (3 if "--debug" not in args else 1), r.stderr
                assert b"HTTP 401" in r.stderr and why in r.stderr
                assert_no_secret(r, args)


# -- object stores: refused before any request --------------------------------------------------


def test_an_object_store_location_with_credentials_is_refused_before_any_request(site, tmp_path):
    _, root = site
    stage = tmp_path / "stage"
    env = {**FAST_FAIL, "HFRAME_STAGE": str(stage)}
    with RangeServer(root) as s3:  # the endpoint the s3:// location names: it must not be asked
        endpoint = f"?endpoint_override=127.0.0.1:{s3.port}&scheme=http"
        cases = [
            (f"s3://KEY:{CANARY}@bucket/p.hframe{endpoint}", b"s3://KEY:***@bucket/p.hframe?...", b"AWS_ACCESS_KEY_ID"),
            (
                f"gs://user:{CANARY}@bucket/p.hframe",
                b"gs://user:***@bucket/p.hframe",
                b"GOOGLE_APPLICATION_CREDENTIALS",
            ),
            (f"hdfs://user:{CANARY}@nn:8020/p.hframe", b"hdfs://user:***@nn:8020/p.hframe", b"?user=NAME"),
        ]
        for url, shown_as, where in cases:  # (every one refused before it writes anything: run a few at once)
            fulls = [
                [a.format(u=url, src=root / "src", out=tmp_path / "o.hframe") for a in args] for args in READS + WRITES
            ]
            kw = {"env": env, "cwd": tmp_path}
            plain = run_bins([(full, kw) for full in fulls])
            debugged = run_bins([(["--debug", *full], kw) for full in fulls])
            for args, full, r, rd in zip(READS + WRITES, fulls, plain, debugged):
                assert r.returncode == 2, (url, args, r.stderr)
                assert_no_secret(r, (url, args))
                said = r.stderr
                if args[0] == "verify":  # verify --json tells it in its document
                    said = b"hframe: error: " + json.loads(r.stdout)["packs"][0]["error"].encode() + b"\n"
                if args[0] != "pack" or full[1] != url:  # (a URL as a pack's source is not a location)
                    assert said.startswith(b"hframe: error: " + shown_as + b": "), (args, said)
                    assert said.count(b"\n") == 1
                    if args[0] != "index" or len(args) == 2:  # (index --rebuild, --merge: no remote writes)
                        assert where in said and b"shell history" in said, said
                assert_no_secret(rd, (url, "--debug", args))
        assert s3.total_requests() == 0
    assert not stage.exists() or list(stage.iterdir()) == []


def test_a_password_holding_a_slash_is_never_printed_nor_sent_to_a_host(site, tmp_path):
    """AWS secret keys often hold a '/': the location's user info then runs past the first '/',
    which read it as a host and a path (the secret printed whole; for s3://, handed to pyarrow)."""
    _, root = site
    head, tail = CANARY[:5], CANARY[5:]
    with RangeServer(root) as srv:
        urls = [
            f"s3://KEY:{head}/{tail}@bucket/p.hframe?endpoint_override=127.0.0.1:{srv.port}&scheme=http",
            f"gs://user:{head}/{tail}@bucket/p.hframe",
            f"http://alice:{head}/{tail}@127.0.0.1:{srv.port}/p.hframe",
        ]
        for url in urls:
            for args in (["dump-header", url], ["verify", url, "--json"], ["--debug", "get", url, "0"]):
                r = run_bin(args, env=FAST_FAIL, cwd=tmp_path)
                out = r.stdout + r.stderr
                assert r.returncode == (1 if args[0] == "--debug" else 2), (args, r.stderr)  # --debug: a traceback
                assert head.encode() not in out and tail.encode() not in out, (args, out)
        assert srv.total_requests() == 0


def test_damaged_or_mismatched_data_behind_credentials_is_named_without_the_password(site, tmp_path):
    """The messages about what a server holds (another pack's index, no index, an unreadable
    manifest, a file that is no pack) name the URL as shown, in every output."""
    _, root = site
    bad = tmp_path / "bad"
    (bad / "ds").mkdir(parents=True)
    src = make_photos(tmp_path / "src", 4)
    h.pack([src], bad / "other.hframe")
    (bad / "mismatch.hframe").write_bytes((root / "p.hframe").read_bytes())
    (bad / "mismatch.hframe.index.parquet").write_bytes((bad / "other.hframe.index.parquet").read_bytes())
    (bad / "noindex.hframe").write_bytes((root / "p.hframe").read_bytes())
    (bad / "ds" / "junk.hframe.dataset.json").write_text('{"kind": "hframe-dataset", "shards": [')
    (bad / "notapack.hframe").write_bytes(b"hello, world\n" * 100)
    (bad / "notapack.hframe.index.parquet").write_bytes((root / "p.hframe.index.parquet").read_bytes())
    with RangeServer(bad) as srv:
        srv.auth = ("alice", CANARY)
        for name, words in (
            ("mismatch.hframe", b"index does not belong to this pack"),
            ("noindex.hframe", b"index not found"),
            ("ds/junk.hframe", b"unreadable dataset manifest"),
            ("notapack.hframe", b"not a frame pack"),
        ):
            url = with_user(srv, name)
            matrix = [
                (args, debug)
                for args in READS + [["index", "{u}", "-f", "json"], ["verify", "{u}", "--no-index"]]
                for debug in ([], ["--debug"])
            ]
            runs = run_bins(
                [([*debug, *(a.format(u=url) for a in args)], {"env": FAST_FAIL}) for args, debug in matrix]
            )
            for (args, debug), r in zip(matrix, runs):
                assert_no_secret(r, (name, debug, args))
                if not debug and args[0] != "verify" and "--no-index" not in args and "--frame" not in args:
                    assert words in r.stderr or words in r.stdout, (name, args, r.stderr)
        assert set(srv.authorization) == {srv.basic()}


def test_a_url_given_where_a_local_path_goes_is_not_printed_with_its_password(srv, tmp_path):
    """--junit, --compare and get -o take local paths: a URL there is a local name (``http:/...``
    once ``//`` is folded), and what names it hides the password all the same."""
    url = with_user(srv, "p.hframe")
    for args in (
        ["verify", url, "--junit", url],
        ["bench-cold", url, "--frames", "2", "--batches", "1", "--compare", url],
        ["get", url, "1", "2", "-o", url],
    ):
        for debug in ([], ["--debug"]):
            r = run_bin([*debug, *args], cwd=tmp_path)
            assert_no_secret(r, (debug, args))
            if not debug:
                assert r.stderr.count(b"\n") == 1 and b"alice:***@127.0.0.1" in r.stderr, (args, r.stderr)
