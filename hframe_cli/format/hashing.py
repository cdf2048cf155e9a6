"""The md5 of many frames at once: ``md5_each``.

Every frame's md5 is in the index, and hframe hashes frames by the thousand (packing, verify,
reads that check what a server sent). One md5 stream is a chain of dependent steps that no core
runs faster than about 700 MB/s (``md5sum``'s speed); but frames are independent, so the
compiled part (``_md5x.c``, ``md5x.h``) hashes 16 of them side by side in the lanes of a vector
register: about 5x one stream on a core with AVX-512, and exactly md5's digests. Without it
(not built, or ``HFRAME_NATIVE=0``) the same digests come from hashlib, one frame at a time.

Imports inside functions: the compiled module, once, through ``native.load``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from types import ModuleType

from ..native import load

__all__ = ["md5_each", "md5x"]


def _import() -> ModuleType:
    from . import _md5x  # type: ignore[attr-defined]

    return _md5x  # type: ignore[no-any-return]


#: The compiled module (``md5_each``, ``isa``), or None: not built here, or HFRAME_NATIVE=0.
md5x = load(_import)

# Fewer frames than this go through hashlib: side by side pays from a few lanes on
_SIDE_BY_SIDE_FROM = 4


def md5_each(frames: Sequence[bytes | bytearray | memoryview]) -> list[bytes]:
    """``[hashlib.md5(f).digest() for f in frames]``, computed side by side where built."""
    if md5x is not None and len(frames) >= _SIDE_BY_SIDE_FROM:
        return md5x.md5_each(frames)  # type: ignore[no-any-return]
    md5 = hashlib.md5
    return [md5(f).digest() for f in frames]
