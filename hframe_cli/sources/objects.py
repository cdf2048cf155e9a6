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

**Lists of URLs.** HTTP(S) has no listing, so files at URLs come as a list (``hframe pack - <
urls.txt``, or URLs as arguments). Each URL is probed once when the list is read (a one-byte
ranged GET, ``URL_PROBES`` at once: size, ETag, Last-Modified) and is then a located source like
an object: fetched whole under the same policy, pinned to the ETag the probe saw (a strong one:
``If-Match``; a changed file is refused, never packed half old). A URL is named as
``wget -x`` saves it (``host/path``, ``host:port/path`` off the default port; the path
percent-decoded; no query), or relative to ``--base URL``. Its ``source`` is the URL without its
query (a signature is never written into an index) and ``#etag=...``.

Imports inside functions: ``pyarrow.fs``, only when an object's listing is checked again.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from ..errors import InputError, StorageError
from ..locations import scheme_family, shown_url
from ..storage.http import HttpBackend
from ..storage.objectstore import ObjectBackend, list_under, prefix_at
from ..storage.policy import Budget, Permanent, RequestPolicy, fetched
from .archives import member_name
from .locator import SourceChanged, tagged, untagged

__all__ = [
    "ObjectEntry",
    "in_flight",
    "list_prefix",
    "list_urls",
    "read_url",
    "url_name",
    "url_shown",
    "url_unchanged",
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
    try:
        resp = fetched(lambda deadline: backend.get(0, None, None, deadline), policy, _BUDGET, url)
    except Permanent as e:
        if e.kind in ("missing", "replaced"):
            raise SourceChanged(f"vanished or was replaced since it was listed ({e})") from None
        raise StorageError(f"{url}: {e}") from None
    finally:
        backend.close()
    if resp.size != size or len(resp.body) != size:
        raise SourceChanged(f"is {resp.size} bytes, listed with {size}: replaced since it was listed")
    version = (resp.etag or "").strip('"')
    return resp.body, {"source": url + (f"#etag={version}" if version else "")}


#: retry tokens shared by every object this process fetches (``storage/policy.Budget``): a
#: store that keeps failing ends the run instead of being retried object after object
_BUDGET = Budget(RequestPolicy().budget)


# -- lists of URLs ------------------------------------------------------------------------------

_URL_KIND = "url"
_URL_FIELDS = 3  # size, mtime, ETag ("": none the server vouches for)


def url_name(url: str, base: str | None = None) -> str | None:
    """A URL's frame name: ``host/path`` as ``wget -x`` saves it (the port too when it is not
    the scheme's), or the path relative to ``base`` (a URL on the same host, ending in ``/``);
    percent-decoded, normalized as a tar member's name; None if no file name is left.

    Raises:
        InputError: the URL is not under ``base``.
    """
    parts = urllib.parse.urlsplit(url)
    path = os.fsdecode(urllib.parse.unquote_to_bytes(parts.path))
    if base is not None:
        root = urllib.parse.urlsplit(base)
        folder = os.fsdecode(urllib.parse.unquote_to_bytes(root.path)).rstrip("/") + "/"
        same_place = (parts.scheme, parts.hostname, parts.port) == (root.scheme, root.hostname, root.port)
        if not same_place or not path.startswith(folder):
            raise InputError(f"{shown_url(url)}: not under --base {shown_url(base)}")
        rel = path[len(folder) :]
    else:
        default = 443 if parts.scheme == "https" else 80
        host = parts.hostname or ""
        rel = host + (f":{parts.port}" if parts.port not in (None, default) else "") + "/" + path
    return None if path.endswith("/") else member_name(rel)


def list_urls(urls: Sequence[str], base: str | None = None) -> Iterator[ObjectEntry]:
    """The files at ``urls``, in the order given: each probed once (``URL_PROBES`` at once)
    for its size, ETag and time.

    Raises:
        InputError: a URL that is not http(s), or not under ``base``.
        StorageError: a server failed past the request policy.
    """
    for url in urls:
        if scheme_family(url) != "http":
            raise InputError(
                f"{shown_url(url)}: a list gives files at http(s):// URLs; an s3://, gs:// or hdfs:// "
                "prefix is given as an argument (its objects are listed)"
            )
    names = [url_name(url, base) for url in urls]
    probes = max(1, min(URL_PROBES, _policy().in_flight, len(urls)))
    with ThreadPoolExecutor(max_workers=probes, thread_name_prefix="hframe-probe") as pool:
        for i in range(0, len(urls), _PROBE_SLICE):  # (a slice at a time: no future per URL of 10^7)
            cut = slice(i, i + _PROBE_SLICE)
            for url, name, probe in zip(urls[cut], names[cut], pool.map(_probe, urls[cut])):
                if name is None:
                    yield ObjectEntry("", shown_url(url), 0, 0, "names no file (its path ends with '/')")
                elif isinstance(probe, str):
                    yield ObjectEntry("", shown_url(url), 0, 0, probe)
                else:
                    size, mtime_ns, etag = probe
                    yield ObjectEntry(name, tagged(url, _URL_KIND, size, mtime_ns, etag), size, mtime_ns)


_PROBE_SLICE = 4096
#: URLs of a list probed at once (``HFRAME_IO_IN_FLIGHT`` when it is set lower)
URL_PROBES = 16


def _probe(url: str) -> tuple[int, int, str] | str:
    """(size, mtime_ns, strong ETag or "") of what ``url`` serves now, or why it cannot be packed."""
    policy = _policy()
    backend = HttpBackend(url, policy)
    try:
        try:
            resp = fetched(lambda deadline: backend.get(0, 1, None, deadline), policy, _BUDGET, shown_url(url))
        except Permanent as e:
            if e.kind != "unsupported":
                return f"cannot be read ({e})" if e.kind != "missing" else f"no such file ({e})"
            # a server without ranges: the whole file, once, only to learn its size
            resp = fetched(lambda deadline: backend.get(0, None, None, deadline), policy, _BUDGET, shown_url(url))
    finally:
        backend.close()
    etag = resp.etag if resp.etag and not resp.etag.startswith("W/") else ""
    return resp.size, _http_time_ns(resp.modified), etag


def _http_time_ns(value: str | None) -> int:
    """A Last-Modified header as Unix nanoseconds (0: none or unreadable), as ``wget -N`` sets a
    file's time from it."""
    if not value:
        return 0
    try:
        return int(parsedate_to_datetime(value).timestamp()) * 1_000_000_000
    except (TypeError, ValueError, OverflowError):
        return 0


def _url_parse(path: str) -> tuple[str, int, int, str]:
    url, (size, mtime, etag) = untagged(path, _URL_FIELDS)
    return url, int(size), int(mtime), etag


def url_shown(path: str) -> str:
    """A listed URL for people and for the frame's ``source``: without credentials or query."""
    return shown_url(_url_parse(path)[0]).split("?", 1)[0]


def url_unchanged(path: str) -> bool:
    """Whether the URL still serves what was listed (size, time, ETag; one small request)."""
    url, size, mtime, etag = _url_parse(path)
    try:
        probe = _probe(url)
    except (StorageError, InputError):
        return False
    return probe == (size, mtime, etag)


def read_url(path: str, size: int) -> tuple[bytes, dict[str, str]]:
    """A listed URL's bytes, fetched whole under the request policy (pinned to the ETag the
    listing saw, when the server gave a strong one), and its ``source``.

    Raises:
        SourceChanged: the file is gone, or another version than the one listed is served.
        StorageError: the server failed past the policy's retries or deadline (exit 3).
        KeyboardInterrupt: a signal is pending.
    """
    url, _, _, etag = _url_parse(path)
    shown = url_shown(path)
    policy = _policy()
    backend = HttpBackend(url, policy)
    try:
        resp = fetched(lambda deadline: backend.get(0, None, etag or None, deadline), policy, _BUDGET, shown)
    except Permanent as e:
        if e.kind in ("missing", "replaced"):
            raise SourceChanged(f"vanished or was replaced since it was listed ({e})") from None
        raise StorageError(f"{shown}: {e}") from None
    finally:
        backend.close()
    if len(resp.body) != size or (etag and resp.etag != etag):
        raise SourceChanged(f"is {len(resp.body)} bytes, listed with {size}: replaced since it was listed")
    return resp.body, {"source": shown + (f"#etag={etag.strip(chr(34))}" if etag else "")}
