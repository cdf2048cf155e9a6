"""A node-local cache of remote packs' frames: bounded, shared by every process on the node,
surviving restarts, and never the source of a wrong byte (``man hframe``, CACHE).

Layout, under the cache folder (``--cache-dir``, ``HFRAME_CACHE_DIR``)::

    hframe-cache-2/                   this layout's version: any other folder there is ignored
                                      (``hframe cache --clear`` removes them too)
      evict.lock                      held (flock) by the one process evicting
      packs/UUID-GEN/                 one pack generation: its UUID and size, and its ETag
        pack.json                       what it is (URL shown, UUID, ETag, size, frames)
        frames                          16 bytes per frame: a mark, a claim's process id, and
                                        the frame's xxh3-64
        used                            8 bytes per segment: when it was last read or filled
        seg/000042                      the pack's bytes [42 x 64 MiB, 43 x 64 MiB), sparse
        stats                           one line per reader closed: hits, misses, bytes
      kept/0123abcd...                what a remote open fetched first (a pack's header and
                                      trailer, an index whole), by URL and ETag: the next open
                                      asks only whether the object changed (``storage/kept.py``)

A frame lives in the segment its first byte falls in, at its own offset within it (a segment
file may run past 64 MiB by its last frame's tail). Only a frame checked against the index's
md5 when it arrived from the store is written; its record in ``frames`` (hash, then mark) is
set after its bytes are written, so a process killed between the two leaves bytes nobody
trusts. Every read from the cache is checked against that hash (xxh3-64: 0.7 us for a 34 KB
frame, where crc32 takes 14 us and md5 53 us, as long as the read itself): a record whose
bytes do not match (damaged, evicted under it, never fully written) is dropped and the frame
fetched again.

Why this is enough: a segment file only ever holds, at each offset, that generation's own bytes
or nothing (a hole reads as zeros; so do the zeros written between neighbouring frames, where
the pack has a record header, ``_writes``). Processes filling the same frame at once write the same
bytes; eviction unlinks whole segments (least recently used first), and a record left behind
then fails its hash. ``frames`` and ``used`` are shared memory maps: a lookup is a load, with
no lock and no system call.

Keyed by the pack's UUID (content-derived, or random: a republished pack has a new one), its
size and the store's ETag or generation: a replaced pack never gets the old bytes.

A cache that cannot be written (disk full, read-only, no permission) gives one ``CacheWarning``
per process and the reader goes on without it.

Imports inside functions: xxhash, by the first pack cache opened (4 ms that every command
importing the reader would pay otherwise).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import struct
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..faults import fault_point
from ..storage.access import looks_cold, will_need
from ..storage.kept import KeptCopies
from ..units import parse_size

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_LIMIT_ENV",
    "CacheWarning",
    "NodeCache",
    "PackCache",
    "cache_settings",
    "kept_copies",
]

CACHE_DIR_ENV = "HFRAME_CACHE_DIR"
CACHE_LIMIT_ENV = "HFRAME_CACHE_LIMIT"
LAYOUT = "hframe-cache-2"
#: the layouts of hframe before this one: ignored, removed by ``clear``
OLD_LAYOUTS = ("hframe-cache-1",)
SEGMENT = 64 << 20
#: without a limit: at most this share of the cache's file system
DEFAULT_SHARE = 0.5
_MARK = 0x32434648  # "HFC2", little-endian
_MARK_BYTES = struct.pack("<I", _MARK)
#: a frame one process is fetching now (its owner field: that process's id): others wait for it
#: rather than fetch it too, while that process lives, for at most ``FILLING_FOR`` seconds
_FILLING = 0x32464648  # "HFF2"
FILLING_FOR = 10.0
_RECORD = struct.Struct("<IIQ")  # mark, owner (a claim's pid, else 0), xxh3-64 of the frame
_USED = struct.Struct("<Q")
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_O_WRITE = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class CacheWarning(UserWarning):
    """The cache could not be used (it is left alone; reads go on without it)."""


def cache_settings(
    cache_dir: str | os.PathLike[str] | None, cache_limit: int | str | None
) -> tuple[str, int | None] | None:
    """The cache folder and limit to use: the arguments, else ``HFRAME_CACHE_DIR`` and
    ``HFRAME_CACHE_LIMIT``; None when there is no cache folder (or it is ``""``).

    Raises:
        InputError: a limit that is not a size.
    """
    root = os.fspath(cache_dir) if cache_dir is not None else os.environ.get(CACHE_DIR_ENV, "")
    if not root:
        return None
    if cache_limit is None:
        cache_limit = os.environ.get(CACHE_LIMIT_ENV) or None
    if isinstance(cache_limit, str):
        cache_limit = parse_size(cache_limit, "cache limit")
    if cache_limit is not None and cache_limit <= 0:
        raise InputError(f"cache limit must be positive (got {cache_limit})")
    return root, cache_limit


@dataclass(frozen=True)
class PackIdentity:
    """What names one pack generation in the cache."""

    uuid: str
    size: int
    generation: str  # the store's ETag or generation ("" when it has none)
    frames: int
    shown: str  # the URL, as messages show it

    @property
    def key(self) -> str:
        tag = hashlib.sha256(f"{self.size}\0{self.generation}".encode()).hexdigest()[:16]
        return f"{self.uuid}-{tag}"


class NodeCache:
    """The cache folder of this node: its packs, its limit, its eviction."""

    def __init__(self, root: str | os.PathLike[str], limit: int | None = None) -> None:
        self.root = os.path.join(os.fspath(root), LAYOUT)
        self.limit = limit
        self._lock = threading.Lock()
        self._written = 0  # bytes this process wrote since it last looked at the total

    # -- packs -----------------------------------------------------------------------------------

    @property
    def kept_folder(self) -> str:
        """Where the kept copies of remote opens are (``storage/kept.py``)."""
        return os.path.join(self.root, "kept")

    def kept_files(self) -> Iterator[tuple[float, str, int]]:
        """(last used, path, bytes on disk) of every kept copy."""
        try:
            entries = list(os.scandir(self.kept_folder))
        except FileNotFoundError:
            return
        for e in entries:
            with contextlib.suppress(OSError):
                st = e.stat()
                yield st.st_mtime, e.path, st.st_blocks * 512

    def pack(self, identity: PackIdentity) -> PackCache | None:
        """The cache of one pack generation (made if new); None, with a ``CacheWarning``, when
        the folder cannot be used."""
        try:
            return PackCache(self, identity)
        except OSError as e:
            warn_unusable(self.root, e)
            return None

    def packs(self) -> list[str]:
        """The folders of the pack generations held."""
        top = os.path.join(self.root, "packs")
        try:
            return sorted(e.path for e in os.scandir(top) if e.is_dir())
        except FileNotFoundError:
            return []

    # -- size and eviction ---------------------------------------------------------------------

    def effective_limit(self) -> int:
        """The limit: given, else half of the file system holding the cache."""
        if self.limit is not None:
            return self.limit
        where = os.path.abspath(self.root)
        while not os.path.exists(where):  # (a cache not made yet: the disk it will be on)
            where = os.path.dirname(where)
        st = os.statvfs(where)
        return int(st.f_blocks * st.f_frsize * DEFAULT_SHARE)

    def segments(self) -> Iterator[tuple[float, str, int]]:
        """(last used, path, bytes on disk) of every segment held."""
        for pack in self.packs():
            used = _read_used(os.path.join(pack, "used"))
            try:
                entries = list(os.scandir(os.path.join(pack, "seg")))
            except FileNotFoundError:
                continue
            for e in entries:
                try:
                    st = e.stat()
                    n = int(e.name)
                except (OSError, ValueError):
                    continue
                yield (used[n] if n < len(used) else 0) or st.st_mtime, e.path, st.st_blocks * 512

    def usage(self) -> int:
        """Bytes the segments and kept copies take on disk."""
        return sum(b for _, _, b in self.segments()) + sum(b for _, _, b in self.kept_files())

    def wrote(self, nbytes: int) -> None:
        """Count bytes written; past a sixteenth of the limit, look at the total (and evict)."""
        with self._lock:
            self._written += nbytes
            due = self._written * 16 >= self.effective_limit()
            if due:
                self._written = 0
        if due:
            self.evict()

    def evict(self, down_to: int | None = None) -> int:
        """Unlink the least recently used segments and kept copies until the cache holds at
        most ``down_to`` bytes (default: 90 % of the limit), when it holds more than the limit
        (or ``down_to``). One process at a time: another one evicting means this one need not.
        Returns the bytes freed."""
        limit = self.effective_limit()
        target = int(limit * 0.9) if down_to is None else down_to
        if not os.path.isdir(self.root):
            return 0  # (nothing held: nothing to make here)
        fd = os.open(os.path.join(self.root, "evict.lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0))
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if down_to is None else 0))
            except BlockingIOError:
                return 0
            found = sorted([*self.segments(), *self.kept_files()])
            total = sum(b for _, _, b in found)
            if total <= (limit if down_to is None else down_to):
                return 0
            freed = 0
            for _, path, nbytes in found:
                if total - freed <= target:
                    break
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    freed += nbytes
            return freed
        finally:
            os.close(fd)

    def clear(self) -> None:
        """Remove every pack generation and kept copy (readers using them fetch again), and
        the folders of the layouts of hframe before this one."""
        for pack in self.packs():
            shutil.rmtree(pack, ignore_errors=True)
        shutil.rmtree(self.kept_folder, ignore_errors=True)
        for old, _ in self.old_layouts():
            shutil.rmtree(old, ignore_errors=True)

    def old_layouts(self) -> list[tuple[str, int]]:
        """(folder, bytes on disk) of the layouts before this one beside it (never read)."""
        parent = os.path.dirname(self.root)
        found = [p for p in (os.path.join(parent, name) for name in OLD_LAYOUTS) if os.path.isdir(p)]
        return [(p, _disk_bytes(p)) for p in found]

    def stats(self, pack: str) -> dict[str, int]:
        """A pack generation's summed reader statistics (``stats`` lines)."""
        total = {"hits": 0, "misses": 0, "hit_bytes": 0, "filled_bytes": 0, "dropped": 0}
        with contextlib.suppress(FileNotFoundError), open(os.path.join(pack, "stats"), "rb") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    for k, v in json.loads(line).items():
                        if k in total and type(v) is int:
                            total[k] += v
        return total


