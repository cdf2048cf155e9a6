"""Members of tar and zip archives as sources (``pack --from tar|zip``), read in place.

A member is a source like a file: a name (its path in the archive, normalized as ``tar xf``
would create it), a size and a modification time. Its bytes are read where they sit in the
archive: a plain tar and a stored zip member hold them as one range of the archive file, a
deflated zip member as one compressed range. So an archive is listed once (its headers only)
and every member is then read with one ``pread``, by the same loaders, threads and packing
workers as files, in name order: the frames, their names, times and bytes are those of packing
the extracted folder, without extracting it.

Where a member's bytes are is kept in the source's path, as a *locator*: the archive's path and
the member's place, joined by NUL bytes. A NUL can never be in a file's path (the kernel refuses
it), so a locator is never taken for a file, and every source list, checkpoint and worker carries
it unchanged. ``shown`` turns one into ``ARCHIVE:MEMBER`` for messages.

Reading checks the archive against the size and time it had when it was listed: a member of an
archive rewritten since is refused ("changed"), never read at a stale offset. A zip member is
also checked against its CRC-32, and is never inflated past the size its header gives (a bomb
cannot take more memory than ``--max-frame-bytes``).
"""

from __future__ import annotations

import io
import os
import stat
import struct
import tarfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import BinaryIO

from ..errors import InputError

__all__ = [
    "ARCHIVE_KINDS",
    "ArchiveEntry",
    "MemberChanged",
    "archive_of",
    "is_member",
    "list_archive",
    "member_unchanged",
    "open_source",
    "provenance",
    "read_member",
    "shown",
]

#: What ``--from`` accepts.
ARCHIVE_KINDS = ("tar", "zip")

_SEP = "\0"
_STORED, _DEFLATED = 0, 8
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_ZIP_LOCAL = struct.Struct("<4s2B4HL2L2H")  # a zip local file header (30 bytes)
_COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}


class MemberChanged(OSError):
    """The archive is not the file it was when the member was listed."""


@dataclass(frozen=True, slots=True)
class _Locator:
    archive: str
    member: str  # as the archive names it (for messages)
    offset: int
    stored: int
    method: int
    crc32: int  # -1: none (tar)
    archive_size: int
    archive_mtime_ns: int

    def encode(self) -> str:
        fields = (self.offset, self.stored, self.method, self.crc32, self.archive_size, self.archive_mtime_ns)
        return _SEP.join([self.archive, *map(str, fields), self.member])


def is_member(path: str) -> bool:
    """Whether a source's path is a member's locator (not a file)."""
    return _SEP in path


def _parse(path: str) -> _Locator:
    archive, offset, stored, method, crc, asize, amtime, member = path.split(_SEP, 7)
    return _Locator(archive, member, int(offset), int(stored), int(method), int(crc), int(asize), int(amtime))


def shown(path: str) -> str:
    """A source's path for people: a file's as it is, a member's as ``ARCHIVE:MEMBER``."""
    if _SEP not in path:
        return path
    loc = _parse(path)
    return f"{loc.archive}:{loc.member}"


def provenance(path: str) -> str | None:
    """Where a member came from, for the frame's ``source`` metadata: the archive's file name
    and the member's name in it (``train-000001.tar:000123.jpg``; no folder, so that the same
    archive packed anywhere gives the same bytes; bytes that are not UTF-8 as ``\\xNN``, as
    the index's ``name`` column shows them). None for a file."""
    if _SEP not in path:
        return None
    loc = _parse(path)
    text = os.fsencode(f"{os.path.basename(loc.archive)}:{loc.member}")
    return text.decode("utf-8", "backslashreplace")  # (a name that is not UTF-8 shown as \\xNN)


def archive_of(path: str) -> str:
    """The archive a member's locator points into."""
    return path.split(_SEP, 1)[0]


