"""Datasets of several packs (shards): planning the split, the dataset manifest, and one reader.

``pack --max-pack-bytes SIZE -o photos.hframe`` writes ``photos-00000.hframe``,
``photos-00001.hframe``, ... (each a complete pack with its own index) and the manifest
``photos.hframe.dataset.json`` listing them in order. ``pack --shard-of i/N`` packs only part
``i`` of the sorted inputs as ``photos-0000i.hframe`` (job arrays); ``hframe index photos.hframe
--merge 'photos-*.hframe'`` writes the manifest afterwards. ``open_pack("photos.hframe")`` opens
the dataset as one: global frame ids run through the shards in manifest order.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .checkpoint import checkpoint_paths, fsync_dir, remove_checkpoint_files, save_sources
from .errors import FormatError, HframeError, InputError, NotFound, PackReplaced, UnsupportedVersion
from .format import HEADER_SIZE, RECORD_FIXED, TRAILER_SIZE
from .index import get_index_path
from .inputs import Source, SourceList, expand_globs
from .lock import OutputLock
from .reader import FrameKey, PackReader

if TYPE_CHECKING:
    from .packing import EventFn, PackResult

__all__ = [
    "DEFAULT_MAX_PACK_BYTES",
    "pack_part",
    "pack_sharded",
    "DatasetReader",
    "Manifest",
    "get_manifest_path",
    "parse_shard_of",
    "plan_shards",
    "shard_path",
    "split_for_worker",
    "write_manifest",
]

DEFAULT_MAX_PACK_BYTES = 16 << 30  # BRIEF: keep packs around 10-20 GB
MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".dataset.json"


def get_manifest_path(output: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(output) + MANIFEST_SUFFIX)


def shard_path(output: str | os.PathLike[str], i: int) -> Path:
    """``photos.hframe`` → ``photos-00003.hframe`` (``-00003`` appended when there is no suffix)."""
    p = Path(output)
    if p.suffix:
        return p.with_name(f"{p.stem}-{i:05d}{p.suffix}")
    return p.with_name(f"{p.name}-{i:05d}")


#: Room for a frame's metadata in its record header (image size and mode, label, split).
_META_ALLOWANCE = 128


def estimated_bytes(s: Source, alignment: int, meta_bytes: int = _META_ALLOWANCE) -> int:
    """An upper bound on the bytes a source adds to a pack (not for videos cut into frames,
    whose output size is unknown until they are decoded; compression only makes it smaller)."""
    return RECORD_FIXED + len(s.name) + meta_bytes + s.size + (alignment - 1)


def media_allowances(media: Any) -> tuple[int, int]:
    """(bytes per frame, bytes per shard) that ``media`` options may add beyond the sources:
    the metadata in record headers (longest label and split name), and a stored dictionary."""
    if media is None:
        return _META_ALLOWANCE, 0
    from .codec import DICT_SIZE
    from .labels import LabelPolicy, parse_split

    labels = LabelPolicy.parse(media.label_from)
    longest_label = max((len(v.encode()) for v in (labels.mapping or {}).values()), default=0)
    longest_split = max((len(n.encode()) for n, _ in parse_split(media.split)), default=0)
    per_frame = _META_ALLOWANCE + longest_label + longest_split
    per_shard = 0
    if media.wants_dictionary:
        try:
            per_shard = DICT_SIZE if media.zstd_dict == "auto" else os.path.getsize(media.zstd_dict)
        except OSError:
            per_shard = 0  # reported when the dictionary is read
    return per_frame, per_shard + 64


def plan_shards(
    sources: Sequence[Source],
    max_pack_bytes: int,
    alignment: int = 1,
    per_frame: int = _META_ALLOWANCE,
    per_shard: int = 0,
) -> list[tuple[int, int]]:
    """Split the sorted sources into consecutive runs whose packs stay under ``max_pack_bytes``.

    ``per_frame`` and ``per_shard`` are the most the media options add (``media_allowances``).
    Returns [start, stop) index ranges; a single source larger than the limit gets a shard alone.
    """
    if max_pack_bytes < 1:
        raise InputError(f"--max-pack-bytes must be positive (got {max_pack_bytes})")
    ranges: list[tuple[int, int]] = []
    start, size = 0, HEADER_SIZE + TRAILER_SIZE + per_shard
    for k, s in enumerate(sources):
        b = estimated_bytes(s, alignment, per_frame)
        if k > start and size + b > max_pack_bytes:
            ranges.append((start, k))
            start, size = k, HEADER_SIZE + TRAILER_SIZE + per_shard
        size += b
    ranges.append((start, len(sources)))
    return ranges


def parse_shard_of(text: str) -> tuple[int, int]:
    """``"3/8"`` → (3, 8): worker 3 of 8, counting from 0."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise InputError(f"--shard-of: {text!r} is not I/N (for example 3/8)") from None
    if n < 1 or not 0 <= i < n:
        raise InputError(f"--shard-of {text}: I must be in 0..N-1 and N at least 1")
    return i, n


