"""Remote packs: every read one bounded ``Range`` GET, under one request policy.

``RemoteFile`` is the ``Storage`` (see ``access.py``) of a pack or index behind a URL. It is
built on a *backend* that does one ranged GET and nothing else (``HttpBackend`` here: a lean
HTTP/1.1 client, ``wire``, keep-alive connections per thread); everything a user relies on is decided
here, once, the same for every backend (``man/hframe.1``, REMOTE PACKS):

* **retries** of what can pass (5xx, 429, connection resets, timeouts, a body cut short):
  bounded attempts, exponential backoff with full jitter, and a retry budget shared by the
  file's requests, so a throttling store (503 SlowDown) gets fewer requests, not a storm;
  never of what cannot (403, 404, a replaced object);
* **timeouts**: connect, per socket operation, and a deadline for one read as a whole;
* **pinning**: the object's ETag is taken on the first request and every later one carries
  ``If-Match``, so a pack replaced by a publish is ``PackReplaced``, never another version's
  bytes; a body shorter than asked is an error, never data. An ETag that could repeat for the
  next version (nginx's, of a file written a moment ago: ``tag_may_repeat``) leaves the reads
  unpinned: the reader checks each frame's md5;
* **concurrency**: requests run on this file's worker threads, at most ``in_flight`` at once;
  the calling thread waits in short slices, so Ctrl-C ends a remote command within a second;
  once the command has a SIGINT/SIGTERM (``signals.pending_signal``), no request is started and
  no thread waits for one (a reader's threads would keep a batch's queued reads going);
* **counters**: requests, bytes, retries, throttles (``bench``, ``verify --json``).

Imports inside functions: pyarrow, only for an object store's stream; email.utils, only to read
the Date of a server whose ETags name a second (``tag_may_repeat``).
"""

from __future__ import annotations

import base64
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from ..errors import HframeError, InputError, PackReplaced, StorageError
from ..locations import scheme_family, shown_url
from ..signals import pending_signal
from .kept import Copy, KeptCopies
from .objectstore import ObjectBackend, join
from .policy import Budget, Counters, Permanent, RequestPolicy, Response, Transient
from .wire import Answer, Connection

__all__ = ["TAG_SETTLED_S", "Counters", "HttpBackend", "RemoteFile", "RequestPolicy", "remote_url", "tag_may_repeat"]

#: the first request of a file reads this much from its start: the header (and, often, a
#: dictionary record and the first frames) come with the size and ETag in one round trip
PROBE_BYTES = 64 * 1024
#: prefetched reads kept for ``read_at`` at most: beyond, the oldest are dropped
MAX_PENDING = 4096
MAX_PENDING_BYTES = 1 << 30
#: a sequential reader (verify) is served from aligned blocks of this size, several in flight
SEQUENTIAL_BLOCK = 4 * 1024 * 1024
#: an index (or other object read as a stream) up to this size is fetched in one GET
WHOLE_OBJECT_MAX = 256 * 1024 * 1024
_T = TypeVar("_T")
_WAIT_SLICE_S = 0.2  # the calling thread waits in slices this long (signals are handled between)


def remote_url(base: str, relative: str) -> str:
    """``relative`` (a shard's path in a manifest) resolved against the manifest's URL (an
    object store's options, in its query, apply to the shards too; an http(s) URL's user name
    and password, to the shards on its origin, and only there)."""
    if "://" in relative:
        return _same_origin_credentials(base, relative)
    if scheme_family(base) != "http":
        return join(base, relative)
    return urllib.parse.urljoin(base, relative)


def _same_origin_credentials(base: str, url: str) -> str:
    """``url`` with ``base``'s credentials where it names none and is on the same origin
    (scheme, host and port) as an http(s) ``base``; any other URL as it is."""
    b, u = urllib.parse.urlsplit(base), urllib.parse.urlsplit(url)
    if scheme_family(base) != "http" or "@" not in b.netloc or "@" in u.netloc:
        return url
    default = {"http": 80, "https": 443}
    try:
        same = (u.scheme.lower(), u.hostname, u.port or default.get(u.scheme.lower())) == (
            b.scheme.lower(),
            b.hostname,
            b.port or default[b.scheme.lower()],
        )
    except ValueError:  # a port that is not a number: not the same origin
        return url
    if not same:
        return url
    return urllib.parse.urlunsplit(u._replace(netloc=f"{b.netloc.rpartition('@')[0]}@{u.netloc}"))


