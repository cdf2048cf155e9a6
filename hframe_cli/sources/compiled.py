"""The optional compiled part of listing: ``_scan`` (``_scan.c``), or None.

A folder whose entries are all plain files (not empty, not over the size limit, UTF-8 names)
is listed there in one call, into the same columns in the same order, where Python spends a
DirEntry, a sort key, a stat result and several appends a file (``inputs._Collector.walk``).
Every other folder is listed in Python, which stays the reference. Built and switched off as
``native`` says.

Imports inside functions: the compiled module, once, in ``_import`` (``native.load`` takes an
ImportError there as "not built").
"""

from __future__ import annotations

import sys
from types import ModuleType

from ..native import load

__all__ = ["scan"]


def _import() -> ModuleType:
    from . import _scan  # type: ignore[attr-defined]

    return _scan  # type: ignore[no-any-return]


#: The compiled module, or None: not built here, HFRAME_NATIVE=0, or file names that are not
#: UTF-8 here (its name order is the order of the names' bytes, which is theirs only in UTF-8).
scan = load(_import) if sys.getfilesystemencoding().lower().replace("-", "") == "utf8" else None
