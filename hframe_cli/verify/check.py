"""Verify packs: every check a pack can fail, reported per frame; and the packing self-check.

``verify_pack`` walks the chain of record headers sequentially in large chunks (the pack's own
structure, independent of the index), hashing every payload (a large pack as one part per
core, in forked processes), and compares each record with its index row. Sound records take a
lean loop (``_Verifier.clean_run``); the first record that is not sound takes the careful path,
which re-checks it and reports exactly what is wrong. Problems are attributed to exactly the
frames they damage:

- header / trailer: magic, version, checksum, position, UUID (pack-level, no frame id);
- index vs pack: UUID (another pack's index: cannot verify), frame count, pack size;
- layout: record header checksum, frame ids in order, index offset/length/record_offset/name
  equal to the record's, non-zero padding, bytes between frames, frames past the end (missing);
- content: md5 of the payload vs index and record header; magic bytes vs the recorded media
  type; optionally a full Pillow decode.

``self_check`` (run by ``pack`` before publishing) is ``verify_pack`` on the first N frames
after evicting the pack from the page cache, raising on the first problem.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import math
import mmap
import os
import pickle
import random
import signal
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import (
    ChecksumMismatch,
    DictionaryUnavailable,
    FormatError,
    HframeError,
    IncompletePack,
    InputError,
    IntegrityError,
    MagicMismatch,
    NotAPack,
    StorageError,
    UnsupportedVersion,
)
from ..format.codec import DIGEST_IN_PIECES_ABOVE, Decompressor
from ..format.index import IndexMeta, file_digest_problem, format_time_us, index_location, int64_column, read_index_meta
from ..format.layout import (
    CODEC_NAMES,
    FLAG_DICT,
    HEADER_SIZE,
    KIND_IDS,
    KIND_NAMES,
    MEDIA_TYPES,
    RECORD_FIXED,
    RECORD_MAGIC,
    RECORD_STRUCT,
    TRAILER_MAGIC,
    TRAILER_SIZE,
    Header,
    Trailer,
    expected_magic,
    record_crc,
    record_field_problem,
    record_fields,
)
from ..locations import is_remote, shown_url
from ..parts import balanced_part
from ..processes import reap, release_signals, signals_held, usable_cpus, write_all
from ..read.reader import read_dictionary
from ..read.snapshot import pinned_index, read_pack_info, until_settled
from ..sources.imagehead import pillow_message
from ..sources.inputs import expand_globs
from ..storage.access import Storage, evict_from_page_cache, open_storage, unpinned_and_moved
from . import DEFAULT_SELF_CHECK
from .columns import IndexCols, wrong_frame_ids, wrong_source_sizes
from .report import PackReport, Problem, VerifyReport, parse_frames, parse_sample

__all__ = [
    "DEFAULT_SELF_CHECK",
    "PackReport",
    "Problem",
    "VerifyReport",
    "parse_frames",
    "parse_sample",
    "self_check",
    "verify_pack",
    "verify_packs",
]

CHUNK_BYTES = 16 << 20
SAMPLE_BLOCK_BYTES = 1 << 20  # sampled frames come in runs of neighbours about this many bytes long
_IMAGE_TYPES = frozenset({"jpeg", "png", "gif", "webp", "bmp", "tiff"})
_MAGICS = {m: expected_magic(m) for m in MEDIA_TYPES}
# A full verify walks a pack in parallel parts of at least this much data each (so packs of
# twice this or more): forking a walker costs about 3 ms, hashing 8 MiB about 15 ms (measured:
# 2 parts of a 34 MB pack 45 ms against 72 ms in one; an 8 MB pack breaks even)
_PART_MIN_BYTES = 8 << 20

ProgressFn = Callable[[int, int], None]  # (frames, bytes) checked since the last call


class _TooManyProblems(Exception):
    pass


# -- chunked sequential reads -----------------------------------------------------------


_BLOB_KIND = KIND_IDS["blob"]
_MAX_KIND = max(KIND_IDS.values())  # kind ids are 0..max (format/layout.py): a higher one takes the careful path


class _Window:
    """Sequential reads in large chunks; ``get(pos, n)`` returns (buffer, start) holding the range."""

    def __init__(self, storage: Storage, end: int, chunk: int | None = None) -> None:
        self.storage = storage
        self.end = end
        self.chunk = chunk or CHUNK_BYTES
        self.buf = b""
        self.start = 0
        self.bytes_read = 0

    def get(self, pos: int, n: int) -> tuple[bytes, int]:
        if self.start <= pos and pos + n <= self.start + len(self.buf):
            return self.buf, pos - self.start
        block = getattr(self.storage, "block_size", None)  # a remote pack read ahead in blocks
        if block and pos // block == (pos + n - 1) // block:
            # the whole block the range is in, as received (a copy of it would cost as much as the md5)
            first = pos - pos % block
            self.buf = self.storage.read_at(first, min(block, self.storage.size() - first))
            self.start = first
            self.bytes_read += len(self.buf)
            return self.buf, pos - first
        want = max(self.chunk, n) if not block else n
        want = min(want, max(self.end - pos, n))
        self.buf = self.storage.read_at(pos, want)
        self.start = pos
        self.bytes_read += len(self.buf)
        return self.buf, 0


#: A compressed frame in a batch: (codec, record flags, raw length, expected magic bytes or None).
Packed = tuple[int, int, int, "bytes | None"]


class _Queue:
    """Frames waiting to be hashed in one batch: (id, buffer, start, end), with the record's
    md5, offset and length of each; the compressed ones and those to decode."""

    __slots__ = ("buf", "frames", "meta", "packed", "decode_ids")

    def __init__(self) -> None:
        self.buf: bytes | None = None
        self.frames: list[tuple[int, bytes, int, int]] = []
        self.meta: list[tuple[int, bytes, int, int]] = []
        self.packed: dict[int, Packed] = {}
        self.decode_ids: set[int] = set()


class _FastRows:
    """The index columns the fast path compares records with, and what it has checked."""

    __slots__ = (
        "idx",
        "offset",
        "length",
        "record",
        "names",
        "raw",
        "codec",
        "magics",
        "first",
        "stop",
        "frames",
        "bytes",
    )

    def __init__(self, idx: IndexCols, first_id: int, stop_id: int | None) -> None:
        self.idx = idx
        self.offset, self.length, self.record = idx.offset, idx.length, idx.record_offset
        self.names, self.raw, self.codec = idx.names, idx.raw_length, idx.codec
        self.first = first_id
        self.stop = len(idx.offset) if stop_id is None else min(stop_id, len(idx.offset))
        self.magics = [_MAGICS.get(m) for m in idx.media[first_id : self.stop]]
        self.frames = self.bytes = 0


#: What ``_hash_batch`` says of a frame it could not check for a reason already reported (the
#: pack's dictionary is damaged): not a problem of the frame, and not counted as checked.
UNCHECKED = "unchecked"


def _hash_batch(
    items: list[tuple[int, bytes, int, int]],
    decode_ids: set[int],
    packed: dict[int, Packed] | None = None,
    decompressor: Decompressor | None = None,
) -> list[tuple[bytes, str | None]]:
    """md5 of each frame's raw bytes (decompressed first where stored compressed); a
    finding about the frame comes back as ``"check: message"``."""
    if not packed and not decode_ids and items and all(it[1] is items[0][1] for it in items):
        whole = memoryview(items[0][1])
        md5 = hashlib.md5
        return [(md5(whole[a:b]).digest(), None) for _, _, a, b in items]
    out: list[tuple[bytes, str | None]] = []
    for frame_id, buf, a, b in items:
        view: memoryview | bytes = memoryview(buf)[a:b]
        err = None
        if packed and frame_id in packed:
            codec, flags, raw_length, magic = packed[frame_id]
            assert decompressor is not None
            if raw_length > DIGEST_IN_PIECES_ABOVE:  # hashed as it decompresses: bounded memory
                out.append(_digest_in_pieces(decompressor, view, frame_id, packed[frame_id]))
                continue
            try:
                view = decompressor.decode(view, codec, flags, raw_length, f"frame {frame_id}")
            except DictionaryUnavailable as e:
                out.append((b"", UNCHECKED if decompressor.dictionary_lost else f"codec: {e}"))
                continue
            except FormatError as e:
                out.append((b"", f"codec: {str(e).removeprefix(f'frame {frame_id}: ')}"))
                continue
            if magic is not None and view[: len(magic)] != magic:
                err = f"magic: magic bytes mismatch after decompression (expected {magic.hex(' ')}, read {bytes(view[: len(magic)]).hex(' ')})"
        digest = hashlib.md5(view).digest()
        if err is None and frame_id in decode_ids:
            decode_err = _decode_error(view)
            err = None if decode_err is None else f"decode: image does not decode ({decode_err})"
        out.append((digest, err))
    return out


def _digest_in_pieces(
    decompressor: Decompressor, data: memoryview | bytes, frame_id: int, packed: Packed
) -> tuple[bytes, str | None]:
    """A large compressed frame's md5 and magic, decompressed in pieces (it is not decoded:
    an image that large is beyond Pillow's own limit)."""
    codec, flags, raw_length, magic = packed
    try:
        digest, head = decompressor.digest(data, codec, flags, raw_length, f"frame {frame_id}", len(magic or b""))
    except DictionaryUnavailable as e:
        return b"", UNCHECKED if decompressor.dictionary_lost else f"codec: {e}"
    except FormatError as e:
        return b"", f"codec: {str(e).removeprefix(f'frame {frame_id}: ')}"
    if magic is not None and head != magic:
        return digest, (
            f"magic: magic bytes mismatch after decompression (expected {magic.hex(' ')}, read {head.hex(' ')})"
        )
    return digest, None


