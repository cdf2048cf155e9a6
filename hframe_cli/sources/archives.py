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

import functools
import io
import mmap
import os
import re
import stat
import struct
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import BinaryIO, NamedTuple

from ..errors import InputError
from ..format.labels import is_member_label
from ..locations import is_remote, shown_url
from ..names import STDIN_SUFFIX
from .locator import SEP as _SEP
from .locator import SourceChanged, kind_of, tagged, untagged
from .streams import Forward, codec_of, open_decompressed, open_raw, read_forward, stamp_of

__all__ = [
    "ARCHIVE_KINDS",
    "ArchiveEntry",
    "MemberChanged",
    "archive_of",
    "is_member",
    "label_extension",
    "list_archive",
    "member_unchanged",
    "open_source",
    "provenance",
    "read_forward_only",
    "read_member",
    "member_meta",
    "read_member_and_meta",
    "shown",
]

#: What ``--from`` accepts.
ARCHIVE_KINDS = ("tar", "zip")

_STORED, _DEFLATED = 0, 8
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_ZIP_LOCAL = struct.Struct("<4s2B4HL2L2H")  # a zip local file header (30 bytes)


class MemberChanged(SourceChanged):
    """The archive is not the file it was when the member was listed (or is damaged there)."""


@dataclass(frozen=True, slots=True)
class _Locator:
    archive: str
    member: str  # as the archive names it (for messages)
    offset: int  # of the member's data: in the file, or in the decompressed stream (``codec``)
    stored: int
    method: int
    crc32: int  # -1: none (tar)
    archive_size: int
    archive_mtime_ns: int
    codec: str = ""  # a compressed tar's compression (``streams.py``): read forward, not in place
    label: str = ""  # its sample's label member's text (``--label-from .EXT``)

    def encode(self) -> str:
        fields = (self.offset, self.stored, self.method, self.crc32, self.archive_size, self.archive_mtime_ns)
        if not self.codec and not self.label:  # the first spelling (older checkpoints hold it)
            return _SEP.join([self.archive, *map(str, fields), self.member])
        return tagged(self.archive, _TAGGED, *fields, self.codec, self.label, self.member)


#: the tag of a member's locator that carries a codec or a label (``locator.tagged``)
_TAGGED = "member"
_TAGGED_FIELDS = 9


def is_member(path: str) -> bool:
    """Whether a source's path is an archive member's locator (``locator.kind_of``)."""
    return kind_of(path) in ("archive", _TAGGED)


def _parse(path: str) -> _Locator:
    if path.split(_SEP, 2)[1] == "":
        archive, f = untagged(path, _TAGGED_FIELDS)
        offset, stored, method, crc, asize, amtime = map(int, f[:6])
        return _Locator(archive, f[8], offset, stored, method, crc, asize, amtime, f[6], f[7])
    archive, offset_s, stored_s, method_s, crc_s, asize_s, amtime_s, member = path.split(_SEP, 7)
    return _Locator(
        archive, member, int(offset_s), int(stored_s), int(method_s), int(crc_s), int(asize_s), int(amtime_s)
    )


def read_forward_only(path: str) -> bool:
    """Whether a member is in a compressed tar (read forward, in archive order: ``streams.py``)."""
    return _parse(path).codec != ""


def shown(path: str) -> str:
    """A source's path for people: a file's as it is, a member's as ``ARCHIVE:MEMBER``."""
    if _SEP not in path:
        return path
    loc = _parse(path)
    return f"{shown_url(loc.archive) if is_remote(loc.archive) else loc.archive}:{loc.member}"


def provenance(path: str) -> str | None:
    """Where a member came from, for the frame's ``source`` metadata: the archive's file name
    and the member's name in it (``train-000001.tar:000123.jpg``; no folder, so that the same
    archive packed anywhere gives the same bytes; bytes that are not UTF-8 as ``\\xNN``, as
    the index's ``name`` column shows them). None for a file."""
    if _SEP not in path:
        return None
    return _source_of(_parse(path))