def member_unchanged(path: str) -> bool:
    """Whether a member's archive is still the file it was listed from (same size and time)."""
    loc = _parse(path)
    try:
        st = os.stat(loc.archive)
    except OSError:
        return False
    return (st.st_size, st.st_mtime_ns) == (loc.archive_size, loc.archive_mtime_ns)


# -- reading ---------------------------------------------------------------------------------


class _Range(io.RawIOBase):
    """The ``stored`` bytes at ``offset`` of a descriptor, read with ``pread`` (it closes it)."""

    def __init__(self, fd: int, offset: int, stored: int) -> None:
        super().__init__()
        self.fd, self.pos, self.end = fd, offset, offset + stored

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.end - self.pos)
        if n <= 0:
            return 0
        data = os.pread(self.fd, n, self.pos)
        if not data:
            raise MemberChanged("the archive ends before this member does (truncated)")
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        super().close()


class _Checked(io.RawIOBase):
    """A member's raw bytes from ``source`` (inflated when deflated), never more than ``size``
    of them, checked at the end: exactly ``size`` bytes, and the CRC-32 when there is one."""

    def __init__(self, source: _Range, loc: _Locator, size: int) -> None:
        super().__init__()
        self.source, self.loc, self.left = source, loc, size
        self.inflate = zlib.decompressobj(-15) if loc.method == _DEFLATED else None
        self.crc = 0
        self.pending = b""
        self.done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self.left)
        if want <= 0:
            self._finish()
            return 0
        try:
            data = self._more(want)
        except zlib.error as e:
            raise MemberChanged(f"cannot be inflated ({e}; damaged archive)") from None
        if not data:
            raise MemberChanged(f"holds {self.left} bytes fewer than its header says (damaged archive)")
        buffer[: len(data)] = data
        self.left -= len(data)
        if self.loc.crc32 >= 0:
            self.crc = zlib.crc32(data, self.crc)
        if self.left == 0:
            self._finish()
        return len(data)

    def _more(self, want: int) -> bytes:
        if self.inflate is None:
            return self.source.read(want) or b""
        while True:
            if self.pending:
                out = self.inflate.decompress(self.pending, want)
                self.pending = self.inflate.unconsumed_tail
                if out:
                    return out
            if self.inflate.eof:
                return b""
            chunk = self.source.read(1 << 20)
            if not chunk:
                return self.inflate.flush(want) if not self.inflate.eof else b""
            self.pending = chunk

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            more = self.inflate.decompress(self.pending, 1) if self.inflate is not None and self.pending else b""
        except zlib.error as e:
            raise MemberChanged(f"cannot be inflated ({e}; damaged archive)") from None
        if more:
            raise MemberChanged("inflates to more bytes than its header says (damaged archive)")
        if self.loc.crc32 >= 0 and self.crc != self.loc.crc32:
            raise MemberChanged("does not match its CRC-32 (damaged archive)")

    def close(self) -> None:
        self.source.close()
        super().close()


def open_source(path: str, size: int) -> BinaryIO:
    """A source's bytes as a binary stream: a file opened, or a member read in place (see the
    module's notes; ``MemberChanged`` when its archive changed or is damaged)."""
    if _SEP not in path:
        return open(path, "rb")
    loc = _parse(path)
    fd = os.open(loc.archive, _O_READ)
    try:
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != (loc.archive_size, loc.archive_mtime_ns):
            raise MemberChanged(f"{loc.archive} changed since it was listed")
    except BaseException:
        os.close(fd)
        raise
    return io.BufferedReader(_Checked(_Range(fd, loc.offset, loc.stored), loc, size), 1 << 20)


