"""``hframe pack s3://bucket/prefix/``: objects under a prefix of a real S3 API server (moto on
loopback), packed as the folder they would sync to, without a local copy; and lists of http(s)
URLs (a real nginx on loopback), packed as the folder ``wget -x`` would fetch."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.parse
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import hframe_bin, killed_and_resumed, make_photos, moto_s3, nginx_serving, real_media, run_bin

import hframe_cli as h
from hframe_cli.names import checkpoint_name

CREATED = ["--created", "1700000000"]
SAME = ["name", "md5", "source_size", "source_mtime", "media_type", "kind", "width", "height", "label", "mode"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """moto's S3 holding bucket ``bkt``; yields (pyarrow filesystem, endpoint)."""
    with moto_s3(tmp_path_factory.mktemp("moto")) as endpoint:
        fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
        fs.create_dir("bkt")
        yield fs, endpoint


def put_tree(fs: pafs.S3FileSystem, root: Path, prefix: str) -> list[str]:
    keys = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            key = f"{prefix}/{p.relative_to(root).as_posix()}"
            with fs.open_output_stream(key) as f:
                f.write(p.read_bytes())
            keys.append(key)
    return keys


def url(endpoint: str, path: str) -> str:
    return f"s3://{path}?endpoint_override={endpoint}&scheme=http"


@pytest.fixture(scope="module")
def photos_prefix(store, tmp_path_factory):
    """Our photos, real images made by others in nested folders, and a blob, under bkt/photos/."""
    fs, endpoint = store
    root = make_photos(tmp_path_factory.mktemp("tree") / "tree", 12)
    for i, p in enumerate(real_media(30)):
        (root / f"real{i % 3}").mkdir(exist_ok=True)
        shutil.copyfile(p, root / f"real{i % 3}" / f"{i:03d}{p.suffix}")
    (root / "notes.bin").write_bytes(os.urandom(3000))
    put_tree(fs, root, "bkt/photos")
    return url(endpoint, "bkt/photos/"), root