def _source_of(loc: _Locator) -> str:
    text = f"{_archive_shown(loc.archive)}:{loc.member}"
    if text.isascii():
        return text
    return os.fsencode(text).decode("utf-8", "backslashreplace")  # (a name that is not UTF-8 shown as \\xNN)


@functools.lru_cache(maxsize=64)
def _archive_shown(archive: str) -> str:
    """An archive's part of its members' ``source``: its file name (a URL's without its query),
    or ``-`` for standard input's copy."""
    if archive.endswith(STDIN_SUFFIX):
        return "-"
    return os.path.basename(archive.split("?", 1)[0] if is_remote(archive) else archive)


def archive_of(path: str) -> str:
    """The archive a member's locator points into."""
    return path.split(_SEP, 1)[0]


def member_unchanged(path: str) -> bool:
    """Whether a member's archive is still the file it was listed from (same size and time)."""
    loc = _parse(path)
    try:
        return stamp_of(loc.archive) == (loc.archive_size, loc.archive_mtime_ns)
    except (OSError, InputError):
        return False


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
    if loc.codec:  # (a compressed tar's member is decompressed whole: at most --max-frame-bytes)
        return io.BytesIO(_read(loc, size))
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
    return _read(_parse(path), size)


def read_member_and_meta(path: str, size: int) -> tuple[bytes, dict[str, str]]:
    """``read_member``, and the frame's metadata: its ``source`` (``provenance``) and, with
    ``--label-from .EXT``, the ``label`` its sample's label member gave; the locator parsed once."""
    loc = _parse(path)
    meta = {"source": _source_of(loc)}
    if loc.label:
        meta["label"] = loc.label
    return _read(loc, size), meta


def member_meta(path: str) -> dict[str, str]:
    """``read_member_and_meta``'s metadata alone (a member that is streamed, not read whole)."""
    loc = _parse(path)
    return {"source": _source_of(loc), **({"label": loc.label} if loc.label else {})}


def _read(loc: _Locator, size: int) -> bytes:
    if loc.codec:  # a compressed tar: decompressed forward to it (streams.py)
        try:
            data = read_forward(
                loc.archive, loc.codec, loc.offset, loc.stored, (loc.archive_size, loc.archive_mtime_ns)
            )
        except SourceChanged as e:
            raise MemberChanged(str(e)) from None
        if len(data) != size:
            raise MemberChanged(f"holds {len(data)} bytes where its header says {size} (damaged archive)")
        return data
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
            # never more than the header says (and a max_length of 0 would mean no limit at all)
            data = inflate.decompress(raw, size) if size else b""
            tail = inflate.unconsumed_tail if size else raw
            more = inflate.decompress(tail, 1) if tail else b""
        except zlib.error as e:
            raise MemberChanged(f"cannot be inflated ({e}; damaged archive)") from None
        if len(data) < size:
            raise MemberChanged(f"holds {size - len(data)} bytes fewer than its header says (damaged archive)")
        if more:
            raise MemberChanged("inflates to more bytes than its header says (damaged archive)")
    else:
        data = raw
        if len(data) != size:
            raise MemberChanged(f"holds {len(data)} bytes where its header says {size} (damaged archive)")
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


#: a WebDataset sample's key and extension (its ``base_plus_ext``): ``dir/key.ext.more`` → (``dir/key``, ``ext.more``)
_SAMPLE = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")
_MAX_LABEL_BYTES = 4096


def label_extension(label_from: str | None) -> str | None:
    """``EXT`` of ``--label-from .EXT`` (a sample's member that holds its label), else None."""
    return label_from[1:] if label_from and is_member_label(label_from) else None


