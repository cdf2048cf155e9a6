"""Datasets: several packs (shards) read as one, through the manifest ``NAME.dataset.json``.

This is the read side of datasets, below every user of the reader: the manifest (its file name
and format), ``DatasetReader`` (the ``PackReader`` API over global frame ids), and
``open_pack``, which opens a pack or, where a manifest stands instead, a dataset. How datasets
are *packed* (planning shards, job-array parts, the sharded run, writing the manifest) is
``write/shards.py`` and ``write/manifest.py``.

Imports inside functions: the HTTP client, only for a remote manifest's shards.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import operator
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import FormatError, HframeError, InputError, NotFound, PackReplaced, UnsupportedVersion
from ..format.index import index_location
from ..locations import is_remote, shown_url, with_suffix
from ..names import MANIFEST_SUFFIX, checkpoint_paths, shard_path
from ..storage.access import open_storage, opening_ahead
from ..storage.policy import Counters
from .cache import cache_settings, kept_copies
from .reader import FrameKey, PackReader, buffer_for, carved
from .snapshot import open_hints

__all__ = [
    "MANIFEST_SUFFIX",
    "MANIFEST_VERSION",
    "DatasetReader",
    "Manifest",
    "ShardEntry",
    "get_manifest_path",
    "open_pack",
    "shard_path",
]

MANIFEST_VERSION = 1


def get_manifest_path(output: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(output) + MANIFEST_SUFFIX)


#: shards of a remote dataset read at once by one ``read_many``
REMOTE_SHARDS_AT_ONCE = 8


def manifest_location(output: str | os.PathLike[str]) -> str:
    """``get_manifest_path`` as a string, right for URLs too (a ``Path`` would fold ``//``; the
    suffix goes on the URL's path, before any ``?query``)."""
    return with_suffix(output, MANIFEST_SUFFIX)


def is_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a sharded dataset: no pack there but a manifest beside it, on a
    disk and behind a URL alike (there: a small request for the manifest, and only when there
    is one, another for the pack)."""
    if not is_remote(path):
        return not os.path.exists(path) and get_manifest_path(path).exists()
    if not has_manifest(path):
        return False
    try:
        with open_storage(os.fspath(path)):
            return False  # a pack (or at least an object) at the location: a pack, as on a disk
    except HframeError:
        return True


def has_manifest(path: str | os.PathLike[str]) -> bool:
    """Whether a dataset manifest is beside ``path`` (a URL: one small request; any answer but
    the manifest says no), whatever is at ``path`` itself: what a publish cleans up."""
    if not is_remote(path):
        return get_manifest_path(path).exists()
    try:
        with open_storage(manifest_location(path)):
            return True
    except HframeError:  # missing, or denied (stores answer 403 for what does not exist): no dataset
        return False


@dataclass
class ShardEntry:
    path: str  # relative to the manifest's folder
    uuid: str
    frame_count: int
    pack_bytes: int
    first_frame: int


@dataclass
class Manifest:
    """``NAME.dataset.json``: the shards of one dataset, in order."""

    shards: list[ShardEntry]
    frame_count: int
    version: int = MANIFEST_VERSION
    kind: str = "hframe-dataset"
    sha256: str = ""

    def to_json(self) -> str:
        body = {k: v for k, v in asdict(self).items() if k != "sha256"}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return json.dumps({**body, "sha256": digest}, indent=1, sort_keys=True) + "\n"

    def shard_paths(self, manifest_path: str | os.PathLike[str]) -> list[str]:
        """The shards' paths (stored relative to the manifest's folder, or its URL)."""
        if is_remote(manifest_path):
            from ..storage.http import remote_url

            urls = [remote_url(os.fspath(manifest_path), e.path) for e in self.shards]
            for url in urls:
                if not is_remote(url):  # a manifest on a server must not point at this machine's files
                    raise FormatError(f"{os.fspath(manifest_path)}: shard {url!r} is not a remote location")
            return urls
        folder = Path(manifest_path).parent
        return [os.fspath(folder / e.path) for e in self.shards]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        where = os.fspath(path)
        try:
            if is_remote(where):
                with open_storage(where) as remote:
                    doc = json.loads(remote.read_at(0, remote.size()))
            else:
                doc = json.loads(Path(path).read_text())
            body = {k: v for k, v in doc.items() if k != "sha256"}
            if doc.get("kind") != "hframe-dataset":
                raise ValueError("not an hframe dataset manifest")
            if hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() != doc.get("sha256"):
                raise ValueError("checksum mismatch")
        except FileNotFoundError:
            raise InputError(f"{where}: no such dataset manifest") from None
        except (OSError, ValueError) as e:
            raise FormatError(f"{where}: unreadable dataset manifest ({e})") from e
        if doc["version"] != MANIFEST_VERSION:
            raise UnsupportedVersion(
                f"{where}: dataset manifest version {doc['version']} is not supported "
                f"(this hframe reads {MANIFEST_VERSION})"
            )
        return cls(
            [ShardEntry(**s) for s in doc["shards"]], doc["frame_count"], doc["version"], doc["kind"], doc["sha256"]
        )


class DatasetReader:
    """The frames of several shards as one pack: the ``PackReader`` API over global frame ids."""

    def __init__(self, output: str | os.PathLike[str], **options: Any) -> None:
        self.path = os.fspath(output)
        self.shown = shown_url(self.path)  # the path as messages name it (a URL's query left out)
        self.manifest_path = manifest_location(output)
        self.manifest = Manifest.load(self.manifest_path)
        self.shard_paths = self.manifest.shard_paths(self.manifest_path)
        self._starts = [e.first_frame for e in self.manifest.shards]
        self._options = options
        self._readers: list[PackReader | None] = [None] * len(self.shard_paths)
        self._table: pa.Table | None = None

    def shard(self, k: int) -> PackReader:
        r = self._readers[k]
        if r is None:
            try:
                r = PackReader(self.shard_paths[k], **self._options)
                if getattr(self, "_in_flight", 0):
                    r.widen(self._in_flight)
            except InputError:
                if self._rebuilt():  # its shard files were replaced or removed by a repack
                    raise PackReplaced(
                        f"{self.shown}: the dataset was rebuilt since this reader opened it (shard "
                        f"{shown_url(self.shard_paths[k])} is gone); open it again"
                    ) from None
                raise
            entry = self.manifest.shards[k]
            if r.info.uuid != entry.uuid or len(r) != entry.frame_count:
                r.close()
                where = f"shard {shown_url(self.shard_paths[k])} was {entry.uuid}, is now {r.info.uuid}"
                if is_remote(self.path) and not self._rebuilt():
                    # no run's plan can be seen in a store: a shard that is not the manifest's is
                    # a republish under way (its manifest is uploaded last)
                    raise PackReplaced(
                        f"{self.shown}: the dataset is being republished ({where}; its manifest comes "
                        "last); open it again when that has finished"
                    )
                if checkpoint_paths(self.path).plan.exists():
                    raise PackReplaced(
                        f"{self.shown}: the dataset is being rebuilt by a sharded pack run ({where}; its "
                        "manifest comes last); open it again when that run has finished"
                    )
                if self._rebuilt():
                    raise PackReplaced(
                        f"{self.shown}: the dataset was rebuilt since this reader opened it ({where}); open it again"
                    )
                raise FormatError(
                    f"{shown_url(self.shard_paths[k])}: shard differs from the dataset manifest "
                    f"(UUID {r.info.uuid} vs {entry.uuid}); rebuild it with 'hframe index --merge'"
                )
            self._readers[k] = r
        return r

    def _rebuilt(self) -> bool:
        """Whether the manifest on disk is no longer the one this reader read."""
        try:
            return Manifest.load(self.manifest_path).sha256 != self.manifest.sha256
        except HframeError:
            return True

    def __len__(self) -> int:
        return self.manifest.frame_count

    def __enter__(self) -> DatasetReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def shard_starts(self) -> list[int]:
        """The global id of each shard's frame 0, in order."""
        return list(self._starts)

    def locate(self, frame_id: int) -> tuple[int, int]:
        """(shard number, frame id inside the shard) of a global frame id."""
        k = bisect.bisect_right(self._starts, frame_id) - 1
        return k, frame_id - self._starts[k]

    def frame_id(self, key: FrameKey) -> int:
        if isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < len(self):
                raise NotFound(
                    f"{self.shown}: frame {key} does not exist (dataset has {len(self)} frames, ids 0..{len(self) - 1})"
                )
            return key
        if not isinstance(key, (str, bytes, bool)):
            try:  # numpy and torch integers: a global id (a shard would take it for its own)
                return self.frame_id(operator.index(key))
            except TypeError:
                pass  # not an integer: a shard refuses it, naming its type
        for k in range(len(self.shard_paths)):
            try:
                return self._starts[k] + self.shard(k).frame_id(key)
            except NotFound:
                continue
        shown = key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key
        raise NotFound(f"{self.shown}: no frame named {shown!r} in any of its {len(self.shard_paths)} shards")

    def read(self, key: FrameKey) -> bytes:
        k, local = self.locate(self.frame_id(key))
        return self.shard(k).read(local)

    __getitem__ = read

    def read_stored(self, key: FrameKey) -> bytes:
        k, local = self.locate(self.frame_id(key))
        return self.shard(k).read_stored(local)

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self.read(i)

    def head(self, key: FrameKey, nbytes: int) -> bytes:
        k, local = self.locate(self.frame_id(key))
        return self.shard(k).head(local, nbytes)

    def read_part(self, key: FrameKey, start: int, nbytes: int, stored: bool = False) -> bytes:
        k, local = self.locate(self.frame_id(key))
        return self.shard(k).read_part(local, start, nbytes, stored)

    def range_of(self, frame_id: int) -> tuple[int, int]:
        k, local = self.locate(frame_id)
        return self.shard(k).range_of(local)

    def _by_shard(self, keys: Sequence[FrameKey]) -> dict[int, list[tuple[int, int]]]:
        """Shard number → (position in ``keys``, frame id in the shard) of each key."""
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for j, key in enumerate(keys):
            k, local = self.locate(self.frame_id(key))
            by_shard.setdefault(k, []).append((j, local))
        return by_shard

    def frame_sizes(self, keys: Sequence[FrameKey]) -> list[int]:
        return self._sizes(self._by_shard(keys), len(keys))

    def _sizes(self, by_shard: dict[int, list[tuple[int, int]]], count: int) -> list[int]:
        out = [0] * count
        for k, items in by_shard.items():
            for (j, _), size in zip(items, self.shard(k).frame_sizes([local for _, local in items])):
                out[j] = size
        return out

    def read_many_into(
        self, keys: Sequence[FrameKey], buffer: bytearray | memoryview | None = None
    ) -> list[memoryview]:
        """``PackReader.read_many_into`` across shards: the frames back to back in the order asked,
        whichever shard holds each."""
        if not keys:
            return []
        by_shard = self._by_shard(keys)  # each key looked up once
        sizes = self._sizes(by_shard, len(keys))
        views = carved(buffer_for(buffer, sum(sizes)), sizes)
        for k, items in by_shard.items():
            self.shard(k).read_into([local for _, local in items], [views[j] for j, _ in items])
        return views

    def fill_cache(
        self,
        keys: Sequence[FrameKey],
        workers: int | None = None,
        *,
        later: Sequence[int] | None = None,
        run: int = 0,
    ) -> int:
        """``PackReader.fill_cache`` across shards (``later``: a mask over the dataset's frame
        ids, each shard given its own part of it)."""
        ends = [*self._starts[1:], len(self)]
        fetched = 0
        for k, items in self._by_shard(keys).items():
            part = None if later is None else later[self._starts[k] : ends[k]]
            fetched += self.shard(k).fill_cache([local for _, local in items], workers, later=part, run=run)
        return fetched

    @property
    def caches(self) -> bool:
        """Whether the shards' reads go through a node cache (the first shard's say)."""
        return self.shard(0).caches

    def widen(self, in_flight: int) -> None:
        """``PackReader.widen`` for every shard opened, and those opened later."""
        self._in_flight = max(in_flight, getattr(self, "_in_flight", 0))
        for r in self._readers:
            if r is not None:
                r.widen(in_flight)

    def read_many(self, keys: Sequence[FrameKey], workers: int | None = None, **kw: Any) -> list[bytes]:
        by_shard = self._by_shard(keys)
        out: list[bytes] = [b""] * len(keys)

        def read_shard(k: int, items: list[tuple[int, int]]) -> None:
            datas = self.shard(k).read_many([local for _, local in items], workers=workers, **kw)
            for (j, _), data in zip(items, datas):
                out[j] = data

        if len(by_shard) > 1 and is_remote(self.path):
            # behind a URL every shard costs round trips (opening it, then its reads): the shards
            # of a batch are read at once, not one after another
            with ThreadPoolExecutor(
                min(REMOTE_SHARDS_AT_ONCE, len(by_shard)), thread_name_prefix="hframe-shard"
            ) as pool:
                for done in [pool.submit(read_shard, k, items) for k, items in by_shard.items()]:
                    done.result()
        else:
            for k, items in by_shard.items():
                read_shard(k, items)
        return out

    @property
    def table(self) -> pa.Table:
        """Every shard's index rows with global frame ids and a ``shard`` column (the shard file)."""
        if self._table is None:
            parts = []
            for k in range(len(self.shard_paths)):
                t = self.shard(k).table
                t = t.set_column(
                    0, "frame_id", pa.array(range(self._starts[k], self._starts[k] + t.num_rows), pa.int64())
                )
                parts.append(
                    t.append_column("shard", pa.array([self.manifest.shards[k].path] * t.num_rows, pa.string()))
                )
            self._table = pa.concat_tables(parts)
        return self._table

    def read_index_columns(self, columns: list[str] | None = None, **options: Any) -> pa.Table:
        """Index columns of every shard in turn, each of the generation this reader holds (as
        ``PackReader.read_index_columns``), with global frame ids; all of them (with
        ``shard``) when ``columns`` is None, as ``table``."""
        if columns is None:
            return self.table
        parts = []
        for k in range(len(self.shard_paths)):
            t = self.shard(k).read_index_columns(columns, **options)
            if "frame_id" in t.column_names:
                ids = pa.array(range(self._starts[k], self._starts[k] + t.num_rows), pa.int64())
                t = t.set_column(t.column_names.index("frame_id"), "frame_id", ids)
            parts.append(t)
        return pa.concat_tables(parts)

    def row(self, key: FrameKey) -> dict[str, Any]:
        row: dict[str, Any] = self.table.slice(self.frame_id(key), 1).to_pylist()[0]
        return row

    # what bench reports of the pack it reads, for the dataset as a whole

    @property
    def coalesce_gap(self) -> int:
        return self.shard(0).coalesce_gap

    @property
    def max_read(self) -> int:
        return self.shard(0).max_read

    @property
    def pack_bytes(self) -> int:
        return sum(e.pack_bytes for e in self.manifest.shards)

    @property
    def files(self) -> list[str]:
        return list(self.shard_paths)

    def storage_counters(self) -> Counters | None:
        """The request counters of the shards opened so far, added up (None when local)."""
        found = [c for r in self._readers if r is not None and (c := r.storage_counters()) is not None]
        if not found:
            return None
        total = Counters()
        for c in found:
            total.add(requests=c.requests, nbytes=c.bytes, retries=c.retries, throttles=c.throttles)
        return total

    def close(self) -> None:
        for r in self._readers:
            if r is not None:
                r.close()
        self._readers = [None] * len(self.shard_paths)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as its path, options and the manifest it read: a spawned DataLoader worker
        maps frame ids exactly as its parent did, and each shard it opens must be the one that
        manifest names (by UUID), or it fails with ``PackReplaced``."""
        return {"output": self.path, "options": self._options, "manifest": self.manifest}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["output"]
        self.shown = shown_url(self.path)
        self.manifest_path = manifest_location(self.path)
        self.manifest = state["manifest"]
        self.shard_paths = self.manifest.shard_paths(self.manifest_path)
        self._starts = [e.first_frame for e in self.manifest.shards]
        self._options = state["options"]
        self._readers = [None] * len(self.shard_paths)
        self._table = None


def open_pack(
    path: str | os.PathLike[str], index_path: str | os.PathLike[str] | None = None, **options: Any
) -> PackReader | DatasetReader:
    """Open a pack for reading; see ``PackReader`` for the options.

    If ``path`` is not a file but ``path.dataset.json`` exists (a sharded dataset), the shards
    are opened as one ``DatasetReader`` with the same API over global frame ids.
    """
    if index_path is not None:
        return PackReader(path, index_path, **options)
    where = os.fspath(path)
    if not is_remote(where):
        return DatasetReader(path, **options) if is_dataset(path) else PackReader(path, None, **options)
    # a remote pack's manifest (is it a dataset?), pack and index are asked for at once; a pack
    # there is a pack, as on a disk, whatever the manifest's answer (over S3 a missing object
    # costs a second round trip: the open no longer waits for it)
    ipath = index_location(where)
    pack_hints, index_hints = open_hints(
        kept_copies(cache_settings(options.get("cache_dir"), options.get("cache_limit")))
    )
    with opening_ahead([manifest_location(where), where, ipath], {where: pack_hints, ipath: index_hints}):
        try:
            return PackReader(path, None, **options)
        except InputError:  # no pack there (or none hframe can read): a dataset's manifest beside it?
            if has_manifest(path):
                return DatasetReader(path, **options)
            raise
