"""PackWriter: append frames to a ``.partial`` pack, seal it, and publish it atomically.

Order of operations (``man/hframe.5``, WRITING):

1. take the output lock (``OUT.lock``; a second writer gets ``PackLocked``), then truncate
   ``OUT.partial`` and write a provisional header (or, resuming, cut it back to the last
   committed offset and rebuild the index rows from its record headers);
2. per frame: the payload offset is computed and recorded *before* the bytes are appended
   (the shifted-index bug cannot happen), then record header + payload are appended;
3. ``commit()`` (for checkpoints): flush and fsync, return what is now durable;
4. ``seal()``: final header (UUID, creation time), trailer, fsync, index to
   ``OUT.index.parquet.partial``, fsync;
5. the caller checks the sealed files (``verify.self_check``), then ``publish()`` renames
   the pack, then the index, into place and fsyncs the folder.

Leaving the ``with`` block by an exception never writes an index nor publishes anything; the
``.partial`` pack stays on disk, clearly named as unfinished.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import mmap
import os
import shutil
import struct
import time
import uuid
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..durable import fsync_dir, later_than_replaced
from ..errors import FormatError, InputError, StorageError
from ..faults import enospc_limit, fault_point
from ..format.index import (
    INDEX_SCHEMA,
    IndexBuilder,
    IndexMeta,
    format_time_us,
    get_index_path,
    read_index_meta,
    write_index,
)
from ..format.layout import (
    EXTRA_ZSTD_DICT,
    FLAG_COMPRESSED,
    FLAG_DICT,
    FORMAT_VERSION,
    FORMAT_VERSION_EXTRAS,
    HEADER_SIZE,
    KIND_IDS,
    MAX_NAME_BYTES,
    RECORD_FIXED,
    SNIFF_BYTES,
    Header,
    Trailer,
    decode_extra,
    encode_extra,
    encode_record,
    record_header_size,
    sniff_media_type,
)
from ..names import index_name, partial_name
from ..processes import write_all
from ..sources.media import PreparedFrame, encode_meta
from ..storage.access import open_storage
from ..version import __version__
from .lock import OutputLock
from .rebuild import record_meta, walk_records

__all__ = [
    "ChunkWriter",
    "PackWriter",
    "SealedPack",
    "WrittenChunk",
    "filesystem_type",
    "finish_publish",
    "half_done_publish",
    "maps_coherently",
    "publish_partials",
]

_FLUSH_BYTES = 8 << 20
#: the byte whose POSIX lock is the write turn of a run's workers (``ChunkWriter._taking_turns``)
_TURN_AT = 1 << 62
#: a worker's chunk made in Python whose records average at least this many bytes is copied into
#: a shared map of the pack (``ChunkWriter._map_write``); smaller records are written with
#: ``pwritev`` (a compiled chunk, one buffer, with one, in turns: ``write_at``)
_MAP_RECORDS_ABOVE = 8 << 10


def _mapped(size: int, records: int) -> bool:
    """Whether ``records`` records of ``size`` bytes in all are written through a map (on a
    filesystem that ``maps_coherently``): the rule the parent reserves room for a chunk by, and
    the worker writes each batch of its records by."""
    return records > 0 and size >= _MAP_RECORDS_ABOVE * records


#: Filesystems whose page cache holds both what ``write`` writes and what a shared map writes,
#: so that a page one worker writes through its map and the neighbouring bytes another worker
#: ``pwritev``s are one page. Elsewhere (FUSE with direct I/O, CIFS with cache=none, ...)
#: ``write`` may go around the cache, and a mapped page written back whole could put stale
#: bytes over the neighbour's: packs there are written with ``pwritev`` only.
_COHERENT_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs"})


def filesystem_type(dev: int, mountinfo: Iterable[bytes]) -> str | None:
    """The type of the filesystem whose device is ``dev`` (an ``st_dev``), from the lines of
    ``/proc/self/mountinfo``; None if none matches."""
    for line in mountinfo:
        fields = line.split()
        try:
            major, minor = fields[2].split(b":")
            if os.makedev(int(major), int(minor)) == dev:
                return fields[fields.index(b"-", 6) + 1].decode("utf-8", "replace")
        except (ValueError, IndexError):
            continue
    return None


@functools.lru_cache(maxsize=8)
def maps_coherently(dev: int) -> bool:
    """Whether files on device ``dev`` may be written partly through shared maps and partly
    with ``pwritev`` (``_COHERENT_FILESYSTEMS``; False when that cannot be told)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            return filesystem_type(dev, f) in _COHERENT_FILESYSTEMS
    except OSError:
        return False


_MAX_IOV = 512
_WRITEBACK_BYTES = 64 << 20
_STREAM_CHUNK = 8 << 20
_UUID_NAMESPACE = uuid.UUID("6f1c4d2e-6a0b-5b8e-9a41-3c1f0d9b7e52")
_DIGEST = struct.Struct("<IQq")
_IMAGE, _BLOB = KIND_IDS["image"], KIND_IDS["blob"]


