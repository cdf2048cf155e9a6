"""One writer per output, and a clean stop at any moment: how every writing command starts.

``writer_run(output)`` installs the SIGINT/SIGTERM handlers, then takes the output lock, and
only then lets the caller list sources, plan an update or write anything (``man/hframe.1``,
CONCURRENCY AND SIGNALS). A second run on the same output therefore fails (exit 3) or waits
(``wait``) before it has done any work, and never acts on a plan made before the lock.

Signals: outside a ``StopSignals.deferred()`` section a signal raises ``Interrupted`` where the
program is, and ``with`` blocks unwind (the lock is released, partial files closed). Inside one
it is acted on when the section ends: the packing loop polls ``signum`` and stops after the
current frame with a checkpoint; writing the run's intent (source list + first checkpoint) and
publishing (two renames) finish first, so they are never left half done.

Imports inside functions: ``writer``, only to finish a dead run's publish (it needs pyarrow; a
locked run must not wait for it).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import HframeError, Interrupted
from ..faults import fault_point
from ..names import checkpoint_paths, index_name, partial_name
from ..signals import pending_signal, set_stopping
from .lock import LockWaitStopped, OutputLock

__all__ = ["StopSignals", "stop_signals", "writer_run"]

EventFn = Callable[[str], None]


class _SignalStop(Interrupted):
    """Raised by the handler itself; ``writer_run`` words it for the output it guards."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """SIGINT/SIGTERM as ``Interrupted``: at once, or at the end of a ``deferred()`` section."""

    def __init__(self, active: bool = True) -> None:
        self.active = active
        self.signum: int | None = None
        self._depth = 0

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: object) -> None:
        first = self.signum is None
        self.signum = signum
        set_stopping(signum)  # loading threads waiting on a store see it (signals.pending_signal)
        if self._depth == 0 and first:  # a second signal while unwinding from the first is ignored
            raise _SignalStop(signum)

    @contextmanager
    def deferred(self, *, act_after: bool = True) -> Iterator[None]:
        """A section a signal does not cut short. With ``act_after``, a signal that arrived
        meanwhile raises ``Interrupted`` when the section ends (normally); otherwise it is left to
        the caller (``signum`` says it came)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if act_after and self._depth == 0 and self.signum is not None and self.active:
            raise _SignalStop(self.signum)


_active: StopSignals | None = None
_inside = threading.local()  # .outputs: the writer_run blocks this thread is in, outermost first


@contextmanager
def stop_signals(enabled: bool = True) -> Iterator[StopSignals]:
    """Handle SIGINT/SIGTERM for the duration (main thread only; nested calls share one)."""
    global _active
    if _active is not None:
        yield _active
        return
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield StopSignals(active=False)
        return
    stop = StopSignals()
    old: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, stop._handle)
    # one that came earlier and was lost where it was raised (see signals.py) counts too
    stop.signum = pending_signal()
    _active = stop
    try:
        yield stop
    finally:
        _active = None
        set_stopping(None)
        for signum, handler in old.items():
            signal.signal(signum, handler)


@contextmanager
def writer_run(
    output: str | os.PathLike[str],
    *,
    wait: float = 0.0,
    handle_signals: bool = False,
    on_event: EventFn | None = None,
    on_warning: EventFn | None = None,
) -> Iterator[OutputLock]:
    """Signals handled, then the output locked (waiting up to ``wait`` seconds), then the body.

    A stale lock left by a dead run is taken over, and a publish it left half done (pack renamed,
    index not) is finished; both are reported through ``on_warning`` (else ``on_event``) in one
    line each.
    A signal that stops the body becomes one ``Interrupted`` that says whether a checkpoint was
    kept (then ``hframe resume OUTPUT`` continues) or nothing was written.

    Raises:
        PackLocked: another run holds the output (after ``wait`` seconds).
        Interrupted: SIGINT/SIGTERM.
    """
    out = os.fspath(output)
    warn = on_warning or on_event
    outputs: list[str] = _inside.__dict__.setdefault("outputs", [])
    outermost = not outputs  # a shard's run inside a dataset's: the dataset's says what was left
    outputs.append(out)
    try:
        with stop_signals(handle_signals) as stop:
            if stop.signum is not None and stop.active:
                if not outermost:
                    raise _SignalStop(stop.signum)
                raise Interrupted(f"{out}: interrupted by {stop.name} before it started; nothing was done")
            lock = OutputLock(out, wait=wait)
            try:
                # a signal while the lock is being taken is acted on once it is held (and then
                # released), or ends the wait for it: never a lock file left behind
                with stop.deferred(act_after=False):
                    lock.acquire(should_stop=lambda: stop.signum is not None)
            except LockWaitStopped:
                if not outermost:
                    raise _SignalStop(stop.signum or signal.SIGINT) from None
                raise Interrupted(
                    f"{out}: interrupted by {stop.name} while waiting for the lock; nothing was done"
                ) from None
            try:
                if stop.signum is not None and stop.active:
                    raise _SignalStop(stop.signum)
                if lock.took_over and warn is not None:
                    warn(f"{out}: took over a stale lock left by a run that died ({lock.took_over})")
                if lock.waited_s > 0 and on_event is not None:
                    on_event(f"{out}: waited {lock.waited_s:.3f} s for the lock")
                if os.path.exists(partial_name(index_name(out))) and _finish_publish(out) and warn is not None:
                    warn(f"{out}: finished the publish of a run that died between its two renames")
                fault_point("after-lock")
                yield lock
            except _SignalStop as e:
                if not outermost:
                    raise
                raise Interrupted(describe_stop(out, e.signum)) from None
            except HframeError as e:
                # a signal's exception can be lost where it was raised (see signals.py) and
                # the run go on to fail for a reason the stop caused (a list on stdin cut short)
                if stop.signum is None or not stop.active or isinstance(e, Interrupted):
                    raise
                if not outermost:
                    raise _SignalStop(stop.signum) from e
                raise Interrupted(describe_stop(out, stop.signum)) from e
            finally:
                lock.release()
    finally:
        outputs.pop()


def _finish_publish(out: str) -> bool:
    from .writer import finish_publish  # only now: it needs pyarrow, a locked run must not wait for it

    return finish_publish(out)


def describe_stop(output: str, signum: int) -> str:
    """What an interrupted run left, in one line."""
    name = signal.Signals(signum).name
    paths = checkpoint_paths(output)
    if paths.checkpoint.exists() or paths.plan.exists():
        return f"{output}: interrupted by {name}; checkpoint kept: run 'hframe resume {output}' to continue"
    return (
        f"{output}: interrupted by {name}; nothing to resume (no checkpoint was written; the published "
        "pack, if any, is unchanged): run the same command again"
    )
