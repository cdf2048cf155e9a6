"""Writing to an object store: build locally, then publish by uploading, in an order that keeps
every reader of the remote location on a complete version (``man/hframe.5``, PUBLISHING AND
READERS).

``pack -o s3://…`` (and ``--update``, ``resume``) builds the pack in a *staging* folder on this
machine (``HFRAME_STAGE``, default ``~/.cache/hframe/stage``; one folder per location), locked
like any local output, then ``publish`` uploads it. Per pack, as a local publish renames:

1. the index to ``KEY.index.parquet.partial``;
2. the pack to ``KEY`` (readers between 2 and 3 pair it with the ``.partial`` index, as locally);
3. the index to ``KEY.index.parquet``; then the ``.partial`` one is deleted.

A dataset's shards go first, each so, and its manifest last. A pack already at its location
(same UUID and size) is not sent again, so an interrupted publish is resumed (``hframe resume
URL``) where it stopped, shard by shard.

Every object is written by a child process that completes the upload only after its last byte
(``storage/put.py`` says why): an interrupted or failed upload leaves nothing at the location.

Imports inside functions: the readers and object-store clients, where a step needs them: this
module is imported before the staging folder's lock is taken, and a run that finds it locked
gives up before pyarrow loads.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import FormatError, HframeError, InputError, PackReplaced, StorageError
from ..locations import scheme_family, shown_url
from ..names import partial_name
from ..storage.put import copy_object, delete_object, put_objects
from ..units import format_bytes

__all__ = [
    "PublishReport",
    "fetch_for_update",
    "finish_interrupted_publish",
    "publish",
    "published_version",
    "put_objects",
    "staging_path",
]

EventFn = Callable[[str], None]
_CHUNK = 8 << 20


def staging_path(url: str, *, create: bool = True) -> str:
    """Where the pack for ``url`` is built and kept: ``HFRAME_STAGE`` (default
    ``~/.cache/hframe/stage``) / a folder per location / the key's file name (the folder made
    unless ``create`` is false)."""
    scheme = url.partition("://")[0].lower()
    if scheme_family(url) == "http":
        raise InputError(
            f"{shown_url(url)}: writing to a remote location ({scheme}://) is not supported yet; "
            "write the pack locally, then upload it and its index"
        )
    from ..storage.objectstore import split_location

    _, path, _ = split_location(url)
    root = os.environ.get("HFRAME_STAGE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hframe", "stage"
    )
    name = path.rsplit("/", 1)[-1]
    folder = os.path.join(root, f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}")
    if create:
        os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


@dataclass
class PublishReport:
    """What ``publish`` did: objects uploaded (location, bytes) and packs already in place;
    ``locations`` maps each staged pack and index to its remote location."""

    uploaded: list[tuple[str, int]] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)
    seconds: float = 0.0
    locations: dict[str, str] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.uploaded)

    def remote_result(self, result: Any) -> Any:
        """A staged pack's ``PackResult`` with the remote locations in place of the staged paths."""

        where = {k: shown_url(v) for k, v in self.locations.items()}
        return replace(
            result, path=where.get(result.path, result.path), index_path=where.get(result.index_path, result.index_path)
        )

    def summary(self, url: str) -> str:
        """One line for the log: what went where, how fast."""
        rate = self.bytes / self.seconds if self.seconds > 0 else 0.0
        done = (
            f"uploaded {len(self.uploaded)} object{'s' if len(self.uploaded) != 1 else ''}, {format_bytes(self.bytes)}"
        )
        kept = (
            f"; {len(self.in_place)} pack{'s' if len(self.in_place) != 1 else ''} already there"
            if self.in_place
            else ""
        )
        return f"published {shown_url(url)}: {done} in {self.seconds:.1f} s ({format_bytes(rate)}/s){kept}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "objects": [{"location": shown_url(u), "bytes": n} for u, n in self.uploaded],
            "bytes": self.bytes,
            "already_there": [shown_url(u) for u in self.in_place],
            "elapsed_s": round(self.seconds, 6),
        }