def read_member(path: str, size: int) -> bytes:
    """A member's bytes, whole, checked as ``open_source`` says: the packing loop's path for
    every member up to ``loading.STREAM_ABOVE``, with one ``pread`` and no stream objects."""
    loc = _parse(path)
    fd = os.open(loc.archive, _O_READ)
    try:
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != (loc.archive_size, loc.archive_mtime_ns):
            raise MemberChanged(f"{loc.archive} changed since it was listed")
        raw = os.pread(fd, loc.stored, loc.offset)
        while len(raw) < loc.stored:  # (a short read of a regular file: rare, but allowed)
            more = os.pread(fd, loc.stored - len(raw), loc.offset + len(raw))
            if not more:
                raise MemberChanged("the archive ends before this member does (truncated)")
            raw += more
    finally:
        os.close(fd)
    if loc.method == _DEFLATED:
        inflate = zlib.decompressobj(-15)
        try:
            data = inflate.decompress(raw, size)  # never more than the header says
            more = inflate.decompress(inflate.unconsumed_tail, 1) if inflate.unconsumed_tail else b""
        except zlib.error as e:
            raise MemberChanged(f"cannot be inflated ({e}; damaged archive)") from None
        if len(data) < size:
            raise MemberChanged(f"holds {size - len(data)} bytes fewer than its header says (damaged archive)")
        if more:
            raise MemberChanged("inflates to more bytes than its header says (damaged archive)")
    else:
        data = raw
    if loc.crc32 >= 0 and zlib.crc32(data) != loc.crc32:
        raise MemberChanged("does not match its CRC-32 (damaged archive)")
    return data


# -- listing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArchiveEntry:
    """One member found in an archive: a regular file's ``name`` (normalized) and where to read
    it (``path``, a locator); or, with ``problem`` set, a member that is not packed and why."""

    name: str
    path: str
    size: int
    mtime_ns: int
    problem: str | None = None


def member_name(raw: str) -> str | None:
    """A member's name as ``tar xf`` creates it: leading ``/`` and ``./`` dropped, ``a/./b`` as
    ``a/b``; None for a name with a ``..`` component (tar refuses to extract those) or none left."""
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
        return None
    return "/".join(parts)


