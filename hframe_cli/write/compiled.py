"""The optional compiled part of ``hframe pack``: ``_blobs`` (``_blobs.c``), or None.

``pip install`` builds it where a C compiler and Python's headers are there (pyproject.toml,
``optional``: without them hframe installs without it). A packing worker hands it a whole
chunk of small files: blobs stored as they are and JPEG/PNG images (their size and mode read
from the header, as ``sources.imagehead`` does); it opens, reads, md5s and lays out their
records in one call, where Python spends 15-20 us of interpreter a file
(``parallel._add_sources``). Every chunk it declines (any other file, or one not as listed)
takes the pure-Python path, which stays the reference: the pack is byte for byte the same
either way.

``HFRAME_NATIVE=0`` turns it off (the test suite runs the packing tests both ways);
``hframe --version`` says whether it is in use.

Imports inside functions: the compiled module, once, in ``_load`` (an ImportError there means
"not built", and is the answer rather than an error).
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["blobs", "describe"]


def _load() -> ModuleType | None:
    if os.environ.get("HFRAME_NATIVE", "1") == "0":
        return None
    try:
        from . import _blobs  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _blobs  # type: ignore[no-any-return]


#: The compiled module, or None: not built here, or HFRAME_NATIVE=0.
blobs = _load()


def describe() -> str:
    """What ``hframe --version`` says after the version, on the same line."""
    if blobs is not None:
        return "packing loop: compiled"
    if os.environ.get("HFRAME_NATIVE", "1") == "0":
        return "packing loop: Python (HFRAME_NATIVE=0)"
    return "packing loop: Python (not compiled at install)"
