"""``pack --from tar|zip``: archives written by the real tools, packed as if extracted, read in place."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_photos, real_media, run_bin

import hframe_cli as h
from hframe_cli.sources.archives import MemberChanged, read_member
from hframe_cli.sources.inputs import collect_sources, expand_braces

CREATED = ["--created", "1700000000"]
SAME = ["name", "md5", "source_size", "source_mtime", "media_type", "kind", "width", "height", "label"]


def rows(pack: Path, columns: list[str] = SAME) -> list[dict]:
    return pq.read_table(f"{pack}.index.parquet", columns=columns).to_pylist()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Our photos, real images made by others, nested folders and a blob: the extracted form."""
    root = make_photos(tmp_path / "tree", 12)
    for i, p in enumerate(real_media(30)):
        (root / f"real{i % 3}").mkdir(exist_ok=True)
        shutil.copyfile(p, root / f"real{i % 3}" / f"{i:03d}{p.suffix}")
    (root / "notes.bin").write_bytes(os.urandom(3000))
    return root


def extracted(archive: Path, into: Path, tool: list[str]) -> Path:
    into.mkdir()
    subprocess.run([*tool, str(archive)], cwd=into, check=True, capture_output=True)
    return into


def test_a_gnu_tar_packs_as_its_extracted_folder_does(tree, tmp_path):
    archive = tmp_path / "photos.tar"
    subprocess.run(["tar", "cf", str(archive), "-C", str(tree), "."], check=True)
    folder = extracted(archive, tmp_path / "x", ["tar", "xf"])
    from_tar, from_folder = tmp_path / "t.hframe", tmp_path / "f.hframe"
    r = run_bin(["pack", "--from", "tar", str(archive), "-o", str(from_tar), *CREATED, "--json"])
    assert r.returncode == 0, r.stderr
    assert run_bin(["pack", str(folder), "-o", str(from_folder), *CREATED]).returncode == 0
    assert rows(from_tar) == rows(from_folder) and len(rows(from_tar)) >= 40
    # every frame holds the member's bytes, and says where it came from
    with h.open_pack(from_tar) as p, tarfile.open(archive) as tf:
        sources = pq.read_table(f"{from_tar}.index.parquet", columns=["source"]).column(0).to_pylist()
        for i in range(len(p)):
            member = sources[i].removeprefix("photos.tar:")
            assert p[i] == tf.extractfile(member).read()
    assert run_bin(["verify", str(from_tar)]).returncode == 0


def test_a_python_pax_tar_keeps_exact_names_and_times(tmp_path):
    """Long names, names that are not UTF-8, times with nanoseconds (PAX), ``./`` and ``/``
    prefixes, as ``tar xf`` would name the files it makes."""
    archive = tmp_path / "pax.tar"
    members = {
        "./a/" + "long" * 40 + ".bin": b"long name",
        "/abs/path.bin": b"absolute",
        os.fsdecode(b"caf\xe9.bin"): b"latin-1 name",
        "b//c/./d.bin": b"messy",
    }
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000.123456789
            tf.addfile(info, io.BytesIO(data))
    out = tmp_path / "p.hframe"
    assert run_bin(["pack", "--from", "tar", str(archive), "-o", str(out)]).returncode == 0
    t = pq.read_table(f"{out}.index.parquet", columns=["name", "name_raw", "source_mtime"]).to_pylist()
    names = sorted((r["name_raw"] or r["name"].encode()) for r in t)
    assert names == sorted([b"a/" + b"long" * 40 + b".bin", b"abs/path.bin", b"caf\xe9.bin", b"b/c/d.bin"])
    assert {r["source_mtime"].timestamp() for r in t} == {1_700_000_000.123456}  # (µs in the index)
    with h.open_pack(out) as p:
        assert sorted(p[i] for i in range(len(p))) == sorted(members.values())