def _basic_authorization(parts: urllib.parse.SplitResult) -> str | None:
    """The ``Authorization`` header of a URL's user name and password (HTTP Basic, RFC 7617:
    percent-decoded, UTF-8), or None when it has none."""
    if parts.username is None or (not parts.username and parts.password is None):
        return None
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def backend_for(location: str) -> Callable[[str, RequestPolicy], Any]:
    """The backend that makes a location's requests: ``HttpBackend`` for http(s), else the
    ``pyarrow.fs`` one (``objectstore.ObjectBackend``)."""
    if scheme_family(location) == "http":
        return HttpBackend

    return ObjectBackend


class HttpBackend:
    """Ranged GETs over HTTP(S) (``wire.Connection``): one keep-alive connection per thread (and
    per process: a forked child opens its own), ``TCP_NODELAY`` on."""

    def __init__(self, url: str, policy: RequestPolicy) -> None:
        parts = urllib.parse.urlsplit(url)
        if scheme_family(url) != "http" or not parts.hostname:
            raise InputError(f"{shown_url(url)}: not an http(s) URL")
        try:
            port = parts.port
        except ValueError:  # (its message would quote what stands where the port goes)
            raise InputError(
                f"{shown_url(url)}: not a valid URL: its port is not a number "
                "(in a user name or password, / ? # @ and : must be percent-encoded)"
            ) from None
        self.url = url
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.https else 80)
        #: sent on every request: the URL's user name and password (never to another host: a
        #: redirect is not followed, and a manifest's shards get them only on its origin)
        self.authorization = _basic_authorization(parts)
        self.target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self.policy = policy
        self._local = threading.local()

    def _connection(self) -> Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn  # type: ignore[no-any-return]
        conn = Connection(self.host, self.port, self.https, self.policy.connect_timeout_s)
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None

    #: ``get`` takes a negative ``start``: the last ``length`` bytes, whatever the object's size
    suffix_ranges = True

    def get(
        self, start: int, length: int | None, etag: str | None, deadline: float | None = None, unless: str | None = None
    ) -> Response:
        """``length`` bytes from ``start`` (None: the whole object, no Range header; ``start``
        < 0: the last ``length`` bytes), all of it received before ``deadline``
        (``time.monotonic()``) or ``Transient``. ``unless``: an ETag kept from before; while the
        object is that version the answer is ``unchanged``, without a body (``If-None-Match``:
        HTTP 304)."""
        resp, body = self._exchange(start, length, etag, deadline, unless)
        status = resp.status
        if status == 304 and unless is not None:
            tag = resp.getheader("ETag") or unless
            return Response(b"", -1, tag, unchanged=True, tag_may_repeat=tag_may_repeat(tag, -1, resp))
        if status == 416 and (resp.getheader("Content-Range") or "").endswith("/0"):
            # an empty object: nothing to range over
            return Response(b"", 0, resp.getheader("ETag"), modified=resp.getheader("Last-Modified"))
        failure = self._failure(resp)
        if failure is not None:
            raise failure
        encoding = (resp.getheader("Content-Encoding") or "identity").lower()
        if encoding != "identity":
            raise Permanent("unsupported", f"the server sends the object {encoding}-encoded (asked for identity)")
        return self._response(resp, body, start, length)

    def _exchange(
        self, start: int, length: int | None, etag: str | None, deadline: float | None, unless: str | None = None
    ) -> tuple[Answer, bytes]:
        """One request on this thread's connection, and its answer: the body where the status
        carries data (200, 206), else nothing (a short error body is drained so the connection
        can be reused). A connection failure or timeout is ``Transient``."""
        conn = self._connection()
        headers = {"Accept-Encoding": "identity", "User-Agent": "hframe"}
        if length is not None:  # (start < 0: the last ``length`` bytes, a suffix range)
            headers["Range"] = f"bytes=-{length}" if start < 0 else f"bytes={start}-{start + length - 1}"
        if etag is not None:
            headers["If-Match"] = etag
        if unless is not None:
            headers["If-None-Match"] = unless
        if self.authorization is not None:
            headers["Authorization"] = self.authorization

        def timeout() -> float:  # each receive: what is left of the deadline, at most the request timeout
            return self._timeout(deadline)

        reused, answered = conn.sock is not None, False
        try:
            if conn.sock is None:
                conn.connect()
            conn.request(self.target, headers)
            resp = conn.answer(timeout)
            answered = True
            if resp.status == 206 or (resp.status == 200 and (length is None or _whole_for_range(resp, start, length))):
                body = conn.body(resp, timeout)
            else:
                conn.body(resp, timeout, limit=64 * 1024)  # drain a short error body so the connection can be reused
                body = b""
        except TimeoutError as e:
            self._drop()
            raise Transient(f"timed out ({e or 'no answer'})") from None
        except OSError as e:
            self._drop()
            if reused and not answered and isinstance(e, (ConnectionResetError, BrokenPipeError)):
                # a kept-alive connection the server had closed (idle too long, or nginx after a
                # 412): the request never reached it; ask again on a new connection, once (a
                # new one is not ``reused``), as no attempt of the policy was spent
                return self._exchange(start, length, etag, deadline, unless)
            raise Transient(f"connection failed: {e.__class__.__name__}: {e}") from None
        if not resp.keep_alive or resp.status not in (200, 206, 304):
            self._drop()  # nginx closes after a 412 though its answer says keep-alive: so do we
        return resp, body

    def _failure(self, resp: Answer) -> Transient | Permanent | None:
        """What an answer's status means when it is not data (200, 206): ``Transient`` (retried:
        throttling, 5xx, 408) or ``Permanent`` (``_PERMANENT_STATUS``; any other status is a
        refusal)."""
        status = resp.status
        if status in (200, 206):
            return None
        if status in (429, 503):
            return Transient(f"HTTP {status} (throttled)", throttled=True)
        if status >= 500 or status == 408:
            return Transient(f"HTTP {status}")
        if status == 401:
            return Permanent("denied", f"HTTP 401 {resp.reason}: {self._unauthorized()}")
        kind, text = _PERMANENT_STATUS.get(status, ("denied", "HTTP {status} {reason}"))
        return Permanent(kind, text.format(status=status, reason=resp.reason, location=resp.getheader("Location")))

    def _response(self, resp: Answer, body: bytes, start: int, length: int | None) -> Response:
        """The data of a 200 or 206 answer, checked to be the bytes asked for, whole."""
        tag = resp.getheader("ETag")
        size_said = _declared_length(resp)
        if resp.status == 200 and length is not None and not _whole_for_range(resp, start, length):
            self._drop()
            raise Permanent("unsupported", "the server ignores Range requests (HTTP 200 for a byte range)")
        if length is None or resp.status == 200:
            if size_said is not None and size_said != len(body):
                raise Transient(f"body cut short: {len(body)} of {size_said} bytes")
            size = len(body)
            return Response(
                body,
                size,
                tag,
                modified=resp.getheader("Last-Modified"),
                tag_may_repeat=tag_may_repeat(tag, size, resp),
            )
        span = _content_range(resp.getheader("Content-Range"))
        if span is None:
            raise Permanent(
                "unsupported", f"no usable Content-Range in a 206 answer ({resp.getheader('Content-Range')!r})"
            )
        first, last, total = span
        if start < 0:  # a suffix range: the last bytes of an object whose size this answer says
            start = max(0, total - length)
        want = min(length, max(0, total - start))
        if first != start or last != start + want - 1:  # another range than asked for is not this data
            raise Transient(f"answered bytes {first}-{last} for {start}-{start + want - 1}")
        if len(body) != want:
            raise Transient(f"body cut short: {len(body)} of {want} bytes")
        return Response(
            body, total, tag, modified=resp.getheader("Last-Modified"), tag_may_repeat=tag_may_repeat(tag, total, resp)
        )

    def _unauthorized(self) -> str:
        if self.authorization is not None:
            return "the server refused the user name and password in the URL"
        return "the server asks for a user name and password (put USER:PASSWORD@ before the host in the URL)"

    def _timeout(self, deadline: float | None) -> float:
        left = self.policy.request_timeout_s if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        return min(self.policy.request_timeout_s, left)

    def version(self) -> tuple[str | None, int]:
        """(ETag, size) of what the URL serves now (one small request)."""
        resp = self.get(0, 1, None)
        return resp.etag, resp.size

    def close(self) -> None:
        self._drop()


