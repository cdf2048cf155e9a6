"""The forked loader of small files (``loading.loaded_by_child``): the same items, in the same
order, as loading them here, whatever happens to the child; and ``pack`` through it gives the
same bytes as one thread, and survives a signal."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import hframe_bin, make_image, open_files, run_bin

import hframe_cli.processes as processes
import hframe_cli.write.loading as loading
from hframe_cli.sources.inputs import collect_sources
from hframe_cli.sources.media import FramePrep, MediaOptions

CREATED = ["--created", "1700000000"]
#: Aligned payloads: record sizes depend on where records start, so no packing workers
#: (``fanout``); the default for many small files is then the forked loader.
LOADER = [*CREATED, "--align", "64"]


def small_tree(root: Path, n: int = 2500, seed: int = 0) -> Path:
    """``n`` tiny blobs in folders of 500, plus two real images (they take the pickled path)."""
    rng = random.Random(seed)
    for i in range(n):
        p = root / f"d{i // 500}" / f"{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.randrange(1, 3000)))
    make_image(root / "d0" / "img.png", (40, 30), "RGB", 1)
    make_image(root / "d1" / "img.jpg", (64, 48), "RGB", 2)
    return root


def fields(items) -> list[tuple]:
    return [(i.source.name, i.data, i.md5, i.error, i.stream, i.video, i.frame) for i in items]


def test_the_child_yields_what_loading_here_does_vanished_grown_and_big_files_included(tmp_path, monkeypatch):
    src = small_tree(tmp_path / "src", 1200)
    big = src / "d1" / "big.bin"
    big.write_bytes(os.urandom(5000))
    sources = collect_sources([str(src)]).sources
    (src / "d0" / "00003.bin").unlink()  # vanished since the listing
    with open(src / "d1" / "00600.bin", "ab") as f:  # grew since the listing
        f.write(b"more")
    monkeypatch.setattr(loading, "STREAM_ABOVE", 4000)  # big.bin is streamed by the writer
    prep = FramePrep(MediaOptions())
    here = fields(loading.loaded_in_order(sources, 1, prep))
    assert fields(loading.loaded_by_child(sources, prep)) == here
    kinds = {(i[3] is not None, i[4], i[6] is not None) for i in here}
    assert kinds == {(False, False, False), (True, False, False), (False, True, False), (False, False, True)}


def test_a_child_that_dies_leaves_the_rest_to_the_parent(tmp_path, monkeypatch):
    sources = collect_sources([str(small_tree(tmp_path / "src", 1000))]).sources
    prep = FramePrep(MediaOptions())
    want = fields(loading.loaded_in_order(sources, 1, prep))
    parent, real = os.getpid(), loading.read_unhashed

    def dies_in_the_child(src, videos):
        if os.getpid() != parent and src.name.endswith(b"00700.bin"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, videos)

    monkeypatch.setattr(loading, "read_unhashed", dies_in_the_child)
    assert fields(loading.loaded_by_child(sources, prep)) == want


def test_closing_the_loader_early_ends_its_child(tmp_path, monkeypatch):
    sources = collect_sources([str(small_tree(tmp_path / "src", 3000))]).sources
    pids = []
    real_fork = os.fork

    def fork():
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(loading.os, "fork", fork)
    items = loading.loaded_by_child(sources, FramePrep(MediaOptions()))
    first = [next(items) for _ in range(10)]
    assert [i.source for i in first] == sources[:10] and len(pids) == 1
    items.close()  # the child is killed and reaped: no process of that pid is left
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


def test_pack_of_many_small_files_is_byte_identical_to_one_thread(tmp_path):
    src = small_tree(tmp_path / "src")
    one, two = tmp_path / "one.hframe", tmp_path / "two.hframe"
    assert run_bin(["pack", str(src), "-o", str(one), "-q", "--workers", "1", *LOADER]).returncode == 0
    r = run_bin(["pack", str(src), "-o", str(two), "-q", *LOADER])  # default: a forked loader
    assert r.returncode == 0, r.stderr
    assert one.read_bytes() == two.read_bytes()
    assert Path(f"{one}.index.parquet").read_bytes() == Path(f"{two}.index.parquet").read_bytes()


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _paused_pack(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """A clean one-thread pack of a small tree, and a default run of the same (a forked loader)
    stopped by itself after frame 1,200; (that run, its output, the clean pack)."""
    src = small_tree(tmp_path / "src")
    clean = tmp_path / "clean.hframe"
    assert run_bin(["pack", str(src), "-o", str(clean), "-q", "--workers", "1", *LOADER]).returncode == 0
    out = tmp_path / "s.hframe"
    env = {**os.environ, "HFRAME_TTY": "0", "HFRAME_FAULT": "after-frame:1200:stop"}
    proc = subprocess.Popen(
        [hframe_bin(), "pack", str(src), "-o", str(out), "--checkpoint-every", "500", *LOADER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.monotonic() + 60
    while True:  # until it stops itself after frame 1,200 (state T)
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return proc, out, clean
        time.sleep(0.01)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_pack_ends_the_loader_and_resume_gives_the_same_pack(tmp_path, sig):
    proc, out, clean = _paused_pack(tmp_path)
    loaders = _children(proc.pid)
    assert len(loaders) == 1  # the forked loader, still there
    # it keeps its pipe and stdio on /dev/null, nothing of the parent's (its lock, its stdio)
    fds = open_files(loaders[0])
    assert not any(f.endswith(".lock") for f in fds) and sum(f.startswith("pipe:") for f in fds) <= 1, fds
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130 and b"Traceback" not in err, err
    for pid in loaders:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    r = run_bin(["resume", str(out)])
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == clean.read_bytes()


def test_a_run_killed_while_its_loader_lives_on_does_not_keep_the_output_locked(tmp_path):
    """SIGKILL of the packing process while its loader is stuck (stopped here): the caller sees
    the end of the run's output (the loader holds none of its pipes), and the next run, a
    second process, takes the output's lock at once and finishes the same pack."""
    proc, out, clean = _paused_pack(tmp_path)
    (loader,) = _children(proc.pid)
    os.kill(loader, signal.SIGSTOP)  # a loader stuck in a slow read
    try:
        proc.kill()
        proc.communicate(timeout=60)  # would wait for ever if the loader held stdout or stderr
        os.kill(loader, 0)  # still there, orphaned
        r = run_bin(["resume", str(out)])
        assert r.returncode == 0, r.stderr
        assert out.read_bytes() == clean.read_bytes()
    finally:
        os.kill(loader, signal.SIGKILL)


