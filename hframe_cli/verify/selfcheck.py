"""The packing self-check: ``verify_pack`` on the first frames of a sealed, unpublished pack,
read back from disk (not the page cache), raising on the first problem."""

from __future__ import annotations

import os

from ..errors import (
    ChecksumMismatch,
    FormatError,
    IntegrityError,
    MagicMismatch,
)
from ..format.index import read_index_meta
from ..storage.access import evict_from_page_cache
from . import DEFAULT_SELF_CHECK
from .check import verify_pack

__all__ = ["self_check"]

# -- the packing self-check ---------------------------------------------------------------

_EXCEPTIONS: dict[str, type[IntegrityError]] = {"md5": ChecksumMismatch, "magic": MagicMismatch}


def self_check(
    pack_path: str | os.PathLike[str], index_path: str | os.PathLike[str], frames: int = DEFAULT_SELF_CHECK
) -> int:
    """Evict the pack from the page cache, read back the first ``frames`` frames, compare with the index.

    Returns:
        The number of frames checked.

    Raises:
        ChecksumMismatch / MagicMismatch / IntegrityError: the first problem found.
        FormatError: the pack or index cannot be read.
    """
    evict_from_page_cache(pack_path)
    meta = read_index_meta(index_path)
    n = min(max(frames, 0), meta.frame_count)
    if n == 0:
        return 0
    rep = verify_pack(pack_path, index_path=index_path, frames=(0, n), max_errors=1, workers=1)
    if rep.error:
        raise FormatError(rep.error)
    if rep.problems:
        p = rep.problems[0]
        raise _EXCEPTIONS.get(p.check, IntegrityError)(p.message)
    return rep.frames_checked