def _decode_error(data: memoryview | bytes) -> str | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
    except Exception as e:  # noqa: BLE001 - any decoder failure is a finding, not a crash
        return pillow_message(e)
    return None


# -- the walk -----------------------------------------------------------------------------


class _Verifier:
    def __init__(
        self,
        report: PackReport,
        storage: Storage,
        max_errors: int | None,
        decode: bool,
        on_progress: ProgressFn | None,
    ) -> None:
        self.r = report
        self.storage = storage
        self.where = storage.location
        self.idx: IndexCols | None = None  # the index rows of the walk under way
        self.max_errors = max_errors
        self.decode = decode
        self.on_progress = on_progress
        self.processes = 1  # parts of a big pack walked at once (forked processes)
        self.report_to: int | None = None  # the walk reports missing frames up to this id
        self.decompressor: Decompressor | None = None  # set when the pack has compressed frames

    def add(self, check: str, message: str, frame_id: int | None = None, **kw: Any) -> None:
        self.keep(Problem(check, message, frame_id, **kw))

    def keep(self, problem: Problem) -> None:
        """Record a problem; stop the walk once ``max_errors`` are recorded."""
        self.r.problems.append(problem)
        if self.max_errors is not None and len(self.r.problems) >= self.max_errors:
            self.r.stopped_early = True
            raise _TooManyProblems

    def frame_where(self, i: int, offset: int | None, length: int | None) -> str:
        """``PACK: frame 3 'cats/003.jpg' (offset 9120, length 4410)``: the name where the index
        gives it."""
        idx = self.idx
        named = ""
        if idx is not None and 0 <= i < len(idx.names):
            idx.ensure(i, i + 1)
            named = f" {_show(idx.names[i])!r}"
        if offset is None:
            return f"{self.where}: frame {i}{named}"
        return f"{self.where}: frame {i}{named} (offset {offset}, length {length})"

    def walk(
        self,
        start_pos: int,
        first_id: int,
        stop_id: int | None,
        end: int,
        data_end_known: bool,
        idx: IndexCols | None,
        n_total: int | None = None,
        read_end: int | None = None,
        report_to: int | None = None,
    ) -> int:
        """Walk records from ``start_pos`` (frame ``first_id``) up to ``stop_id`` or ``end``.

        ``read_end`` bounds the chunked reads (the end of a sampled run) without changing where
        the data ends. Where the data ends early, frames are reported missing up to
        ``report_to`` (default ``stop_id``: a selection reports only its own frames; a part of
        a full walk passes the frame count). Returns the position after the last record walked.

        Each step takes the fast path (``_fast_step``: records the index agrees with, in the
        chunk in memory) when it can, else the careful one (``_careful_step``: every check,
        each problem reported exactly, resynchronising after a lost record).
        """
        win = _Window(self.storage, read_end if read_end is not None else end)
        self.idx = idx  # frame_where names frames from it
        # bigger read-ahead: the walk is sequential (a remote sample's runs are read as they are:
        # read-ahead there would fetch blocks around every run)
        if self.r.selection == "full" or not getattr(self.storage, "remote", False):
            self.storage.advise_sequential(start_pos)
        queue = _Queue()
        pos, i = start_pos, first_id
        n_index = len(idx.offset) if idx is not None else n_total
        self.report_to = report_to if report_to is not None else (stop_id if stop_id is not None else n_index)
        fast = _FastRows(idx, first_id, stop_id) if idx is not None and not self.decode else None
        plain = [0, 0] if idx is None and not self.decode else None  # frames, bytes hashed by clean_run_no_index
        try:
            while (stop_id is None or i < stop_id) and pos < end:
                # (a resync may land on a record whose id is below first_id: the careful path)
                step = None
                if fast is not None and first_id <= i < fast.stop:
                    step = self._fast_step(fast, win, queue, pos, i, end)
                elif plain is not None:
                    run_pos, run_i, run_bytes = self.clean_run_no_index(win.buf, win.start, pos, i, end)
                    if run_i > i:
                        plain[0] += run_i - i
                        plain[1] += run_bytes
                        step = run_pos, run_i
                if step is None:
                    step = self._careful_step(win, queue, idx, pos, i, end, data_end_known, n_index)
                    if step is None:
                        break
                pos, i = step
            self.flush(queue, idx)
            if stop_id is not None and i < stop_id and not self.r.problems_after(i):
                self.missing_from(i, None, end, idx, self.report_to, f"the pack ends at byte {end}")
        finally:  # hashed by clean_run: counted even when stopped early by max_errors
            if fast is not None:
                self.r.frames_checked += fast.frames
                self.r.bytes_checked += fast.bytes
            if plain is not None:
                self.r.frames_checked += plain[0]
                self.r.bytes_checked += plain[1]
        self.next_id = i
        return pos

    def _fast_step(
        self, fast: _FastRows, win: _Window, queue: _Queue, pos: int, i: int, end: int
    ) -> tuple[int, int] | None:
        """Frame ``i`` at ``pos`` when its record lies wholly in the chunk in memory and agrees
        with its index row: a run of sound uncompressed frames hashed right here (``clean_run``),
        or one compressed frame queued to be decompressed and hashed in a batch. Returns the
        position and id after what it took, or None: the careful path re-checks the record and
        reports exactly what is wrong."""
        wb, ws = win.buf, win.start
        if not fast.codec[i]:  # a frame the index says is compressed cannot start a clean run
            run_pos, run_i, run_bytes = self.clean_run(
                wb, ws, pos, i, fast.stop, end, fast.idx, fast.magics, fast.first
            )
            if run_i > i:
                fast.frames += run_i - i
                fast.bytes += run_bytes
                return run_pos, run_i
        at = pos - ws
        ln, off = fast.length[i], fast.offset[i]
        if at < 0 or at + RECORD_FIXED > len(wb) or off + ln - ws > len(wb) or off + ln > end or fast.record[i] != pos:
            return None
        rmagic, rsize, rid, rlen, rraw, rmd5, rmtime, rcodec, rkind, nlen, elen, rflags, rcrc = (
            RECORD_STRUCT.unpack_from(wb, at)
        )
        body = at + RECORD_FIXED
        hend = body + nlen + elen
        if not (
            rid == i
            and rlen == ln
            and rkind == fast.idx.kind[i]
            and rmtime // 1000 == fast.idx.mtime_us[i]
            and pos + rsize == off
            and hend <= at + rsize
            and rraw == fast.raw[i]
            and rcodec == fast.codec[i]
            and rmagic == RECORD_MAGIC
            and record_crc(wb, at, nlen, elen) == rcrc
            and wb[body : body + nlen] == fast.names[i]
            and (hend == at + rsize or not wb[hend : at + rsize].strip(b"\0"))
        ):
            return None
        p0 = off - ws
        magic = fast.magics[i - fast.first]
        packed = None
        if rcodec:  # compressed: the magic is checked on the raw bytes
            packed, magic = (rcodec, rflags, rraw, magic), None
        if magic is not None and wb[p0 : p0 + min(len(magic), ln)] != magic:
            return None
        self.queue(queue, fast.idx, i, wb, p0, rmd5, off, ln, packed)
        return off + ln, i + 1

    def _careful_step(
        self,
        win: _Window,
        queue: _Queue,
        idx: IndexCols | None,
        pos: int,
        i: int,
        end: int,
        data_end_known: bool,
        n_index: int | None,
    ) -> tuple[int, int] | None:
        """Frame ``i``'s record at ``pos``, every check made and each problem reported. Returns
        the position and id after it (or where the walk picks up again after a lost record), or
        None where the walk stops (the end of the data, a trailer, ``max_errors``)."""
        found = self._record_at(win, pos, i, end, data_end_known)
        if isinstance(found, str):  # what is wrong with the record header ("" at a trailer)
            return self.lost_record(i, pos, end, idx, found, n_index) if found else None
        buf, at, (_, size, _, length, raw_length, rec_md5, mtime_ns, codec, kind, name_len, extra_len, flags, _) = found
        offset = pos + size
        pad = buf[at + RECORD_FIXED + name_len + extra_len : at + size]
        if pad.count(0) != len(pad):
            where = self.frame_where(i, offset, length)
            self.add("layout", f"{where}: non-zero padding in record header", i, offset=offset, length=length)
        if offset + length > end:
            self.missing_from(i, offset, end, idx, self.report_to, f"payload runs past the end of data ({end})")
            return None
        problem = record_field_problem(length, raw_length, codec, kind)
        if problem is not None:  # a crafted record whose CRC matches: nothing in it can be trusted
            self.add("record", f"{self.frame_where(i, offset, length)}: {problem}", i, offset=offset, length=length)
            return offset + length, i + 1
        name = bytes(buf[at + RECORD_FIXED : at + RECORD_FIXED + name_len])
        media = None
        if idx is not None:
            idx.ensure(i, i + 1)  # a resync may have led outside the rows walked
            if i >= len(idx.offset):
                where = f"{self.where}: record for frame {i} at offset {pos} has no index row"
                self.add("index", where, i, offset=offset, length=length)
            else:
                self.compare_row(i, idx, pos, offset, length, name, raw_length, codec, kind, mtime_ns // 1000)
                media = idx.media[i]
        start = at + size  # the payload follows the record header in the same buffer
        magic = _MAGICS.get(media) if media is not None else None
        packed = None
        if codec:  # compressed: the magic is checked on the raw bytes, after decompression
            packed, magic = (codec, flags, raw_length, magic), None
        if magic is not None and media is not None and buf[start : start + min(len(magic), length)] != magic:
            self.flush(queue, idx)  # earlier frames' findings first (--max-errors keeps the earliest)
            self.check_magic(i, buf[start : start + min(len(magic), length)], magic, media, name, offset, length)
        # no index: the record header's kind says what is an image
        decode = self.decode and (media in _IMAGE_TYPES if idx is not None else kind != _BLOB_KIND)
        self.queue(queue, idx, i, buf, start, rec_md5, offset, length, packed, decode)
        return offset + length, i + 1

    def _record_at(
        self, win: _Window, pos: int, i: int, end: int, data_end_known: bool
    ) -> tuple[bytes, int, tuple[Any, ...]] | str:
        """The record header of frame ``i`` at ``pos``, read with its payload where that fits:
        (buffer, where in it, the fixed fields); or what is wrong with it, "" at a trailer."""
        buf, at = win.get(pos, min(RECORD_FIXED, end - pos))
        if len(buf) - at < RECORD_FIXED or buf[at : at + 4] != RECORD_MAGIC:
            if not data_end_known and (
                buf[at : at + 8] == TRAILER_MAGIC[: len(buf[at : at + 8])]
                or (end - pos == TRAILER_SIZE and buf[at : at + 4] != RECORD_MAGIC)
            ):
                return ""  # reached a trailer (or its place, its magic damaged): the caller checks it
            return "no record header"
        fields = record_fields(buf, at)
        _, size, frame_id, length, _, _, _, _, _, name_len, extra_len, _, crc = fields
        if pos + size > end or size < RECORD_FIXED + name_len + extra_len:
            return "record header runs past the end of data"
        buf, at = win.get(pos, size + length if pos + size + length <= end else size)
        if record_crc(buf, at, name_len, extra_len) != crc:
            return "record header checksum mismatch (record header is corrupt)"
        if frame_id != i:
            return f"record header says frame {frame_id}, expected {i}"
        return buf, at, fields

    def check_magic(self, i: int, head: bytes, magic: bytes, media: str, name: bytes, offset: int, length: int) -> None:
        """Report frame ``i`` if its first bytes are not the magic of the media type its index
        row names (a frame shorter than its magic: all of it)."""
        if head != magic:
            self.add(
                "magic",
                f"{self.frame_where(i, offset, length)}: magic bytes mismatch (index says "
                f"{media}, expected {magic.hex(' ')}, read {bytes(head).hex(' ')})",
                i,
                name=_show(name),
                offset=offset,
                length=length,
                expected=magic.hex(" "),
                found=bytes(head).hex(" "),
            )

    def queue(
        self,
        queue: _Queue,
        idx: IndexCols | None,
        i: int,
        buf: bytes,
        start: int,
        rec_md5: bytes,
        offset: int,
        length: int,
        packed: Packed | None = None,
        decode: bool = False,
    ) -> None:
        """Queue frame ``i`` (``buf[start:start + length]``) to be hashed with its neighbours: a
        batch holds frames of one buffer, at most 4096."""
        if buf is not queue.buf and queue.frames:
            self.flush(queue, idx)
        queue.buf = buf
        queue.frames.append((i, buf, start, start + length))
        queue.meta.append((i, rec_md5, offset, length))
        if packed is not None:
            queue.packed[i] = packed
        if decode:
            queue.decode_ids.add(i)
        if len(queue.frames) >= 4096:
            self.flush(queue, idx)

    def flush(self, queue: _Queue, idx: IndexCols | None) -> None:
        """Hash what is queued (see ``submit``) and empty the queue."""
        if queue.frames:
            self.submit(queue.frames, queue.meta, queue.decode_ids, idx, queue.packed)
            queue.frames, queue.meta, queue.decode_ids, queue.packed = [], [], set(), {}

    def clean_run_no_index(self, wb: bytes, ws: int, pos: int, i: int, end: int) -> tuple[int, int, int]:
        """``clean_run`` for a walk without an index (``--no-index``): frames ``i``, ``i + 1``,
        ... while each record lies wholly in ``wb`` (pack bytes from ``ws``), is intact (magic,
        checksum, frame id, zero padding, fields a writer produces), is stored uncompressed and
        its payload's md5 is the record's. Stops at the first that is not, which the careful path
        then examines. Returns (position after the last sound frame, next id, bytes checked)."""
        unpack, md5 = RECORD_STRUCT.unpack_from, hashlib.md5
        limit, n = min(ws + len(wb), end), len(wb)
        i0, nbytes = i, 0
        with memoryview(wb) as mv:
            while True:
                at = pos - ws
                if at < 0 or at + RECORD_FIXED > n:
                    break
                rmagic, rsize, rid, rlen, rraw, rmd5, _, rcodec, rkind, nlen, elen, _, rcrc = unpack(wb, at)
                hend = at + RECORD_FIXED + nlen + elen
                off = pos + rsize
                if (
                    rid != i
                    or rcodec
                    or rraw != rlen
                    or rkind > _MAX_KIND
                    or off + rlen > limit
                    or hend > at + rsize
                    or rmagic != RECORD_MAGIC
                    or record_crc(mv, at, nlen, elen) != rcrc
                    or (hend != at + rsize and wb[hend : at + rsize].strip(b"\0"))
                ):
                    break
                p0 = off - ws
                if md5(mv[p0 : p0 + rlen]).digest() != rmd5:
                    break
                nbytes += rlen
                pos = off + rlen
                i += 1
        if i > i0 and self.on_progress is not None:
            self.on_progress(i - i0, nbytes)
        return pos, i, nbytes

    def clean_run(
        self,
        wb: bytes,
        ws: int,
        pos: int,
        i: int,
        stop: int,
        end: int,
        idx: IndexCols,
        magics: list[bytes | None],
        first_id: int,
    ) -> tuple[int, int, int]:
        """Check frames ``i``, ``i + 1``, ... from ``pos`` while each is sound: wholly inside
        ``wb`` (pack bytes from ``ws``), stored uncompressed, its record header intact and equal
        to its index row, its magic bytes right, and the md5 of its payload equal to both the
        record header's and the index's. Stops before frame ``stop`` and at the first frame that
        is not sound, which the caller's careful path then examines.

        Returns (position after the last sound frame, the next frame id, payload bytes checked).
        This is the loop nearly every byte of a full verify goes through: keep it lean.
        """
        unpack, md5 = RECORD_STRUCT.unpack_from, hashlib.md5
        offs, lens, rofs, iraw, icodec, names, imd5 = (
            idx.offset,
            idx.length,
            idx.record_offset,
            idx.raw_length,
            idx.codec,
            idx.names,
            idx.md5,
        )
        ikind, imtime = idx.kind, idx.mtime_us
        limit = min(ws + len(wb), end)
        i0, nbytes = i, 0
        with memoryview(wb) as mv:
            while i < stop:
                off, ln = offs[i], lens[i]
                at = pos - ws
                if off + ln > limit or rofs[i] != pos or at < 0 or at + RECORD_FIXED > len(wb):
                    break
                rmagic, rsize, rid, rlen, rraw, rmd5, rmtime, rcodec, rkind, nlen, elen, _, rcrc = unpack(wb, at)
                body = at + RECORD_FIXED
                hend = body + nlen + elen
                if (
                    rid != i
                    or rlen != ln
                    or rkind != ikind[i]
                    or rmtime // 1000 != imtime[i]
                    or pos + rsize != off
                    or hend > at + rsize
                    or rcodec
                    or icodec[i]
                    or rraw != iraw[i]
                    or rmagic != RECORD_MAGIC
                    or record_crc(mv, at, nlen, elen) != rcrc
                    or wb[body : body + nlen] != names[i]
                    or (hend != at + rsize and wb[hend : at + rsize].strip(b"\0"))
                ):
                    break
                p0 = off - ws
                magic = magics[i - first_id]
                if magic is not None and wb[p0 : p0 + min(len(magic), ln)] != magic:
                    break
                d = md5(mv[p0 : p0 + ln]).digest()
                if d != rmd5 or d != imd5[16 * i : 16 * i + 16]:
                    break
                nbytes += ln
                pos = off + ln
                i += 1
        if i > i0 and self.on_progress is not None:
            self.on_progress(i - i0, nbytes)
        return pos, i, nbytes

    def submit(
        self,
        batch: list[tuple[int, bytes, int, int]],
        meta: list[tuple[int, bytes, int, int]],
        decode_ids: set[int],
        idx: IndexCols | None,
        packed: dict[int, Packed] | None = None,
    ) -> None:
        """Hash a batch of frames (decompressing those in ``packed``) and report what differs.
        Frames count as checked here, once hashed (not when queued: ``max_errors`` may stop the
        walk with a batch still queued)."""
        results = _hash_batch(batch, decode_ids, packed, self.decompressor)
        nbytes = sum(m[3] for m in meta)
        self.r.frames_checked += len(meta)
        self.r.bytes_checked += nbytes
        if self.on_progress is not None:
            self.on_progress(len(meta), nbytes)
        self.collect(results, meta, idx)

    def collect(
        self, results: list[tuple[bytes, str | None]], meta: list[tuple[int, bytes, int, int]], idx: IndexCols | None
    ) -> None:
        if idx is not None and meta:
            ids = [m[0] for m in meta]
            idx.ensure(min(ids), max(ids) + 1)
        if not self.decode and meta and not any([e for _, e in results]):
            # the usual case, all well: compare the whole batch's digests in one go (a compressed
            # frame's finding, its magic after decompression, is not in its digest)
            digests = b"".join([d for d, _ in results])
            first, last = meta[0][0], meta[-1][0]
            if digests == b"".join([m[1] for m in meta]) and (
                idx is None
                or (
                    last - first + 1 == len(meta)
                    and last < len(idx.offset)
                    and digests == idx.md5[first * 16 : last * 16 + 16]
                )
            ):
                return
        for (digest, decode_err), (i, rec_md5, offset, length) in zip(results, meta):
            if decode_err is UNCHECKED:
                self.r.frames_checked -= 1
                self.r.bytes_checked -= length
                continue
            want = idx.md5[i * 16 : i * 16 + 16] if idx is not None and i < len(idx.offset) else rec_md5
            undecodable = decode_err is not None and decode_err.startswith("codec: ")
            if not undecodable and (digest != want or digest != rec_md5):
                name = _show(idx.names[i]) if idx is not None and i < len(idx.names) else None
                where = self.frame_where(i, offset, length)
                if digest == rec_md5:  # payload intact, the index row's md5 is wrong
                    check, message = (
                        "index",
                        f"{where}: index md5 {want.hex()} differs from record header and payload ({digest.hex()})",
                    )
                else:
                    check, message = "md5", f"{where}: md5 mismatch (index {want.hex()}, read {digest.hex()})"
                self.add(
                    check, message, i, name=name, offset=offset, length=length, expected=want.hex(), found=digest.hex()
                )
            if decode_err is not None:
                check, _, message = decode_err.partition(": ")
                self.add(
                    check,
                    f"{self.frame_where(i, offset, length)}: {message}",
                    i,
                    offset=offset,
                    length=length,
                    found=message,
                )

    def compare_row(
        self,
        i: int,
        idx: IndexCols,
        rec_pos: int,
        offset: int,
        length: int,
        name: bytes,
        raw_length: int = -1,
        codec: int = -1,
        kind: int = -1,
        mtime_us: int | None = None,
    ) -> None:
        def disagrees(check: str, col: str, mine: str, theirs: str) -> None:
            self.add(
                check,
                f"{self.frame_where(i, idx.offset[i], idx.length[i])}: index {col} {mine} "
                f"disagrees with the record header in the pack ({theirs})",
                i,
                name=_show(idx.names[i]),
                offset=idx.offset[i],
                length=idx.length[i],
                expected=theirs,
                found=mine,
            )

        # the reader trusts these two to decode the frame (-1: the caller has no record value)
        if codec >= 0 and idx.codec[i] != codec:
            disagrees(
                "index", "codec", CODEC_NAMES.get(idx.codec[i], str(idx.codec[i])), CODEC_NAMES.get(codec, str(codec))
            )
        if raw_length >= 0 and idx.raw_length[i] != raw_length:
            disagrees("index", "raw_length", str(idx.raw_length[i]), str(raw_length))
        if kind >= 0 and idx.kind[i] != kind:
            disagrees("index", "kind", KIND_NAMES.get(idx.kind[i], "?"), KIND_NAMES.get(kind, str(kind)))
        if mtime_us is not None and idx.mtime_us[i] != mtime_us:
            disagrees("index", "source_mtime", format_time_us(idx.mtime_us[i]), format_time_us(mtime_us))
        for col, mine, theirs in (
            ("offset", idx.offset[i], offset),
            ("length", idx.length[i], length),
            ("record_offset", idx.record_offset[i], rec_pos),
        ):
            if mine != theirs:
                disagrees("layout", col, str(mine), str(theirs))
                return
        if idx.names[i] != name:
            self.add(
                "layout",
                f"{self.frame_where(i, offset, length)}: index name {_show(idx.names[i])!r} disagrees "
                f"with the record header ({_show(name)!r})",
                i,
                offset=offset,
                length=length,
                expected=_show(name),
                found=_show(idx.names[i]),
            )

    def lost_record(
        self, i: int, pos: int, end: int, idx: IndexCols | None, reason: str, n_index: int | None
    ) -> tuple[int, int] | None:
        """Report frame ``i`` unreadable at ``pos``; return where the walk can resume, if anywhere."""
        if idx is not None:
            idx.ensure(i, i + 2)
        off = idx.offset[i] if idx is not None and i < len(idx.offset) else None
        ln = idx.length[i] if idx is not None and i < len(idx.length) else None
        if idx is not None and n_index is not None and i >= n_index:
            self.add(
                "layout", f"{self.where}: unexpected bytes at offset {pos} after the last indexed frame ({reason})"
            )
            return None
        self.add(
            "record",
            f"{self.frame_where(i, off, ln)}: {reason} at offset {pos}",
            i,
            name=_show(idx.names[i]) if idx is not None and i < len(idx.names) else None,
            offset=off,
            length=ln,
        )
        # resume at the next record: the index says where (if it agrees), else search for one
        if idx is not None and i + 1 < len(idx.record_offset) and pos < idx.record_offset[i + 1] < end:
            return idx.record_offset[i + 1], i + 1
        if idx is not None and i + 1 >= len(idx.record_offset):
            return None
        found = self.resync(pos + 1, end)
        if found is None:
            self.missing_from(i + 1, None, end, idx, self.report_to, "no further record headers found")
            return None
        nxt_pos, nxt_id = found
        for j in range(i + 1, nxt_id if self.report_to is None else min(nxt_id, self.report_to)):
            self.add(
                "record", f"{self.where}: frame {j}: record not found (lost between offsets {pos} and {nxt_pos})", j
            )
        return nxt_pos, nxt_id

    def resync(self, pos: int, end: int) -> tuple[int, int] | None:
        step = 4 << 20
        while pos < end:
            data = self.storage.read_at(pos, min(step + RECORD_FIXED + 65536, end - pos))
            k = data.find(RECORD_MAGIC)
            while k >= 0:
                if k + RECORD_FIXED <= len(data):
                    _, _, frame_id, _, _, _, _, _, _, name_len, extra_len, _, crc = record_fields(data, k)
                    if (
                        k + RECORD_FIXED + name_len + extra_len <= len(data)
                        and record_crc(data, k, name_len, extra_len) == crc
                    ):
                        return pos + k, frame_id
                k = data.find(RECORD_MAGIC, k + 1)
            if len(data) <= step:
                return None
            pos += step
        return None

    def missing_from(
        self, i: int, offset: int | None, end: int, idx: IndexCols | None, n_index: int | None, reason: str
    ) -> None:
        last = n_index if n_index is not None else i + 1
        if self.r.problems_after(i):
            return  # already reported from here on
        if idx is not None:
            idx.ensure(i, last)
        for j in range(i, last):
            off = idx.offset[j] if idx is not None else offset
            ln = idx.length[j] if idx is not None else None
            self.add(
                "missing",
                f"{self.frame_where(j, off, ln)}: frame missing or cut short ({reason})",
                j,
                name=_show(idx.names[j]) if idx is not None else None,
                offset=off,
                length=ln,
            )


def _show(name: bytes) -> str:
    return name.decode("utf-8", "backslashreplace")


# -- one pack -----------------------------------------------------------------------------


def _selection(
    n: int, payload_bytes: int, sample: tuple[str, float] | None, seed: int, frames: tuple[int, int | None] | None
) -> tuple[list[tuple[int, int]], str]:
    if frames is not None:
        start, stop = frames
        stop = n if stop is None else min(stop, n)
        if start >= n:
            raise InputError(f"--frames {start}:{stop}: the pack has {n} frames")
        return [(start, stop)], f"frames {start}:{stop}"
    if sample is None or n == 0:
        return [(0, n)], "full"
    kind, value = sample
    want = min(n, max(1, math.ceil(n * value / 100) if kind == "percent" else int(value)))
    # runs of neighbouring frames, so that sampled reads stay sequential (cheap on a cold cache)
    mean = max(1, payload_bytes // max(n, 1))
    # at least 16 runs so the sample is spread over the pack; runs of at most ~1 MiB
    block = max(1, min(4096, SAMPLE_BLOCK_BYTES // (mean + 128), math.ceil(want / 16)))
    blocks = math.ceil(n / block)
    take = min(blocks, math.ceil(want / block))
    chosen = sorted(random.Random(seed).sample(range(blocks), take))
    ranges: list[tuple[int, int]] = []
    for b in chosen:
        a, z = b * block, min(n, (b + 1) * block)
        if ranges and ranges[-1][1] == a:
            ranges[-1] = (ranges[-1][0], z)
        else:
            ranges.append((a, z))
    label = f"{value:g}%" if kind == "percent" else f"{int(value)} frames"
    return ranges, f"sample {label} (seed {seed})"


def verify_pack(
    path: str | os.PathLike[str],
    *,
    index_path: str | os.PathLike[str] | None = None,
    use_index: bool = True,
    sample: tuple[str, float] | None = None,
    seed: int = 0,
    frames: tuple[int, int | None] | None = None,
    decode: bool = False,
    max_errors: int | None = None,
    workers: int | None = None,
    on_progress: ProgressFn | None = None,
) -> PackReport:
    """Check one pack; never raises for problems in the data (they are in the report).

    Args:
        index_path: the index (default ``<path>.index.parquet``).
        use_index: False checks the pack from its record headers alone.
        sample: ("percent", P) or ("count", N), see ``parse_sample``; None checks every frame.
        seed: the sampler seed (same seed ⇒ same frames).
        frames: check only frames [A, B).
        decode: also decode image frames fully with Pillow (decompression-bomb limits on).
        max_errors: stop after this many problems.
        workers: parts of a pack (at most one per 8 MiB of data) walked at once in forked processes
            (default: one per core, at most 4); smaller packs and samples are walked in one.

    Raises:
        InputError: bad arguments (for example --sample without an index).
    """
    t0 = time.perf_counter()
    loc = os.fspath(path)
    ipath = os.fspath(index_path) if index_path is not None else index_location(loc)
    if not use_index and (sample is not None or frames is not None):
        raise InputError("--sample and --frames need the index (drop --no-index)")

    def attempt() -> PackReport:  # raises Overtaken if a publish replaced the pack meanwhile
        report = PackReport(
            shown_url(loc), shown_url(ipath) if use_index else None, "index" if use_index else "no-index", "full"
        )
        try:
            storage = open_storage(loc)
        except HframeError as e:
            report.error, report.error_is_storage = str(e), isinstance(e, StorageError)
            return report
        v = _Verifier(report, storage, max_errors, decode, on_progress)
        # a big pack is walked as one part per core (default), in forked processes
        v.processes = max(1, workers if workers is not None else min(4, usable_cpus()))
        if getattr(storage, "remote", False):
            v.processes = 1  # a remote pack is read ahead by several requests in flight instead
        try:
            _verify_open(v, report, storage, ipath, use_index, sample, seed, frames)
        except _TooManyProblems:
            pass
        except (InputError, UnsupportedVersion, NotAPack, StorageError) as e:
            report.error, report.error_is_storage = str(e), isinstance(e, StorageError)
        except FormatError as e:  # raised here only by an index that cannot be used at all
            report.error = str(e)
        finally:
            counters = getattr(storage, "counters", None)
            if counters is not None:
                _replaced_while_read(report, storage)
                report.remote = counters.to_dict()
            storage.close()
        # pack-level problems first, then by frame (md5 results arrive in batches, after layout ones)
        report.problems.sort(key=lambda p: -1 if p.frame_id is None else p.frame_id)
        report.elapsed_s = time.perf_counter() - t0
        return report

    try:
        return until_settled(attempt, ipath)
    except StorageError as e:  # kept being overtaken by publishes
        report = PackReport(shown_url(loc), shown_url(ipath), "index", "full")
        report.error, report.error_is_storage = str(e), True
        return report


def _replaced_while_read(report: PackReport, storage: Storage) -> None:
    """A remote pack whose reads are not pinned to a version (``RemoteFile.pinned``) and that
    shows problems may have been replaced while it was read: then that is the finding (exit 3),
    not damage. A store that cannot be asked (it died meanwhile) is no sign of that: the read's
    own failure stands, and problems it cannot tell from a publish are not reported as damage."""
    if not (report.problems or report.error):
        return
    try:
        moved = unpinned_and_moved(storage)
    except StorageError as e:
        if report.problems:
            report.problems.clear()
            report.error = f"{e} (asked whether frames that did not match were a publish); verify it again"
            report.error_is_storage = True
        return
    if moved:
        report.problems.clear()
        report.error = f"{report.pack}: the pack was replaced while it was verified; verify it again"
        report.error_is_storage = True


@dataclass
class _Ends:
    """What the pack's two ends said: its size, first and last bytes, and the header and
    trailer where they decode (None where damaged: already reported)."""

    size: int
    head: bytes
    tail: bytes
    header: Header | None
    trailer: Trailer | None


@dataclass
class _IndexRead:
    """The index as verify uses it: the table (None: check from the pack alone), its rows and
    metadata, and the row ranges the selection asks for."""

    table: pa.Table | None = None
    rows: int = 0
    meta: IndexMeta | None = None
    ranges: list[tuple[int, int]] = field(default_factory=list)


def _verify_open(
    v: _Verifier,
    report: PackReport,
    storage: Storage,
    ipath: str,
    use_index: bool,
    sample: tuple[str, float] | None,
    seed: int,
    frames: tuple[int, int | None] | None,
) -> None:
    """Verify an opened pack: its ends, then its index against it, then every frame asked for."""
    ends = _check_ends(v, storage)
    read = _IndexRead()
    if use_index:
        got = _read_index(v, report, storage, ipath, ends, sample, seed, frames)
        if got is None:
            return  # the index that names the frames asked for is unreadable: nothing more to check
        read = got
    if read.meta is not None:
        _check_index_with_pack(v, storage.location, ipath, read.table, read.meta, ends)
    trailer = ends.trailer
    n = read.rows if read.table is not None else (trailer.frame_count if trailer is not None else 0)
    report.frames_total = n
    data_end_known = trailer is not None
    end = trailer.data_end if trailer is not None else ends.size
    if trailer is None and ends.tail[:8] == TRAILER_MAGIC and ends.size >= HEADER_SIZE + TRAILER_SIZE:
        end, data_end_known = ends.size - TRAILER_SIZE, True  # trailer bytes damaged, but it is where it should be
    if read.table is not None:
        _walk_indexed(v, report, storage, read, n, end, data_end_known, ends)
        return
    stop_pos = v.walk(HEADER_SIZE, 0, None, end, data_end_known, None, trailer.frame_count if trailer else None)
    report.frames_total = max(n, v.next_id)
    if trailer is not None and v.next_id != trailer.frame_count:
        v.add("trailer", f"{storage.location}: found {v.next_id} records, trailer says {trailer.frame_count}")
    _check_end(v, stop_pos, ends.size, end, trailer, data_end_known)


def _check_ends(v: _Verifier, storage: Storage) -> _Ends:
    """The header, the zstd dictionary in record 0 (the verifier's decompressor is set up with
    it) and the trailer, each damage reported once."""
    where = storage.location
    size = storage.size()
    head = storage.read_at(0, HEADER_SIZE)
    tail = storage.read_at(size - TRAILER_SIZE, TRAILER_SIZE) if size >= TRAILER_SIZE else b""
    header: Header | None = None
    try:
        header = Header.decode(head, where)
    except NotAPack:
        if tail[:8] != TRAILER_MAGIC:
            raise
        v.add("header", f"{where}: header magic is corrupt (found {head[:8].hex(' ')})")
    except UnsupportedVersion:
        raise
    except FormatError as e:
        v.add("header", str(e))
    dictionary, lost = None, False
    if header is None or header.flags & FLAG_DICT:
        # a damaged header is one problem of the header: record 0 still holds the dictionary
        try:
            dictionary = read_dictionary(storage)
        except FormatError as e:
            if header is not None:
                v.add("record", f"{e} (the frames compressed with it are not checked)", 0)
                lost = True
    v.decompressor = Decompressor(dictionary, where, dictionary_lost=lost)  # a stray compressed frame is still checked
    trailer: Trailer | None = None
    try:
        trailer = Trailer.decode(tail, size, header, where)
    except FormatError as e:
        v.add("trailer", str(e))
    return _Ends(size, head, tail, header, trailer)


def _read_index(
    v: _Verifier,
    report: PackReport,
    storage: Storage,
    ipath: str,
    ends: _Ends,
    sample: tuple[str, float] | None,
    seed: int,
    frames: tuple[int, int | None] | None,
) -> _IndexRead | None:
    """The index of the generation opened, read whole (every page against its CRC, the file
    against its md5), and the rows the selection asks for. An index that is damaged is a
    problem: a full check goes on from the pack alone (an ``_IndexRead`` without a table), a
    selection, which the index names, stops (None)."""
    uuids = {str(u.uuid) for u in (ends.header, ends.trailer) if u is not None}
    try:
        index, meta = pinned_index(storage, ipath, uuids)
    except UnsupportedVersion:
        raise
    except FormatError as e:  # a damaged footer: one index problem, and a full check goes on without it
        v.add("index", f"{e}; rebuild it with 'hframe index PACK --rebuild'")
        if sample is not None or frames is not None:
            return None  # the frames asked for are named by the index
        report.mode = "no-index"
        return _IndexRead()
    try:
        if uuids and meta.pack_uuid not in uuids:
            raise InputError(
                f"{ipath}: index belongs to another pack (index UUID {meta.pack_uuid}, pack "
                f"{' / '.join(sorted(uuids))}); rebuild it with 'hframe index PACK --rebuild'"
            )
        footer = pq.ParquetFile(index.stream()).metadata
        rows = footer.num_rows
        damage = file_digest_problem(index.read_at, index.size(), footer.metadata, ipath)
        if damage is not None:
            v.add("index", f"{damage}; rebuild it with 'hframe index PACK --rebuild'")
        ranges, report.selection = _selection(rows, meta.payload_bytes, sample, seed, frames)
        try:
            table = IndexCols.read(ipath, stream=index.stream())
            if table.num_rows != rows:  # the footer's count was hit, or a row group's
                raise FormatError(f"{ipath}: index holds {table.num_rows} rows, its footer says {rows}")
            if rows != meta.frame_count:
                v.add("index", f"{ipath}: index has {rows} rows, its metadata says {meta.frame_count}")
        except FormatError as e:
            # a damaged page: a full check still checks every frame, from the pack alone
            v.add("index", f"{e}; rebuild it with 'hframe index PACK --rebuild'")
            if report.selection != "full":
                return None  # the frames asked for are named by the index: nothing more to check
            report.mode = "no-index"
            return _IndexRead(None, rows, meta)  # its metadata is still compared with the pack
    finally:
        index.close()
    return _IndexRead(table, rows, meta, ranges)


def _check_index_with_pack(
    v: _Verifier, where: str, ipath: str, table: pa.Table | None, meta: IndexMeta, ends: _Ends
) -> None:
    """What the index says as a whole against itself and the pack: frame ids and source sizes
    (where its rows could be read), frame count and pack size (from its metadata)."""
    for row, value in wrong_frame_ids(table) if table is not None else ():
        v.add("index", f"{ipath}: row {row} has frame_id {value} (frame ids are row numbers)", row)
    for row, source_size, raw_length in wrong_source_sizes(table) if table is not None else ():
        v.add(
            "index",
            f"{ipath}: row {row}: source_size {source_size} is not the frame's raw length {raw_length} "
            "(a frame not cut from a video is its whole source file)",
            row,
        )
    if ends.trailer is not None and meta.frame_count != ends.trailer.frame_count:
        v.add("index", f"{ipath}: index says {meta.frame_count} frames, pack trailer says {ends.trailer.frame_count}")
    if meta.pack_bytes != ends.size:
        v.add(
            "index",
            f"{where}: pack is {ends.size} bytes, index says {meta.pack_bytes} "
            f"({'truncated' if ends.size < meta.pack_bytes else 'bytes appended'}?)",
        )


def _walk_indexed(
    v: _Verifier,
    report: PackReport,
    storage: Storage,
    read: _IndexRead,
    n: int,
    end: int,
    data_end_known: bool,
    ends: _Ends,
) -> None:
    """Walk the frames the selection names, with the index: a full check in parallel parts
    where it pays, else run by run (a sample's runs prefetched at once)."""
    table, ranges = read.table, read.ranges
    assert table is not None
    # --max-errors walks in one part: "the first N problems" must not depend on how parts race
    if (
        report.selection == "full"
        and v.processes > 1
        and v.max_errors is None
        and n > 1
        and end - HEADER_SIZE >= 2 * _PART_MIN_BYTES
    ):
        stop_pos = _walk_in_parallel(v, table, n, end, data_end_known)
        _check_end(v, stop_pos, ends.size, end, ends.trailer, data_end_known)
        return
    # a selection of most rows converts them all: simpler and no slower
    idx = IndexCols.from_table(table, ranges if sum(b - a for a, b in ranges) * 2 <= n else None)
    if report.selection != "full" and len(ranges) > 1:
        # a sample reads many separate runs: ask for all of them at once, so a cold disk
        # serves them in parallel instead of one seek after another
        starts, lengths = [], []
        for a, b in ranges:
            if a < b:
                start = idx.record_offset[a] if a > 0 else HEADER_SIZE
                stop = min(end, idx.offset[b - 1] + idx.length[b - 1])
                if 0 <= start < stop:
                    starts.append(start)
                    lengths.append(stop - start)
        storage.prefetch(starts, lengths)
    for a, b in ranges:
        if a >= b:
            continue
        start = idx.record_offset[a] if a > 0 else HEADER_SIZE
        run_end = min(end, idx.offset[b - 1] + idx.length[b - 1]) if report.selection != "full" else end
        stop_pos = v.walk(start, a, b, end, data_end_known, idx, read_end=max(run_end, start))
        if report.selection == "full":
            _check_end(v, stop_pos, ends.size, end, ends.trailer, data_end_known)


class _SharedProgress:
    """Progress of forked walkers, seen by the parent: each child keeps its running (frames,
    bytes) in its slot of a shared anonymous mapping; whenever the parent reports its own
    progress it adds what the children did since it last looked. ``settle`` reports the rest of
    a child's part once its result is in (or, for a child that failed, forgets it: the parent
    walks that part itself), so the totals come out exact."""

    def __init__(self, children: int, report: ProgressFn | None) -> None:
        self.report = report
        self.map = mmap.mmap(-1, 16 * max(1, children)) if report is not None else None
        self.seen = [[0, 0] for _ in range(children)]
        self.settled = [False] * children

    def child_progress(self, slot: int) -> ProgressFn:
        done = [0, 0]

        def tell(frames: int, nbytes: int) -> None:
            done[0] += frames
            done[1] += nbytes
            if self.map is not None:
                struct.pack_into("<qq", self.map, 16 * slot, done[0], done[1])

        return tell

    def parent_progress(self, frames: int, nbytes: int) -> None:
        if self.report is None or self.map is None:
            return
        for slot, seen in enumerate(self.seen):
            if not self.settled[slot]:
                f, b = struct.unpack_from("<qq", self.map, 16 * slot)
                frames, nbytes = frames + f - seen[0], nbytes + b - seen[1]
                seen[0], seen[1] = f, b
        self.report(frames, nbytes)

    def settle(self, slot: int, frames: int, nbytes: int) -> None:
        """Child ``slot`` checked ``frames`` and ``nbytes`` in all (0, 0: its part is walked again)."""
        self.settled[slot] = True
        if self.report is not None:
            seen = self.seen[slot]
            self.report(frames - seen[0], nbytes - seen[1])
            seen[0], seen[1] = frames, nbytes

    def close(self) -> None:
        if self.map is not None:
            self.map.close()


def _walk_in_parallel(v: _Verifier, table: pa.Table, n: int, end: int, data_end_known: bool) -> int:
    """Walk the pack as ``v.processes`` contiguous parts at once: forked children take parts
    1.., this process part 0; problems come back in frame order. Returns where the last part
    ended. Falls back to one walk if the index's record offsets are not in order.

    A part's result is used only if the part before it ended exactly where it began (same
    position, next frame id). Where damage breaks that seam, the rest of the pack is walked
    here in one go, from where the walk really is: the report is then what one walk gives.

    Each process converts only its own part's index rows up front (others on demand, see
    ``IndexCols.ensure``), so that work is shared out too."""
    rofs = int64_column(table, "record_offset")
    if any(b < a for a, b in zip(rofs, rofs[1:])):
        return v.walk(HEADER_SIZE, 0, n, end, data_end_known, IndexCols.from_table(table))

    def rows(a: int, b: int) -> IndexCols:
        return IndexCols.from_table(table, [(min(a, n), min(n, b + 1))])

    parts_n = min(v.processes, n, max(1, (end - HEADER_SIZE) // _PART_MIN_BYTES))
    cuts = [0]
    for k in range(1, parts_n):
        target = HEADER_SIZE + (end - HEADER_SIZE) * k // parts_n
        cuts.append(max(cuts[-1] + 1, min(n - (parts_n - k), bisect.bisect_left(rofs, target))))
    cuts.append(n)
    parts = [(cuts[k], cuts[k + 1]) for k in range(parts_n) if cuts[k] < cuts[k + 1]]
    children: list[tuple[int, int]] = []
    shared = _SharedProgress(len(parts) - 1, v.on_progress)
    outer = v.on_progress
    v.on_progress = shared.parent_progress if outer is not None else None

    def walk_part(slot: int, a: int, b: int, w: int) -> None:
        """In a forked child: walk part [a, b) and send back what it found."""
        child = _Verifier(
            PackReport(v.r.pack, v.r.index, v.r.mode, v.r.selection),
            v.storage,
            v.max_errors,
            v.decode,
            shared.child_progress(slot) if outer is not None else None,
        )
        child.decompressor = v.decompressor
        pos, nxt = -1, -1
        try:
            pos = child.walk(
                rofs[a], a, b, end, data_end_known, rows(a, b), read_end=rofs[b] if b < n else end, report_to=n
            )
            nxt = child.next_id
        except _TooManyProblems:
            pass
        r = child.r
        write_all(w, pickle.dumps((r.problems, r.frames_checked, r.bytes_checked, pos, nxt, r.stopped_early)))

    try:
        for slot, (a, b) in enumerate(parts[1:]):
            r, w = os.pipe()
            with signals_held():  # a signal is taken once the child is in its try, and listed below
                pid = os.fork()
                if pid == 0:  # the child: walk its part, send back what it found, exit without cleanup
                    os.close(r)
                    code = 0
                    try:
                        release_signals()  # now a signal ends this child through the except below
                        walk_part(slot, a, b, w)
                    except BaseException:  # noqa: BLE001 - report by exit status; the parent re-walks the part
                        code = 1
                    finally:
                        os._exit(code)
                os.close(w)
                children.append((pid, r))
        pos = v.walk(
            HEADER_SIZE,
            0,
            parts[0][1],
            end,
            data_end_known,
            rows(*parts[0]),
            read_end=rofs[parts[0][1]] if parts[0][1] < n else end,
            report_to=n,
        )
        nxt = v.next_id
        children_done = 0
        for (pid, r), (a, b) in zip(children, parts[1:]):
            if nxt < a:  # the walk stopped inside the part before (data ends, no record found):
                return pos  # one walk stops there too, having reported every frame after it
            if (pos, nxt) != (rofs[a], a):  # the seam does not join: the rest in one walk, here
                return v.walk(pos, nxt, n, end, data_end_known, rows(nxt, n))
            chunks = []
            while True:
                data = os.read(r, 1 << 20)
                if not data:
                    break
                chunks.append(data)
            os.close(r)
            status = reap(pid)  # (0 when SIGCHLD is ignored: then the message tells)
            children = [c for c in children if c[0] != pid]
            try:
                found = pickle.loads(b"".join(chunks)) if status == 0 and chunks else None
            except Exception:  # noqa: BLE001 - a message cut short: the child failed
                found = None
            if found is None:  # the child failed: walk its part here
                shared.settle(children_done, 0, 0)
                children_done += 1
                pos = v.walk(rofs[a], a, b, end, data_end_known, rows(a, b), report_to=n)
                nxt = v.next_id
                continue
            problems, frames, nbytes, pos, nxt, stopped = found
            v.r.frames_checked += frames
            v.r.bytes_checked += nbytes
            shared.settle(children_done, frames, nbytes)
            children_done += 1
            for p in problems:
                v.keep(p)
            if stopped:
                v.r.stopped_early = True
                raise _TooManyProblems
        return pos
    finally:
        v.on_progress = outer
        shared.close()
        for pid, r in children:  # stopped early: do not wait for the rest
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.close(r)
            reap(pid)


def _check_end(v: _Verifier, pos: int, size: int, end: int, trailer: Trailer | None, data_end_known: bool) -> None:
    """After a full walk: the records must end exactly where the trailer starts."""
    where = v.where
    if data_end_known:
        if pos < end:
            v.add("layout", f"{where}: {end - pos} unindexed bytes between the last frame (ends {pos}) and the trailer")
        return
    # no valid trailer at the end of the file: maybe a good one sits earlier, followed by junk
    tail = v.storage.read_at(pos, TRAILER_SIZE)
    if tail[:8] == TRAILER_MAGIC:
        try:
            t = Trailer.parse(tail, where)
        except IncompletePack:
            return
        if t.data_end == pos:
            v.add(
                "trailer",
                f"{where}: {size - pos - TRAILER_SIZE} unexpected bytes after the trailer (at {pos + TRAILER_SIZE})",
            )


NO_MATCH = "no file matches this pattern"


def _expand(paths: Sequence[str]) -> Iterator[tuple[str, str | None, Any]]:
    """Packs to check, each with None or why it cannot be, and for a dataset's shard the
    manifest's entry for it: globs expanded (a pattern that matches nothing is one entry,
    ``NO_MATCH``); a sharded dataset stands for its shards."""
    from ..read.dataset import Manifest, is_dataset, manifest_location

    for p in expand_globs(paths):
        manifest = manifest_location(p)
        if is_dataset(p):
            m = Manifest.load(manifest)
            yield from ((shard, None, entry) for shard, entry in zip(m.shard_paths(manifest), m.shards))
        elif not is_remote(p) and not os.path.lexists(p) and any(c in p for c in "*?["):
            yield p, NO_MATCH, None
        else:
            yield p, None, None


def _check_shard(report: PackReport, shard: str, entry: Any) -> None:
    """A dataset's shard must be the pack its manifest names (UUID, frames, size): another one
    (a shard swapped or rebuilt alone) makes the dataset's readers fail."""
    try:
        with open_storage(shard) as storage:
            info = read_pack_info(storage)
    except HframeError:
        return  # verify_pack reported why it cannot be read
    if (info.uuid, info.trailer.frame_count, info.size) != (entry.uuid, entry.frame_count, entry.pack_bytes):
        report.problems.insert(
            0,
            Problem(
                "manifest",
                f"{shown_url(shard)}: not the shard the dataset manifest names (it is {info.uuid}, "
                f"{info.trailer.frame_count} frames, {info.size} bytes; the manifest says {entry.uuid}, "
                f"{entry.frame_count} frames, {entry.pack_bytes} bytes); rebuild the manifest with "
                "'hframe index OUT --merge' or repack the dataset",
                expected=entry.uuid,
                found=info.uuid,
            ),
        )


def planned_work(
    path: str,
    *,
    use_index: bool = True,
    sample: tuple[str, float] | None = None,
    seed: int = 0,
    frames: tuple[int, int | None] | None = None,
    **_: Any,
) -> tuple[int, int]:
    """The frames and bytes ``verify_pack`` will check in ``path``, from the index footer (or the
    pack trailer) alone; a sample's bytes are estimated from the mean frame. (0, 0) when the
    pack or index cannot tell: ``verify_pack`` then says why."""
    try:
        if use_index:
            if is_remote(path):  # a request or two; only asked where a bar is shown
                with open_storage(index_location(path)) as index:
                    meta = read_index_meta(index_location(path), stream=index.stream())
            else:
                meta = read_index_meta(index_location(path))
            ranges, _label = _selection(meta.frame_count, meta.payload_bytes, sample, seed, frames)
            n = sum(b - a for a, b in ranges)
            return n, meta.payload_bytes * n // max(1, meta.frame_count)
        if is_remote(path):
            return 0, 0
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TRAILER_SIZE))
            try:
                t = Trailer.parse(f.read(TRAILER_SIZE), path)
            except HframeError:  # no trailer (a truncated pack): its bytes at least bound the walk
                return 0, max(0, size - HEADER_SIZE)
        return t.frame_count, max(0, t.data_end - HEADER_SIZE)
    except (HframeError, OSError, ValueError):
        return 0, 0


class _Tally:
    """The progress of several packs as one (frames, bytes) count for a bar: within a pack at most
    what was planned for it (where a plan is known: 0 means unknown, not capped), and once it is
    done exactly that, so the bar ends at its total whatever a pack turned out to hold."""

    def __init__(self, update: Callable[[int, int], None]) -> None:
        self.update = update
        self.base = [0, 0]
        self.cur = [0, 0]
        self.plan = (0, 0)

    def start(self, plan: tuple[int, int]) -> None:
        self.plan, self.cur = plan, [0, 0]

    def add(self, frames: int, nbytes: int) -> None:
        self.cur[0] += frames
        self.cur[1] += nbytes
        frames, nbytes = (c if p == 0 else min(c, p) for c, p in zip(self.cur, self.plan))
        self.update(self.base[0] + frames, self.base[1] + nbytes)

    def done(self) -> None:
        self.base = [b + (c if p == 0 else p) for b, c, p in zip(self.base, self.cur, self.plan)]
        self.update(*self.base)


def verify_packs(
    paths: Sequence[str | os.PathLike[str]],
    *,
    on_pack: Callable[[PackReport], None] | None = None,
    max_errors: int | None = None,
    progress: Callable[[int, int], contextlib.AbstractContextManager[Callable[[int, int], None] | None]] | None = None,
    part: tuple[int, int] | None = None,
    **options: Any,
) -> VerifyReport:
    """Verify several packs (glob patterns expanded); ``max_errors`` counts across all of them.

    ``progress``, if given, is called once with the frames and bytes to check in all
    (``planned_work``) and returns a context manager yielding a callback for the running totals
    ``(frames, bytes)`` (or None), as ``pack``'s ``progress`` does.

    ``part`` = (I, N): only part I of N of the packs (after globs and datasets are expanded, in
    order): contiguous, balanced by bytes, the same split in every part (``--shard-of``);
    ``VerifyReport.merged`` joins the parts' reports."""
    reports: list[PackReport] = []
    left = max_errors
    targets = list(_expand([os.fspath(x) for x in paths]))
    everything = len(targets)
    if part is not None:
        lo, hi = balanced_part([_weight(p, entry) for p, _, entry in targets], *part)
        targets = targets[lo:hi]
    plans = [planned_work(p, **options) if why is None else (0, 0) for p, why, _ in targets] if progress else []
    total = (sum(f for f, _ in plans), sum(b for _, b in plans))
    with progress(*total) if progress is not None else contextlib.nullcontext(None) as update:
        tally = _Tally(update) if update is not None else None
        for k, (p, why, entry) in enumerate(targets):
            if tally is not None:
                tally.start(plans[k])
                options["on_progress"] = tally.add
            if why is not None:
                rep = PackReport(p, None, "index", "full", error=why)
            else:
                rep = verify_pack(p, max_errors=left, **options)
                if entry is not None and rep.error is None:
                    _check_shard(rep, p, entry)
            if tally is not None:
                tally.done()
            reports.append(rep)
            if on_pack is not None:
                on_pack(rep)
            if left is not None:
                left -= len(rep.problems)
                if left <= 0:
                    break
    return VerifyReport(reports, part=(part[0], part[1], everything) if part is not None else None)


def merge_reports(files: Sequence[str]) -> VerifyReport:
    """One verdict from the ``verify --json`` reports in ``files`` (``-`` for stdin)."""
    import json
    import sys

    docs = []
    for f in files:
        try:
            text = sys.stdin.read() if f == "-" else open(f, encoding="utf-8").read()
            docs.append((f, json.loads(text)))
        except OSError as e:
            raise InputError(f"{f}: cannot read: {e.strerror or e}") from None
        except ValueError as e:
            raise InputError(f"{f}: not a JSON report ({e})") from None
        if not isinstance(docs[-1][1], dict):
            raise InputError(f"{f}: not a verify --json report")
    return VerifyReport.merged(docs)


def _weight(path: str, entry: Any) -> int:
    """What a pack weighs in a split: its size (from the manifest, or the file), else 1."""
    if entry is not None:
        return max(1, int(entry.pack_bytes))
    try:
        return max(1, os.path.getsize(path)) if not is_remote(path) else 1
    except OSError:
        return 1


# -- the packing self-check ---------------------------------------------------------------

_EXCEPTIONS: dict[str, type[IntegrityError]] = {"md5": ChecksumMismatch, "magic": MagicMismatch}


def self_check(
    pack_path: str | os.PathLike[str], index_path: str | os.PathLike[str], frames: int = DEFAULT_SELF_CHECK
) -> int:
    """Evict the pack from the page cache, read back the first ``frames`` frames, compare with the index.

    Returns:
        The number of frames checked.

    Raises:
        ChecksumMismatch / MagicMismatch / IntegrityError: the first problem found.
        FormatError: the pack or index cannot be read.
    """
    evict_from_page_cache(pack_path)
    meta = read_index_meta(index_path)
    n = min(max(frames, 0), meta.frame_count)
    if n == 0:
        return 0
    rep = verify_pack(pack_path, index_path=index_path, frames=(0, n), max_errors=1, workers=1)
    if rep.error:
        raise FormatError(rep.error)
    if rep.problems:
        p = rep.problems[0]
        raise _EXCEPTIONS.get(p.check, IntegrityError)(p.message)
    return rep.frames_checked