def list_archive(path: str, kind: str) -> Iterator[ArchiveEntry]:
    """The members of the archive ``path`` (``kind`` tar or zip), in archive order.

    Raises:
        InputError: not an archive of that kind, compressed in a way not read in place, or
            damaged where its headers are.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: --from {kind} needs an archive file")
    with open(path, "rb") as f:
        head = f.read(8)
    for magic, what in _COMPRESSED_MAGIC.items():
        if kind == "tar" and head.startswith(magic):
            raise InputError(
                f"{path}: a {what}-compressed archive; --from {kind} reads plain tar and zip files in place "
                f"(decompress it first, e.g. with {'gunzip' if what == 'gzip' else what} -d)"
            )
    if kind == "tar":
        yield from _list_tar(path, st)
    elif kind == "zip":
        yield from _list_zip(path, st)
    else:
        raise InputError(f"--from {kind}: not a kind of archive hframe reads ({', '.join(ARCHIVE_KINDS)})")


def _tar_mtime_ns(info: tarfile.TarInfo) -> int:
    exact = info.pax_headers.get("mtime")
    if exact is not None:
        try:
            return int(Decimal(exact) * 1_000_000_000)
        except ArithmeticError:
            pass
    return int(info.mtime) * 1_000_000_000


_TAR_KINDS: dict[bytes, str] = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
}


def _list_tar(path: str, st: os.stat_result) -> Iterator[ArchiveEntry]:
    try:
        tf = tarfile.open(path, "r:", errorlevel=2)
    except tarfile.ReadError as e:
        raise InputError(f"{path}: not a tar archive ({e})") from None
    with tf:
        while True:
            try:
                info = tf.next()
            except tarfile.ReadError as e:
                raise InputError(f"{path}: damaged or truncated after {tf.offset} bytes ({e})") from None
            if info is None:
                return
            tf.members.clear()  # type: ignore[attr-defined]  # bounded memory for millions of members
            yield _tar_entry(path, st, info)


def _tar_entry(path: str, st: os.stat_result, info: tarfile.TarInfo) -> ArchiveEntry:
    raw = info.name
    name = member_name(raw)
    shown_at = f"{path}:{raw}"
    if info.isdir():
        return ArchiveEntry(raw, shown_at, 0, 0, problem="")  # (a folder: nothing to say)
    if name is None:
        return ArchiveEntry(raw, shown_at, 0, 0, problem="member name contains '..' (skipped, as tar does)")
    kind = _TAR_KINDS.get(info.type)
    if kind is not None:
        return ArchiveEntry(name, shown_at, 0, 0, problem=f"{kind} (skipped)")
    if info.issparse():
        return ArchiveEntry(name, shown_at, 0, 0, problem="a sparse member (not supported; skipped)")
    if not info.isreg():
        return ArchiveEntry(name, shown_at, 0, 0, problem="not a regular file (skipped)")
    if info.offset_data + info.size > st.st_size:
        raise InputError(f"{path}: truncated: member {raw!r} ends past the end of the archive")
    loc = _Locator(path, raw, info.offset_data, info.size, _STORED, -1, st.st_size, st.st_mtime_ns)
    return ArchiveEntry(name, loc.encode(), info.size, _tar_mtime_ns(info))


def _zip_raw_name(info: zipfile.ZipInfo) -> str:
    """The member's name as the bytes it was stored with (``os.fsdecode``-able): zipfile decodes
    names as UTF-8 when flagged so, else as CP437, which gives the bytes back unchanged."""
    raw = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
    return os.fsdecode(raw)


def _zip_mtime_ns(info: zipfile.ZipInfo) -> int:
    """The Unix time of the member's "UT" extra field (what ``unzip`` sets), else its DOS time
    read as local time (as ``unzip`` does)."""
    extra = info.extra
    i = 0
    while i + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, i)
        if tag == 0x5455 and n >= 5 and extra[i + 4] & 1:
            return int(struct.unpack_from("<i", extra, i + 5)[0]) * 1_000_000_000
        i += 4 + n
    return int(time.mktime((*info.date_time, 0, 0, -1))) * 1_000_000_000


def _list_zip(path: str, st: os.stat_result) -> Iterator[ArchiveEntry]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise InputError(f"{path}: not a zip archive, or its directory is damaged ({e})") from None
    with zf, open(path, "rb") as f:
        for info in zf.infolist():
            yield _zip_entry(path, st, f, info)


def _zip_entry(path: str, st: os.stat_result, f: BinaryIO, info: zipfile.ZipInfo) -> ArchiveEntry:
    raw = _zip_raw_name(info)
    shown_at = f"{path}:{raw}"
    if info.is_dir():
        return ArchiveEntry(raw, shown_at, 0, 0, problem="")
    name = member_name(raw)
    if name is None:
        return ArchiveEntry(raw, shown_at, 0, 0, problem="member name contains '..' (skipped, as unzip does)")
    if stat.S_ISLNK(info.external_attr >> 16):
        return ArchiveEntry(name, shown_at, 0, 0, problem="a symbolic link (skipped)")
    if info.flag_bits & 0x1:
        return ArchiveEntry(name, shown_at, 0, 0, problem="encrypted (skipped)")
    if info.compress_type not in (_STORED, _DEFLATED):
        return ArchiveEntry(
            name, shown_at, 0, 0, problem=f"compressed with method {info.compress_type} (stored or deflated only)"
        )
    f.seek(info.header_offset)
    local = f.read(_ZIP_LOCAL.size)
    if len(local) < _ZIP_LOCAL.size or local[:4] != b"PK\x03\x04":
        raise InputError(f"{path}: damaged: member {raw!r} has no local header at offset {info.header_offset}")
    fields = _ZIP_LOCAL.unpack(local)
    data_at = info.header_offset + _ZIP_LOCAL.size + fields[10] + fields[11]
    if data_at + info.compress_size > st.st_size:
        raise InputError(f"{path}: truncated: member {raw!r} ends past the end of the archive")
    loc = _Locator(path, raw, data_at, info.compress_size, info.compress_type, info.CRC, st.st_size, st.st_mtime_ns)
    return ArchiveEntry(name, loc.encode(), info.file_size, _zip_mtime_ns(info))
