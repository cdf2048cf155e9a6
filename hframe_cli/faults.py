"""Fault injection for crash tests: die or fail at named points, only when asked.

``HFRAME_FAULT=point[:n]`` makes the process kill itself with SIGKILL the n-th time (default 1)
it passes ``point``; ``HFRAME_FAULT=point:n:stop`` makes it stop itself with SIGSTOP there instead
(a test then acts while the run is paused at a known moment, and resumes it with SIGCONT);
``HFRAME_FAULT=enospc:BYTES`` makes pack writes fail with ENOSPC once the partial pack would grow
past BYTES. Unset (always, outside tests), every call is a dictionary
lookup and nothing else. The points are listed in ``man/hframe.1`` (ENVIRONMENT).
"""

from __future__ import annotations

import os
import signal

__all__ = ["POINTS", "enospc_limit", "fault_point"]

POINTS = (
    "after-lock",
    "after-plan",
    "after-frame",
    "checkpoint-before-rename",
    "checkpoint-between-renames",
    "after-seal",
    "publish-between-renames",
    "after-manifest",
    "upload-before-complete",
    "upload-after-object",
    "listing-helper",
    "cache-fill",
)

_hits: dict[str, int] = {}


def _spec() -> tuple[str, int, str] | None:
    raw = os.environ.get("HFRAME_FAULT")
    if not raw:
        return None
    name, _, rest = raw.partition(":")
    count, _, action = rest.partition(":")
    try:
        return name, int(count or 1), action or "kill"
    except ValueError:
        return None


def fault_point(name: str) -> None:
    """SIGKILL (or SIGSTOP) this process here if ``HFRAME_FAULT`` names this point and its count
    is reached. A stop happens once; after SIGCONT the run goes on."""
    spec = _spec()
    if spec is None or spec[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if spec[2] == "stop":
        if _hits[name] == spec[1]:
            os.kill(os.getpid(), signal.SIGSTOP)
    elif _hits[name] >= spec[1]:
        os.kill(os.getpid(), signal.SIGKILL)


def enospc_limit() -> int | None:
    """The byte size past which pack writes fail with ENOSPC, if injected."""
    spec = _spec()
    return spec[1] if spec is not None and spec[0] == "enospc" else None