def pack_part(sources: SourceList, output: str | os.PathLike[str], shard_of: str, **options: Any) -> PackResult:
    """``pack --shard-of I/N``: pack part I of N of the sorted sources as ``NAME-0000I.hframe``."""
    from .packing import pack_sources

    i, n = parse_shard_of(shard_of)
    part = SourceList(split_for_worker(sources.sources, i, n), sources.rejected if i == 0 else [])
    if not part.sources:
        raise InputError(f"--shard-of {shard_of}: part {i} of {n} is empty ({len(sources.sources)} sources)")
    return pack_sources(part, shard_path(output, i), **options)


def split_for_worker(sources: Sequence[Source], i: int, n: int) -> list[Source]:
    """Part ``i`` of ``n`` of the sorted sources: contiguous, disjoint, covering all of them."""
    total = len(sources)
    return list(sources[i * total // n : (i + 1) * total // n])


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
        """The shards' paths (they are stored relative to the manifest's folder)."""
        folder = Path(manifest_path).parent
        return [os.fspath(folder / e.path) for e in self.shards]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        where = os.fspath(path)
        try:
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


def write_manifest(output: str | os.PathLike[str], shards: Sequence[str | os.PathLike[str]]) -> Manifest:
    """Check every shard (header, trailer, index of that pack) and write the dataset manifest.

    ``shards`` may hold glob patterns (``hframe index OUT --merge 'NAME-*.hframe'``).
    """
    with OutputLock(output):  # one writer of the manifest at a time (re-entrant in a sharded run)
        return _write_manifest(output, shards)


def _write_manifest(output: str | os.PathLike[str], shards: Sequence[str | os.PathLike[str]]) -> Manifest:
    shards = expand_globs(os.fspath(s) for s in shards)
    mpath = get_manifest_path(output)
    folder = mpath.parent
    entries: list[ShardEntry] = []
    first = 0
    for s in shards:
        if checkpoint_paths(s).checkpoint.exists():
            raise InputError(f"{s}: still being written or interrupted (finish it with 'hframe resume {s}')")
        with PackReader(s) as r:
            entries.append(
                ShardEntry(
                    os.path.relpath(os.path.abspath(s), os.path.abspath(folder)),
                    r.info.uuid,
                    len(r),
                    r.info.size,
                    first,
                )
            )
            first += len(r)
    if not entries:
        raise InputError(f"{output}: no shards to merge")
    names = [e.path for e in entries]
    if len(set(names)) != len(names):
        raise InputError(f"{output}: a shard is listed twice")
    manifest = Manifest(entries, first)
    tmp = Path(os.fspath(mpath) + ".partial")
    tmp.write_text(manifest.to_json())
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, mpath)
    fsync_dir(folder)
    return manifest


class DatasetReader:
    """The frames of several shards as one pack: the ``PackReader`` API over global frame ids."""

    def __init__(self, output: str | os.PathLike[str], **options: Any) -> None:
        self.path = os.fspath(output)
        self.manifest_path = get_manifest_path(output)
        self.manifest = Manifest.load(self.manifest_path)
        self.shard_paths = self.manifest.shard_paths(self.manifest_path)
        self._starts = [e.first_frame for e in self.manifest.shards]
        self._options = options
        self._readers: list[PackReader | None] = [None] * len(self.shard_paths)
        self._table: pa.Table | None = None

    def shard(self, k: int) -> PackReader:
        r = self._readers[k]
        if r is None:
            r = PackReader(self.shard_paths[k], **self._options)
            entry = self.manifest.shards[k]
            if r.info.uuid != entry.uuid or len(r) != entry.frame_count:
                r.close()
                if self._rebuilt():
                    raise PackReplaced(
                        f"{self.path}: the dataset was rebuilt since this reader opened it (shard "
                        f"{self.shard_paths[k]} was {entry.uuid}, is now {r.info.uuid}); open it again"
                    )
                raise FormatError(
                    f"{self.shard_paths[k]}: shard differs from the dataset manifest "
                    f"(UUID {r.info.uuid} vs {entry.uuid}); rebuild it with 'hframe index --merge'"
                )
            self._readers[k] = r
        return r

    def _rebuilt(self) -> bool:
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

    def locate(self, frame_id: int) -> tuple[int, int]:
        """(shard number, frame id inside the shard) of a global frame id."""
        k = bisect.bisect_right(self._starts, frame_id) - 1
        return k, frame_id - self._starts[k]

    def frame_id(self, key: FrameKey) -> int:
        if isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < len(self):
                raise NotFound(
                    f"{self.path}: frame {key} does not exist (dataset has {len(self)} frames, ids 0..{len(self) - 1})"
                )
            return key
        for k in range(len(self.shard_paths)):
            try:
                return self._starts[k] + self.shard(k).frame_id(key)
            except NotFound:
                continue
        shown = key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key
        raise NotFound(f"{self.path}: no frame named {shown!r} in any of its {len(self.shard_paths)} shards")

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

    def range_of(self, frame_id: int) -> tuple[int, int]:
        k, local = self.locate(frame_id)
        return self.shard(k).range_of(local)

    def read_many(self, keys: Sequence[FrameKey], workers: int | None = None, **kw: Any) -> list[bytes]:
        ids = [self.frame_id(k) for k in keys]
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for j, g in enumerate(ids):
            k, local = self.locate(g)
            by_shard.setdefault(k, []).append((j, local))
        out: list[bytes] = [b""] * len(ids)
        for k, items in by_shard.items():
            datas = self.shard(k).read_many([local for _, local in items], workers=workers, **kw)
            for (j, _), data in zip(items, datas):
                out[j] = data
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

    def row(self, key: FrameKey) -> dict[str, Any]:
        row: dict[str, Any] = self.table.slice(self.frame_id(key), 1).to_pylist()[0]
        return row

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
        self.manifest_path = get_manifest_path(self.path)
        self.manifest = state["manifest"]
        self.shard_paths = self.manifest.shard_paths(self.manifest_path)
        self._starts = [e.first_frame for e in self.manifest.shards]
        self._options = state["options"]
        self._readers = [None] * len(self.shard_paths)
        self._table = None


def save_plan(output: str | os.PathLike[str], ranges: list[tuple[int, int]], options: dict[str, Any]) -> None:
    """The sharded run's intent: the shard ranges over the saved source list, and its options."""
    path = Path(os.fspath(output) + ".dataset.plan.json")
    tmp = Path(os.fspath(path) + ".partial")
    tmp.write_text(json.dumps({"ranges": ranges, "options": options}, indent=1))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_plan(output: str | os.PathLike[str]) -> tuple[list[tuple[int, int]], dict[str, Any]] | None:
    path = Path(os.fspath(output) + ".dataset.plan.json")
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: unreadable plan of a sharded run ({e})") from e
    return [(int(a), int(b)) for a, b in doc["ranges"]], doc["options"]


def remove_plan(output: str | os.PathLike[str]) -> None:
    try:
        os.unlink(os.fspath(output) + ".dataset.plan.json")
    except FileNotFoundError:
        pass


def open_dataset_or_pack(path: str | os.PathLike[str], **options: Any) -> PackReader | DatasetReader:
    """A pack, or — when ``path`` is not a file but ``path.dataset.json`` exists — a dataset."""
    if not os.path.exists(path) and get_manifest_path(path).exists():
        return DatasetReader(path, **options)
    return PackReader(path, **options)


# -- packing a dataset (the driver behind pack --max-pack-bytes and resume) ---------------


def pack_sharded(
    sources: SourceList,
    output: str | os.PathLike[str],
    *,
    max_pack_bytes: int,
    alignment: int = 1,
    created_us: int | None = None,
    force: bool = False,
    on_event: EventFn | None = None,
    **options: Any,
) -> tuple[Any, list[PackResult]]:
    """Pack ``sources`` as shards ``NAME-00000.hframe``... of at most ``max_pack_bytes`` each,
    plus the manifest ``NAME.dataset.json``; one plain pack when everything fits.

    A sharded run saves its plan (the source list and shard ranges) first; if it is interrupted,
    ``resume_pack(output)`` (``hframe resume``) keeps the finished shards, resumes the
    interrupted one and packs the rest. Returns the manifest (None for a single pack) and the
    shards' results.
    """

    from .packing import pack_sources

    out = os.fspath(output)
    ranges = plan_shards(sources.sources, max_pack_bytes, alignment, *media_allowances(options.get("media")))
    if len(ranges) == 1:
        return None, [
            pack_sources(
                sources, out, alignment=alignment, created_us=created_us, force=force, on_event=on_event, **options
            )
        ]

    if not force:
        for p in [get_manifest_path(out), *(shard_path(out, k) for k in range(len(ranges)))]:
            if os.path.exists(p):
                raise InputError(f"{p}: already exists (use --force to replace the dataset)")
    if created_us is None:
        created_us = time.time_ns() // 1000  # one creation time for every shard
    with OutputLock(out):
        save_sources(out, sources)
        save_plan(
            out,
            ranges,
            {
                "alignment": alignment,
                "created_us": created_us,
                "force": force,
                **{
                    k: (v.to_dict() if k == "media" and v is not None else v)
                    for k, v in options.items()
                    if k in SHARD_OPTIONS
                },
            },
        )
        return run_shards(
            out, sources, ranges, alignment=alignment, created_us=created_us, force=force, on_event=on_event, **options
        )


SHARD_OPTIONS = ("skip_bad", "self_check_frames", "media")


def run_shards(
    out: str,
    sources: SourceList,
    ranges: list[tuple[int, int]],
    *,
    on_event: EventFn | None,
    force: bool,
    resuming: bool = False,
    **options: Any,
) -> tuple[Any, list[PackResult]]:

    from .packing import _note, pack_sources, resume_pack

    # a shard holds a fixed part of the planned sources (a SourceList without ``collect``): on
    # resume its files are checked for changes, but folders are not walked again
    results = []
    paths = []
    for k, (a, b) in enumerate(ranges):
        path = shard_path(out, k)
        paths.append(path)
        part = SourceList(sources.sources[a:b], list(sources.rejected) if k == 0 else [])
        if checkpoint_paths(path).checkpoint.exists():
            _note(on_event, f"shard {k + 1} of {len(ranges)}: resuming {path}")
            outcome = resume_pack(
                path,
                on_event=on_event,
                **{x: options[x] for x in ("workers", "checkpoints", "handle_signals", "on_progress") if x in options},
            )
            if outcome.result is not None:
                results.append(outcome.result)
            continue
        if resuming and os.path.exists(path) and get_index_path(path).exists():
            _note(on_event, f"shard {k + 1} of {len(ranges)}: {path} already complete")  # published by this plan
            with OutputLock(path):  # a lock file its run left when it was killed goes with this one
                pass
            continue
        _note(on_event, f"shard {k + 1} of {len(ranges)}: {b - a} sources -> {path}")
        results.append(pack_sources(part, path, force=force or resuming, on_event=on_event, **options))
    manifest = write_manifest(out, paths)
    remove_plan(out)
    remove_checkpoint_files(out)
    return manifest, results
