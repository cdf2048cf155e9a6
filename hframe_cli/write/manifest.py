"""Writing a dataset's manifest (``index --merge``, the end of a sharded run), and the parts of
a job array it is made from: which exist, which are missing or interrupted."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..durable import write_atomically
from ..errors import InputError
from ..locations import expand_globs, is_remote
from ..names import checkpoint_paths, plan_list_name
from ..read.dataset import Manifest, ShardEntry, get_manifest_path, shard_path
from ..read.reader import PackReader
from .lock import OutputLock

__all__ = ["missing_parts", "part_number", "part_traces", "unfinished_part", "write_manifest"]


def _part_pattern(output: str | os.PathLike[str]) -> re.Pattern[str]:
    """``shard_path``'s names for ``output``, any part number, with any suffix a run adds."""
    p = Path(output)
    head, tail = (p.stem, p.suffix) if p.suffix else (p.name, "")
    return re.compile(re.escape(head) + r"-(\d{5,})" + re.escape(tail) + r"(\..*)?")


def part_traces(output: str | os.PathLike[str]) -> dict[int, list[str]]:
    """The parts of ``output`` (``NAME-0000I.hframe``, job-array parts or shards) its folder
    holds a file of: the shard, or what its run left (partial pack, checkpoint, lock, ...).
    Part number → those file names. Local outputs only."""
    if is_remote(output):
        return {}
    pattern = _part_pattern(output)
    folder = Path(output).parent
    found: dict[int, list[str]] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    for name in sorted(names):
        m = pattern.fullmatch(name)
        if m is not None:
            found.setdefault(int(m.group(1)), []).append(name)
    return found


def part_number(output: str | os.PathLike[str], path: str | os.PathLike[str]) -> int | None:
    """``I`` when ``path`` is part I of ``output`` (``shard_path``, in its folder), else None."""
    if is_remote(output) or is_remote(path):
        return None
    p, o = Path(os.path.abspath(path)), Path(os.path.abspath(output))
    m = _part_pattern(o).fullmatch(p.name)
    return int(m.group(1)) if m is not None and m.group(2) is None and p.parent == o.parent else None


def missing_parts(output: str | os.PathLike[str], missing: Sequence[int]) -> str:
    """The one line that names the missing parts of ``output`` and the command that makes one."""
    out = os.fspath(output)
    plan = plan_list_name(out)
    how = f"hframe pack --plan {plan} -o {out}" if os.path.exists(plan) else f"hframe pack SOURCE... -o {out}"
    paths = ", ".join(os.fspath(shard_path(out, k)) for k in missing)
    if len(missing) == 1:
        return f"part {missing[0]} ({paths}) is missing: run its task again ({how} --shard-of {missing[0]}/N)"
    numbers = ", ".join(map(str, missing))
    return f"parts {numbers} ({paths}) are missing: run their tasks again ({how} --shard-of I/N)"


def unfinished_part(output: str | os.PathLike[str]) -> str | None:
    """A part of ``output`` whose run was interrupted (a checkpoint beside it), if any."""
    for k in sorted(part_traces(output)):
        p = shard_path(output, k)
        if checkpoint_paths(p).checkpoint.exists() or checkpoint_paths(p).previous.exists():
            return os.fspath(p)
    return None


def write_manifest(
    output: str | os.PathLike[str],
    shards: Sequence[str | os.PathLike[str]],
    *,
    check_parts: bool = True,
    lock: OutputLock | None = None,
) -> Manifest:
    """Check every shard (header, trailer, index of that pack) and write the dataset manifest.

    ``shards`` may hold glob patterns (``hframe index OUT --merge 'NAME-*.hframe'``). With
    ``check_parts``, when they include parts of ``output`` (``NAME-0000I.hframe``), a part
    missing before the last one given, or any part of it still interrupted, is refused: a
    dataset is never written without one of its parts. One writer of the manifest at a time:
    ``lock`` is ``output``'s, held by the caller (a sharded run); without it, it is taken here
    (``index --merge``).
    """
    if lock is not None:
        lock.require(output)
        return _write_manifest(output, shards, check_parts)
    with OutputLock(output):
        return _write_manifest(output, shards, check_parts)


def _check_parts(output: str | os.PathLike[str], shards: list[str]) -> None:
    numbers = {part_number(output, s) for s in shards} - {None}
    if not numbers:
        return
    unfinished = unfinished_part(output)
    if unfinished is not None:
        raise InputError(
            f"{unfinished}: interrupted (finish it with 'hframe resume {output}' or run its task again), then merge"
        )
    missing = [k for k in range(max(n for n in numbers if n is not None)) if k not in numbers]
    if missing:
        raise InputError(f"{os.fspath(output)}: {missing_parts(output, missing)}; then merge")


def _write_manifest(
    output: str | os.PathLike[str], shards: Sequence[str | os.PathLike[str]], check_parts: bool = True
) -> Manifest:
    shards = expand_globs(os.fspath(s) for s in shards)
    if check_parts:
        _check_parts(output, shards)
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
    write_atomically(mpath, manifest.to_json())
    return manifest
