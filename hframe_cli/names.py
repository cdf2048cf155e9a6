"""The names of the files beside a pack: one place spells every suffix (``man/hframe.5``, FILES).

``OUT`` is the pack (or, for a sharded dataset, the name its manifest and shards are made from):

- ``OUT.partial``, ``OUT.index.parquet.partial``: a pack and index being written; any file
  written whole-or-not-at-all (``durable.py``) goes through ``NAME.partial`` too;
- ``OUT.index.parquet``: the index; ``OUT.dataset.json``: a sharded dataset's manifest;
- ``OUT.lock``: the output lock; ``OUT.ckpt``, ``OUT.ckpt.prev``: checkpoints (``OUT.ckpt.tmp``
  while one is written);
- ``OUT.sources.parquet``: the source list a run fixed; ``OUT.dataset.plan.json``: a sharded run's
  plan; ``OUT.plan.parquet``: ``pack --plan-only``'s list for job arrays.

A dataset's shards (and a job array's parts) are ``NAME-00003.hframe`` beside it (``shard_path``).
The name functions take a local path or a URL (the suffix goes on a URL's path, before any
query). Imports nothing of hframe but ``locations``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .locations import with_suffix

__all__ = [
    "CHECKPOINT_SUFFIX",
    "CheckpointPaths",
    "checkpoint_paths",
    "INDEX_SUFFIX",
    "LEFTOVER_SUFFIXES",
    "MANIFEST_SUFFIX",
    "PARTIAL_SUFFIX",
    "STDIN_SUFFIX",
    "checkpoint_name",
    "index_name",
    "lock_name",
    "manifest_name",
    "partial_name",
    "plan_list_name",
    "previous_checkpoint_name",
    "shard_path",
    "sharded_plan_name",
    "source_list_name",
    "stdin_name",
]

PARTIAL_SUFFIX = ".partial"
INDEX_SUFFIX = ".index.parquet"
MANIFEST_SUFFIX = ".dataset.json"
LOCK_SUFFIX = ".lock"
CHECKPOINT_SUFFIX = ".ckpt"
PREVIOUS_SUFFIX = ".ckpt.prev"
CHECKPOINT_TEMP_SUFFIX = ".ckpt.tmp"
SOURCES_SUFFIX = ".sources.parquet"
SHARDED_PLAN_SUFFIX = ".dataset.plan.json"
PLAN_LIST_SUFFIX = ".plan.parquet"
STDIN_SUFFIX = ".stdin"  # an archive read from standard input, kept until the run is published

#: what only a running or stopped run leaves beside its output: none is there once it finished
LEFTOVER_SUFFIXES = (
    PARTIAL_SUFFIX,
    LOCK_SUFFIX,
    CHECKPOINT_SUFFIX,
    PREVIOUS_SUFFIX,
    CHECKPOINT_TEMP_SUFFIX,
    SOURCES_SUFFIX,
    SHARDED_PLAN_SUFFIX,
    STDIN_SUFFIX,
)

Location = str | os.PathLike[str]


def partial_name(path: Location) -> str:
    """Where ``path`` is written before it is renamed into place."""
    return with_suffix(path, PARTIAL_SUFFIX)


def index_name(pack: Location) -> str:
    return with_suffix(pack, INDEX_SUFFIX)


def manifest_name(output: Location) -> str:
    return with_suffix(output, MANIFEST_SUFFIX)


def stdin_name(output: Location) -> str:
    """Where ``pack --from tar -`` keeps the archive it read from standard input (``api.py``)."""
    return os.fspath(output) + STDIN_SUFFIX


def lock_name(output: Location) -> str:
    return os.fspath(output) + LOCK_SUFFIX


def checkpoint_name(output: Location) -> str:
    return os.fspath(output) + CHECKPOINT_SUFFIX


def previous_checkpoint_name(output: Location) -> str:
    return os.fspath(output) + PREVIOUS_SUFFIX


def source_list_name(output: Location) -> str:
    return os.fspath(output) + SOURCES_SUFFIX


def sharded_plan_name(output: Location) -> str:
    return os.fspath(output) + SHARDED_PLAN_SUFFIX


def plan_list_name(output: Location) -> str:
    return with_suffix(output, PLAN_LIST_SUFFIX)


@dataclass(frozen=True)
class CheckpointPaths:
    """The files a run keeps beside its output while it runs (``man/hframe.5``, CHECKPOINTS)."""

    checkpoint: Path
    previous: Path
    sources: Path
    lock: Path
    plan: Path  # a sharded run's plan (``shards.save_plan``)
    temp: Path  # a checkpoint being written, before it is renamed to ``checkpoint``


def checkpoint_paths(output: Location) -> CheckpointPaths:
    return CheckpointPaths(
        Path(checkpoint_name(output)),
        Path(previous_checkpoint_name(output)),
        Path(source_list_name(output)),
        Path(lock_name(output)),
        Path(sharded_plan_name(output)),
        Path(os.fspath(output) + CHECKPOINT_TEMP_SUFFIX),
    )


def shard_path(output: str | os.PathLike[str], i: int) -> Path:
    """``photos.hframe`` → ``photos-00003.hframe`` (``-00003`` appended when there is no suffix)."""
    p = Path(output)
    if p.suffix:
        return p.with_name(f"{p.stem}-{i:05d}{p.suffix}")
    return p.with_name(f"{p.name}-{i:05d}")
