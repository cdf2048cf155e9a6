"""What this process may use and fork: the CPUs it may run on, whether forking a helper is
safe here, forking without a signal in between (``signals_held``), making the child a helper
that holds nothing of the parent's and dies with it (``become_helper``), and the pipe chores
every forked helper shares (write or read all of a message, reap the child). Used by the
listing (``listing``), the pack loader (``loading``), verify's parallel parts, the uploader
and the reader."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator

__all__ = [
    "become_helper",
    "die_with_parent",
    "fork_is_safe",
    "read_exactly",
    "reap",
    "release_signals",
    "signals_held",
    "usable_cpus",
    "write_all",
]

_HELD = {signal.SIGINT, signal.SIGTERM}

_MAX_FD = max(1 << 16, os.sysconf("SC_OPEN_MAX")) if hasattr(os, "sysconf") else 1 << 16


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: Slurm, taskset, a cpuset), not all
    the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fork_is_safe() -> bool:
    """Whether a forked helper can run here without risk: no other thread in this process but
    known harmless ones (a thread holding a lock at the fork could leave the child stuck on it;
    an S3 client's threads, for example, make this False). Harmless: pyarrow's allocator
    thread (it prepares itself for a fork) and the progress bar's monitor (tqdm's; its lock is
    one a helper never takes)."""
    if not hasattr(os, "fork"):
        return False
    main = threading.main_thread()
    python_threads = [t for t in threading.enumerate() if t is not main]
    monitors = [t for t in python_threads if type(t).__name__ == "TMonitor" and type(t).__module__.startswith("tqdm")]
    if len(monitors) != len(python_threads):
        return False
    try:
        native = 0
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as f:
                native += f.read().strip() != "jemalloc_bg_thd"
        return native == 1 + len(monitors)  # this thread and the monitors: no thread of a C library
    except OSError:
        return True


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (a pipe or a file may take less at a time)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (blocked) inside, around a fork: the parent takes a signal
    that came meanwhile only once it has recorded the child (so its cleanup can end it), and the
    child only once ``become_helper`` has set what a signal does to it (it never runs the
    parent's handlers, which raise into the parent's code)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this (forked) process when its parent ends (``PR_SET_PDEATHSIG``,
    Linux); end now if ``parent`` is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def become_helper(parent: int, *keep: int) -> None:
    """In a child just forked (under ``signals_held``) by ``parent``: keep only the descriptors
    ``keep`` (its pipes) and stdio on /dev/null, so an orphaned helper holds neither the
    output's lock nor the caller's pipes open; die with the parent (a helper must not keep
    working for a process that is gone); ignore SIGINT (the parent decides what a signal stops)
    and die by SIGTERM; run no finalizer of the parent's objects. The child must end with
    ``os._exit``."""
    gc.disable()
    null = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        if std not in keep:
            os.dup2(null, std)
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _MAX_FD)
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    release_signals()


def release_signals() -> None:
    """In a child forked under ``signals_held``, once it is ready for them: take SIGINT and
    SIGTERM again."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


def read_exactly(fd: int, n: int) -> bytearray | None:
    """``n`` bytes from ``fd``, or None if it ends first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return None
        got += k
    return buf


def reap(pid: int) -> int:
    """Wait for child ``pid``; its wait status, or 0 when there is none to wait for (a host
    program that ignores SIGCHLD has the kernel reap children itself)."""
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, 0)[1]
    return 0
