"""The request policy every remote backend is used under, and the words backends and
``http.RemoteFile`` share: ``Transient`` (retry), ``Permanent`` (do not), ``Response``.
``RequestPolicy.from_env`` reads the ``HFRAME_IO_*`` variables and ``--io-timeout``."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import InputError, StorageError
from ..signals import pending_signal

__all__ = ["Budget", "Counters", "Permanent", "RequestPolicy", "Response", "Transient", "fetched"]

_T = TypeVar("_T")


@dataclass
class RequestPolicy:
    """How requests are made and retried; one per remote file (``from_env`` reads the
    ``HFRAME_IO_*`` variables and ``--io-timeout``)."""

    attempts: int = 5  # tries of one request, the first included
    backoff_s: float = 0.1  # full jitter: sleep uniform(0, min(cap, backoff * 2**n))
    backoff_cap_s: float = 2.0
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 20.0  # the longest wait for any byte of a response
    deadline_s: float = 120.0  # one read (with its retries) as a whole
    in_flight: int = 16  # requests at once, per file
    budget: int = 50  # retry tokens: a retry costs 5 (a throttle 10), a success gives 1 back

    @classmethod
    def from_env(cls, io_timeout: float | None = None, environ: dict[str, str] | None = None) -> RequestPolicy:
        env = os.environ if environ is None else environ
        policy = cls()
        for name, attr, kind in (
            ("HFRAME_IO_TIMEOUT", "deadline_s", float),
            ("HFRAME_IO_ATTEMPTS", "attempts", int),
            ("HFRAME_IO_CONNECT_TIMEOUT", "connect_timeout_s", float),
            ("HFRAME_IO_REQUEST_TIMEOUT", "request_timeout_s", float),
            ("HFRAME_IO_IN_FLIGHT", "in_flight", int),
        ):
            value = env.get(name)
            if value:
                try:
                    setattr(policy, attr, kind(value))
                except ValueError:
                    raise InputError(f"{name}={value!r}: not a number") from None
        if io_timeout is not None:
            policy.deadline_s = io_timeout
        if policy.attempts < 1 or policy.in_flight < 1 or min(policy.deadline_s, policy.request_timeout_s) <= 0:
            raise InputError("remote I/O settings must be positive (HFRAME_IO_* / --io-timeout)")
        policy.request_timeout_s = min(policy.request_timeout_s, policy.deadline_s)
        policy.connect_timeout_s = min(policy.connect_timeout_s, policy.deadline_s)
        return policy


@dataclass
class Counters:
    """What a remote file cost: requests made (retries included), body bytes received, retries,
    and how many answers were throttles (429 or 503)."""

    requests: int = 0
    bytes: int = 0
    retries: int = 0
    throttles: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, *, requests: int = 0, nbytes: int = 0, retries: int = 0, throttles: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            self.retries += retries
            self.throttles += throttles

    def to_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes": self.bytes, "retries": self.retries, "throttles": self.throttles}


class Budget:
    """A retry budget: retries spend tokens, successes earn some back; none left, no retries."""

    def __init__(self, tokens: int) -> None:
        self.capacity = self.tokens = tokens
        self.lock = threading.Lock()

    def spend(self, cost: int) -> bool:
        with self.lock:
            if self.tokens < cost:
                return False
            self.tokens -= cost
            return True

    def earn(self) -> None:
        with self.lock:
            self.tokens = min(self.capacity, self.tokens + 1)


class Transient(Exception):
    """A failure another attempt may not meet (the backend raises it; ``RemoteFile`` retries)."""

    def __init__(self, reason: str, throttled: bool = False) -> None:
        super().__init__(reason)
        self.throttled = throttled


class Permanent(Exception):
    """A failure no retry changes: ``kind`` is ``missing`` (404), ``replaced`` (412: the ETag no
    longer matches), ``unsupported`` (the server ignores ranges) or ``denied`` (401/403, other 4xx)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


@dataclass(frozen=True)
class Response:
    """One ranged GET's answer: the body, the object's full size and its ETag."""

    body: bytes
    size: int
    etag: str | None
    requests: int = 1  # requests it took (a backend may first ask for the object's metadata)
    modified: str | None = None  # the Last-Modified header (HTTP), as sent
    #: the object is still the version ``get(unless=ETAG)`` named: no body came (HTTP 304)
    unchanged: bool = False
    #: the ETag names the object's last write only to the second, and that second is not yet
    #: past: a version written next could carry the same one (``http.tag_may_repeat``)
    tag_may_repeat: bool = False


def fetched(call: Callable[[float], _T], policy: RequestPolicy, budget: Budget, where: str) -> _T:
    """``call(deadline)`` (one request of a backend) under ``policy``: ``Transient`` failures
    retried with full-jitter backoff while attempts, the deadline and ``budget`` (shared by the
    process: a store that keeps failing ends the run) allow; ``Permanent`` ones raised as they
    are, for the caller to name. What fetches a source whole (``sources/objects.py``) uses;
    ``http.RemoteFile`` has its own loop, which also tracks a pack's version.

    Raises:
        StorageError: retries, deadline or budget exhausted (exit 3), naming ``where``.
        Permanent: the answer no retry changes.
        KeyboardInterrupt: a signal is pending (the command is stopping: nothing more is asked).
    """
    t0 = time.monotonic()
    deadline = t0 + policy.deadline_s
    attempt = 0
    while True:
        attempt += 1
        if pending_signal() is not None:
            raise KeyboardInterrupt
        try:
            result = call(deadline)
        except Transient as e:
            pause = random.uniform(0, min(policy.backoff_cap_s, policy.backoff_s * 2 ** (attempt - 1)))
            cost = 10 if e.throttled else 5
            if attempt >= policy.attempts or time.monotonic() + pause >= deadline or not budget.spend(cost):
                raise StorageError(f"{where}: {e} after {attempt} attempts in {time.monotonic() - t0:.1f} s") from None
            time.sleep(pause)
            continue
        budget.earn()
        return result
