"""Reading sources for ``pack``: on a few threads, in order, with bounded memory.

Each source is read with one ``os.read``, and a batch's sources hashed together once read
(``md5_each``: side by side where built; file reads and md5 release the GIL),
checked against what the listing saw (a file that vanished, grew or changed is reported, not
packed), sniffed for video when videos are cut into frames, and prepared (image metadata,
compression) by ``media.FramePrep`` on the same thread. ``loaded_in_order`` keeps only a few
batches in flight, so memory stays flat however many files there are; sources above
``STREAM_ABOVE`` are not read here at all (the writer streams them).

Small files are another matter: there the cost is per file (four system calls and a few Python
objects each), which holds the GIL, so a second thread only contends for it. ``loaded_by_child``
does the same work in a forked process that sends each batch back through a pipe as one message,
while this process writes: two cores, and the output is the same bytes in the same order.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import signal
import struct
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..format.hashing import md5_each
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
from ..sources.located import SourceChanged, open_source, read_located
from ..sources.media import FramePrep, PreparedFrame
from ..sources.sourcelist import Source
from ..sources.video import SNIFF_VIDEO_BYTES, has_video_extension, sniff_video

if TYPE_CHECKING:
    from .writer import PackWriter

__all__ = [
    "STREAM_ABOVE",
    "WITHOUT_SIZE",
    "Loaded",
    "add_loaded",
    "child_may_load",
    "finish",
    "load_batch",
    "load_prepared",
    "loaded_by_child",
    "loaded_in_order",
    "read_listed_bytes",
    "read_unhashed",
]

STREAM_ABOVE = 32 << 20
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_BATCH_FILES = 64
_BATCH_BYTES = 16 << 20


@dataclass
class Loaded:
    source: Source
    data: bytes | None = None
    md5: bytes | None = None
    error: str | None = None
    stream: bool = False
    video: bool = False
    frame: PreparedFrame | None = None
    #: a located source's metadata (``located.read_located``: its ``source``, a row's
    #: ``label``); None for a file
    origin: dict[str, str] | None = None


def load_prepared(src: Source, prep: FramePrep | None, videos: bool) -> Loaded:
    """``_load``, then (on the same reader thread) sniff videos and prepare the frame."""
    return load_batch([src], prep, videos)[0]


def load_batch(batch: Sequence[Source], prep: FramePrep | None, videos: bool) -> list[Loaded]:
    """``load_prepared`` of each source of ``batch``, in order; their md5s computed together
    (``md5_each``: side by side where built) once all are read."""
    return finish([read_unhashed(src, videos) for src in batch], prep)


def read_unhashed(src: Source, videos: bool) -> Loaded:
    """A source read (``_load``) and sniffed for video, its md5 not yet computed (``finish``)."""
    if videos:
        if has_video_extension(src.name):
            return Loaded(src, video=True)
        if src.size > STREAM_ABOVE:
            try:
                with open_source(src.path, src.size) as f:
                    head = f.read(SNIFF_VIDEO_BYTES)
            except OSError:
                head = b""
            return Loaded(src, video=True) if sniff_video(head) else Loaded(src, stream=True)
    item = _load(src)
    if item.data is not None and videos:
        if sniff_video(item.data[:200]):
            item.video = True  # confirmed (or refuted) when the container is opened
    return item


def finish(items: list[Loaded], prep: FramePrep | None) -> list[Loaded]:
    """Items ``read_unhashed`` gave: the md5 of every one read, computed together, then each
    frame prepared (which needs its md5). Returns ``items``."""
    read = [(item, item.data) for item in items if item.data is not None]
    for (item, data), digest in zip(read, md5_each([data for _, data in read])):
        item.md5 = digest
        if prep is not None and not item.video:
            item.frame = prep.prepare(item.source.name, data, digest, item.origin)
    return items


#: How an image whose header could not be read is packed (said after its warning).
WITHOUT_SIZE = " (packed without width/height)"


def add_loaded(writer: PackWriter, item: Loaded, strict_images: bool) -> str | None:
    """Append a loaded source (read whole, not a video, no error) to ``writer``, as both
    packing loops do. Returns the warning to report for it (an image header that could not be
    read: packed ``WITHOUT_SIZE``); with ``strict_images`` that is ``item.error`` instead, and
    nothing is appended."""
    src, fr = item.source, item.frame
    if fr is None:
        data = item.data or b""
        source = item.origin["source"] if item.origin else None
        writer.add_blob(src.name, data, item.md5 or hashlib.md5(data).digest(), src.mtime_ns, source)
        return None
    if fr.warning is not None and strict_images:
        item.error = fr.warning
        return None
    writer.add_prepared(src.name, src.mtime_ns, fr)
    return fr.warning


def _load(src: Source) -> Loaded:
    """Read one source (not hashed: ``finish``), noting if it vanished or changed since it was
    listed."""
    if src.size > STREAM_ABOVE:
        return Loaded(src, stream=True)
    if "\0" in src.path:  # a located source (sources/locator.py; os.open would refuse it)
        return _load_located(src)
    got = read_listed_bytes(src.path, src.size, src.mtime_ns)
    if isinstance(got, str):
        return Loaded(src, error=got)
    return Loaded(src, got)


def read_listed_bytes(path: str, size: int, mtime_ns: int) -> bytes | str:
    """A file's bytes, as listed (``size`` bytes, modified at ``mtime_ns``), or what is wrong
    with it now: vanished, unreadable, or changed since it was listed. The packing loops' one
    read of a file (``_load``; a packing worker calls it for each file of its chunks)."""
    try:
        fd = os.open(path, _O_READ)
    except FileNotFoundError:
        return "vanished while packing"
    except OSError as e:
        return f"cannot read: {e.strerror}"
    try:
        st = os.fstat(fd)
        want = size + 1  # one byte more than listed: a file that grew shows up
        data = os.read(fd, want)
        if len(data) < want and len(data) != size and data:
            more = [data]
            got = len(data)
            while got < want:
                chunk = os.read(fd, want - got)
                if not chunk:
                    break
                more.append(chunk)
                got += len(chunk)
            data = b"".join(more)
    except IsADirectoryError:
        return "became a folder while packing"
    except OSError as e:
        return f"cannot read: {e.strerror}"
    finally:
        os.close(fd)
    if len(data) != size or st.st_size != size or st.st_mtime_ns != mtime_ns:
        return f"changed while packing (listed {size} bytes, read {len(data)})"
    return data


def _load_located(src: Source) -> Loaded:
    """Read one located source where it sits (an archive member, a table's row, an object:
    ``located.read_located``); not hashed (``finish``)."""
    try:
        data, origin = read_located(src.path, src.size)
    except SourceChanged as e:
        return Loaded(src, error=str(e))
    except FileNotFoundError:
        return Loaded(src, error="its archive or table vanished while packing")
    except OSError as e:
        return Loaded(src, error=f"cannot read its archive or table: {e.strerror or e}")
    return Loaded(src, data, origin=origin)


def _batches(sources: Sequence[Source]) -> Iterator[list[Source]]:
    batch: list[Source] = []
    size = 0
    for s in sources:
        batch.append(s)
        size += s.size
        if len(batch) >= _BATCH_FILES or size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def loaded_in_order(
    sources: Sequence[Source], workers: int, prep: FramePrep | None = None, videos: bool = False
) -> Generator[Loaded, None, None]:
    """Load (and prepare) sources on ``workers`` threads, yielding them in order, few batches
    in flight."""
    if workers <= 1:  # (one at a time: nothing read before it is needed, as with no thread)
        for s in sources:
            yield load_prepared(s, prep, videos)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hframe-pack") as pool:
        pending: deque[Future[list[Loaded]]] = deque()
        batches = _batches(sources)
        try:
            for batch in batches:
                pending.append(pool.submit(load_batch, batch, prep, videos))
                if len(pending) >= 2 * workers:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


_COUNT = struct.Struct("<I")
_HEAD = struct.Struct("<BQ16s")
_PIPE_BYTES = 1 << 20


def loaded_by_child(
    sources: Sequence[Source], prep: FramePrep | None = None, videos: bool = False
) -> Generator[Loaded, None, None]:
    """``loaded_in_order``, with the loading done by one forked child process.

    The child walks the batches in order, loads each source exactly as ``load_prepared`` does,
    and writes one message per batch (``_encode``). The pipe's buffer holds back a child that
    is ahead (a batch in hand, a few in the pipe: memory stays flat). The child ignores SIGINT
    (the parent decides what a signal stops), dies by SIGTERM, writes nothing after a broken
    pipe, keeps no other descriptor of the parent's open (the output's lock, stdio), and never runs the
    parent's exit handlers or finalizers. Should it die or send something unreadable, the parent
    loads the rest itself; should the fork fail, the parent loads everything: the frames are the
    same either way. Closing the iterator early kills the child.
    """
    if not sources:
        return
    batches = list(_batches(sources))
    r, w = pipe_with_room(_PIPE_BYTES)  # room for a few batches: the child runs ahead
    pid = -1
    taken = 0  # sources yielded from what the child sent

    def load_all() -> None:  # in the child
        keep_freed_heap()
        for batch in batches:
            send_message(w, _encode(load_batch(batch, prep, videos)))

    try:
        with signals_held():  # a signal is taken only once the child is known to the finally below
            pid = fork_helper(load_all, w)
            os.close(w)
        if pid > 0:
            for batch in batches:
                fields = _receive(r)
                if fields is None or len(fields) != len(batch):
                    break
                for src, (data, md5, error, stream, video, frame) in zip(batch, fields):
                    yield Loaded(src, data, md5, error, stream, video, frame)
                taken += len(batch)
    finally:
        os.close(r)
        if pid > 0:
            if taken < len(sources):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            reap(pid)
    # no child, or it died or sent garbage: the rest is loaded here
    yield from loaded_in_order(sources[taken:], 1, prep, videos)


def _encode(items: list[Loaded]) -> bytes:
    """One batch as a message (``processes.send_message``): the item count, a head per item (0: a plain file, with
    its length and md5; 1: anything else, pickled), then the items' bytes back to back. Plain
    files (most small files) cost a struct and no pickling."""
    heads, bodies = [_COUNT.pack(len(items))], []
    for it in items:
        if it.data is not None and it.md5 is not None and it.frame is None and it.error is None and not it.video:
            heads.append(_HEAD.pack(0, len(it.data), it.md5))
            bodies.append(it.data)
        else:
            blob = pickle.dumps((it.data, it.md5, it.error, it.stream, it.video, it.frame), pickle.HIGHEST_PROTOCOL)
            heads.append(_HEAD.pack(1, len(blob), bytes(16)))
            bodies.append(blob)
    return b"".join(heads + bodies)


def _receive(fd: int) -> list[tuple[Any, ...]] | None:
    """One message from the child, decoded, or None at the end of the pipe or a broken message."""
    body = receive_message(fd)
    if body is None:
        return None
    try:
        view = memoryview(body)
        (n,) = _COUNT.unpack_from(view, 0)
        at, pos = _COUNT.size, _COUNT.size + n * _HEAD.size
        fields: list[tuple[Any, ...]] = []
        for _ in range(n):
            kind, length, md5 = _HEAD.unpack_from(view, at)
            at += _HEAD.size
            chunk = view[pos : pos + length]
            pos += length
            if len(chunk) != length:
                return None
            if kind == 0:
                fields.append((bytes(chunk), md5, None, False, False, None))
            else:
                item = pickle.loads(chunk)
                if not isinstance(item, tuple) or len(item) != 6:
                    return None
                fields.append(item)
        return fields if pos == len(view) else None
    except Exception:  # noqa: BLE001 - a broken message: the parent loads the rest itself
        return None


def child_may_load() -> bool:
    """Whether ``loaded_by_child`` pays and is safe here: a second CPU to run on, and a fork
    that cannot leave the child stuck (``processes.fork_is_safe``)."""
    return usable_cpus() >= 2 and fork_is_safe()
