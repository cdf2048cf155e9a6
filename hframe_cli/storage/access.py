"""File access behind one small interface: the only module that opens packs for reading.

``open_storage(uri)`` is the single place where a location is parsed. Local paths get an
``os.pread`` fast path with a descriptor per process, pinned to the file first opened, so a
reader created before ``fork()`` (PyTorch DataLoader workers) never shares a descriptor with its
parent, and never reads a newer file that a publish renamed over the path. Remote schemes plug in
here (``register_scheme``): ``http(s)://``, ``s3://``, ``gs://`` and ``hdfs://`` open a
``http.RemoteFile``; Azure (``abfs://``, ``az://``) is refused clearly.

Imports inside functions: the remote clients (``http``) and pyarrow, only when a remote location
or a stream is opened.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from ..errors import HframeError, InputError, OutOfMemory, PackReplaced, StorageError
from ..locations import SCHEMES, is_remote
from ..processes import this_process

__all__ = [
    "LocalFile",
    "Storage",
    "evict_from_page_cache",
    "is_remote",
    "open_storage",
    "register_scheme",
    "unpinned_and_moved",
]

#: every scheme but file://: read by ``RemoteFile`` or refused as not supported yet
REMOTE_SCHEMES = tuple(s for s in SCHEMES if s != "file")


class Storage(Protocol):
    """What readers need from a pack location: the seam every read, prefetch and eviction goes
    through. ``LocalFile`` is the local implementation; remote schemes plug in through
    ``register_scheme``."""

    location: str
    #: a handle reopened by path (after fork, pickling or close) accepts only the same version
    same_generation: Callable[[int], None] | None
    #: other locations of the same file (an index opened as INDEX.partial mid-publish)
    alternates: tuple[str, ...]

    @property
    def origin(self) -> tuple[int, int, int, int] | None: ...

    def size(self) -> int: ...

    def read_at(self, offset: int, length: int) -> bytes: ...

    def preader(self) -> Callable[[int, int], bytes]: ...

    def prefetch(self, offsets: Sequence[int], lengths: Sequence[int]) -> None: ...

    def advise_sequential(self, start: int) -> None: ...

    def stream(self) -> Any: ...

    def is_at_path(self) -> bool: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


def unpinned_and_moved(storage: Storage) -> bool:
    """Whether ``storage`` is a remote object whose reads are not tied to one version (its
    ``pinned`` is False: S3 through pyarrow, a server without a strong ETag) and the object
    changed since it was opened: then bytes that fail a check are that change, not damage."""
    return not getattr(storage, "pinned", True) and not storage.is_at_path()


def _storage_error(location: str, err: OSError) -> StorageError:
    reason = err.strerror or str(err)
    return StorageError(f"{location}: {reason}")


class _Held:
    """``LocalFile.held``: a small context manager (a generator-based one costs twice as much)."""

    __slots__ = ("_file",)

    def __init__(self, file: LocalFile) -> None:
        self._file = file

    def __enter__(self) -> None:
        self._file._enter()

    def __exit__(self, *exc: object) -> None:
        self._file._leave()


class LocalFile:
    """A local file read with ``os.pread`` through a per-process descriptor, pinned to one file.

    The file is the one opened first (its device and inode, ``identity``), not whatever the path
    names later: a pack replaced by a publish (a rename over the path) stays readable through
    handles opened before. A forked child reaches the same file through the descriptor it
    inherited (reopened as ``/proc/self/fd/N`` where that exists, so it gets its own file
    description, else duplicated); a process it is pickled to (a spawned DataLoader worker)
    through ``/proc/PID/fd/N`` of the process that opened it, while that process lives. Only when
    neither can be reached is the path opened again; then ``same_generation(fd)`` (set by the
    owner, e.g. ``PackReader``) decides whether that file may stand in for the first one, and
    raises ``PackReplaced`` when it may not.
    """

    def __init__(
        self,
        path: str,
        *,
        origin: tuple[int, int, int, int] | None = None,
        same_generation: Callable[[int], None] | None = None,
    ) -> None:
        self.location = path
        self._fd = -1
        self._pid = -1
        self._lock = threading.Lock()
        #: reads in flight (``held``) in process ``_users_pid``, and a ``close()`` left to the last
        self._users = 0
        self._users_pid = -1
        self._closing = False
        #: (pid, fd, st_dev, st_ino) of the handle this one was pickled from (spawned workers)
        self._origin = origin
        self.identity: tuple[int, int] | None = (origin[2], origin[3]) if origin else None
        self.same_generation = same_generation
        #: other paths where the same file may be found once ``path`` is gone (checked alike)
        self.alternates: tuple[str, ...] = ()
        self.fileno()  # fail now, with the path, if it cannot be opened

    def fileno(self) -> int:
        """The descriptor for this process, reaching the same file on first use after a fork."""
        pid = this_process.pid
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:
                    fd = self._reattach()
                    if fd < 0:
                        fd = self._open_path()
                    self._fd, self._pid = fd, pid
        return self._fd

    def _reattach(self) -> int:
        """The first file again, through an inherited descriptor or the opener's /proc entry.

        An inherited descriptor is that very file (it stayed open). The opener's entry may have
        been closed and its number reused, and a freed inode number comes back quickly (ext4),
        so a file found there must also pass ``same_generation``."""
        if self.identity is None:
            return -1
        candidates: list[tuple[str | int, bool]] = []
        if self._fd >= 0:  # inherited across fork
            candidates += [(f"/proc/self/fd/{self._fd}", False), (self._fd, False)]
        if self._origin is not None:
            candidates.append((f"/proc/{self._origin[0]}/fd/{self._origin[1]}", True))
        for c, check in candidates:
            try:
                fd = os.open(c, os.O_RDONLY | os.O_CLOEXEC) if isinstance(c, str) else os.dup(c)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == self.identity:
                    if check and self.same_generation is not None:
                        self.same_generation(fd)
                    return fd
            except (OSError, PackReplaced):
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        return -1

    def _open_path(self) -> int:
        """Open the path (or, when it is gone, an ``alternates`` path). Opened again after the
        first time, the file must pass ``same_generation`` whatever its inode number (one freed
        by a publish is soon given to a newer file); without that check, only the very same
        inode is accepted."""
        fd = -1
        for location in (self.location, *self.alternates):
            try:
                fd = os.open(location, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                break
            except FileNotFoundError as e:
                if location == self.location and self.identity is not None and self.alternates:
                    continue  # e.g. INDEX.partial, renamed into place since: try where it went
                raise InputError(f"{location}: no such file") from e
            except IsADirectoryError as e:
                raise InputError(f"{location}: is a directory, not a pack") from e
            except OSError as e:
                raise _storage_error(location, e) from e
        if fd < 0:
            raise InputError(f"{self.location}: no such file")
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            raise InputError(f"{self.location}: is a directory, not a pack")
        ident = (st.st_dev, st.st_ino)
        if self.identity is not None:
            try:
                if self.same_generation is not None:
                    self.same_generation(fd)
                elif ident != self.identity:
                    raise PackReplaced(
                        f"{self.location}: the file was replaced since this handle opened it, and the "
                        "version it opened can no longer be reached; open it again"
                    )
            except BaseException:
                os.close(fd)
                raise
        self.identity = ident
        return fd

    def size(self) -> int:
        """The current size of the file (one ``fstat``)."""
        try:
            return os.fstat(self.fileno()).st_size
        except OSError as e:
            raise _storage_error(self.location, e) from e

    def read_at(self, offset: int, length: int) -> bytes:
        """Read exactly ``length`` bytes at ``offset`` (short only at end of file)."""
        fd = self._fd if self._pid == this_process.pid else self.fileno()  # (a call less per frame)
        try:
            data = os.pread(fd, length, offset)
            if len(data) == length or not data:
                return data
            parts = [data]
            got = len(data)
            while got < length:
                more = os.pread(fd, length - got, offset + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            return b"".join(parts)
        except OSError as e:
            raise _storage_error(self.location, e) from e
        except MemoryError:
            raise OutOfMemory(
                f"{self.location}: not enough memory to read {length} bytes at offset {offset} (the process may not take that much)"
            ) from None

    def preader(self) -> Callable[[int, int], bytes]:
        """``pread(length, offset)`` bound to this process's descriptor: the cheapest way to read
        many ranges (no Python frame per call). It may return short at the end of the file and
        raises ``OSError`` untranslated: callers check lengths and use ``read_at`` to finish or
        to fail with the path."""
        return functools.partial(os.pread, self.fileno())

    def prefetch(self, offsets: Sequence[int], lengths: Sequence[int]) -> None:
        """Tell the kernel about these ranges at once (WILLNEED), so one thread's reads overlap."""
        will_need(self.fileno(), offsets, lengths)

    def advise_sequential(self, start: int) -> None:
        """A bigger read-ahead from ``start`` on: the caller will read sequentially."""
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fileno(), start, 0, os.POSIX_FADV_SEQUENTIAL)

    def stream(self) -> Any:
        """A read-only file object over this same file with its own position, for readers that
        want one, such as pyarrow's Parquet reader: a native pyarrow file opened on
        ``/proc/self/fd/N`` where there is one (the same file, whatever the path names now),
        else a ``pread``-backed Python stream."""
        fd = self.fileno()
        if os.path.isdir("/proc/self/fd"):
            import pyarrow as pa  # only its users ask for a stream

            try:
                return pa.OSFile(f"/proc/self/fd/{fd}")
            except OSError:
                pass
        return _PreadStream(self)

    def is_at_path(self) -> bool:
        """Whether the path still names the file this handle reads (False once it was replaced)."""
        try:
            st = os.stat(self.location)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def held(self) -> _Held:
        """A batch of reads in flight (``with storage.held(): ...``): a ``close()`` meanwhile
        (another thread's) leaves the descriptor to the last of them. Closed at once, its number
        could be given to another file that the rest of the batch would then read."""
        return _Held(self)

    def _enter(self) -> None:
        pid = this_process.pid
        with self._lock:
            if self._users_pid != pid:  # a forked child starts with none of its parent's
                self._users, self._users_pid, self._closing = 0, pid, False
            self._users += 1

    def _leave(self) -> None:
        with self._lock:
            self._users -= 1
            if not self._users and self._closing:
                self._close_now()

    @property
    def closing(self) -> bool:
        """A ``close()`` waits for batches in flight: the descriptor is about to go (nothing may
        keep its number for later reads)."""
        return self._closing and self._users_pid == this_process.pid

    def close(self) -> None:
        """Close the descriptor now, or, while reads are in flight (``held``), when the last ends."""
        with self._lock:
            if self._users and self._users_pid == this_process.pid:
                self._closing = True
                return
            self._close_now()

    def _close_now(self) -> None:
        if self._fd >= 0 and self._pid == this_process.pid:
            os.close(self._fd)
        self._fd, self._pid, self._closing = -1, -1, False

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def origin(self) -> tuple[int, int, int, int] | None:
        """(pid, fd, st_dev, st_ino): how another process on this host can reach this same file."""
        if self._fd >= 0:
            try:
                self.fileno()  # this process's own descriptor (a fork's child reattaches first)
            except HframeError:
                pass
        if self._fd >= 0 and self._pid == this_process.pid and self.identity is not None:
            return (self._pid, self._fd, *self.identity)
        return self._origin

    def __getstate__(self) -> dict[str, object]:
        return {"location": self.location, "origin": self.origin}

    def __setstate__(self, state: dict[str, object]) -> None:
        origin = state.get("origin")
        self.__init__(str(state["location"]), origin=tuple(origin) if origin else None)  # type: ignore[misc,arg-type]


