"""How a source that is not a file says where its bytes are: a *locator* in the source's path.

A source is a path, a name, a size and a time (``sourcelist.Source``). For a file the path is
the file's. For anything else (a member of an archive, a row of a table, an object under a
prefix) the path is a locator: the container's location and the place in it, joined by NUL
bytes. A NUL can never be in a file's path (the kernel refuses it), so a locator is never
taken for a file, and every source list, checkpoint, plan and worker carries it unchanged.

Two shapes, told apart by the second field:

- an archive member (``archives.py``, the first kind, whose locators older checkpoints hold):
  ``ARCHIVE NUL OFFSET NUL ...``, the second field a number;
- every later kind: ``CONTAINER NUL NUL KIND NUL FIELD...``, the second field empty and the
  third naming the kind (``parquet``, ``object``).
"""

from __future__ import annotations

__all__ = ["SEP", "SourceChanged", "kind_of", "tagged", "untagged"]

SEP = "\0"


class SourceChanged(OSError):
    """The container of a located source is not what it was when the source was listed (or
    it is damaged where the source is): the source is refused, never read from a stale place."""


def kind_of(path: str) -> str | None:
    """``None`` for a file, ``archive`` for an archive member, else the tagged kind."""
    if SEP not in path:
        return None
    _, second, rest = path.split(SEP, 2)
    if second:
        return "archive"
    return rest.partition(SEP)[0]


def tagged(container: str, kind: str, *fields: object) -> str:
    """The locator of a source of ``kind`` in ``container``; its last field may hold anything
    but a NUL."""
    return SEP.join([container, "", kind, *map(str, fields)])


def untagged(path: str, count: int) -> tuple[str, list[str]]:
    """(container, fields) of a tagged locator with ``count`` fields (the last keeps any NUL-free text)."""
    container, _, _, rest = path.split(SEP, 3)
    return container, rest.split(SEP, count - 1)
