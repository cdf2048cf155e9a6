"""Verifying several packs and datasets in one run (``hframe verify A B 'C-*.hframe'``), the
work they plan, and merging the reports of a job array's tasks."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import (
    HframeError,
    InputError,
)
from ..format.index import index_location, read_index_meta
from ..format.layout import (
    HEADER_SIZE,
    TRAILER_SIZE,
    Trailer,
)
from ..locations import expand_globs, is_remote, shown_url
from ..parts import balanced_part
from ..read.dataset import Manifest, is_dataset, manifest_location
from ..read.snapshot import read_pack_info
from ..storage.access import open_storage
from .check import frames_to_check, verify_pack
from .report import PackReport, Problem, VerifyReport

__all__ = ["NO_MATCH", "merge_reports", "planned_work", "verify_packs"]

NO_MATCH = "no file matches this pattern"


def _expand(paths: Sequence[str]) -> Iterator[tuple[str, str | None, Any]]:
    """Packs to check, each with None or why it cannot be, and for a dataset's shard the
    manifest's entry for it: globs expanded (a pattern that matches nothing is one entry,
    ``NO_MATCH``); a sharded dataset stands for its shards."""

    for p in expand_globs(paths):
        manifest = manifest_location(p)
        if is_dataset(p):
            m = Manifest.load(manifest)
            yield from ((shard, None, entry) for shard, entry in zip(m.shard_paths(manifest), m.shards))
        elif not is_remote(p) and not os.path.lexists(p) and any(c in p for c in "*?["):
            yield p, NO_MATCH, None
        else:
            yield p, None, None


def _check_shard(report: PackReport, shard: str, entry: Any) -> None:
    """A dataset's shard must be the pack its manifest names (UUID, frames, size): another one
    (a shard swapped or rebuilt alone) makes the dataset's readers fail."""
    try:
        with open_storage(shard) as storage:
            info = read_pack_info(storage)
    except HframeError:
        return  # verify_pack reported why it cannot be read
    if (info.uuid, info.trailer.frame_count, info.size) != (entry.uuid, entry.frame_count, entry.pack_bytes):
        report.problems.insert(
            0,
            Problem(
                "manifest",
                f"{shown_url(shard)}: not the shard the dataset manifest names (it is {info.uuid}, "
                f"{info.trailer.frame_count} frames, {info.size} bytes; the manifest says {entry.uuid}, "
                f"{entry.frame_count} frames, {entry.pack_bytes} bytes); rebuild the manifest with "
                "'hframe index OUT --merge' or repack the dataset",
                expected=entry.uuid,
                found=info.uuid,
            ),
        )


def planned_work(
    path: str,
    *,
    use_index: bool = True,
    sample: tuple[str, float] | None = None,
    seed: int = 0,
    frames: tuple[int, int | None] | None = None,
    **_: Any,
) -> tuple[int, int]:
    """The frames and bytes ``verify_pack`` will check in ``path``, from the index footer (or the
    pack trailer) alone; a sample's bytes are estimated from the mean frame. (0, 0) when the
    pack or index cannot tell: ``verify_pack`` then says why."""
    try:
        if use_index:
            if is_remote(path):  # a request or two; only asked where a bar is shown
                with open_storage(index_location(path)) as index:
                    meta = read_index_meta(index_location(path), stream=index.stream())
            else:
                meta = read_index_meta(index_location(path))
            ranges, _label = frames_to_check(meta.frame_count, meta.payload_bytes, sample, seed, frames)
            n = sum(b - a for a, b in ranges)
            return n, meta.payload_bytes * n // max(1, meta.frame_count)
        if is_remote(path):
            return 0, 0
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TRAILER_SIZE))
            try:
                t = Trailer.parse(f.read(TRAILER_SIZE), path)
            except HframeError:  # no trailer (a truncated pack): its bytes at least bound the walk
                return 0, max(0, size - HEADER_SIZE)
        return t.frame_count, max(0, t.data_end - HEADER_SIZE)
    except (HframeError, OSError, ValueError):
        return 0, 0


