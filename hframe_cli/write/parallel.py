"""Packing plain sources on several processes, each writing its own chunks into the pack.

Small files cost per file (open, read, close, md5, a header, an index row), in Python, and a
single writer is one core however the reading is spread. Here N forked workers share the work:
the sources (from the first one not yet packed) are cut into chunks of consecutive files, and
worker ``c % N`` takes chunk ``c``. For each chunk a worker

1. loads and prepares every source exactly as the one-writer loop does (``_add_sources``:
   read whole, then hashed together and prepared as ``load_batch`` does, then ``add_loaded``;
   a plain blob with no object built for it),
   builds its records and index rows in memory (``writer.ChunkWriter``, whose ``add`` is
   ``PackWriter.add``), and sends the parent the chunk's size, frame count and problems;
2. waits for the parent to place the chunk: the byte offset and the first frame id, known as
   soon as the chunk before it is sized (not written);
3. writes the records there on its own copy of the pack's descriptor (a compiled chunk with
   one ``pwritev`` while it holds the run's write turn, ``ChunkWriter.write_at``; large
   records made in Python through a shared map of the pack, which the parent extended first;
   small ones with ``pwritev``), and sends back the rows (``WrittenChunk``).

The parent takes the chunks in order: it decides about bad inputs (fail, or skip them with
``--skip-bad``) when a chunk is sized, and takes the rows in (``PackWriter.append_chunk``),
reports progress and checkpoints once the chunk is on disk. Only the index and a 16-byte md5
per file cross a pipe, never the files' bytes, and the pack is byte for byte the one a single
writer makes (record headers, rows and the pack digest are produced by the same code, in the
same order).

Only for packs whose record sizes do not depend on where a record starts (no ``--align``, no
zstd dictionary), without videos (one input, many frames) or sources large enough to stream.
If a worker dies or sends something unreadable, every worker is killed and reaped (none can
write after that), the pack is cut back to the last chunk taken in, and the one-writer loop
does the rest. Workers keep the output lock's descriptor open: a run that finds the lock free
knows no worker of an earlier run can still write into the pack.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import signal
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..faults import fault_point
from ..format.hashing import md5_each
from ..format.layout import KIND_IDS, MAX_NAME_BYTES, SNIFF_BYTES, sniff_media_type
from ..processes import (
    fork_helper,
    fork_is_safe,
    keep_freed_heap,
    pipe_with_room,
    reap,
    receive_message,
    send_message,
    signals_held,
    usable_cpus,
)
from ..sources.located import shown
from ..sources.sourcelist import Rejected, Source
from .compiled import blobs
from .loading import STREAM_ABOVE, WITHOUT_SIZE, Loaded, add_loaded, finish, read_listed_bytes, read_unhashed
from .writer import ChunkWriter, PackWriter, WrittenChunk

if TYPE_CHECKING:
    from ..errors import InputError, Interrupted
    from ..sources.media import FramePrep, MediaOptions
    from ..sources.sourcelist import SourceList
    from .guard import StopSignals


class Settings(Protocol):
    """The run's settings the workers' parent reads (``settings.PackSettings``)."""

    @property
    def skip_bad(self) -> bool: ...
    @property
    def media(self) -> MediaOptions: ...
    @property
    def on_progress(self) -> Callable[[int, int], None] | None: ...
    @property
    def on_event(self) -> Callable[[str], None] | None: ...


class Run(Protocol):
    """What the packing loop (``run._Run``) shares with the workers' parent."""

    writer: PackWriter
    sources: SourceList

    @property
    def settings(self) -> Settings: ...

    prep: FramePrep
    videos: bool
    skipped: list[Rejected]
    done_bytes: int

    def bad_input(self, path: str, error: str) -> InputError: ...
    def warn(self, src: Source, problem: str, consequence: str) -> None: ...
    def interrupted(self, stop: StopSignals, signum: int, next_source: int, where: str) -> Interrupted: ...
    def checkpoint_due(self) -> bool: ...
    def checkpoint(self, next_source: int, why: str, *, wait: bool = True) -> None: ...
    def settle(self, *, done: bool = True) -> None: ...


