"""Listing a big tree on several processes.

One process lists about 150,000 small files a second: a ``stat`` per file and the Python objects
around it, all under the GIL. ``walk_in_parallel`` cuts the walk into units in the order one
walk takes them (a folder's files in slices, then its subfolders in name order), forks helpers
that take units from a shared queue while this process takes them too, and adds what each unit
found in unit order. So the sources, the rejections and their order, and the first error
without ``--skip-bad`` are those of the one-process walk (``inputs._Collector.walk``). A helper
that dies leaves its units to this process; a fork that fails leaves them all.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import operator
import os
import pickle
import signal
import struct
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from ..faults import fault_point
from ..processes import (
    fork_helper,
    fork_is_safe,
    pipe_with_room,
    reap,
    receive_message,
    send_message,
    signals_held,
    usable_cpus,
    write_all,
)
from .sourcelist import Rejected, SourceList

__all__ = ["PARALLEL_LIST_MIN", "Folder", "Walker", "sorted_entries", "walk_in_parallel"]

#: a folder to walk: its path, the name prefix of its files, and the (dev, ino) of it and the
#: folders above it (a symlink back to one of them is a loop)
Folder = tuple[str, str, tuple[tuple[int, int], ...]]


class Walker(Protocol):
    """What walks a tree one folder at a time (``inputs._Collector``): found files and rejections
    go to ``out``; with ``skip_bad`` off, the first rejection raises ``InputError``."""

    out: SourceList

    def walk(self, stack: list[Folder]) -> None: ...

    def add_entries(self, folder: Folder, entries: Iterable[os.DirEntry[str]], stack: list[Folder]) -> None: ...

    def subfolder(self, folder: Folder, entry: os.DirEntry[str], reject: bool = True) -> Folder | tuple[()] | None: ...


#: a tree estimated to hold fewer files than this is listed by one process (forking costs a few ms)
PARALLEL_LIST_MIN = 20_000
_MAX_WORKERS = 8  # stat is quick on a local disk; on NFS more would help, but stay a good neighbour
_SLICE = 4096  # files of one folder per unit
_LEVELS = 3  # folders below the top cut into units at most this deep
_INDEX = struct.Struct("<I")
_PIPE_BYTES = 1 << 20  # room for the queue of units (four bytes each)


@dataclass
class _Unit:
    folder: Folder
    #: some of ``folder``'s entries (files, and folders to reject), or None for its whole tree
    entries: list[os.DirEntry[str]] | None = None


_Found = tuple[SourceList, "Exception | None"]  # sources and rejections, the error it stopped at


def sorted_entries(folder: str) -> list[os.DirEntry[str]]:
    """The entries of ``folder`` in the order every walk takes them, by name (raises OSError):
    the one order the units are cut in and the walk of one process adds them in."""
    with os.scandir(folder) as it:
        return sorted(it, key=_ENTRY_NAME)


_ENTRY_NAME = operator.attrgetter("name")


def walk_in_parallel(col: Walker, top: Folder) -> bool:
    """Walk ``top`` into ``col`` as ``col.walk([top])`` would, on several processes when the tree
    is big and forking is safe; False (nothing done) when this process alone should walk it."""
    workers = min(usable_cpus(), _MAX_WORKERS)
    if workers < 2 or not hasattr(os, "fork"):
        return False
    units = [_Unit(top)]
    for _ in range(_LEVELS):
        if sum(u.entries is None for u in units) >= 4 * workers:
            break
        units = [part for u in units for part in _cut(col, u)]
    if len(units) < 2 or _estimate(units) < PARALLEL_LIST_MIN or not fork_is_safe():
        found = [_found_by(col, u) for u in units]  # the same walk, in the same order, here
    else:
        found = _found_forked(col, units, workers)
    for unit_found, error in found:
        col.out.extend(unit_found)
        if error is not None:
            raise error  # the one the walk would have met first, whichever process met it
    return True


def _cut(col: Walker, unit: _Unit) -> list[_Unit]:
    """A whole-tree unit as the units one walk of it takes in order: its files (and the folders
    it will reject) in slices, then its subfolders' trees in name order. A folder that cannot be
    listed is left whole (the walk rejects it in its turn)."""
    if unit.entries is not None:
        return [unit]
    try:
        entries = sorted_entries(unit.folder[0])
    except OSError:
        return [unit]
    rest: list[os.DirEntry[str]] = []
    trees: list[_Unit] = []
    for entry in entries:
        sub = col.subfolder(unit.folder, entry, reject=False)
        if sub:
            trees.append(_Unit(sub))
        else:
            rest.append(entry)
    slices = [_Unit(unit.folder, rest[i : i + _SLICE]) for i in range(0, len(rest), _SLICE)]
    return slices + trees


def _estimate(units: list[_Unit]) -> int:
    """Roughly how many files the units hold: those listed, and each tree not yet listed counted
    at the mean size of three (first, middle, last) by their entries, without a stat."""
    files = sum(len(u.entries) for u in units if u.entries is not None)
    trees = [u for u in units if u.entries is None]
    sample = {trees[i].folder[0] for i in (0, len(trees) // 2, -1)} if trees else set()
    sizes = []
    for folder in sample:
        with contextlib.suppress(OSError):
            sizes.append(len(os.listdir(folder)))
    return files + (len(trees) * sum(sizes) // len(sizes) if sizes else 0)


def _found_by(col: Walker, unit: _Unit) -> _Found:
    """Walk one unit into a fresh list: what it found, and the error it stopped at."""
    saved, col.out = col.out, SourceList()
    error = None
    try:
        if unit.entries is None:
            col.walk([unit.folder])
        else:
            stack: list[Folder] = []
            col.add_entries(unit.folder, unit.entries, stack)
            col.walk(stack)  # a file that became a folder since it was listed
    except Exception as e:  # noqa: BLE001 - a bad input without --skip-bad, the output inside the
        error = e  # tree, anything unforeseen: raised in its turn, as the one walk would raise it
    finally:
        found, col.out = col.out, saved
    return found, error


def _found_forked(col: Walker, units: list[_Unit], workers: int) -> list[_Found]:
    """Each unit's findings, walked by ``workers - 1`` forked helpers and this process, which all
    take unit numbers from one pipe written in full beforehand."""
    found: list[_Found | None] = [None] * len(units)
    queue_r, queue_w = pipe_with_room(_PIPE_BYTES)
    try:
        room = fcntl.fcntl(queue_w, fcntl.F_GETPIPE_SZ)
    except (OSError, AttributeError):
        room = 1 << 16
    if len(units) * _INDEX.size > room:  # so many units that writing them all would block
        os.close(queue_r)
        os.close(queue_w)
        return [_found_by(col, u) for u in units]
    write_all(queue_w, b"".join(_INDEX.pack(i) for i in range(len(units))))
    os.close(queue_w)
    helpers: list[tuple[int, int]] = []  # pid, the pipe it answers on
    try:
        for _ in range(workers - 1):
            r, w = os.pipe()
            with signals_held():  # a signal is taken only once the finally below knows the helper
                pid = fork_helper(functools.partial(_helper, col, units, queue_r, w), queue_r, w)
                os.close(w)
                if pid < 0:  # a limit on processes: fewer helpers, or this process alone
                    os.close(r)
                    break
                helpers.append((pid, r))
        for i in _taken(queue_r):
            found[i] = _found_by(col, units[i])
        while helpers:
            pid, r = helpers[0]
            for i, unit_found in _answers(r, len(units)):
                found[i] = unit_found
            os.close(r)
            reap(pid)
            helpers.pop(0)
    finally:
        os.close(queue_r)
        for pid, r in helpers:  # interrupted: the helpers go too
            os.close(r)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            reap(pid)
    # a helper that died took its units with it: they are walked here
    return [f if f is not None else _found_by(col, units[i]) for i, f in enumerate(found)]


def _taken(queue: int) -> Iterator[int]:
    """Unit numbers taken from the queue until it is empty (each read takes one whole number:
    they were all written before any reader started)."""
    while True:
        raw = os.read(queue, _INDEX.size)
        if len(raw) != _INDEX.size:
            return
        yield _INDEX.unpack(raw)[0]


def _helper(col: Walker, units: list[_Unit], queue: int, answer: int) -> None:
    """In a forked helper: walk the units taken from the queue, then send what each found as one
    message (a pickle of columns: paths and names each joined by NULs, which no path holds,
    sizes and mtimes as arrays). One message at the end, not one per unit: the parent reads only
    once it has no units left to walk, and a full pipe would hold the helper back until then."""
    answers = []
    for i in _taken(queue):
        fault_point("listing-helper")
        unit_found, error = _found_by(col, units[i])
        paths, names, sizes, mtimes = unit_found.columns()
        answers.append(
            (
                i,
                len(names),
                "\0".join(paths),
                b"\0".join(names),
                array("q", sizes),
                array("q", mtimes),
                [(r.path, r.reason) for r in unit_found.rejected],
                error,
            )
        )
    send_message(answer, pickle.dumps(answers, pickle.HIGHEST_PROTOCOL))


def _answers(fd: int, count: int) -> list[tuple[int, _Found]]:
    """What the helper on ``fd`` found, by unit number; nothing if it died or sent garbage."""
    body = receive_message(fd)
    if body is None:
        return []
    try:
        out: list[tuple[int, _Found]] = []
        for i, n, paths, names, sizes, mtimes, rejected, error in pickle.loads(body):
            if not (isinstance(i, int) and 0 <= i < count):
                return []
            found = SourceList.from_columns(
                paths.split("\0") if n else [],
                names.split(b"\0") if n else [],
                sizes.tolist(),
                mtimes.tolist(),
                [Rejected(*r) for r in rejected],
            )
            if len(found) != n:
                return []
            out.append((i, (found, error)))
        return out
    except Exception:  # noqa: BLE001 - a broken answer: its units are walked here
        return []