#: nginx's ETag: the file's mtime in whole seconds and its size, in hex
_SECONDS_TAG = re.compile(r'"([0-9a-f]{1,15})-([0-9a-f]{1,15})"')
#: seconds the server's clock must be past a seconds-ETag's mtime for it to be trusted
TAG_SETTLED_S = 2


def tag_may_repeat(tag: str | None, size: int, resp: Answer) -> bool:
    """Whether ``tag`` could also name a version written after this answer: nginx's form
    (``"MTIME-SIZE"``, ``size`` the object's size, or -1 when the answer does not say) names
    the second of the file's last write, so another file of that size written in the same
    second gets the same ETag, and ``If-Match`` lets its bytes through. Once the server's clock
    (its Date) is ``TAG_SETTLED_S`` past that second, a file written from then on has a later
    mtime; before, it may repeat, and such a reader checks each frame's md5
    (``RemoteFile.pinned``). A file written earlier and moved in later with its mtime kept
    (``mv``, ``rsync -t``) is not caught here: hframe's publishes give every version a later
    second (``durable.later_than_replaced``); other tools must (``touch`` before the rename)."""
    m = _SECONDS_TAG.fullmatch(tag or "")
    if m is None or (size >= 0 and int(m.group(2), 16) != size):
        return False
    import email.utils  # (5 ms: only for a server with such ETags)

    try:
        now = email.utils.parsedate_to_datetime(resp.getheader("Date") or "").timestamp()
    except (TypeError, ValueError):
        return True  # (no clock to say the second is past)
    return now - int(m.group(1), 16) < TAG_SETTLED_S


