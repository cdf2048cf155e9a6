"""What this process may use and fork: the CPUs it may run on, whether forking a helper is
safe here, forking without a signal in between (``signals_held``), making the child a helper
that holds nothing of the parent's and dies with it (``become_helper``), and the pipe chores
every forked helper shares (write or read all of a message, reap the child). Used by the
listing (``listing``), the pack loader (``loading``), verify's parallel parts, the uploader
and the reader.

Imports inside functions: ctypes, only where a C call is made (``mallopt``, ``prctl``).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import signal
import struct
import threading
from collections.abc import Callable, Iterator

__all__ = [
    "become_helper",
    "die_with_parent",
    "fork_helper",
    "fork_is_safe",
    "keep_freed_heap",
    "may_keep_freed_heap",
    "pipe_with_room",
    "read_exactly",
    "reap",
    "receive_message",
    "release_signals",
    "send_message",
    "signals_held",
    "this_process",
    "usable_cpus",
    "write_all",
]

_HELD = {signal.SIGINT, signal.SIGTERM}

_MAX_FD = max(1 << 16, os.sysconf("SC_OPEN_MAX")) if hasattr(os, "sysconf") else 1 << 16
_LEN = struct.Struct("<Q")  # a message's length, before its bytes


class _ThisProcess:
    """``this_process.pid`` is ``os.getpid()`` without its system call (180 ns on this VM,
    a sixth of a warm 2.6 KB ``pread``): set at import and again in every child ``os.fork``
    makes (``multiprocessing`` and ``fork_helper`` included), by an at-fork hook. A child
    forked in C without the hook would keep its parent's pid here; code keyed on it then uses
    the descriptors it inherited, which read the same file."""

    pid = os.getpid()


this_process = _ThisProcess()


def _forked() -> None:
    this_process.pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


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


def fork_helper(work: Callable[[], object], *keep: int) -> int:
    """Fork a helper that runs ``work`` (after ``become_helper``, keeping the descriptors
    ``keep``) and ends with ``os._exit``: 0 when ``work`` returned, 1 on any exception (a
    broken pipe included: the parent carries on without it). Call it under ``signals_held``
    and record the pid there. Returns the pid, or -1 when the fork failed (a limit on
    processes, no memory to overcommit): the caller then does the work itself."""
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        return -1
    if pid == 0:
        code = 0
        try:
            become_helper(parent, *keep)
            work()
        except BaseException:  # noqa: BLE001 - reported by the exit status and the pipe's end
            code = 1
        finally:
            os._exit(code)
    return pid


def keep_freed_heap(limit: int = 256 << 20) -> bool:
    """In a helper that reads, hashes and writes files one after another: ask glibc to keep up
    to ``limit`` bytes of freed memory instead of giving it back to the kernel, and to serve
    allocations up to 32 MiB from that heap, so each file's bytes land in pages faulted in
    already. By default glibc trims the heap whenever a freed file leaves its top free, and the
    next file faults every page in again: loading 6,000 JPEGs of 34 KB as a worker does took
    39,000 minor faults and 0.18-0.22 s of system time, and 0 faults and 0.07-0.10 s with this.
    Only for the ``hframe`` command's process, our own helpers and DataLoader workers reading a
    ``FrameDataset`` (processes made to run our reads; a library must not set this in its
    caller's process), where ``may_keep_freed_heap``. False where the C library has no
    ``mallopt`` (not glibc)."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_TRIM_THRESHOLD, limit)) and bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20))


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h

#: settings of glibc's malloc a user may give in the environment: then they are theirs to set
_MALLOC_SETTINGS = ("MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def may_keep_freed_heap() -> bool:
    """Whether ``keep_freed_heap`` may be asked for in a process of ours: not with
    ``HFRAME_MALLOC=0``, nor where the environment sets malloc's thresholds itself."""
    return os.environ.get("HFRAME_MALLOC") != "0" and not any(k in os.environ for k in _MALLOC_SETTINGS)


def pipe_with_room(nbytes: int) -> tuple[int, int]:
    """A pipe (read end, write end) whose buffer is asked to hold ``nbytes`` (Linux; without
    it, or above the system's limit, it keeps what it has: ``F_GETPIPE_SZ`` tells)."""
    r, w = os.pipe()
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, nbytes)
    return r, w


def send_message(fd: int, body: bytes | bytearray | memoryview) -> None:
    """Write ``body`` as one message: its length, then its bytes (``receive_message``)."""
    write_all(fd, _LEN.pack(len(body)))
    write_all(fd, body)


def receive_message(fd: int) -> bytearray | None:
    """The next message ``send_message`` wrote to the other end, or None when the pipe ends
    first (the sender died or finished)."""
    head = read_exactly(fd, _LEN.size)
    return read_exactly(fd, _LEN.unpack(head)[0]) if head is not None else None


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
