"""What this process may use and fork: the CPUs it may run on, whether forking a helper is
safe here, and the two pipe chores every forked helper shares (write all of a message, reap
the child). Used by the pack loader (``loading``), verify's parallel parts and the reader."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading

__all__ = ["become_helper", "fork_is_safe", "read_exactly", "reap", "usable_cpus", "write_all"]

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


def become_helper(*keep: int) -> None:
    """In a freshly forked child: keep only the descriptors ``keep`` (its pipes) and stdio on
    /dev/null, so an orphaned helper holds neither the output's lock nor the caller's pipes
    open; ignore SIGINT (the parent decides what a signal stops) and die by SIGTERM; run no
    finalizer of the parent's objects. The child must end with ``os._exit``."""
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