#: statuses that no retry changes (a 401's words depend on whether the URL carries credentials)
_PERMANENT_STATUS = {
    404: ("missing", "HTTP 404"),
    412: ("replaced", "the object changed (HTTP 412: its ETag no longer matches)"),
    **{
        code: ("redirect", "HTTP {status}: redirected to {location}; give that URL")
        for code in (301, 302, 303, 307, 308)
    },
}


def _declared_length(resp: Answer) -> int | None:
    declared = resp.getheader("Content-Length")
    return int(declared) if declared is not None and declared.isdigit() else None


def _whole_for_range(resp: Answer, start: int, length: int) -> bool:
    """A 200 to a range from 0 (or to a suffix range) that covers a whole small object: the
    server sent all of it."""
    size_said = _declared_length(resp)
    return resp.status == 200 and start <= 0 and size_said is not None and size_said <= length


def _content_range(value: str | None) -> tuple[int, int, int] | None:
    """``bytes 0-99/1234`` → (0, 99, 1234)."""
    if not value or not value.startswith("bytes ") or "/" not in value:
        return None
    span, _, total = value[6:].partition("/")
    first, _, last = span.partition("-")
    if not (first.strip().isdigit() and last.strip().isdigit() and total.strip().isdigit()):
        return None
    return int(first), int(last), int(total)