class _PreadStream(io.RawIOBase):
    """A seekable read-only stream over a ``LocalFile`` (own position, ``pread`` underneath)."""

    def __init__(self, file: LocalFile) -> None:
        self._file = file
        self._pos = 0
        self._size = file.size()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = os.preadv(self._file.fileno(), [view], self._pos) if len(view) else 0
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._size - self._pos)
        data = self._file.read_at(self._pos, size)
        self._pos += len(data)
        return data


#: URI scheme → opener. ``open_storage`` is the one place a location is parsed; a remote backend
#: registers its scheme here (``register_scheme``) and every command and reader can use it.
_SCHEMES: dict[str, Callable[..., Storage]] = {}


def register_scheme(scheme: str, opener: Callable[..., Storage]) -> None:
    """Make ``open_storage`` open ``scheme://...`` locations with ``opener(location, **options)``."""
    _SCHEMES[scheme.lower()] = opener


def _remote(location: str, **options: Any) -> Storage:
    from .http import RemoteFile  # only remote commands load the clients

    return RemoteFile(location, **options)


def _not_supported_yet(location: str, **options: Any) -> LocalFile:
    scheme = location.partition("://")[0]
    raise InputError(f"{location}: remote storage ({scheme}://) is not supported by this release yet")


def _file_uri(location: str, **options: Any) -> LocalFile:
    return LocalFile(location[len("file://") :], **options)


