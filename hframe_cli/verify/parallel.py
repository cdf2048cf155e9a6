"""A large pack walked as one contiguous part per core: each part in a forked child reading the
pack through a shared read-only map, their problems back in frame order (``walk_in_parallel``)."""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import pickle
import select
import signal
import struct

import pyarrow as pa

from ..format.index import int64_column
from ..format.layout import (
    HEADER_SIZE,
)
from ..processes import reap, release_signals, signals_held, write_all
from .columns import IndexCols
from .report import PackReport
from .walk import ProgressFn, TooManyProblems, Verifier

__all__ = ["PART_MIN_BYTES", "walk_in_parallel"]


# A full verify walks a pack in parallel parts of at least this much data each (so packs of
# twice this or more): forking a walker costs about 3 ms, hashing 8 MiB about 15 ms (measured:
# 2 parts of a 34 MB pack 45 ms against 72 ms in one; an 8 MB pack breaks even)
PART_MIN_BYTES = 8 << 20


class _SharedProgress:
    """Progress of forked walkers, seen by the parent: each child keeps its running (frames,
    bytes) in its slot of a shared anonymous mapping; whenever the parent reports its own
    progress it adds what the children did since it last looked. ``settle`` reports the rest of
    a child's part once its result is in (or, for a child that failed, forgets it: the parent
    walks that part itself), so the totals come out exact."""

    def __init__(self, children: int, report: ProgressFn | None) -> None:
        self.report = report
        self.map = mmap.mmap(-1, 16 * max(1, children)) if report is not None else None
        self.seen = [[0, 0] for _ in range(children)]
        self.settled = [False] * children

    def child_progress(self, slot: int) -> ProgressFn:
        done = [0, 0]

        def tell(frames: int, nbytes: int) -> None:
            done[0] += frames
            done[1] += nbytes
            if self.map is not None:
                struct.pack_into("<qq", self.map, 16 * slot, done[0], done[1])

        return tell

    def parent_progress(self, frames: int, nbytes: int) -> None:
        if self.report is None or self.map is None:
            return
        for slot, seen in enumerate(self.seen):
            if not self.settled[slot]:
                f, b = struct.unpack_from("<qq", self.map, 16 * slot)
                frames, nbytes = frames + f - seen[0], nbytes + b - seen[1]
                seen[0], seen[1] = f, b
        self.report(frames, nbytes)

    def settle(self, slot: int, frames: int, nbytes: int) -> None:
        """Child ``slot`` checked ``frames`` and ``nbytes`` in all (0, 0: its part is walked again)."""
        self.settled[slot] = True
        if self.report is not None:
            seen = self.seen[slot]
            self.report(frames - seen[0], nbytes - seen[1])
            seen[0], seen[1] = frames, nbytes

    def close(self) -> None:
        if self.map is not None:
            self.map.close()