def _hframe_version() -> str:
    return __version__


@dataclass(frozen=True)
class SealedPack:
    """A finished but not yet published pack and index."""

    partial_path: Path
    partial_index_path: Path
    uuid: str
    frame_count: int
    payload_bytes: int
    pack_bytes: int
    pack_time: str


class PackWriter:
    """Writes one pack. Use as a context manager.

    Args:
        path: the final pack path; bytes go to ``path + ".partial"`` until ``publish()``.
        alignment: payloads start on multiples of this (1 = packed tight; 4096 for O_DIRECT).
        created_us: creation time in microseconds since the epoch. When given, the pack UUID
            is derived from the frames and options, so the same inputs give identical bytes.
        pack_uuid: a fixed UUID (used when resuming a pack whose UUID was chosen at the start).
        force: replace an existing pack at ``path``.
        resume_at: continue an existing ``.partial`` pack, cut back to this committed offset.
        lock: the output lock, already held by the caller (else the writer takes it itself).
        dictionary: a zstd dictionary to store with frame 0 (a resumed pack reloads its own).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        alignment: int = 1,
        created_us: int | None = None,
        pack_uuid: str | None = None,
        force: bool = False,
        resume_at: int | None = None,
        lock: OutputLock | None = None,
        dictionary: bytes | None = None,
    ) -> None:
        if alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 24:
            raise InputError(f"--align must be a power of two between 1 and 16777216 (got {alignment})")
        self.path = Path(path)
        self.index_path = get_index_path(self.path)
        self.partial_path = Path(partial_name(self.path))
        self.partial_index_path = Path(partial_name(self.index_path))
        self.alignment = alignment
        self.deterministic = created_us is not None and pack_uuid is None
        self.created_us = created_us if created_us is not None else time.time_ns() // 1000
        self.fixed_uuid = uuid.UUID(pack_uuid) if pack_uuid else None
        self.force = force
        self.resume_at = resume_at
        self.own_lock = lock is None
        self.lock = lock if lock is not None else OutputLock(self.path)
        self._fd = -1
        self._chunks: list[bytes | memoryview] = []
        self._pending = 0
        self._pos = 0
        self._flushed = 0
        self._index = IndexBuilder()
        self._payload_bytes = 0
        self._digest = hashlib.sha256()
        self._sealed: SealedPack | None = None
        self._enospc_at = enospc_limit()
        self._advised = 0
        self._reserved = 0  # how far the file was extended for workers' maps (reserve)
        self.dictionary = dictionary
        self._compressed = False  # some frame has a codec other than none
        self._extras = False  # some record header has an extra field (format 1.1)

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> PackWriter:
        self.open()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def open(self) -> None:
        """Take the lock (or check the one passed in); start a new partial pack, or reopen one to resume."""
        if self.resume_at is None and self.path.exists() and not self.force:
            raise InputError(f"{self.path}: already exists (use --force to replace it)")
        if not self.path.parent.is_dir():
            raise InputError(f"{self.path}: folder {self.path.parent} does not exist")
        if self.own_lock:
            self.lock.acquire()
        else:
            self.lock.require(self.path)
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            try:
                fd = os.open(self.partial_path, flags, 0o644)
            except OSError as e:
                raise StorageError(f"{self.partial_path}: cannot create: {e.strerror}") from e
            self._fd = fd
            if self.resume_at is None:
                os.ftruncate(fd, 0)
                self._write(self._header(uuid.UUID(int=0)).encode())
            else:
                self._reload(self.resume_at)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the partial file and release the lock (publishing is separate)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.own_lock:
            self.lock.release()

    def fileno(self) -> int:
        """The partial pack's descriptor."""
        return self._fd

    def lock_fileno(self) -> tuple[int, ...]:
        """The output lock's descriptor, when it is held: a forked worker that keeps it open
        keeps the lock held as long as it lives."""
        fd = self.lock.fileno()
        return (fd,) if fd >= 0 else ()

    @property
    def version(self) -> tuple[int, int]:
        """1.0 unless the pack uses what format 1.1 added (compression, record extras)."""
        return FORMAT_VERSION_EXTRAS if (self._compressed or self._extras) else FORMAT_VERSION

    def _header(self, pack_uuid: uuid.UUID) -> Header:
        flags = (FLAG_COMPRESSED if self._compressed else 0) | (FLAG_DICT if self._has_dict() else 0)
        return Header(pack_uuid, self.created_us, self.alignment, self.version, flags)

    def _has_dict(self) -> bool:
        return self.dictionary is not None and len(self._index) > 0

    def _reload(self, committed: int) -> None:
        """Cut the partial pack back to ``committed`` bytes and rebuild rows from its records."""
        size = os.fstat(self._fd).st_size
        if size < committed or committed < HEADER_SIZE:
            raise FormatError(f"{self.partial_path}: {size} bytes on disk, the checkpoint committed {committed}")
        os.ftruncate(self._fd, committed)
        storage = open_storage(self.partial_path)
        self.dictionary = None
        try:
            for rec in walk_records(storage, committed):
                h = rec.header
                meta = record_meta(h, os.fspath(self.partial_path))
                if h.frame_id == 0 and h.extra:
                    self.dictionary = decode_extra(h.extra).get(EXTRA_ZSTD_DICT)
                self._append_row(
                    h.name,
                    rec.record_offset,
                    rec.offset - rec.record_offset,
                    h.length,
                    h.md5,
                    h.mtime_ns,
                    rec.media_type,
                    h.kind,
                    codec=h.codec,
                    raw_length=h.raw_length,
                    meta=meta,
                    extra=h.extra,
                )
        except FormatError as e:
            raise FormatError(f"{e}; cannot resume from this partial pack (start over with --force)") from e
        finally:
            storage.close()
        os.lseek(self._fd, committed, os.SEEK_SET)
        self._pos = self._flushed = committed

    # -- appending ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._index)

    @property
    def position(self) -> int:
        """Bytes written so far (buffered ones included)."""
        return self._pos

    @property
    def payload_bytes(self) -> int:
        return self._payload_bytes

    def _write(self, *parts: bytes | memoryview) -> None:
        """Queue ``parts`` for the next ``writev``; flush when enough is queued."""
        self._chunks += parts
        n = sum(map(len, parts))
        self._pending += n
        self._pos += n
        if self._pending >= _FLUSH_BYTES or len(self._chunks) >= _MAX_IOV:
            self._flush()

    def _flush(self) -> None:
        if not self._chunks:
            return
        try:
            self._check_room(self._flushed + self._pending)
            n = os.writev(self._fd, self._chunks)
            if n < self._pending:  # rare short write: finish it plainly
                write_all(self._fd, memoryview(b"".join(self._chunks))[n:])
        except OSError as e:
            raise _write_error(self.partial_path, e) from e
        self._flushed += self._pending
        self._chunks.clear()
        self._pending = 0
        if self._flushed - self._advised >= _WRITEBACK_BYTES and hasattr(os, "posix_fadvise"):
            # start writeback of what is written so far (and keep it out of the page cache):
            # the final fsync then has little left to wait for
            os.posix_fadvise(self._fd, self._advised, self._flushed - self._advised, os.POSIX_FADV_DONTNEED)
            self._advised = self._flushed

    def _check_room(self, end: int) -> None:
        """Fail as a full disk would if the pack is to grow past the injected limit (tests)."""
        if self._enospc_at is not None and end > self._enospc_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(self.partial_path))

    def _append_row(
        self,
        name: bytes,
        rec_off: int,
        hdr_size: int,
        length: int,
        md5: bytes,
        mtime_ns: int,
        media: str,
        kind: int,
        *,
        codec: int = 0,
        raw_length: int | None = None,
        meta: dict[str, Any] | None = None,
        extra: bytes = b"",
    ) -> None:
        raw = length if raw_length is None else raw_length
        self._index.append(
            name=name,
            offset=rec_off + hdr_size,
            length=length,
            md5=md5,
            media_type=media,
            kind=kind,
            codec=codec,
            raw_length=raw,
            source_size=raw,
            mtime_ns=mtime_ns,
            record_offset=rec_off,
            meta=meta,
        )
        self._payload_bytes += length
        self._digest.update(_DIGEST.pack(len(name), length, mtime_ns) + name + md5)
        if codec or extra:  # packs without either keep the UUIDs they had in format 1.0
            self._digest.update(_DIGEST.pack(codec, raw, len(extra)) + extra)
            self._compressed = self._compressed or codec != 0
            self._extras = self._extras or bool(extra)

    def add(
        self,
        name: bytes,
        data: bytes,
        *,
        mtime_ns: int = 0,
        md5: bytes | None = None,
        raw_length: int | None = None,
        codec: int = 0,
        flags: int = 0,
        media: str | None = None,
        kind: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Append one frame held in memory. Returns its frame id.

        Args:
            name: the frame's name in the pack (POSIX path bytes).
            data: the bytes to store (compressed when ``codec`` says so).
            mtime_ns: the source's modification time, for the index.
            md5: the md5 of the raw frame if the caller already computed it (required when
                ``codec`` is not none).
            raw_length, codec, flags: for a compressed frame, its raw size, codec id and
                record flags (``codec.Compression``).
            media, kind: the sniffed media type and frame kind (default: sniffed from ``data``).
            meta: per-frame metadata (``index.FRAME_META_KEYS``), stored in the record header.
        """
        if self._fd < 0:
            raise InputError("PackWriter is not open (use it as a context manager)")
        nlen = len(name)
        if nlen > MAX_NAME_BYTES:
            raise InputError(f"{name[:80]!r}...: name is longer than {MAX_NAME_BYTES} bytes")
        frame_id = len(self._index)
        extra = (
            encode_extra(encode_meta(meta) if meta else None, self.dictionary if frame_id == 0 else None)
            if meta or (frame_id == 0 and self.dictionary)
            else b""
        )
        elen = len(extra)
        rec_off = self._pos
        hdr_size = (
            record_header_size(rec_off, nlen, elen, self.alignment)
            if self.alignment > 1
            else RECORD_FIXED + nlen + elen
        )
        length = len(data)
        if md5 is None:
            if codec:
                raise InputError("add(): a compressed frame needs the md5 of its raw bytes")
            md5 = hashlib.md5(data).digest()
        if media is None:
            media = sniff_media_type(data[:SNIFF_BYTES])
        if kind is None:
            kind = _BLOB if media == "unknown" else _IMAGE
        raw = length if raw_length is None else raw_length
        # the row (with the payload offset rec_off + hdr_size) is recorded before the bytes are appended
        self._append_row(
            name,
            rec_off,
            hdr_size,
            length,
            md5,
            mtime_ns,
            media,
            kind,
            codec=codec,
            raw_length=raw,
            meta=meta,
            extra=extra,
        )
        self._put_record((hdr_size, frame_id, length, raw, md5, mtime_ns, codec, kind, name, extra, flags), data)
        return frame_id

    def add_blob(
        self, name: bytes, data: bytes, md5: bytes, mtime_ns: int, source: str | None = None, media: str | None = None
    ) -> int:
        """``add(name, data, mtime_ns=mtime_ns, md5=md5, meta={"source": source} if source else
        None)`` for a frame ``FramePrep.prepare`` left as it is: the same record and row, without
        ``add``'s general path when the frame is a blob in an unaligned pack and not the frame
        that carries a dictionary (a pack of small files, or of an archive's members, spends its
        time here). ``media``: the media type, when the caller sniffed it already."""
        if media is None:
            media = sniff_media_type(data[:SNIFF_BYTES])
        frame_id = len(self._index)
        nlen = len(name)
        if (
            media != "unknown"
            or self.alignment > 1
            or nlen > MAX_NAME_BYTES
            or self._fd < 0
            or (frame_id == 0 and self.dictionary)
        ):
            meta = {"source": source} if source is not None else None
            return self.add(name, data, mtime_ns=mtime_ns, md5=md5, media=media, meta=meta)
        rec_off = self._pos
        length = len(data)
        if source is None:
            extra = b""
            self._index.append_blob(name, rec_off + RECORD_FIXED + nlen, length, md5, mtime_ns, rec_off)
        else:
            extra = encode_extra(encode_meta({"source": source}))
            self._index.append_blob(
                name, rec_off + RECORD_FIXED + nlen + len(extra), length, md5, mtime_ns, rec_off, source
            )
            self._extras = True
        hdr_size = RECORD_FIXED + nlen + len(extra)
        self._payload_bytes += length
        self._digest.update(_DIGEST.pack(nlen, length, mtime_ns) + name + md5)
        if extra:
            self._digest.update(_DIGEST.pack(0, length, len(extra)) + extra)
        self._put_record((hdr_size, frame_id, length, length, md5, mtime_ns, 0, _BLOB, name, extra, 0), data)
        return frame_id

    def add_prepared(self, name: bytes, mtime_ns: int, fr: PreparedFrame) -> int:
        """Append a frame ``media.FramePrep`` prepared (compressed, with its metadata)."""
        return self.add(
            name,
            fr.data,
            mtime_ns=mtime_ns,
            md5=fr.md5,
            raw_length=fr.raw_length,
            codec=fr.codec,
            flags=fr.flags,
            media=fr.media,
            kind=fr.kind,
            meta=fr.meta or None,
        )

    def _put_record(self, header: tuple[Any, ...], data: bytes) -> None:
        """Queue one record: its header (``encode_record``'s arguments) and payload."""
        self._write(encode_record(*header), data)

    def append_chunk(self, chunk: WrittenChunk) -> None:
        """Take in a chunk of records a ``ChunkWriter`` has written right after the last frame
        (``fanout``): its rows, its share of the digest, and its bytes, already on disk."""
        if self._pending or chunk.start != self._pos or chunk.first_frame != len(self._index):
            raise InputError(
                f"{self.partial_path}: chunk at byte {chunk.start}, frame {chunk.first_frame} does not follow "
                f"byte {self._pos}, frame {len(self._index)}"
            )
        self._index.extend(chunk.rows)
        self._digest.update(chunk.digest_input)
        self._payload_bytes += chunk.payload_bytes
        self._compressed = self._compressed or chunk.compressed
        self._extras = self._extras or chunk.extras
        self._pos = self._flushed = chunk.start + chunk.size
        os.lseek(self._fd, self._pos, os.SEEK_SET)

    def reserve(self, start: int, size: int, records: int) -> None:
        """Extend the partial pack (sparse) past a chunk of ``size`` bytes and ``records``
        records before it is placed at ``start``, when its worker will write it through a map
        (records of ``_MAP_RECORDS_ABOVE`` bytes or more on average, ``ChunkWriter``): a map
        cannot grow a file. Only this process changes the file's size while workers write."""
        end = start + size
        if end > self._reserved and _mapped(size, records) and self.maps_coherently():
            try:
                os.ftruncate(self._fd, end)
            except OSError as e:
                raise _write_error(self.partial_path, e) from e
            self._reserved = end

    def maps_coherently(self) -> bool:
        """Whether the pack's filesystem lets workers write it partly through maps
        (``maps_coherently``; the answer is kept, and forked workers inherit it)."""
        return maps_coherently(os.fstat(self._fd).st_dev)

    def cut_back(self) -> None:
        """Drop any bytes past the last frame taken in (workers' chunks not taken in) and go on
        appending from there."""
        self._flush()
        try:
            os.ftruncate(self._fd, self._pos)
        except OSError as e:
            raise _write_error(self.partial_path, e) from e
        os.lseek(self._fd, self._pos, os.SEEK_SET)
        self._advised = min(self._advised, self._pos)
        self._reserved = self._pos

    def mark(self) -> tuple[Any, ...]:
        """A point to come back to with ``rollback`` (a video abandoned part-way)."""
        return (len(self._index), self._pos, self._payload_bytes, self._digest.copy(), self._compressed, self._extras)

    def rollback(self, mark: tuple[Any, ...]) -> None:
        """Drop every frame appended since ``mark``: rows, buffered and written bytes."""
        frames, pos, payload, digest, compressed, extras = mark
        self._flush()
        try:
            os.ftruncate(self._fd, pos)
        except OSError as e:
            raise _write_error(self.partial_path, e) from e
        os.lseek(self._fd, pos, os.SEEK_SET)
        self._pos = self._flushed = pos
        self._advised = min(self._advised, pos)
        self._index.truncate(frames)
        self._payload_bytes, self._digest = payload, digest
        self._compressed, self._extras = compressed, extras

    def add_stream(
        self, name: bytes, stream: BinaryIO, size: int, *, mtime_ns: int = 0, meta: dict[str, Any] | None = None
    ) -> int:
        """Append one frame of ``size`` bytes copied from ``stream`` in chunks (bounded memory),
        with per-frame ``meta`` (``index.FRAME_META_KEYS``) if any.

        Raises:
            InputError: the stream held more or fewer than ``size`` bytes; nothing is kept.
        """
        if self._fd < 0:
            raise InputError("PackWriter is not open (use it as a context manager)")
        if len(name) > MAX_NAME_BYTES:
            raise InputError(f"{name[:80]!r}...: name is longer than {MAX_NAME_BYTES} bytes")
        self._flush()
        rec_off = self._pos
        # frame 0 carries the pack's dictionary, whichever way it is written
        dictionary = self.dictionary if not len(self._index) else None
        extra = encode_extra(encode_meta(meta) if meta else None, dictionary) if meta or dictionary else b""
        hdr_size = record_header_size(rec_off, len(name), len(extra), self.alignment)
        digest = hashlib.md5()
        head = b""
        got = 0
        pos = rec_off + hdr_size
        try:
            os.pwrite(self._fd, b"\0" * hdr_size, rec_off)
            while True:
                chunk = stream.read(_STREAM_CHUNK)
                if not chunk:
                    break
                if not head:
                    head = chunk[:SNIFF_BYTES]
                digest.update(chunk)
                self._check_room(pos + len(chunk))
                _pwrite_all(self._fd, chunk, pos)
                pos += len(chunk)
                got += len(chunk)
                if got > size:
                    break
        except OSError as e:
            os.ftruncate(self._fd, rec_off)
            raise _write_error(self.partial_path, e) from e
        if got != size:
            os.ftruncate(self._fd, rec_off)
            raise InputError(f"size changed while packing (expected {size} bytes, read {got})")
        media = sniff_media_type(head)
        kind = _BLOB if media == "unknown" else _IMAGE
        frame_id = len(self._index)
        md5 = digest.digest()
        self._append_row(name, rec_off, hdr_size, size, md5, mtime_ns, media, kind, meta=meta, extra=extra)
        record = encode_record(hdr_size, frame_id, size, size, md5, mtime_ns, 0, kind, name, extra)
        os.pwrite(self._fd, record, rec_off)
        os.lseek(self._fd, rec_off + hdr_size + size, os.SEEK_SET)
        self._pos = self._flushed = rec_off + hdr_size + size
        return frame_id

    def copy_records_from(self, pack: str | os.PathLike[str], data_end: int) -> None:
        """Append the records of another pack verbatim (``--update``): bytes [HEADER_SIZE, data_end).

        Only valid right after ``open()`` with the same alignment, so every offset is unchanged.
        """
        if self._pos != HEADER_SIZE or len(self._index):
            raise InputError("copy_records_from must come first")
        self._flush()
        with open(pack, "rb") as src:
            src.seek(HEADER_SIZE)
            os.lseek(self._fd, HEADER_SIZE, os.SEEK_SET)
            with open(self._fd, "wb", closefd=False) as dst:
                try:
                    shutil.copyfileobj(src, dst, 16 << 20)  # uses copy_file_range/sendfile where it can
                except OSError as e:
                    raise _write_error(self.partial_path, e) from e
        self._pos = self._flushed = data_end
        os.lseek(self._fd, data_end, os.SEEK_SET)
        self._reload(data_end)

    # -- finishing ----------------------------------------------------------------------

    def commit(self) -> tuple[int, int]:
        """Make everything written so far durable. Returns (frames, committed bytes)."""
        done = self.flush()
        self.sync()
        return done

    def flush(self) -> tuple[int, int]:
        """Hand what is buffered to the file (not yet durable: ``sync``). Returns (frames,
        bytes) written so far."""
        self._flush()
        return len(self._index), self._pos

    def sync(self) -> None:
        """fsync the partial pack: what was handed to the file before is durable (safe on
        another thread, while more is written)."""
        try:
            os.fsync(self._fd)
        except OSError as e:
            raise _write_error(self.partial_path, e) from e

    def seal(self) -> SealedPack:
        """Write the final header and the trailer, fsync, and write the index (all partial)."""
        if self._fd < 0:
            raise InputError("PackWriter is not open")
        if self.fixed_uuid is not None:
            pack_uuid = self.fixed_uuid
        elif self.deterministic:
            pack_uuid = uuid.uuid5(_UUID_NAMESPACE, f"{self._digest.hexdigest()}:{self.created_us}:{self.alignment}")
        else:
            pack_uuid = uuid.uuid4()
        data_end = self._pos
        count = len(self._index)
        self._write(Trailer(count, self._payload_bytes, data_end, pack_uuid, self.version).encode())
        self._flush()
        pack_bytes = self._pos
        try:
            os.pwrite(self._fd, self._header(pack_uuid).encode(), 0)
            os.fsync(self._fd)
        except OSError as e:
            raise _write_error(self.partial_path, e) from e
        meta = IndexMeta(
            format_version="{}.{}".format(*self.version),
            index_schema_version=INDEX_SCHEMA,
            pack_uuid=str(pack_uuid),
            pack_time=format_time_us(self.created_us),
            frame_count=count,
            pack_bytes=pack_bytes,
            payload_bytes=self._payload_bytes,
            alignment=self.alignment,
            hframe_version=_hframe_version(),
        )
        try:
            write_index(self._index.to_table(meta), self.partial_index_path)
        except OSError as e:
            raise _write_error(self.partial_index_path, e) from e
        self._index.release()  # written: the self-check and publishing need only the count
        self._sealed = SealedPack(
            self.partial_path,
            self.partial_index_path,
            str(pack_uuid),
            count,
            self._payload_bytes,
            pack_bytes,
            meta.pack_time,
        )
        return self._sealed

    def publish(self) -> SealedPack:
        """Rename the sealed pack, then its index, into place; fsync the folder."""
        if self._sealed is None:
            raise InputError("seal() the pack before publishing it")
        if self.resume_at is None and self.path.exists() and not self.force:
            raise InputError(f"{self.path}: appeared while packing (use --force to replace it)")
        publish_partials(self.path)
        return self._sealed


@dataclass
class WrittenChunk:
    """What a ``ChunkWriter`` sends back once its records are on disk (``PackWriter.append_chunk``)."""

    start: int
    first_frame: int
    size: int
    rows: IndexBuilder
    digest_input: bytes
    payload_bytes: int
    compressed: bool
    extras: bool


class _DigestInput:
    """Stands in for the pack digest in a ``ChunkWriter``: keeps what would be hashed, so the
    parent hashes the chunks in order and gets the digest a single writer would have."""

    def __init__(self) -> None:
        self.data = bytearray()

    def update(self, data: bytes) -> None:
        self.data += data


class ChunkWriter(PackWriter):
    """Builds the records of a run of frames in memory before it knows where they go, then
    writes them at a given byte offset and frame id (a ``fanout`` worker).

    ``add`` is ``PackWriter.add``: the same checks, rows and header bytes. A record header holds
    its frame id (under its CRC), so headers are encoded in ``write_at``, once the first frame's
    id is known. Only for packs whose record sizes do not depend on where they start: no
    alignment, and no dictionary (frame 0 would carry it).
    """

    def __init__(self, fd: int, path: str | os.PathLike[str]) -> None:  # noqa: D107 - no PackWriter set-up
        self._fd = fd
        self.partial_path = Path(path)
        self.alignment = 1
        self.dictionary = None
        self._index = IndexBuilder()
        self._digest = _DigestInput()  # type: ignore[assignment]
        self._payload_bytes = 0
        self._compressed = self._extras = False
        self._pos = 0
        self._records: list[tuple[tuple[Any, ...], bytes]] = []
        self._image: tuple[bytearray, bytes, Any] | None = None  # add_blob_records: (records, their offsets, numbering)
        self._enospc_at = enospc_limit()
        self._may_map = self.maps_coherently()

    def _put_record(self, header: tuple[Any, ...], data: bytes) -> None:
        self._records.append((header, data))
        self._pos += header[0] + len(data)

    def add_records(self, names: list[bytes], mtimes_ns: list[int], chunk: tuple[Any, ...], number: Any) -> None:
        """Take the records the compiled loop laid out for files named ``names``, modified at
        ``mtimes_ns`` (``_blobs.read_chunk``'s answer): the records and rows ``add_blob`` and
        ``add`` would have made for each, into a chunk that holds nothing yet. ``number``
        (``_blobs.number``) sets their frame ids and CRCs in ``write_at``."""
        if self._records or self._image is not None or len(self._index):
            raise ValueError("add_records: the chunk holds frames already")
        image, count, rec_offs, offsets, lengths, md5s, digest_input, media, widths, heights, modes = chunk
        columns = [array("q") for _ in range(3)]
        for column, raw in zip(columns, (offsets, lengths, rec_offs)):
            column.frombytes(raw)
        offsets_q, lengths_q, rec_offs_q = columns
        images = media.count(0) != count
        self._index.extend_frames(
            names, offsets_q, lengths_q, md5s, mtimes_ns, rec_offs_q, media, widths, heights, modes
        )
        self._digest.update(digest_input)
        self._payload_bytes += sum(lengths_q)
        self._extras = self._extras or images  # (an image's size and mode are in its record's extra)
        self._pos += len(image)
        self._image = (image, rec_offs, number)

    def write_at(self, start: int, first_frame: int) -> WrittenChunk:
        """Write the records at byte ``start`` with frame ids from ``first_frame``; the chunk
        to hand to the parent's ``PackWriter.append_chunk``."""
        if self._image is not None:
            image, rec_offs, number = self._image
            number(image, rec_offs, first_frame)
            # one buffer: one write in the run's turn, never through a map (records=0). A map's
            # first write to each page is a fault: 20,000 JPEGs of 34 KB, a fifth of the CPU
            # samples of ``hframe pack``; 10 runs each, alternated, 1.57 s median mapped, 1.27 s
            # written, 1.20 s written in turns (``tar cf`` + ``sync`` 1.0-1.1 s)
            with self._taking_turns():
                self._pwrite([image], start, len(image), 0)
        else:
            parts: list[bytes] = []
            at, pending = start, 0
            for header, data in self._records:
                size, frame_id, *rest = header
                parts.append(encode_record(size, first_frame + frame_id, *rest))
                parts.append(data)
                pending += size + len(data)
                if pending >= _FLUSH_BYTES or len(parts) >= _MAX_IOV:
                    at = self._pwrite(parts, at, pending, len(parts) // 2)
                    parts, pending = [], 0
            self._pwrite(parts, at, pending, len(parts) // 2)
        self._index.shift_offsets(start)
        return WrittenChunk(
            start,
            first_frame,
            self._pos,
            self._index,
            bytes(self._digest.data),  # type: ignore[attr-defined]
            self._payload_bytes,
            self._compressed,
            self._extras,
        )

    def _pwrite(self, parts: list[bytes] | list[bytearray], at: int, size: int, records: int) -> int:
        if not parts:
            return at
        try:
            self._check_room(at + size)
            mapped = self._may_map and _mapped(size, records)
            if mapped and self._map_write(parts, at, size):
                return at + size
            n = os.pwritev(self._fd, parts, at)
            if n < size:  # rare short write: finish it plainly
                _pwrite_all(self._fd, memoryview(b"".join(parts))[n:], at + n)
        except OSError as e:
            raise _write_error(self.partial_path, e) from e
        return at + size

    @contextlib.contextmanager
    def _taking_turns(self) -> Iterator[None]:
        """Hold the run's write turn (a compiled chunk's write, ``write_at``): a POSIX lock on
        one byte far past any pack's end (``_TURN_AT``), which the kernel frees when its holder
        dies. Two workers writing into one file at once take turns on its inode lock anyway,
        but by spinning on it: a worker waiting here sleeps instead. Only on a local filesystem (``maps_coherently``: no lock manager
        to wait for); a lock that cannot be had is done without."""
        held = False
        if self._may_map:
            with contextlib.suppress(OSError):
                fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, _TURN_AT)
                held = True
        try:
            yield
        finally:
            if held:
                with contextlib.suppress(OSError):
                    fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _TURN_AT)

    def _map_write(self, parts: list[bytes] | list[bytearray], at: int, size: int) -> bool:
        """Copy ``parts`` into a shared map of bytes [at, at + size) of the pack, which the
        parent extended past them (``PackWriter.reserve``). Workers that ``pwritev`` into one
        file take turns on its inode lock: writing 20,000 JPEGs of 34 KB, 10 % of the CPU
        samples spun on it, and mapped, the workers' system time was 1.13-1.19 s against
        1.24-1.84 s (8 runs of each, alternated).
        False (the caller writes with ``pwritev``) when the file is shorter than that or cannot
        be mapped. A disk that fills up shows as SIGBUS when a page is first written: the
        worker dies, and the parent packs on in its own process (``fanout``), where the write
        fails with ENOSPC as usual."""
        base = at - at % mmap.ALLOCATIONGRANULARITY
        try:
            if os.fstat(self._fd).st_size < at + size:
                return False
            view = mmap.mmap(self._fd, at + size - base, offset=base)
        except (OSError, ValueError):
            return False
        with view:
            pos = at - base
            for part in parts:
                end = pos + len(part)
                view[pos:end] = part
                pos = end
        return True


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write every byte of ``data`` at ``offset`` (a file may take less at a time)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def publish_partials(path: str | os.PathLike[str]) -> None:
    """Rename ``PATH.partial`` then ``PATH.index.parquet.partial`` into place; fsync the folder.

    The pack goes first: a reader that opens the pair between the two renames finds the new pack
    beside the old index, and refuses it by UUID; the index never points at bytes that are not there.
    Either rename is skipped when its partial file is already gone (resuming a half-done publish).
    Each new file's mtime is a later second than the one it replaces (``later_than_replaced``:
    a web server's ETag must change with every publish).
    """
    pack = Path(path)
    index = get_index_path(pack)
    try:
        if os.path.exists(partial_name(pack)):
            later_than_replaced(partial_name(pack), pack, durable=True)
            os.replace(partial_name(pack), pack)
        fault_point("publish-between-renames")
        if os.path.exists(partial_name(index)):
            later_than_replaced(partial_name(index), index, durable=True)
            os.replace(partial_name(index), index)
        fsync_dir(pack.parent)
    except OSError as e:
        raise _write_error(pack, e) from e


def half_done_publish(path: str | os.PathLike[str]) -> bool:
    """Whether a writer killed between its two renames left ``path`` half published: the pack
    renamed into place, its index still at ``INDEX.partial`` (same UUID and size). Reads only."""
    pack = os.fspath(path)
    partial = partial_name(index_name(pack))
    if not (os.path.exists(partial) and os.path.isfile(pack)):
        return False

    try:
        with open(pack, "rb") as f:
            head = f.read(HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
        header = Header.decode(head, pack)
        meta = read_index_meta(partial)
    except (OSError, FormatError, InputError):
        return False
    return meta.pack_uuid == str(header.uuid) and meta.pack_bytes == size


def finish_publish(path: str | os.PathLike[str]) -> bool:
    """Complete a publish that a writer killed between its two renames left half done.

    That writer had renamed its sealed, self-checked pack over ``path`` but not yet its index:
    ``INDEX.partial`` belongs to the pack at ``path`` (same UUID, size and frame count). Rename it
    into place. Returns whether there was such a publish to finish. Call it holding the lock.
    """
    pack = os.fspath(path)
    index = get_index_path(pack)
    partial = partial_name(index)
    if not half_done_publish(pack):
        return False
    try:
        later_than_replaced(partial, index, durable=True)
        os.replace(partial, index)
        fsync_dir(os.path.dirname(os.path.abspath(pack)))
    except OSError as e:
        raise _write_error(index, e) from e
    return True


def _write_error(path: Path | str, err: OSError) -> StorageError:
    if err.errno == errno.ENOSPC:
        free = "unknown"
        try:
            st = os.statvfs(os.path.dirname(os.path.abspath(path)) or ".")
            free = f"{st.f_bavail * st.f_frsize} bytes"
        except OSError:
            pass
        return StorageError(
            f"{path}: disk full (no space left on device; {free} free); the partial pack and its last "
            "checkpoint are kept: free some space and run 'hframe resume'"
        )
    return StorageError(f"{path}: write failed: {err.strerror}")
