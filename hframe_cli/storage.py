"""File access behind one small interface: the only module that opens packs for reading.

``open_storage(uri)`` is the single place where a location is parsed. Local paths get an
``os.pread`` fast path with a handle opened lazily per process, so a reader created before
``fork()`` (PyTorch DataLoader workers) never shares a file position or descriptor with its
parent. Remote schemes (``s3://``, ``gs://``, ``hdfs://``, ``http(s)://``) will plug in here
through ``pyarrow.fs`` without touching callers; this release refuses them clearly.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from typing import Protocol

from .errors import InputError, StorageError

__all__ = ["LocalFile", "Storage", "evict_from_page_cache", "open_storage"]

REMOTE_SCHEMES = ("s3", "gs", "gcs", "hdfs", "http", "https", "abfs", "az")


class Storage(Protocol):
    """What readers need from a pack location."""

    location: str

    def size(self) -> int: ...

    def read_at(self, offset: int, length: int) -> bytes: ...

    def close(self) -> None: ...


def _storage_error(location: str, err: OSError) -> StorageError:
    reason = err.strerror or str(err)
    return StorageError(f"{location}: {reason}")


class LocalFile:
    """A local file read with ``os.pread`` through a per-process descriptor."""

    def __init__(self, path: str) -> None:
        self.location = path
        self._fd = -1
        self._pid = -1
        self._lock = threading.Lock()
        self._size = -1
        self.fileno()  # fail now, with the path, if it cannot be opened

    def fileno(self) -> int:
        """The descriptor for this process, opening it on first use after a fork."""
        pid = os.getpid()
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:
                    try:
                        fd = os.open(self.location, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    except FileNotFoundError as e:
                        raise InputError(f"{self.location}: no such file") from e
                    except IsADirectoryError as e:
                        raise InputError(f"{self.location}: is a directory, not a pack") from e
                    except OSError as e:
                        raise _storage_error(self.location, e) from e
                    if stat.S_ISDIR(os.fstat(fd).st_mode):
                        os.close(fd)
                        raise InputError(f"{self.location}: is a directory, not a pack")
                    self._fd, self._pid = fd, pid
        return self._fd

    def size(self) -> int:
        """The current size of the file (one ``fstat``)."""
        try:
            return os.fstat(self.fileno()).st_size
        except OSError as e:
            raise _storage_error(self.location, e) from e

    def read_at(self, offset: int, length: int) -> bytes:
        """Read exactly ``length`` bytes at ``offset`` (short only at end of file)."""
        fd = self.fileno()
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

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd, self._pid = -1, -1

    def __getstate__(self) -> dict[str, object]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(str(state["location"]))  # type: ignore[misc]


def open_storage(location: str | os.PathLike[str]) -> LocalFile:
    """Open a pack location for reading: a local path (remote URIs come later)."""
    loc = os.fspath(location)
    scheme, sep, _ = loc.partition("://")
    if sep:
        if scheme == "file":
            return LocalFile(loc[len("file://") :])
        if scheme.lower() in REMOTE_SCHEMES:
            raise InputError(f"{loc}: remote storage ({scheme}://) is not supported by this release yet")
        raise InputError(f"{loc}: unknown URI scheme {scheme!r}")
    return LocalFile(loc)


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
