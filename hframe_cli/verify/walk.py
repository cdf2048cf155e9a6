"""The walk over a pack's records: chunked sequential reads, every record checked against its
index row, a lean loop for sound records (``Verifier.clean_run``) and a careful path that says
exactly what is wrong with the first record that is not (``verify.check`` runs it).

Imports inside functions: Pillow, only with ``verify --decode``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
from collections.abc import Callable
from typing import Any

from ..errors import (
    DictionaryUnavailable,
    FormatError,
)
from ..format.codec import DIGEST_IN_PIECES_ABOVE, Decompressor
from ..format.hashing import md5_each
from ..format.index import format_time_us
from ..format.layout import (
    CODEC_NAMES,
    KIND_IDS,
    KIND_NAMES,
    MEDIA_TYPES,
    RECORD_FIXED,
    RECORD_MAGIC,
    RECORD_STRUCT,
    TRAILER_MAGIC,
    TRAILER_SIZE,
    expected_magic,
    record_crc,
    record_field_problem,
    record_fields,
)
from ..sources.imagehead import pillow_message
from ..storage.access import LocalFile, Storage
from .columns import IndexCols
from .compiled import walk
from .report import PackReport, Problem

__all__ = ["CHUNK_BYTES", "ProgressFn", "SAMPLE_BLOCK_BYTES", "TooManyProblems", "UNCHECKED", "Verifier"]

CHUNK_BYTES = 16 << 20
SAMPLE_BLOCK_BYTES = 1 << 20  # sampled frames come in runs of neighbours about this many bytes long
_IMAGE_TYPES = frozenset({"jpeg", "png", "gif", "webp", "bmp", "tiff"})
_MAGICS = {m: expected_magic(m) for m in MEDIA_TYPES}

ProgressFn = Callable[[int, int], None]  # (frames, bytes) checked since the last call


class TooManyProblems(Exception):
    pass


# -- chunked sequential reads -----------------------------------------------------------


#: what the walk reads records from: a chunk read, or the pack's map (``_Window``)
Chunk = bytes | mmap.mmap

_BLOB_KIND = KIND_IDS["blob"]
_MAX_KIND = max(KIND_IDS.values())  # kind ids are 0..max (format/layout.py): a higher one takes the careful path


class _Window:
    """Sequential reads in large chunks; ``get(pos, n)`` returns (buffer, start) holding the range.
    With ``mapped`` (the local pack mapped read-only) the buffer is the map, the next chunks
    asked of the kernel ahead of the walk; a range beyond the map is read as without one."""

    def __init__(self, storage: Storage, end: int, chunk: int | None = None, mapped: mmap.mmap | None = None) -> None:
        self.storage = storage
        self.end = end
        self.chunk = chunk or CHUNK_BYTES
        self.buf: Chunk = b""
        self.start = 0
        self.mapped = mapped
        self._advised = 0  # (mapped: read-ahead asked for up to here; more once less than a chunk is left)

    def get(self, pos: int, n: int) -> tuple[Chunk, int]:
        if self.start <= pos and pos + n <= self.start + len(self.buf):
            return self.buf, pos - self.start
        m = self.mapped
        if m is not None and pos + n <= len(m):
            self.buf, self.start = m, 0
            self._advise(pos)
            return m, pos
        block = getattr(self.storage, "block_size", None)  # a remote pack read ahead in blocks
        if block and pos // block == (pos + n - 1) // block:
            # the whole block the range is in, as received (a copy of it would cost as much as the md5)
            first = pos - pos % block
            self.buf = self.storage.read_at(first, min(block, self.storage.size() - first))
            self.start = first
            return self.buf, pos - first
        self.mapped = None  # (beyond the map: read as without one)
        want = max(self.chunk, n) if not block else n
        want = min(want, max(self.end - pos, n))
        self.buf = self.storage.read_at(pos, want)
        self.start = pos
        return self.buf, 0

    def bound(self, pos: int, end: int) -> int:
        """Where a run of sound frames from ``pos`` stops at the latest (``clean_run``'s
        ``end``): ``end``, or in a map a chunk further (progress is reported and signals are
        taken between runs, as with chunked reads), the chunks after it asked for ahead."""
        if self.mapped is None or self.buf is not self.mapped:
            return end
        if pos + self.chunk > self._advised:
            self._advise(pos)
        return min(end, pos + self.chunk)

    def _advise(self, pos: int) -> None:
        """Ask the kernel for the next two chunks of the map (the walk is sequential)."""
        m = self.mapped
        assert m is not None
        first = pos - pos % mmap.PAGESIZE
        length = min(2 * self.chunk, len(m) - first)
        if length > 0:
            with contextlib.suppress(OSError, ValueError):
                m.madvise(mmap.MADV_WILLNEED, first, length)
        self._advised = first + length


#: A compressed frame in a batch: (codec, record flags, raw length, expected magic bytes or None).
Packed = tuple[int, int, int, "bytes | None"]


class _Queue:
    """Frames waiting to be hashed in one batch: (id, buffer, start, end), with the record's
    md5, offset and length of each; the compressed ones and those to decode."""

    __slots__ = ("buf", "frames", "meta", "packed", "decode_ids")

    def __init__(self) -> None:
        self.buf: Chunk | None = None
        self.frames: list[tuple[int, Chunk, int, int]] = []
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
    items: list[tuple[int, Chunk, int, int]],
    decode_ids: set[int],
    packed: dict[int, Packed] | None = None,
    decompressor: Decompressor | None = None,
) -> list[tuple[bytes, str | None]]:
    """md5 of each frame's raw bytes (decompressed first where stored compressed); a
    finding about the frame comes back as ``"check: message"``."""
    if not packed and not decode_ids and items and all(it[1] is items[0][1] for it in items):
        whole = memoryview(items[0][1])
        return [(d, None) for d in md5_each([whole[a:b] for _, _, a, b in items])]
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


class Verifier:
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
        #: a local pack read through a shared read-only map instead of chunked preads (no copy,
        #: no fresh buffer to zero: ~12 % of a warm verify's CPU). Only where dying is safe: a
        #: file cut short under the map would end the process with SIGBUS, so the forked walkers
        #: of ``parallel`` set it, and their parent walks a failed part again with preads
        self.mapped_reads = False
        self.report_to: int | None = None  # the walk reports missing frames up to this id
        self.decompressor: Decompressor | None = None  # set when the pack has compressed frames

    def add(self, check: str, message: str, frame_id: int | None = None, **kw: Any) -> None:
        self.keep(Problem(check, message, frame_id, **kw))

    def _map(self) -> mmap.mmap | None:
        """The local pack mapped whole, read-only, when ``mapped_reads`` (else, or when it
        cannot be mapped, None: chunked reads)."""
        if not self.mapped_reads or not isinstance(self.storage, LocalFile):
            return None
        try:
            return mmap.mmap(self.storage.fileno(), 0, prot=mmap.PROT_READ)
        except (OSError, ValueError):  # (an empty file, no address space: read as before)
            return None

    def keep(self, problem: Problem) -> None:
        """Record a problem; stop the walk once ``max_errors`` are recorded."""
        self.r.problems.append(problem)
        if self.max_errors is not None and len(self.r.problems) >= self.max_errors:
            self.r.stopped_early = True
            raise TooManyProblems

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
        win = _Window(self.storage, read_end if read_end is not None else end, mapped=self._map())
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
                    run_pos, run_i, run_bytes = self.clean_run_no_index(win.buf, win.start, pos, i, win.bound(pos, end))
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
                wb, ws, pos, i, fast.stop, win.bound(pos, end), fast.idx, fast.magics, fast.first
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
    ) -> tuple[Chunk, int, tuple[Any, ...]] | str:
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
        buf: Chunk,
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

    def clean_run_no_index(self, wb: Chunk, ws: int, pos: int, i: int, end: int) -> tuple[int, int, int]:
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
        wb: Chunk,
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
        This is the loop nearly every byte of a full verify goes through: keep it lean. It runs
        in C where that was built (``compiled.walk``, the same answer), else here.
        """
        if walk is not None:
            i0 = i
            pos, i, nbytes = walk.clean_run(
                wb, ws, pos, i, stop, end, idx.offset, idx.length, idx.record_offset, idx.raw_length, idx.codec,
                idx.names, idx.md5, idx.kind, idx.mtime_us, magics, first_id
            )  # fmt: skip
            if i > i0 and self.on_progress is not None:
                self.on_progress(i - i0, nbytes)
            return pos, i, nbytes
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
        batch: list[tuple[int, Chunk, int, int]],
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
