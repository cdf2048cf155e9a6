"""``hframe mount``: packs (images, real media, zstd, video frames), a dataset and a pack over
nginx, mounted with FUSE and used by real tools (``md5sum -c``, ``ls -lR``, ``stat``, ``cp -r``,
``tar``, Pillow, a folder-of-classes reader); a republish while mounted never mixes generations;
errors are one line and leave nothing mounted. Skipped (with the reason) where FUSE cannot run:
no ``/dev/fuse``, no libfuse 3 (``.ci/run`` installs Debian's fuse3), no mfusepy."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import FRAMES, hframe_bin, make_photos, make_video, nginx_serving, real_media, run_bin
from PIL import Image

from hframe_cli import open_pack


def _why_not() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse here"
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "no fusermount3 (apt-get install fuse3; .ci/run does)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return f"mfusepy or libfuse 3 missing: {e}"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))

CREATED = ["--created", "1700000000"]


@contextmanager
def mounted(source: str | Path, mnt: Path, *extra: str) -> Iterator[Path]:
    mnt.mkdir(parents=True, exist_ok=True)
    r = run_bin(["mount", str(source), str(mnt), "--background", *extra])
    assert r.returncode == 0, r.stderr
    try:
        assert os.path.ismount(mnt)
        yield mnt
    finally:
        if os.path.ismount(mnt) and run_bin(["umount", str(mnt)]).returncode != 0 or not os.path.isdir(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)
        deadline = time.monotonic() + 10
        while os.path.ismount(mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.ismount(mnt)


def in_the_foreground(pack: Path, mnt: Path) -> subprocess.Popen[bytes]:
    """``hframe mount PACK MNT`` as a running process, once MNT is mounted (at most 20 s: a hang)."""
    proc = subprocess.Popen([hframe_bin(), "mount", str(pack), str(mnt)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mnt) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    return proc


def sources(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = make_photos(tmp_path / "src", 30)
    for k, m in enumerate(real_media(40)[:16]):
        (src / "real").mkdir(exist_ok=True)
        shutil.copyfile(m, src / "real" / f"{k:02d}{m.suffix}")
    return src


def test_real_tools_read_a_mounted_pack_as_the_folder_it_was_packed_from(tree, tmp_path):
    pack = tmp_path / "p.hframe"
    assert run_bin(["pack", str(tree), "-o", str(pack), "-q", *CREATED]).returncode == 0
    want = sources(tree)
    sums = tmp_path / "sums.md5"
    sums.write_text("".join(f"{hashlib.md5(p.read_bytes()).hexdigest()}  {n}\n" for n, p in sorted(want.items())))
    with mounted(pack, tmp_path / "mnt") as mnt:
        r = subprocess.run(["md5sum", "-c", "--quiet", str(sums)], cwd=mnt, capture_output=True)
        assert r.returncode == 0, r.stdout + r.stderr
        listing = subprocess.run(["ls", "-lR", str(mnt)], capture_output=True, text=True, check=True).stdout
        assert all(Path(n).name in listing for n in want)
        found = subprocess.run(["find", ".", "-type", "f"], cwd=mnt, capture_output=True, text=True, check=True)
        assert sorted(line[2:] for line in found.stdout.split()) == sorted(want)
        rows = {r["name"]: r for r in pq.read_table(f"{pack}.index.parquet").to_pylist()}
        for name, path in want.items():
            st = os.stat(mnt / name)
            assert st.st_size == path.stat().st_size == rows[name]["raw_length"]
            assert int(st.st_mtime) == int(path.stat().st_mtime)
        shutil.copytree(mnt, tmp_path / "copy")
        assert {n: p.read_bytes() for n, p in sources(tmp_path / "copy").items()} == {
            n: p.read_bytes() for n, p in want.items()
        }
        subprocess.run(["tar", "cf", str(tmp_path / "m.tar"), "-C", str(mnt), "."], check=True)
        with tarfile.open(tmp_path / "m.tar") as t:
            assert sorted(m.name[2:] for m in t.getmembers() if m.isfile()) == sorted(want)
        # a folder-of-classes reader (torchvision ImageFolder's walk): classes, labels, decoded images
        classes = sorted(d.name for d in mnt.iterdir() if d.is_dir())
        samples = [(p, classes.index(c)) for c in classes for p in sorted((mnt / c).iterdir())]
        assert len(samples) == len(want)
        for p, _ in samples:
            if p.suffix.lower() in (".jpg", ".png"):
                with Image.open(p) as im:
                    im.load()
        with pytest.raises(OSError):
            (mnt / "new.txt").write_bytes(b"x")  # read-only


def test_compressed_frames_video_frames_and_stored_bytes(tmp_path):
    src = make_photos(tmp_path / "src", 12)
    (src / "records").mkdir()
    for i in range(20):
        (src / "records" / f"{i:03d}.json").write_text(f'{{"i": {i}, "pad": "{"x" * (100 + i * 300)}"}}')
    make_video(src / "clips" / "one.mp4", "libx264")
    pack = tmp_path / "z.hframe"
    args = ["pack", str(src), "-o", str(pack), "-q", "--compress", "zstd:3", "--video-frames", "every:10", *CREATED]
    assert run_bin(args).returncode == 0
    rows = pq.read_table(f"{pack}.index.parquet").to_pylist()
    assert any(r["codec"] != "none" for r in rows) and any("#frame=" in r["name"] for r in rows)
    with mounted(pack, tmp_path / "mnt") as mnt:
        for i in range(20):
            name = f"records/{i:03d}.json"
            assert (mnt / name).read_bytes() == (src / name).read_bytes()
        frames = sorted((mnt / "clips").glob("one.mp4#frame=*"))
        assert len(frames) == 3
        for f in frames:
            with Image.open(f) as im:
                im.load()
    with mounted(pack, tmp_path / "mnt2", "--stored") as mnt:
        from hframe_cli import open_pack

        with open_pack(pack) as p:
            for r in rows[:10]:
                got = (mnt / r["name"]).read_bytes()
                assert len(got) == r["length"] and got == p.read_stored(r["frame_id"])


def test_a_video_stored_whole_plays_through_the_mount(tmp_path):
    """A container read as a video reader reads it: seeks into the file (mp4's index), partial
    reads; PyAV (FFmpeg's libraries, as ffprobe) demuxes and decodes every frame."""
    import av

    src = tmp_path / "src"
    make_video(src / "one.mp4", "libx264", movflags="faststart")
    make_video(src / "two.mkv", "mpeg4")
    pack = tmp_path / "v.hframe"
    assert run_bin(["pack", str(src), "-o", str(pack), "-q", *CREATED]).returncode == 0
    with mounted(pack, tmp_path / "mnt") as mnt:
        for name in ("one.mp4", "two.mkv"):
            with av.open(str(mnt / name)) as c:
                stream = c.streams.video[0]
                frames = [f.to_ndarray(format="rgb24").tobytes() for f in c.decode(stream)]
            with av.open(str(src / name)) as c:
                want = [f.to_ndarray(format="rgb24").tobytes() for f in c.decode(c.streams.video[0])]
            assert len(frames) == FRAMES and frames == want


@pytest.mark.skipif(shutil.which("ffprobe") is None, reason="no ffprobe (apt-get install ffmpeg; .ci/run does)")
def test_ffprobe_and_ffmpeg_read_videos_and_frames_through_the_mount(tmp_path):
    """FFmpeg's own tools on the mount: ffprobe's streams of a whole video and of a frame cut from
    one equal those of the files packed; ffmpeg decodes every frame to the same picture md5s."""
    src = tmp_path / "src"
    make_video(src / "one.mp4", "libx264", movflags="faststart")
    make_video(src / "two.mkv", "mpeg4")
    pack = tmp_path / "v.hframe"
    assert run_bin(["pack", str(src), "-o", str(pack), "-q", *CREATED]).returncode == 0
    cut = tmp_path / "cut.hframe"
    assert (
        run_bin(["pack", str(src / "one.mp4"), "-o", str(cut), "-q", "--video-frames", "every:10", *CREATED]).returncode
        == 0
    )

    def probe(path: Path) -> dict:
        entries = "stream=codec_name,width,height,pix_fmt,nb_frames,duration:format=format_name,size"
        r = subprocess.run(
            ["ffprobe", "-v", "error", "-show_entries", entries, "-of", "json", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def framemd5(path: Path) -> list[str]:
        r = subprocess.run(
            ["ffmpeg", "-v", "error", "-nostdin", "-i", str(path), "-map", "0:v", "-f", "framemd5", "-"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return [line for line in r.stdout.splitlines() if not line.startswith("#")]

    with mounted(pack, tmp_path / "mnt") as mnt:
        for name in ("one.mp4", "two.mkv"):
            assert probe(mnt / name) == probe(src / name)
            sums = framemd5(mnt / name)
            assert len(sums) == FRAMES and sums == framemd5(src / name)
    with mounted(cut, tmp_path / "mnt2") as mnt, open_pack(cut) as p:
        frames = sorted(mnt.rglob("one.mp4#frame=*"))
        assert frames
        for f in frames:
            got = probe(f)
            assert got["streams"][0]["codec_name"] in ("mjpeg", "png")
            (tmp_path / "frame").write_bytes(p[f.relative_to(mnt).as_posix()])
            assert got == {**probe(tmp_path / "frame"), "format": got["format"]}
            assert int(got["format"]["size"]) == f.stat().st_size


def test_a_dataset_and_a_pack_over_nginx_mount_as_the_local_pack(tree, tmp_path):
    want = {n: p.read_bytes() for n, p in sources(tree).items()}
    ds = tmp_path / "ds.hframe"
    assert run_bin(["pack", str(tree), "-o", str(ds), "-q", "--max-pack-bytes", "16KiB", *CREATED]).returncode == 0
    assert len(list(tmp_path.glob("ds-*.hframe"))) > 1
    with mounted(ds, tmp_path / "mnt") as mnt:
        assert {n: p.read_bytes() for n, p in sources(mnt).items()} == want
    site = tmp_path / "site"
    site.mkdir()
    assert run_bin(["pack", str(tree), "-o", str(site / "p.hframe"), "-q", *CREATED]).returncode == 0
    with nginx_serving(site, tmp_path / "ng") as base, mounted(f"{base}/p.hframe", tmp_path / "mnt3") as mnt:
        assert {n: p.read_bytes() for n, p in sources(mnt).items()} == want
        where = str(mnt.absolute()).replace("/", "_")
        log = Path(tempfile.gettempdir()) / f"hframe-mount-{os.getuid()}{where}.log"
        assert log.read_text() == ""  # (libfuse's threads configured: no "Ignoring invalid max threads")


def test_a_pack_republished_while_mounted_serves_its_old_bytes_never_a_mix(tmp_path):
    old_src = make_photos(tmp_path / "old", 20)
    new_src = tmp_path / "new"
    shutil.copytree(old_src, new_src)
    for p in new_src.rglob("*.*"):  # same names and sizes, other bytes
        p.write_bytes(bytes(255 - b for b in p.read_bytes()))
    pack = tmp_path / "p.hframe"
    assert run_bin(["pack", str(old_src), "-o", str(pack), "-q", *CREATED]).returncode == 0
    old = {n: p.read_bytes() for n, p in sources(old_src).items()}
    with mounted(pack, tmp_path / "mnt") as mnt:
        reader = subprocess.Popen(
            [
                *hframe_bin_python(),
                "-c",
                "import sys, os, time\n"
                "root = sys.argv[1]\n"
                "end = time.monotonic() + 4\n"
                "while time.monotonic() < end:\n"
                "    for d, _, fs in os.walk(root):\n"
                "        for f in fs:\n"
                "            p = os.path.join(d, f)\n"
                "            try:\n"
                "                data = open(p, 'rb').read()\n"
                "            except OSError:\n"
                "                print('EIO', os.path.relpath(p, root), flush=True); continue\n"
                "            sys.stdout.buffer.write(os.path.relpath(p, root).encode() + b' ' + data.hex().encode() + b'\\n')\n",
                str(mnt),
            ],
            stdout=subprocess.PIPE,
        )
        for k in range(3):  # republish, back and forth, while it reads
            time.sleep(0.5)
            src = new_src if k % 2 == 0 else old_src
            assert run_bin(["pack", str(src), "-o", str(pack), "-q", "--force", *CREATED]).returncode == 0
        out, _ = reader.communicate(timeout=60)
    lines = out.decode().splitlines()
    assert len(lines) > len(old)
    for line in lines:
        name, value = line.split(" ", 1)
        if name != "EIO":
            assert bytes.fromhex(value) == old[name], name  # the generation it mounted, whole


def test_a_remote_pack_replaced_on_the_server_gives_eio_never_new_bytes(tmp_path):
    old_src = make_photos(tmp_path / "old", 200)  # (well past the first 64 KiB, which come with the open)
    new_src = tmp_path / "new"
    shutil.copytree(old_src, new_src)
    for p in new_src.rglob("*.*"):
        p.write_bytes(bytes(255 - b for b in p.read_bytes()))
    site = tmp_path / "site"
    site.mkdir()
    assert run_bin(["pack", str(old_src), "-o", str(site / "p.hframe"), "-q", *CREATED]).returncode == 0
    old = {n: p.read_bytes() for n, p in sources(old_src).items()}
    names = sorted(old)
    with nginx_serving(site, tmp_path / "ng") as base, mounted(f"{base}/p.hframe", tmp_path / "mnt") as mnt:
        for n in names[:5]:
            assert (mnt / n).read_bytes() == old[n]
        assert run_bin(["pack", str(new_src), "-o", str(site / "p.hframe"), "-q", "--force", *CREATED]).returncode == 0
        failed = 0
        for n in names:
            try:
                got = (mnt / n).read_bytes()
            except OSError as e:
                assert e.errno == 5  # EIO
                failed += 1
                continue
            assert got == old[n], n  # the generation it mounted, never the new one
        head = sum(1 for r in pq.read_table(site / "p.hframe.index.parquet").to_pylist() if r["offset"] < 65536)
        assert failed >= len(names) - 5 - head  # the frames not read before: the old generation is gone


def test_a_file_read_once_is_served_by_the_kernel_with_the_mount_stopped(tree, tmp_path):
    """The mount answers no open (nor flush): the kernel then opens and closes files itself and
    keeps their pages, so a file read once reads again, and any file opens and closes, with the
    mount's process stopped (a request to it would hang: each try is bounded by a timeout)."""
    pack = tmp_path / "p.hframe"
    assert run_bin(["pack", str(tree), "-o", str(pack), "-q", *CREATED]).returncode == 0
    want = sources(tree)
    names = sorted(want)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = in_the_foreground(pack, mnt)
    try:
        assert os.path.ismount(mnt)
        for n in names[:10]:
            assert (mnt / n).read_bytes() == want[n].read_bytes()
        os.listdir(mnt / "real")  # (its entries known: the last names need no lookup either)
        for n in names[10:]:
            os.stat(mnt / n)
        proc.send_signal(signal.SIGSTOP)
        try:
            # md5sum opens, reads, closes: no ioctl (Python's open() would ask isatty)
            # (absolute paths, no cwd in the mount: a chdir there would ask it for access)
            r = subprocess.run(
                ["timeout", "10", "md5sum", *(str(mnt / n) for n in names[:10])], capture_output=True, text=True
            )
            assert r.returncode == 0, r.stderr
            got = {
                Path(p).relative_to(mnt).as_posix(): h
                for h, p in (ln.split(maxsplit=1) for ln in r.stdout.splitlines())
            }
            assert got == {n: hashlib.md5(want[n].read_bytes()).hexdigest() for n in names[:10]}
            opener = "import os, sys\nfor p in sys.argv[1:]: os.close(os.open(p, os.O_RDONLY))\n"
            python = os.path.abspath(hframe_bin_python()[0])
            r = subprocess.run(["timeout", "10", python, "-c", opener, *(str(mnt / n) for n in names[10:])])
            assert r.returncode == 0  # opened and closed, not read: nothing asked of the mount
        finally:
            proc.send_signal(signal.SIGCONT)
        assert (mnt / names[-1]).read_bytes() == want[names[-1]].read_bytes()  # (and on it goes)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)


def test_a_remote_mount_with_a_cache_dir_reads_each_frame_once_from_the_server(tmp_path):
    src = make_photos(tmp_path / "src", 120)
    want = {n: p.read_bytes() for n, p in sources(src).items()}
    site = tmp_path / "site"
    site.mkdir()
    assert run_bin(["pack", str(src), "-o", str(site / "p.hframe"), "-q", *CREATED]).returncode == 0
    log = tmp_path / "access.log"
    cache = tmp_path / "cache"
    with nginx_serving(site, tmp_path / "ng", location=f"access_log {log};") as base:
        url = f"{base}/p.hframe"
        counts = []
        for k in range(2):  # mounted, read, unmounted; then again: the second time from the cache
            with mounted(url, tmp_path / f"mnt{k}", "--cache-dir", str(cache)) as mnt:
                assert {n: p.read_bytes() for n, p in sources(mnt).items()} == want
            counts.append(len(log.read_text().splitlines()))
    first, second = counts[0], counts[1] - counts[0]
    assert first > 20  # the frames past the pack's head, fetched
    assert second <= 4  # the open's requests (manifest, head, index), no frame
    r = run_bin(["cache", "--cache-dir", str(cache), "--json"])
    assert r.returncode == 0 and url in r.stdout.decode()


def hframe_bin_python() -> list[str]:
    return [str(Path(hframe_bin()).with_name("python"))]


def test_bad_mounts_are_one_line_and_leave_nothing_mounted(tree, tmp_path):
    pack = tmp_path / "p.hframe"
    assert run_bin(["pack", str(tree), "-o", str(pack), "-q", *CREATED]).returncode == 0
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        ([str(pack), str(tmp_path / "missing")], "no such folder"),
        ([str(pack), str(tmp_path / "full")], "not empty"),
        ([str(tmp_path / "nope.hframe"), str(tmp_path / "empty"), "--background"], "nope.hframe"),
    ]
    for args, words in cases:
        r = run_bin(["mount", *args])
        err = r.stderr.decode()
        assert r.returncode == 2 and words in err and err.count("\n") == 1, err
    assert not os.path.ismount(tmp_path / "empty") and not os.path.ismount(tmp_path / "full")
    r = run_bin(["umount", str(tmp_path / "empty")])
    assert r.returncode == 2 and "nothing is mounted there" in r.stderr.decode()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_foreground_mount_unmounts_on_ctrl_c_and_sigterm(tree, tmp_path, sig):
    pack = tmp_path / "p.hframe"
    assert run_bin(["pack", str(tree), "-o", str(pack), "-q", *CREATED]).returncode == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = in_the_foreground(pack, mnt)
    try:
        assert os.path.ismount(mnt)
        assert (mnt / "cats").is_dir()
        proc.send_signal(sig)
        proc.wait(timeout=10)
        assert not os.path.ismount(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
        # (a killed server's mount is "not connected", which ismount does not see: always detach)
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)


def test_a_mount_whose_process_was_killed_is_still_unmounted_by_umount(tree, tmp_path):
    pack = tmp_path / "p.hframe"
    assert run_bin(["pack", str(tree), "-o", str(pack), "-q", *CREATED]).returncode == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = in_the_foreground(pack, mnt)
    try:
        proc.kill()
        proc.wait(timeout=10)
        with pytest.raises(OSError):
            os.listdir(mnt)  # "Transport endpoint is not connected"
        r = run_bin(["mount", str(pack), str(mnt)])
        assert r.returncode == 2 and "mounted there already" in r.stderr.decode()
        assert run_bin(["umount", str(mnt)]).returncode == 0
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)


def test_a_missing_fuse_binding_is_one_line_exit_3_and_nothing_mounted(tree, tmp_path):
    pack = tmp_path / "p.hframe"
    assert run_bin(["pack", str(tree), "-o", str(pack), "-q", *CREATED]).returncode == 0
    blocker = tmp_path / "blocker"  # an mfusepy that fails to import, first on the path
    blocker.mkdir()
    (blocker / "mfusepy.py").write_text("raise ImportError('No module named mfusepy')\n")
    (tmp_path / "mnt").mkdir()
    r = run_bin(["mount", str(pack), str(tmp_path / "mnt")], env={**os.environ, "PYTHONPATH": str(blocker)})
    err = r.stderr.decode()
    assert r.returncode == 3 and "pip install 'hframe[mount]'" in err and err.count("\n") == 1
    assert not os.path.ismount(tmp_path / "mnt")
