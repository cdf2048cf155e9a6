"""PackWriter: append frames to a ``.partial`` pack, seal it, and publish it atomically.

Order of operations (``man/hframe.5``, WRITING):

1. lock ``OUT.partial`` (``flock``, non-blocking: a second writer gets ``PackLocked``),
   truncate it, write a provisional header;
2. per frame: the payload offset is computed and recorded *before* the bytes are appended
   (the shifted-index bug cannot happen), then record header + payload are appended;
3. ``seal()``: final header (UUID, creation time), trailer, fsync, index to
   ``OUT.index.parquet.partial``, fsync;
4. the caller checks the sealed files (``verify.self_check``), then ``publish()`` renames
   the pack, then the index, into place and fsyncs the folder.

Leaving the ``with`` block by an exception never writes an index nor publishes anything; the
``.partial`` pack stays on disk, clearly named as unfinished.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import InputError, PackLocked, StorageError
from .format import (
    FORMAT_VERSION,
    KIND_IDS,
    MAX_NAME_BYTES,
    SNIFF_BYTES,
    Header,
    RecordHeader,
    Trailer,
    record_header_size,
    sniff_media_type,
)
from .index import (
    INDEX_SCHEMA,
    IndexBuilder,
    IndexMeta,
    current_format_version,
    format_time_us,
    get_index_path,
    write_index,
)

__all__ = ["PackWriter", "SealedPack"]

_FLUSH_BYTES = 8 << 20
_STREAM_CHUNK = 8 << 20
_UUID_NAMESPACE = uuid.UUID("6f1c4d2e-6a0b-5b8e-9a41-3c1f0d9b7e52")


def _hframe_version() -> str:
    from . import __version__

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
        force: replace an existing pack at ``path``.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, alignment: int = 1, created_us: int | None = None, force: bool = False
    ) -> None:
        if alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 24:
            raise InputError(f"--align must be a power of two between 1 and 16777216 (got {alignment})")
        self.path = Path(path)
        self.index_path = get_index_path(self.path)
        self.partial_path = Path(os.fspath(self.path) + ".partial")
        self.partial_index_path = Path(os.fspath(self.index_path) + ".partial")
        self.alignment = alignment
        self.deterministic = created_us is not None
        self.created_us = created_us if created_us is not None else time.time_ns() // 1000
        self.force = force
        self._fd = -1
        self._buf = bytearray()
        self._pos = 0
        self._index = IndexBuilder()
        self._payload_bytes = 0
        self._digest = hashlib.sha256()
        self._sealed: SealedPack | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> PackWriter:
        self.open()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._release()

    def open(self) -> None:
        """Lock and truncate the partial file and write a provisional header."""
        if self.path.exists() and not self.force:
            raise InputError(f"{self.path}: already exists (use --force to replace it)")
        if not self.path.parent.is_dir():
            raise InputError(f"{self.path}: folder {self.path.parent} does not exist")
        try:
            fd = os.open(self.partial_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StorageError(f"{self.partial_path}: cannot create: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            raise PackLocked(f"{self.path}: another hframe run is writing it ({self.partial_path} is locked)") from e
        self._fd = fd
        os.ftruncate(fd, 0)
        self._write(self._header(uuid.UUID(int=0)).encode())

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1

    def _header(self, pack_uuid: uuid.UUID) -> Header:
        return Header(pack_uuid, self.created_us, self.alignment, FORMAT_VERSION)

    # -- appending ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._index)

    @property
    def position(self) -> int:
        """Bytes written so far (buffered ones included)."""
        return self._pos

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data
        self._pos += len(data)
        if len(self._buf) >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        view = memoryview(self._buf)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as e:
            raise _write_error(self.partial_path, e) from e
        finally:
            view.release()
        self._buf.clear()

    def _begin_record(self, name: bytes) -> tuple[int, int]:
        if len(name) > MAX_NAME_BYTES:
            raise InputError(f"{name[:80]!r}...: name is longer than {MAX_NAME_BYTES} bytes")
        if self._fd < 0:
            raise InputError("PackWriter is not open (use it as a context manager)")
        rec_off = self._pos
        return rec_off, record_header_size(rec_off, len(name), 0, self.alignment)

    def _record(
        self,
        *,
        name: bytes,
        rec_off: int,
        hdr_size: int,
        length: int,
        md5: bytes,
        media: str,
        mtime_ns: int,
        source_size: int,
    ) -> tuple[int, RecordHeader]:
        frame_id = len(self._index)
        kind = KIND_IDS["image"] if media != "unknown" else KIND_IDS["blob"]
        offset = rec_off + hdr_size  # recorded before the payload is appended
        self._index.append(
            name=name,
            offset=offset,
            length=length,
            md5=md5,
            media_type=media,
            kind=kind,
            codec=0,
            raw_length=length,
            source_size=source_size,
            mtime_ns=mtime_ns,
            record_offset=rec_off,
        )
        self._payload_bytes += length
        d = self._digest
        d.update(len(name).to_bytes(4, "little"))
        d.update(name)
        d.update(md5)
        d.update(length.to_bytes(8, "little"))
        d.update(mtime_ns.to_bytes(8, "little", signed=True))
        rec = RecordHeader(frame_id, length, length, md5, mtime_ns, name, b"", 0, kind)
        return frame_id, rec

    def add(self, name: bytes, data: bytes, *, mtime_ns: int = 0, md5: bytes | None = None) -> int:
        """Append one frame held in memory. Returns its frame id.

        Args:
            name: the frame's name in the pack (POSIX path bytes).
            data: the exact bytes to store.
            mtime_ns: the source's modification time, for the index.
            md5: the md5 digest of ``data`` if the caller already computed it.
        """
        rec_off, hdr_size = self._begin_record(name)
        frame_id, rec = self._record(
            name=name,
            rec_off=rec_off,
            hdr_size=hdr_size,
            length=len(data),
            md5=md5 if md5 is not None else hashlib.md5(data).digest(),
            media=sniff_media_type(data[:SNIFF_BYTES]),
            mtime_ns=mtime_ns,
            source_size=len(data),
        )
        self._write(rec.encode(rec_off, self.alignment))
        self._write(data)
        return frame_id

    def add_stream(self, name: bytes, stream: BinaryIO, size: int, *, mtime_ns: int = 0) -> int:
        """Append one frame of ``size`` bytes copied from ``stream`` in chunks (bounded memory).

        Raises:
            InputError: the stream held more or fewer than ``size`` bytes; nothing is kept.
        """
        rec_off, hdr_size = self._begin_record(name)
        self._flush()
        digest = hashlib.md5()
        head = b""
        got = 0
        try:
            os.pwrite(self._fd, b"\0" * hdr_size, rec_off)
            pos = rec_off + hdr_size
            while True:
                chunk = stream.read(_STREAM_CHUNK)
                if not chunk:
                    break
                if not head:
                    head = chunk[:SNIFF_BYTES]
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    n = os.pwrite(self._fd, view, pos)
                    view = view[n:]
                    pos += n
                got += len(chunk)
                if got > size:
                    break
        except OSError as e:
            os.ftruncate(self._fd, rec_off)
            raise _write_error(self.partial_path, e) from e
        if got != size:
            os.ftruncate(self._fd, rec_off)
            raise InputError(f"size changed while packing (expected {size} bytes, read {got})")
        frame_id, rec = self._record(
            name=name,
            rec_off=rec_off,
            hdr_size=hdr_size,
            length=size,
            md5=digest.digest(),
            media=sniff_media_type(head),
            mtime_ns=mtime_ns,
            source_size=size,
        )
        os.pwrite(self._fd, rec.encode(rec_off, self.alignment), rec_off)
        os.lseek(self._fd, rec_off + hdr_size + size, os.SEEK_SET)
        self._pos = rec_off + hdr_size + size
        return frame_id

    # -- finishing ----------------------------------------------------------------------

    def seal(self) -> SealedPack:
        """Write the final header and the trailer, fsync, and write the index (all partial)."""
        if self._fd < 0:
            raise InputError("PackWriter is not open")
        pack_uuid = (
            uuid.uuid5(_UUID_NAMESPACE, f"{self._digest.hexdigest()}:{self.created_us}:{self.alignment}")
            if self.deterministic
            else uuid.uuid4()
        )
        data_end = self._pos
        count = len(self._index)
        self._write(Trailer(count, self._payload_bytes, data_end, pack_uuid).encode())
        self._flush()
        pack_bytes = self._pos
        try:
            os.pwrite(self._fd, self._header(pack_uuid).encode(), 0)
            os.fsync(self._fd)
        except OSError as e:
            raise _write_error(self.partial_path, e) from e
        meta = IndexMeta(
            format_version=current_format_version(),
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
        if self.path.exists() and not self.force:
            raise InputError(f"{self.path}: appeared while packing (use --force to replace it)")
        try:
            os.replace(self.partial_path, self.path)
            os.replace(self.partial_index_path, self.index_path)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise _write_error(self.path, e) from e
        return self._sealed


def _write_error(path: Path | str, err: OSError) -> StorageError:
    if err.errno == errno.ENOSPC:
        return StorageError(f"{path}: disk full (no space left on device); the partial pack is kept")
    return StorageError(f"{path}: write failed: {err.strerror}")
