"""Compressed tars (gzip, bzip2, xz, zstd), and tars at a URL: read forward, never in place.

A compressed archive has no place where a member's bytes sit: they exist only as the
decompressor reaches them. So such a tar is listed by decompressing it once, front to back,
its headers walked over a ``Forward`` view (the bytes from the lowest place still wanted on,
never a member's data unless asked), and each member's locator keeps its offset in the
*decompressed* stream. Reading then decompresses once more, front to back: a ``Cursor`` per
archive (per process) stands where the last member ended, and a member further on is reached
by decompressing past the ones in between. Members are therefore packed in archive order
(``inputs.py``), by one loader, and a member behind the cursor (a resume, a retried read)
starts the archive again from its first byte.

A tar at a URL (``s3://bucket/train-000001.tar``, ``https://...``) is read the same way, plain
(``plain``) or compressed: fetched front to back in sequential blocks under the remote request
policy, once to list it and once to pack it, never stored. What says it is still the archive
listed is its size and ETag (a local archive's: its size and time).

Imports inside functions: ``zstandard``, only for a zstd-compressed archive.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import threading
import zlib
from typing import Any, BinaryIO

from ..errors import InputError
from ..locations import is_remote, shown_url
from ..storage.access import open_storage
from .locator import SourceChanged

__all__ = ["CODECS", "Forward", "codec_of", "open_decompressed", "open_raw", "read_forward", "stamp_of"]

#: first bytes → codec
CODECS = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}
_CHUNK = 1 << 20
_STEP = 64 << 10


def codec_of(head: bytes) -> str | None:
    """The compression a file's first bytes show, or None."""
    return next((codec for magic, codec in CODECS.items() if head.startswith(magic)), None)


def open_decompressed(path: str, codec: str) -> BinaryIO:
    """The archive at ``path`` (a file, or a URL: ``open_raw``) decompressed, as a forward
    stream (every frame or member of it, as ``tar`` reads a concatenated ``.gz``); ``plain``:
    as it is."""
    raw = open_raw(path)
    try:
        if codec == "plain":
            return raw
        if codec == "gzip":
            return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
        if codec == "bzip2":
            return bz2.BZ2File(raw, "rb")  # type: ignore[return-value]
        if codec == "xz":
            return lzma.LZMAFile(raw, "rb")  # type: ignore[return-value]
        if codec == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    except BaseException:
        raw.close()
        raise
    raw.close()
    raise ValueError(f"unknown codec {codec!r}")


def open_raw(path: str) -> BinaryIO:
    """The bytes of an archive, front to back: a file opened, or a URL read in sequential
    blocks, several ahead, under the remote request policy (``storage/http.RemoteFile``)."""
    if not is_remote(path):
        return open(path, "rb")
    return io.BufferedReader(_RemoteReader(open_storage(path)), _CHUNK)


def stamp_of(path: str) -> tuple[int, int]:
    """What says an archive is still the one listed: a file's size and time; a URL's size and
    a number made from its ETag (0 without one: then its size alone)."""
    if not is_remote(path):
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns
    with open_storage(path) as f:
        return f.size(), _tag_number(f.etag)


def _tag_number(etag: str | None) -> int:
    return zlib.crc32(etag.encode()) if etag else 0


class _RemoteReader(io.RawIOBase):
    """A remote object read front to back (``RemoteFile.advise_sequential``); closes it."""

    def __init__(self, remote: Any) -> None:
        super().__init__()
        self.remote, self.pos = remote, 0
        self.stamp = (remote.size(), _tag_number(remote.etag))
        remote.advise_sequential(0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.remote.read_at(self.pos, len(buffer))
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.remote.close()
        super().close()


_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)


