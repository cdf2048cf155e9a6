"""Crash safety for ``pack``: the output lock, the checkpoint file, and the saved source list.

Files beside ``OUT`` (``man/hframe.5``, CHECKPOINTS):

- ``OUT.lock``: held with ``flock`` for the whole run (``lock.OutputLock``); its text names the
  holder (pid, host, start time). A lock file whose ``flock`` is free was left by a dead process
  and is taken over.
- ``OUT.ckpt`` (and ``OUT.ckpt.prev``, the one before): JSON with a sha256 of its own content,
  written to a temporary name, fsynced, renamed; a torn or truncated file is detected and the
  previous one used.
- ``OUT.sources.parquet``: the sorted source list (path, name, size, mtime) fixed when the run
  started, so ``resume`` can tell what changed since, even for a list read from stdin.

Durability order for a checkpoint: pack data flushed and fsynced → checkpoint written to a temp
file, fsynced → previous checkpoint renamed to ``.prev`` → temp renamed to ``OUT.ckpt`` →
folder fsynced. At every instant at least one valid checkpoint describes bytes that are on disk.

Imports inside functions: pyarrow, only for the saved source list: the lock and checkpoint files
must not need it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..durable import fsync_dir, replaced
from ..errors import FormatError, StorageError
from ..faults import fault_point
from ..names import checkpoint_paths
from ..sources.sourcelist import Rejected, SourceList
from .lock import OutputLock

__all__ = [
    "CHECKPOINT_VERSION",
    "Checkpoint",
    "CheckpointPolicy",
    "OutputLock",
    "load_checkpoint",
    "load_sources",
    "save_sources",
    "source_fingerprint",
]

CHECKPOINT_VERSION = 1


@dataclass
class CheckpointPolicy:
    """When ``pack`` writes a checkpoint: whichever of these comes first (0 disables one)."""

    every_frames: int = 100_000
    every_bytes: int = 4 << 30
    every_seconds: float = 30.0
    enabled: bool = True


@dataclass
class Checkpoint:
    """What ``resume`` needs to continue a pack exactly where it stopped."""

    output: str
    phase: str  # "packing" | "publishing"
    options: dict[str, Any]
    fingerprint: str
    source_count: int
    next_source: int = 0
    frames: int = 0
    committed_bytes: int = 0
    skipped: list[list[str]] = field(default_factory=list)
    version: int = CHECKPOINT_VERSION
    written_at: str = ""

    def save(self, output: str | os.PathLike[str]) -> None:
        """Write atomically (temp, fsync, keep the previous one as .prev, rename, fsync folder)."""
        paths = checkpoint_paths(output)
        self.written_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = asdict(self)
        payload = json.dumps(body, sort_keys=True, separators=(",", ":"))
        doc = json.dumps(
            {"hframe_checkpoint": body, "sha256": hashlib.sha256(payload.encode()).hexdigest()},
            sort_keys=True,
            indent=1,
        )
        tmp = paths.temp
        try:
            with open(tmp, "w") as f:
                f.write(doc)
                f.flush()
                os.fsync(f.fileno())
            fault_point("checkpoint-before-rename")
            if paths.checkpoint.exists():
                os.replace(paths.checkpoint, paths.previous)
            fault_point("checkpoint-between-renames")
            os.replace(tmp, paths.checkpoint)
            fsync_dir(paths.checkpoint.parent)
        except OSError as e:
            raise StorageError(f"{paths.checkpoint}: cannot write checkpoint: {e.strerror}") from e

    @property
    def skipped_rejects(self) -> list[Rejected]:
        return [Rejected(p, r) for p, r in self.skipped]


def _parse(path: Path) -> Checkpoint:
    doc = json.loads(path.read_text())
    body = doc["hframe_checkpoint"]
    payload = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(payload.encode()).hexdigest() != doc["sha256"]:
        raise ValueError("checksum mismatch")
    if body.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {body.get('version')} (this hframe writes {CHECKPOINT_VERSION})")
    return Checkpoint(**body)


def load_checkpoint(output: str | os.PathLike[str]) -> tuple[Checkpoint | None, list[str]]:
    """The newest valid checkpoint (current, else previous) and notes about any that were bad."""
    paths = checkpoint_paths(output)
    notes: list[str] = []
    for p in (paths.checkpoint, paths.previous):
        if not p.exists():
            continue
        try:
            return _parse(p), notes
        except (OSError, ValueError, KeyError, TypeError) as e:
            notes.append(f"{p}: torn or invalid checkpoint ignored ({e})")
    return None, notes


def source_fingerprint(sources: SourceList) -> str:
    """What the checkpoint keeps to know its saved source list: a hash of every source's name,
    size and mtime, in order (read from the list's columns: no object per source)."""
    h = hashlib.sha256()
    update = h.update
    for name, size, mtime_ns in zip(sources.names, sources.sizes, sources.mtimes_ns):
        update(len(name).to_bytes(4, "little"))
        update(name)
        update(size.to_bytes(8, "little"))
        update(mtime_ns.to_bytes(8, "little", signed=True))
    return h.hexdigest()


def save_sources(output: str | os.PathLike[str], sources: SourceList) -> None:
    """Keep the run's sorted source list (and what was rejected up front) beside the output."""
    write_source_list(checkpoint_paths(output).sources, sources)


def load_sources(output: str | os.PathLike[str]) -> SourceList:
    return read_source_list(checkpoint_paths(output).sources, "the saved source list")


def write_source_list(path: str | os.PathLike[str], sources: SourceList, created_us: int | None = None) -> None:
    """A sorted source list as Parquet (path, name, size, mtime_ns; the rejected inputs in the
    metadata), written whole or not at all: a run's saved list, or a job array's plan (which
    also keeps ``created_us``, the creation time of every pack made from it)."""
    import pyarrow as pa  # here: the lock and checkpoint files must not need pyarrow
    import pyarrow.parquet as pq

    rejected = json.dumps([[r.path, r.reason] for r in sources.rejected])
    schema = pa.schema(
        [("path", pa.binary()), ("name", pa.binary()), ("size", pa.int64()), ("mtime_ns", pa.int64())],
        metadata={
            b"hframe.rejected": rejected.encode(),
            b"hframe.source_list": b"1",
            **({b"hframe.created_us": str(created_us).encode()} if created_us is not None else {}),
        },
    )
    paths, names, sizes, mtimes = sources.paths, sources.names, sources.sizes, sources.mtimes_ns
    try:
        # the folder is fsynced with the run's first checkpoint, which follows this list
        with replaced(path, durable=False) as tmp, open(tmp, "wb") as f:
            # in slices, one row group each: a list of millions is never all in Arrow at once
            # (the whole list as one table cost 80 MB at 200,000 sources), and no dictionary
            # for paths and names, which are all different
            with pq.ParquetWriter(f, schema, compression="zstd", use_dictionary=["size"]) as writer:
                for i in range(0, max(1, len(names)), _LIST_SLICE):
                    cut = slice(i, i + _LIST_SLICE)
                    part = [_fsencoded(paths[cut]), names[cut], sizes[cut], mtimes[cut]]
                    writer.write_table(
                        pa.Table.from_arrays([pa.array(c, t.type) for c, t in zip(part, schema)], schema=schema)
                    )
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise StorageError(f"{os.fspath(path)}: cannot write: {e.strerror}") from e


_LIST_SLICE = 32768  # sources in one row group of a saved source list


def _fsencoded(paths: list[str]) -> list[bytes]:
    """``[os.fsencode(p) for p in paths]``, encoded as one string (no file's path holds a NUL; an
    archive member's locator does, ``archives.py``: then one by one)."""
    if not paths:
        return []
    out = "\0".join(paths).encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()).split(b"\0")
    return out if len(out) == len(paths) else [os.fsencode(p) for p in paths]


