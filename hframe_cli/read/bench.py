"""Cold and warm random-read timing through the library reader, optionally beside loose files.

Honesty rules (BRIEF): the sampler is seeded once; cold runs evict the page cache before every
batch and say how (``drop_caches`` as root, else ``posix_fadvise(DONTNEED)`` on every file
read, else they say the numbers are not cold); warm runs read each batch once untimed before
timing it. Reads go through ``PackReader.read_many``, the same code training jobs use.

Imports inside functions: Pillow, only for the decode benchmark.
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import EXIT_DATA, EXIT_OK, InputError
from ..format.index import current_format_version
from ..locations import is_remote, shown_url
from ..storage.access import evict_from_page_cache
from .dataset import DatasetReader, open_pack
from .reader import PackReader, ReadStats, default_workers

__all__ = ["CACHE_METHODS", "SAMPLERS", "BenchResult", "ReadSide", "evict", "percentile", "run_bench", "sample_batches"]

SAMPLERS = ("random", "block-local", "sequential")
CACHE_METHODS = ("auto", "drop_caches", "fadvise", "none")


def sample_batches(
    n: int, frames: int, batches: int, sampler: str, seed: int, block_size: int | None = None
) -> list[list[int]]:
    """Frame ids for each batch, from one generator seeded once.

    - ``random``: each batch draws ``frames`` distinct ids uniformly;
    - ``block-local``: blocks of ``block_size`` neighbouring frames (default: one batch) in random
      order, shuffled inside each block; batches take consecutive ids from that order (a new
      order when used up);
    - ``sequential``: frames in order, wrapping around.
    """
    if sampler not in SAMPLERS:
        raise InputError(f"unknown sampler {sampler!r} (samplers: {', '.join(SAMPLERS)})")
    if frames < 1 or batches < 1:
        raise InputError(f"--frames and --batches must be at least 1 (got {frames} and {batches})")
    if n < frames:
        raise InputError(f"the pack has {n} frames, fewer than one batch of --frames {frames}")
    if block_size is None:
        block_size = frames  # a batch reads one block: its frames are neighbours, reads merge
    if block_size < 1:
        raise InputError(f"--block-size must be at least 1 (got {block_size})")
    rng = random.Random(seed)
    if sampler == "random":
        return [rng.sample(range(n), frames) for _ in range(batches)]
    if sampler == "sequential":
        return [[(b * frames + k) % n for k in range(frames)] for b in range(batches)]
    order: list[int] = []
    out: list[list[int]] = []
    for _ in range(batches):
        while len(order) < frames:
            blocks = list(range(0, n, block_size))
            rng.shuffle(blocks)
            for start in blocks:
                block = list(range(start, min(n, start + block_size)))
                rng.shuffle(block)
                order.extend(block)
        out.append(order[:frames])
        del order[:frames]
    return out


#: what a cold batch of a remote pack evicts: nothing; the client keeps no cache, every batch is
#: read over the network (what the store itself caches is out of reach)
REMOTE_COLD = "remote (no client cache)"


def evict(method: str, paths: Sequence[str]) -> str:
    """Drop ``paths`` from the page cache; returns the method that worked ("none" if none did)."""
    if method == "none":
        return "none"
    if method in ("auto", "drop_caches"):
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return "drop_caches"
        except OSError:
            if method == "drop_caches":
                raise InputError(
                    "--method drop_caches: not permitted here (needs root and a writable "
                    "/proc/sys/vm/drop_caches); try --method fadvise"
                ) from None
    if method in ("auto", "fadvise"):
        if all(evict_from_page_cache(p) for p in paths):
            return "fadvise"
        if method == "fadvise":
            raise InputError("--method fadvise: posix_fadvise is not available here")
    return "none"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile of ``values``, interpolated between neighbours (0 for none)."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class ReadSide:
    """Timings of one way of reading the sampled frames (the pack, or loose files)."""

    label: str
    frames: int = 0
    bytes_requested: int = 0
    bytes_read: int = 0
    read_calls: int = 0
    elapsed_s: float = 0.0
    frame_latencies_s: list[float] = field(default_factory=list)
    batch_latencies_s: list[float] = field(default_factory=list)
    decode_s: float | None = None
    md5_checked: int = 0
    md5_mismatches: int = 0

    def to_dict(self) -> dict[str, Any]:
        ms = 1000.0
        fl, bl = self.frame_latencies_s, self.batch_latencies_s
        return {
            "frames": self.frames,
            "bytes_requested": self.bytes_requested,
            "bytes_read": self.bytes_read,
            "read_calls": self.read_calls,
            "elapsed_s": round(self.elapsed_s, 6),
            "frames_per_s": round(self.frames / self.elapsed_s, 1) if self.elapsed_s > 0 else 0.0,
            "mb_per_s": round(self.bytes_requested / self.elapsed_s / 1e6, 3) if self.elapsed_s > 0 else 0.0,
            "frame_latency_ms": {
                "p50": round(percentile(fl, 0.50) * ms, 4),
                "p95": round(percentile(fl, 0.95) * ms, 4),
                "p99": round(percentile(fl, 0.99) * ms, 4),
                "max": round(max(fl, default=0.0) * ms, 4),
            },
            "batch_latency_ms": {
                "p50": round(percentile(bl, 0.50) * ms, 4),
                "p99": round(percentile(bl, 0.99) * ms, 4),
            },
            "decode_s": None if self.decode_s is None else round(self.decode_s, 6),
            "decode_frames_per_s": (round(self.frames / self.decode_s, 1) if self.decode_s else None),
            "md5_checked": self.md5_checked,
            "md5_mismatches": self.md5_mismatches,
        }


@dataclass
class BenchResult:
    """Everything ``bench-cold`` / ``bench-warm`` report."""

    mode: str
    pack: str
    frames_per_batch: int
    batches: int
    seed: int
    sampler: str
    block_size: int
    workers: int
    coalesce_gap: int
    max_read: int
    memory_map: bool
    cache_method: str
    pack_side: ReadSide
    loose_side: ReadSide | None
    host: dict[str, Any]
    remote: dict[str, int] | None = None  # a remote pack's request counters (remote.Counters)

    @property
    def cold(self) -> bool:
        return self.mode == "cold" and self.cache_method != "none"

    @property
    def exit_code(self) -> int:
        """1 when a frame read did not match its md5 (``md5=True``), else 0."""
        return EXIT_DATA if self.pack_side.md5_mismatches else EXIT_OK

    @property
    def ratio(self) -> float | None:
        if self.loose_side is None or self.loose_side.elapsed_s <= 0 or self.pack_side.elapsed_s <= 0:
            return None
        return (self.pack_side.frames / self.pack_side.elapsed_s) / (self.loose_side.frames / self.loose_side.elapsed_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.pack_side.md5_mismatches == 0,
            "format_version": current_format_version(),
            "mode": self.mode,
            "cold": self.cold,
            "cache_method": self.cache_method,
            "pack": self.pack,
            "frames_per_batch": self.frames_per_batch,
            "batches": self.batches,
            "seed": self.seed,
            "sampler": self.sampler,
            "block_size": self.block_size if self.sampler == "block-local" else None,
            "workers": self.workers,
            "coalesce_gap": self.coalesce_gap,
            "max_read": self.max_read,
            "memory_map": self.memory_map,
            "hframe": self.pack_side.to_dict(),
            "loose": self.loose_side.to_dict() if self.loose_side else None,
            "ratio_vs_loose": None if self.ratio is None else round(self.ratio, 3),
            "host": self.host,
            "remote": self.remote,
        }


def host_facts(path: str, size: int | None = None) -> dict[str, Any]:
    """CPU count, the filesystem holding ``path`` (or its URL scheme), pack size against RAM."""
    real = os.path.realpath(path)
    fs, mount = "unknown", "/"
    if is_remote(path):
        # the host (and port): not a user name or password the URL may hold
        fs, mount = path.partition("://")[0], path.partition("://")[2].partition("/")[0].rpartition("@")[2]
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if (
                    len(parts) >= 3
                    and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/"))
                    and len(parts[1]) >= len(mount)
                ):
                    mount, fs = parts[1], parts[2]
    except OSError:
        pass
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    size = os.path.getsize(path) if size is None else size
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "filesystem": fs,
        "mount": mount,
        "pack_bytes": size,
        "mem_total_bytes": mem,
        "pack_vs_ram": round(size / mem, 4) if mem else None,
    }


def _decode_all(datas: Sequence[bytes]) -> None:
    from PIL import Image

    for data in datas:
        with Image.open(io.BytesIO(data)) as img:
            img.load()


def _check_options(pack: str | os.PathLike[str], mode: str, method: str, memory_map: bool, workers: int | None) -> None:
    """Refuse options that do not go together, before the pack is opened."""
    if mode not in ("cold", "warm"):
        raise InputError(f"mode must be cold or warm, not {mode!r}")
    if mode == "warm" and method != "auto":
        raise InputError("--method applies to bench-cold only")
    if mode == "cold" and memory_map:
        raise InputError("--memory-map applies to bench-warm only (mapped pages cannot be evicted)")
    if memory_map and is_remote(pack):
        raise InputError("--memory-map applies to local packs only")
    if method not in CACHE_METHODS:
        raise InputError(f"unknown --method {method!r} (methods: {', '.join(CACHE_METHODS)})")
    if workers is not None and workers < 1:
        raise InputError(f"--workers must be at least 1 (got {workers})")


def run_bench(
    pack: str | os.PathLike[str],
    *,
    mode: str,
    frames: int = 256,
    batches: int = 10,
    seed: int = 0,
    sampler: str = "random",
    block_size: int | None = None,
    workers: int | None = None,
    coalesce_gap: int | None = None,
    max_read: int | None = None,
    memory_map: bool = False,
    method: str = "auto",
    compare: str | os.PathLike[str] | None = None,
    decode: bool = False,
    md5: bool = False,
    on_batch: Callable[[int], None] | None = None,
) -> BenchResult:
    """Time ``batches`` batches of ``frames`` sampled frames, cold or warm.

    Args:
        mode: "cold" (evict before every batch) or "warm" (read each batch untimed first).
        method: cache eviction for cold runs: auto, drop_caches, fadvise, none.
        compare: a folder holding the original files: read the same frames from it too.
        decode: decode every frame with Pillow after reading (timed separately).
        md5: hash every frame read and compare with the index.
        memory_map: read through a memory map (``PackReader``); warm only: pages mapped by a
            process cannot be evicted, so a cold batch would not be cold.

    Raises:
        InputError: bad options, a pack smaller than one batch, names missing under ``compare``.

    With ``md5``, mismatches are counted in the result (``to_dict()["ok"]`` is then false).
    """
    _check_options(pack, mode, method, memory_map, workers)
    path = os.fspath(pack)
    with open_pack(path, coalesce_gap=coalesce_gap, max_read=max_read, memory_map=memory_map) as reader:
        ids_per_batch = sample_batches(len(reader), frames, batches, sampler, seed, block_size)
        w = workers or default_workers(frames)
        md5_col = reader.table.column("md5").to_pylist() if md5 else []
        loose_paths = _loose_paths(reader, ids_per_batch, compare) if compare is not None else {}
        pack_side = ReadSide("hframe")
        loose_side = ReadSide("loose") if compare is not None else None
        used, methods_seen = "none", set[str]()
        loose_pool = ThreadPoolExecutor(max_workers=w) if compare is not None and w > 1 else None
        try:
            for b, ids in enumerate(ids_per_batch):
                if mode == "cold":
                    used = REMOTE_COLD if is_remote(path) else evict(method, reader.files)
                    methods_seen.add(used)
                _time_pack_batch(pack_side, reader, ids, w, warm_first=mode == "warm", decode=decode, md5s=md5_col)
                if loose_side is not None:
                    paths = [loose_paths[i] for i in ids]
                    if mode == "cold":
                        methods_seen.add(evict(method, paths))
                    _time_loose_batch(loose_side, paths, loose_pool, warm_first=mode == "warm")
                if on_batch is not None:
                    on_batch(b + 1)
        finally:
            if loose_pool is not None:
                loose_pool.shutdown()
        return BenchResult(
            mode,
            shown_url(path),
            frames,
            batches,
            seed,
            sampler,
            block_size or frames,
            w,
            reader.coalesce_gap,
            reader.max_read,
            memory_map,
            ("none" if "none" in methods_seen else used) if mode == "cold" else "none (warm)",
            pack_side,
            loose_side,
            host_facts(reader.files[0], reader.pack_bytes),
            getattr(reader.storage_counters(), "to_dict", lambda: None)(),
        )


def _loose_paths(
    reader: PackReader | DatasetReader, ids_per_batch: list[list[int]], compare: str | os.PathLike[str]
) -> dict[int, str]:
    """The original file of every sampled frame under ``compare`` (bad input if any is missing)."""
    names_col = reader.table.column("name").to_pylist()
    raw_col = reader.table.column("name_raw").to_pylist()
    root = os.fsencode(os.fspath(compare))
    wanted = sorted({i for b in ids_per_batch for i in b})
    paths: dict[int, str] = {}
    missing = []
    for i in wanted:
        p = os.path.join(root, raw_col[i] if raw_col[i] is not None else names_col[i].encode())
        if not os.path.isfile(p):
            missing.append(os.fsdecode(p))
        paths[i] = os.fsdecode(p)
    if missing:
        raise InputError(
            f"--compare {os.fspath(compare)}: {len(missing)} of {len(wanted)} sampled frames "
            f"have no file there (first: {missing[0]}); point --compare at the folder that was packed"
        )
    return paths


def _time_pack_batch(
    side: ReadSide,
    reader: PackReader | DatasetReader,
    ids: list[int],
    workers: int,
    *,
    warm_first: bool,
    decode: bool,
    md5s: list[str],
) -> None:
    """Read one batch from the pack, timed (after an untimed read when warm); then decode and
    hash it if asked (timed apart, counted apart)."""
    if warm_first:
        reader.read_many(ids, workers=workers)
    stats = ReadStats()
    t0 = time.perf_counter()
    datas = reader.read_many(ids, workers=workers, stats=stats)
    _account(side, stats, time.perf_counter() - t0, len(ids))
    if decode:
        t1 = time.perf_counter()
        _decode_all(datas)
        side.decode_s = (side.decode_s or 0.0) + time.perf_counter() - t1
    for i, data in zip(ids, datas) if md5s else ():
        side.md5_checked += 1
        if hashlib.md5(data).hexdigest() != md5s[i]:
            side.md5_mismatches += 1


def _time_loose_batch(side: ReadSide, paths: list[str], pool: ThreadPoolExecutor | None, *, warm_first: bool) -> None:
    """Read the same frames as loose files, timed (after an untimed read when warm)."""
    if warm_first:
        _read_loose(paths, pool)
    t0 = time.perf_counter()
    lat = _read_loose(paths, pool)
    dt = time.perf_counter() - t0
    side.frames += len(paths)
    side.elapsed_s += dt
    side.batch_latencies_s.append(dt)
    side.frame_latencies_s.extend(x[0] for x in lat)
    side.read_calls += len(paths)
    nbytes = sum(x[1] for x in lat)
    side.bytes_read += nbytes
    side.bytes_requested += nbytes


def _account(side: ReadSide, stats: ReadStats, dt: float, n: int) -> None:
    side.frames += n
    side.elapsed_s += dt
    side.batch_latencies_s.append(dt)
    side.frame_latencies_s.extend(stats.frame_latencies_s)
    side.read_calls += stats.read_calls
    side.bytes_read += stats.bytes_read
    side.bytes_requested += stats.bytes_requested


def _read_one(path: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        n = len(f.read())
    return time.perf_counter() - t0, n


def _read_loose(paths: Sequence[str], pool: ThreadPoolExecutor | None) -> list[tuple[float, int]]:
    if pool is None:
        return [_read_one(p) for p in paths]
    return list(pool.map(_read_one, paths))