def _labelled(entries: list[ArchiveEntry], ext: str) -> Iterator[ArchiveEntry]:
    """``entries`` with the text of their sample's ``.EXT`` member as their label (WebDataset: the
    members ``key.jpg`` and ``key.cls`` are one sample, and ``key.cls`` holds its class)."""
    labels: dict[str, str] = {}
    for e in entries:
        m = _SAMPLE.match(e.name) if e.problem is None else None
        if m is None or m.group(2) != ext:
            continue
        if e.size > _MAX_LABEL_BYTES:
            raise InputError(f"{shown(e.path)}: {e.size} bytes is too long for a label (at most {_MAX_LABEL_BYTES})")
        try:
            text = read_member(e.path, e.size).decode("utf-8", "replace").strip().replace("\0", "")
        except SourceChanged as err:
            raise InputError(f"{shown(e.path)}: {err}") from None
        if text:
            labels[m.group(1)] = text
    for e in entries:
        m = _SAMPLE.match(e.name) if e.problem is None else None
        label = labels.get(m.group(1)) if m is not None else None
        if label is None:
            yield e
        else:
            yield ArchiveEntry(e.name, replace(_parse(e.path), label=label).encode(), e.size, e.mtime_ns)


def list_archive(path: str, kind: str, label_ext: str | None = None) -> Iterator[ArchiveEntry]:
    """The members of the archive ``path`` (``kind`` tar or zip), in archive order; with
    ``label_ext``, each labelled by its sample's ``.EXT`` member (``_labelled``).

    Raises:
        InputError: not an archive of that kind, compressed in a way not read in place, or
            damaged where its headers are.
    """
    if kind not in ARCHIVE_KINDS:
        raise InputError(f"--from {kind}: not a kind of archive hframe reads ({', '.join(ARCHIVE_KINDS)})")
    if is_remote(path):
        if kind != "tar":
            raise InputError(f"{shown_url(path)}: --from {kind} reads a zip file on this machine only; copy it first")
        try:
            size, tag = stamp_of(path)
            with open_raw(path) as f:
                head = f.read(8)
        except OSError as e:
            raise InputError(f"{shown_url(path)}: cannot read: {e}") from None
        found = _list_forward(path, _Stamp(size, tag), codec_of(head) or "plain")
        yield from _labelled(list(found), label_ext) if label_ext is not None else found
        return
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: --from {kind} needs an archive file")
    with open(path, "rb") as f:
        head = f.read(8)
    codec = codec_of(head) if kind == "tar" else None
    if codec is not None:
        found = _list_forward(path, st, codec)
    else:
        found = _list_tar(path, st) if kind == "tar" else _list_zip(path, st)
    if label_ext is not None:
        yield from _labelled(list(found), label_ext)
    else:
        yield from found


_BLOCK = 512
_REGULAR = frozenset(b"07\0")
_FOLDER, _SPARSE, _MULTI, _LONG_NAME, _LONG_LINK, _PAX, _GLOBAL_PAX = b"5SMLKxg"
_TAR_KINDS: dict[int, str] = {
    ord("1"): "a hard link",
    ord("2"): "a symbolic link",
    ord("3"): "a character device",
    ord("4"): "a block device",
    ord("6"): "a FIFO",
    _SPARSE: "a sparse member, not supported",
    ord("V"): "a volume label",
    _MULTI: "a multi-volume continuation, not supported",
}


def _tar_number(field: bytes) -> int:
    """An octal number field (NUL- or space-padded), or GNU's base-256 (high bit set)."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip()
    if text.isdigit():  # ASCII digits only (int() would also take "_", "+", "0o": tar does not)
        return int(text, 8)  # (an 8 or a 9 is a ValueError here)
    if text:
        raise ValueError(f"not an octal number: {text!r}")
    return 0


def _pax_records(data: bytes, where: str) -> dict[str, bytes]:
    """A PAX extended header's ``LEN key=value\\n`` records."""
    out: dict[str, bytes] = {}
    i = 0
    while i < len(data) and data[i : i + 1] != b"\0":
        space = data.find(b" ", i)
        digits = data[i:space] if space > i else b""
        n = int(digits) if digits.isdigit() else 0
        if space <= i or n <= space - i or i + n > len(data) or data[i + n - 1 : i + n] != b"\n":
            raise InputError(f"{where}: damaged PAX header")
        key, eq, value = data[space + 1 : i + n - 1].partition(b"=")  # (without the newline)
        if not eq:
            raise InputError(f"{where}: damaged PAX header")
        out[key.decode("utf-8", "replace")] = value
        i += n
    return out


