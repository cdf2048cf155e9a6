"""Verify packs: every check a pack can fail, reported per frame; the front of the verify room.

``verify_pack`` walks the chain of record headers sequentially in large chunks (the pack's own
structure, independent of the index), hashing every payload (a large pack as one part per
core, in forked processes), and compares each record with its index row. Sound records take a
lean loop (``Verifier.clean_run``); the first record that is not sound takes the careful path,
which re-checks it and reports exactly what is wrong. Problems are attributed to exactly the
frames they damage:

- header / trailer: magic, version, checksum, position, UUID (pack-level, no frame id);
- index vs pack: UUID (another pack's index: cannot verify), frame count, pack size;
- layout: record header checksum, frame ids in order, index offset/length/record_offset/name
  equal to the record's, non-zero padding, bytes between frames, frames past the end (missing);
- content: md5 of the payload vs index and record header; magic bytes vs the recorded media
  type; optionally a full Pillow decode.

Here: opening one pack and its index, choosing what to check, and running the walk
(``walk.py``; in parallel parts, ``parallel.py``). Several packs at once are ``many.py``'s; the
packing self-check ``selfcheck.py``'s. This module re-exports them: ``verify.check`` stays the
room's front.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import (
    FormatError,
    HframeError,
    IncompletePack,
    InputError,
    NotAPack,
    StorageError,
    UnsupportedVersion,
)
from ..format.codec import Decompressor
from ..format.index import IndexMeta, file_digest_problem, index_location
from ..format.layout import (
    FLAG_DICT,
    HEADER_SIZE,
    TRAILER_MAGIC,
    TRAILER_SIZE,
    Header,
    Trailer,
)
from ..locations import shown_url
from ..processes import usable_cpus
from ..read.reader import read_dictionary
from ..read.snapshot import pinned_index, replaced_since, until_settled
from ..storage.access import Storage, open_storage, unpinned_and_moved
from . import parallel
from .columns import IndexCols, wrong_frame_ids, wrong_source_sizes
from .report import PackReport
from .walk import SAMPLE_BLOCK_BYTES, ProgressFn, TooManyProblems, Verifier

__all__ = ["frames_to_check", "verify_pack"]

# -- one pack -----------------------------------------------------------------------------


def frames_to_check(
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
        v = Verifier(report, storage, max_errors, decode, on_progress)
        # a big pack is walked as one part per core (default), in forked processes
        v.processes = max(1, workers if workers is not None else min(4, usable_cpus()))
        if getattr(storage, "remote", False):
            v.processes = 1  # a remote pack is read ahead by several requests in flight instead
        try:
            _verify_open(v, report, storage, ipath, use_index, sample, seed, frames)
        except TooManyProblems:
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
    """A remote pack that shows problems may have been replaced while it was read (its reads
    not pinned to a version, or pinned by an ETag that another version carries too: nginx's):
    then that is the finding (exit 3), not damage. A store that cannot be asked (it died
    meanwhile) is no sign of that: the read's own failure stands, and problems it cannot tell
    from a publish are not reported as damage."""
    if not (report.problems or report.error):
        return
    try:
        moved = _replaced(storage)
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


def _replaced(storage: Storage) -> bool:
    """``replaced_since`` the pack opened (its header, which the open's first answer holds);
    with no header to name it (damaged: reported already), ``unpinned_and_moved``."""
    try:
        opened = Header.decode(storage.read_at(0, HEADER_SIZE), storage.location)
    except HframeError:
        return unpinned_and_moved(storage)
    return replaced_since(storage, str(opened.uuid))


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
    v: Verifier,
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


def _check_ends(v: Verifier, storage: Storage) -> _Ends:
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
    v: Verifier,
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
        ranges, report.selection = frames_to_check(rows, meta.payload_bytes, sample, seed, frames)
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
    v: Verifier, where: str, ipath: str, table: pa.Table | None, meta: IndexMeta, ends: _Ends
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
    v: Verifier,
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
        and end - HEADER_SIZE >= 2 * parallel.PART_MIN_BYTES
    ):
        stop_pos = parallel.walk_in_parallel(v, table, n, end, data_end_known)
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


def _check_end(v: Verifier, pos: int, size: int, end: int, trailer: Trailer | None, data_end_known: bool) -> None:
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