register_scheme("file", _file_uri)
for _scheme in REMOTE_SCHEMES:
    register_scheme(_scheme, _not_supported_yet if SCHEMES[_scheme] == "unsupported" else _remote)


def open_storage(location: str | os.PathLike[str], **options: Any) -> Storage:
    """Open a pack location for reading: a local path, or ``scheme://...`` through the opener
    registered for that scheme. ``options`` go to the opener (``LocalFile``: ``origin``,
    ``same_generation``). A remote location that ``opening_ahead`` is opening already is taken
    from it (its first request made once, not twice)."""
    loc = os.fspath(location)
    if _AHEAD and options.keys() <= _HINTS:
        with _AHEAD_LOCK:
            ahead = _AHEAD.pop((os.getpid(), loc), None)
        if ahead is not None:
            return ahead.result()  # (what it raised, it raises here: as opening it now would)
    return _open_now(loc, **options)


#: options of ``open_storage`` that say what to fetch with a remote open (``RemoteFile``'s
#: ``whole`` and ``tail``) and where its answers are kept (``kept``): a local file has no use for them
_HINTS = frozenset({"whole", "tail", "kept"})


def _open_now(loc: str, **options: Any) -> Storage:
    scheme, sep, _ = loc.partition("://")
    if not sep:
        return LocalFile(loc, **{k: v for k, v in options.items() if k not in _HINTS})
    opener = _SCHEMES.get(scheme.lower())
    if opener is None:
        raise InputError(f"{loc}: unknown URI scheme {scheme!r}")
    return opener(loc, **options)