def read_source_list(path: str | os.PathLike[str], what: str = "the source list") -> SourceList:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        t = pq.read_table(path)
        cols = t.to_pydict()
        columns = (list(map(os.fsdecode, cols["path"])), cols["name"], cols["size"], cols["mtime_ns"])
    except (OSError, pa.ArrowInvalid, KeyError) as e:
        raise FormatError(f"{os.fspath(path)}: {what} is missing or unreadable ({e})") from e
    rej = json.loads((t.schema.metadata or {}).get(b"hframe.rejected", b"[]"))
    return SourceList.from_columns(*columns, [Rejected(p, r) for p, r in rej])


def source_list_created(path: str | os.PathLike[str]) -> int | None:
    """The creation time a plan fixes (``write_source_list``), or None (a plan from before
    plans kept one); only the file's footer is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_schema(path).metadata or {}).get(b"hframe.created_us")
        return None if raw is None else int(raw)
    except (OSError, pa.ArrowInvalid, ValueError) as e:
        raise FormatError(f"{os.fspath(path)}: the plan is missing or unreadable ({e})") from e


def remove_checkpoint_files(output: str | os.PathLike[str]) -> None:
    paths = checkpoint_paths(output)
    # the checkpoint itself last: until it is gone, resume can still finish the job
    for p in (paths.sources, paths.previous, paths.temp, paths.checkpoint):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
