"""SIGINT and SIGTERM before a command takes them over: raise ``KeyboardInterrupt``, and remember.

Raising is not enough: CPython runs a handler wherever the main thread is, and one that raises
inside a callback (a weakref callback of the import system, met while a module loads) is printed
as "Exception ignored" and lost. So the handler also records the signal, and
``guard.stop_signals`` and ``cli.app.main`` look at the record when they take over or finish; and
such a lost ``KeyboardInterrupt`` is not printed (its "Exception ignored ... Traceback" would be
the one traceback of a run that ends with its one line and exit 130). Imports nothing: the
console script installs this on its first line.
"""

from __future__ import annotations

import signal
import sys

__all__ = ["install_early", "pending_signal", "set_stopping"]

_received: list[int] = []
_stopping: list[int] = []  # a command that handles signals itself took one (``set_stopping``)


def _stop(signum: int, frame: object) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def _unraisable(info: sys.UnraisableHookArgs) -> None:
    if isinstance(info.exc_value, KeyboardInterrupt) and _received:
        return  # a signal's, lost where it was raised: the record stands for it
    sys.__unraisablehook__(info)


def install_early() -> None:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` (and are remembered) from now on."""
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    sys.unraisablehook = _unraisable


def pending_signal() -> int | None:
    """The first SIGINT/SIGTERM the early handler met, or the one the command that now handles
    signals took (``set_stopping``), if one came: threads that wait on the network ask this
    between requests, and stop asking."""
    if _received:
        return _received[0]
    return _stopping[0] if _stopping else None


def set_stopping(signum: int | None) -> None:
    """Record that the command's own handler (``write/guard.StopSignals``) took ``signum`` and
    is stopping; None clears it when that handler is given up (a library caller may run again)."""
    _stopping[:] = [] if signum is None else [signum]