#: (process id, location) → a remote open under way (``opening_ahead``)
_AHEAD: dict[tuple[int, str], Future[Storage]] = {}
_AHEAD_LOCK = threading.Lock()


@contextlib.contextmanager
def opening_ahead(locations: Sequence[str], hints: dict[str, dict[str, Any]] | None = None) -> Iterator[None]:
    """Open the remote ``locations`` at once, each on its own thread, while the block runs:
    opening a remote pack reads a manifest (is it a dataset?), the pack and its index, and each
    first request is a round trip; made together they cost one. ``hints`` are a location's
    ``whole``/``tail`` options (what its open fetches: an index whole, a pack's trailer).
    ``open_storage`` of one of them in the block takes its open; what the block did not take is
    closed at its end (on a worker thread, when it is still under way: an interrupted block does
    not wait for the network)."""
    remote = [loc for loc in dict.fromkeys(locations) if is_remote(loc)]
    if len(remote) < 2:
        yield
        return
    hints = hints or {}
    pool = ThreadPoolExecutor(len(remote), thread_name_prefix="hframe-open")
    keys = [(os.getpid(), loc) for loc in remote]
    with _AHEAD_LOCK:
        for key, loc in zip(keys, remote):
            _AHEAD[key] = pool.submit(_open_now, loc, **hints.get(loc, {}))
    pool.shutdown(wait=False)  # (its threads end with their opens)
    try:
        yield
    finally:
        with _AHEAD_LOCK:
            left = [f for key in keys if (f := _AHEAD.pop(key, None)) is not None]
        for f in left:
            f.add_done_callback(_close_opened)


def _close_opened(opened: Future[Storage]) -> None:
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()


#: ``looks_cold``: a read taking longer than this plus its bytes at this rate came from the disk
_COLD_FIXED_S = 100e-6
_COLD_BYTES_PER_S = 2e9


def will_need(fd: int, offsets: Sequence[int], lengths: Sequence[int]) -> None:
    """Tell the kernel about these ranges of ``fd`` at once (WILLNEED), so one thread's reads
    of them overlap on the disk."""
    if hasattr(os, "posix_fadvise"):
        advise, willneed = os.posix_fadvise, os.POSIX_FADV_WILLNEED
        try:
            for off, ln in zip(offsets, lengths):
                advise(fd, off, ln, willneed)
        except OSError:
            pass  # advice only (a descriptor closed meanwhile): the reads say what is wrong


def looks_cold(seconds: float, nbytes: int) -> bool:
    """A local read slower than a page-cache copy could be: what it read, and probably its
    neighbours of the same batch, were not in memory (then tell the kernel about the rest at
    once, ``LocalFile.prefetch``)."""
    return seconds > _COLD_FIXED_S + nbytes / _COLD_BYTES_PER_S


def evict_from_page_cache(path: str | os.PathLike[str]) -> bool:
    """Ask the kernel to drop ``path`` from the page cache (any user). False if unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
            return False
        raise
    finally:
        os.close(fd)