__all__ = ["CHUNK_BYTES", "CHUNK_FILES", "fanout_workers", "write_chunks"]

#: A chunk holds up to this many files or bytes (the last file may take it past).
CHUNK_FILES = 1024
CHUNK_BYTES = 8 << 20
#: Fewer sources than this, by default, are packed by the one-writer loop: forking costs more.
_DEFAULT_ABOVE_FILES = 2000
_DEFAULT_ABOVE_BYTES = 64 << 20
_MAX_DEFAULT_WORKERS = 8
_PLACE = struct.Struct("<QQ")
_PIPE_BYTES = 1 << 20
_BLOB, _IMAGE = KIND_IDS["blob"], KIND_IDS["image"]


def fanout_workers(run: Run, start: int, workers: int | None) -> int:
    """How many worker processes should write sources ``start`` onwards (0: the one-writer
    loop does).

    ``workers`` given (``--workers N``, N >= 2) asks for N whenever this pack allows it; by
    default there is one per usable CPU (at most 8) when the sources are many or large enough
    to pay for the forks.
    """
    writer = run.writer
    sizes = run.sources.sizes[start:]
    if workers is not None and workers < 2:
        return 0
    if writer.alignment != 1 or writer.dictionary is not None or run.videos or not sizes:
        return 0
    if max(sizes) > STREAM_ABOVE or not fork_is_safe():
        return 0
    if workers is not None:
        return workers
    if usable_cpus() < 2 or (len(sizes) < _DEFAULT_ABOVE_FILES and sum(sizes) < _DEFAULT_ABOVE_BYTES):
        return 0
    return min(usable_cpus(), _MAX_DEFAULT_WORKERS)


