"""Checking that stored frames are what the index says: the packing self-check.

``self_check`` is what ``pack`` runs before it publishes: evict the new pack from the page
cache (so the bytes come from the disk, not from memory that was just written), read back the
first N frames through the ordinary reader, and compare md5 and magic bytes with the index.
"""

from __future__ import annotations

import hashlib
import os

from .errors import ChecksumMismatch, MagicMismatch
from .format import expected_magic
from .reader import PackReader
from .storage import evict_from_page_cache

__all__ = ["DEFAULT_SELF_CHECK", "self_check"]

DEFAULT_SELF_CHECK = 20


def self_check(
    pack_path: str | os.PathLike[str], index_path: str | os.PathLike[str], frames: int = DEFAULT_SELF_CHECK
) -> int:
    """Read back the first ``frames`` frames from disk and compare them with the index.

    Returns:
        The number of frames checked.

    Raises:
        ChecksumMismatch: a frame's md5 differs from the index.
        MagicMismatch: a frame's first bytes do not match its recorded media type.
    """
    evict_from_page_cache(pack_path)
    with PackReader(pack_path, index_path) as reader:
        n = min(max(frames, 0), len(reader))
        if n == 0:
            return 0
        rows = reader.table.slice(0, n).select(["md5", "media_type"]).to_pylist()
        datas = reader.read_many(list(range(n)))
        for i, (row, data) in enumerate(zip(rows, datas)):
            offset, length = reader.range_of(i)
            where = f"{reader.path}: frame {i} (offset {offset}, length {length})"
            magic = expected_magic(row["media_type"])
            if magic is not None and not data.startswith(magic):
                raise MagicMismatch(
                    f"{where}: magic bytes mismatch (index says {row['media_type']}, expected "
                    f"{magic.hex(' ')}, read {data[: len(magic)].hex(' ')})"
                )
            got = hashlib.md5(data).hexdigest()
            if got != row["md5"]:
                raise ChecksumMismatch(f"{where}: md5 mismatch (index {row['md5']}, read {got})")
        return n