def walk_in_parallel(v: Verifier, table: pa.Table, n: int, end: int, data_end_known: bool) -> int:
    """Walk the pack as ``v.processes`` contiguous parts at once, each in a forked child that
    reads the pack through a map (``Verifier.mapped_reads``) while this process waits and
    reports their progress; problems come back in frame order. Returns where the last part
    ended. Falls back to one walk if the index's record offsets are not in order. A child that
    fails (or dies: a pack cut short under its map is a SIGBUS) has its part walked again here,
    with reads that see the file as it is.

    A part's result is used only if the part before it ended exactly where it began (same
    position, next frame id). Where damage breaks that seam, the rest of the pack is walked
    here in one go, from where the walk really is: the report is then what one walk gives.

    Each process converts only its own part's index rows up front (others on demand, see
    ``IndexCols.ensure``), so that work is shared out too."""
    rofs = int64_column(table, "record_offset")
    if any(b < a for a, b in zip(rofs, rofs[1:])):
        return v.walk(HEADER_SIZE, 0, n, end, data_end_known, IndexCols.from_table(table))

    def rows(a: int, b: int) -> IndexCols:
        return IndexCols.from_table(table, [(min(a, n), min(n, b + 1))])

    parts_n = min(v.processes, n, max(1, (end - HEADER_SIZE) // PART_MIN_BYTES))
    cuts = [0]
    for k in range(1, parts_n):
        target = HEADER_SIZE + (end - HEADER_SIZE) * k // parts_n
        cuts.append(max(cuts[-1] + 1, min(n - (parts_n - k), bisect.bisect_left(rofs, target))))
    cuts.append(n)
    parts = [(cuts[k], cuts[k + 1]) for k in range(parts_n) if cuts[k] < cuts[k + 1]]
    children: list[tuple[int, int]] = []
    shared = _SharedProgress(len(parts), v.on_progress)
    outer = v.on_progress
    v.on_progress = shared.parent_progress if outer is not None else None

    def first_of(a: int) -> int:
        """Where part ``a..`` starts: the first part where records begin, the others at their
        first record."""
        return HEADER_SIZE if a == 0 else rofs[a]

    def walk_part(slot: int, a: int, b: int, w: int) -> None:
        """In a forked child: walk part [a, b) through a map of the pack and send back what it
        found."""
        child = Verifier(
            PackReport(v.r.pack, v.r.index, v.r.mode, v.r.selection),
            v.storage,
            v.max_errors,
            v.decode,
            shared.child_progress(slot) if outer is not None else None,
        )
        child.decompressor = v.decompressor
        child.mapped_reads = True  # (a SIGBUS here, the pack cut short under the map, ends only this child)
        pos, nxt = -1, -1
        try:
            pos = child.walk(
                first_of(a), a, b, end, data_end_known, rows(a, b), read_end=rofs[b] if b < n else end, report_to=n
            )
            nxt = child.next_id
        except TooManyProblems:
            pass
        r = child.r
        write_all(w, pickle.dumps((r.problems, r.frames_checked, r.bytes_checked, pos, nxt, r.stopped_early)))

    def result_of(r: int) -> bytes:
        """All a child sent, reporting the children's progress while waiting for it."""
        chunks: list[bytes] = []
        while True:
            if outer is not None:
                while not select.select([r], [], [], 0.1)[0]:
                    shared.parent_progress(0, 0)
            data = os.read(r, 1 << 20)
            if not data:
                return b"".join(chunks)
            chunks.append(data)

    try:
        # every part in a child (this process waits): only a child reads through a map
        for slot, (a, b) in enumerate(parts):
            r, w = os.pipe()
            with signals_held():  # a signal is taken once the child is in its try, and listed below
                pid = os.fork()
                if pid == 0:  # the child: walk its part, send back what it found, exit without cleanup
                    os.close(r)
                    code = 0
                    try:
                        release_signals()  # now a signal ends this child through the except below
                        walk_part(slot, a, b, w)
                    except BaseException:  # noqa: BLE001 - report by exit status; the parent re-walks the part
                        code = 1
                    finally:
                        os._exit(code)
                os.close(w)
                children.append((pid, r))
        pos, nxt = HEADER_SIZE, 0
        for slot, ((pid, r), (a, b)) in enumerate(zip(list(children), parts)):
            if nxt < a:  # the walk stopped inside the part before (data ends, no record found):
                return pos  # one walk stops there too, having reported every frame after it
            if (pos, nxt) != (first_of(a), a):  # the seam does not join: the rest in one walk, here
                return v.walk(pos, nxt, n, end, data_end_known, rows(nxt, n))
            message = result_of(r)
            os.close(r)
            status = reap(pid)  # (0 when SIGCHLD is ignored: then the message tells)
            children = [c for c in children if c[0] != pid]
            try:
                found = pickle.loads(message) if status == 0 and message else None
            except Exception:  # noqa: BLE001 - a message cut short: the child failed
                found = None
            if found is None:  # the child failed (or died of a pack cut short): its part walked here, with preads
                shared.settle(slot, 0, 0)
                pos = v.walk(first_of(a), a, b, end, data_end_known, rows(a, b), report_to=n)
                nxt = v.next_id
                continue
            problems, frames, nbytes, pos, nxt, stopped = found
            v.r.frames_checked += frames
            v.r.bytes_checked += nbytes
            shared.settle(slot, frames, nbytes)
            for p in problems:
                v.keep(p)
            if stopped:
                v.r.stopped_early = True
                raise TooManyProblems
        v.next_id = nxt
        return pos
    finally:
        v.on_progress = outer
        shared.close()
        for pid, r in children:  # stopped early: do not wait for the rest
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.close(r)
            reap(pid)
