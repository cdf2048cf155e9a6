"""The output lock: one writer per output, decided before anything else is done.

``OUT.lock`` is held with ``flock`` for the whole run; its text names the holder (pid, host,
start time). This module imports nothing heavy, so a run that finds the output locked exits
before it has loaded pyarrow or looked at a single source.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable

from ..errors import InputError, PackLocked, StorageError
from ..locations import is_remote, scheme_family, shown_url
from ..names import lock_name

__all__ = ["LockWaitStopped", "OutputLock", "lock_path", "peek_lock"]


class LockWaitStopped(Exception):
    """Waiting for the lock was given up because ``should_stop`` said so (a signal came)."""


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def lock_path(output: str | os.PathLike[str]) -> str:
    """The lock file of an output: ``OUTPUT.lock``."""
    return lock_name(output)


def peek_lock(output: str | os.PathLike[str], *, wait: float = 0.0) -> str | None:
    """Whether a run holds ``output``'s lock, without taking it, creating or deleting anything
    (``pack --update --dry-run``): None when nobody does; else the holder's text.

    Raises:
        PackLocked: a live run holds it (after ``wait`` seconds), worded as ``acquire`` words it.

    A lock file whose ``flock`` is free (a dead run's) returns its text prefixed ``stale: ``.
    The test takes a shared ``flock`` for an instant, which a writer starting at that instant
    sees as held, exactly as it would a dry run that locked.
    """
    path = lock_path(output)
    deadline = time.monotonic() + max(0.0, wait)
    pause = 0.005
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None  # no lock file (or none we may read: nothing to say about it)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()  # its holder wrote it
                if time.monotonic() >= deadline:
                    raise PackLocked(
                        f"{os.fspath(output)}: locked by another hframe run ({text or 'unknown holder'}); "
                        f"lock file {path}"
                    ) from None
            else:
                try:
                    st = os.stat(path)
                    same = (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
                except FileNotFoundError:
                    same = False
                # a holder deletes the file before letting go: a free lock on a deleted file is nobody's
                text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
                return f"stale: {text or 'unknown holder'}" if same else None
        finally:
            os.close(fd)
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


#: The lock files this process holds, by path and thread, with the holder's pid (a forked child
#: inherits the table, not the locks' ownership). The same thread taking one again is a bug of
#: the layer that did; another thread or process is locked out like any other run.
_HELD: dict[tuple[str, int], int] = {}


class OutputLock:
    """An exclusive lock on one output, naming its holder.

    One layer owns it: the run's front door (``api.pack``, ``api.resume_pack``; a shard's or a
    part's driver for that shard) takes it once and passes the held lock down, and the layers
    below ``require`` it. Taking a lock this process already holds raises ``RuntimeError``.

    Args:
        output: the output path; the lock file is ``OUTPUT.lock``.
        wait: seconds to keep trying while another run holds it (0: fail at once, like
            ``flock -n``; like ``flock -w SECONDS`` otherwise).

    A lock file whose ``flock`` is free was left by a dead process: it is taken over and
    ``took_over`` says whose it was. Releasing deletes the file while still holding it, and a
    fresh ``flock`` is only trusted once the path is seen to still name the locked file, so two
    runs can never both hold one output.
    """

    def __init__(self, output: str | os.PathLike[str], *, wait: float = 0.0) -> None:
        if is_remote(output):  # every writing run takes this lock first
            where, scheme = shown_url(os.fspath(output)), os.fspath(output).partition("://")[0]
            if scheme_family(output) == "http":
                raise InputError(
                    f"{where}: writing to a remote location ({scheme}://) is not supported yet; "
                    "write the pack locally, then upload it and its index"
                )
            raise InputError(
                f"{where}: only pack and resume write to a remote location ({scheme}://); "
                "run this on a local copy, then publish it with 'hframe pack'"
            )
        self.path = lock_path(output)
        self.output = os.fspath(output)
        self.wait = wait
        self._key = (os.path.abspath(self.path), threading.get_ident())
        self._fd = -1
        self.took_over: str | None = None  # text of a stale lock we replaced
        self.waited_s = 0.0

    def acquire(self, should_stop: Callable[[], bool] | None = None) -> OutputLock:
        """Take the lock (waiting up to ``wait`` seconds).

        Raises:
            PackLocked: another run holds it.
            LockWaitStopped: ``should_stop()`` turned true while waiting (a signal came).
        """
        if _HELD.get(self._key) == os.getpid():
            raise RuntimeError(f"{self.output}: its lock is already held by this thread (pass the held lock down)")
        t0 = time.monotonic()
        deadline = t0 + max(0.0, self.wait)
        pause = 0.005
        contended = False
        while True:
            fd = self._try_once()
            if fd >= 0:
                break
            contended = True
            now = time.monotonic()
            if now >= deadline:
                holder = self.holder() or "unknown holder"
                waited = f" after waiting {now - t0:.1f} s" if self.wait > 0 else ""
                raise PackLocked(
                    f"{self.output}: locked by another hframe run ({holder}){waited}; lock file {self.path}"
                )
            if should_stop is not None and should_stop():
                raise LockWaitStopped(f"{self.output}: stopped while waiting for the lock")
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 0.1)
        try:
            # only a wait for another run counts (a slow first try on a busy machine is not one)
            self.waited_s = time.monotonic() - t0 if contended else 0.0
            old = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            self.took_over = old or None
            now_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            info = f"pid {os.getpid()} on {socket.gethostname()} since {now_utc}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, (info + "\n").encode(), 0)
            self._fd = fd
            _HELD[self._key] = os.getpid()
        except BaseException:
            _unlink_quietly(self.path)  # we hold it: nobody can be using the file
            os.close(fd)
            raise
        return self

    def _try_once(self) -> int:
        """One attempt: the locked descriptor, or -1 if another process holds the lock."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            folder = os.path.dirname(os.path.abspath(self.path))
            raise InputError(f"{self.output}: the folder {folder} does not exist") from None
        except OSError as e:
            raise StorageError(f"{self.path}: cannot create lock file: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return -1
        # the holder we waited for deletes the file before letting go: if we locked that deleted
        # file, the lock is worth nothing (the next run creates a new file); try again
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return self._try_once()
        return fd

    def fileno(self) -> int:
        """The locked file's descriptor (-1 when not held)."""
        return self._fd

    def holder(self) -> str:
        """Who holds the lock, as its file says (empty if nobody or unreadable)."""
        try:
            with open(self.path, "rb") as f:
                return f.read(4096).decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def require(self, output: str | os.PathLike[str]) -> None:
        """Check that this is ``output``'s lock and that this process holds it: what a layer that
        writes ``output`` with a lock passed down from its caller does first.

        Raises:
            RuntimeError: it is not (a bug of the caller, never the user's).
        """
        if self._fd < 0 or _HELD.get(self._key) != os.getpid() or self._key[0] != os.path.abspath(lock_path(output)):
            raise RuntimeError(
                f"{os.fspath(output)}: written without holding its lock (the lock passed is {self.path})"
            )

    def release(self) -> None:
        """Let go: delete the file while still holding it (nobody can take a half-released
        lock), then unlock. A forked child's copy lets go of nothing: its parent holds the lock."""
        fd, self._fd = self._fd, -1
        if fd < 0 or _HELD.get(self._key) != os.getpid():
            return
        del _HELD[self._key]
        _unlink_quietly(self.path)
        os.close(fd)

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
