"""Byte sizes and durations as people type and read them (``16GiB``, ``64MB``, ``1.5 s``)."""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone

from .errors import InputError

__all__ = ["count", "format_bytes", "parse_created", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, what: str = "size") -> int:
    """``"16GiB"`` → 17179869184. Decimal (kB, MB, GB) and binary (KiB, MiB, GiB) units."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise InputError(f"{what}: {text!r} is not a size (examples: 4096, 64MB, 16GiB)")
    return int(float(m.group(1)) * _UNITS[unit])


def count(n: int, one: str, many: str | None = None, *, sep: str = "") -> str:
    """``count(1, "frame")`` → ``"1 frame"``, ``count(2, "frame")`` → ``"2 frames"``; ``many``
    for an irregular plural, ``sep=","`` for thousands separators."""
    return f"{n:{sep}} {one if n == 1 else many or one + 's'}"


def format_bytes(n: float) -> str:
    """``1536000`` → ``"1.5 MB"`` (decimal units, as disks and networks are sold)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def format_duration(seconds: float) -> str:
    """``42`` → ``"42 s"``, ``750`` → ``"13 min"``, ``9000`` → ``"2.5 h"``: a log reader's ETA."""
    if seconds < 1:
        return "<1 s"
    if seconds < 100:
        return f"{seconds:.0f} s"
    if seconds < 6000:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def parse_created(value: str | None, environ: dict[str, str] | None = None) -> int | None:
    """Creation time in microseconds from ``--created`` or ``SOURCE_DATE_EPOCH``.

    ``value`` may be epoch seconds (``1700000000``) or ISO 8601 (``2024-01-02T03:04:05Z``).
    Returns None when neither is set (then the pack gets the current time and a random UUID).
    """
    env = os.environ if environ is None else environ
    source = "--created"
    if value is None:
        value = env.get("SOURCE_DATE_EPOCH") or None
        source = "SOURCE_DATE_EPOCH"
    if value is None:
        return None
    try:
        return int(round(float(value) * 1_000_000))
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise InputError(f"{source}: {value!r} is neither epoch seconds nor an ISO 8601 time") from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1_000_000)
