"""Read-ahead from the sampler's order: while the DataLoader's workers read the batches handed
out, the frames the sampler will hand out next are fetched into the node cache, so that the
workers find them there (``BlockShuffleSampler(..., read_ahead=N)``).

The sampler knows the whole epoch's order; its process (the training loop's) runs one thread
that keeps up to ``ahead`` items past the last one handed out fetched, ``batch`` items per
``fill_cache`` call (coalesced ranges, the reader's requests in flight), ``in_flight`` calls at
once: bounded in bytes (about ``ahead`` frames) and in requests. Of the items already handed
out it fetches only the last ``behind`` (the sampler's ``read_ahead // 2``): a DataLoader hands
out ``prefetch_factor`` batches per worker before it reads them, and at the epoch's start those
are what its workers wait for (``scripts/bench_cache.py``, plain shuffle, six runs each: 3,380
frames/s median with none of them, 3,796 with half of ``ahead``); the earlier ones are being
read (a frame a worker is fetching already is waited for, not fetched twice: the cache's
claims). It stops at the end of the epoch, when the
iteration is dropped (``set_epoch``, a ``break``), on Ctrl-C, and at the first error (the
worker's own read of that frame says what is wrong: read-ahead only saves time). Every
process of the node shares the cache (``read/cache.py``), which is how the workers benefit:
the cache is required.

Spreading (``run``, ``BlockShuffleSampler(read_ahead_run=...)``): with the frame ids of the
epoch's items (``frames_of``), each fetch is given a mask of the frames the epoch reads later,
not yet asked for by a fetch nor handed out before it, and also takes those lying right after its own
frames in the pack, up to ``run`` bytes from each (``PackReader.fill_cache``): a shuffled
order's scattered frames become runs, the bytes the epoch fetches anyway in fewer requests.

Imports inside functions: none.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from ..signals import pending_signal

__all__ = ["READ_AHEAD_RUN", "ReadAhead"]

#: bytes one read-ahead request may cover (``BlockShuffleSampler(read_ahead_run=...)``): at
#: ~20 ms a round trip and a few hundred MB/s, a request for 256 KiB costs little more than one
#: for a single 30 KB frame. (scripts/bench_cache.py, plain shuffle, read-ahead against none:
#: 2.07-2.29x with 256 KiB, 1.76x with 1 MiB, 1.61x with 4 MiB; 1.41x without spreading)
READ_AHEAD_RUN = 256 << 10


class ReadAhead:
    """One epoch's read-ahead over ``items`` (dataset positions, in the order handed out)."""

    def __init__(
        self,
        fill: Callable[..., object],
        items: Sequence[int],
        *,
        ahead: int,
        batch: int = 256,
        in_flight: int = 4,
        frames_of: Callable[[Sequence[int]], list[int]] | None = None,
        run: int = 0,
        behind: int = 0,
    ) -> None:
        self.items = items
        #: spreading (``frames_of`` and ``run``): the frame ids of ``items`` (made in the thread)
        self.frames_of, self.run = frames_of if run > 0 else None, run
        self.ahead, self.batch, self.in_flight = ahead, max(1, batch), max(1, in_flight)
        self.behind = max(0, behind)  # handed-out items still fetched: the last ``behind`` of them
        self.fill = fill
        self.fetched = 0  # items asked for (for tests and reports)
        self.error: BaseException | None = None
        self._handed = 0
        self._stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hframe-read-ahead", daemon=True)
        self._thread.start()

    def handed_out(self, count: int) -> None:
        """The sampler has handed out ``count`` items of the epoch."""
        with self._cond:
            self._handed = count
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop fetching (what is in flight finishes) and wait for the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _next(self, pos: int) -> int | None:
        """Where the next fetch starts, once it may (None: stop)."""
        with self._cond:
            while True:
                if self._stopped or pending_signal() is not None:
                    return None
                # (handed out: the workers'; the last ``behind`` of them are queued, not yet read)
                pos = max(pos, self._handed - self.behind)
                if pos >= len(self.items):
                    return None
                if pos < self._handed + self.ahead:
                    return pos
                self._cond.wait(0.5)

    def _run(self) -> None:
        pending: deque[Future[object]] = deque()
        try:
            # spreading: a mask over frame ids of the items not yet handed out nor asked for,
            # the frames a fetch may take after the ones it asks for (``PackReader.fill_cache``)
            frames: list[int] = []
            later: bytearray | None = None
            if self.frames_of is not None:
                frames = self.frames_of(self.items)
                later = bytearray(max(frames, default=-1) + 1)
                for f in frames:
                    later[f] = 1
            with ThreadPoolExecutor(self.in_flight, thread_name_prefix="hframe-read-ahead") as pool:
                pos = 0
                while True:
                    start = self._next(pos)
                    if start is None:
                        break
                    end = min(len(self.items), start + self.batch, self._limit())
                    chunk = list(self.items[start:end])
                    if later is not None:
                        for f in frames[pos:end]:  # (handed out, or asked for by this fetch)
                            later[f] = 0
                        job = pool.submit(self.fill, chunk, later=later, run=self.run)
                    else:
                        job = pool.submit(self.fill, chunk)
                    pos = end
                    pending.append(job)
                    self.fetched += len(chunk)
                    while len(pending) >= self.in_flight or (pending and pending[0].done()):
                        pending.popleft().result()
                while pending:
                    pending.popleft().result()
        except BaseException as e:  # (a failed fetch ends read-ahead; the worker's read reports it)
            self.error = e
            with self._cond:
                self._stopped = True

    def _limit(self) -> int:
        with self._cond:
            return self._handed + self.ahead
