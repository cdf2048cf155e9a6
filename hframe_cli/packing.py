"""``pack``: sources in, a self-checked, published pack and index out.

Sources are read and hashed on a small thread pool (file reads and md5 release the GIL)
while the calling thread appends them in sorted order, with a bounded number of batches in
flight, so memory stays flat however many files there are. Frames larger than
``_STREAM_ABOVE`` are streamed in chunks instead of being held in memory.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .errors import InputError
from .inputs import Rejected, Source, SourceList
from .verify import DEFAULT_SELF_CHECK, self_check
from .writer import PackWriter, SealedPack

__all__ = ["PackResult", "pack_sources", "parse_created"]

_STREAM_ABOVE = 32 << 20
_THREADS_ABOVE_MEAN = 16 << 10
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_BATCH_FILES = 64
_BATCH_BYTES = 16 << 20

ProgressFn = Callable[[int, int], None]


@dataclass
class PackResult:
    """What ``pack_sources`` wrote."""

    path: str
    index_path: str
    uuid: str
    frame_count: int
    payload_bytes: int
    pack_bytes: int
    pack_time: str
    self_checked: int
    elapsed_s: float
    skipped: list[Rejected] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        from .index import current_format_version

        return {
            "ok": True,
            "format_version": current_format_version(),
            "pack": self.path,
            "index": self.index_path,
            "uuid": self.uuid,
            "pack_time": self.pack_time,
            "frame_count": self.frame_count,
            "payload_bytes": self.payload_bytes,
            "pack_bytes": self.pack_bytes,
            "self_checked": self.self_checked,
            "elapsed_s": round(self.elapsed_s, 6),
            "skipped": [{"path": r.path, "reason": r.reason} for r in self.skipped],
        }


def parse_created(value: str | None, environ: dict[str, str] | None = None) -> int | None:
    """Creation time in microseconds from ``--created`` or ``SOURCE_DATE_EPOCH``.

    ``value`` may be epoch seconds (``1700000000``) or ISO 8601 (``2024-01-02T03:04:05Z``).
    Returns None when neither is set (then the pack gets the current time and a random UUID).
    """
    env = os.environ if environ is None else environ
    source = "--created"
    if value is None:
        value = env.get("SOURCE_DATE_EPOCH") or None
        source = "SOURCE_DATE_EPOCH"
    if value is None:
        return None
    try:
        return int(round(float(value) * 1_000_000))
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise InputError(f"{source}: {value!r} is neither epoch seconds nor an ISO 8601 time") from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1_000_000)


@dataclass
class _Loaded:
    source: Source
    data: bytes | None = None
    md5: bytes | None = None
    error: str | None = None
    stream: bool = False


def _load(src: Source) -> _Loaded:
    """Read and hash one source, noting if it vanished or changed since it was listed."""
    if src.size > _STREAM_ABOVE:
        return _Loaded(src, stream=True)
    try:
        fd = os.open(src.path, _O_READ)
    except FileNotFoundError:
        return _Loaded(src, error="vanished while packing")
    except OSError as e:
        return _Loaded(src, error=f"cannot read: {e.strerror}")
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
        return _Loaded(src, error="became a folder while packing")
    except OSError as e:
        return _Loaded(src, error=f"cannot read: {e.strerror}")
    finally:
        os.close(fd)
    if len(data) != src.size or st.st_size != src.size or st.st_mtime_ns != src.mtime_ns:
        return _Loaded(src, error=f"changed while packing (listed {src.size} bytes, read {len(data)})")
    return _Loaded(src, data, hashlib.md5(data).digest())


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


def _loaded_in_order(sources: Sequence[Source], workers: int) -> Iterator[_Loaded]:
    """Load sources on ``workers`` threads, yielding them in order, few batches in flight."""
    if workers <= 1:
        for s in sources:
            yield _load(s)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hframe-pack") as pool:
        pending: deque[Future[list[_Loaded]]] = deque()
        batches = _batches(sources)
        try:
            for batch in batches:
                pending.append(pool.submit(lambda b: [_load(s) for s in b], batch))
                if len(pending) >= 2 * workers:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


def pack_sources(
    sources: SourceList,
    output: str | os.PathLike[str],
    *,
    alignment: int = 1,
    created_us: int | None = None,
    force: bool = False,
    skip_bad: bool = False,
    self_check_frames: int = DEFAULT_SELF_CHECK,
    workers: int | None = None,
    on_progress: ProgressFn | None = None,
    after_seal: Callable[[SealedPack], None] | None = None,
) -> PackResult:
    """Write ``sources`` into a pack at ``output``, self-check it, and publish it.

    Args:
        sources: from ``inputs.collect_sources`` (sorted, checked).
        alignment: payload alignment in bytes (power of two).
        created_us: fixed creation time (makes the output byte-for-byte reproducible).
        force: replace an existing pack.
        skip_bad: leave out sources that vanish, change or cannot be read while packing.
        self_check_frames: frames read back from disk and compared before publishing.
        workers: reader threads (default: 2 when sources average 16 KiB or more, else 1).
        on_progress: called with (frames_done, bytes_done) after each frame.
        after_seal: called with the sealed, unpublished pack before the self-check
            (fault injection in tests; monitoring).

    Raises:
        InputError: a bad source (without ``skip_bad``) or an existing output.
        IntegrityError: the self-check failed; nothing was published.
        PackLocked: another run is writing ``output``.
    """
    start = time.perf_counter()
    skipped = list(sources.rejected)
    if workers is None:
        # threads pay off when hashing and copying dominate; for small files the per-file Python
        # work dominates and a second thread only contends for the GIL
        mean = sources.total_bytes // max(1, len(sources.sources))
        workers = 1 if mean < _THREADS_ABOVE_MEAN else min(2, os.cpu_count() or 1)
    n_workers = workers
    done_bytes = 0
    with PackWriter(output, alignment=alignment, created_us=created_us, force=force) as writer:
        for item in _loaded_in_order(sources.sources, n_workers):
            src = item.source
            if item.stream:
                try:
                    with open(src.path, "rb") as f:
                        writer.add_stream(src.name, f, src.size, mtime_ns=src.mtime_ns)
                except InputError as e:
                    item.error = str(e)
                except FileNotFoundError:
                    item.error = "vanished while packing"
                except OSError as e:
                    item.error = f"cannot read: {e.strerror}"
            elif item.error is None:
                writer.add(src.name, item.data or b"", mtime_ns=src.mtime_ns, md5=item.md5)
            if item.error is not None:
                if not skip_bad:
                    raise InputError(f"{src.path}: {item.error} (use --skip-bad to leave it out)")
                skipped.append(Rejected(src.path, item.error))
                continue
            done_bytes += src.size
            if on_progress is not None:
                on_progress(len(writer), done_bytes)
        if len(writer) == 0:
            raise InputError("nothing to pack: every input was skipped")
        sealed = writer.seal()
        if after_seal is not None:
            after_seal(sealed)
        checked = self_check(sealed.partial_path, sealed.partial_index_path, self_check_frames)
        writer.publish()
    return PackResult(
        path=os.fspath(output),
        index_path=os.fspath(writer.index_path),
        uuid=sealed.uuid,
        frame_count=sealed.frame_count,
        payload_bytes=sealed.payload_bytes,
        pack_bytes=sealed.pack_bytes,
        pack_time=sealed.pack_time,
        self_checked=checked,
        elapsed_s=time.perf_counter() - start,
        skipped=skipped,
    )


def pack(
    paths: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    base: str | None = None,
    skip_bad: bool = False,
    allow_empty: bool = False,
    max_frame_bytes: int | None = None,
    **options: object,
) -> PackResult:
    """Collect ``paths`` (files and folders) and pack them: the library form of ``hframe pack``.

    Keyword options not listed here go to ``pack_sources`` (``alignment``, ``created_us``,
    ``force``, ``self_check_frames``, ``workers``, ``on_progress``).
    """
    from .inputs import DEFAULT_MAX_FRAME_BYTES, collect_sources

    sources = collect_sources(
        [os.fspath(p) for p in paths],
        include=include,
        exclude=exclude,
        base=base,
        output=os.fspath(output),
        skip_bad=skip_bad,
        allow_empty=allow_empty,
        max_frame_bytes=max_frame_bytes if max_frame_bytes is not None else DEFAULT_MAX_FRAME_BYTES,
    )
    return pack_sources(sources, output, skip_bad=skip_bad, **options)  # type: ignore[arg-type]
