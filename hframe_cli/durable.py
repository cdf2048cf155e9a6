"""Files that appear whole or not at all: written as ``NAME.partial``, fsynced, renamed over
``NAME``, and the folder fsynced, so that after a crash a reader finds the old file or the new
one, never a torn one (``man/hframe.5``, CRASH SAFETY)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from .names import partial_name

__all__ = ["fsync_dir", "later_than_replaced", "replaced", "special_file", "write_atomically"]


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


def later_than_replaced(new: str | os.PathLike[str], old: str | os.PathLike[str], *, durable: bool = False) -> None:
    """Before ``new`` is renamed over ``old``: give ``new`` an mtime in a later whole second
    than ``old``'s, when it is not already (and fsync it then, with ``durable``).

    A static web server names a file's version by its mtime in whole seconds and its size
    (nginx's ETag is ``"MTIME-SIZE"`` in hex; Last-Modified has seconds): two versions of one
    size written within a second would carry one ETag, and a reader pinned to the first by
    ``If-Match`` would be served the second's bytes at the first's offsets (``man/hframe.5``,
    PUBLISHING AND READERS). So each version of a path gets a later second than the one before
    (sizes aside: with S, S', S in one second the third would carry the first's ETag);
    publishes of one path follow each other, under its lock, and mtimes run ahead of the clock
    by at most a second per publish made within the same second."""
    try:
        was, now = os.stat(old), os.stat(new)
    except FileNotFoundError:
        return
    second = int(was.st_mtime)
    if int(now.st_mtime) <= second:
        os.utime(new, ns=(now.st_atime_ns, (second + 1) * 1_000_000_000))
        if durable:
            _fsync_file(os.fspath(new))


def special_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a device, a pipe or a socket (through any link: ``/dev/stdout``,
    ``/dev/null``, a named pipe): written into as it is, never replaced by a file (a rename
    over ``/dev/null`` as root would leave a regular file there)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextmanager
def replaced(path: str | os.PathLike[str], *, durable: bool = True, temp: str | None = None) -> Iterator[str]:
    """The name to write ``path``'s new content to (``PATH.partial``, or ``temp``); when the block
    ends normally it is given a later mtime second than ``path`` (``later_than_replaced``),
    fsynced and renamed over ``path`` (then the folder fsynced), and when it raises it is
    removed and ``path`` is left as it was. ``durable=False`` skips the fsyncs, for files a
    crash may lose but must never tear (a report). A device or pipe (``special_file``:
    ``-o /dev/stdout``) is written into as it is."""
    final = os.fspath(path)
    if special_file(final):
        yield final
        return
    tmp = temp if temp is not None else partial_name(final)
    try:
        yield tmp
        later_than_replaced(tmp, final)
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
