"""What a pack is made from: the input files found (``Source``), those left out and why
(``Rejected``), and the sorted list of both that ``inputs.collect_sources`` builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Rejected", "Source", "SourceList"]


@dataclass(frozen=True, slots=True)
class Source:
    """One input file: where to read it and the name it gets in the pack."""

    path: str
    name: bytes
    size: int
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """An input left out of the pack, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class SourceList:
    """The sorted sources and what was rejected on the way."""

    sources: list[Source] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    #: how the list was collected (folders, globs, limits): ``resume`` walks the folders again
    collect: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.sources)