def _pax_mtime_ns(value: bytes) -> int:
    try:
        return int(Decimal(value.decode()) * 1_000_000_000)
    except (ArithmeticError, ValueError):
        return 0


class _Mapped:
    """A plain tar's bytes for ``_walk_tar``: the file mapped."""

    def __init__(self, mm: mmap.mmap, size: int) -> None:
        self.mm, self.size = mm, size

    def get(self, start: int, end: int) -> bytes:
        return self.mm[start:end]

    def has(self, end: int) -> bool:
        return end <= self.size


def _list_tar(path: str, st: os.stat_result) -> Iterator[ArchiveEntry]:
    """A plain tar's members: its headers walked over the mapped file (a member costs a few
    slices: ``tarfile``'s objects cost several times a folder's listing;
    ``scripts/bench_archives.py``)."""
    if st.st_size < _BLOCK:
        raise InputError(f"{path}: not a tar archive (shorter than one header)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        yield from _walk_tar(path, st, _Mapped(mm, st.st_size), "")


class _Stamp(NamedTuple):
    """What a listing records of an archive (``os.stat_result``'s two fields, for a URL:
    ``streams.stamp_of``)."""

    st_size: int
    st_mtime_ns: int


def _list_forward(path: str, st: os.stat_result | _Stamp, codec: str) -> Iterator[ArchiveEntry]:
    """A compressed or remote tar's members (``streams.py``): its headers walked as it is read."""
    with open_decompressed(path, codec) as stream:
        try:
            yield from _walk_tar(path, st, Forward(stream), codec)
        except SourceChanged as e:  # the decompressor's complaint, met while listing
            raise InputError(f"{shown_url(path)}: {e}") from None


def _walk_tar(path: str, st: os.stat_result | _Stamp, view: _Mapped | Forward, codec: str) -> Iterator[ArchiveEntry]:
    """Walk the chain of 512-byte headers (ustar, GNU and PAX, as GNU tar and Python write
    them), each checked against its checksum, without decoding more than a source needs;
    ``view`` gives the archive's (decompressed) bytes, front to back."""
    where = shown_url(path) if is_remote(path) else path  # (a URL's query is not shown)
    at = 0
    long_name: bytes | None = None
    pax: dict[str, bytes] = {}
    glob_pax: dict[str, bytes] = {}
    first = True
    while True:
        header = view.get(at, at + _BLOCK)
        if len(header) < _BLOCK:
            if first:
                raise InputError(f"{where}: not a tar archive")
            raise InputError(f"{where}: truncated after {at} bytes (no end-of-archive blocks)")
        if header == _ZERO_BLOCK:
            if first:
                raise InputError(f"{where}: not a tar archive (it starts with an empty block)")
            return  # the end (two zero blocks; one is enough, as for tar)
        if not _checksum_ok(header):
            if first:
                raise InputError(f"{where}: not a tar archive")
            raise InputError(f"{where}: damaged: the header at offset {at} does not match its checksum")
        first = False
        flag = header[156]
        try:
            length = _tar_number(header[124:136])
        except ValueError:
            raise InputError(f"{where}: damaged: the header at offset {at} has no readable size") from None
        if length < 0:
            raise InputError(f"{where}: damaged: the header at offset {at} gives a negative size")
        if flag in (_SPARSE, _MULTI):  # more headers of their own follow: never read past them blind
            raise InputError(
                f"{where}: member at offset {at} is a GNU {'sparse' if flag == ord('S') else 'multi-volume'} "
                "member, which --from tar does not read; re-create the archive without --sparse"
            )
        data_at = at + _BLOCK
        nxt = data_at + -(-length // _BLOCK) * _BLOCK
        if flag in (_LONG_NAME, _LONG_LINK, _PAX, _GLOBAL_PAX):  # data for the next header
            body = view.get(data_at, data_at + length)
            if len(body) < length:
                raise InputError(f"{where}: truncated: an extended header at offset {at} ends past the end")
            if flag == _LONG_NAME:
                long_name = body.split(b"\0", 1)[0]
            elif flag == _PAX:
                pax = _pax_records(body, f"{where} (offset {at})")
            elif flag == _GLOBAL_PAX:
                glob_pax.update(_pax_records(body, f"{where} (offset {at})"))
            at = nxt
            continue
        fields = {**glob_pax, **pax} if glob_pax or pax else _NO_FIELDS
        raw = _tar_name(header, long_name, fields)
        if "size" in fields:
            try:
                if not fields["size"].isdigit():
                    raise ValueError(fields["size"])
                length = int(fields["size"])
            except ValueError:
                raise InputError(f"{where}: damaged PAX header at offset {at} (size)") from None
            nxt = data_at + -(-length // _BLOCK) * _BLOCK
        long_name, pax = None, {}
        entry = _tar_entry(path, st, raw, flag, data_at, length, header, fields, codec, where)
        if entry.problem is None and not view.has(data_at + length):
            raise InputError(f"{where}: truncated: member {raw!r} ends past the end of the archive")
        yield entry
        at = nxt


_ZERO_BLOCK = bytes(_BLOCK)
_NO_FIELDS: dict[str, bytes] = {}  # (a member without PAX fields: never written to)


def _checksum_ok(header: bytes) -> bool:
    try:
        want = _tar_number(header[148:156])
    except ValueError:
        return False
    if header.count(0) >= _BLOCK // 2:
        # at most 256 bytes of 255: the sum is below adler32's modulus, so adler32's low half
        # is 1 + the sum exactly (C speed: Python's sum() of 512 bytes was a third of a listing)
        total = (zlib.adler32(header) & 0xFFFF) - 1
    else:
        total = sum(header)
    total += 8 * 32 - sum(header[148:156])
    if total == want:
        return True
    signed = total - 2 * sum(b for b in header if b > 127) + 2 * sum(b for b in header[148:156] if b > 127)
    return signed == want  # (some old tars summed signed bytes)


def _tar_name(header: bytes, long_name: bytes | None, fields: dict[str, bytes]) -> str:
    """The member's name as stored: PAX ``path``, else GNU's long name, else ustar's prefix and
    name (decoded as ``os.fsdecode``: the exact bytes come back with ``os.fsencode``)."""
    if "path" in fields:
        return os.fsdecode(fields["path"])
    if long_name is not None:
        return os.fsdecode(long_name)
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0":  # POSIX ustar: a prefix (GNU's "ustar  " uses the space otherwise)
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return os.fsdecode(name)


def _tar_entry(
    path: str,
    st: os.stat_result | _Stamp,
    raw: str,
    flag: int,
    data_at: int,
    length: int,
    header: bytes,
    fields: dict[str, bytes],
    codec: str = "",
    where: str | None = None,
) -> ArchiveEntry:
    if where is None:
        where = shown_url(path) if is_remote(path) else path
    if "\0" in raw:
        return ArchiveEntry(
            raw.replace("\0", "\\0"),
            f"{where}:{raw}".replace("\0", "\\0"),
            0,
            0,
            problem="name holds a NUL byte (skipped)",
        )
    if flag == _FOLDER or (flag in _REGULAR and raw.endswith("/")):
        return ArchiveEntry(raw, f"{where}:{raw}", 0, 0, problem="")  # (a folder: nothing to say)
    name = member_name(raw)
    if name is None:
        return ArchiveEntry(raw, f"{where}:{raw}", 0, 0, problem="member name contains '..' (skipped, as tar does)")
    if flag not in _REGULAR:
        kind = _TAR_KINDS.get(flag, "not a regular file")
        return ArchiveEntry(name, f"{where}:{raw}", 0, 0, problem=f"{kind} (skipped)")
    if fields and any(k.startswith("GNU.sparse") for k in fields):
        return ArchiveEntry(name, f"{where}:{raw}", 0, 0, problem="a sparse member, not supported (skipped)")
    try:
        mtime = _pax_mtime_ns(fields["mtime"]) if "mtime" in fields else _tar_number(header[136:148]) * 1_000_000_000
    except ValueError:
        raise InputError(f"{where}: damaged: member {raw!r} has no readable time") from None
    if not -(1 << 63) <= mtime < 1 << 63:
        raise InputError(f"{where}: member {raw!r} has a time hframe cannot store (before 1678 or after 2262)")
    if codec:
        loc = _Locator(path, raw, data_at, length, _STORED, -1, st.st_size, st.st_mtime_ns, codec)
        return ArchiveEntry(name, loc.encode(), length, mtime)
    # _Locator(...).encode() of a plain tar's member, spelled out (a listing makes one per member)
    return ArchiveEntry(
        name,
        f"{path}{_SEP}{data_at}{_SEP}{length}{_SEP}{_STORED}{_SEP}-1{_SEP}{st.st_size}{_SEP}{st.st_mtime_ns}{_SEP}{raw}",
        length,
        mtime,
    )


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
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, IndexError, struct.error) as e:
        raise InputError(f"{path}: not a zip archive, or its directory is damaged ({e})") from None
    ranges: list[tuple[int, int, str]] = []
    with zf, open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for info in zf.infolist():
            try:
                entry, data_at = _zip_entry(path, st, mm, info)
            except (OSError, ValueError, NotImplementedError, IndexError, struct.error) as e:
                raise InputError(f"{path}: damaged: member {info.filename!r} ({e})") from None
            if entry.problem is None:
                ranges.append((data_at, data_at + info.compress_size, info.filename))
            yield entry
    # members whose data overlap are a zip bomb's trick (unzip refuses them too): the pack
    # would hold the same bytes again and again, far more than the archive
    ranges.sort()
    for (_, end, a), (start, _, b) in zip(ranges, ranges[1:]):
        if start < end:
            raise InputError(f"{path}: members {a!r} and {b!r} overlap in the archive (a zip bomb?); refused")


def _zip_entry(path: str, st: os.stat_result, mm: mmap.mmap, info: zipfile.ZipInfo) -> tuple[ArchiveEntry, int]:
    """A zip member's entry, and where its data starts (-1: not packed)."""
    raw = _zip_raw_name(info)
    shown_at = f"{path}:{raw}"
    if info.is_dir():
        return ArchiveEntry(raw, shown_at, 0, 0, problem=""), -1
    name = member_name(raw)
    if name is None:
        return ArchiveEntry(raw, shown_at, 0, 0, problem="member name contains '..' (skipped, as unzip does)"), -1
    if stat.S_ISLNK(info.external_attr >> 16):
        return ArchiveEntry(name, shown_at, 0, 0, problem="a symbolic link (skipped)"), -1
    if info.flag_bits & 0x1:
        return ArchiveEntry(name, shown_at, 0, 0, problem="encrypted (skipped)"), -1
    if "\0" in raw:
        return ArchiveEntry(name, shown_at.replace("\0", "\\0"), 0, 0, problem="name holds a NUL byte (skipped)"), -1
    if info.compress_type == _STORED and info.compress_size != info.file_size:
        raise InputError(
            f"{path}: damaged: stored member {raw!r} says {info.file_size} bytes but holds {info.compress_size}"
        )
    if info.compress_type not in (_STORED, _DEFLATED):
        problem = f"compressed with method {info.compress_type} (stored or deflated only)"
        return ArchiveEntry(name, shown_at, 0, 0, problem=problem), -1
    at = info.header_offset
    local = mm[at : at + _ZIP_LOCAL.size]  # (a slice of the mapped file: no seek, no read call)
    if len(local) < _ZIP_LOCAL.size or local[:4] != b"PK\x03\x04":
        raise InputError(f"{path}: damaged: member {raw!r} has no local header at offset {info.header_offset}")
    fields = _ZIP_LOCAL.unpack(local)
    data_at = info.header_offset + _ZIP_LOCAL.size + fields[10] + fields[11]
    if data_at + info.compress_size > st.st_size:
        raise InputError(f"{path}: truncated: member {raw!r} ends past the end of the archive")
    # _Locator(...).encode(), spelled out (a listing makes one per member)
    locator = _SEP.join(
        map(str, (path, data_at, info.compress_size, info.compress_type, info.CRC, st.st_size, st.st_mtime_ns, raw))
    )
    return ArchiveEntry(name, locator, info.file_size, _zip_mtime_ns(info)), data_at
