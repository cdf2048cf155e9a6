"""Warming a node's cache before training (``hframe prefetch``), and looking at the cache
(``hframe cache``): the work of both commands, over ``cache.py``.

``prefetch`` reads the chosen frames of a remote pack or dataset through a reader with the
cache: every frame the cache does not hold is fetched (coalesced ranges, many at once, as
``read_many`` reads a batch, with up to ``IN_FLIGHT`` requests in flight: a sample is scattered
frames, a request each), checked against the index's md5, and kept. What the cache holds
already costs a lookup. As MosaicML Streaming's ``predownload``, but by frame, not by shard: a
10 % sample fetches 10 % of the bytes.

Imports inside functions: ``open_pack`` (it imports pyarrow, which ``hframe cache`` never needs).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

from ..errors import InputError
from ..locations import is_remote, shown_url
from .cache import LAYOUT, NodeCache, cache_settings

__all__ = ["cache_report", "prefetch", "select_frames"]

#: frames asked for at once
BATCH = 1024
#: requests in flight while warming (as the sampler's read-ahead: ``read_ahead_in_flight``): a
#: sample's frames are scattered, one request each, and each waits a round trip
IN_FLIGHT = 64


def select_frames(count: int, frames: str | None, sample: int | None, seed: int, part: str | None) -> list[int]:
    """The frame ids to prefetch: ``A:B`` (Python slice bounds), a seeded sample of ``N``, and/or
    the ``K/N``-th contiguous part, in id order.

    Raises:
        InputError: a selection that is not one of those.
    """
    ids = range(count)
    if frames is not None:
        lo, colon, hi = frames.partition(":")
        try:
            if colon:
                ids = ids[slice(int(lo) if lo else None, int(hi) if hi else None)]
            else:
                ids = ids[int(lo) : int(lo) + 1]
        except ValueError:
            raise InputError(f"--frames {frames!r}: give A:B (frame ids, B excluded) or one id") from None
    if part is not None:
        try:
            k, n = (int(x) for x in part.split("/"))
            if not 0 <= k < n:
                raise ValueError
        except ValueError:
            raise InputError(f"--part {part!r}: give K/N with 0 <= K < N") from None
        ids = ids[len(ids) * k // n : len(ids) * (k + 1) // n]
    chosen = list(ids)
    if sample is not None:
        if sample < 0:
            raise InputError("--sample must be at least 0")
        chosen = sorted(random.Random(seed).sample(chosen, min(sample, len(chosen))))
    return chosen


def prefetch(
    location: str,
    *,
    cache_dir: str | None = None,
    cache_limit: int | str | None = None,
    frames: str | None = None,
    sample: int | None = None,
    seed: int = 0,
    part: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Fetch the chosen frames of a remote pack or dataset into the node's cache.

    Returns:
        what was done: frames chosen, fetched and already held, bytes fetched, seconds, the cache.

    Raises:
        InputError: no cache folder, a local pack, or a bad selection.
    """
    from .dataset import open_pack

    settings = cache_settings(cache_dir, cache_limit)
    if settings is None:
        raise InputError("prefetch needs a cache: --cache-dir DIR or HFRAME_CACHE_DIR")
    if not is_remote(location):
        raise InputError(f"{location}: a local pack is read where it is; prefetch is for remote packs")
    t0 = time.monotonic()
    with open_pack(location, cache_dir=settings[0], cache_limit=settings[1]) as reader:
        reader.widen(IN_FLIGHT)  # (never fewer than HFRAME_IO_IN_FLIGHT)
        ids = select_frames(len(reader), frames, sample, seed, part)
        sizes = reader.frame_sizes(ids) if ids else []
        done = nbytes = fetched = 0
        for k in range(0, len(ids), BATCH):
            batch = ids[k : k + BATCH]
            fetched += reader.fill_cache(batch)
            done += len(batch)
            nbytes += sum(sizes[k : k + BATCH])
            if progress is not None:
                progress(done, nbytes)
        counts = _counts(reader)
        requests = _requests(reader)
    return {
        "pack": shown_url(location),
        "cache": os.path.join(settings[0], LAYOUT),
        "frames": len(ids),
        "bytes": sum(sizes),
        "fetched": fetched,
        "held_already": len(ids) - fetched,
        "fetched_bytes": counts["filled_bytes"],
        "requests": requests,
        "seconds": round(time.monotonic() - t0, 3),
    }


def _readers(reader: Any) -> list[Any]:
    """A pack's reader, or a dataset's open shard readers."""
    if hasattr(reader, "shard_paths"):  # (shards never opened were not read)
        return [r for r in reader._readers if r is not None]
    return [reader]


def _counts(reader: Any) -> dict[str, int]:
    total = {"filled_bytes": 0}
    for r in _readers(reader):
        cache = getattr(r, "_cache", None)
        if cache is not None:
            for k in total:
                total[k] += cache.counts[k]
    return total


def _requests(reader: Any) -> int:
    return sum(c.requests for r in _readers(reader) if (c := r.storage_counters()) is not None)


def cache_report(cache_dir: str | None, prune: bool = False, clear: bool = False) -> dict[str, Any]:
    """What the node's cache holds, per pack generation (and after ``prune`` to its limit, or
    ``clear``): URL, UUID, frames held, bytes on disk, last use, hits and misses; and the kept
    copies of remote opens (files, bytes).

    Raises:
        InputError: no cache folder given.
    """
    settings = cache_settings(cache_dir, None)
    if settings is None:
        raise InputError("no cache: give --cache-dir DIR or set HFRAME_CACHE_DIR")
    node = NodeCache(*settings)
    freed = 0
    held_before = node.old_layouts()
    old = [{"folder": f, "bytes": nbytes} for f, nbytes in held_before]
    if clear:
        before = node.usage() + sum(nbytes for _, nbytes in held_before)
        node.clear()
        freed, old = before, []
    elif prune:
        freed = node.evict(down_to=node.effective_limit())
    packs = []
    by_pack: dict[str, list[tuple[float, int]]] = {}
    for used, path, nbytes in node.segments():
        by_pack.setdefault(os.path.dirname(os.path.dirname(path)), []).append((used, nbytes))
    for folder in node.packs():
        info = _info(folder)
        segs = by_pack.get(folder, [])
        packs.append(
            {
                "url": info.get("url"),
                "uuid": info.get("uuid"),
                "frames": info.get("frames"),
                "bytes": sum(b for _, b in segs),
                "last_used": max((u for u, _ in segs), default=None),
                **node.stats(folder),
            }
        )
    packs.sort(key=lambda p: p["last_used"] or 0, reverse=True)
    kept = [nbytes for _, _, nbytes in node.kept_files()]
    held = sum(b for segs in by_pack.values() for _, b in segs) + sum(kept)  # (the segments listed once)
    return {
        "cache": node.root,
        "limit": node.effective_limit(),
        "bytes": held,
        "freed": freed,
        "packs": packs,
        # what remote opens fetched first (headers, indexes), kept by URL and ETag
        "kept": {"files": len(kept), "bytes": sum(kept)},
        "old_layouts": old,  # (an older hframe's cache beside it: never read; --clear removes it)
    }


def _info(folder: str) -> dict[str, Any]:
    try:
        with open(os.path.join(folder, "pack.json")) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}