def synced(fs: pafs.S3FileSystem, prefix: str, into: Path) -> Path:
    """What ``aws s3 sync`` makes of the prefix: the objects as files, with their times."""
    for info in fs.get_file_info(pafs.FileSelector(prefix, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        dest = into / info.path[len(prefix) + 1 :]
        dest.parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(info.path) as f:
            dest.write_bytes(f.read())
        os.utime(dest, ns=(info.mtime_ns, info.mtime_ns))
    return into


def test_a_prefix_packs_as_its_synced_folder_does_and_can_publish_to_the_store(store, photos_prefix, tmp_path):
    fs, endpoint = store
    photos_prefix, tree = photos_prefix
    out = tmp_path / "s3.hframe"
    r = run_bin(["pack", photos_prefix, "-o", str(out), *CREATED])
    assert r.returncode == 0, r.stderr
    folder = synced(fs, "bkt/photos", tmp_path / "synced")
    local = tmp_path / "local.hframe"
    assert run_bin(["pack", str(folder), "-o", str(local), *CREATED]).returncode == 0
    got = pq.read_table(f"{out}.index.parquet").to_pylist()
    want = pq.read_table(f"{local}.index.parquet", columns=SAME).to_pylist()
    assert [{k: g[k] for k in SAME} for g in got] == want
    assert all(g["source"].startswith(f"s3://bkt/photos/{g['name']}#etag=") for g in got)
    originals = {p.relative_to(tree).as_posix(): hashlib.md5(p.read_bytes()).hexdigest() for p in tree.rglob("*.*")}
    assert {g["name"]: g["md5"] for g in got} == originals  # the files put there, byte for byte
    with h.open_pack(out) as a, h.open_pack(local) as b:
        assert a.read_many(list(range(len(a)))) == b.read_many(list(range(len(b))))
    # filters, and the pack written to the store itself
    dest = url(endpoint, "bkt/packs/real.hframe")
    r = run_bin(["pack", photos_prefix, "-o", dest, "--include", "real*/*", "--exclude", "*.gif", *CREATED])
    assert r.returncode == 0, r.stderr
    r = run_bin(["verify", dest, "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stderr
    r = run_bin(["index", dest, "-c", "name", "-f", "json"])
    names = [row["name"] for row in json.loads(r.stdout)]
    assert names and all(n.startswith("real") and not n.endswith(".gif") for n in names)


def test_an_empty_prefix_a_missing_bucket_and_an_http_url_are_one_line_and_exit_2(store, tmp_path):
    _, endpoint = store
    for src, words in [
        (url(endpoint, "bkt/nothing-here/"), "lists no objects"),
        (url(endpoint, "no-such-bucket/x/"), "lists no objects"),
        ("https://example.invalid/photos/", "HTTP has no listing"),
        (f"s3://KEY:pw-xyzzy@bkt/photos/?endpoint_override={endpoint}&scheme=http", "no credentials"),
    ]:
        r = run_bin(["pack", src, "-o", str(tmp_path / "o.hframe")])
        err = r.stderr.decode()
        assert r.returncode == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err, (src, err)
        assert "xyzzy" not in err
        assert not (tmp_path / "o.hframe").exists()


def test_an_object_deleted_between_listing_and_reading_is_named_and_with_skip_bad_left_out(store, tmp_path):
    fs, endpoint = store
    for i in range(8):
        with fs.open_output_stream(f"bkt/gone/{i}.bin") as f:
            f.write(bytes([i]) * 100)
    folder = tmp_path / "ds"
    folder.mkdir()
    r = run_bin(["pack", url(endpoint, "bkt/gone"), "-o", str(folder / "g.hframe"), "--plan-only", "-q"])
    assert r.returncode == 0, r.stderr
    plan = folder / "g.hframe.plan.parquet"
    fs.delete_file("bkt/gone/3.bin")
    r = run_bin(["pack", "--plan", str(plan), "-o", str(folder / "g.hframe")])
    err = r.stderr.decode()
    assert r.returncode == 2 and "s3://bkt/gone/3.bin: vanished" in err and "Traceback" not in err, err
    r = run_bin(["pack", "--plan", str(plan), "-o", str(folder / "g.hframe"), "--skip-bad", "--force"])
    assert r.returncode == 0, r.stderr
    with h.open_pack(folder / "g.hframe") as p:
        assert len(p) == 7 and p["4.bin"] == bytes([4]) * 100


def test_update_of_a_prefix_appends_new_objects_and_sees_removed_ones(store, tmp_path):
    fs, endpoint = store
    for i in range(6):
        with fs.open_output_stream(f"bkt/grow/{i}.bin") as f:
            f.write(bytes([i]) * 64)
    src, out = url(endpoint, "bkt/grow/"), tmp_path / "g.hframe"
    assert run_bin(["pack", src, "-o", str(out)]).returncode == 0
    with fs.open_output_stream("bkt/grow/6.bin") as f:
        f.write(b"new" * 10)
    r = run_bin(["pack", src, "-o", str(out), "--update", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["update"]["status"] == "append"
    with h.open_pack(out) as p:
        assert len(p) == 7 and p["6.bin"] == b"new" * 10
    fs.delete_file("bkt/grow/0.bin")
    r = run_bin(["pack", src, "-o", str(out), "--update", "--dry-run", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["update"] == {
        "status": "repack",
        "added": 0,
        "changed": 0,
        "removed": 1,
        "existing_frames": 7,
    }


def test_ctrl_c_mid_pack_of_a_prefix_stops_within_a_second_and_resume_gives_the_same_pack(store, tmp_path):
    fs, endpoint = store
    for i in range(200):
        with fs.open_output_stream(f"bkt/many/{i:04d}.bin") as f:
            f.write(os.urandom(200 + i))
    src = url(endpoint, "bkt/many/")
    args = [*CREATED, "--checkpoint-every", "20"]
    clean, out = tmp_path / "clean.hframe", tmp_path / "i.hframe"
    assert run_bin(["pack", src, "-o", str(clean), *args]).returncode == 0
    env = {**os.environ, "HFRAME_TTY": "0"}
    proc = subprocess.Popen([hframe_bin(), "pack", src, "-o", str(out), *args], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not Path(checkpoint_name(out)).exists():
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint was written"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    err = proc.communicate(timeout=30)[1]
    # bounded to catch a run that keeps fetching (before the fix every loading thread finished
    # its batch of up to 64 objects first), generously: a loaded machine is slow to stop too
    assert time.monotonic() - t0 < 5
    assert proc.returncode == 130 and b"Traceback" not in err, err
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == clean.read_bytes()


def test_a_gcs_prefix_packs_as_an_s3_one_does(tmp_path):
    """The same listing and reads through pyarrow's GCS client (the emulator, a test extra)."""
    from conftest import gcs_emulator

    with gcs_emulator(tmp_path / "gcs", "gbkt") as endpoint:
        fs = pafs.GcsFileSystem(anonymous=True, endpoint_override=endpoint, scheme="http")
        tree = make_photos(tmp_path / "tree", 9)
        put_tree(fs, tree, "gbkt/photos")
        src = f"gs://gbkt/photos?endpoint_override={endpoint}&scheme=http&anonymous=true"
        out = tmp_path / "g.hframe"
        r = run_bin(["pack", src, "-o", str(out), *CREATED])
        assert r.returncode == 0, r.stderr
        got = pq.read_table(f"{out}.index.parquet", columns=["name", "md5", "label", "source"]).to_pylist()
        files = sorted(p for p in tree.rglob("*") if p.is_file())
        assert [g["name"] for g in got] == [p.relative_to(tree).as_posix() for p in files]
        assert [g["md5"] for g in got] == [__import__("hashlib").md5(p.read_bytes()).hexdigest() for p in files]
        assert all(g["source"].startswith(f"gs://gbkt/photos/{g['name']}#etag=") for g in got)
        assert {g["label"] for g in got} == {"cats", "dogs", "birds"}


def test_webdataset_shards_at_s3_urls_pack_as_the_local_shards_do(store, tmp_path):
    """``--from tar 's3://.../shard-{000..002}.tar'``: read front to back from the store, never
    stored; gzip at a URL too; a killed run resumes byte-identically; a shard cut short keeps,
    with --skip-bad, the members before the cut."""
    wds = pytest.importorskip("webdataset")
    import gzip

    import boto3

    fs, endpoint = store
    s3 = boto3.client("s3", endpoint_url=f"http://{endpoint}")
    with wds.ShardWriter(str(tmp_path / "shard-%03d.tar"), maxcount=10, verbose=0) as sink:
        for i, p in enumerate(real_media(30)):
            sink.write({"__key__": f"k{i:04d}", p.suffix[1:]: p.read_bytes(), "cls": i % 4})
    shards = sorted(tmp_path.glob("shard-*.tar"))
    assert len(shards) == 3
    for p in shards:
        s3.put_object(Bucket="bkt", Key=f"wds/{p.name}", Body=p.read_bytes())
    s3.put_object(Bucket="bkt", Key="wds/one.tar.gz", Body=gzip.compress(shards[0].read_bytes()))
    cut = shards[1].read_bytes()
    s3.put_object(Bucket="bkt", Key="wds/cut.tar", Body=cut[: len(cut) // 2])
    local = tmp_path / "local.hframe"
    args = ["--label-from", ".cls", *CREATED]
    assert (
        run_bin(["pack", "--from", "tar", str(tmp_path / "shard-{000..002}.tar"), "-o", str(local), *args]).returncode
        == 0
    )
    key = ["name", "md5", "source_mtime", "label", "source"]
    want = sorted(map(str, pq.read_table(f"{local}.index.parquet", columns=key).to_pylist()))
    remote = url(endpoint, "bkt/wds/shard-{000..002}.tar")
    clean, out = tmp_path / "clean.hframe", tmp_path / "k.hframe"
    r = run_bin(["pack", "--from", "tar", remote, "-o", str(clean), *args])
    assert r.returncode == 0, r.stderr
    assert sorted(map(str, pq.read_table(f"{clean}.index.parquet", columns=key).to_pylist())) == want
    r = run_bin(
        ["pack", "--from", "tar", remote, "-o", str(out), *args, "--checkpoint-every", "7"],
        env={"HFRAME_FAULT": "after-frame:40"},
    )
    assert r.returncode < 0
    assert run_bin(["resume", str(out)]).returncode == 0
    assert out.read_bytes() == clean.read_bytes()
    g = tmp_path / "g.hframe"
    assert run_bin(["pack", "--from", "tar", url(endpoint, "bkt/wds/one.tar.gz"), "-o", str(g)]).returncode == 0
    assert len(pq.read_table(f"{g}.index.parquet")) == len(tarfile.open(shards[0]).getnames())
    r = run_bin(["pack", "--from", "tar", url(endpoint, "bkt/wds/cut.tar"), "-o", str(tmp_path / "c.hframe")])
    err = r.stderr.decode()
    assert r.returncode == 2 and "s3://bkt/wds/cut.tar?...: truncated" in err and "endpoint" not in err, err
    r = run_bin(
        ["pack", "--from", "tar", url(endpoint, "bkt/wds/cut.tar"), "-o", str(tmp_path / "c.hframe"), "--skip-bad"]
    )
    assert r.returncode == 0, r.stderr
    assert 0 < len(pq.read_table(tmp_path / "c.hframe.index.parquet")) < len(tarfile.open(shards[1]).getnames())


@pytest.fixture()
def served(tmp_path):
    """Real images made by others and a blob in nested folders (one name with a space), with
    whole-second times (what ``wget -N`` gives a file from Last-Modified), served by nginx;
    yields (base URL of the tree, the tree, the URLs of its files)."""
    www = tmp_path / "www"
    tree = www / "imgs"
    for i, p in enumerate(real_media(24)):
        (tree / f"real{i % 3}").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, tree / f"real{i % 3}" / f"{i:03d}{p.suffix}")
    (tree / "notes two.bin").write_bytes(os.urandom(3000))
    for k, p in enumerate(sorted(tree.rglob("*.*"))):
        os.utime(p, (1_600_000_000 + k, 1_600_000_000 + k))
    with nginx_serving(www, tmp_path / "nginx") as base:
        urls = [f"{base}/imgs/{p.relative_to(tree).as_posix().replace(' ', '%20')}" for p in sorted(tree.rglob("*.*"))]
        yield f"{base}/imgs/", tree, urls


def test_a_list_of_urls_packs_as_the_fetched_folder_does(served, tmp_path):
    base, tree, urls = served
    out, local = tmp_path / "u.hframe", tmp_path / "local.hframe"
    listing = "".join(u + "\n" for u in reversed(urls)).encode()  # (any order: packed by name)
    r = run_bin(["pack", "-", "--base", base, "-o", str(out), *CREATED], input=listing)
    assert r.returncode == 0, r.stderr
    assert run_bin(["pack", str(tree), "-o", str(local), *CREATED]).returncode == 0
    got = pq.read_table(f"{out}.index.parquet").to_pylist()
    want = pq.read_table(f"{local}.index.parquet", columns=SAME).to_pylist()
    assert [{k: g[k] for k in SAME} for g in got] == want  # names, bytes, sizes, times, media
    etags = {u: subprocess.run(["curl", "-sI", u], capture_output=True).stdout for u in urls}
    for g in got:
        u, _, etag = g["source"].partition("#etag=")
        assert u in urls and f'ETag: "{etag}"'.encode() in etags[u], g["source"]
    assert "notes two.bin" in [g["name"] for g in got]
    with h.open_pack(out) as a, h.open_pack(local) as b:
        assert a.read_many(list(range(len(a)))) == b.read_many(list(range(len(b))))
    # without --base, named as wget -x saves them; URLs as arguments are a list too
    r = run_bin(["pack", *urls[:3], "-o", str(tmp_path / "args.hframe")])
    assert r.returncode == 0, r.stderr
    names = pq.read_table(tmp_path / "args.hframe.index.parquet", columns=["name"]).column(0).to_pylist()
    assert names == sorted(urllib.parse.unquote(u.split("//", 1)[1]) for u in urls[:3])  # host:port/imgs/...


def test_bad_urls_are_one_line_and_exit_2_and_a_file_replaced_after_listing_is_refused(served, tmp_path):
    base, tree, urls = served
    out = tmp_path / "o.hframe"
    for args, stdin, words in [
        (["-"], urls[0] + "\n" + base + "nope.jpg\n", "nope.jpg: no such file (HTTP 404)"),
        ([base], None, "HTTP has no listing"),
        (["-"], "s3://bkt/key.jpg\n", "a list gives files at http(s):// URLs"),
        ([urls[0], "--base", base.replace("/imgs/", "/other/")], None, "not under --base"),
    ]:
        r = run_bin(["pack", *args, "-o", str(out)], input=stdin.encode() if stdin else None)
        err = r.stderr.decode()
        assert r.returncode == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err, (args, err)
        assert not out.exists()
    r = run_bin(["pack", "-", "-o", str(out), "--skip-bad"], input=(urls[0] + "\n" + base + "nope.jpg\n").encode())
    assert r.returncode == 0 and b"skipped" in r.stderr and len(h.open_pack(out)) == 1
    # listed, then one file rewritten (another ETag) and one removed: never packed half old
    folder = tmp_path / "ds"
    folder.mkdir()
    listing = "".join(u + "\n" for u in urls).encode()
    r = run_bin(["pack", "-", "--base", base, "-o", str(folder / "p.hframe"), "--plan-only", "-q"], input=listing)
    assert r.returncode == 0, r.stderr
    changed = sorted(tree.rglob("*.*"))[2]
    changed.write_bytes(changed.read_bytes()[::-1])
    r = run_bin(["pack", "--plan", str(folder / "p.hframe.plan.parquet"), "-o", str(folder / "p.hframe")])
    err = r.stderr.decode()
    assert r.returncode == 2 and "replaced since it was listed" in err and changed.name in err, err
    r = run_bin(["pack", "--plan", str(folder / "p.hframe.plan.parquet"), "-o", str(folder / "p.hframe"), "--skip-bad"])
    assert r.returncode == 0, r.stderr
    with h.open_pack(folder / "p.hframe") as p:
        assert len(p) == len(urls) - 1
    names = pq.read_table(folder / "p.hframe.index.parquet", columns=["name"]).column(0).to_pylist()
    assert changed.relative_to(tree).as_posix() not in names


def test_a_killed_pack_of_urls_resumes_byte_identically(served, tmp_path):
    base, _, urls = served
    clean, out, resumed = killed_and_resumed(
        urls[0], tmp_path, [*urls[1:], "--base", base, *CREATED, "--checkpoint-every", "4"], "after-frame:9"
    )
    assert out.read_bytes() == clean.read_bytes() and resumed["resumed_from_frame"] == 8
