"""Objects under an object-store prefix as sources (``hframe pack s3://bucket/prefix/ -o ...``).

A prefix is packed as the folder it would be if synced to a disk: every object under it is a
frame named by its key relative to the prefix (normalized as a tar member's name), with the size
and modification time the listing gives, in name order. Listing goes through ``pyarrow.fs``
(``storage/objectstore.list_under``); each object is then a located source (``locator.py``):
the prefix's location (with its store options), the size and time listed, and the key.

Reading fetches an object whole with ``ObjectBackend``: a metadata request (pyarrow opens an
object with one; it gives the size and ETag) and one GET, under the request policy every remote read has (retries with
jittered backoff, a per-request timeout, a deadline per read, a retry budget; a pending Ctrl-C
stops asking). Many objects are fetched at once by the
packing loop's loading threads (``objects.IN_FLIGHT`` of them, ``HFRAME_IO_IN_FLIGHT``), while
one writer appends in name order. An object whose size is no longer the listed one, or that is
gone, is refused (``SourceChanged``), as a file that changed while packing is. The frame's
``source`` is the object's URL and the version read: ``s3://b/k#etag=...`` (GCS: its generation).

Imports inside functions: ``pyarrow.fs``, only when an object's listing is checked again.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import StorageError
from ..locations import shown_url
from ..signals import pending_signal
from ..storage.objectstore import ObjectBackend, list_under, prefix_at
from ..storage.policy import Budget, Permanent, RequestPolicy, Transient
from .archives import member_name
from .locator import SourceChanged, tagged, untagged

__all__ = [
    "ObjectEntry",
    "in_flight",
    "list_prefix",
    "object_origin",
    "object_shown",
    "object_unchanged",
    "read_object",
]

_KIND = "object"
_FIELDS = 3  # size, mtime, key relative to the prefix


@dataclass(frozen=True, slots=True)
class ObjectEntry:
    """One object found under a prefix: its frame ``name``, locator (``path``), size and time;
    or, with ``problem`` set, a key that is not packed and why."""

    name: str
    path: str
    size: int
    mtime_ns: int
    problem: str | None = None


_POLICY: list[RequestPolicy] = []
_POLICY_LOCK = threading.Lock()


def _policy() -> RequestPolicy:
    """This process's request policy (``HFRAME_IO_*``), read once."""
    with _POLICY_LOCK:
        if not _POLICY:
            _POLICY.append(RequestPolicy.from_env())
        return _POLICY[0]


def in_flight() -> int:
    """How many objects to fetch at once (the policy's ``in_flight``, ``HFRAME_IO_IN_FLIGHT``)."""
    return _policy().in_flight


def list_prefix(location: str) -> Iterator[ObjectEntry]:
    """The objects under the prefix ``location``, in the store's (key) order."""
    _, found = list_under(location, _policy())
    for rel, size, mtime_ns in found:
        path = tagged(location, _KIND, size, mtime_ns, rel)
        name = member_name(rel)
        if name is None:
            yield ObjectEntry("", path, size, mtime_ns, "its key has a '..' part: not a name a folder could hold")
        else:
            yield ObjectEntry(name, path, size, mtime_ns)


def _parse(path: str) -> tuple[str, int, int, str]:
    prefix, (size, mtime, rel) = untagged(path, _FIELDS)
    return prefix, int(size), int(mtime), rel


def _url(prefix: str, rel: str) -> str:
    """An object's URL for people (the prefix's store options left out)."""
    return shown_url(prefix).split("?", 1)[0].rstrip("/") + "/" + rel


def object_shown(path: str) -> str:
    prefix, _, _, rel = _parse(path)
    return _url(prefix, rel)


def object_origin(path: str) -> str:
    """The object's URL (what the locator alone says; a read adds the version)."""
    return object_shown(path)


def _key(prefix: str, rel: str) -> str:
    _, base = prefix_at(prefix, _policy())
    return base + "/" + rel


def object_unchanged(path: str) -> bool:
    """Whether the object is still there with the size and time it was listed with (one request)."""
    import pyarrow.fs as pafs

    prefix, size, mtime, rel = _parse(path)
    fs, _ = prefix_at(prefix, _policy())
    try:
        info = fs.get_file_info(_key(prefix, rel))
    except (OSError, ValueError):
        return False
    return info.type == pafs.FileType.File and (info.size, info.mtime_ns or 0) == (size, mtime)


def read_object(path: str, size: int) -> tuple[bytes, dict[str, str]]:
    """An object's bytes, fetched whole under the request policy, and its ``source``.

    Raises:
        SourceChanged: the object is gone, or is no longer ``size`` bytes.
        StorageError: the store failed past the policy's retries or deadline (exit 3).
        KeyboardInterrupt: a signal is pending (the command is stopping: the store is not asked again).
    """
    prefix, _, _, rel = _parse(path)
    url = _url(prefix, rel)
    policy = _policy()
    backend = ObjectBackend(prefix, policy, key=_key(prefix, rel))
    t0 = time.monotonic()
    deadline = t0 + policy.deadline_s
    attempt = 0
    try:
        while True:
            attempt += 1
            if pending_signal() is not None:
                raise KeyboardInterrupt
            try:
                resp = backend.get(0, None, None, deadline)
                break
            except Transient as e:
                pause = random.uniform(0, min(policy.backoff_cap_s, policy.backoff_s * 2 ** (attempt - 1)))
                if attempt >= policy.attempts or time.monotonic() + pause >= deadline or not _BUDGET.spend(5):
                    raise StorageError(
                        f"{url}: {e} after {attempt} attempts in {time.monotonic() - t0:.1f} s"
                    ) from None
                time.sleep(pause)
            except Permanent as e:
                if e.kind in ("missing", "replaced"):
                    raise SourceChanged(f"vanished or was replaced since it was listed ({e})") from None
                raise StorageError(f"{url}: {e}") from None
    finally:
        backend.close()
    _BUDGET.earn()
    if resp.size != size or len(resp.body) != size:
        raise SourceChanged(f"is {resp.size} bytes, listed with {size}: replaced since it was listed")
    version = (resp.etag or "").strip('"')
    return resp.body, {"source": url + (f"#etag={version}" if version else "")}


#: retry tokens shared by every object this process fetches (``storage/policy.Budget``): a
#: store that keeps failing ends the run instead of being retried object after object
_BUDGET = Budget(RequestPolicy().budget)
