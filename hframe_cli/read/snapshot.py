"""Opening one pack generation: the pack and the index that belongs to it, as one snapshot.

A publish renames ``PACK.partial`` over the pack, then ``INDEX.partial`` over the index
(``man/hframe.5``, PUBLISHING AND READERS). Everything that reads a pack and its index together
(``PackReader``, ``verify``, ``dump-header``) opens them here, so it never mixes two generations
and never fails in the moment between the renames; a reader reopened in another process (or
after ``close()``) accepts only the generation it held (``generation_checks``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import FormatError, HframeError, InputError, PackReplaced, StorageError
from ..format.index import IndexMeta, format_time_us, read_index_meta
from ..format.layout import HEADER_SIZE, TRAILER_SIZE, Header, Trailer
from ..locations import is_remote
from ..names import partial_name
from ..storage.access import LocalFile, Storage, open_storage, opening_ahead, unpinned_and_moved
from ..storage.kept import KeptCopies

T = TypeVar("T")

__all__ = [
    "OPEN_ATTEMPTS",
    "Overtaken",
    "PackInfo",
    "generation_checks",
    "open_generation",
    "open_hints",
    "pinned_index",
    "read_pack_info",
    "replaced_since",
    "until_settled",
]


@dataclass(frozen=True)
class PackInfo:
    """What the header and trailer of a complete pack say."""

    path: str
    header: Header
    trailer: Trailer
    size: int

    @property
    def uuid(self) -> str:
        return str(self.header.uuid)

    @property
    def pack_time(self) -> str:
        return format_time_us(self.header.created_us)


def read_pack_info(storage: Storage) -> PackInfo:
    """Read and validate the header and trailer of the pack behind ``storage``."""
    where = storage.location
    size = storage.size()
    header = Header.decode(storage.read_at(0, HEADER_SIZE), where)
    tail = storage.read_at(size - TRAILER_SIZE, TRAILER_SIZE) if size >= TRAILER_SIZE else b""
    trailer = Trailer.decode(tail, size, header, where)
    return PackInfo(where, header, trailer, size)


def replaced_since(storage: Storage, uuid: str) -> bool:
    """Whether the object behind ``storage`` is no longer the pack ``uuid`` it was opened as:
    one whose reads are not pinned and that changed since (``unpinned_and_moved``), or a remote
    one whose header names another pack now (one request without ``If-Match``: an ETag may
    name two versions, nginx's: ``http.tag_may_repeat``). Asked after a check failed, never
    before. A store that cannot say raises ``StorageError``, as a read's failure would."""
    if unpinned_and_moved(storage):
        return True
    read_current = getattr(storage, "read_current", None)
    if read_current is None:  # (a local file: its reads are of the file opened)
        return False
    try:
        head = read_current(0, HEADER_SIZE)
    except (PackReplaced, InputError):  # (removed since, or already known gone; no longer an object to read)
        return True
    try:
        return str(Header.decode(head, storage.location).uuid) != uuid
    except FormatError:  # (no pack header there now: another object)
        return True


#: What a remote open fetches with its first request (``RemoteFile``): a pack's trailer too
#: (read right after its header), an index whole (it is read whole): one round trip for both
#: (``open_pack`` makes theirs at once, ``storage.access.opening_ahead``)
PACK_OPEN: dict[str, Any] = {"tail": TRAILER_SIZE}
INDEX_OPEN: dict[str, Any] = {"whole": True}


def open_hints(kept: KeptCopies | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a remote pack's open and its index's fetch with their first requests
    (``PACK_OPEN``, ``INDEX_OPEN``), and where copies of those answers are kept (``kept``:
    ``storage/kept.py``; the node cache's, for a reader with one)."""
    if kept is None:
        return PACK_OPEN, INDEX_OPEN
    return {**PACK_OPEN, "kept": kept}, {**INDEX_OPEN, "kept": kept}


#: How often ``open_generation`` looks again when the pack or index at the path changed while it
#: was opening them (a publish under way); each look is a few syscalls, with a short pause between.
OPEN_ATTEMPTS = 10


def open_generation(
    path: str, index_path: str, snapshot: dict[str, Any] | None = None, kept: KeptCopies | None = None
) -> tuple[Storage, PackInfo, Storage, IndexMeta]:
    """Open one pack generation: the pack, and the index that belongs to it (``man/hframe.5``,
    PUBLISHING AND READERS).

    A publish renames ``PACK.partial`` over the pack, then ``INDEX.partial`` over the index.
    Whenever the pair at the paths does not match, this finds the matching pair instead of
    failing: the new pack with ``INDEX.partial`` (between the two renames, or after a writer died
    there), or, when the pack at the path changed since it was opened, both again. Only a pair
    that stays put and does not match is an ``IndexMismatch`` (a genuinely stray index).

    ``snapshot`` (from an unpickled reader) names the generation wanted: the one its parent held,
    reached through the parent's open files where possible; another generation is refused.

    ``kept``: a remote pack's and index's first answers are taken from these copies while the
    store says the objects are still the versions kept, and kept there once the pair opened
    (``storage/kept.py``). A pair from copies that does not open (copies that do not belong
    together) is opened again from the store, the copies dropped.

    Returns:
        (pack handle, its header and trailer, index handle, index metadata).
    """
    pack_hints, index_hints = open_hints(kept)
    if snapshot is not None:
        return _reopen_generation(path, index_path, snapshot, pack_hints, index_hints, kept)

    def attempt() -> tuple[Storage, PackInfo, Storage, IndexMeta]:
        storage = open_storage(path, **pack_hints)
        try:
            info = read_pack_info(storage)
            index, meta = pinned_index(storage, index_path, {info.uuid}, index_hints)
        except FormatError:
            try:
                replaced = unpinned_and_moved(storage)  # (a store that cannot say raises StorageError)
            finally:
                storage.close()
            if replaced:  # its reads met a newer object than its size came from: open it again
                raise Overtaken from None
            raise
        except BaseException:
            storage.close()
            raise
        try:
            meta.check_pack(info.uuid, info.size, info.trailer.frame_count, index_path)  # a stray index
        except BaseException:
            index.close()
            storage.close()
            raise
        return storage, info, index, meta

    return until_settled(_kept_by(attempt, kept, path, index_path), index_path)


def _kept_by(
    attempt: Callable[[], tuple[Storage, PackInfo, Storage, IndexMeta]],
    kept: KeptCopies | None,
    *locations: str,
) -> Callable[[], tuple[Storage, PackInfo, Storage, IndexMeta]]:
    """``attempt`` (an open of a pack and its index), whose answers are kept in ``kept`` once
    it opened; one that fails while copies of ``locations`` are kept drops them and is made
    again (``Overtaken``): copies are never the reason an open fails."""
    if kept is None:
        return attempt

    def kept_attempt() -> tuple[Storage, PackInfo, Storage, IndexMeta]:
        try:
            opened = attempt()
        except (HframeError, Overtaken):  # (a copy of another size than the object's looks moved)
            held = [loc for loc in locations if kept.holds(loc)]
            if not held:
                raise
            for loc in held:
                kept.forget(loc)
            raise Overtaken from None
        for storage in (opened[0], opened[2]):
            keep = getattr(storage, "keep", None)
            if keep is not None:
                keep()
        return opened

    return kept_attempt


def until_settled(attempt: Callable[[], T], where: str) -> T:
    """``attempt()``, tried again (at most ``OPEN_ATTEMPTS`` times, a few ms apart) while it
    raises ``Overtaken``: a publish replaced the pack while it was being opened.

    Raises:
        StorageError: it kept being overtaken (something republishes in a tight loop).
    """
    for n in range(OPEN_ATTEMPTS):
        if n:
            time.sleep(min(0.05, 0.001 * (2**n)))
        try:
            return attempt()
        except Overtaken:
            continue
    raise StorageError(
        f"{where}: pack and index kept changing while being opened ({OPEN_ATTEMPTS} attempts); "
        "is something republishing it in a loop?"
    )


def generation_checks(
    path: str, index_path: str, want: str, size: int
) -> tuple[Callable[[int], None], Callable[[int], None], Callable[[str], PackReplaced]]:
    """Checks that a file opened again by path (``Storage.same_generation``) is the pack, or
    the index, of generation ``want``; they raise ``PackReplaced`` naming both UUIDs if not."""

    def replaced(now: str) -> PackReplaced:
        return PackReplaced(
            f"{path}: the pack was replaced since this reader was opened (it holds pack {want}, the path "
            f"now has {now}), and the old one cannot be reached from this process; open the pack again"
        )

    def same_pack(fd: int) -> None:
        try:
            head = Header.decode(os.pread(fd, HEADER_SIZE, 0), path)
        except FormatError:
            raise replaced("a file that is not a complete pack") from None
        if str(head.uuid) != want or os.fstat(fd).st_size != size:
            raise replaced(f"pack {head.uuid}")

    def same_index(fd: int) -> None:
        with os.fdopen(os.dup(fd), "rb") as f:
            try:
                meta = read_index_meta(index_path, stream=f)
            except (FormatError, InputError):
                raise replaced("an unreadable index") from None
        if meta.pack_uuid != want or meta.pack_bytes != size:
            raise replaced(f"an index of pack {meta.pack_uuid}")

    return same_pack, same_index, replaced


def _reopen_generation(
    path: str,
    index_path: str,
    snapshot: dict[str, Any],
    pack_hints: dict[str, Any],
    index_hints: dict[str, Any],
    kept: KeptCopies | None,
) -> tuple[Storage, PackInfo, Storage, IndexMeta]:
    """The generation an unpickled reader's parent held: through the parent's open files while
    it lives (``/proc/PID/fd``), else by path if the path still holds the same generation."""
    want, size = snapshot["uuid"], snapshot["size"]
    same_pack, same_index, replaced = generation_checks(path, index_path, want, size)
    location = snapshot.get("index_location") or index_path
    if is_remote(path):  # pinned by the checks below; pack and index asked for at once

        def attempt() -> tuple[Storage, PackInfo, Storage, IndexMeta]:
            with opening_ahead([path, location], {path: pack_hints, location: index_hints}):
                return _reopen_from(path, index_path, location, want, pack_hints, index_hints, same_index, replaced)

        return until_settled(_kept_by(attempt, kept, path, location), index_path)
    pack_options = {"origin": snapshot.get("pack"), "same_generation": same_pack}
    index_options = {"origin": snapshot.get("index"), "same_generation": same_index}
    return _reopen_from(path, index_path, location, want, pack_options, index_options, same_index, replaced)


def _reopen_from(
    path: str,
    index_path: str,
    location: str,
    want: str,
    pack_options: dict[str, Any],
    index_options: dict[str, Any],
    same_index: Callable[[int], None],
    replaced: Callable[[str], PackReplaced],
) -> tuple[Storage, PackInfo, Storage, IndexMeta]:
    storage = open_storage(path, **pack_options)
    try:
        info = read_pack_info(storage)
        if info.uuid != want:
            raise replaced(f"pack {info.uuid}")
        try:
            index = open_storage(location, **index_options)
        except InputError:  # e.g. it was opened as INDEX.partial, since renamed: the path now
            index = open_storage(index_path, **INDEX_OPEN)
            try:
                if isinstance(index, LocalFile):  # a remote index is checked by its metadata below
                    same_index(index.fileno())
            except BaseException:
                index.close()
                raise
        try:
            meta = read_index_meta(index_path, stream=index.stream())
            meta.check_pack(info.uuid, info.size, info.trailer.frame_count, index_path)
        except BaseException:
            index.close()
            raise
    except BaseException:
        storage.close()
        raise
    return storage, info, index, meta


class Overtaken(Exception):
    """The pack at the path was replaced after it was opened and before its index was."""


def pinned_index(
    storage: Storage, ipath: str, uuids: set[str], hints: dict[str, Any] = INDEX_OPEN
) -> tuple[Storage, IndexMeta]:
    """The index of the pack ``storage`` holds, as an open handle: ``ipath``, or mid-publish
    ``ipath.partial`` (``man/hframe.5``, PUBLISHING AND READERS). An index of another pack is
    returned as it is (the caller reports it) unless the pack was replaced meanwhile.
    ``hints``: what its open fetches (``open_hints``)."""
    try:
        index: Storage | None = open_storage(ipath, **hints)
    except InputError:
        index = None
    meta: IndexMeta | None = None
    if index is not None:
        try:
            meta = read_index_meta(ipath, stream=index.stream())
        except FormatError:
            try:
                replaced = unpinned_and_moved(index)
            finally:
                index.close()
            if replaced:
                raise Overtaken from None
            raise
        except BaseException:
            index.close()
            raise
        if not uuids or meta.pack_uuid in uuids:
            return index, meta
    try:
        twin = open_storage(partial_name(ipath))
    except HframeError:
        twin = None
    if twin is not None:
        try:
            twin_meta = read_index_meta(partial_name(ipath), stream=twin.stream())
        except HframeError:
            twin_meta = None  # still being written
        if twin_meta is not None and twin_meta.pack_uuid in uuids:
            if index is not None:
                index.close()
            return twin, twin_meta
        twin.close()
    try:  # (asking a store whether an object moved can fail: the index is closed either way)
        moved = not storage.is_at_path() or (index is not None and not index.is_at_path())
    except BaseException:
        if index is not None:
            index.close()
        raise
    if moved:
        if index is not None:
            index.close()
        raise Overtaken
    if index is None or meta is None:
        raise InputError(f"{ipath}: index not found (rebuild it with 'hframe index PACK --rebuild')")
    return index, meta
