"""The optional compiled part of ``hframe verify``: ``_walk`` (``_walk.c``), or None.

``Verifier.clean_run``, the loop nearly every byte of a full verify goes through, runs there:
per frame the record header compared with its index row, the CRC, name, padding and magic
bytes checked and the md5 compared with both, where Python spends 4-6 us of interpreter a
frame. The Python loop stays the reference (the same answer). Built and switched off as
``native`` says.

Imports inside functions: the compiled module, once, in ``_import`` (``native.load`` takes an
ImportError there as "not built").
"""

from __future__ import annotations

from types import ModuleType

from ..native import load

__all__ = ["walk"]


def _import() -> ModuleType:
    from . import _walk  # type: ignore[attr-defined]

    return _walk  # type: ignore[no-any-return]


#: The compiled module, or None: not built here, or HFRAME_NATIVE=0.
walk = load(_import)
