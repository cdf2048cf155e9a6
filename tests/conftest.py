"""Shared fixtures: real images made with Pillow, and a runner for the real ``hframe`` entry point."""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest
from PIL import Image, ImageDraw
from typer.testing import CliRunner

from hframe_cli.cli.app import main


def make_image(path: Path, size: tuple[int, int], mode: str, seed: int) -> None:
    rng = random.Random(seed)
    img = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.randrange(size[0]), rng.randrange(size[1])
        draw.rectangle(
            (x0, y0, x0 + rng.randrange(1, size[0]), y0 + rng.randrange(1, size[1])),
            fill=tuple(rng.randrange(256) for _ in range(3)),
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".png":
        img.convert(mode).save(path)
    else:
        img.convert(mode if mode in ("RGB", "L") else "RGB").save(path, quality=80)


#: make_video's clips: frames, frames per second, frames between keyframes
FRAMES, RATE, GOP = 30, 10, 10


def make_video(
    path: Path, codec: str, n: int = FRAMES, rate: int = RATE, size=(64, 48), pts_step: int = 1, **container_opts: str
) -> Path:
    """Encode ``n`` frames at ``rate`` fps, a keyframe every GOP frames (scene-cut detection off);
    ``pts_step`` > 1 stores only every so many frame periods (a sparse, variable-rate file)."""
    import av  # (only the video tests pay for it)

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", options=container_opts) as c:
        s = c.add_stream(codec, rate=rate)
        s.width, s.height = size
        s.pix_fmt = "yuv420p"
        s.gop_size = GOP
        s.codec_context.options = {"sc_threshold": "1000000000", "x264-params": "scenecut=0:bframes=0"}
        for i in range(n):
            img = Image.new("RGB", size, (i * 8 % 256, 40, 200 - i * 5 % 200))
            ImageDraw.Draw(img).line([(0, i % size[1]), (size[0], i % size[1])], fill=(0, 255, 0))
            frame = av.VideoFrame.from_image(img)
            frame.pts = i * pts_step
            frame.time_base = Fraction(1, rate)
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def make_records(root: Path, n: int = 120, seed: int = 0) -> Path:
    """JSON annotation records of 0.5-3 KB (compressible structure), a BMP, and a JPEG."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        rec = {
            "image_id": i,
            "category_id": rng.randint(1, 80),
            "bbox": [round(rng.random() * 640, 2) for _ in range(4)],
            "iscrowd": 0,
            "segmentation": [[round(rng.random() * 640, 1) for _ in range(rng.randint(20, 200))]],
        }
        (root / f"ann{i:04d}.json").write_text(json.dumps(rec))
    Image.new("RGB", (40, 30), (10, 200, 30)).save(root / "flat.bmp")
    make_image(root / "photo.jpg", (64, 48), "RGB", seed=3)
    return root


def real_media(limit: int = 120) -> list[Path]:
    """Images made by others: shipped inside the installed Python packages and Debian's."""
    return list(_real_media(limit))


@functools.cache
def _real_media(limit: int) -> tuple[Path, ...]:  # (walking both trees costs about a second)
    # varied: every kind from both trees in turn, at most three files of one folder (a package's
    # folder of toolbar icons would otherwise be all of them)
    groups: list[list[Path]] = []
    for root in (Path(sys.prefix), Path("/usr/share")):
        for ext in ("png", "jpg", "jpeg", "gif", "webp"):
            per_folder: dict[Path, int] = {}
            group = []
            for p in sorted(root.rglob(f"*.{ext}")):
                if per_folder.get(p.parent, 0) < 3 and p.is_file() and 0 < p.stat().st_size < 4 << 20:
                    per_folder[p.parent] = per_folder.get(p.parent, 0) + 1
                    group.append(p)
            groups.append(group)
    mixed = [p for round_ in itertools.zip_longest(*groups) for p in round_ if p is not None]
    return tuple(mixed[:limit])


def make_photos(root: Path, count: int = 30) -> Path:
    """An ImageFolder-style tree: root/<class>/<nnn>.(jpg|png), several sizes and modes."""
    sizes = ((16, 16), (48, 32), (120, 90), (200, 150))
    modes = ("RGB", "L", "RGBA", "P")
    for i in range(count):
        label = ("cats", "dogs", "birds")[i % 3]
        ext = ".png" if i % 4 == 0 else ".jpg"
        make_image(root / label / f"{i:03d}{ext}", sizes[i % len(sizes)], modes[i % len(modes)], seed=i)
    return root


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    return make_photos(tmp_path / "photos")


@pytest.fixture
def packed(photos: Path, tmp_path: Path) -> Path:
    out = tmp_path / "photos.hframe"
    result = run_cli(["pack", str(photos), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    return out


@dataclass
class CliResult:
    exit_code: int
    stdout_bytes: bytes
    stderr: str

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")


def run_cli(args: list[str], input: bytes | str | None = None, env: dict[str, str] | None = None) -> CliResult:
    """Run ``hframe ARGS`` in-process through ``cli.main`` (the same error handling as the binary)."""
    runner = CliRunner()
    base_env = {"HFRAME_TTY": "0"}
    base_env.update(env or {})
    with runner.isolation(input=input, env=base_env) as (out, err, _):
        try:
            main(args)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        return CliResult(code, out.getvalue(), err.getvalue().decode("utf-8", "replace"))


@pytest.fixture
def cli():
    return run_cli


def open_files(pid: int) -> set[str]:
    """What ``pid``'s descriptors name; one closed while they are listed is left out (a loader
    or packing worker still running opens and closes the files it reads)."""
    names = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            names.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return names


def hframe_bin() -> str:
    """The installed console script (next to this Python)."""
    exe = Path(sys.executable).with_name("hframe")
    return str(exe) if exe.exists() else (shutil.which("hframe") or "hframe")


def same_pack(a: Path, b: Path) -> bool:
    """Whether two packs and their indexes are the same bytes."""
    return (
        a.read_bytes() == b.read_bytes()
        and Path(f"{a}.index.parquet").read_bytes() == Path(f"{b}.index.parquet").read_bytes()
    )


def run_bin(args: list[str], **kw) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "HFRAME_TTY": "0", **kw.pop("env", {})}
    return subprocess.run([hframe_bin(), *args], capture_output=True, env=env, timeout=120, **kw)


def run_bins(commands: list[tuple[list[str], dict]], workers: int = 3) -> list[subprocess.CompletedProcess[bytes]]:
    """``run_bin`` of each (args, keywords), a few at once (each is mostly a process starting):
    for matrices of commands that read, and write nothing another could meet."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda c: run_bin(c[0], **c[1]), commands))


def killed_and_resumed(src: Path, tmp_path: Path, args: list[str], fault: str) -> tuple[Path, Path, dict]:
    """Pack ``src`` twice with ``args``: once cleanly, once SIGKILLed by ``HFRAME_FAULT=fault``
    and then resumed. Returns (clean pack, resumed pack, resume --json document)."""
    clean = tmp_path / "clean.hframe"
    assert run_bin(["pack", str(src), "-o", str(clean), *args]).returncode == 0
    out = tmp_path / "k.hframe"
    r = run_bin(["pack", str(src), "-o", str(out), *args], env={"HFRAME_FAULT": fault})
    assert r.returncode == -signal.SIGKILL
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    return clean, out, json.loads(r.stdout)


@contextmanager
def lock_held_elsewhere(output: Path) -> Iterator[int]:
    """Hold ``output``'s lock from another process (as another hframe run would); yields its pid."""
    code = (
        "import sys; from hframe_cli.write.checkpoint import OutputLock; "
        "lock = OutputLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read(); lock.release()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(output)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        yield proc.pid
    finally:
        proc.communicate(timeout=30)


@contextmanager
def nginx_serving(root: Path, workdir: Path, location: str = "") -> Iterator[str]:
    """nginx on a free loopback port serving ``root`` (static files: byte ranges, ETags,
    If-Match); yields its base URL. ``location``: directives for its ``location /`` block (such as
    ``auth_basic``). Skips where nginx is not installed (``.ci/run`` installs it)."""
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if exe is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "nginx.conf"
    user = "user root;" if os.geteuid() == 0 else ""  # workers must read pytest's private folders
    conf.write_text(
        f"""{user}
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ {location} }}
    }}
}}
"""
    )
    proc = subprocess.Popen([exe, "-c", str(conf), "-p", str(workdir), "-g", "daemon off;"], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    pytest.fail(f"nginx did not start: {err}")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(argv: list[str], port: int, what: str, log: Path) -> subprocess.Popen[bytes]:
    """Start a server process and wait (up to 30 s) until it accepts connections on ``port``."""
    out = open(log, "wb")  # noqa: SIM115 - the server's log lives as long as the server
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"{what} did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)


def _tool(name: str) -> str | None:
    """An executable installed with the test extras: next to this Python, else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


#: credentials for the loopback S3 (moto accepts any); set for this process and its children
S3_ENV = {"AWS_ACCESS_KEY_ID": "hframe-test", "AWS_SECRET_ACCESS_KEY": "hframe-test", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def moto_s3(workdir: Path) -> Iterator[str]:
    """moto's S3 server (PyPI ``moto[server]``, a test extra) on a free loopback port; yields its
    ``HOST:PORT``. Sets fake credentials in the environment (and restores it after)."""
    with moto_s3_process(workdir) as (endpoint, _, _):
        yield endpoint


@contextmanager
def moto_s3_process(workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """``moto_s3``, yielding (``HOST:PORT``, the server process, its log: one line per request
    answered) for tests that kill the store or count its requests."""
    exe = _tool("moto_server")
    if exe is None:
        pytest.fail("moto_server is not installed (pip install 'moto[server]': a test extra)")
    port = _free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    proc = _serve([exe, "-H", "127.0.0.1", "-p", str(port)], port, "moto_server", workdir / "moto.log")
    try:
        yield f"127.0.0.1:{port}", proc, workdir / "moto.log"
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def gcs_emulator(workdir: Path, bucket: str) -> Iterator[str]:
    """A Google Cloud Storage emulator (PyPI ``gcp-storage-emulator``, a test extra) on a free
    loopback port holding ``bucket``; yields its ``HOST:PORT``."""
    exe = _tool("gcp-storage-emulator")
    if exe is None:
        pytest.fail("gcp-storage-emulator is not installed (pip install gcp-storage-emulator: a test extra)")
    port = _free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [exe, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory", "--default-bucket", bucket]
    proc = _serve(argv, port, "gcp-storage-emulator", workdir / "gcs.log")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def assert_ctrl_c_ends_a_stuck_read(server, args: list[str]) -> None:
    """``hframe ARGS`` against ``server`` (a ``RangeServer`` told to hang): once its first
    request is in, SIGINT ends it with exit 130 and no traceback, long before the hung request
    would have (the bound only catches a wait for it: hframe.1 promises 1 s, which a loaded
    machine cannot time reliably; scripts/ measure it)."""
    server.faults.extend(["hang"] * 5)
    env = {**os.environ, "HFRAME_IO_REQUEST_TIMEOUT": "60", "HFRAME_IO_TIMEOUT": "120", "HFRAME_TTY": "0"}
    proc = subprocess.Popen([hframe_bin(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 20
    while server.total_requests() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 130
    assert time.monotonic() - t0 < 10
    assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()


def assert_commands_agree(remote: str, local: str | os.PathLike[str], commands: list[list[str]]) -> None:
    """Each command (``{}`` standing for the pack) gives on ``remote`` exactly what it gives on
    ``local``, the locations aside (a URL is shown without its query, as ``...``)."""
    here = os.fspath(local)
    base = remote.partition("?")[0]
    for args in commands:
        got = run_bin([a.format(remote) for a in args])
        want = run_bin([a.format(here) for a in args])
        assert got.returncode == 0, got.stderr
        shown = got.stdout.replace(remote.encode(), b"P").replace(base.encode(), b"P").replace(b"?...", b"")
        assert shown == want.stdout.replace(here.encode(), b"P"), args
