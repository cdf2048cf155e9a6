"""Byte sizes and durations as people type and read them (``16GiB``, ``64MB``, ``1.5 s``)."""

from __future__ import annotations

import re

from .errors import InputError

__all__ = ["format_bytes", "parse_size"]

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


def format_bytes(n: float) -> str:
    """``1536000`` → ``"1.5 MB"`` (decimal units, as disks and networks are sold)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