def kept_copies(settings: tuple[str, int | None] | None) -> KeptCopies | None:
    """The kept copies of remote opens in the cache ``settings`` name (``cache_settings``)."""
    return None if settings is None else KeptCopies(NodeCache(settings[0]).kept_folder)


def warn_unusable(where: str, err: OSError) -> None:
    """One warning per process and folder: the cache cannot be used."""
    if where in _WARNED:
        return
    _WARNED.add(where)
    warnings.warn(f"cache {where}: {err.strerror or err}; reading on without it", CacheWarning, stacklevel=3)


_WARNED: set[str] = set()


def _disk_bytes(folder: str) -> int:
    total = 0
    for d, _, files in os.walk(folder):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
    return total


def _read_used(path: str) -> list[int]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return [v for (v,) in _USED.iter_unpack(data[: len(data) // 8 * 8])]


class PackCache:
    """The cached frames of one pack generation, for the readers of this process."""

    def __init__(self, node: NodeCache, identity: PackIdentity) -> None:
        self.node = node
        self.identity = identity
        self.dir = os.path.join(node.root, "packs", identity.key)
        self.segments = max(1, -(-identity.size // SEGMENT))
        os.makedirs(os.path.join(self.dir, "seg"), exist_ok=True)
        info = os.path.join(self.dir, "pack.json")
        if not os.path.exists(info):
            tmp = f"{info}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(
                    {
                        "url": identity.shown,
                        "uuid": identity.uuid,
                        "generation": identity.generation,
                        "size": identity.size,
                        "frames": identity.frames,
                        "layout": LAYOUT,
                    },
                    f,
                )
            os.replace(tmp, info)
        self._frames = _shared_map(os.path.join(self.dir, "frames"), max(1, identity.frames) * _RECORD.size)
        self._used = _shared_map(os.path.join(self.dir, "used"), self.segments * _USED.size)
        self._touched: dict[int, int] = {}
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "hit_bytes": 0, "filled_bytes": 0, "dropped": 0}
        self.broken = False  # a write failed: this process reads on without filling
        #: the pack's frame offsets grow with the frame id (its reader says; every pack hframe
        #: writes): neighbouring frames are then written together (``_writes``)
        self.in_order = False
        self._pid = os.getpid()
        self._hash = _xxh3()

    # -- reading -------------------------------------------------------------------------------

    def get_many(
        self, ids: Sequence[int], offs: Sequence[int], lens: Sequence[int], again: bool = False
    ) -> list[bytes | None]:
        """Each frame's bytes from the cache, checked against its hash, or None (not held, or
        held wrongly: then its record is dropped). Small frames of one segment close to each
        other are read together (one ``pread`` per run); a big frame by itself, straight into
        the bytes returned."""
        out: list[bytes | None] = [None] * len(ids)
        frames, unpack, hash_of = self._frames, _RECORD.unpack_from, self._hash
        records = [unpack(frames, i * _RECORD.size) for i in ids]
        by_segment: dict[int, list[int]] = {}
        for j, record in enumerate(records):
            if record[0] == _MARK:
                by_segment.setdefault(offs[j] // SEGMENT, []).append(j)
        hits = hit_bytes = dropped = 0
        plan: list[tuple[int, int, list[tuple[int, int, list[int]]]]] = []  # (segment, fd, runs)
        try:
            for seg, js in by_segment.items():
                try:
                    fd = os.open(self._segment_path(seg), _O_READ)
                except OSError:  # evicted: every record of it is stale
                    for j in js:
                        self._drop(ids[j], records[j])
                    dropped += len(js)
                    continue
                plan.append((seg, fd, _runs(js, offs, lens)))
            timed = True  # the first read says whether the batch is on disk rather than in memory
            pread, clock = os.pread, time.perf_counter
            for seg, fd, runs in plan:
                base = seg * SEGMENT
                for run_start, run_end, members in runs:
                    t0 = clock() if timed else 0.0
                    try:
                        raw = pread(fd, run_end - run_start, run_start - base)
                    except OSError:
                        raw = b""
                    if timed:
                        timed = False
                        if len(runs) + len(plan) > 2 and looks_cold(clock() - t0, len(raw)):
                            _will_need(plan)  # the disk then reads the batch's runs at once
                    # (a run of one frame is that frame's bytes: no view, no copy)
                    alone = len(members) == 1
                    blob = raw if alone else memoryview(raw)
                    for j in members:
                        at, length = offs[j] - run_start, lens[j]
                        piece = blob if alone else blob[at : at + length]
                        if len(piece) == length and hash_of(piece) == records[j][2]:
                            out[j] = raw if alone else bytes(piece)
                            hits += 1
                            hit_bytes += length
                        else:
                            self._drop(ids[j], records[j])
                            dropped += 1
                self._touch(seg)
        finally:
            for _, fd, _ in plan:
                os.close(fd)
        with self._lock:
            c = self._counts
            c["hits"] += hits
            c["hit_bytes"] += hit_bytes
            c["misses"] += -hits if again else len(ids) - hits  # (again: misses counted already)
            c["dropped"] += dropped
        return out

    def missing(self, ids: Sequence[int]) -> list[int]:
        """The frames of ``ids`` neither held nor being fetched by another process (held ones
        are not read: a fill's question)."""
        frames = self._frames
        out = []
        for i in ids:
            mark, owner, _ = _RECORD.unpack_from(frames, i * _RECORD.size)
            if mark != _MARK and not (mark == _FILLING and _alive(owner)):
                out.append(i)
        return out

    def claim(self, ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Mark the frames of ``ids`` as fetched by this process now; returns (claimed, being
        fetched by another process or thread: ``wait_for`` those). Two processes claiming one
        frame at the same instant both fetch it: the same bytes, written twice."""
        frames, me = self._frames, os.getpid()
        mine, theirs = [], []
        for i in ids:
            at = i * _RECORD.size
            mark, owner, _ = _RECORD.unpack_from(frames, at)
            if mark == _FILLING and _alive(owner):
                theirs.append(i)
            else:  # (a record the caller found stale, or none)
                frames[at : at + _RECORD.size] = _RECORD.pack(_FILLING, me, 0)
                mine.append(i)
        return mine, theirs

    def release(self, ids: Sequence[int]) -> None:
        """Clear this process's claims of ``ids`` that were not filled (a failed fetch, an md5
        mismatch)."""
        frames, me = self._frames, os.getpid()
        for i in ids:
            at = i * _RECORD.size
            if _RECORD.unpack_from(frames, at) == (_FILLING, me, 0):
                frames[at : at + _RECORD.size] = bytes(_RECORD.size)

    def wait_for(self, ids: Sequence[int], poll: float = 0.002) -> None:
        """Wait until no frame of ``ids`` is being fetched by a live process any more (held, or
        given up), at most ``FILLING_FOR`` seconds."""
        frames = self._frames
        waiting = list(ids)
        deadline = time.monotonic() + FILLING_FOR
        while waiting and time.monotonic() < deadline:
            waiting = [
                i
                for i in waiting
                if (r := _RECORD.unpack_from(frames, i * _RECORD.size))[0] == _FILLING and _alive(r[1])
            ]
            if waiting:
                time.sleep(poll)

    def _drop(self, i: int, record: tuple[int, int, int]) -> None:
        """Clear a record that did not hold (unless another process set it anew meanwhile)."""
        at = i * _RECORD.size
        if _RECORD.unpack_from(self._frames, at) == record:
            self._frames[at : at + _RECORD.size] = bytes(_RECORD.size)

    # -- filling -------------------------------------------------------------------------------

    def put_many(self, ids: Sequence[int], offs: Sequence[int], datas: Sequence[bytes]) -> None:
        """Keep frames that arrived from the store, already checked against the index's md5:
        bytes first, then each record (a process killed between the two leaves nothing trusted)."""
        if self.broken or not ids:
            return
        by_segment: dict[int, list[int]] = {}
        for j, off in enumerate(offs):
            by_segment.setdefault(off // SEGMENT, []).append(j)
        written = 0
        try:
            for seg, js in by_segment.items():
                fd = os.open(self._segment_path(seg), _O_WRITE, 0o644)
                try:
                    base = seg * SEGMENT
                    for start, parts in _writes(js, ids if self.in_order else None, offs, datas):
                        n = os.pwritev(fd, parts, start - base)
                        if n != sum(map(len, parts)):
                            raise OSError(28, "No space left on device")
                        written += n
                finally:
                    os.close(fd)
                fault_point("cache-fill")  # (tests: killed with the bytes written, no record yet)
                for j in js:  # the hash first, the mark last: a mark read is a whole record
                    at = ids[j] * _RECORD.size
                    self._frames[at + 4 : at + _RECORD.size] = _RECORD.pack(0, 0, self._hash(datas[j]))[4:]
                    self._frames[at : at + 4] = _MARK_BYTES
                self._touch(seg)
        except OSError as e:
            self.broken = True
            warn_unusable(self.node.root, e)
            return
        with self._lock:
            self._counts["filled_bytes"] += sum(map(len, datas))  # (the frames: ``written`` has the gaps too)
        self.node.wrote(written)

    def _segment_path(self, seg: int) -> str:
        return os.path.join(self.dir, "seg", f"{seg:06d}")

    def _touch(self, seg: int) -> None:
        now = int(time.time())
        if self._touched.get(seg) == now:
            return
        self._touched[seg] = now
        _USED.pack_into(self._used, seg * _USED.size, now)

    def held(self) -> int:
        """How many frames have a record (not all may still be on disk)."""
        data = self._frames
        return sum(1 for k in range(0, len(data), _RECORD.size) if _RECORD.unpack_from(data, k)[0] == _MARK)

    def close(self) -> None:
        """Append this process's counts to the pack's ``stats`` (one line, ``O_APPEND``)."""
        with self._lock:
            counts, self._counts = self._counts, dict.fromkeys(self._counts, 0)
        if any(counts.values()) and os.getpid() == self._pid:
            line = (json.dumps(counts, separators=(",", ":")) + "\n").encode()
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(self.dir, "stats"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _xxh3() -> Any:
    import xxhash

    return xxhash.xxh3_64_intdigest


def _will_need(plan: list[tuple[int, int, list[tuple[int, int, list[int]]]]]) -> None:
    """Tell the kernel about every run of a batch at once (WILLNEED): a cold batch's reads
    then overlap on the disk, as a cold ``read_many`` of a local pack does."""
    for seg, fd, runs in plan:
        base = seg * SEGMENT
        will_need(fd, [a - base for a, _, _ in runs], [b - a for a, b, _ in runs])


def _shared_map(path: str, size: int) -> mmap.mmap:
    """``path`` mapped shared, read-write, at least ``size`` bytes (grown, never shrunk: every
    process maps the same file), its blocks allocated: a store to a page of a sparse file on a
    full disk would kill the process (SIGBUS), where this fails here with ENOSPC."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        if os.fstat(fd).st_size < size or os.fstat(fd).st_blocks * 512 < size:
            os.posix_fallocate(fd, 0, size)  # (two processes growing it to the same size: harmless)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


#: frames of a segment at most this far apart are read with one ``pread`` (the bytes between
#: are read for nothing: a few KiB, against a system call per frame), when they are small: a
#: frame of ``_ALONE`` bytes or more is read by itself, straight into the bytes returned (a run
#: read of big frames costs a big buffer and a copy of each frame out of it: measured, reading
#: 256 JPEGs of ~34 KB as runs took twice the time of one ``pread`` each)
_RUN_GAP = 16 << 10
_RUN_MAX = 1 << 20
_ALONE = 8 << 10


def _runs(js: list[int], offs: Sequence[int], lens: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """The frames ``js`` (indexes into ``offs``/``lens``) as (start, end, members) runs: each
    big frame a run of its own, in the order asked; then the small ones in offset order,
    neighbours merged."""
    # (the big ones as asked: each a run of its own, not worth sorting)
    runs = [(offs[j], offs[j] + lens[j], [j]) for j in js if lens[j] >= _ALONE]
    members: list[int] = []
    start = end = 0
    for j in sorted((j for j in js if lens[j] < _ALONE), key=offs.__getitem__):
        off = offs[j]
        stop = off + lens[j]
        if members and off - end <= _RUN_GAP and stop - start <= _RUN_MAX:
            members.append(j)
            end = max(end, stop)
            continue
        if members:
            runs.append((start, end, members))
        members, start, end = [j], off, stop
    if members:
        runs.append((start, end, members))
    return runs


#: frames put in the cache that are neighbours in the pack (frame i + 1 at most this far after
#: frame i: its record header between them) are written with one ``pwritev``, zeros in the gaps,
#: up to ``_WRITE_MAX`` bytes: the kernel then keeps the segment in large pages of its page
#: cache, and reading a frame back costs a fifth less than from a file written frame by frame
#: (4.6 -> 3.7 us a 34 KB JPEG, kernel 6.18, ext4). The zeros read as a hole does, in bytes no
#: frame has (no frame lies between i and i + 1 when the pack's offsets grow with the frame id,
#: ``PackCache.in_order``), so writers of neighbours never disagree about a byte.
_WRITE_GAP = 4 << 10
_WRITE_MAX = 8 << 20
_WRITE_PARTS = 512  # (each gap a part too: within IOV_MAX, 1024 on Linux)


def _writes(
    js: list[int], ids: Sequence[int] | None, offs: Sequence[int], datas: Sequence[bytes]
) -> Iterator[tuple[int, list[bytes]]]:
    """The frames ``js`` (indexes into ``ids``/``offs``/``datas``) as (offset, parts) writes, in
    offset order: a frame right after the one before in the pack (``ids``: their frame ids, None:
    each written alone) merged into its write, the gap between them a part of zeros."""
    parts: list[bytes] = []
    start = end = last = 0
    for j in sorted(js, key=offs.__getitem__):
        off, data = offs[j], datas[j]
        gap = off - end
        if (
            parts
            and ids is not None
            and ids[j] == last + 1
            and 0 <= gap <= _WRITE_GAP
            and off + len(data) - start <= _WRITE_MAX
            and len(parts) < _WRITE_PARTS
        ):
            if gap:
                parts.append(bytes(gap))
            parts.append(data)
            end, last = off + len(data), ids[j]
            continue
        if parts:
            yield start, parts
        parts, start, end, last = [data], off, off + len(data), ids[j] if ids is not None else 0
    if parts:
        yield start, parts


def _alive(pid: int) -> bool:
    """Whether the process that claimed a frame still runs (on this node: a pid of another
    container reads as gone, and its frames are fetched twice, harmlessly)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return pid > 0