def test_a_fork_that_fails_loads_everything_here(tmp_path, monkeypatch):
    sources = collect_sources([str(small_tree(tmp_path / "src", 300))]).sources
    prep = FramePrep(MediaOptions())
    want = fields(loading.loaded_in_order(sources, 1, prep))

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")  # a limit on processes

    monkeypatch.setattr(loading.os, "fork", no_fork)
    before = len(os.listdir("/proc/self/fd"))
    assert fields(loading.loaded_by_child(sources, prep)) == want
    assert len(os.listdir("/proc/self/fd")) == before  # the pipe was closed


def test_a_host_that_ignores_sigchld_still_gets_its_frames(tmp_path):
    """With SIGCHLD ignored the kernel reaps children itself: waitpid has nothing to wait for."""
    sources = collect_sources([str(small_tree(tmp_path / "src", 300))]).sources
    prep = FramePrep(MediaOptions())
    want = fields(loading.loaded_in_order(sources, 1, prep))
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert fields(loading.loaded_by_child(sources, prep)) == want
    finally:
        signal.signal(signal.SIGCHLD, old)


def test_the_child_needs_a_second_cpu_and_no_other_thread(monkeypatch):
    # (numpy, which pyarrow imports where it is installed, starts OpenBLAS's pool of threads: the
    # hframe command asks for none, cli/entry.py; here the test asks the same, then not)
    quiet_blas = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    code = "import pyarrow.parquet, hframe_cli.write.loading as l; print(l.child_may_load())"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=quiet_blas)
    assert fresh.stdout.strip() == "True"  # pyarrow loaded: only jemalloc's own thread besides this one
    code = (
        "import io, threading, tqdm, pyarrow.parquet, hframe_cli.write.loading as l; bar = tqdm.tqdm(total=9, file=io.StringIO()); "
        "print(sorted(type(t).__name__ for t in threading.enumerate()), l.child_may_load())"
    )
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=quiet_blas)
    assert fresh.stdout.strip() == "['TMonitor', '_MainThread'] True"  # a terminal's progress bar: allowed
    code = "import numpy, hframe_cli.write.loading as l; print(l.child_may_load())"
    blas = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=blas)
    if fresh.returncode == 0:  # numpy installed: a thread of a C library is one fork_is_safe cannot vouch for
        assert fresh.stdout.strip() == "False"
    monkeypatch.setattr(loading.os, "sched_getaffinity", lambda pid: {0})  # taskset -c 0, a 1-CPU job
    assert processes.usable_cpus() == 1 and not loading.child_may_load()
    monkeypatch.undo()
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not loading.child_may_load()
    finally:
        stop.set()
        t.join()


_FAULTS = """
import resource, sys
from hframe_cli.processes import keep_freed_heap
kept = keep_freed_heap() if sys.argv[1] == "keep" else False
def round_of_files():  # what a worker does: a chunk of 34 KB files held, then let go
    held = [bytes(34_000) for _ in range(240)]
    del held
round_of_files()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    round_of_files()
print(int(kept), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_a_helper_keeps_freed_memory_instead_of_faulting_it_in_again():
    """glibc gives a freed chunk of files back to the kernel, and the next chunk faults every
    page in again (the system time of packing 34 KB JPEGs); a helper that asked
    ``keep_freed_heap`` reuses the pages it has."""
    out = {}
    for how in ("default", "keep"):
        r = subprocess.run([sys.executable, "-c", _FAULTS, how], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        kept, faults = map(int, r.stdout.split())
        out[how] = (kept, faults)
    if not out["keep"][0]:
        pytest.skip("not glibc: no mallopt")
    assert out["default"][1] > 20 * 240 * 34_000 // 4096 // 2  # about a fault per page, every round
    assert out["keep"][1] < out["default"][1] // 20, out


def test_a_batch_is_hashed_together_with_each_sources_own_md5(tmp_path):
    """``load_batch`` reads a batch, then hashes it in one ``md5_each`` call: every item read has
    its own bytes' md5 (side by side where built, else hashlib), an item that failed has none,
    and the images are prepared with their md5."""
    src = small_tree(tmp_path / "src", 300)
    sources = collect_sources([str(src)]).sources
    (src / "d0" / "00007.bin").unlink()  # vanished since the listing: an error, no bytes
    items = loading.load_batch(sources, FramePrep(MediaOptions()), False)
    assert [i.source for i in items] == list(sources)
    read = [i for i in items if i.data is not None]
    assert len(read) == len(sources) - 1 and len(read) >= 16  # (more than one lane's worth)
    assert all(i.md5 == hashlib.md5(i.data).digest() for i in read)
    (gone,) = [i for i in items if i.data is None]
    assert gone.error and gone.md5 is None and gone.source.name.endswith(b"00007.bin")
    images = [i for i in read if i.frame is not None]
    assert len(images) == 2 and all(i.frame.md5 == i.md5 for i in images)
