"""PackReader: frame ids and names in, exact frame bytes out, through byte-range reads.

The reader validates header, trailer and index on open, keeps only the ``offset`` and
``length`` columns in memory (16 bytes per frame), and loads other columns on demand.
Every read is bounds-checked against the end of the pack's data before it is issued.
``read_many`` sorts the wanted ranges, coalesces neighbours that lie within
``coalesce_gap`` bytes, splits reads larger than ``max_read``, and runs them on a bounded
thread pool (``os.pread`` has no shared file position, so threads never race).

Imports inside functions: ``pyarrow.compute``, only for lookups by name and bounds checks of
large indexes (``verify`` and ``dump-header`` never need it).
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import operator
import os
import threading
import time
import weakref
from array import array
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice, repeat
from typing import Any, TypeVar

import pyarrow as pa

from ..errors import (
    ChecksumMismatch,
    FormatError,
    FrameOutOfRange,
    HframeError,
    IncompletePack,
    InputError,
    IntegrityError,
    NotFound,
    PackReplaced,
)
from ..format.codec import Decompressor
from ..format.hashing import md5_each
from ..format.index import index_location, int64_column, read_index
from ..format.layout import (
    CODEC_IDS,
    EXTRA_ZSTD_DICT,
    FLAG_COMPRESSED,
    FLAG_DICT,
    HEADER_SIZE,
    RECORD_FIXED,
    RECORD_FLAG_DICT,
    RecordHeader,
    decode_extra,
)
from ..locations import is_remote, shown_url
from ..processes import usable_cpus
from ..storage.access import LocalFile, Storage, looks_cold
from .cache import NodeCache, PackCache, PackIdentity, cache_settings, kept_copies
from .snapshot import PackInfo, generation_checks, open_generation, replaced_since

__all__ = [
    "DEFAULT_COALESCE_GAP",
    "DEFAULT_MAX_READ",
    "PackInfo",
    "PackReader",
    "ReadStats",
    "buffer_for",
    "carved",
    "default_workers",
]

DEFAULT_COALESCE_GAP = 8 * 1024
DEFAULT_MAX_READ = 2 * 1024 * 1024
REMOTE_COALESCE_GAP = 64 * 1024
REMOTE_MAX_READ = 8 * 1024 * 1024
#: ``fill_cache``'s spread takes a pack's next frame only this close after the one before (a
#: record header and its metadata: a frame found further on was not written right after it)
SPREAD_GAP = 64 * 1024
#: and what it adds is claimed, fetched and kept this many bytes at a time
SPREAD_FILL = 8 << 20
REMOTE_GAP_BUDGET = 0.1  # bytes read between the frames asked for, as a share of their bytes

FrameKey = int | str | bytes
#: A merged read: (offset, length, positions in the request of the frames inside it).
Run = tuple[int, int, list[int]]


def default_workers(batch: int) -> int:
    """Workers for a batch of ``batch`` frames: ``min(16, max(1, batch // 4))`` (BRIEF)."""
    return min(16, max(1, batch // 4))


def read_dictionary(storage: Storage) -> bytes:
    """The zstd dictionary stored in the extra field of record 0 (``man/hframe.5``)."""
    where = f"{storage.location}: record 0"
    fixed = storage.read_at(HEADER_SIZE, RECORD_FIXED)
    name_len, extra_len = RecordHeader.name_extra_lengths(fixed, where) if len(fixed) == RECORD_FIXED else (0, 0)
    rest = storage.read_at(HEADER_SIZE + RECORD_FIXED, name_len + extra_len)
    header, _ = RecordHeader.decode(fixed, rest, where)
    entries = decode_extra(header.extra, where)
    if EXTRA_ZSTD_DICT not in entries:
        raise IncompletePack(f"{where}: the header says the pack has a zstd dictionary, record 0 holds none")
    return entries[EXTRA_ZSTD_DICT]


class PackReader:
    """Random access to the frames of one pack.

    Args:
        path: the pack file.
        index_path: its index (default ``<path>.index.parquet``).
        workers: the most threads ``read_many`` uses (default: per batch, see ``default_workers``).
        coalesce_gap: neighbouring ranges at most this many bytes apart are read together
            (0 disables coalescing).
        max_read: the largest single read of a batch (``read_many``) or of a remote pack;
            bigger frames are read in several ranges. ``p[i]`` of a local pack reads a frame
            with one ``pread`` whatever its size (a read cut short goes the checked way, in
            ranges).
        memory_map: read a local pack through one read-only memory map instead of a ``pread``
            per frame: a warm small frame costs a copy instead of a system call (faster than a
            bare ``pread`` loop for small frames: ``scripts/bench_read.py`` measures by how
            much on this machine). The catch: a pack
            file truncated in place while mapped (never by hframe, which publishes by rename;
            ``truncate``, or ``cp`` over it), or a read error of the disk under it, kills the
            process with SIGBUS where ``pread`` would give an error. A map holds a descriptor of
            its own (one more per pack, per shard of a dataset). For packs read warm:
            ``read_many`` reads a batch that looks cold with ``pread``, but a cold ``p[i]``
            faults its pages in one at a time (several times slower than ``pread`` for a
            34 KB frame). Ignored for remote packs and where the file cannot be mapped.
        cache_dir: for a remote pack, the node-local cache to read frames from and keep them
            in (``cache.py``; default ``HFRAME_CACHE_DIR``; ``""``: none). Ignored for a local pack.
        cache_limit: the most bytes the cache may hold (a number or ``"20G"``; default
            ``HFRAME_CACHE_LIMIT``, else half of its file system).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        index_path: str | os.PathLike[str] | None = None,
        *,
        workers: int | None = None,
        coalesce_gap: int | None = None,
        max_read: int | None = None,
        memory_map: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        _snapshot: dict[str, Any] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.memory_map = memory_map
        self.shown = shown_url(self.path)  # the path as messages name it (a URL's query left out)
        self.index_path = os.fspath(index_path) if index_path is not None else index_location(path)
        if workers is not None and workers < 1:
            raise InputError(f"workers must be at least 1 (got {workers})")
        if (coalesce_gap is not None and coalesce_gap < 0) or (max_read is not None and max_read < 1):
            raise InputError("coalesce_gap must be >= 0 and max_read >= 1")
        self.workers = workers
        #: the node-local cache (remote packs only): its folder and limit (its handle: ``_cache``)
        self.cache_settings = cache_settings(cache_dir, cache_limit) if is_remote(self.path) else None
        #: where the remote open's first answers are kept (the cache's: ``storage/kept.py``)
        self._kept = kept_copies(self.cache_settings)
        self._storage, self.info, self._index, self.meta = open_generation(
            self.path, self.index_path, _snapshot, self._kept
        )
        #: a remote pack: every read is a request, so neighbours farther apart are worth merging,
        #: runs may be longer, and a batch is always read as cold (all its requests at once)
        self.remote = bool(getattr(self._storage, "remote", False))
        gap, cap = (REMOTE_COALESCE_GAP, REMOTE_MAX_READ) if self.remote else (DEFAULT_COALESCE_GAP, DEFAULT_MAX_READ)
        self.coalesce_gap = gap if coalesce_gap is None else coalesce_gap
        self.max_read = cap if max_read is None else max_read
        #: remote, gap not chosen by the caller: merge the smallest gaps of each batch first, up to
        #: ``coalesce_gap``, while the bytes read for nothing stay within this share of the batch
        self.gap_budget = REMOTE_GAP_BUDGET if self.remote and coalesce_gap is None else None
        #: a store whose reads are not tied to the version opened (S3 through pyarrow, a server
        #: without a strong ETag): every frame returned is checked against the index's md5 first
        self.checks_md5 = self.remote and not getattr(self._storage, "pinned", True)
        self._md5s: list[bytes] | None = None
        self._cache: PackCache | None = None
        self._cache_pid = -1
        self._in_order: bool | None = None  # the offsets grow with the frame id (for the cache's writes)
        # a handle used again after close() (or in a process that cannot reach these files) opens
        # the path: only the same generation may stand in
        checks = generation_checks(self.path, self.index_path, self.info.uuid, self.info.size)
        self._storage.same_generation, self._index.same_generation = checks[0], checks[1]
        if _opened_at(self._index) != self.index_path:  # opened as INDEX.partial mid-publish
            self._index.alternates = (self.index_path,)
        self._pool: ThreadPoolExecutor | None = None
        # what close() undoes, set before anything can fail
        self._fast_fd = -1  # ``read`` of an id: one pread on this descriptor (-1: not armed) ...
        self._fast_map: mmap.mmap | None = None  # ... or one slice of this map
        self._map: mmap.mmap | None = None
        self._map_failed = False  # the file could not be mapped: pread, until close()
        self._arm_lock = threading.Lock()  # arming and close() one at a time (threads)
        _readers.add(self)  # (forked children disarm it: ``_disarm_forked``)
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        table = self.read_index_columns(["offset", "length"])
        self._offsets = int64_column(table, "offset")
        self._lengths = int64_column(table, "length")
        if len(self._offsets) != self.meta.frame_count:
            raise IncompletePack(
                f"{self.index_path}: index has {len(self._offsets)} rows, metadata says {self.meta.frame_count}"
            )
        self._data_end = self.info.trailer.data_end
        # bounds of every index entry, checked once against the real pack size; reads of an
        # index with any entry out of range are checked frame by frame instead
        self._all_in_range = _all_in_range(table, self._data_end, self._offsets, self._lengths)
        # compressed packs (format 1.1): per-frame codec and raw length, to return raw bytes
        self._codecs: array[int] | None = None
        self._raw_lengths: array[int] | None = None
        self._decompressor: Decompressor | None = None
        if self.info.header.flags & FLAG_COMPRESSED:
            self._load_codecs()
        #: ``read`` of an id needs one read and nothing else (no range check, decompression or md5)
        self._plain = self._all_in_range and self._codecs is None and not self.checks_md5
        # a plain local pack: ``read`` of an id is one ``os.pread`` on ``_fast_fd`` (or one slice
        # of ``_fast_map``); a close() or a fork (``_disarm_forked``) disarms it, and the careful
        # path arms it again
        self._arm_fast_read()
        self._table: pa.Table | None = None
        self._names: tuple[pa.Array, pa.Array] | None = None
        self._pool_pid = -1
        self._pool_lock = threading.Lock()

    def storage_counters(self) -> Any:
        """The pack's request counters (``policy.Counters``) when it is remote, else None."""
        return getattr(self._storage, "counters", None)

    @property
    def pack_bytes(self) -> int:
        """The size of the pack file (of every shard, for a dataset)."""
        return self.info.size

    @property
    def files(self) -> list[str]:
        """The pack files this reader reads (one; a dataset's shards)."""
        return [self.path]

    @property
    def uuid(self) -> str:
        """The UUID of the pack generation this reader holds (every read comes from it)."""
        return self.info.uuid

    @property
    def index_location(self) -> str:
        """The index file this reader holds: ``index_path``, or its ``.partial`` twin when it
        opened the pack between the two renames of a publish (``man/hframe.5``, PUBLISHING)."""
        return self._index.location

    def read_index_columns(self, columns: list[str] | None = None, **options: Any) -> pa.Table:
        """Index columns of this reader's pack generation (never another one: the index file
        opened with the pack is read, whatever the path names now)."""
        return read_index(self.index_path, columns, stream=self._index.stream(), **options)

    def _load_codecs(self) -> None:
        t = self.read_index_columns(["codec", "raw_length"])
        names = t.column("codec").combine_chunks() if t.num_rows else pa.array([], pa.string())
        coded = names.dictionary_encode()
        ids = [CODEC_IDS.get(c, -1) for c in coded.dictionary.to_pylist()]
        self._codecs = array("b", [ids[c] for c in coded.indices.to_pylist()])
        self._raw_lengths = int64_column(t, "raw_length")
        dictionary = None
        if self.info.header.flags & FLAG_DICT:
            dictionary = read_dictionary(self._storage)
        self._decompressor = Decompressor(dictionary, self.shown)

    @property
    def compressed(self) -> bool:
        """Whether some frames are stored compressed (reads still return the raw bytes)."""
        return self._codecs is not None

    def _decode(self, frame_id: int, data: bytes) -> bytes:
        if self._codecs is None or not self._codecs[frame_id]:
            return data
        assert self._decompressor is not None and self._raw_lengths is not None
        flags = RECORD_FLAG_DICT if self.info.header.flags & FLAG_DICT else 0
        return self._decompressor.decode(
            data, self._codecs[frame_id], flags, self._raw_lengths[frame_id], f"{self.shown}: frame {frame_id}"
        )

    # -- size and lookup ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._offsets)

    def __enter__(self) -> PackReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self.read(i)

    @property
    def table(self) -> pa.Table:
        """All index columns (loaded on first use)."""
        if self._table is None:
            self._table = self.read_index_columns()
        return self._table

    def frame_id(self, key: FrameKey) -> int:
        """The frame id for an id or a name (``str`` as typed, or the exact ``bytes``)."""
        if isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < len(self):
                raise NotFound(
                    f"{self.shown}: frame {key} does not exist (pack has {len(self)} frames, ids 0..{len(self) - 1})"
                )
            return key
        if isinstance(key, str):
            raw = os.fsencode(key)
        elif isinstance(key, bytes):
            raw = key
        else:
            if isinstance(key, bool):
                raise InputError("frame key must be an int id or a name, not bool")
            try:
                return self.frame_id(operator.index(key))  # numpy and torch integers
            except TypeError:
                raise InputError(f"frame key must be an int id or a name, not {type(key).__name__}") from None
        try:
            text: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        names, raws = self._name_columns()
        if text is not None:
            import pyarrow.compute as pc  # here, not at import: verify and dump-header never need it

            pos = pc.index(names, pa.scalar(text)).as_py()
            if pos >= 0 and not raws[pos].is_valid:
                return int(pos)  # frame ids are row numbers
            if pos >= 0:  # the name as index prints a non-UTF-8 one (\xNN escapes), unless a
                # UTF-8 name is exactly that text (that one wins)
                same = pc.indices_nonzero(pc.equal(names, pa.scalar(text))).to_pylist()
                exact = [i for i in same if not raws[i].is_valid]
                return int(exact[0] if exact else same[0])
        if raws.null_count < len(raws):
            import pyarrow.compute as pc

            pos = pc.index(raws, pa.scalar(raw, pa.binary())).as_py()
            if pos >= 0:
                return int(pos)
        raise NotFound(f"{self.shown}: no frame named {raw.decode('utf-8', 'backslashreplace')!r}")

    def _frame_ids(self, keys: Sequence[FrameKey]) -> list[int]:
        """``frame_id`` of each key, with valid int ids taken as they are (no call per frame)."""
        count = len(self._offsets)
        return [k if type(k) is int and 0 <= k < count else self.frame_id(k) for k in keys]

    def _name_columns(self) -> tuple[pa.Array, pa.Array]:
        """The name and name_raw columns only (a name lookup needs nothing else)."""
        if self._names is None:
            t = self._table if self._table is not None else self.read_index_columns(["name", "name_raw"])
            self._names = (t.column("name").combine_chunks(), t.column("name_raw").combine_chunks())
        return self._names

    def range_of(self, frame_id: int) -> tuple[int, int]:
        """(offset, length) of a frame's stored bytes."""
        return self._offsets[frame_id], self._lengths[frame_id]

    def row(self, key: FrameKey) -> dict[str, Any]:
        """The full index row of one frame."""
        row: dict[str, Any] = self.table.slice(self.frame_id(key), 1).to_pylist()[0]
        return row

    # -- reads --------------------------------------------------------------------------

    def _check_range(self, frame_id: int, offset: int, length: int) -> None:
        if offset < HEADER_SIZE or length < 0 or offset + length > self._data_end:
            raise FrameOutOfRange(
                f"{self.shown}: frame {frame_id} (offset {offset}, length {length}): index out of range "
                f"(pack data is bytes {HEADER_SIZE}..{self._data_end})"
            )

    def read(self, key: FrameKey) -> bytes:
        """The exact bytes of one frame (decompressed if it is stored compressed)."""
        # the fast path, for ``p[i]`` loops of small frames: every test and attribute here
        # shows in a warm small read (``scripts/bench_read.py``: getitem), a call through a
        # ``functools.partial`` or a pid compared more so: so neither
        if type(key) is int and key >= 0:
            fd = self._fast_fd
            if fd >= 0:
                try:
                    length = self._lengths[key]
                    data = _pread(fd, length, self._offsets[key])
                    if len(data) == length:
                        return data
                except (IndexError, OSError):
                    pass  # no such frame or a failed read: the careful path says which
            else:
                m = self._fast_map
                if m is not None:
                    try:
                        length, offset = self._lengths[key], self._offsets[key]
                        data = m[offset : offset + length]  # (short at the end, as pread is)
                        if len(data) == length:
                            return data
                    except (IndexError, ValueError):
                        pass  # no such frame, or the map closed meanwhile
        i = self.frame_id(key)
        if not self.checks_md5:
            data = self._decode(i, self._read_stored(i))
            if self._plain and self._fast_fd < 0 and self._fast_map is None:
                self._arm_fast_read()  # (after a fork or a close: the fast path is this process's again)
            return data
        with self._replaced_if_moved():
            data = self._decode(i, self._read_stored(i))
            self._check_md5([i], [data])
        return data

    __getitem__ = read  # ``p[i]``: the same method, not a call more per frame

    def _arm_fast_read(self) -> None:
        """Let ``read`` of an id in this process be one ``os.pread`` or one slice of the map (a
        plain local pack only); map the pack first if ``memory_map`` asks for it.

        Under the lock ``close()`` takes: a close in another thread between taking the
        descriptor and arming would leave ``read`` armed on a number that soon names another
        file (and every later ``p[i]`` reading it)."""
        if not isinstance(self._storage, LocalFile):
            return
        with self._arm_lock:
            if self.memory_map and self._map is None and not self._map_failed:
                self._map = _map_file(self._storage.fileno())
                self._map_failed = self._map is None
            m = self._map
            # (not on a descriptor a close() in another thread has left to the batches in flight:
            # it goes when they end, and its number may then name another file)
            if self._plain and (m is not None or not self._storage.closing):
                if m is not None:
                    self._fast_map = m
                else:
                    self._fast_fd = self._storage.fileno()

    def _preader(self, cold: bool = False) -> Callable[[int, int], bytes]:
        """``pread(length, offset)`` of the stored bytes: a slice of the map, when there is one
        and the batch is warm, else the storage's (``Storage.preader``: short at the end of the
        file, raises OSError, or ValueError once the map is closed).

        A cold batch is read with ``pread`` even when mapped: a page fault holds the GIL while
        the disk reads, so the pool's threads would take turns, and it reads around the page
        (cold random batches measured 2x slower through the map)."""
        m = self._mapped()
        if m is not None and not cold:
            return _map_slicer(m)
        return self._storage.preader()

    def _mapped(self) -> mmap.mmap | None:
        """The map, made now if ``memory_map`` asks for one and there is none (after ``close()``)."""
        if self.memory_map and self._map is None and not self._map_failed:
            self._arm_fast_read()
        return self._map

    def read_stored(self, key: FrameKey) -> bytes:
        """The bytes of one frame exactly as stored in the pack (still compressed, if it is)."""
        i = self.frame_id(key)
        data = self._read_stored(i)
        if self.checks_md5:
            with self._replaced_if_moved():
                self._check_md5([i], [self._decode(i, data)])
        return data

    def _read_stored(self, i: int) -> bytes:
        cache = self._pack_cache()
        if cache is not None:
            return self._cached([i], cache, lambda miss: [self._fetch_stored(miss[0])])[0]
        return self._fetch_stored(i)

    def _fetch_stored(self, i: int) -> bytes:
        offset, length = self._offsets[i], self._lengths[i]
        self._check_range(i, offset, length)
        if length <= self.max_read:
            data = self._storage.read_at(offset, length)
        else:
            data = b"".join(self._storage.read_at(o, n) for o, n in _split(offset, length, self.max_read))
        if len(data) != length:
            raise FrameOutOfRange(
                f"{self.shown}: frame {i} (offset {offset}, length {length}): short read ({len(data)} bytes); pack truncated?"
            )
        return data

    def head(self, key: FrameKey, nbytes: int) -> bytes:
        """The first ``nbytes`` bytes of a frame (all of it when shorter)."""
        return self.read_part(key, 0, nbytes)

    def read_part(self, key: FrameKey, start: int, nbytes: int, stored: bool = False) -> bytes:
        """``nbytes`` bytes of a frame from byte ``start`` of it (fewer at its end, none past
        it): one read of the pack for a frame stored as it is (``hframe mount``'s reads). A
        compressed frame is decompressed whole first (unless ``stored``); a frame of an unpinned
        remote pack, or of a remote pack with a node cache, is read whole (checked, or kept)."""
        i = self.frame_id(key)
        start, nbytes = max(start, 0), max(nbytes, 0)
        compressed = not stored and self._codecs is not None and self._codecs[i]
        if compressed or self.checks_md5 or (self.remote and self._pack_cache() is not None):
            whole = self.read_stored(i) if stored else self.read(i)
            return whole[start : start + nbytes]
        offset, length = self._offsets[i], self._lengths[i]
        self._check_range(i, offset, length)
        if start >= length or not nbytes:
            return b""
        return self._storage.read_at(offset + start, min(nbytes, length - start))

    def read_many(
        self, keys: Sequence[FrameKey], workers: int | None = None, stats: ReadStats | None = None
    ) -> list[bytes]:
        """The bytes of several frames, in the order asked, read in parallel (and decompressed,
        where stored compressed).

        Args:
            keys: frame ids or names (repeats allowed).
            workers: threads for this call (default: the reader's, else ``default_workers``).
            stats: if given, read calls, bytes and per-frame read latencies are added to it.
        """
        if self.checks_md5:
            with self._replaced_if_moved():
                checked: set[int] = set()
                out = self._read_many_raw(keys, workers, stats, checked)
                ids = self._frame_ids(keys)
                # (not those through the node cache: their md5 was the index's when it kept them)
                rest = [j for j, i in enumerate(ids) if i not in checked]
                self._check_md5([ids[j] for j in rest], [out[j] for j in rest])
            return out
        return self._read_many_raw(keys, workers, stats)

    def _read_many_raw(
        self,
        keys: Sequence[FrameKey],
        workers: int | None = None,
        stats: ReadStats | None = None,
        checked: set[int] | None = None,
    ) -> list[bytes]:
        """``read_many`` without the md5 check (``checked``: see ``_cached``)."""
        out = self._read_many_stored(keys, workers, stats, checked)
        codecs = self._codecs
        if codecs is None:
            return out
        assert self._decompressor is not None and self._raw_lengths is not None
        ids = self._frame_ids(keys)
        packed = [j for j, i in enumerate(ids) if codecs[i]]
        if len(packed) < 4:
            return list(map(self._decode, ids, out))
        codec = codecs[ids[packed[0]]]
        if any(codecs[ids[j]] != codec for j in packed) or not self._decompressor.batches(codec):
            return list(map(self._decode, ids, out))  # mixed codecs, or one that decodes frame by frame
        datas = [out[j] for j in packed]
        raws = [self._raw_lengths[ids[j]] for j in packed]
        self._decompressor.decode_many(
            datas, [ids[j] for j in packed], raws, bool(self.info.header.flags & FLAG_DICT), self.path, codec
        )
        for j, data in zip(packed, datas):
            out[j] = data
        return out

    def _check_md5(self, ids: Sequence[int], frames: Sequence[bytes | memoryview]) -> None:
        """Each frame's bytes against the index's md5 (``checks_md5``; run under
        ``_replaced_if_moved``, which tells a replaced pack from damage)."""
        if not ids:  # (a batch the node cache held whole: the md5 column is not even read)
            return
        want = self._index_md5s()
        for i, digest in zip(ids, md5_each(frames)):
            if digest != want[i]:
                raise ChecksumMismatch(f"{self.shown}: frame {i}: md5 mismatch (stored bytes are not the indexed ones)")

    @contextmanager
    def _replaced_if_moved(self) -> Iterator[None]:
        """For reads not pinned to a version (``checks_md5``): bytes that fail a check (md5,
        decompression, record layout) from an object that changed since it was opened are the
        pack replaced (exit 3), not damage (exit 1)."""
        try:
            yield
        except (FormatError, IntegrityError) as e:
            if replaced_since(self._storage, self.info.uuid):
                raise PackReplaced(
                    f"{self.shown}: the pack was replaced since this reader opened it ({e}); open it again"
                ) from None
            self._forget_copies()
            raise

    def _forget_copies(self) -> None:
        """Drop the kept copies this reader's pack and index came from (``open_generation``):
        bytes that fail a check are damage, or (a publish raced the open that kept them) not
        the version those copies say; either way the next open fetches both from the store."""
        for storage in (self._storage, self._index):
            if getattr(storage, "from_copy", False):
                storage.forget_copy()  # type: ignore[attr-defined]

    def read_many_into(
        self, keys: Sequence[FrameKey], buffer: bytearray | memoryview | None = None
    ) -> list[memoryview]:
        """``read_many``'s frames, written back to back into one buffer in the order asked, and
        returned as views of it.

        A ``bytes`` object per frame is an allocation per frame, and glibc gives the memory of
        large ones back to the kernel when they are freed, so every warm batch of 34 KB JPEGs
        faults its memory in again: that, not the read, is most of its time. A buffer reused
        from batch to batch is faulted in once (``scripts/bench_read.py``: ``read_many_into``).
        Decoders that take a buffer read the views without a copy
        (``torchvision.io.decode_jpeg(torch.frombuffer(v, dtype=torch.uint8))``,
        ``numpy.frombuffer(v, numpy.uint8)``; ``PIL.Image.open(io.BytesIO(v))`` copies).

        A local pack with no compressed frames is read straight into the buffer, one ``pread``
        per frame on this thread (the kernel told of a cold batch's ranges at once, as
        ``read_many`` does); anything else is read by ``read_many`` and copied in.

        Args:
            keys: frame ids or names (repeats allowed).
            buffer: writable, contiguous memory filled from its start, reused when big enough
                (the views of its previous batch then show the new bytes); when it is too small,
                or None, a new ``bytearray`` just big enough is used (``frame_sizes`` says how
                big a batch is).
        """
        if not keys:
            return []
        if self._codecs is None:  # sizes as stored: the ranges looked up once, for both
            ids, offs, lens = self._ranges(keys)
            views = carved(buffer_for(buffer, sum(lens)), lens)
            self._fill(ids, offs, lens, views)
            return views
        ids = self._frame_ids(keys)  # names looked up once, not again by read_into
        sizes = self.frame_sizes(ids)
        views = carved(buffer_for(buffer, sum(sizes)), sizes)
        self.read_into(ids, views)
        return views

    def read_into(self, keys: Sequence[FrameKey], views: Sequence[memoryview]) -> None:
        """Read each frame of ``keys`` into its view in ``views``, each exactly the frame's size
        (``frame_sizes``); the work of ``read_many_into``, for callers that lay a buffer out
        themselves (a dataset's shards)."""
        if not keys:
            return
        if len(views) != len(keys):
            raise InputError(f"read_into: {len(keys)} frames asked for, {len(views)} views to read them into")
        if any(v.format != "B" or v.ndim != 1 for v in views):  # (a copy needs the same layout both sides)
            views = [v.cast("B") for v in views]
        if self._codecs is None:
            ids, offs, lens = self._ranges(keys)
            self._fill(ids, offs, lens, views)
            return
        for view, data in zip(views, self.read_many(keys), strict=True):
            view[:] = data

    def _fill(self, ids: Sequence[int], offs: list[int], lens: list[int], views: Sequence[memoryview]) -> None:
        """``read_into`` of a pack with no compressed frames, its ranges looked up."""
        fileno = getattr(self._storage, "fileno", None)
        with self._held():
            if not self.remote and fileno is not None:
                with self._replaced_if_moved() if self.checks_md5 else contextlib.nullcontext():
                    if self._read_into(fileno(), offs, lens, views):
                        if self.checks_md5:
                            self._check_md5(ids, views)
                        return
            # remote, or a read that failed or came short: the checked path reads it (or says
            # why it cannot)
            for view, data in zip(views, self.read_many(ids), strict=True):
                view[:] = data

    def frame_sizes(self, keys: Sequence[FrameKey]) -> list[int]:
        """The size of each frame as ``read`` returns it (decompressed), from the index."""
        lengths = self._raw_lengths if self._raw_lengths is not None else self._lengths
        return list(map(lengths.__getitem__, self._frame_ids(keys)))

    def _read_into(self, fd: int, offs: list[int], lens: list[int], views: Sequence[memoryview]) -> bool:
        """Each range read into its view; False after an error or an end of file met early.
        The first is read with ``pread``, timed: the rest of a warm batch is copied out of the
        map when there is one (no system call per frame), a cold one is asked for at once."""
        preadv = os.preadv
        try:
            t0 = time.perf_counter()
            for j, (off, n, view) in enumerate(zip(offs, lens, views, strict=True)):
                got = preadv(fd, [view], off)
                while got < n:  # a read of 2 GiB or more comes in parts
                    more = preadv(fd, [view[got:]], off + got)
                    if more <= 0:
                        return False
                    got += more
                if j == 0 and len(offs) > 1:
                    if _looks_cold(time.perf_counter() - t0, n):
                        if len(offs) > 2:
                            self._storage.prefetch(offs[1:], lens[1:])  # the rest asked for at once
                    elif (m := self._mapped()) is not None:
                        return _copy_from_map(m, offs[1:], lens[1:], views[1:])
        except (OSError, ValueError):
            return False
        return True

    def read_many_stored(
        self, keys: Sequence[FrameKey], workers: int | None = None, stats: ReadStats | None = None
    ) -> list[bytes]:
        """Like ``read_many``, but the bytes exactly as stored (no decompression)."""
        out = self._read_many_stored(keys, workers, stats)
        if self.checks_md5:
            ids = self._frame_ids(keys)
            with self._replaced_if_moved():
                self._check_md5(ids, [self._decode(i, d) for i, d in zip(ids, out)])
        return out

    def _read_many_stored(
        self,
        keys: Sequence[FrameKey],
        workers: int | None = None,
        stats: ReadStats | None = None,
        checked: set[int] | None = None,
    ) -> list[bytes]:
        """``read_many_stored`` without the md5 check (``checked``: see ``_cached``).

        The steps: look the ranges up (checked against the pack's data section); a local pack
        reads the first frame, timed, to tell whether the batch is in the page cache. A warm
        batch is only memory copies: one ``pread`` per frame on this thread, unless its frames
        are small and close enough for merged reads to save calls. A cold (or remote) batch
        whose frames are scattered (the usual random sample) and that one thread reads: one
        ``pread`` each; otherwise merge neighbouring ranges into runs and read them (on this
        thread when the batch is warm and small, else a contiguous share per worker), cutting
        each run's frames out as it arrives.
        """
        if not keys:
            return []
        cache = self._pack_cache()
        with self._held():  # (a close() in another thread meanwhile waits for this batch)
            if cache is not None:
                return self._cached(
                    self._frame_ids(keys), cache, lambda miss: self._read_batch(miss, workers, stats), checked
                )
            return self._read_batch(keys, workers, stats)

    # -- the node-local cache (remote packs) -------------------------------------------------------

    def _pack_cache(self) -> PackCache | None:
        """This process's handle on the pack's cache, made on first use (None: no cache)."""
        if self.cache_settings is None:
            return None
        if self._cache_pid != os.getpid():  # (a forked child keeps its own counts)
            root, limit = self.cache_settings
            generation = getattr(self._storage, "generation", lambda: "")()
            identity = PackIdentity(self.info.uuid, self.info.size, generation, len(self._offsets), self.shown)
            self._cache = NodeCache(root, limit).pack(identity)
            self._cache_pid = os.getpid()
            if self._cache is None:
                self.cache_settings = None  # unusable (warned once): read on without it
            else:
                if self._in_order is None:  # (once per reader: forked workers inherit it)
                    self._in_order = _increasing(self._offsets)
                self._cache.in_order = self._in_order
        return self._cache

    def _cached(
        self,
        ids: Sequence[int],
        cache: PackCache,
        fetch: Callable[[list[int]], list[bytes]],
        checked: set[int] | None = None,
        filling: bool = False,
    ) -> list[bytes]:
        """Frames as stored: those the cache holds (each checked against its hash), the rest
        fetched with ``fetch`` and kept when their md5 is the index's. A frame that fails is
        returned as it came to a reader that checks md5s (its own check says what it is), and to
        none other (``_refuse_wrong``); ``filling`` (nothing is returned: ``fill_cache``) only
        leaves it out of the cache. ``checked`` gets the ids of the frames returned whose md5
        is known to be the index's: held by the cache (kept after that check, read back
        unchanged: their hash) or kept now."""
        got = self._from_cache(ids, cache, checked)
        missing = [j for j, data in enumerate(got) if data is None]
        if not missing:
            return got  # type: ignore[return-value]
        unique = list(dict.fromkeys(ids[j] for j in missing))  # (a frame asked for twice: fetched once)
        # what another process (the sampler's read-ahead, a worker) is fetching now is waited
        # for, not fetched again; the rest is claimed, fetched and kept
        mine, theirs = cache.claim(unique)
        fetched = self._fetch_and_keep(mine, cache, fetch, checked, refuse=not filling)
        if theirs:
            cache.wait_for(theirs)
            again = self._from_cache(theirs, cache, checked, again=True)
            fetched.update((i, data) for i, data in zip(theirs, again) if data is not None)
            gone = [i for i, data in zip(theirs, again) if data is None]  # (given up there: fetched here)
            if gone:
                stored = fetch(gone)
                if not filling and not self.checks_md5:
                    self._refuse_wrong(gone, stored, self._md5s_match(gone, stored))
                fetched.update(zip(gone, stored))
        for j in missing:
            got[j] = fetched[ids[j]]
        return got  # type: ignore[return-value]

    def _from_cache(
        self, ids: Sequence[int], cache: PackCache, checked: set[int] | None, again: bool = False
    ) -> list[bytes | None]:
        """``cache.get_many`` of these frames; the ids of those it held added to ``checked``."""
        got = cache.get_many(ids, [self._offsets[i] for i in ids], [self._lengths[i] for i in ids], again)
        if checked is not None:
            checked.update(i for i, data in zip(ids, got) if data is not None)
        return got

    def _fetch_and_keep(
        self,
        ids: list[int],
        cache: PackCache,
        fetch: Callable[[list[int]], list[bytes]],
        checked: set[int] | None = None,
        refuse: bool = True,
    ) -> dict[int, bytes]:
        """Fetch frames this process claimed, keep those whose md5 is the index's (added to
        ``checked``), and give the claims of the rest up (also when the fetch fails); with
        ``refuse``, fail on one that is wrong (``_refuse_wrong``)."""
        if not ids:
            return {}
        try:
            fetched = dict(zip(ids, fetch(ids)))
            keep = self._md5s_match(ids, [fetched[i] for i in ids])
            if checked is not None:
                checked.update(keep)
            cache.put_many(keep, [self._offsets[i] for i in keep], [fetched[i] for i in keep])
        finally:
            cache.release(ids)  # (what was kept has its record: only claims left are cleared)
        if refuse:
            self._refuse_wrong(ids, [fetched[i] for i in ids], keep)
        return fetched

    def _refuse_wrong(self, ids: list[int], stored: list[bytes], right: Sequence[int]) -> None:
        """Of frames fetched for the node cache and checked against the index's md5 (``right``
        passed), none that failed is returned by a reader that checks no md5 of its own (a
        pinned one): the read fails naming the first, with its decoding error or as an md5
        mismatch, "replaced" where the pack was (a version its ETag did not tell apart)."""
        if self.checks_md5 or len(right) == len(ids):  # (a reader that checks: its own check says)
            return
        good = set(right)
        bad = min(i for i in ids if i not in good)
        with self._replaced_if_moved():
            self._decode(bad, stored[ids.index(bad)])
            raise ChecksumMismatch(f"{self.shown}: frame {bad}: md5 mismatch (stored bytes are not the indexed ones)")

    def fill_cache(
        self,
        keys: Sequence[FrameKey],
        workers: int | None = None,
        *,
        later: Sequence[int] | None = None,
        run: int = 0,
    ) -> int:
        """Fetch the frames of ``keys`` that the node cache does not hold into it, without
        reading back what it holds (``hframe prefetch``, the sampler's read-ahead). Returns how
        many were fetched (0 without a cache: a local pack, or none configured).

        ``later`` (a mask over frame ids: true for the frames that will be read later, the rest
        of a sampler's epoch) with ``run`` (bytes): a run of missing frames shorter than ``run``
        bytes is extended over the frames right after it in the pack that the mask holds and the
        cache lacks, to ``run`` bytes (``_spread``): bytes that would be fetched later anyway, in a
        fraction of the requests when the order is shuffled frame by frame. Those are claimed,
        fetched and kept ``SPREAD_FILL`` bytes at a time, in the order of ``keys``: a worker
        that needs one of them waits for that much, not for the whole fill."""
        cache = self._pack_cache()
        if cache is None or not keys:
            return 0
        missing = list(dict.fromkeys(cache.missing(self._frame_ids(keys))))
        groups = [missing]
        if missing and later is not None and run > 0:
            groups = self._spread(missing, cache, later, run)
        with self._held():
            for group in groups:
                if group:
                    self._cached(group, cache, lambda miss: self._read_batch(miss, workers, None), filling=True)
        return sum(map(len, groups))

    def _spread(self, ids: list[int], cache: PackCache, later: Sequence[int], run: int) -> list[list[int]]:
        """``ids`` and, after each run of them (frames back to back in the pack, a record
        header apart) shorter than ``run`` bytes, the pack's next frames that ``later`` marks and
        the cache neither holds nor has being fetched, until the run is ``run`` bytes long; in
        groups of about ``SPREAD_FILL`` bytes, in the order of ``ids``. (Runs already that long,
        a block-shuffled batch's, get nothing.)"""
        offsets, lengths, count, marked = self._offsets, self._lengths, len(self._offsets), len(later)
        asked = set(ids)
        taken = set(ids)
        groups: list[list[int]] = [[]]
        size_of_group = 0
        for i in ids:
            group = groups[-1]
            group.append(i)
            start = offsets[i]
            end = start + lengths[i]
            size_of_group += lengths[i]
            if i - 1 in asked and 0 <= start - offsets[i - 1] - lengths[i - 1] <= SPREAD_GAP:
                continue  # (not the first of its run: the first one spreads it)
            j = i + 1
            while j < count:
                off, size = offsets[j], lengths[j]
                if not 0 <= off - end <= SPREAD_GAP:
                    break
                if j not in asked:
                    if off + size - start > run or j in taken:
                        break
                    if j >= marked or not later[j] or not cache.missing((j,)):
                        break
                    taken.add(j)
                    group.append(j)
                    size_of_group += size
                end = off + size
                j += 1
            if size_of_group >= SPREAD_FILL:
                groups.append([])
                size_of_group = 0
        return groups

    @property
    def caches(self) -> bool:
        """Whether reads go through a node cache (a remote pack with a usable cache folder)."""
        return self._pack_cache() is not None

    def widen(self, in_flight: int) -> None:
        """A remote pack: allow up to ``in_flight`` requests at once in this process (the
        sampler's read-ahead fetches for every worker). Nothing for a local pack."""
        widen = getattr(self._storage, "widen", None)
        if widen is not None:
            widen(in_flight)

    def _md5s_match(self, ids: list[int], stored: list[bytes]) -> list[int]:
        """Those of ``ids`` whose stored bytes (decoded) have the index's md5 (hashed together:
        ``md5_each``)."""
        want = self._index_md5s()
        decodable, decoded = [], []
        for i, data in zip(ids, stored):
            try:
                decoded.append(self._decode(i, data))
            except HframeError:  # (undecodable: damaged, certainly not kept)
                continue
            decodable.append(i)
        return [i for i, digest in zip(decodable, md5_each(decoded)) if digest == want[i]]

    def _index_md5s(self) -> list[bytes]:
        if self._md5s is None:
            column = self.read_index_columns(["md5"]).column("md5").to_pylist()
            self._md5s = [bytes.fromhex(h) if h else b"" for h in column]
        return self._md5s

    def _held(self) -> contextlib.AbstractContextManager[None]:
        """The storage's ``held`` (reads in flight, which a ``close()`` meanwhile waits for),
        where it has one."""
        held = getattr(self._storage, "held", None)
        return held() if held is not None else contextlib.nullcontext()

    def _read_batch(
        self, keys: Sequence[FrameKey], workers: int | None = None, stats: ReadStats | None = None
    ) -> list[bytes]:
        ids, offs, lens = self._ranges(keys)
        w = workers or self.workers or default_workers(len(keys))
        if stats is not None:
            runs = self._coalesce(offs, lens)
            out, seconds = self._read_runs_timed(runs, w, offs, lens)
            stats.add(runs, seconds, lens, self.max_read)
            return out
        if self.remote:
            if w <= 1 and self._scattered(offs, lens):
                each = self._read_each(offs, lens)
                if each is not None:
                    return each
            return self._read_runs(self._coalesce(offs, lens), w, offs, lens)
        first, cold = self._read_first(offs[0], lens[0])
        if first is None:  # a failed or split read: the checked path says why, or reads it in pieces
            return self._read_runs(self._coalesce(offs, lens), w, offs, lens)
        if cold:
            each_pays = w <= 1 and self._scattered(offs, lens)
        else:  # merged reads save calls but copy every frame once more: worth it for small frames only
            big = sum(lens) >= _WARM_EACH_BYTES * len(lens) and max(lens) <= self.max_read
            # (a map makes every frame a slice: nothing for merging to save)
            each_pays = big or self._map is not None or self._scattered(offs, lens)
        if each_pays:
            each = self._read_each(offs, lens, first, cold)
            if each is not None:
                return each
        return self._read_runs(self._coalesce(offs, lens), w, offs, lens, cold)

    def _ranges(self, keys: Sequence[FrameKey]) -> tuple[Sequence[int], list[int], list[int]]:
        """Frame ids, offsets and lengths of ``keys``, each range checked against the pack."""
        offsets, lengths = self._offsets, self._lengths
        try:  # fast path: a sequence of valid int ids (array indexing rejects names and ids >= count)
            lowest = min(keys)
            if lowest < 0 or (lowest <= 1 and any(type(k) is bool for k in keys)):  # type: ignore[operator]
                raise TypeError  # (True indexes as 1: the careful path refuses it)
            if len(keys) > 1:  # one C call per column (a map of __getitem__ costs twice as much)
                pick = operator.itemgetter(*keys)
                offs, lens = list(pick(offsets)), list(pick(lengths))
            else:
                offs, lens = [offsets[keys[0]]], [lengths[keys[0]]]  # type: ignore[index]
            ids: Sequence[int] = keys  # type: ignore[assignment]
        except (TypeError, IndexError):
            ids = self._frame_ids(keys)
            offs = list(map(offsets.__getitem__, ids))
            lens = list(map(lengths.__getitem__, ids))
        if not self._all_in_range and (
            min(offs) < HEADER_SIZE or min(lens) < 0 or max(map(int.__add__, offs, lens)) > self._data_end
        ):
            for i, off, ln in zip(ids, offs, lens):
                self._check_range(i, off, ln)
        return ids, offs, lens

    def _scattered(self, offs: list[int], lens: list[int]) -> bool:
        """True when (almost) no two frames are close enough to merge: merging a pair or two
        would save less than planning the runs costs."""
        longest = max(lens)
        if longest > self.max_read:
            return False
        # frames in the same slot of ``reach`` bytes are close; a close pair across two slots is
        # missed half the time (hence 32, not 16): half the cost of sorting, at every batch
        reach = max(1, self.coalesce_gap + longest)  # (empty frames and no gap: 0)
        near = len(offs) - len(set(map(operator.floordiv, offs, repeat(reach))))  # (faster than a method-wrapper)
        return near * 32 <= len(offs)

    def _read_first(self, offset: int, length: int) -> tuple[bytes | None, bool]:
        """A local batch's first frame (None when it fails or needs more than one read) and
        whether that read looked cold (the batch is probably not in the page cache)."""
        if length > self.max_read:
            return None, False
        t0 = time.perf_counter()
        try:  # (pread even when mapped: a batch not known to be warm is not read through the map)
            data = self._storage.preader()(length, offset)
        except (OSError, ValueError):
            return None, False
        return data, _looks_cold(time.perf_counter() - t0, length)

    def _read_each(
        self, offs: list[int], lens: list[int], first: bytes | None = None, cold: bool = False
    ) -> list[bytes] | None:
        """One ``pread`` per frame, in the order asked (None after a short read or an error:
        the caller reads again through the checked path). ``first``: the first frame, already
        read; ``cold``: the batch is not in the page cache (the rest is asked for at once)."""
        pread = self._preader(cold)
        try:
            if self.remote and len(offs) > 1:  # all requests at once, then take them in order
                self._storage.prefetch(offs, lens)
            elif cold and len(offs) > 2:
                self._storage.prefetch(offs[1:], lens[1:])
            if first is None:
                first = pread(lens[0], offs[0])
            blobs = [first, *_each(pread, lens[1:], offs[1:])]
        except (OSError, ValueError):  # read_at, on the checked path, says which file and why
            return None
        return blobs if sum(map(len, blobs)) == sum(lens) else None

    def _coalesce(self, offs: list[int], lens: list[int]) -> list[Run]:
        """The ranges in offset order, neighbours at most ``coalesce_gap`` apart merged into runs
        of at most ``max_read`` bytes (a single longer frame is a run of its own)."""
        gap, cap = self.coalesce_gap, self.max_read
        if self.gap_budget is not None and len(offs) > 1:
            gap = _budgeted_gap(offs, lens, gap, self.gap_budget)
        runs: list[Run] = []
        members: list[int] = []
        run_off = run_end = 0
        for j in sorted(range(len(offs)), key=offs.__getitem__):
            off = offs[j]
            end = off + lens[j]
            if members and off - run_end <= gap and end - run_off <= cap:
                members.append(j)
                if end > run_end:
                    run_end = end
                continue
            if members:
                runs.append((run_off, run_end - run_off, members))
            members = [j]
            run_off, run_end = off, end
        runs.append((run_off, run_end - run_off, members))
        return runs

    def _read_runs(
        self, runs: list[Run], workers: int, offs: list[int], lens: list[int], cold: bool | None = None
    ) -> list[bytes]:
        """Every frame's bytes, read run by run and cut out at once (while the run is in the CPU
        cache): the first run on this thread (is the batch cold?) unless ``cold`` says; the rest
        here too when the batch is warm and small, else a contiguous share of the runs per worker."""
        out: list[bytes] = [b""] * len(offs)
        read_at, pread, cap = self._storage.read_at, self._preader(bool(cold)), self.max_read

        def read_share(share: list[Run]) -> None:
            for run in share:
                off, size, _ = run
                try:  # the bare pread: a Python call and a syscall less per run than read_at
                    blob = pread(size, off) if size <= cap else b""
                except (OSError, ValueError):
                    blob = b""
                if len(blob) != size:  # finish a short read, split a long one, or fail with the path
                    blob = self._read_plan(read_at, off, size)
                self._cut(run, blob, out, offs, lens)

        if self.remote and len(runs) > 1:  # all requests at once: the shares below wait for theirs
            self._storage.prefetch([r[0] for r in runs if r[1] <= cap], [r[1] for r in runs if r[1] <= cap])
        rest = runs
        if cold is None:
            t0 = time.perf_counter()
            read_share(runs[:1])
            cold = self.remote or _looks_cold(time.perf_counter() - t0, runs[0][1])
            rest = runs[1:]
            if cold:
                pread = self._preader(cold=True)
        if len(rest) > 1 and cold and not self.remote:
            self._storage.prefetch([r[0] for r in rest], [r[1] for r in rest])
        if workers <= 1 or len(rest) <= 1 or (not cold and sum(r[1] for r in runs) <= _INLINE_WARM_BYTES):
            # warm and small: handing reads to threads would cost more than the copies themselves
            read_share(rest)
        elif rest:
            # a warm batch is only memory copies: more threads than cores would just take turns
            k = min(workers if cold else min(workers, usable_cpus()), len(rest))
            shares = [rest[i * len(rest) // k : (i + 1) * len(rest) // k] for i in range(k)]
            for _ in self._pool_map(workers, read_share, shares):
                pass
        return out

    def _read_runs_timed(
        self, runs: list[Run], workers: int, offs: list[int], lens: list[int]
    ) -> tuple[list[bytes], list[float]]:
        """Like ``_read_runs``, one task per run, with each run's read time."""
        out: list[bytes] = [b""] * len(offs)
        read_at = self._storage.read_at
        if self._map is not None:
            pread, checked = _map_slicer(self._map), self._storage.read_at

            def read_at(offset: int, length: int) -> bytes:  # short at the end, as read_at is
                try:
                    return pread(length, offset)
                except ValueError:  # the map closed meanwhile (close() in another thread)
                    return checked(offset, length)

        clock = time.perf_counter

        def timed(run: Run) -> float:
            t0 = clock()
            blob = self._read_plan(read_at, run[0], run[1])
            seconds = clock() - t0
            self._cut(run, blob, out, offs, lens)
            return seconds

        seconds = [timed(runs[0])]
        rest = runs[1:]
        cold = self.remote or _looks_cold(seconds[0], runs[0][1])
        if len(rest) > 1 and cold:
            fit = [r for r in rest if r[1] <= self.max_read]  # longer runs are read in pieces
            self._storage.prefetch([r[0] for r in fit], [r[1] for r in fit])
        # on this thread where read_many reads a warm batch on it too (small, or large frames)
        total = sum(r[1] for r in runs)
        inline = not cold and (total <= _INLINE_WARM_BYTES or total >= _WARM_EACH_BYTES * len(offs))
        if workers <= 1 or len(rest) <= 1 or inline:
            seconds += map(timed, rest)
        else:
            seconds += self._pool_map(workers, timed, rest)
        return out, seconds

    def _cut(self, run: Run, blob: bytes, out: list[bytes], offs: list[int], lens: list[int]) -> None:
        """The bytes of each frame in ``run`` out of the run's, into ``out``; a short run is a
        truncated pack."""
        run_off, size, members = run
        if len(blob) != size:
            raise FrameOutOfRange(
                f"{self.shown}: short read at offset {run_off} ({len(blob)} of {size} bytes); pack truncated?"
            )
        if len(members) == 1:
            out[members[0]] = blob
        else:
            view = memoryview(blob)
            for j in members:
                start = offs[j] - run_off
                out[j] = view[start : start + lens[j]].tobytes()

    def _read_plan(self, read_at: Any, offset: int, length: int) -> bytes:
        if length <= self.max_read:
            return read_at(offset, length)  # type: ignore[no-any-return]
        return b"".join(read_at(o, n) for o, n in _split(offset, length, self.max_read))

    def _get_pool(self, workers: int) -> ThreadPoolExecutor:
        with self._pool_lock:
            pid = os.getpid()
            if self._pool is None or self._pool_pid != pid or self._pool._max_workers != min(workers, 64):
                if self._pool is not None and self._pool_pid == pid:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(max_workers=min(workers, 64), thread_name_prefix="hframe-read")
                self._pool_pid = pid
            return self._pool

    def _pool_map(self, workers: int, fn: Callable[[_T], _R], items: list[_T]) -> Iterator[_R]:
        """``fn`` over ``items`` on the pool, or on this thread when the pool was shut down
        under the caller (by a ``close()``, or a call for another pool size, in another thread)."""
        try:
            return self._get_pool(workers).map(fn, items)
        except RuntimeError:  # (raised as the work is handed over, before any of it runs)
            return map(fn, items)

    def close(self) -> None:
        """Release the file descriptor and the thread pool (reopened on next use).

        A ``close()`` while another thread reads leaves the descriptor to the batches in flight
        (``read_many``, ``read_many_into``, ``read_into``): they finish on the pack (a mapped
        reader's batch may map it again to finish, as any read after ``close()`` does), and the
        last closes it (closed at once, its number could go to a file opened meanwhile, which the
        rest of the batch would read). A single-frame read already under way (``p[i]``,
        ``read_stored``, ``head``) is not counted (a lock per frame would cost as much as a
        small read): close a reader when its reads are done, as a ``with`` block does."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None
        with self._arm_lock:
            self._fast_fd = -1  # before the descriptor goes: its number may soon name another file
            self._fast_map = None  # (and no reference to the map left)
            if self._map is not None:
                # a read_into copying from it in another thread holds it exported: then it is
                # unmapped when that copy lets it go (the last reference), not here
                with contextlib.suppress(BufferError):
                    self._map.close()
                self._map = None
            self._map_failed = False
            self._storage.close()
        self._index.close()
        if self._cache is not None and self._cache_pid == os.getpid():
            self._cache.close()  # (its counts, to the cache's stats)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as paths, options and the generation it holds: the process that unpickles it
        (a spawned DataLoader worker) reads that same generation or fails with ``PackReplaced``."""
        return {
            "path": self.path,
            "index_path": self.index_path,
            "workers": self.workers,
            "coalesce_gap": self.coalesce_gap,
            "max_read": self.max_read,
            "memory_map": self.memory_map,
            "cache_dir": self.cache_settings[0] if self.cache_settings else "",
            "cache_limit": self.cache_settings[1] if self.cache_settings else None,
            "_snapshot": {
                "uuid": self.info.uuid,
                "size": self.info.size,
                "pack": self._storage.origin,
                "index": self._index.origin,
                "index_location": _opened_at(self._index),
            },
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.pop("path"), state.pop("index_path"), **state)  # type: ignore[misc]


def _opened_at(storage: Storage) -> str:
    """Where ``storage`` was opened: its path, or its URL whole (``location`` is the URL as
    messages show it, without its query: an object store's endpoint and options are there)."""
    return getattr(storage, "url", None) or storage.location


_pread = os.pread


def _each(pread: Callable[[int, int], bytes], lens: list[int], offs: list[int]) -> Iterator[bytes]:
    """``map(pread, lens, offs)``; a ``pread`` bound to a descriptor (``Storage.preader``) is
    called as ``os.pread`` itself: a call through the ``functools.partial`` shows in a warm
    small read (``scripts/bench_read.py``)."""
    if type(pread) is functools.partial and pread.func is _pread and len(pread.args) == 1 and not pread.keywords:
        return map(_pread, repeat(pread.args[0]), lens, offs)
    return map(pread, lens, offs)


#: every reader of this process, from its construction on (registered before it can be armed:
#: one armed first and registered after could miss a fork in between, and keep its arming)
_readers: weakref.WeakSet[PackReader] = weakref.WeakSet()


def _disarm_forked() -> None:
    """In a forked child, before any of its code runs: no reader reads an id through the
    descriptor number it inherited (the child may close it, and the number then name another
    file). The careful path reattaches (``LocalFile.fileno``) and arms the reader again. This
    hook, not a pid compared at every ``p[i]``, since that compare shows in a warm small read
    (``scripts/bench_read.py``); a child forked in C without Python's at-fork hooks keeps the parent's number, which
    reads the same file until the child closes it."""
    for reader in list(_readers):
        reader._fast_fd, reader._fast_map = -1, None
        reader._arm_lock = threading.Lock()  # (held by another of the parent's threads, maybe)


os.register_at_fork(after_in_child=_disarm_forked)


def _map_file(fd: int) -> mmap.mmap | None:
    """The whole file as a read-only shared map (None where it cannot be mapped: the reader
    then reads with ``pread``), advised random: a fault on a page not in memory reads that page,
    not the device's read-ahead around it (8 MiB on this VM's disk: 7-9 ms for one 2.6 KB frame)."""
    try:
        m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    with contextlib.suppress(AttributeError, OSError):
        m.madvise(mmap.MADV_RANDOM)
    return m


def _copy_from_map(m: mmap.mmap, offs: list[int], lens: list[int], views: Sequence[memoryview]) -> bool:
    """Each range copied from the map into its view; False when the map was closed meanwhile
    or a range runs past its end (the checked path then reads it or says why)."""
    try:
        mapped = memoryview(m)  # (a close() meanwhile leaves the map to this copy: see close)
    except ValueError:
        return False
    try:
        for off, n, view in zip(offs, lens, views, strict=True):
            view[:] = mapped[off : off + n]  # (a short slice does not fit: ValueError)
    except ValueError:
        return False
    finally:
        mapped.release()
    return True


def _map_slicer(m: mmap.mmap) -> Callable[[int, int], bytes]:
    def read(length: int, offset: int) -> bytes:
        return m[offset : offset + length]  # (short at the end of the map, as pread is)

    return read


_T = TypeVar("_T")
_R = TypeVar("_R")

#: A warm batch up to this size is read on the calling thread (no pool hand-off).
_INLINE_WARM_BYTES = 2 << 20
#: A warm local batch whose frames average this size or more is read one ``pread`` per frame
#: (a merged read would save a call per frame and cost a copy per frame: more, from here up).
_WARM_EACH_BYTES = 16 << 10


def _budgeted_gap(offs: Sequence[int], lens: Sequence[int], most: int, budget: float) -> int:
    """The largest gap (at most ``most``) such that merging every gap up to it reads at most
    ``budget`` x the batch's bytes in between: each request saved costs the fewest extra bytes."""
    spans = sorted(zip(offs, lens))
    gaps = sorted(g for g in (b[0] - (a[0] + a[1]) for a, b in zip(spans, spans[1:])) if 0 < g <= most)
    allowed, spent, chosen = budget * sum(lens), 0, 0
    for g in gaps:
        if spent + g > allowed:
            break
        spent += g
        chosen = g
    return chosen


def buffer_for(buffer: bytearray | memoryview | None, size: int) -> memoryview:
    """``buffer`` as writable bytes when it holds ``size`` of them, else a new bytearray's
    (``read_many_into``)."""
    if buffer is not None:
        view = memoryview(buffer)
        if view.readonly:
            raise InputError("read_many_into: the buffer is read-only")
        if not view.c_contiguous:
            raise InputError("read_many_into: the buffer is not contiguous")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        if view.nbytes >= size:
            return view
    return memoryview(bytearray(size))


def carved(view: memoryview, sizes: Sequence[int]) -> list[memoryview]:
    """``view`` cut into consecutive views of ``sizes`` bytes, from its start."""
    out = []
    at = 0
    for n in sizes:
        out.append(view[at : at + n])
        at += n
    return out


def _looks_cold(seconds: float, nbytes: int) -> bool:
    """A read slower than a page-cache copy could be: the batch is probably not in memory."""
    return looks_cold(seconds, nbytes)


_STATS_LOCK = threading.Lock()


@dataclass
class ReadStats:
    """Counters ``read_many`` fills in when asked (benchmarks, monitoring)."""

    read_calls: int = 0
    bytes_requested: int = 0
    bytes_read: int = 0
    frame_latencies_s: list[float] = field(default_factory=list)

    def add(self, runs: list[Run], seconds: list[float], lens: list[int], max_read: int) -> None:
        """Count one batch: its runs (read in pieces of at most ``max_read``) and, per frame,
        the time its run took (the shards of a remote dataset add theirs from several threads)."""
        with _STATS_LOCK:
            for (_, size, members), dt in zip(runs, seconds):
                self.read_calls += -(-size // max_read)
                self.bytes_read += size
                for j in members:
                    self.bytes_requested += lens[j]
                    self.frame_latencies_s.append(dt)


def _split(offset: int, length: int, cap: int) -> Iterator[tuple[int, int]]:
    end = offset + length
    while offset < end:
        step = min(cap, end - offset)
        yield offset, step
        offset += step


def _increasing(offsets: array[int]) -> bool:
    """Whether every frame's offset is beyond the one before."""
    if len(offsets) < 65536:  # (as below: cheaper than importing pyarrow.compute)
        return all(map(operator.lt, offsets, islice(offsets, 1, None)))
    import pyarrow.compute as pc

    col = pa.Array.from_buffers(pa.int64(), len(offsets), [None, pa.py_buffer(offsets)])
    return bool(pc.all(pc.less(col[:-1], col[1:])).as_py())


def _all_in_range(table: pa.Table, data_end: int, offsets: array[int], lengths: array[int]) -> bool:
    """Whether every index entry lies in the pack's data section."""
    if table.num_rows == 0:
        return True
    if len(offsets) < 65536:  # cheaper than importing pyarrow.compute (~75 ms) for a small pack
        return min(offsets) >= HEADER_SIZE and max(map(int.__add__, offsets, lengths)) <= data_end and min(lengths) >= 0
    offset, length = table.column("offset"), table.column("length")
    import pyarrow.compute as pc

    try:  # (checked: an int64 sum that wraps around would read as in range)
        hi = pc.max(pc.add_checked(offset, length)).as_py()
    except pa.ArrowInvalid:
        return False  # an offset + length past 2**63: not a range of any pack
    return bool(pc.min(offset).as_py() >= HEADER_SIZE and hi <= data_end and pc.min(length).as_py() >= 0)