def _decompress_error(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return f"cannot be decompressed ({text}; damaged or truncated archive)"


class Forward:
    """The bytes of a forward stream as the tar walker asks for them (``archives._walk_tar``):
    ``get(a, b)`` the bytes in [a, b) (short at the end), ``has(end)`` whether the stream
    reaches ``end`` (bytes before it, not asked for, are let go unread into memory). Asking
    behind what was let go is an error of the caller's."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        # one decompression step at a time: bytes before a damaged place are all given out first
        self.read_some = getattr(stream, "read1", stream.read)
        self.base = 0  # offset of buf[0]
        self.buf = bytearray()
        self.eof = False

    def _fill(self, end: int) -> None:
        while not self.eof and self.base + len(self.buf) < end:
            try:
                chunk = self.read_some(_STEP)
            except _ERRORS as e:
                raise SourceChanged(_decompress_error(e)) from None
            if not chunk:
                self.eof = True
            self.buf += chunk

    def _drop_to(self, start: int) -> None:
        if start < self.base:
            raise ValueError("a forward stream cannot go back")
        cut = min(start - self.base, len(self.buf))
        del self.buf[:cut]
        self.base += cut

    def get(self, start: int, end: int) -> bytes:
        if start > self.base + len(self.buf):
            self.has(start)  # skipped without holding what lies before it
        self._drop_to(min(start, self.base + len(self.buf)))
        self._fill(end)
        return bytes(self.buf[start - self.base : end - self.base])

    def has(self, end: int) -> bool:
        """Whether the stream holds ``end`` bytes; what comes before ``end`` is skipped."""
        while self.base + len(self.buf) < end and not self.eof:
            self._drop_to(self.base + len(self.buf))
            try:
                chunk = self.read_some(min(_STEP, end - self.base - len(self.buf)))
            except _ERRORS as e:
                raise SourceChanged(_decompress_error(e)) from None
            if not chunk:
                self.eof = True
            self.buf += chunk
        return self.base + len(self.buf) >= end


class _Cursor:
    """One archive decompressed up to ``pos``, for the next member at or after it."""

    def __init__(self, path: str, codec: str, stamp: tuple[int, int]) -> None:
        try:
            now = stamp_of(path)
        except InputError as e:  # (a URL the store no longer has)
            raise SourceChanged(str(e)) from None
        if now != stamp:
            raise SourceChanged(f"{shown_url(path)} changed since it was listed")
        self.stream = open_decompressed(path, codec)
        self.pos = 0
        self.lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        skip = offset - self.pos
        while skip > 0:
            chunk = self.stream.read(min(_CHUNK, skip))
            if not chunk:
                raise SourceChanged("the archive ends before this member does (truncated)")
            skip -= len(chunk)
        parts, want = [], size
        while want > 0:
            chunk = self.stream.read(want)
            if not chunk:
                raise SourceChanged("the archive ends before this member does (truncated)")
            parts.append(chunk)
            want -= len(chunk)
        self.pos = offset + size
        return b"".join(parts)

    def close(self) -> None:
        try:
            self.stream.close()
        except _ERRORS:
            pass


_CURSORS: dict[tuple[Any, ...], _Cursor] = {}
_CURSORS_LOCK = threading.Lock()
_CURSORS_PID = [os.getpid()]


def read_forward(path: str, codec: str, offset: int, size: int, stamp: tuple[int, int]) -> bytes:
    """``size`` bytes at ``offset`` of the decompressed archive ``path`` (of size and time
    ``stamp`` when listed), from this process's cursor on it: forward from where the last read
    ended, or from the start again for a place behind it."""
    key = (path, codec, stamp)
    with _CURSORS_LOCK:
        if _CURSORS_PID[0] != os.getpid():  # a forked child: the parent's cursors are not its own
            _CURSORS.clear()
            _CURSORS_PID[0] = os.getpid()
        cursor = _CURSORS.get(key)
        if cursor is None or cursor.pos > offset:
            if cursor is not None:
                cursor.close()
            for old in [k for k in _CURSORS if k[0] == path]:  # a rewritten archive's old cursor
                _CURSORS.pop(old).close()
            cursor = _CURSORS[key] = _Cursor(path, codec, stamp)
    with cursor.lock:
        try:
            return cursor.read(offset, size)
        except _ERRORS as e:
            with _CURSORS_LOCK:
                if _CURSORS.get(key) is cursor:
                    del _CURSORS[key]
            cursor.close()
            if isinstance(e, SourceChanged):
                raise
            raise SourceChanged(_decompress_error(e)) from None
