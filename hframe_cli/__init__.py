"""hframe: frame packs — many small media files in one file, read by offset through a Parquet index.

The library is the product; the ``hframe`` command is a thin layer over it::

    import hframe_cli as h
    h.pack(["photos/"], "photos.hframe")
    with h.open_pack("photos.hframe") as p:
        first = p[0]                      # exact bytes of frame 0
        batch = p.read_many([3, 1, 4])    # parallel, coalesced range reads

Importing this package loads neither typer, rich, tqdm nor torch.

Imports inside functions: ``importlib`` in ``__getattr__``, which loads a public name's module
on first use (``import hframe_cli`` stays cheap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    ChecksumMismatch,
    FormatError,
    FrameOutOfRange,
    HframeError,
    IncompletePack,
    IndexMismatch,
    InputError,
    IntegrityError,
    Interrupted,
    MagicMismatch,
    NotAPack,
    NotFound,
    NothingToResume,
    PackLocked,
    PackReplaced,
    StorageError,
    UnsupportedVersion,
)
from .format.layout import FORMAT_VERSION
from .version import __version__

# The rest of the public API loads on first use (PEP 562), so that `hframe --version` and a
# failing command start fast and `import hframe_cli` costs little until a pack is touched.
_LAZY = {
    "get_index_path": "format.index",
    "collect_sources": "sources.inputs",
    "MediaOptions": "sources.media",
    "CheckpointPolicy": "write.run",
    "PackResult": "write.run",
    "pack": "api",
    "PackOptions": "api",
    "PackOutcome": "api",
    "pack_sources": "write.run",
    "resume_pack": "api",
    "PackReader": "read.reader",
    "ReadStats": "read.reader",
    "open_pack": "read.dataset",
    "rebuild_index": "write.rebuild",
    "PackReport": "verify.report",
    "VerifyReport": "verify.report",
    "self_check": "verify.selfcheck",
    "verify_pack": "verify.check",
    "verify_packs": "verify.many",
    "PackWriter": "write.writer",
    "FrameDataset": "training.dataset",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hframe_cli' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .api import PackOptions, PackOutcome, pack, resume_pack
    from .format.index import get_index_path
    from .read.dataset import open_pack
    from .read.reader import PackReader, ReadStats
    from .sources.inputs import collect_sources
    from .sources.media import MediaOptions
    from .training.dataset import FrameDataset
    from .verify.check import verify_pack
    from .verify.many import verify_packs
    from .verify.report import PackReport, VerifyReport
    from .verify.selfcheck import self_check
    from .write.rebuild import rebuild_index
    from .write.run import CheckpointPolicy, PackResult, pack_sources
    from .write.writer import PackWriter

__all__ = [
    "FORMAT_VERSION",
    "ChecksumMismatch",
    "FormatError",
    "FrameDataset",
    "FrameOutOfRange",
    "HframeError",
    "CheckpointPolicy",
    "IncompletePack",
    "IndexMismatch",
    "InputError",
    "Interrupted",
    "IntegrityError",
    "MagicMismatch",
    "MediaOptions",
    "NotAPack",
    "NotFound",
    "NothingToResume",
    "PackLocked",
    "PackReplaced",
    "PackReader",
    "PackOptions",
    "PackOutcome",
    "PackReport",
    "PackResult",
    "PackWriter",
    "ReadStats",
    "StorageError",
    "UnsupportedVersion",
    "VerifyReport",
    "__version__",
    "collect_sources",
    "get_index_path",
    "open_pack",
    "pack",
    "pack_sources",
    "rebuild_index",
    "resume_pack",
    "self_check",
    "verify_pack",
    "verify_packs",
]
