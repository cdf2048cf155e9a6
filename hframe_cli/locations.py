"""Where packs live: local paths or URLs. The small rules every module that names a location
shares (no imports of hframe modules: everything may import this)."""

from __future__ import annotations

import os

__all__ = ["is_remote", "shown_url", "with_suffix"]


def is_remote(location: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` locations other than ``file://``."""
    scheme, sep, _ = os.fspath(location).partition("://")
    return bool(sep) and scheme.lower() != "file"


def shown_url(url: str) -> str:
    """A location as messages show it: a URL's query, which may hold a signature or a token, is
    left out."""
    base, sep, _ = url.partition("?")
    return f"{base}?..." if sep and "://" in base else url


def with_suffix(location: str | os.PathLike[str], suffix: str) -> str:
    """``location`` + ``suffix``; for a URL, on its path (``http://h/p.hframe?v=3`` →
    ``http://h/p.hframe.index.parquet?v=3``)."""
    loc = os.fspath(location)
    if "://" in loc and "?" in loc:
        base, _, query = loc.partition("?")
        return f"{base}{suffix}?{query}"
    return loc + suffix