def test_info_zip_stored_and_deflated_members_pack_as_unzip_extracts_them(tree, tmp_path):
    stored, deflated = tmp_path / "s.zip", tmp_path / "d.zip"
    subprocess.run(["zip", "-qr0", str(stored), "."], cwd=tree, check=True)
    subprocess.run(["zip", "-qr9", str(deflated), "."], cwd=tree, check=True)
    with zipfile.ZipFile(deflated) as z:
        assert {i.compress_type for i in z.infolist() if not i.is_dir()} == {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED}
    folder = extracted(deflated, tmp_path / "x", ["unzip", "-q"])
    want = tmp_path / "f.hframe"
    assert run_bin(["pack", str(folder), "-o", str(want), *CREATED]).returncode == 0
    for archive in (stored, deflated):
        out = tmp_path / f"{archive.stem}.hframe"
        r = run_bin(["pack", "--from", "zip", str(archive), "-o", str(out), *CREATED])
        assert r.returncode == 0, r.stderr
        assert rows(out) == rows(want)
        assert run_bin(["verify", str(out)]).returncode == 0


def test_webdataset_shards_by_brace_range_keep_their_keys_and_bytes(tmp_path):
    wds = pytest.importorskip("webdataset")
    photos = make_photos(tmp_path / "photos", 9)
    samples = []
    with wds.ShardWriter(str(tmp_path / "shard-%06d.tar"), maxcount=4, verbose=0) as sink:
        for i, p in enumerate(sorted(photos.rglob("*.jpg")) + sorted(photos.rglob("*.png"))):
            sample = {"__key__": f"s{i:05d}", p.suffix[1:]: p.read_bytes(), "cls": str(i % 3).encode()}
            sink.write(sample)
            samples.append(sample)
    assert len(list(tmp_path.glob("shard-*.tar"))) >= 3
    out = tmp_path / "w.hframe"
    pattern = str(tmp_path / "shard-{000000..000002}.tar")
    r = run_bin(["pack", "--from", "tar", pattern, "-o", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    want = {f"{s['__key__']}.{k}": v for s in samples for k, v in s.items() if k != "__key__"}
    names = pq.read_table(f"{out}.index.parquet", columns=["name"]).column(0).to_pylist()
    with h.open_pack(out) as p:
        got = {n: p[i] for i, n in enumerate(names)}
    assert got == want


def test_a_webdataset_samples_cls_or_txt_member_labels_all_its_members(tmp_path):
    wds = pytest.importorskip("webdataset")
    images = real_media(30)
    with wds.ShardWriter(str(tmp_path / "shard-%03d.tar"), maxcount=7, verbose=0) as sink:
        for i, p in enumerate(images):
            sink.write({"__key__": f"k{i:04d}", p.suffix[1:]: p.read_bytes(), "cls": i % 5, "txt": f"a photo {i}"})
    pattern = str(tmp_path / "shard-*.tar")
    for ext, want in ((".cls", lambda i: str(i % 5)), (".txt", lambda i: f"a photo {i}")):
        out = tmp_path / f"l{ext}.hframe"
        r = run_bin(["pack", "--from", "tar", pattern, "--label-from", ext, "-o", str(out)])
        assert r.returncode == 0, r.stderr
        got = rows(out, ["name", "label"])
        assert len(got) == 3 * len(images)
        assert all(g["label"] == want(int(g["name"][1:5])) for g in got), got[:6]
    # resume and the packing workers keep them too: the labels ride with each member's locator
    args = ["--from", "tar", pattern, "--label-from", ".cls", *CREATED, "--checkpoint-every", "5"]
    clean, out = tmp_path / "c.hframe", tmp_path / "k.hframe"
    assert run_bin(["pack", *args, "-o", str(clean), "--workers", "2"]).returncode == 0
    r = run_bin(["pack", *args, "-o", str(out)], env={"HFRAME_FAULT": "after-frame:17"})
    assert r.returncode < 0
    assert run_bin(["resume", str(out)]).returncode == 0
    assert out.read_bytes() == clean.read_bytes()
    r = run_bin(["pack", str(tmp_path), "--label-from", ".cls", "-o", str(tmp_path / "x.hframe")])
    assert r.returncode == 2 and b"is for --from tar or zip" in r.stderr


def test_brace_ranges_expand_as_a_shell_does():
    assert expand_braces("s-{008..011}.tar") == ["s-008.tar", "s-009.tar", "s-010.tar", "s-011.tar"]
    assert expand_braces("{a,b}/x-{1..2}") == ["a/x-1", "a/x-2", "b/x-1", "b/x-2"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def tar_with(path: Path, entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, mtime: int = 1_700_000_000) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.mtime = kind, mtime
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    info.linkname = "a.bin" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
    return info, None


def test_links_devices_dotdot_names_and_duplicates_are_skipped_with_a_line_each(tmp_path):
    archive = tar_with(
        tmp_path / "odd.tar",
        [
            member("a.bin", b"first a"),
            member("link.bin", kind=tarfile.SYMTYPE),
            member("hard.bin", kind=tarfile.LNKTYPE),
            member("dev", kind=tarfile.CHRTYPE),
            member("fifo", kind=tarfile.FIFOTYPE),
            member("../escape.bin", b"outside"),
            member("dir/", kind=tarfile.DIRTYPE),
            member("dir/b.bin", b"b"),
            member("a.bin", b"second a", mtime=1_700_000_100),
        ],
    )
    out = tmp_path / "o.hframe"
    r = run_bin(["pack", "--from", "tar", str(archive), "-o", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    skipped = {s["path"].split(":", 1)[1]: s["reason"] for s in doc["skipped"]}
    assert skipped == {
        "link.bin": "a symbolic link (skipped)",
        "hard.bin": "a hard link (skipped)",
        "dev": "a character device (skipped)",
        "fifo": "a FIFO (skipped)",
        "../escape.bin": "member name contains '..' (skipped, as tar does)",
        "a.bin": "replaced by a later member of the same name (as tar xf does)",
    }
    with h.open_pack(out) as p:
        assert len(p) == 2 and p["a.bin"] == b"second a" and p["dir/b.bin"] == b"b"


def test_a_truncated_tar_is_one_line_and_exit_2_and_nothing_is_left(tree, tmp_path):
    archive = tmp_path / "t.tar"
    subprocess.run(["tar", "cf", str(archive), "-C", str(tree), "."], check=True)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])  # a download cut short
    out = tmp_path / "o.hframe"
    r = run_bin(["pack", "--from", "tar", str(cut), "-o", str(out)])
    assert r.returncode == 2
    line = r.stderr.decode().strip()
    assert "\n" not in line and str(cut) in line and "truncated" in line and "Traceback" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.tar", "t.tar", "tree"]


def test_a_damaged_zip_member_is_named_and_with_skip_bad_the_others_are_kept(tree, tmp_path):
    archive = tmp_path / "d.zip"
    subprocess.run(["zip", "-qr9", str(archive), "."], cwd=tree, check=True)
    with zipfile.ZipFile(archive) as z:
        victim = next(i for i in z.infolist() if i.compress_type == zipfile.ZIP_DEFLATED and i.compress_size > 200)
        others = len([i for i in z.infolist() if not i.is_dir()]) - 1
    data = bytearray(archive.read_bytes())
    at = victim.header_offset + 30 + len(victim.orig_filename.encode()) + len(victim.extra) + victim.compress_size // 2
    data[at] ^= 0x55
    archive.write_bytes(bytes(data))
    out = tmp_path / "o.hframe"
    r = run_bin(["pack", "--from", "zip", str(archive), "-o", str(out)])
    assert r.returncode == 2 and f"{archive}:{victim.filename}" in r.stderr.decode(), r.stderr
    assert not out.exists()
    r = run_bin(["pack", "--from", "zip", str(archive), "-o", str(out), "--skip-bad", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["frame_count"] == others and [s["path"] for s in doc["skipped"]] == [f"{archive}:{victim.filename}"]


def test_a_zip_bomb_takes_no_more_memory_than_its_member_may_have(tmp_path):
    """A member that says it inflates to 1 KiB but inflates to 64 MiB: refused after 1 KiB. A
    real bomb (64 MiB of zeros in 64 KiB) over --max-frame-bytes is refused by its header."""
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros.bin", b"\0" * (64 << 20))
    assert bomb.stat().st_size < 1 << 20
    r = run_bin(["pack", "--from", "zip", str(bomb), "-o", str(tmp_path / "a.hframe"), "--max-frame-bytes", "1MiB"])
    assert r.returncode == 2 and "larger than --max-frame-bytes" in r.stderr.decode()
    liar = tmp_path / "liar.zip"
    data = bytearray(bomb.read_bytes())
    with zipfile.ZipFile(bomb) as z:
        info = z.infolist()[0]
    # the central directory's uncompressed size (offset 24 in its entry) says 1 KiB
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 24 : cd + 28] = (1024).to_bytes(4, "little")
    liar.write_bytes(bytes(data))
    locs = collect_sources([str(liar)], archives="zip")
    assert locs.sizes == [1024] and info.file_size == 64 << 20
    with pytest.raises(MemberChanged, match="more bytes than its header says|CRC-32"):
        read_member(locs.paths[0], 1024)
    # one that says it is empty (zlib reads a limit of 0 as none at all)
    data[cd + 24 : cd + 28] = bytes(4)
    liar.write_bytes(bytes(data))
    empty = collect_sources([str(liar)], archives="zip", allow_empty=True)
    assert empty.sizes == [0]
    with pytest.raises(MemberChanged, match="more bytes than its header says"):
        read_member(empty.paths[0], 0)


def test_an_archive_rewritten_after_listing_is_never_read_at_a_stale_offset(tmp_path):
    a = tar_with(tmp_path / "a.tar", [member("x.bin", b"x" * 100), member("y.bin", b"y" * 100)])
    srcs = collect_sources([str(a)], archives="tar")
    assert read_member(srcs.paths[1], 100) == b"y" * 100
    tar_with(a, [member("y.bin", b"Y" * 100), member("x.bin", b"X" * 100)])  # same names and sizes, swapped
    os.utime(a, ns=(0, 1))
    with pytest.raises(MemberChanged, match="changed since it was listed"):
        read_member(srcs.paths[1], 100)


def test_a_killed_pack_of_a_tar_resumes_byte_identically_and_a_changed_archive_is_refused(tree, tmp_path):
    archive = tmp_path / "a.tar"
    subprocess.run(["tar", "cf", str(archive), "-C", str(tree), "."], check=True)
    args = ["--from", "tar", *CREATED, "--checkpoint-every", "5"]
    clean, out = tmp_path / "clean.hframe", tmp_path / "k.hframe"
    assert run_bin(["pack", str(archive), "-o", str(clean), *args]).returncode == 0
    r = run_bin(["pack", str(archive), "-o", str(out), *args], env={"HFRAME_FAULT": "after-frame:17"})
    assert r.returncode < 0, r.stderr
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] > 0
    assert out.read_bytes() == clean.read_bytes()
    # killed again, then the archive is rewritten: resume says what changed, reads nothing stale
    again = tmp_path / "again.hframe"
    r = run_bin(["pack", str(archive), "-o", str(again), *args], env={"HFRAME_FAULT": "after-frame:17"})
    assert r.returncode < 0
    (tree / "zz-new.bin").write_bytes(b"new")
    subprocess.run(["tar", "cf", str(archive), "-C", str(tree), "."], check=True)
    r = run_bin(["resume", str(again)])
    assert r.returncode == 2 and "inputs changed" in r.stderr.decode() and "zz-new.bin" in r.stderr.decode()


def test_update_from_a_grown_tar_appends_the_new_members(tmp_path):
    a = tmp_path / "a.tar"
    tar_with(a, [member(f"{i:03d}.bin", bytes([i]) * 50) for i in range(10)])
    out = tmp_path / "o.hframe"
    assert run_bin(["pack", "--from", "tar", str(a), "-o", str(out)]).returncode == 0
    tar_with(a, [member(f"{i:03d}.bin", bytes([i]) * 50) for i in range(12)])
    r = run_bin(["pack", "--from", "tar", str(a), "-o", str(out), "--update", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["update"]["status"] == "append"
    with h.open_pack(out) as p:
        assert len(p) == 12 and p["011.bin"] == bytes([11]) * 50


def test_what_from_cannot_read_yet_is_one_line_and_exit_2(tmp_path):
    gz = tmp_path / "a.tar.gz"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.bin").write_bytes(b"x")
    subprocess.run(["tar", "czf", str(gz), "-C", str(tmp_path / "in"), "."], check=True)
    for args, words in [
        (["--from", "tar", "-", "-"], "standard input is one archive"),
        (["--from", "tar", "-", "--plan-only"], "standard input is one archive"),
        (["--from", "rar", str(gz)], "tar, zip, parquet"),
        (["--from", "tar", str(tmp_path)], "is a folder"),
        (["--from", "tar", str(tmp_path / "none-{1..2}.tar")], "no such file"),
        (["--from", "zip", str(gz)], "not a zip archive"),
    ]:
        r = run_bin(["pack", *args, "-o", str(tmp_path / "o.hframe")])
        err = r.stderr.decode()
        assert r.returncode == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err, (args, err)


@pytest.mark.parametrize("flag", ["z", "j", "J", "zstd"])
def test_a_compressed_tar_packs_its_members_read_forward_and_resumes_byte_identically(tree, tmp_path, flag):
    archive = tmp_path / f"a.tar.{flag}"
    compress = ["--zstd"] if flag == "zstd" else [f"-{flag}"]
    if flag == "zstd" and shutil.which("zstd") is None:
        pytest.skip("GNU tar needs the zstd program for --zstd")
    subprocess.run(["tar", "-c", *compress, "-f", str(archive), "-C", str(tree), "."], check=True)
    plain = tmp_path / "a.tar"
    subprocess.run(["tar", "cf", str(plain), "-C", str(tree), "."], check=True)
    args = ["--from", "tar", *CREATED, "--checkpoint-every", "5"]
    ref, out = tmp_path / "plain.hframe", tmp_path / "c.hframe"
    assert run_bin(["pack", str(plain), "-o", str(ref), *args]).returncode == 0
    r = run_bin(["pack", str(archive), "-o", str(out), *args], env={"HFRAME_FAULT": "after-frame:17"})
    assert r.returncode < 0, r.stderr
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] > 0
    # the frames of the plain tar, in the archive's order (a compressed stream is read forward)
    key = lambda row: row["name"]  # noqa: E731
    assert sorted(rows(out), key=key) == sorted(rows(ref), key=key)
    order = [m.removeprefix("./") for m in tarfile.open(plain).getnames()]  # (GNU tar walks the folder alike)
    names = [r["name"] for r in rows(out, ["name"])]
    assert names == [m for m in order if m in set(names)]
    assert run_bin(["verify", str(out)]).returncode == 0


def test_a_damaged_compressed_tar_is_one_line_and_exit_2_and_skip_bad_keeps_what_came_before(tree, tmp_path):
    archive = tmp_path / "a.tar.gz"
    subprocess.run(["tar", "czf", str(archive), "-C", str(tree), "."], check=True)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    r = run_bin(["pack", "--from", "tar", str(cut), "-o", str(tmp_path / "o.hframe")])
    err = r.stderr.decode()
    assert r.returncode == 2 and str(cut) in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o.hframe").exists()
    r = run_bin(["pack", "--from", "tar", str(cut), "-o", str(tmp_path / "o.hframe"), "--skip-bad", "--json"])
    assert r.returncode == 0, r.stderr
    kept = rows(tmp_path / "o.hframe", ["name", "md5"])
    whole = {
        p.relative_to(tree).as_posix(): hashlib.md5(p.read_bytes()).hexdigest() for p in tree.rglob("*") if p.is_file()
    }
    assert 0 < len(kept) < len(whole) and all(whole[k["name"]] == k["md5"] for k in kept)
    assert "the members before the damage are kept" in r.stdout.decode()


def test_a_tar_on_standard_input_plain_or_gzipped_packs_and_leaves_nothing_behind(tree, tmp_path):
    plain = subprocess.run(["tar", "cf", "-", "-C", str(tree), "."], check=True, capture_output=True).stdout
    ref = tmp_path / "ref.tar"
    ref.write_bytes(plain)
    assert run_bin(["pack", "--from", "tar", str(ref), "-o", str(tmp_path / "ref.hframe"), *CREATED]).returncode == 0
    for what, data in (("plain", plain), ("gzip", __import__("gzip").compress(plain))):
        out = tmp_path / f"{what}.hframe"
        r = run_bin(["pack", "--from", "tar", "-", "-o", str(out), *CREATED], input=data)
        assert r.returncode == 0, r.stderr
        got = rows(out, ["name", "md5", "source_mtime", "source"])
        assert sorted((g["name"], g["md5"]) for g in got) == sorted(
            (g["name"], g["md5"]) for g in rows(tmp_path / "ref.hframe", ["name", "md5"])
        )
        assert all(g["source"].startswith("-:") for g in got)
        assert sorted(p.name for p in tmp_path.glob(f"{what}.hframe*")) == [
            f"{what}.hframe",
            f"{what}.hframe.index.parquet",
        ]
    # killed: the copy of standard input stays for resume, which needs no standard input
    out = tmp_path / "k.hframe"
    r = run_bin(
        ["pack", "--from", "tar", "-", "-o", str(out), *CREATED, "--checkpoint-every", "5"],
        input=plain,
        env={"HFRAME_FAULT": "after-frame:17"},
    )
    assert r.returncode < 0 and (tmp_path / "k.hframe.stdin").exists()
    assert run_bin(["resume", str(out)], stdin=subprocess.DEVNULL).returncode == 0
    assert out.read_bytes() == (tmp_path / "plain.hframe").read_bytes()
    assert not (tmp_path / "k.hframe.stdin").exists()
    r = run_bin(["pack", "--from", "tar", "-", "-o", str(tmp_path / "e.hframe")], input=b"")
    assert r.returncode == 2 and b"standard input is empty" in r.stderr


def test_many_small_members_pack_the_same_with_packing_workers_and_without(tmp_path):
    """Over 2,000 members: the forked packing workers read members in place too."""
    a = tar_with(tmp_path / "many.tar", [member(f"{i:05d}.bin", os.urandom(300 + i % 700)) for i in range(2500)])
    one, many = tmp_path / "one.hframe", tmp_path / "many.hframe"
    assert run_bin(["pack", "--from", "tar", str(a), "-o", str(one), *CREATED, "--workers", "1"]).returncode == 0
    assert run_bin(["pack", "--from", "tar", str(a), "-o", str(many), *CREATED, "--workers", "2"]).returncode == 0
    assert one.read_bytes() == many.read_bytes()


def test_a_job_array_over_tar_shards_gives_the_frames_of_one_pack(tree, tmp_path):
    for k, sub in enumerate(sorted(p for p in tree.iterdir() if p.is_dir())):
        subprocess.run(["tar", "cf", str(tmp_path / f"s-{k}.tar"), "-C", str(tree), sub.name], check=True)
    shards = str(tmp_path / "s-{0..2}.tar")
    one, ds = tmp_path / "one.hframe", tmp_path / "ds.hframe"
    assert run_bin(["pack", "--from", "tar", shards, "-o", str(one), *CREATED]).returncode == 0
    assert run_bin(["pack", "--from", "tar", shards, "-o", str(ds), "--plan-only"]).returncode == 0
    plan = f"{ds}.plan.parquet"
    for part in ("0/2", "1/2"):
        r = run_bin(["pack", "--plan", plan, "-o", str(ds), "--shard-of", part, *CREATED])
        assert r.returncode == 0, r.stderr
    assert run_bin(["index", str(ds), "--merge", str(tmp_path / "ds-*.hframe")]).returncode == 0
    parts = [tmp_path / "ds-00000.hframe", tmp_path / "ds-00001.hframe"]
    assert rows(parts[0]) + rows(parts[1]) == rows(one)
    assert run_bin(["verify", str(ds)]).returncode == 0


def test_flipped_bytes_anywhere_in_an_archive_never_crash_and_never_give_wrong_zip_bytes(tree, tmp_path):
    """A byte flipped in headers, names, data or the directory: a clean error (HframeError), or
    a pack whose every frame is a member's true bytes (zip: each is checked against its CRC-32;
    tar keeps no checksum of data, so there only "no crash" is asked)."""
    from hframe_cli.errors import HframeError

    zipped, tarred = tmp_path / "a.zip", tmp_path / "a.tar"
    subprocess.run(["zip", "-qr9", str(zipped), "."], cwd=tree, check=True)
    subprocess.run(["tar", "cf", str(tarred), "-C", str(tree), "."], check=True)
    with zipfile.ZipFile(zipped) as z:
        true = {hashlib.md5(z.read(i)).hexdigest() for i in z.infolist() if not i.is_dir()}
    rng = random.Random(7)
    caught = {"zip": 0, "tar": 0}
    for archive, kind in ((zipped, "zip"), (tarred, "tar")):
        good = archive.read_bytes()
        for k in range(40):
            data = bytearray(good)
            at = rng.randrange(len(data))
            data[at] ^= 1 << rng.randrange(8)
            bad = tmp_path / f"bad-{k}.{kind}"
            bad.write_bytes(bytes(data))
            out = tmp_path / f"o-{kind}-{k}.hframe"
            try:
                outcome = h.pack([str(bad)], out, archives=kind, skip_bad=True, allow_empty=True)
            except HframeError:
                caught[kind] += 1
                continue
            if kind == "zip":
                got = set(pq.read_table(f"{out}.index.parquet", columns=["md5"]).column(0).to_pylist())
                assert got <= true, (at, got - true)
                caught[kind] += bool(outcome.result.skipped)
    assert caught["zip"] >= 10  # (most flips land in deflated data: each is found)


def test_git_archive_with_its_global_pax_header_packs_the_committed_files(tmp_path):
    """``git archive`` writes a global PAX header (the commit id) before the members."""
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo = make_photos(tmp_path / "repo", 6)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "photos"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True, env=env, capture_output=True)
    archive = tmp_path / "repo.tar"
    subprocess.run(["git", "archive", "-o", str(archive), "HEAD"], cwd=repo, check=True)
    assert b"pax_global_header" in archive.read_bytes()[:512]
    out = tmp_path / "g.hframe"
    r = run_bin(["pack", "--from", "tar", str(archive), "-o", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    committed = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts)
    assert sorted(pq.read_table(f"{out}.index.parquet", columns=["name"]).column(0).to_pylist()) == committed


def test_crafted_headers_are_refused_in_one_line_never_looped_on_or_misread(tmp_path):
    """Found in review: a negative size looped forever, a PAX record without a space too, a
    GNU sparse member made the walk land inside data, a stored member's size was not enforced,
    and members sharing their data (a bomb that unzip refuses) were packed again and again."""
    one = tar_with(tmp_path / "one.tar", [member("a.bin", b"a" * 100)])
    cases = {}
    data = bytearray(one.read_bytes())
    data[124:136] = b"\xff" * 12  # base-256 -1
    data[148:156] = b"%06o\0 " % (sum(data[:148]) + 8 * 32 + sum(data[156:512]))
    cases["neg.tar"] = (bytes(data), "negative size")
    pax = tmp_path / "pax.tar"
    with tarfile.open(pax, "w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("é" * 3)
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    data = bytearray(pax.read_bytes())
    at = data.index(b" path=")
    data[at] = ord("x")  # the record's length and key run together: no space
    cases["nospace.tar"] = (bytes(data), "damaged PAX header")
    data = bytearray(one.read_bytes())
    data[156] = ord("S")
    data[148:156] = b"%06o\0 " % (sum(data[:148]) + 8 * 32 + sum(data[156:512]))
    cases["sparse.tar"] = (bytes(data), "GNU sparse")
    for name, (content, words) in cases.items():
        (tmp_path / name).write_bytes(content)
        r = run_bin(["pack", "--from", "tar", str(tmp_path / name), "-o", str(tmp_path / "o.hframe")])
        assert r.returncode == 2 and words in r.stderr.decode(), (name, r.stderr)
    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w", zipfile.ZIP_STORED) as z:
        z.writestr("a.bin", b"a" * 100)
        z.writestr("b.bin", b"b" * 100)
    data = bytearray(two.read_bytes())
    second = data.rfind(b"PK\x01\x02")
    data[second + 42 : second + 46] = bytes(4)  # its local header: the first one's
    overlap = tmp_path / "overlap.zip"
    overlap.write_bytes(bytes(data))
    r = run_bin(["pack", "--from", "zip", str(overlap), "-o", str(tmp_path / "o.hframe")])
    assert r.returncode == 2 and "overlap" in r.stderr.decode(), r.stderr
    data = bytearray(two.read_bytes())
    first = data.find(b"PK\x01\x02")
    data[first + 24 : first + 28] = (50).to_bytes(4, "little")  # stored, "50 bytes", holds 100
    short = tmp_path / "short.zip"
    short.write_bytes(bytes(data))
    r = run_bin(["pack", "--from", "zip", str(short), "-o", str(tmp_path / "o.hframe")])
    assert r.returncode == 2 and "says 50 bytes but holds 100" in r.stderr.decode(), r.stderr
    assert not (tmp_path / "o.hframe").exists()


def test_the_fast_header_checksum_and_source_json_agree_with_their_plain_definitions():
    """Listing speed-ups that must not change a verdict: a header's checksum (adler32 when half
    the header is zeros) against tar's own sum, on headers from mostly zeros to all 0xff; a
    member's ``source`` JSON written directly against ``json.dumps`` on names JSON escapes."""
    from hframe_cli.sources.archives import _checksum_ok
    from hframe_cli.sources.media import encode_meta

    rng = random.Random(3)
    for zeros in (0, 100, 200, 255, 256, 300, 512 - 8):
        for low in (1, 200):  # (high bytes: sums past adler32's modulus with fewer zeros)
            header = bytearray(rng.randrange(low, 256) for _ in range(512))
            for i in rng.sample(range(512), zeros):
                header[i] = 0
            want = sum(header[:148]) + 8 * 32 + sum(header[156:])
            for field, ok in ((want, True), (want + 65521, False), (want - 1, False)):
                header[148:156] = b"%06o\0 " % (field % 8**6)
                assert _checksum_ok(bytes(header)) == (ok and field < 8**6), (zeros, field)
    for source in ["a.tar:x/1.jpg", 'a.tar:"q".bin', "a.tar:b\\c", "a.tar:tab\there", "a.tar:é", "a.tar:\x7f"]:
        assert (
            encode_meta({"source": source})
            == json.dumps({"source": source}, separators=(",", ":"), ensure_ascii=False).encode()
        )
