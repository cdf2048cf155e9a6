"""One front for every kind of source, file or located (``locator.py``): how to read it, show it,
say where it came from, and tell whether its container changed since it was listed.

The packing loop, its loaders and workers, ``--update`` and ``resume`` ask here and never look
at a locator themselves. Kinds and their modules: files; ``archive`` and ``member``
(``archives.py``: tar and zip members); ``parquet`` (``tables.py``: rows); ``object`` and ``url`` (``objects.py``: objects under an
object-store prefix, files at the URLs of a list).
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

from . import archives, objects, tables
from .locator import SourceChanged, kind_of

#: the kinds of an archive member's locator (``archives.py``: the first spelling, and the tagged one)
_MEMBERS = ("archive", "member")

__all__ = [
    "SourceChanged",
    "container_of",
    "is_located",
    "kind_of",
    "open_located",
    "origin_of",
    "read_located",
    "reading",
    "shown",
    "unchanged",
]


def is_located(path: str) -> bool:
    """Whether a source's path is a locator (not a file)."""
    return "\0" in path


def shown(path: str) -> str:
    """A source's path for people: a file's as it is, ``ARCHIVE:MEMBER``, ``TABLE#row=N``, or
    an object's URL."""
    kind = kind_of(path)
    if kind is None:
        return path
    if kind in _MEMBERS:
        return archives.shown(path)
    if kind == "parquet":
        return tables.row_shown(path)
    if kind == "url":
        return objects.url_shown(path)
    return objects.object_shown(path)


def origin_of(path: str) -> dict[str, str] | None:
    """The frame metadata that says where a located source came from (its ``source``), as far
    as the locator alone tells; None for a file."""
    kind = kind_of(path)
    if kind is None:
        return None
    if kind in _MEMBERS:
        return archives.member_meta(path)
    if kind == "parquet":
        return {"source": tables.row_origin(path)}
    if kind == "url":
        return {"source": objects.url_shown(path)}
    return {"source": objects.object_origin(path)}


def reading(path: str) -> str:
    """How sources like this one are best read by the packing loop: ``parallel`` (files and
    members in place: threads, packing workers), ``rows`` (a table's: a row group decoded once
    per process, no packing workers), ``remote`` (objects: many fetched at once on threads),
    ``forward`` (a compressed tar's members: one reader, in order)."""
    kind = kind_of(path)
    if kind == "parquet":
        return "rows"
    if kind in ("object", "url"):
        return "remote"
    if kind in _MEMBERS and archives.read_forward_only(path):
        return "forward"
    return "parallel"


def container_of(path: str) -> str:
    """The archive, table or object a located source is read from (a file: itself)."""
    return path.split("\0", 1)[0]


def unchanged(path: str) -> bool:
    """Whether a located source's container is still what it was listed from (size and time)."""
    kind = kind_of(path)
    if kind in _MEMBERS:
        return archives.member_unchanged(path)
    if kind == "parquet":
        return tables.row_unchanged(path)
    if kind == "object":
        return objects.object_unchanged(path)
    if kind == "url":
        return objects.url_unchanged(path)
    try:
        os.stat(path)
    except OSError:
        return False
    return True


def read_located(path: str, size: int) -> tuple[bytes, dict[str, str]]:
    """A located source's bytes, whole and checked, and its frame's metadata (``source``; a
    row's ``label``).

    Raises:
        SourceChanged: its container changed since it was listed, or is damaged there.
        OSError: its container cannot be read.
    """
    kind = kind_of(path)
    if kind in _MEMBERS:
        return archives.read_member_and_meta(path, size)
    if kind == "parquet":
        return tables.read_row(path, size)
    if kind == "object":
        return objects.read_object(path, size)
    if kind == "url":
        return objects.read_url(path, size)
    raise ValueError(f"not a locator: {path!r}")


def open_located(path: str, size: int) -> tuple[BinaryIO, dict[str, str] | None]:
    """A source's bytes as a stream, and its frame's metadata (None for a file): a file opened,
    a member read in place, a row or an object fetched whole."""
    kind = kind_of(path)
    if kind is None:
        return open(path, "rb"), None
    if kind in _MEMBERS:
        return archives.open_source(path, size), archives.member_meta(path)
    data, meta = read_located(path, size)
    return io.BytesIO(data), meta


def open_source(path: str, size: int) -> BinaryIO:
    """``open_located`` without the metadata."""
    return open_located(path, size)[0]
