"""Object stores (``s3://``, ``gs://``, ``hdfs://``) through ``pyarrow.fs``, as ``RemoteFile`` backends.

pyarrow brings what hframe should not write again: the AWS and Google credential chains
(environment, config files, instance metadata, workload identity), request signing, and HDFS.
What it does not bring is hframe's request policy, so its own retry loops are turned off here
(S3: one attempt; GCS: no retry time) and ``http.RemoteFile`` retries, times out and counts
every request, the same on every backend (``man/hframe.1``, REMOTE PACKS).

Locations: ``s3://BUCKET/KEY``, ``gs://BUCKET/KEY`` (or ``gcs://``), ``hdfs://HOST:PORT/PATH``.
Options of an S3-compatible or emulated store go in the query (``?endpoint_override=HOST:PORT&
scheme=http&region=R``); an S3 endpoint may also come from ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, as the AWS tools take it. Credentials never appear in a location: one that
holds them (``s3://KEY:SECRET@BUCKET/...``) is refused before any request (``_CREDENTIALS``).

pyarrow's S3 client takes hframe's connect and request timeouts. Its GCS client takes none (only
a time limit for its own retries; without a byte, a download waits 120 s, a constant built into
google-cloud-cpp, and a metadata request longer): there every request runs on a thread of its
own and is given up after ``request_timeout_s`` for each 8 MiB it asks for (the rest of the
read's deadline at most), a ``Transient`` failure like a timeout over HTTP; the request given
up ends by itself, in the background.

A ranged read through pyarrow cannot carry ``If-Match``. GCS reads are pinned anyway (pyarrow
asks for the object's generation); S3 and HDFS reads are not, so ``pinned`` is False for them
and the reader checks every frame it returns against the index's md5 (``read/reader.py``).

Imports inside functions: ``pyarrow.fs``, only when an object store is opened.
"""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import InputError, StorageError
from ..locations import has_credentials, object_store, shown_url
from .policy import Permanent, RequestPolicy, Response, Transient

__all__ = [
    "ObjectBackend",
    "check_bucket",
    "filesystem",
    "join",
    "list_under",
    "object_at",
    "prefix_at",
    "split_location",
]

#: query keys each scheme takes (anything else is refused: a typo must not be ignored)
_OPTIONS = {
    "s3": ("endpoint_override", "scheme", "region", "anonymous"),
    "gs": ("endpoint_override", "scheme", "anonymous"),
    "hdfs": ("user", "replication"),
}
#: where each store's credentials go instead of the location (a command line is kept in shell
#: history and shown to every user by ps; pyarrow would take some of them there, silently)
_CREDENTIALS = {
    "s3": "give them as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in the "
    "environment, or as a profile (AWS_PROFILE, ~/.aws/credentials)",
    "gs": "give them as GOOGLE_APPLICATION_CREDENTIALS (a service account key file) in the environment, "
    "or log in with 'gcloud auth application-default login'",
    "hdfs": "give the user as ?user=NAME, or log in with Kerberos (kinit)",
}
#: where the client takes no request timeout (GCS), a request is given up after
#: ``request_timeout_s`` for each this many bytes it asks for
BOUNDED_BYTES = 8 * 1024 * 1024
_T = TypeVar("_T")


