"""Kept copies: what a remote object's open fetched, kept on local disk by its URL and ETag.

Opening a remote pack fetches the start of the pack (its header), its trailer and its index
whole; a training process, each of its spawned workers and every rank of a node does it again,
and an index grows with the frames (about 40 bytes each: 40 MB for a million). With a kept
copy, the open asks the store only whether the object is still the version kept: HTTP sends
``If-None-Match`` with the kept ETag (a 304 answer carries no body); an object store's open
asks for the object's metadata anyway (its size and ETag, one request), and a matching ETag
makes the GETs unnecessary. The question is always asked: a replaced object is fetched
again, never served from the copy.

What is kept (``RemoteFile``): an object read whole (an index) under a strong ETag, and, on
an object store, whose ETag or generation changes with every write, a pack's first bytes and
trailer too. An HTTP server's ETag may repeat for other bytes (nginx's is the modification
time in seconds and the size), so over HTTP a pack's header is always fetched: it names the
pack's UUID, which the index (kept or not) must name too, so an index kept for other bytes
under the same ETag is found out, dropped and fetched (``read/snapshot.py``).

The node cache holds them (``read/cache.py``: ``kept/`` beside ``packs/``), one file per URL::

    b"HFK1", u32 length of the JSON that follows, JSON {"etag", "size", "head", "tail",
    "xxh3"}, then the head's bytes, then the tail's

``head``: the bytes the open fetched from the object's start (a pack's first 64 KB, an index
whole); ``tail``: its last bytes (a pack's trailer), or none. ``xxh3``: the 128-bit xxh3 of
both, checked at every use: a damaged or torn copy is deleted and the object fetched. A copy
is written to a temporary name and renamed, so a reader sees a whole copy or none; two
processes writing the same copy write the same bytes. The caller writes a copy only once what
it fetched has been checked (``RemoteFile.keep``: a pack and an index that belong together).

Imports inside functions: xxhash (the first copy read or written).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import threading
from dataclasses import dataclass

__all__ = ["Copy", "KeptCopies"]

_MAGIC = b"HFK1"
_LEN = struct.Struct("<I")
#: a copy bigger than this is not kept (an index past it is read in ranges anyway)
MOST_BYTES = 256 << 20


@dataclass(frozen=True)
class Copy:
    """A kept open of one object version: its ETag, size, first bytes and last bytes."""

    etag: str
    size: int
    head: bytes
    tail: bytes = b""


class KeptCopies:
    """The kept copies in one folder (made on first write). Every method is best effort: a
    folder that cannot be read or written means no copy, never an error."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        #: copies found wrong here (``forget``): never used again through this handle, even
        #: where their files cannot be deleted (a read-only cache)
        self._refused: set[str] = set()

    def path_of(self, url: str) -> str:
        """The file of ``url``'s copy: named by the URL's SHA-256 (the whole URL: the same path
        on two servers, or with two endpoints, is two copies)."""
        return os.path.join(self.folder, hashlib.sha256(url.encode()).hexdigest()[:32])

    def get(self, url: str) -> Copy | None:
        """``url``'s copy, if one is kept and whole (a damaged one is deleted)."""
        if url in self._refused:
            return None
        path = self.path_of(url)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        copy = _decode(data)
        if copy is None:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # (used now: eviction takes the least recently used first)
        return copy

    def put(self, url: str, copy: Copy) -> None:
        """Keep ``copy`` for ``url`` (replacing the one kept), whole or not at all."""
        if len(copy.head) + len(copy.tail) > MOST_BYTES or not copy.etag:
            return
        path = self.path_of(url)
        if _kept_version(path) == (copy.etag, copy.size, len(copy.head), len(copy.tail)):
            return  # (another process kept it meanwhile: ranks opening at once write it once)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # (one writer per name: threads too)
        try:
            os.makedirs(self.folder, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(_encode(copy))
            os.replace(tmp, path)
            self._refused.discard(url)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def holds(self, url: str) -> bool:
        """Whether a copy of ``url`` is kept and not refused (whole or not: ``get`` says)."""
        return url not in self._refused and os.path.exists(self.path_of(url))

    def forget(self, url: str) -> None:
        """Drop ``url``'s copy (what it held did not match what the store serves)."""
        self._refused.add(url)
        with contextlib.suppress(OSError):
            os.unlink(self.path_of(url))


def _kept_version(path: str) -> tuple[str, int, int, int] | None:
    """(ETag, size, head and tail lengths) a copy's file says it holds, from its first bytes
    only (not checked: enough to tell that writing the same copy again is not needed)."""
    try:
        with open(path, "rb") as f:
            start = f.read(8)
            if len(start) < 8 or start[:4] != _MAGIC:
                return None
            meta = json.loads(f.read(_LEN.unpack_from(start, 4)[0]))
        return meta["etag"], meta["size"], meta["head"], meta["tail"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _digest(head: bytes, tail: bytes) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    h.update(head)
    h.update(tail)
    return h.hexdigest()


def _encode(copy: Copy) -> bytes:
    meta = json.dumps(
        {
            "etag": copy.etag,
            "size": copy.size,
            "head": len(copy.head),
            "tail": len(copy.tail),
            "xxh3": _digest(copy.head, copy.tail),
        }
    ).encode()
    return b"".join((_MAGIC, _LEN.pack(len(meta)), meta, copy.head, copy.tail))


def _decode(data: bytes) -> Copy | None:
    """The copy in a file's bytes; None when they are not a whole, undamaged copy."""
    if len(data) < 8 or data[:4] != _MAGIC:
        return None
    (n,) = _LEN.unpack_from(data, 4)
    try:
        meta = json.loads(data[8 : 8 + n])
        etag, size, nhead, ntail, digest = (meta[k] for k in ("etag", "size", "head", "tail", "xxh3"))
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(etag, str) and etag and all(type(v) is int and v >= 0 for v in (size, nhead, ntail))):
        return None
    start = 8 + n
    if len(data) != start + nhead + ntail:
        return None
    head, tail = data[start : start + nhead], data[start + nhead :]
    if _digest(head, tail) != digest:
        return None
    return Copy(etag, size, head, tail)
