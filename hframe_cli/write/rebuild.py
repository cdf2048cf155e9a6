"""Walk a pack's record headers from start to trailer, without an index.

Used to rebuild a lost index (``hframe index --rebuild``); the pack alone is enough because
every payload is preceded by a record header carrying its length, md5, mtime and name.
Reads are sequential and bounded: one record header (plus the payload's first bytes, to
sniff its media type) at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..durable import replaced
from ..errors import FormatError
from ..format.index import INDEX_SCHEMA, IndexBuilder, IndexMeta, write_index
from ..format.layout import (
    EXTRA_META,
    HEADER_SIZE,
    RECORD_FIXED,
    SNIFF_BYTES,
    RecordHeader,
    decode_extra,
    sniff_media_type,
)
from ..read.snapshot import PackInfo, read_pack_info
from ..sources.media import decode_meta
from ..storage.access import Storage, open_storage
from ..version import __version__
from .lock import OutputLock

__all__ = ["ScannedRecord", "iter_records", "rebuild_index", "walk_records"]

_PROBE = 4096


@dataclass(frozen=True)
class ScannedRecord:
    """One record as found in the pack."""

    record_offset: int
    offset: int
    header: RecordHeader
    media_type: str


def iter_records(storage: Storage, info: PackInfo) -> Iterator[ScannedRecord]:
    """Yield every record between the header and the trailer, checking each header."""
    count = 0
    for rec in walk_records(storage, info.trailer.data_end):
        count += 1
        yield rec
    if count != info.trailer.frame_count:
        raise FormatError(f"{storage.location}: found {count} records, trailer says {info.trailer.frame_count}")


def walk_records(storage: Storage, end: int) -> Iterator[ScannedRecord]:
    """Yield the records from the header up to byte ``end``, which must fall between records.

    Every record header's checksum and frame id are checked; also used to pick up a partial pack
    (``end`` = the committed offset) when resuming.
    """
    where = storage.location
    pos = HEADER_SIZE
    expected_id = 0
    while pos < end:
        probe = storage.read_at(pos, min(_PROBE, end - pos))
        at = f"{where}: record at offset {pos}"
        if len(probe) < RECORD_FIXED:
            raise FormatError(f"{at}: truncated record header ({len(probe)} bytes before the trailer)")
        name_len, extra_len = RecordHeader.name_extra_lengths(probe, at)
        need = RECORD_FIXED + name_len + extra_len
        if need > len(probe):
            if pos + need > end:
                raise FormatError(f"{at}: record header runs past the end of data")
            probe = storage.read_at(pos, need + SNIFF_BYTES)
        header, size = RecordHeader.decode(probe[:RECORD_FIXED], probe[RECORD_FIXED:need], at)
        if header.frame_id != expected_id:
            raise FormatError(f"{at}: frame id {header.frame_id}, expected {expected_id}")
        offset = pos + size
        if offset + header.length > end:
            raise FormatError(
                f"{at}: frame {header.frame_id} (offset {offset}, length {header.length}) runs past "
                f"the end of data ({end})"
            )
        head = (
            probe[size : size + SNIFF_BYTES]
            if len(probe) >= size + SNIFF_BYTES
            else storage.read_at(offset, min(SNIFF_BYTES, header.length))
        )
        yield ScannedRecord(pos, offset, header, sniff_media_type(head[: header.length]))
        pos = offset + header.length
        expected_id += 1


def record_meta(h: RecordHeader, where: str) -> dict[str, Any] | None:
    """The per-frame metadata stored in a record header's extra field (None when there is none)."""
    if not h.extra:
        return None

    at = f"{where}: frame {h.frame_id}"
    entries = decode_extra(h.extra, at)
    return decode_meta(entries[EXTRA_META], at) if EXTRA_META in entries else None


def rebuild_index(
    pack_path: str | os.PathLike[str],
    index_path: str | os.PathLike[str],
    on_progress: Callable[[int], None] | None = None,
) -> IndexMeta:
    """Recreate the Parquet index of a pack from its record headers alone.

    The result has the same rows as the index written by ``pack`` (the pack UUID, time and
    sizes come from the header and trailer; ``hframe_version`` is this release's).
    """

    # the lock: a pack run publishing this output at the same time writes INDEX.partial too
    with OutputLock(pack_path), open_storage(pack_path) as storage:
        return _rebuild(storage, index_path, on_progress, __version__)


def _rebuild(
    storage: Storage, index_path: str | os.PathLike[str], on_progress: Callable[[int], None] | None, version: str
) -> IndexMeta:
    """``rebuild_index`` holding the lock: walk the records, write the index, rename it in."""
    info = read_pack_info(storage)
    builder = IndexBuilder()
    for rec in iter_records(storage, info):
        h = rec.header
        frame_meta = record_meta(h, storage.location)
        builder.append(
            name=h.name,
            offset=rec.offset,
            length=h.length,
            md5=h.md5,
            media_type=rec.media_type,
            kind=h.kind,
            codec=h.codec,
            raw_length=h.raw_length,
            source_size=h.raw_length,
            mtime_ns=h.mtime_ns,
            record_offset=rec.record_offset,
            meta=frame_meta,
        )
        if on_progress is not None:
            on_progress(h.length)
    meta = IndexMeta(
        format_version="{}.{}".format(*info.header.version),
        index_schema_version=INDEX_SCHEMA,
        pack_uuid=info.uuid,
        pack_time=info.pack_time,
        frame_count=info.trailer.frame_count,
        pack_bytes=info.size,
        payload_bytes=info.trailer.payload_bytes,
        alignment=info.header.alignment,
        hframe_version=version,
    )
    with replaced(index_path) as tmp:
        write_index(builder.to_table(meta), tmp)
    return meta