def published_version(url: str) -> bool:
    """Whether a pack or a dataset is published at ``url``."""
    from ..read.dataset import has_manifest

    return _remote_uuid(url) is not None or has_manifest(url)


def _pairs(stage: str, url: str) -> tuple[list[tuple[str, str]], tuple[str, str] | None]:
    """(local pack, its URL) of every pack of the staged output, and (manifest, its URL) for a
    dataset."""
    from ..read.dataset import Manifest, is_dataset, manifest_location
    from ..storage.http import remote_url

    if is_dataset(stage):
        mpath = manifest_location(stage)
        manifest = Manifest.load(mpath)
        murl = manifest_location(url)
        pairs = [(os.path.join(os.path.dirname(mpath), e.path), remote_url(murl, e.path)) for e in manifest.shards]
        return pairs, (mpath, murl)
    if not os.path.exists(stage):
        raise InputError(f"{shown_url(url)}: nothing built to publish (no {stage})")
    return [(stage, url)], None


def _remote_uuid(url: str) -> tuple[str, int] | None:
    """(UUID, size) of the pack at ``url``, or None when there is none (or not a readable one)."""
    from ..read.snapshot import read_pack_info
    from ..storage.access import open_storage

    try:
        with open_storage(url) as s:
            info = read_pack_info(s)
            return info.uuid, info.size
    except (InputError, FormatError):
        return None


def _local_uuid(path: str) -> tuple[str, int]:
    from ..read.snapshot import read_pack_info
    from ..storage.access import open_storage

    with open_storage(path) as s:
        info = read_pack_info(s)
        return info.uuid, info.size