class RemoteFile:
    """The ``Storage`` of a remote object: sized, pinned to one version, read in ranges.

    Opening makes one request (``PROBE_BYTES`` from the start; with ``whole``, all of an object
    up to ``WHOLE_OBJECT_MAX``: an index, which is read whole), which gives the size and ETag;
    ``tail`` > 0 asks at the same time for the object's last ``tail`` bytes where the backend
    takes suffix ranges (HTTP at once; an object store once the first request's metadata
    request gave the size): a pack's trailer, read right after the header, then costs no round
    trip of its own. ``read_at`` serves from the probe, the tail or
    what ``prefetch`` started when it can, else makes one GET. ``stream()`` fetches a small
    object (an index) whole, in one GET (none when the probe held all of it).
    """

    remote = True

    def __init__(
        self,
        location: str,
        *,
        policy: RequestPolicy | None = None,
        etag: str | None = None,
        backend: Callable[[str, RequestPolicy], Any] | None = None,
        whole: bool = False,
        tail: int = 0,
        kept: KeptCopies | None = None,
        **_: Any,
    ) -> None:
        self.url = location
        self.location = shown_url(location)  # in messages: a query (a signature?) is not printed
        self.policy = policy or RequestPolicy.from_env()
        self.backend = (backend or backend_for(location))(location, self.policy)
        self.counters = Counters()
        self._budget = Budget(self.policy.budget)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = -1
        self._pending: dict[tuple[int, int], Future[bytes]] = {}
        self._pending_lock = threading.Lock()
        self._sequential = False  # advise_sequential: read in blocks, ahead of the reader
        self._blocks: dict[int, Future[bytes]] = {}
        self._whole: bytes | None = None
        self.etag = etag
        self._closed = False
        self._version: tuple[str | None, int] | None = None  # (ETag, size) of the first answer
        self._gone: str | None = None  # why the version read is known to be replaced (then: no more requests)
        self._tail: Future[Response] | None = None
        self._tail_wanted = tail
        pinned = etag is not None
        #: where this open's first answers are kept (``kept.py``), and the copy found there: of
        #: an object read whole (an index: the pack's header, always fetched, must name its pack
        #: UUID), or of any object where a store's version tag changes with every write (an S3
        #: ETag, a GCS generation). An HTTP ETag may not (nginx's: mtime in seconds and size),
        #: so a pack's header over HTTP is always fetched.
        self._kept = kept if whole or getattr(self.backend, "versioned", False) else None
        self._copy = self._kept.get(location) if self._kept is not None else None
        # on a worker, as every request: a client blocked in C++ (pyarrow) would not see Ctrl-C
        try:
            started = self._executor().submit(self._request, 0, WHOLE_OBJECT_MAX if whole else PROBE_BYTES, None, True)
            if tail > 0 and getattr(self.backend, "suffix_ranges", False):
                from_copy = self._copy is not None and len(self._copy.tail) == tail
                self._tail = self._executor().submit(self._one_try, -tail, tail, from_copy)
            first = self._wait(started)
        except BaseException:
            self.close()  # no worker thread is left behind by a failed open (a dataset check's 404)
            raise
        #: the first answer came from the kept copy (the store said it is still that version)
        self.from_copy = first.unchanged
        if pinned and first.etag != etag:
            raise PackReplaced(f"{self.location}: the object was replaced (ETag {first.etag}, expected {etag})")
        # a weak ETag (W/"...") never passes If-Match (a strong comparison): such a server, or one
        # that sends none, is read unpinned (hframe.5, PUBLISHING AND READERS)
        self.etag = first.etag if first.etag and not first.etag.startswith("W/") else None
        #: the ETag could repeat for a version written next (nginx's, of a file written a moment
        #: ago): If-Match is still sent, and each frame read is checked against its md5 too
        self.tag_may_repeat = first.tag_may_repeat
        self._size = first.size
        self._probe = first.body

    # -- the request policy ------------------------------------------------------------------

    def _request(
        self, start: int, length: int | None, deadline: float | None = None, from_copy: bool = False
    ) -> Response:
        """One GET with the policy's retries (``deadline``: the end of the read it serves).
        ``from_copy``: the object's first bytes, which the kept copy holds while the store says
        it is still that version (then no body is sent)."""

        def get(until: float) -> Response:
            unless = self._copy.etag if from_copy and self._copy is not None else None
            return self._kept_answer(self.backend.get(start, length, self.etag, until, unless), tail=False)

        resp: Response = self._retried(get, deadline)
        self.counters.add(requests=resp.requests - 1, nbytes=0 if resp.unchanged else len(resp.body))
        self._same_version(resp)
        return resp

    def _one_try(self, start: int, length: int, from_copy: bool = False) -> Response:
        """One GET, not retried: a read asked for ahead of need (``tail``), whose failure only
        means the read is asked for again when it is needed, with the policy's retries.
        ``from_copy``: the object's last bytes, as ``_request``'s first ones."""
        if self._closed:  # (the open failed meanwhile: nothing more is asked)
            raise StorageError(f"{self.location}: closed while reading")
        self.counters.add(requests=1)
        unless = self._copy.etag if from_copy and self._copy is not None else None
        deadline = time.monotonic() + self.policy.request_timeout_s
        resp = self._kept_answer(self.backend.get(start, length, self.etag, deadline, unless), tail=True)
        self.counters.add(requests=resp.requests - 1, nbytes=0 if resp.unchanged else len(resp.body))
        self._same_version(resp)
        return resp

    def _kept_answer(self, resp: Response, tail: bool) -> Response:
        """An ``unchanged`` answer (the store still serves the kept version) with the copy's
        bytes, size and ETag; any other answer as it is."""
        copy = self._copy
        if not resp.unchanged or copy is None:
            return resp
        if resp.size not in (-1, copy.size):  # (the same ETag at another size: not the version kept)
            self._copy = None
            raise Transient(f"the object has the kept ETag {copy.etag} but {resp.size} bytes, not {copy.size}")
        body = copy.tail if tail else copy.head
        return Response(
            body, copy.size, copy.etag, requests=resp.requests, unchanged=True, tag_may_repeat=resp.tag_may_repeat
        )

    def keep(self) -> None:
        """Keep what this open fetched (its first bytes, and the tail asked for) under the
        object's ETag, where a kept-copies folder was given (``kept.py``): once the caller has
        checked them (a pack and the index that belongs to it). Nothing is kept from an object
        without a strong ETag (HTTP), or that came from the copy already."""
        tag = (self._version or (None, 0))[0]
        if self._kept is None or self.from_copy or not tag or tag.startswith("W/") or self._gone is not None:
            return
        tail = self._tail_bytes() if self._tail_wanted and self._tail is not None else b""
        if self._tail_wanted and len(tail) != min(self._tail_wanted, self._size):
            return
        self._kept.put(self.url, Copy(tag, self._size, self._probe, tail))

    def forget_copy(self) -> None:
        """Drop this object's kept copy (what it held does not belong with what the store serves)."""
        if self._kept is not None:
            self._kept.forget(self.url)

    def _retried(self, call: Callable[[float], _T], deadline: float | None = None) -> _T:
        """``call(deadline)`` (one request of the backend) with the policy's retries; its
        ``Transient`` and ``Permanent`` failures as hframe errors naming the location."""
        policy = self.policy
        t0 = time.monotonic()
        deadline = deadline if deadline is not None else t0 + policy.deadline_s
        attempt = 0
        while True:
            attempt += 1
            if self._closed:
                raise StorageError(f"{self.location}: closed while reading")
            if pending_signal() is not None:  # the command is stopping: the store is not asked again
                raise KeyboardInterrupt
            if self._gone is not None:  # every later answer would be a refusal (412) or another version
                raise PackReplaced(self._gone)
            self.counters.add(requests=1)
            try:
                result = call(deadline)
            except Transient as e:
                self.counters.add(throttles=int(e.throttled))
                pause = random.uniform(0, min(policy.backoff_cap_s, policy.backoff_s * 2 ** (attempt - 1)))
                if attempt >= policy.attempts:
                    why = ""
                elif time.monotonic() + pause >= deadline:
                    why = f" (the {policy.deadline_s:g} s deadline of this read was reached)"
                elif not self._budget.spend(10 if e.throttled else 5):
                    why = " (retry budget spent: the store keeps failing)"
                else:
                    self.counters.add(retries=1)
                    time.sleep(pause)
                    continue
                if self._gone is not None:  # another request of this file learnt meanwhile that the
                    raise PackReplaced(self._gone) from None  # version is gone: that is the answer
                raise StorageError(
                    f"{self.location}: {e} after {attempt} attempt{'s' if attempt > 1 else ''} "
                    f"in {time.monotonic() - t0:.1f} s{why}"
                ) from None
            except Permanent as e:
                if e.kind == "missing" and self._version is not None:  # it was there when opened
                    raise self._replaced(
                        f"{self.location}: the object was removed or replaced since this reader opened it ({e}); "
                        "open it again"
                    ) from None
                if e.kind == "missing":
                    raise InputError(f"{self.location}: no such file ({e})") from None
                if e.kind == "replaced":
                    raise self._replaced(
                        f"{self.location}: the pack was replaced since this reader opened it ({e}); open it again"
                    ) from None
                if e.kind in ("unsupported", "redirect"):
                    raise InputError(f"{self.location}: {e}") from None
                raise StorageError(f"{self.location}: {e}") from None
            self._budget.earn()
            return result

    def _same_version(self, resp: Response) -> None:
        """Every answer must come from the version the first one did: same size, same ETag (weak
        ones too). The If-Match header makes a strong-ETag server refuse another version (412);
        this catches the rest, where a server has no strong ETag to match."""
        if self._version is None:
            self._version = (resp.etag, resp.size)
            return
        etag, size = self._version
        if resp.size != size or (etag is not None and resp.etag is not None and resp.etag != etag):
            raise self._replaced(
                f"{self.location}: the pack was replaced since this reader opened it (now {resp.size} bytes, "
                f"ETag {resp.etag}; it was {size} bytes, ETag {etag}); open it again"
            )

    def _replaced(self, message: str) -> PackReplaced:
        """``PackReplaced``, remembered: the version this file reads is gone, so its later reads
        (and those that failed meanwhile for another reason) are ``PackReplaced`` too, at once."""
        if self._gone is None:
            self._gone = message
        return PackReplaced(message)

    def widen(self, in_flight: int) -> None:
        """Allow up to ``in_flight`` requests at once from now on (never fewer than the policy's):
        a reader that fetches ahead for others (the sampler's read-ahead) keeps more in flight."""
        with self._pending_lock:
            if in_flight > self.policy.in_flight:
                self.policy.in_flight = in_flight
                self._pool = None  # (the next request makes the wider pool; the old one's threads finish)

    def _executor(self) -> ThreadPoolExecutor:
        pid = os.getpid()
        if self._pool is None or self._pool_pid != pid:
            self._pool = ThreadPoolExecutor(self.policy.in_flight, thread_name_prefix="hframe-remote")
            self._pool_pid = pid
            self._pending, self._blocks = {}, {}
        return self._pool

    def _submit(self, offset: int, length: int, deadline: float) -> Future[bytes]:
        return self._executor().submit(lambda: self._request(offset, length, deadline).body)

    def _wait(self, future: Future[_T]) -> _T:
        """The future's result, waited for in short slices (a signal handler runs between; on
        a thread that is not the main one, a signal the command received ends the wait)."""
        while True:
            if pending_signal() is not None:
                raise KeyboardInterrupt
            try:
                return future.result(timeout=_WAIT_SLICE_S)
            except FutureTimeout:
                continue

    # -- Storage -------------------------------------------------------------------------------

    def generation(self) -> str:
        """What names the version read: the ETag of the first answer (weak ones too), else ""."""
        return (self._version or (None, 0))[0] or ""

    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (short only at the end of the object)."""
        length = max(0, min(length, self._size - offset))
        if length == 0 or offset < 0:
            return b""
        if offset + length <= len(self._probe):
            return self._probe[offset : offset + length]
        if self._tail is not None:
            tail = self._tail_bytes()
            if tail and offset >= self._size - len(tail):
                at = offset - (self._size - len(tail))
                return tail[at : at + length]
        if self._sequential:
            return self._read_blocks(offset, length)
        with self._pending_lock:
            future = self._pending.pop((offset, length), None)
        if future is None or (future.done() and future.exception() is not None):
            # not started, or failed before anyone asked (a burst of errors since passed): ask now
            future = self._submit(offset, length, time.monotonic() + self.policy.deadline_s)
        return self._wait(future)

    def _tail_bytes(self) -> bytes:
        """The object's last bytes asked for with the probe; b"" when that request failed (the
        read then asks for its range as any other, and meets the failure again, or not)."""
        tail = self._tail
        if tail is None:
            return b""
        try:
            resp = self._wait(tail)
        except (HframeError, Transient, Permanent):
            self._tail = None
            return b""
        if resp.size != self._size:  # (another version: ``_same_version`` raised already)
            self._tail = None
            return b""
        return resp.body

    def _read_blocks(self, offset: int, length: int) -> bytes:
        """A sequential reader's range, from aligned ``SEQUENTIAL_BLOCK`` blocks: the blocks it
        needs and the next ``ahead`` ones are requested at once; blocks behind it are let go."""
        block = SEQUENTIAL_BLOCK
        first, last = offset // block, (offset + length - 1) // block
        ahead = max(1, self.policy.in_flight // 2)
        deadline = time.monotonic() + self.policy.deadline_s
        blocks = self._blocks
        for b in list(blocks):
            if b < first:
                del blocks[b]
        for b in range(first, min(last + ahead, (self._size - 1) // block) + 1):
            if b not in blocks:
                start = b * block
                blocks[b] = self._submit(start, min(block, self._size - start), deadline)
        # the range's piece of each block, as views: the one copy is the join into the bytes returned
        end = offset + length
        views = []
        for b in range(first, last + 1):
            data = self._wait(blocks[b])
            lo, hi = max(offset - b * block, 0), min(end - b * block, len(data))
            if first == last and lo == 0 and hi == len(data):
                return data  # a whole block: itself, not a copy
            views.append(memoryview(data)[lo:hi])
        return views[0].tobytes() if len(views) == 1 else b"".join(views)

    def preader(self) -> Callable[[int, int], bytes]:
        """``pread(length, offset)`` as ``read_at``: errors are already hframe errors."""
        return lambda length, offset: self.read_at(offset, length)

    def prefetch(self, offsets: Sequence[int], lengths: Sequence[int]) -> None:
        """Start these reads now, ``in_flight`` at a time; ``read_at`` of the same ranges waits
        for them instead of asking again."""
        deadline = time.monotonic() + self.policy.deadline_s
        with self._pending_lock:
            # reads started earlier and never asked for (a caller that stopped early) are let go,
            # oldest first, to make room (in count and in bytes): this batch's are all kept
            room = sum(lengths)
            held = sum(k[1] for k in self._pending)
            for key in list(self._pending):
                if len(self._pending) + len(offsets) <= MAX_PENDING and held + room <= MAX_PENDING_BYTES:
                    break
                self._pending.pop(key).cancel()
                held -= key[1]
            for off, ln in zip(offsets, lengths):
                ln = max(0, min(ln, self._size - off))
                if ln and (off, ln) not in self._pending and off + ln > len(self._probe):
                    self._pending[(off, ln)] = self._submit(off, ln, deadline)

    def advise_sequential(self, start: int) -> None:
        """The caller will read on from ``start``: serve it from blocks read ahead (``_read_blocks``)."""
        self._sequential = True

    @property
    def block_size(self) -> int | None:
        """Once ``advise_sequential`` was called, the aligned block size reads are served from:
        a read of exactly one block returns the block received, without a copy."""
        return SEQUENTIAL_BLOCK if self._sequential else None

    def read_all(self) -> bytes:
        """The whole object (one GET up to ``WHOLE_OBJECT_MAX``, else in ranges), kept."""
        if self._whole is None:
            if self._size <= len(self._probe):
                self._whole = self._probe[: self._size]
            elif self._size <= WHOLE_OBJECT_MAX:
                resp = self._wait(self._executor().submit(lambda: self._request(0, None).body))
                if len(resp) != self._size:
                    raise StorageError(f"{self.location}: got {len(resp)} bytes, the object has {self._size}")
                self._whole = resp
            else:
                self._whole = self.read_at(0, self._size)
        return self._whole

    def stream(self) -> Any:
        """A file object over the whole object (fetched once): what pyarrow's Parquet reader wants."""
        import pyarrow as pa

        return pa.BufferReader(self.read_all())

    def is_at_path(self) -> bool:
        """Whether the URL still serves the version this handle pinned (one small request, retried
        as a read is). A store that cannot say (unreachable, denying) is not a sign of another
        version: that failure is raised (``StorageError``), as a read's would be."""
        if self._gone is not None:
            return False
        try:
            now = self._wait(self._executor().submit(self._retried, lambda _: self.backend.version()))
        except (PackReplaced, InputError):  # gone (404), or no longer an object hframe can read
            return False
        return self._version is not None and now == self._version

    def read_current(self, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` of what the URL serves now, whatever version that is
        (one request without ``If-Match``, none of it from what this handle holds): what tells
        two versions with one ETag apart (``tag_may_repeat``)."""

        def call(deadline: float) -> bytes:
            return bytes(self.backend.get(start, length, None, deadline).body)

        body: bytes = self._wait(self._executor().submit(self._retried, call))
        return body

    @property
    def pinned(self) -> bool:
        """Whether every read is tied to the version first read (If-Match with a strong ETag, or
        a store that pins it itself); where not, readers check each frame's md5."""
        return bool(getattr(self.backend, "pinned", True)) and self.etag is not None and not self.tag_may_repeat

    def close(self) -> None:
        self._closed = True  # a request under way on a worker stops at its next attempt
        pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown(wait=False, cancel_futures=True)
        self._pending, self._blocks = {}, {}
        self.backend.close()

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # what LocalFile offers for handles that move between processes: a remote handle is pinned
    # by its ETag instead, which a spawned worker checks when it opens the URL again
    origin: tuple[int, int, int, int] | None = None
    identity = None
    same_generation: Callable[[int], None] | None = None
    alternates: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, object]:
        return {"location": self.url, "etag": self.etag}

    def __setstate__(self, state: dict[str, object]) -> None:
        etag = state.get("etag")
        self.__init__(str(state["location"]), etag=str(etag) if etag else None)  # type: ignore[misc]
