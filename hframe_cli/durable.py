"""Files that appear whole or not at all: written as ``NAME.partial``, fsynced, renamed over
``NAME``, and the folder fsynced, so that after a crash a reader finds the old file or the new
one, never a torn one (``man/hframe.5``, CRASH SAFETY)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from .names import partial_name

__all__ = ["fsync_dir", "replaced", "write_atomically"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the renames in folder ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def replaced(path: str | os.PathLike[str], *, durable: bool = True, temp: str | None = None) -> Iterator[str]:
    """The name to write ``path``'s new content to (``PATH.partial``, or ``temp``); when the block
    ends normally it is fsynced and renamed over ``path`` (then the folder fsynced), and when it
    raises it is removed and ``path`` is left as it was. ``durable=False`` skips the fsyncs, for
    files a crash may lose but must never tear (a report)."""
    final = os.fspath(path)
    tmp = temp if temp is not None else partial_name(final)
    try:
        yield tmp
        if durable:
            _fsync_file(tmp)
        os.replace(tmp, final)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(final)))


def write_atomically(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = True) -> None:
    """``path`` holds ``data`` (text as UTF-8), whole, or keeps what it held."""
    with replaced(path, durable=durable) as tmp, open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
