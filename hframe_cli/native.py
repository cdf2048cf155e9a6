"""The optional compiled parts of hframe, and the one switch that turns them off.

``pip install`` builds them where a C compiler and Python's headers are (pyproject.toml: the
extensions are ``optional``, so hframe installs without them). Each sits beside the Python code
it speeds up, which stays the reference (the same bytes, the same report) and the fallback:

* ``sources/_scan.c`` (``sources.compiled``): a folder of plain files listed in one call;
* ``write/_blobs.c`` (``write.compiled``): a packing worker's chunk of small files read,
  hashed and laid out in one call;
* ``verify/_walk.c`` (``verify.compiled``): verify's loop over sound frames;
* ``format/_md5x.c`` (``format.hashing``): the md5 of many frames side by side (``format/md5x.h``,
  which the packing and verify loops above hash with too).

``HFRAME_NATIVE=0`` turns them all off (``scripts/test.sh`` runs the listing, packing and
verify tests again that way); ``hframe --version`` says which are in use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

__all__ = ["describe", "enabled", "load"]


def enabled() -> bool:
    """Whether compiled parts may be used (``HFRAME_NATIVE`` is not ``0``)."""
    return os.environ.get("HFRAME_NATIVE", "1") != "0"


def load(importer: Callable[[], ModuleType]) -> ModuleType | None:
    """The module ``importer`` imports, or None: switched off, or not built here."""
    if not enabled():
        return None
    try:
        return importer()
    except ImportError:
        return None


def describe(parts: dict[str, ModuleType | None]) -> str:
    """What ``hframe --version`` says of them: ``compiled: pack, verify``, or why none is."""
    used = [name for name, module in parts.items() if module is not None]
    if used:
        return "compiled: " + ", ".join(used)
    return "compiled: none (HFRAME_NATIVE=0)" if not enabled() else "compiled: none (not built at install)"
