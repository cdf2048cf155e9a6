"""The optional compiled part of ``hframe pack``: ``_blobs`` (``_blobs.c``), or None.

A packing worker hands it a whole chunk of small files: blobs stored as they are and JPEG/PNG
images (their size and mode read from the header, as ``sources.imagehead`` does); it opens,
reads, md5s and lays out their records in one call, where Python spends 15-20 us of
interpreter a file (``parallel._add_sources``). Every chunk it declines (any other file, or one
not as listed) takes the pure-Python path, which stays the reference: the pack is byte for
byte the same either way. Built and switched off as ``native`` says.

Imports inside functions: the compiled module, once, in ``_import`` (``native.load`` takes an
ImportError there as "not built").
"""

from __future__ import annotations

from types import ModuleType

from ..native import load

__all__ = ["blobs"]


def _import() -> ModuleType:
    from . import _blobs  # type: ignore[attr-defined]

    return _blobs  # type: ignore[no-any-return]


#: The compiled module, or None: not built here, or HFRAME_NATIVE=0.
blobs = load(_import)
