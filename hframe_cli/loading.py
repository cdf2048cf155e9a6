"""Reading sources for ``pack``: on a few threads, in order, with bounded memory.

Each source is read with one ``os.read`` and hashed (file reads and md5 release the GIL),
checked against what the listing saw (a file that vanished, grew or changed is reported, not
packed), sniffed for video when videos are cut into frames, and prepared (image metadata,
compression) by ``media.FramePrep`` on the same thread. ``loaded_in_order`` keeps only a few
batches in flight, so memory stays flat however many files there are; sources above
``STREAM_ABOVE`` are not read here at all (the writer streams them).
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from .inputs import Source
from .media import FramePrep, PreparedFrame

__all__ = ["STREAM_ABOVE", "Loaded", "load_prepared", "loaded_in_order"]

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


def load_prepared(src: Source, prep: FramePrep | None, videos: bool) -> Loaded:
    """``_load``, then (on the same reader thread) sniff videos and prepare the frame."""
    if videos:
        from .video import SNIFF_VIDEO_BYTES, has_video_extension, sniff_video

        if has_video_extension(src.name):
            return Loaded(src, video=True)
        if src.size > STREAM_ABOVE:
            try:
                with open(src.path, "rb") as f:
                    head = f.read(SNIFF_VIDEO_BYTES)
            except OSError:
                head = b""
            return Loaded(src, video=True) if sniff_video(head) else Loaded(src, stream=True)
    item = _load(src)
    if item.data is not None and videos:
        from .video import sniff_video

        if sniff_video(item.data[:200]):
            item.video = True  # confirmed (or refuted) when the container is opened
    if prep is not None and item.data is not None and not item.video:
        item.frame = prep.prepare(src.name, item.data, item.md5)
    return item


def _load(src: Source) -> Loaded:
    """Read and hash one source, noting if it vanished or changed since it was listed."""
    if src.size > STREAM_ABOVE:
        return Loaded(src, stream=True)
    try:
        fd = os.open(src.path, _O_READ)
    except FileNotFoundError:
        return Loaded(src, error="vanished while packing")
    except OSError as e:
        return Loaded(src, error=f"cannot read: {e.strerror}")
    try:
        st = os.fstat(fd)
        want = src.size + 1  # one byte more than listed: a file that grew shows up
        data = os.read(fd, want)
        if len(data) < want and len(data) != src.size and data:
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
        return Loaded(src, error="became a folder while packing")
    except OSError as e:
        return Loaded(src, error=f"cannot read: {e.strerror}")
    finally:
        os.close(fd)
    if len(data) != src.size or st.st_size != src.size or st.st_mtime_ns != src.mtime_ns:
        return Loaded(src, error=f"changed while packing (listed {src.size} bytes, read {len(data)})")
    return Loaded(src, data, hashlib.md5(data).digest())


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
) -> Iterator[Loaded]:
    """Load (and prepare) sources on ``workers`` threads, yielding them in order, few batches
    in flight."""
    if workers <= 1:
        for s in sources:
            yield load_prepared(s, prep, videos)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hframe-pack") as pool:
        pending: deque[Future[list[Loaded]]] = deque()
        batches = _batches(sources)
        try:
            for batch in batches:
                pending.append(pool.submit(lambda b: [load_prepared(s, prep, videos) for s in b], batch))
                if len(pending) >= 2 * workers:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
