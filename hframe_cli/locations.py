"""Where packs live: local paths or URLs. The small rules every module that names a location
shares (no imports of hframe modules: everything may import this), and the one table of the
URL schemes hframe knows (``SCHEMES``): who reads each is decided here, nowhere else.

Imports inside functions: ``glob``, only where a pattern is expanded (``verify``'s start-up
imports this module)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

__all__ = [
    "SCHEMES",
    "expand_globs",
    "has_credentials",
    "is_remote",
    "object_store",
    "redact",
    "scheme_family",
    "shown_url",
    "with_suffix",
]

#: Every URL scheme hframe knows → what reads it: ``file`` (this machine), ``http``
#: (``storage/http.py``'s ``HttpBackend``), ``object:NAME`` (``pyarrow.fs``'s store NAME, through
#: ``storage/objectstore.py``), ``unsupported`` (known, not read by this release). Anything else
#: is refused as an unknown scheme.
SCHEMES: dict[str, str] = {
    "file": "file",
    "http": "http",
    "https": "http",
    "s3": "object:s3",
    "gs": "object:gs",
    "gcs": "object:gs",
    "hdfs": "object:hdfs",
    "abfs": "unsupported",
    "az": "unsupported",
}

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
#: a URL with an ``@`` in it anywhere in a text (its user info is found by ``_userinfo_end``), or a
#: remote scheme's ``scheme:/userinfo@``: a URL taken for a local path (``Path`` folds ``//``)
_USERINFO = re.compile(
    r"\b([A-Za-z][A-Za-z0-9+.-]*://|(?:"
    + "|".join(sorted({s for s in SCHEMES if s != "file"} | {"abfss"}))
    + r"):/)([^\s'\"<>]*@[^\s'\"<>]*)",
    re.IGNORECASE,
)


def is_remote(location: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` locations other than ``file://``."""
    scheme, sep, _ = os.fspath(location).partition("://")
    return bool(sep) and scheme.lower() != "file"


def scheme_family(location: str | os.PathLike[str]) -> str:
    """What reads ``location``: ``file`` for a local path or ``file://``, else ``http``,
    ``object``, ``unsupported`` (from ``SCHEMES``) or ``unknown``."""
    scheme, sep, _ = os.fspath(location).partition("://")
    if not sep:
        return "file"
    return SCHEMES.get(scheme.lower(), "unknown").partition(":")[0]


def object_store(location: str | os.PathLike[str]) -> str | None:
    """The ``pyarrow.fs`` store of an object-store location (``gcs://`` → ``gs``), else None."""
    scheme, sep, _ = os.fspath(location).partition("://")
    family, _, store = SCHEMES.get(scheme.lower(), "").partition(":")
    return store if sep and family == "object" else None


def _split(url: str) -> tuple[str, str, str] | None:
    """(scheme, authority, the rest from the path on) of a URL, or None for a local path. The
    authority runs to the first ``/``: a password holding an unencoded ``?`` or ``#`` (not
    valid, but typed) is still taken as part of it, and hidden."""
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        return None
    at = _userinfo_end(rest)
    authority, slash, path = rest[at + 1 :].partition("/")
    return scheme, rest[: at + 1] + authority, slash + path


def _userinfo_end(rest: str) -> int:
    """Where the user info of a URL ends (the index of its ``@`` in ``rest``, what follows
    ``scheme://``), or -1 when it has none. A password holding an unencoded ``/`` (common in
    AWS secret keys; not valid, but typed) is told from a path holding an ``@`` by what stands
    after the first colon: a port is digits, a password is not."""
    head = re.split(r"[?#\s'\"<>]", rest, maxsplit=1)[0]
    authority = head.partition("/")[0]
    user, colon, password = authority.partition(":")
    if colon and user and not password.isdigit() and "@" in head:
        return head.rindex("@")  # (a path holding an @ after a password is hidden with it: safe)
    if "@" in authority:
        return authority.rindex("@")
    return -1


def _hidden_userinfo(userinfo: str) -> str:
    """``alice:SECRET`` → ``alice:***``; a user name alone (often a token) → ``***``."""
    user, colon, _ = userinfo.partition(":")
    return f"{user}:***" if colon and user else "***"


def has_credentials(url: str) -> bool:
    """Whether a URL carries a user name or password (``scheme://USER:PASSWORD@HOST/...``)."""
    parts = _split(url)
    return parts is not None and "@" in parts[1]


def shown_url(url: str) -> str:
    """A location as messages and documents show it: a password is replaced by ``***``
    (``http://alice:***@host/p.hframe``; a user name without a password, often a token, is
    ``***`` too) and a URL's query, which may hold a signature or a token, is left out
    (``?...``). A local path is shown as it is."""
    parts = _split(url)
    if parts is None:
        return url
    scheme, authority, rest = parts
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        authority = f"{_hidden_userinfo(userinfo)}@{host}"
    base, sep, _ = f"{authority}{rest}".partition("?")
    return f"{scheme}://{base}?..." if sep else f"{scheme}://{base}"


def redact(text: str) -> str:
    """``text`` with the user name and password of every URL in it hidden, as ``shown_url``
    hides them (a last guard for what is printed; messages name locations by ``shown_url``)."""

    def hide(m: re.Match[str]) -> str:
        rest = m.group(2)
        at = _userinfo_end(rest)
        return m.group(0) if at < 0 else f"{m.group(1)}{_hidden_userinfo(rest[:at])}{rest[at:]}"

    return _USERINFO.sub(hide, text)


def with_suffix(location: str | os.PathLike[str], suffix: str) -> str:
    """``location`` + ``suffix``; for a URL, on its path (``http://h/p.hframe?v=3`` →
    ``http://h/p.hframe.index.parquet?v=3``)."""
    loc = os.fspath(location)
    if "://" in loc and "?" in loc:
        base, _, query = loc.partition("?")
        return f"{base}{suffix}?{query}"
    return loc + suffix


def expand_globs(patterns: Iterable[str]) -> list[str]:
    """Each pattern's matches, sorted, for shells that did not expand them; a path that exists,
    or a pattern that matches nothing, is kept as it is (so the error names it)."""
    import glob  # (and fnmatch: only where a pattern is given)

    out: list[str] = []
    for p in patterns:
        matches = sorted(glob.glob(p)) if not os.path.exists(p) and any(c in p for c in "*?[") else []
        out.extend(matches or [p])
    return out
