"""What a pack is made from: the input files found (``Source``), those left out and why
(``Rejected``), and the sorted list of both that ``inputs.collect_sources`` builds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
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


class SourceList:
    """The sorted sources and what was rejected on the way.

    The sources are kept as four columns (paths, names, sizes, mtimes) while they are listed,
    sorted and compared, and become ``Source`` objects only when ``sources`` is asked for (a
    pack reads them one by one). A no-op ``--update`` of 200,000 files compares the columns with
    the index and never builds the 200,000 objects.
    """

    __slots__ = ("_objects", "_paths", "_names", "_sizes", "_mtimes", "rejected", "collect")

    def __init__(
        self,
        sources: Iterable[Source] | None = None,
        rejected: list[Rejected] | None = None,
        collect: dict[str, Any] | None = None,
    ) -> None:
        # (a list given is kept, not copied, as the dataclass this once was kept it)
        self._objects: list[Source] | None = sources if isinstance(sources, list) or sources is None else list(sources)
        self._paths: list[str] = []
        self._names: list[bytes] = []
        self._sizes: list[int] = []
        self._mtimes: list[int] = []
        self.rejected: list[Rejected] = rejected if rejected is not None else []
        #: how the list was collected (folders, globs, limits): ``resume`` walks the folders again
        self.collect: dict[str, Any] = collect if collect is not None else {}

    @classmethod
    def from_columns(
        cls,
        paths: list[str],
        names: list[bytes],
        sizes: list[int],
        mtimes_ns: list[int],
        rejected: list[Rejected] | None = None,
    ) -> SourceList:
        """A list made from its columns (taken as they are, not copied)."""
        if not len(paths) == len(names) == len(sizes) == len(mtimes_ns):
            raise ValueError("the columns of a source list differ in length")
        out = cls(rejected=rejected)
        out._paths, out._names, out._sizes, out._mtimes = paths, names, sizes, mtimes_ns
        return out

    @property
    def sources(self) -> list[Source]:
        """The sources as objects (built on first use; the list may be changed in place)."""
        if self._objects is None:
            self._objects = list(map(Source, self._paths, self._names, self._sizes, self._mtimes))
            self._paths, self._names, self._sizes, self._mtimes = [], [], [], []
        return self._objects

    @sources.setter
    def sources(self, value: list[Source]) -> None:
        self._objects = value
        self._paths, self._names, self._sizes, self._mtimes = [], [], [], []

    def columns(self) -> tuple[list[str], list[bytes], list[int], list[int]]:
        """The paths, names, sizes and mtimes (ns), to read or to append to in step (the objects,
        if they were built, become columns again)."""
        if self._objects is not None:
            self._paths, self._names, self._sizes, self._mtimes = self.paths, self.names, self.sizes, self.mtimes_ns
            self._objects = None
        return self._paths, self._names, self._sizes, self._mtimes

    def source(self, k: int) -> Source:
        """Source ``k`` as an object (built for the asking when the list is held as columns)."""
        if self._objects is not None:
            return self._objects[k]
        return Source(self._paths[k], self._names[k], self._sizes[k], self._mtimes[k])

    # the four columns, to read (not to change: they may be the list's own, or copies)

    @property
    def names(self) -> list[bytes]:
        """The names, in order."""
        return [s.name for s in self._objects] if self._objects is not None else self._names

    @property
    def sizes(self) -> list[int]:
        return [s.size for s in self._objects] if self._objects is not None else self._sizes

    @property
    def mtimes_ns(self) -> list[int]:
        return [s.mtime_ns for s in self._objects] if self._objects is not None else self._mtimes

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self._objects] if self._objects is not None else self._paths

    def add(self, path: str, name: bytes, size: int, mtime_ns: int) -> None:
        """One more source, at the end."""
        if self._objects is not None:
            self._objects.append(Source(path, name, size, mtime_ns))
        else:
            self._paths.append(path)
            self._names.append(name)
            self._sizes.append(size)
            self._mtimes.append(mtime_ns)

    def extend(self, other: SourceList) -> None:
        """``other``'s sources and rejections, after these."""
        if self._objects is not None:
            self._objects.extend(other.sources)
        else:  # (``other`` read as it is held, not turned into columns)
            self._paths.extend(other.paths)
            self._names.extend(other.names)
            self._sizes.extend(other.sizes)
            self._mtimes.extend(other.mtimes_ns)
        self.rejected.extend(other.rejected)

    def __len__(self) -> int:
        return len(self._objects) if self._objects is not None else len(self._names)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SourceList):
            return NotImplemented
        return (self.names, self.paths, self.sizes, self.mtimes_ns, self.rejected, self.collect) == (
            other.names,
            other.paths,
            other.sizes,
            other.mtimes_ns,
            other.rejected,
            other.collect,
        )

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, Any]:  # (any pickle protocol: slots and no __dict__)
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return f"SourceList({len(self)} sources, {len(self.rejected)} rejected)"