def _index_in_place(local_index: str, url: str) -> bool:
    """Whether the index at ``url`` is the staged one (same bytes: compared by md5)."""
    from ..storage.access import open_storage

    try:
        with open_storage(url) as s:
            if s.size() != os.path.getsize(local_index):
                return False
            remote = hashlib.md5(s.read_all() if hasattr(s, "read_all") else s.read_at(0, s.size())).digest()
    except HframeError:
        return False
    digest = hashlib.md5()
    with open(local_index, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.digest() == remote


def publish(stage: str, url: str, on_event: EventFn | None = None) -> PublishReport:
    """Upload the staged output ``stage`` to ``url`` (the order in the module docstring); packs
    already there are left alone. Raises ``StorageError`` (exit 3) naming the object on failure."""
    from ..format.index import index_location
    from ..read.dataset import manifest_location

    report = PublishReport()
    t0 = time.monotonic()
    pairs, manifest = _pairs(stage, url)
    old_shards = _remote_shards(url)
    for local, remote in pairs:
        lindex, rindex = index_location(local), index_location(remote)
        report.locations.update({local: remote, lindex: rindex})
        there = _remote_uuid(remote)
        _finish_interrupted(remote, there, on_event)
        if there == _local_uuid(local) and _index_in_place(lindex, rindex):
            report.in_place.append(remote)
            continue
        partial = partial_name(rindex)
        order = [(lindex, partial), (local, remote), (lindex, rindex)]
        put_objects(order)
        report.uploaded += [(target, os.path.getsize(path)) for path, target in order]
        delete_object(partial)
        if on_event is not None:
            on_event(f"uploaded {shown_url(remote)} and its index ({format_bytes(os.path.getsize(local))})")
    if manifest is not None:
        put_objects([manifest])
        report.uploaded.append((manifest[1], os.path.getsize(manifest[0])))
    # what the other form left at the location would keep readers on the old version (a pack
    # is taken over a manifest, as on a disk) or cost storage (a manifest a pack replaced, stale shards):
    # removed once the new version is complete, as a local publish does (shards.retire_other_form)
    if manifest is None:
        if old_shards:
            delete_object(manifest_location(url))
        doomed = old_shards
    else:
        new = {remote for _, remote in pairs}
        doomed = [url, *(s for s in old_shards if s not in new)]
    for where in doomed:
        for obj in (where, index_location(where)):
            delete_object(obj)
    report.seconds = time.monotonic() - t0
    return report


def finish_interrupted_publish(url: str, on_event: EventFn | None = None) -> bool:
    """A publish cut between a pack and its index leaves the new pack at ``url`` with its index
    at ``INDEX.partial``, which readers use (hframe.5): put that index in place before anything
    else is uploaded over it, as a local writer finishes a publish left between its renames.
    True when there was one to finish."""
    return _finish_interrupted(url, _remote_uuid(url), on_event)


def _finish_interrupted(url: str, pack: tuple[str, int] | None, on_event: EventFn | None) -> bool:
    """``finish_interrupted_publish`` for the pack (UUID, size) the caller found at ``url``."""
    from ..format.index import index_location

    rindex = index_location(url)
    partial = partial_name(rindex)
    if pack is None or _index_pack_uuid(partial) != pack[0]:
        return False  # nothing there, or a .partial left by a run cut before its pack (never read)
    if _index_pack_uuid(rindex) != pack[0]:
        copy_object(partial, rindex)
    delete_object(partial)
    if on_event is not None:
        on_event(f"finished the publish of {shown_url(url)} that an interrupted run left between pack and index")
    return True


def _index_pack_uuid(url: str) -> str | None:
    """The pack UUID an index at ``url`` belongs to (None: no readable index there)."""
    from ..format.index import read_index_meta
    from ..storage.access import open_storage

    try:
        with open_storage(url) as s:
            return read_index_meta(url, stream=s.stream()).pack_uuid
    except (InputError, FormatError):
        return None


def _remote_shards(url: str) -> list[str]:
    """The shard locations of the dataset published at ``url`` named as its own shards are
    (none if there is none)."""
    from ..read.dataset import Manifest, has_manifest, manifest_location
    from .shards import own_shard

    if not has_manifest(url):
        return []
    murl = manifest_location(url)
    return [s for s in Manifest.load(murl).shard_paths(murl) if own_shard(url, s)]  # never packs merged from elsewhere


def fetch_for_update(url: str, stage: str, on_event: EventFn | None = None) -> bool:
    """Make the staged copy of ``url`` the version published there, for ``--update``: the pack
    and its index are downloaded unless the staged copy is that version already. False when
    nothing is published at ``url`` (the update then packs everything)."""
    from ..format.index import index_location
    from ..read.dataset import is_dataset

    if is_dataset(url):  # refused before anything is downloaded, as the local update refuses it
        raise InputError(
            f"{shown_url(url)}: --update of a sharded dataset is not supported yet; repack it with --force"
        )
    want = _remote_uuid(url)
    if want is None:
        return False
    have = _local_uuid(stage) if os.path.exists(stage) else None
    if want == have and _index_in_place(index_location(stage), index_location(url)):
        return True
    if on_event is not None:
        on_event(f"downloading {shown_url(url)} to {stage} (the staged copy is not the published one)")
    _download(url, stage)
    _download(index_location(url), index_location(stage))
    return True


def _download(url: str, path: str) -> None:
    """Copy an object to ``path`` (through ``path.download``, renamed once whole)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = path + ".download"
    try:
        _copy_out(url, tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)


def _copy_out(url: str, tmp: str) -> None:
    """The object's bytes into ``tmp``, all from the version it had when the copy began."""
    from ..storage.access import open_storage

    with open_storage(url) as s, open(tmp, "wb") as out:
        s.advise_sequential(0)  # blocks read ahead, several in flight
        size, pos = s.size(), 0
        while pos < size:
            piece = s.read_at(pos, min(_CHUNK, size - pos))
            if not piece:
                raise StorageError(f"{shown_url(url)}: the object ended at {pos} of {size} bytes")
            out.write(piece)
            pos += len(piece)
        out.flush()
        os.fsync(out.fileno())
        if not s.is_at_path():  # S3 reads are not pinned: a copy taken across a publish is no copy
            raise PackReplaced(f"{shown_url(url)}: it was replaced while it was downloaded; run again")