def split_location(location: str) -> tuple[str, str, dict[str, str]]:
    """``s3://b/k?region=x`` → (``s3``, ``b/k``, ``{"region": "x"}``); ``hdfs://h:8020/p`` →
    (``hdfs``, ``h:8020/p``, {}). Refuses what cannot name an object (exit 2)."""
    parts = urllib.parse.urlsplit(location)
    shown = shown_url(location)  # messages leave the query out (it may carry more than options)
    scheme = object_store(location)
    if scheme is None:
        raise InputError(f"{shown}: not an object-store location")
    if has_credentials(location):
        raise InputError(
            f"{shown}: hframe takes no credentials in a {parts.scheme}:// location (a command line is kept "
            f"in shell history and shown by ps); {_CREDENTIALS[scheme]}"
        )
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - set(_OPTIONS[scheme]))
    if unknown:
        raise InputError(
            f"{shown}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"({scheme}:// takes {', '.join(_OPTIONS[scheme])})"
        )
    if query.get("scheme", "https") not in ("http", "https"):
        raise InputError(f"{shown}: scheme must be http or https")
    for flag in ("anonymous",):
        if flag in query:
            _flag(query[flag], f"{shown}: {flag}")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not parts.netloc or not path or path.startswith("/") or path.endswith("/") or "//" in path:
        what = "HOST:PORT/PATH" if scheme == "hdfs" else "BUCKET/KEY"
        raise InputError(f"{shown}: not an object location (expected {parts.scheme}://{what}, no empty path parts)")
    return scheme, f"{parts.netloc}/{path}", query


def join(base: str, relative: str) -> str:
    """A manifest's shard path resolved against the manifest's location; the store options in
    its query apply to the shards too."""
    if "://" in relative:
        return relative
    head, sep, query = base.partition("?")
    folder = head.rsplit("/", 1)[0]
    parts: list[str] = []
    for piece in relative.split("/"):
        if piece == "..":
            if folder.count("/") <= 3:  # scheme://bucket: a shard cannot be above the bucket
                raise InputError(f"{base}: shard {relative!r} points outside the bucket")
            folder = folder.rsplit("/", 1)[0]
        elif piece not in ("", "."):
            parts.append(piece)
    return f"{folder}/{'/'.join(parts)}" + (f"?{query}" if sep else "")


def _flag(value: str, name: str) -> bool:
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no", ""):
        return False
    raise InputError(f"{name}={value!r}: expected true or false")


def check_bucket(location: str, policy: RequestPolicy) -> None:
    """Refuse (exit 2) an s3:// or gs:// location whose bucket does not exist, before anything
    is built for it; an unreachable store is exit 3, as for reads."""
    import pyarrow.fs as pafs

    if split_location(location)[0] == "hdfs":
        return
    fs, key = object_at(location, policy)
    bucket = key.split("/", 1)[0]
    try:
        missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError as e:
        err = _classify(e)
        if not (isinstance(err, Permanent) and err.kind == "missing"):
            raise StorageError(f"{shown_url(location)}: {err}") from None
        missing = True
    if missing:
        raise InputError(f"{shown_url(location)}: the bucket {bucket} does not exist")


def _s3_endpoint(query: dict[str, str], environ: Any) -> dict[str, Any]:
    """endpoint_override and scheme: from the query, else the AWS tools' environment variables."""
    found: dict[str, Any] = {}
    url = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if url and "endpoint_override" not in query:
        parts = urllib.parse.urlsplit(url if "://" in url else f"https://{url}")
        found["endpoint_override"] = parts.netloc
        found["scheme"] = parts.scheme or "https"
    for key in ("endpoint_override", "scheme", "region"):
        if key in query:
            found[key] = query[key]
    if "anonymous" in query:
        found["anonymous"] = _flag(query["anonymous"], "anonymous")
    return found


_FILESYSTEMS: dict[tuple[Any, ...], Any] = {}
_FS_LOCK = threading.Lock()


def filesystem(scheme: str, netloc: str, query: dict[str, str], policy: RequestPolicy) -> Any:
    """One pyarrow filesystem per process, store and options (creating one sets up a client)."""
    import pyarrow.fs as pafs

    options: dict[str, Any]
    if scheme == "s3":
        options = _s3_endpoint(query, os.environ)
        key_options = tuple(sorted(options.items()))
    elif scheme == "gs":
        options = {k: v for k, v in query.items() if k != "anonymous"}
        if "anonymous" in query:
            options["anonymous"] = _flag(query["anonymous"], "anonymous")
        key_options = tuple(sorted(options.items()))
    else:
        options = dict(query)
        key_options = (("netloc", netloc), *sorted(options.items()))
    key = (os.getpid(), scheme, (*key_options, ("timeouts", policy.connect_timeout_s, policy.request_timeout_s)))
    with _FS_LOCK:
        fs = _FILESYSTEMS.get(key)
        if fs is not None:
            return fs
        if scheme == "s3":
            fs = pafs.S3FileSystem(
                **options,
                # hframe retries (remote.RequestPolicy); the SDK's own loop took 17 s on a dead endpoint
                retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
                connect_timeout=policy.connect_timeout_s,
                request_timeout=policy.request_timeout_s,
            )
        elif scheme == "gs":
            # the Google client's retry loop is bounded by time: one request's worth (0 refuses to try)
            limit = datetime.timedelta(seconds=policy.request_timeout_s)
            fs = pafs.GcsFileSystem(**options, retry_time_limit=limit)
        else:
            host, _, port = netloc.partition(":")
            try:
                fs = pafs.HadoopFileSystem(
                    host,
                    int(port or 8020),
                    user=options.get("user"),
                    replication=int(options.get("replication", 3)),
                )
            except (OSError, ValueError) as e:
                raise StorageError(
                    f"hdfs://{netloc}: cannot reach HDFS through pyarrow ({e}); it needs Hadoop's libhdfs.so "
                    "and a Java runtime (HADOOP_HOME, JAVA_HOME, ARROW_LIBHDFS_DIR, CLASSPATH)"
                ) from None
        _FILESYSTEMS[key] = fs
        return fs


def object_at(location: str, policy: RequestPolicy) -> tuple[Any, str]:
    """(pyarrow filesystem, path in it) of an object-store location."""
    scheme, path, query = split_location(location)
    netloc = path.partition("/")[0]
    return filesystem(scheme, netloc, query, policy), path if scheme != "hdfs" else "/" + path.partition("/")[2]


def prefix_at(location: str, policy: RequestPolicy) -> tuple[Any, str]:
    """(pyarrow filesystem, prefix path in it) of a prefix location: ``s3://b/p/``, ``s3://b/p``
    and ``s3://b`` (the whole bucket) are all prefixes; the rest is checked as ``split_location``
    checks an object's location."""
    parts = urllib.parse.urlsplit(location)
    path = parts.path.strip("/")
    probe = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/" + (path or "_"), parts.query, ""))
    scheme, _, query = split_location(probe)  # (scheme, credentials, options)
    if "//" in path:
        raise InputError(f"{shown_url(location)}: not a prefix (an empty path part)")
    fs = filesystem(scheme, parts.netloc, query, policy)
    if scheme == "hdfs":
        return fs, "/" + path
    return fs, f"{parts.netloc}/{path}" if path else parts.netloc


def list_under(location: str, policy: RequestPolicy) -> tuple[str, list[tuple[str, int, int]]]:
    """The objects under the prefix ``location`` (as a folder: ``s3://b/p`` and ``s3://b/p/``
    both list ``p/...``): the prefix's path in the store and, for each object, (its path
    relative to the prefix, size, modification time in ns), as the store lists them (S3:
    pages of 1,000 keys, fetched by pyarrow). Keys ending in ``/`` (folder markers) are not
    objects here. A missing prefix lists nothing; a store that fails is ``StorageError``
    (exit 3) after the policy's attempts."""
    import pyarrow.fs as pafs

    fs, base = prefix_at(location, policy)
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    attempt = 0
    while True:
        attempt += 1
        try:
            infos = fs.get_file_info(selector)
            break
        except (OSError, ValueError) as e:
            err = _classify(e)
            if isinstance(err, Permanent) and err.kind == "missing":
                return base, []
            if isinstance(err, Permanent) or attempt >= policy.attempts:
                raise StorageError(f"{shown_url(location)}: cannot list it: {err}") from None
            time.sleep(min(policy.backoff_cap_s, policy.backoff_s * 2 ** (attempt - 1)))
    cut = len(base) + 1
    found = [
        (info.path[cut:], info.size, info.mtime_ns or 0)
        for info in infos
        if info.type == pafs.FileType.File and info.path.startswith(base + "/")
    ]
    return base, found


class ObjectBackend:
    """Ranged reads of one object through ``pyarrow.fs``, for ``http.RemoteFile``.

    The object is opened once per process (one metadata request: size and ETag or generation);
    each ``get`` is one ranged GET on that handle. ``pinned`` says whether those reads are tied
    to the version opened (GCS: yes; S3, HDFS: no)."""

    def __init__(self, url: str, policy: RequestPolicy, *, key: str | None = None) -> None:
        self.url = url
        #: the object's path in the store, where ``url`` cannot name it (a key holding ``?`` or
        #: ``#``): ``url`` then only says which store (its scheme, bucket and options)
        self.key = key
        # (a bad location is refused here)
        self.pinned = (split_location(url) if key is None else prefix_at(url, policy))[0] is not None and (
            object_store(url) == "gs"
        )
        self.bounded = self.pinned  # GCS: no request timeout in the client, hframe bounds each request
        self.policy = policy
        self._lock = threading.Lock()
        self._handle: tuple[int, Any, int, str | None] | None = None  # (pid, file, size, etag)
        self._tried = threading.Event()  # an opening of the handle ended (well or not)

    def _open(self) -> tuple[Any, int, str | None, int]:
        """This process's handle on the object: (file, size, etag, requests made to get it)."""
        pid = os.getpid()
        handle = self._handle
        if handle is None or handle[0] != pid:
            with self._lock:
                handle = self._handle
                if handle is None or handle[0] != pid:  # one opening, however many threads ask
                    try:
                        fs, key = self._located()
                        f = self._within(0, None, lambda: fs.open_input_file(key))
                        self._handle = (pid, f, f.size(), _tag(f))
                    finally:
                        self._tried.set()
                    return f, f.size(), self._handle[3], 1
        return handle[1], handle[2], handle[3], 0

    def _opened_by_another(self, deadline: float | None) -> None:
        """Wait for the handle another request is opening (the first read's): a suffix range
        makes no metadata request of its own, so a failure or a retry is the first read's."""
        left = self.policy.request_timeout_s if deadline is None else deadline - time.monotonic()
        handle = self._handle
        if (handle is None or handle[0] != os.getpid()) and self._tried.wait(max(0.0, left)):
            handle = self._handle
        if handle is None or handle[0] != os.getpid():
            raise Transient("the object's size is not known (its metadata request failed or is under way)")

    #: the version tag changes with every write (S3: the ETag, the md5 of the content; GCS: the
    #: generation): a copy kept under it is that content (``kept.py``)
    versioned = True

    #: ``get`` takes a negative ``start``: the last ``length`` bytes (asked for once the
    #: handle's metadata request gave the size: a trailer asked for with the first read then
    #: costs no round trip of its own after it)
    suffix_ranges = True

    def get(
        self, start: int, length: int | None, etag: str | None, deadline: float | None = None, unless: str | None = None
    ) -> Response:
        """As ``HttpBackend.get``; ``unless``: no GET while the object's metadata (asked for
        once per process, with the handle) names that ETag or generation."""
        if deadline is not None and deadline <= time.monotonic():
            raise Transient("timed out (the deadline passed)")
        opened = 0
        try:
            if start < 0:
                self._opened_by_another(deadline)
            f, size, tag, opened = self._open()
            if etag is not None and tag != etag:
                raise Permanent("replaced", f"the object changed (its ETag is now {tag})")
            if unless is not None and tag == unless:
                return Response(b"", size, tag, requests=opened, unchanged=True)
            if length is None:
                body = self._within(size, deadline, lambda: f.read_at(size, 0)) if size else b""
            else:
                if start < 0:  # the last ``length`` bytes (the size came with the handle)
                    start = max(0, size - length)
                length = max(0, min(length, size - start))
                want = length
                body = self._within(want, deadline, lambda: f.read_at(want, start)) if want else b""
        except (OSError, ValueError) as e:
            raise _classify(e) from None
        body = bytes(body) if not isinstance(body, bytes) else body
        want = size if length is None else length
        if len(body) != want:
            raise Transient(f"body cut short: {len(body)} of {want} bytes")
        return Response(body, size, tag, requests=1 + opened)

    def version(self) -> tuple[str | None, int]:
        """(ETag or generation, size) of the object at the location now (one metadata request)."""
        try:
            fs, key = self._located()
            f = self._within(0, None, lambda: fs.open_input_file(key))
            try:
                return _tag(f), f.size()
            finally:
                f.close()
        except (OSError, ValueError) as e:
            raise _classify(e) from None

    def _located(self) -> tuple[Any, str]:
        if self.key is not None:
            return prefix_at(self.url, self.policy)[0], self.key
        return object_at(self.url, self.policy)

    def _within(self, nbytes: int, deadline: float | None, call: Callable[[], _T]) -> _T:
        """``call()`` (one request of the client), given up as ``Transient`` when it has not
        ended in ``request_timeout_s`` per ``BOUNDED_BYTES`` asked for, nor by ``deadline``, where
        the client cannot be told so (``bounded``): it then runs on, and ends, on its own thread."""
        if not self.bounded:
            return call()
        limit = self.policy.request_timeout_s * max(1, -(-nbytes // BOUNDED_BYTES))
        if deadline is not None:
            limit = min(limit, deadline - time.monotonic())
        if limit <= 0:
            raise Transient("timed out (the deadline passed)")
        done = threading.Event()
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append((True, call()))
            except BaseException as e:  # noqa: BLE001 - handed to the thread that waits
                outcome.append((False, e))
            done.set()

        threading.Thread(target=run, name="hframe-request", daemon=True).start()
        if not done.wait(limit):
            raise Transient(f"timed out (no answer in {limit:.3g} s)")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None and handle[0] == os.getpid():
            try:
                handle[1].close()
            except OSError:
                pass


def _tag(f: Any) -> str | None:
    """The version of an opened object: its S3 ETag, or its GCS generation."""
    meta = f.metadata() if hasattr(f, "metadata") else {}
    tag = meta.get("ETag") or meta.get("generation") or meta.get("etag")
    return tag.decode() if tag else None


def _classify(err: Exception) -> Exception:
    """A pyarrow error as ``Permanent`` (no retry changes it) or ``Transient`` (retried)."""
    text = str(err)
    upper = text.upper()
    if isinstance(err, ValueError):  # pyarrow.ArrowInvalid: the request itself is wrong
        return Permanent("unsupported", text.split("Detail:")[0].strip())
    short = text.split("Detail:")[0].split(" error_info=")[0].strip()
    status = re.search(r"HTTP STATUS (\d+)|\[CODE (\d+)\]|HTTP STATUS CODE: (\d+)", upper)
    code = next((int(g) for g in status.groups() if g), 0) if status else 0
    if code in (404, 410):
        return Permanent("missing", short)
    if code == 416:
        return Permanent("replaced", f"the object changed size ({short})")
    if code in (401, 403):
        return Permanent("denied", short)
    if code in (429, 503):
        return Transient(short, throttled=True)
    if isinstance(err, FileNotFoundError) or "NOT_FOUND" in upper or "NO_SUCH" in upper or "NOSUCH" in upper:
        return Permanent("missing", short)
    if "INVALID_RANGE" in upper or "INVALIDRANGE" in upper or "PAST END" in upper:
        # ranges are checked against the size found at open: the object is no longer that one
        return Permanent("replaced", f"the object changed size ({short})")
    if any(
        word in upper
        for word in ("ACCESS_DENIED", "ACCESSDENIED", "FORBIDDEN", "INVALID_ACCESS_KEY", "SIGNATURE", "PERMISSION")
    ):
        return Permanent("denied", short)
    if any(
        word in upper for word in ("SLOW_DOWN", "SLOWDOWN", "THROTTL", "[CODE 429]", "[CODE 503]", "RESOURCE_EXHAUSTED")
    ):
        return Transient(short, throttled=True)
    if any(word in upper for word in ("NETWORK_CONNECTION", "CURLCODE", "CURL ERROR", "COULD NOT CONNECT")):
        return Transient(f"connection failed: {short}")  # said as an HTTP store's is
    return Transient(short)