class _Tally:
    """The progress of several packs as one (frames, bytes) count for a bar: within a pack at most
    what was planned for it (where a plan is known: 0 means unknown, not capped), and once it is
    done exactly that, so the bar ends at its total whatever a pack turned out to hold."""

    def __init__(self, update: Callable[[int, int], None]) -> None:
        self.update = update
        self.base = [0, 0]
        self.cur = [0, 0]
        self.plan = (0, 0)

    def start(self, plan: tuple[int, int]) -> None:
        self.plan, self.cur = plan, [0, 0]

    def add(self, frames: int, nbytes: int) -> None:
        self.cur[0] += frames
        self.cur[1] += nbytes
        frames, nbytes = (c if p == 0 else min(c, p) for c, p in zip(self.cur, self.plan))
        self.update(self.base[0] + frames, self.base[1] + nbytes)

    def done(self) -> None:
        self.base = [b + (c if p == 0 else p) for b, c, p in zip(self.base, self.cur, self.plan)]
        self.update(*self.base)


def verify_packs(
    paths: Sequence[str | os.PathLike[str]],
    *,
    on_pack: Callable[[PackReport], None] | None = None,
    max_errors: int | None = None,
    progress: Callable[[int, int], contextlib.AbstractContextManager[Callable[[int, int], None] | None]] | None = None,
    part: tuple[int, int] | None = None,
    **options: Any,
) -> VerifyReport:
    """Verify several packs (glob patterns expanded); ``max_errors`` counts across all of them.

    ``progress``, if given, is called once with the frames and bytes to check in all
    (``planned_work``) and returns a context manager yielding a callback for the running totals
    ``(frames, bytes)`` (or None), as ``pack``'s ``progress`` does.

    ``part`` = (I, N): only part I of N of the packs (after globs and datasets are expanded, in
    order): contiguous, balanced by bytes, the same split in every part (``--shard-of``);
    ``VerifyReport.merged`` joins the parts' reports."""
    reports: list[PackReport] = []
    left = max_errors
    targets = list(_expand([os.fspath(x) for x in paths]))
    everything = len(targets)
    if part is not None:
        lo, hi = balanced_part([_weight(p, entry) for p, _, entry in targets], *part)
        targets = targets[lo:hi]
    plans = [planned_work(p, **options) if why is None else (0, 0) for p, why, _ in targets] if progress else []
    total = (sum(f for f, _ in plans), sum(b for _, b in plans))
    with progress(*total) if progress is not None else contextlib.nullcontext(None) as update:
        tally = _Tally(update) if update is not None else None
        for k, (p, why, entry) in enumerate(targets):
            if tally is not None:
                tally.start(plans[k])
                options["on_progress"] = tally.add
            if why is not None:
                rep = PackReport(p, None, "index", "full", error=why)
            else:
                rep = verify_pack(p, max_errors=left, **options)
                if entry is not None and rep.error is None:
                    _check_shard(rep, p, entry)
            if tally is not None:
                tally.done()
            reports.append(rep)
            if on_pack is not None:
                on_pack(rep)
            if left is not None:
                left -= len(rep.problems)
                if left <= 0:
                    break
    return VerifyReport(reports, part=(part[0], part[1], everything) if part is not None else None)


def merge_reports(files: Sequence[str]) -> VerifyReport:
    """One verdict from the ``verify --json`` reports in ``files`` (``-`` for stdin)."""
    docs = []
    for f in files:
        try:
            text = sys.stdin.read() if f == "-" else open(f, encoding="utf-8").read()
            docs.append((f, json.loads(text)))
        except OSError as e:
            raise InputError(f"{f}: cannot read: {e.strerror or e}") from None
        except ValueError as e:
            raise InputError(f"{f}: not a JSON report ({e})") from None
        if not isinstance(docs[-1][1], dict):
            raise InputError(f"{f}: not a verify --json report")
    return VerifyReport.merged(docs)


def _weight(path: str, entry: Any) -> int:
    """What a pack weighs in a split: its size (from the manifest, or the file), else 1."""
    if entry is not None:
        return max(1, int(entry.pack_bytes))
    try:
        return max(1, os.path.getsize(path)) if not is_remote(path) else 1
    except OSError:
        return 1