def _cut(sizes: Sequence[int], start: int, workers: int) -> list[tuple[int, int]]:
    """Chunks of consecutive sources, as (first, end) source numbers, from ``start`` on; at
    least a few per worker when there are enough sources, so that the work stays shared to
    the end."""
    count = len(sizes) - start
    per_chunk = max(1, min(CHUNK_FILES, count // (4 * workers)))
    bounds, first, size = [], start, 0
    for k in range(start, len(sizes)):
        size += sizes[k]
        if k + 1 - first >= per_chunk or size >= CHUNK_BYTES:
            bounds.append((first, k + 1))
            first, size = k + 1, 0
    if first < len(sizes):
        bounds.append((first, len(sizes)))
    return bounds


@dataclass
class _Sized:
    """A worker's first answer for a chunk: its size, frames and problems (source number,
    whether it is an error, what is wrong)."""

    size: int
    frames: int
    problems: list[tuple[int, bool, str]]


@dataclass
class _Worker:
    pid: int
    answers: int  # its messages to us
    orders: int  # ours to it
    placed: deque[int] = field(default_factory=deque)


class _WorkerLost(Exception):
    """A worker ended or sent something unreadable: the one-writer loop takes over."""


def write_chunks(run: Run, start: int, stop: StopSignals, faults: bool, workers: int) -> int:
    """Pack sources ``start`` onwards with ``workers`` processes, as ``_Run._write_loaded``
    would. Returns the first source not packed: all of them, or where the one-writer loop must
    take over (a worker was lost, or no worker could be forked)."""
    sources = run.sources
    paths, _, sizes, _ = sources.columns()  # read as columns: no object per source
    bounds = _cut(sizes, start, workers)
    writer = run.writer
    writer.cut_back()  # what is buffered goes to disk first: workers write after it
    writer.maps_coherently()  # asked once here: the workers inherit the answer (no file opened in each)
    strict = run.settings.media.strict_images
    fds = (writer.fileno(), *writer.lock_fileno())
    crew: list[_Worker] = []
    sized: dict[int, _Sized] = {}
    merged = 0  # chunks taken in
    try:
        with signals_held():  # a signal is taken only once every worker is known to the finally below
            for w in range(workers):
                answers_r, answers_w = pipe_with_room(_PIPE_BYTES)
                orders_r, orders_w = os.pipe()
                pid = fork_helper(
                    functools.partial(
                        _work, sources, bounds[w::workers], run.prep, strict, writer, answers_w, orders_r
                    ),
                    answers_w,
                    orders_r,
                    *fds,
                )
                os.close(answers_w)
                os.close(orders_r)
                if pid < 0:
                    os.close(answers_r)
                    os.close(orders_w)
                    return start  # could not fork: the caller packs everything itself
                crew.append(_Worker(pid, answers_r, orders_w))
        at, frame = writer.position, len(writer)
        for c in range(len(bounds)):
            worker = crew[c % workers]
            while worker.placed:  # the chunk this worker had before, the oldest not taken in
                prev = worker.placed.popleft()
                _take_in(run, sources, worker, bounds[prev], sized.pop(prev), stop, faults)
                merged += 1
            answer = _receive(worker.answers)
            if not isinstance(answer, _Sized):
                raise _WorkerLost
            for k, is_error, problem in answer.problems:
                if is_error and not run.settings.skip_bad:
                    raise run.bad_input(paths[k], problem)
            sized[c] = answer
            writer.reserve(at, answer.size, answer.frames)  # a chunk to be mapped: the file holds it first
            try:
                os.write(worker.orders, _PLACE.pack(at, frame))
            except BrokenPipeError:
                raise _WorkerLost from None
            worker.placed.append(c)
            at, frame = at + answer.size, frame + answer.frames
        for c in range(merged, len(bounds)):
            worker = crew[c % workers]
            worker.placed.popleft()
            _take_in(run, sources, worker, bounds[c], sized.pop(c), stop, faults)
            merged += 1
        return len(sources)
    except _WorkerLost:
        _stop_crew(crew)  # none of them writes after this
        crew = []
        run.settle()  # no checkpoint thread left: the one-writer loop may fork its loader again
        writer.cut_back()  # the bytes of chunks placed but not taken in
        first = bounds[merged][0]
        if run.settings.on_event is not None:
            run.settings.on_event(f"pack: a packing worker stopped; packing on from file {first + 1:,} in this process")
        return first
    finally:
        _stop_crew(crew)


def _take_in(
    run: Run,
    sources: SourceList,
    worker: _Worker,
    bounds: tuple[int, int],
    sized: _Sized,
    stop: StopSignals,
    faults: bool,
) -> None:
    """Take in the worker's chunk, written: rows, problems, progress, checkpoint."""
    chunk = _receive(worker.answers)
    if not isinstance(chunk, WrittenChunk):
        raise _WorkerLost
    first, end = bounds
    run.writer.append_chunk(chunk)
    for k, is_error, problem in sized.problems:
        if is_error:
            run.skipped.append(Rejected(shown(sources.paths[k]), problem))
        else:
            run.warn(sources.source(k), problem, WITHOUT_SIZE)
    run.done_bytes += sum(sources.sizes[first:end])
    settings = run.settings
    if settings.on_progress is not None:
        settings.on_progress(len(run.writer), run.done_bytes)
    if faults:
        for _ in range(len(chunk.rows)):
            fault_point("after-frame")
    if stop.signum is not None:
        raise run.interrupted(stop, stop.signum, end, "")
    if run.checkpoint_due():
        run.checkpoint(end, "periodic", wait=False)  # the workers go on while the disk catches up


def _receive(fd: int) -> object:
    body = receive_message(fd)
    if body is None:
        raise _WorkerLost
    try:
        return pickle.loads(body)
    except Exception as e:  # noqa: BLE001 - a broken message: the one-writer loop takes over
        raise _WorkerLost from e


def _stop_crew(crew: list[_Worker]) -> None:
    """Kill and reap every worker (a finished one has exited already), close the pipes."""
    for w in crew:
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.pid, signal.SIGKILL)
    for w in crew:
        reap(w.pid)
        for fd in (w.answers, w.orders):
            with contextlib.suppress(OSError):
                os.close(fd)


def _work(
    sources: SourceList,
    mine: list[tuple[int, int]],
    prep: FramePrep,
    strict: bool,
    writer: PackWriter,
    answers: int,
    orders: int,
) -> None:
    """A worker: load, size, wait to be placed, write, for each of its chunks in turn."""
    keep_freed_heap()
    fd, path = writer.fileno(), writer.partial_path
    for first, end in mine:
        chunk = ChunkWriter(fd, path)
        problems: list[tuple[int, bool, str]] = []
        _add_sources(chunk, sources, first, end, prep, strict, problems)
        send_message(answers, pickle.dumps(_Sized(chunk.position, len(chunk), problems), pickle.HIGHEST_PROTOCOL))
        order = os.read(orders, _PLACE.size)
        if len(order) != _PLACE.size:
            return  # the parent stopped
        at, frame = _PLACE.unpack(order)
        written = chunk.write_at(at, frame)
        if hasattr(os, "posix_fadvise"):  # start writeback now: the final fsync has less to wait for
            os.posix_fadvise(fd, at, written.size, os.POSIX_FADV_DONTNEED)
        send_message(answers, pickle.dumps(written, pickle.HIGHEST_PROTOCOL))


def _add_sources(
    chunk: ChunkWriter,
    sources: SourceList,
    first: int,
    end: int,
    prep: FramePrep,
    strict: bool,
    problems: list[tuple[int, bool, str]],
) -> None:
    """Load, prepare and add sources ``first``..``end - 1`` to ``chunk`` as the one-writer loop
    does (``load_batch``, then ``add_loaded``), noting each problem as (source number,
    whether it is an error, what is wrong). A file that is a blob stored as it is (most of a
    pack of small files) is read (``read_listed_bytes``) and added (``add_blob``, its media type
    sniffed once) with no object built for it; anything else takes the general path. The
    chunk's sources are all read before any is hashed: their md5s are computed together."""
    paths, names, sizes, mtimes = sources.columns()
    plain = prep.plain_blobs
    if plain and blobs is not None:  # the compiled loop, when it can take every file of the chunk
        got = blobs.read_chunk(
            paths,
            sizes,
            mtimes,
            names,
            first,
            end,
            MAX_NAME_BYTES,
            STREAM_ABOVE,
            _BLOB,
            _IMAGE,
            prep.options.image_meta,
        )
        if got is not None:
            chunk.add_records(names[first:end], mtimes[first:end], got, blobs.number)
            return
    # every source of the chunk read first, then hashed together (md5_each: side by side
    # where built), then prepared and added in order
    reads: list[tuple[int, bytes | str | Loaded]] = []
    for k in range(first, end):
        path = paths[k]
        if plain and "\0" not in path and sizes[k] <= STREAM_ABOVE:  # (\0: a located source, read where it sits)
            reads.append((k, read_listed_bytes(path, sizes[k], mtimes[k])))
        else:
            reads.append((k, read_unhashed(sources.source(k), False)))
    finish([got for _, got in reads if isinstance(got, Loaded)], prep)
    digests = iter(md5_each([got for _, got in reads if isinstance(got, bytes)]))
    for k, got in reads:
        if isinstance(got, str):
            problems.append((k, True, got))
            continue
        if isinstance(got, bytes):
            data, md5 = got, next(digests)
            media = sniff_media_type(data[:SNIFF_BYTES])
            if media == "unknown":
                chunk.add_blob(names[k], data, md5, mtimes[k], None, media)
                continue
            src = Source(paths[k], names[k], sizes[k], mtimes[k])
            item = Loaded(src, data, md5, frame=prep.prepare(src.name, data, md5))
        else:
            item = got
        warning = add_loaded(chunk, item, strict) if item.error is None else None
        if warning is not None:
            problems.append((k, False, warning))
        if item.error is not None:
            problems.append((k, True, item.error))
