"""Packing datasets of several packs (shards): planning the split, job-array parts, the sharded run.

``pack --max-pack-bytes SIZE -o photos.hframe`` writes ``photos-00000.hframe``,
``photos-00001.hframe``, ... (each a complete pack with its own index) and the manifest
``photos.hframe.dataset.json`` listing them in order. ``pack --shard-of i/N`` packs only part
``i`` of the sorted inputs as ``photos-0000i.hframe`` (job arrays); ``hframe index photos.hframe
--merge 'photos-*.hframe'`` writes the manifest afterwards. Reading datasets (the manifest,
``DatasetReader``, ``open_pack``) is ``read/dataset.py``, below the reader's users; this driver sits
above packing.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..durable import write_atomically
from ..errors import FormatError, HframeError, InputError, NothingToResume
from ..faults import fault_point
from ..format.codec import DICT_SIZE
from ..format.index import get_index_path
from ..format.labels import LabelPolicy, parse_split
from ..format.layout import HEADER_SIZE, RECORD_FIXED, TRAILER_SIZE
from ..names import checkpoint_paths
from ..parts import balanced_part
from ..read.dataset import Manifest, get_manifest_path, shard_path
from ..read.reader import PackReader
from ..sources.sourcelist import Source, SourceList
from .checkpoint import (
    load_checkpoint,
    load_sources,
    remove_checkpoint_files,
    save_sources,
    source_fingerprint,
    source_list_created,
)
from .guard import writer_run
from .lock import OutputLock
from .manifest import missing_parts, part_number, part_traces, write_manifest
from .run import PackResult, ResumeResult, resume_single, write_pack
from .settings import PackSettings

__all__ = [
    "DEFAULT_MAX_PACK_BYTES",
    "load_plan",
    "pack_part",
    "pack_sharded",
    "parse_shard_of",
    "plan_shards",
    "resume_sharded",
    "run_shards",
    "split_for_worker",
]

DEFAULT_MAX_PACK_BYTES = 16 << 30  # BRIEF: keep packs around 10-20 GB


#: Room for a frame's metadata in its record header (image size and mode, label, split).
_META_ALLOWANCE = 128


def media_allowances(media: Any) -> tuple[int, int]:
    """(bytes per frame, bytes per shard) that ``media`` options may add beyond the sources:
    the metadata in record headers (longest label and split name), and a stored dictionary."""
    if media is None:
        return _META_ALLOWANCE, 0

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
    sources: SourceList | Sequence[Source],
    max_pack_bytes: int,
    alignment: int = 1,
    per_frame: int = _META_ALLOWANCE,
    per_shard: int = 0,
) -> list[tuple[int, int]]:
    """Split the sorted sources into consecutive runs whose packs stay under ``max_pack_bytes``.

    ``per_frame`` and ``per_shard`` are the most the media options add (``media_allowances``).
    Returns [start, stop) index ranges; a single source larger than the limit gets a shard alone.
    A ``SourceList`` is read by its columns (no object per source).
    """
    if max_pack_bytes < 1:
        raise InputError(f"--max-pack-bytes must be positive (got {max_pack_bytes})")
    if isinstance(sources, SourceList):
        names, sizes = sources.names, sources.sizes
    else:
        names, sizes = [s.name for s in sources], [s.size for s in sources]
    # an upper bound on what a source adds to a pack: its record header (metadata included), name,
    # bytes and padding (not for videos cut into frames, whose size is unknown until decoded;
    # compression only makes it smaller)
    fixed = RECORD_FIXED + per_frame + alignment - 1
    empty = HEADER_SIZE + TRAILER_SIZE + per_shard
    if empty + fixed * len(names) + sum(map(len, names)) + sum(sizes) <= max_pack_bytes:
        return [(0, len(names))]  # everything fits (the common case: no loop)
    ranges: list[tuple[int, int]] = []
    start, size = 0, empty
    for k, (name, nbytes) in enumerate(zip(names, sizes)):
        b = fixed + len(name) + nbytes
        if k > start and size + b > max_pack_bytes:
            ranges.append((start, k))
            start, size = k, empty
        size += b
    ranges.append((start, len(names)))
    return ranges


def parse_shard_of(text: str, environ: Any = None) -> tuple[int, int]:
    """``"3/8"`` → (3, 8): worker 3 of 8, counting from 0. ``"env"`` takes both from a Slurm
    job array (``SLURM_ARRAY_TASK_ID`` minus ``SLURM_ARRAY_TASK_MIN``, ``SLURM_ARRAY_TASK_COUNT``);
    ``"env/N"`` takes I from Slurm or from a Kubernetes Indexed Job (``JOB_COMPLETION_INDEX``),
    which gives no count, and N as written."""
    env = os.environ if environ is None else environ
    head, sep, tail = text.partition("/")
    if head == "env":
        i, n = _job_array_index(env, tail if sep else None, text)
    else:
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise InputError(f"--shard-of: {text!r} is not I/N (for example 3/8), env or env/N") from None
    if n < 1 or not 0 <= i < n:
        raise InputError(f"--shard-of {text}: I must be in 0..N-1 and N at least 1 (got {i}/{n})")
    return i, n


def _job_array_index(env: Any, count: str | None, text: str) -> tuple[int, int]:
    """(I, N) from the job array's environment (``parse_shard_of``)."""

    def number(name: str) -> int:
        try:
            return int(env[name])
        except ValueError:
            raise InputError(f"--shard-of {text}: {name}={env[name]!r} is not a number") from None

    n = None
    if count is not None:
        try:
            n = int(count)
        except ValueError:
            raise InputError(f"--shard-of {text}: N must be a number (env/N)") from None
    if "SLURM_ARRAY_TASK_ID" in env:
        i = number("SLURM_ARRAY_TASK_ID") - (number("SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0)
        if env.get("SLURM_ARRAY_TASK_STEP", "1") != "1" or (
            "SLURM_ARRAY_TASK_MAX" in env
            and "SLURM_ARRAY_TASK_COUNT" in env
            and number("SLURM_ARRAY_TASK_MAX")
            - (number("SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0)
            + 1
            != number("SLURM_ARRAY_TASK_COUNT")
        ):
            raise InputError(
                f"--shard-of {text}: a Slurm array with a step or a list (--array=0-15:2, --array=1,3,5) "
                "cannot name parts; use --array=0-(N-1)"
            )
        if "SLURM_ARRAY_TASK_COUNT" in env:
            slurm_n = number("SLURM_ARRAY_TASK_COUNT")
            if n is not None and n != slurm_n:
                raise InputError(f"--shard-of {text}: the Slurm array has {slurm_n} tasks, not {n}")
            n = slurm_n
        if n is None:
            raise InputError(f"--shard-of {text}: SLURM_ARRAY_TASK_COUNT is not set; give the count as env/N")
        if i >= n:
            raise InputError(
                f"--shard-of {text}: task {i} of {n}: a Slurm array with a step (--array=0-15:2) cannot "
                "name parts; use --array=0-(N-1)"
            )
        return i, n
    if "JOB_COMPLETION_INDEX" in env:
        if n is None:
            raise InputError(f"--shard-of {text}: a Kubernetes Indexed Job gives no count; use env/N (N = completions)")
        return number("JOB_COMPLETION_INDEX"), n
    raise InputError(
        f"--shard-of {text}: no job-array index in the environment (Slurm: SLURM_ARRAY_TASK_ID and "
        "SLURM_ARRAY_TASK_COUNT; Kubernetes Indexed Job: JOB_COMPLETION_INDEX, with env/N)"
    )


def pack_part(
    sources: SourceList,
    output: str | os.PathLike[str],
    shard_of: str,
    settings: PackSettings,
    *,
    lock: OutputLock,
    plan: str | None = None,
    force: bool = False,
) -> PackResult:
    """``pack --shard-of I/N``: pack part I of N of the sorted sources as ``NAME-0000I.hframe``
    (whose ``lock`` the caller holds).

    The task's command line run again after it was killed continues the part from its
    checkpoint when the checkpoint is of this part (same sources and settings), else packs the
    part again from the start: either way the shard is the bytes of an uninterrupted part. A
    ``plan`` (``--plan``) fixes the creation time unless ``settings.created_us`` does.
    """
    i, n = parse_shard_of(shard_of)
    path = os.fspath(shard_path(output, i))
    lock.require(path)
    part = SourceList(split_for_worker(sources.sources, i, n), sources.rejected if i == 0 else [])
    if not part.sources:
        raise InputError(f"--shard-of {shard_of}: part {i} of {n} is empty ({len(sources.sources)} sources)")
    if settings.created_us is None and plan is not None:
        settings = replace(settings, created_us=source_list_created(plan))
    if not force and _interrupted(path):
        done = _continue_part(path, part, i, n, settings, lock)
        if done is not None:
            return done
        force = True  # the interrupted run was not this part's: its partial pack goes
    return write_pack(part, path, settings, lock=lock, force=force)


def _interrupted(path: str | os.PathLike[str]) -> bool:
    """Whether a run of ``path`` left a checkpoint (the current one, or only the previous one
    when it was killed between the two renames of a checkpoint)."""
    paths = checkpoint_paths(path)
    return paths.checkpoint.exists() or paths.previous.exists()


def _continue_part(
    path: str, part: SourceList, i: int, n: int, settings: PackSettings, lock: OutputLock
) -> PackResult | None:
    """Resume the interrupted run of part ``i`` at ``path`` if its checkpoint is of this part
    (``pack_part``); None when it is not (then the part is packed again)."""
    ckpt, _ = load_checkpoint(path)
    try:
        media = settings.media.with_label_csv_fixed()  # as the run being continued saw it: absolute, with its SHA-256
    except InputError:
        media = settings.media  # (an unreadable labels CSV never matches: the part is packed again, which says why)
    want = {"alignment": settings.alignment, "skip_bad": settings.skip_bad, "media": media.to_dict()}
    if settings.created_us is not None:
        want["created_us"] = settings.created_us
    if (
        ckpt is None
        or ckpt.fingerprint != source_fingerprint(part)
        or any(ckpt.options.get(k) != v for k, v in want.items())
    ):
        settings.note(f"part {i} of {n}: {path} was interrupted packing other sources or options; packing it again")
        return None
    settings.note(f"part {i} of {n}: continuing the interrupted run of {path}")
    outcome = resume_single(path, settings, lock=lock)
    if outcome.result is not None:
        return outcome.result
    return published_result(path, ckpt.frames)  # it was killed while publishing


def published_result(path: str, resumed_from: int | None) -> PackResult:
    """A ``PackResult`` for a pack that is already published (its run finished by ``resume``)."""

    with PackReader(path) as r:
        return PackResult(
            path=path,
            index_path=os.fspath(get_index_path(path)),
            uuid=r.info.uuid,
            frame_count=len(r),
            payload_bytes=r.info.trailer.payload_bytes,
            pack_bytes=r.info.size,
            pack_time=r.info.pack_time,
            self_checked=0,
            elapsed_s=0.0,
            resumed_from_frame=resumed_from,
        )


def split_for_worker(sources: Sequence[Source], i: int, n: int) -> list[Source]:
    """Part ``i`` of ``n`` of the sorted sources: contiguous, disjoint, covering all of them,
    balanced by bytes (``parts.balanced_part``; an empty file weighs as one byte)."""
    lo, hi = balanced_part([max(1, s.size) for s in sources], i, n)
    return list(sources[lo:hi])


def save_plan(output: str | os.PathLike[str], ranges: list[tuple[int, int]], settings: PackSettings) -> None:
    """The sharded run's intent: the shard ranges over the saved source list, and its recorded
    settings (``PackSettings.to_dict``)."""
    doc = {"ranges": ranges, "options": settings.to_dict()}
    write_atomically(checkpoint_paths(output).plan, json.dumps(doc, indent=1))


def load_plan(output: str | os.PathLike[str]) -> tuple[list[tuple[int, int]], dict[str, Any]] | None:
    path = checkpoint_paths(output).plan
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: unreadable plan of a sharded run ({e})") from e
    return [(int(a), int(b)) for a, b in doc["ranges"]], doc["options"]


def remove_plan(output: str | os.PathLike[str]) -> None:
    try:
        os.unlink(checkpoint_paths(output).plan)
    except FileNotFoundError:
        pass


# -- packing a dataset (the driver behind pack --max-pack-bytes and resume) ---------------


def pack_sharded(
    sources: SourceList,
    out: str,
    settings: PackSettings,
    *,
    lock: OutputLock,
    max_pack_bytes: int,
    force: bool = False,
) -> tuple[Manifest | None, list[PackResult]]:
    """Pack ``sources`` as shards ``NAME-00000.hframe``... of at most ``max_pack_bytes`` each,
    plus the manifest ``NAME.dataset.json``; one plain pack when everything fits. The caller
    holds ``out``'s ``lock``; each shard is written under its own.

    A sharded run saves its plan (the source list and shard ranges) first; if it is interrupted,
    ``resume_sharded`` (``hframe resume``) keeps the finished shards, resumes the interrupted one
    and packs the rest. Returns the manifest (None for a single pack) and the shards' results.
    """
    lock.require(out)
    ranges = plan_shards(sources, max_pack_bytes, settings.alignment, *media_allowances(settings.media))
    mpath = get_manifest_path(out)
    if not force and (mpath.exists() if len(ranges) == 1 else os.path.exists(out)):
        other = "a dataset (its manifest)" if len(ranges) == 1 else "a single pack"
        raise InputError(f"{out}: already exists as {other} (use --force to replace it)")
    if len(ranges) == 1:
        result = write_pack(sources, out, settings, lock=lock, force=force)
        retire_other_form(out, dataset=False)  # a dataset it replaces (--force) would hide it
        return None, [result]

    if not force:
        for p in [get_manifest_path(out), *(shard_path(out, k) for k in range(len(ranges)))]:
            if os.path.exists(p):
                raise InputError(f"{p}: already exists (use --force to replace the dataset)")
    if settings.created_us is None:
        settings = replace(settings, created_us=time.time_ns() // 1000)  # one creation time for every shard
    save_sources(out, sources)
    save_plan(out, ranges, settings)
    return run_shards(out, sources, ranges, settings, lock=lock, force=force)


def run_shards(
    out: str,
    sources: SourceList,
    ranges: list[tuple[int, int]],
    settings: PackSettings,
    *,
    lock: OutputLock,
    force: bool,
    resuming: bool = False,
) -> tuple[Manifest, list[PackResult]]:
    """Write (or resume, or keep) every shard of a sharded run's plan, each under its own lock,
    then the manifest (under ``out``'s ``lock``, which the caller holds)."""
    lock.require(out)
    # a shard holds a fixed part of the planned sources (a SourceList without ``collect``): on
    # resume its files are checked for changes, but folders are not walked again
    results = []
    paths = []
    for k, (a, b) in enumerate(ranges):
        path = os.fspath(shard_path(out, k))
        paths.append(path)
        part = SourceList(sources.sources[a:b], list(sources.rejected) if k == 0 else [])
        published = os.path.exists(path) and get_index_path(path).exists()
        if resuming and published and not checkpoint_paths(path).checkpoint.exists():
            settings.note(f"shard {k + 1} of {len(ranges)}: {path} already complete")  # published by this plan
            with OutputLock(path):  # a lock file its run left when it was killed goes with this one
                pass
            continue
        with writer_run(path, handle_signals=settings.handle_signals, on_event=settings.on_event) as shard_lock:
            if checkpoint_paths(path).checkpoint.exists():
                settings.note(f"shard {k + 1} of {len(ranges)}: resuming {path}")
                outcome = resume_single(path, settings, lock=shard_lock)
                if outcome.result is not None:
                    results.append(outcome.result)
                continue
            settings.note(f"shard {k + 1} of {len(ranges)}: {b - a} sources -> {path}")
            results.append(write_pack(part, path, settings, lock=shard_lock, force=force or resuming))
    stale = _shards_of(out)
    manifest = write_manifest(out, paths, check_parts=False, lock=lock)  # (its own plan: stale shards may stand beside)
    retire_other_form(out, dataset=True, stale_shards=[p for p in stale if p not in map(os.fspath, paths)])
    remove_plan(out)
    fault_point("after-manifest")  # a kill here leaves the source list; resume finds the dataset complete
    remove_checkpoint_files(out)
    return manifest, results


def _shards_of(out: str) -> list[str]:
    """The shard files of ``out``'s own naming (``NAME-NNNNN.hframe`` beside it) that the
    manifest at ``out`` names now: packs a ``--merge`` gathered from elsewhere are never
    counted (none without a readable manifest)."""

    mpath = get_manifest_path(out)
    if not mpath.exists():
        return []
    try:
        named = [os.fspath(p) for p in Manifest.load(mpath).shard_paths(mpath)]
    except HframeError:
        return []
    return [p for p in named if own_shard(out, p)]


def own_shard(out: str, path: str) -> bool:
    """Whether ``path`` is named as ``out``'s shards are (``shard_path``), in its folder (both
    local paths, or both URLs: compared without their queries)."""
    if "://" in out:
        out, path = out.partition("?")[0], path.partition("?")[0]
        split, folder_of = posixpath.split, posixpath.dirname
    else:
        out, path = os.path.abspath(out), os.path.abspath(path)
        split, folder_of = os.path.split, os.path.dirname
    stem, dot, suffix = split(out)[1].rpartition(".")
    pattern = re.escape(stem) + r"-\d{5}\." + re.escape(suffix) if dot else re.escape(suffix) + r"-\d{5}"
    folder, name = split(path)
    return folder == folder_of(out) and re.fullmatch(pattern, name) is not None


def retire_other_form(out: str, *, dataset: bool, stale_shards: Sequence[str] = ()) -> None:
    """After ``out`` was published as a dataset (``dataset``) or as one pack, remove what the
    other form left there (``pack --force`` from one form to the other): a single pack at
    ``out`` hides nothing, but readers take it over a manifest, and a manifest hides nothing but
    a missing pack; either would keep readers on the old version. Shards no manifest names any
    longer go too. Readers that opened them keep their open files."""
    if dataset:
        doomed = [out, *stale_shards]
    else:
        doomed = [os.fspath(get_manifest_path(out)), *_shards_of(out)]
    for p in doomed:
        for f in (p, os.fspath(get_index_path(p))):
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass


def resume_sharded(
    out: str, plan: tuple[list[tuple[int, int]], dict[str, Any]], settings: PackSettings, *, lock: OutputLock
) -> ResumeResult:
    """Continue an interrupted sharded run from its saved plan with the settings it recorded
    (``out``'s ``lock`` held by the caller): finished shards are kept, the interrupted one
    resumed, the rest packed."""
    ranges, recorded = plan
    saved_all = load_sources(out)
    settings.note(f"resume: sharded run of {out}: {len(ranges)} shards")
    settings = settings.restored(recorded)
    manifest, results = run_shards(out, saved_all, ranges, settings, lock=lock, force=False, resuming=True)
    return ResumeResult("resumed", results[-1] if results else None, [], manifest)


def resume_parts(out: str, settings: PackSettings, *, lock: OutputLock) -> ResumeResult | None:
    """``resume`` of a dataset whose parts are packed apart (a job array, ``--shard-of``), or a
    finished sharded dataset (``out``'s ``lock`` held by the caller): every part with a
    checkpoint is resumed (each under its own lock, with the settings its checkpoint recorded),
    then the parts are checked. None when ``out`` has no parts and no manifest (not a dataset).

    A dataset is complete only when every part up to the last one seen (and every shard its
    manifest names) is a finished pack. A manifest written before a part was resumed is
    written again over the same parts. Parts are never merged when there is no manifest yet
    (only the job array knows how many there are: ``hframe index OUT --merge``).

    Raises:
        NothingToResume: a part is missing (the line names it and the command that packs it),
            or there is nothing to resume and no manifest (the line says to merge).
    """

    lock.require(out)
    mpath = get_manifest_path(out)
    traces = part_traces(out)
    if not traces and not mpath.exists():
        return None
    resumed: list[PackResult] = []
    notes: list[str] = []
    for k in sorted(traces):
        path = os.fspath(shard_path(out, k))
        if _interrupted(path):
            settings.note(f"part {k}: resuming the interrupted run of {path}")
            with writer_run(path, handle_signals=settings.handle_signals, on_event=settings.on_event) as part_lock:
                outcome = resume_single(path, settings, lock=part_lock)
            notes += outcome.notes
            resumed.append(outcome.result or published_result(path, None))
    listed = Manifest.load(mpath).shard_paths(mpath) if mpath.exists() else []
    finished = _finished_parts(out, set(traces), listed)
    parts = [os.fspath(shard_path(out, k)) for k in sorted(finished)]
    if not listed:
        if not resumed:
            raise NothingToResume(
                f"{out}: nothing to resume: parts 0-{max(finished)} are finished; merge them "
                f"(hframe index {out} --merge {shlex.quote(_parts_glob(out))})"
            )
        notes.append(
            f"{out}: parts 0-{max(finished)} are finished; merge them "
            f"(hframe index {out} --merge {shlex.quote(_parts_glob(out))})"
        )
        return ResumeResult("resumed", resumed[-1], notes)
    # the manifest is written again over the shards it lists, never over more: part files beside
    # it that it does not list may be left by another job array (another N) and are only named
    unlisted = sorted({os.path.abspath(p) for p in parts} - {os.path.abspath(p) for p in listed})
    if unlisted:
        notes.append(
            f"{out}: {len(unlisted)} part file(s) beside the dataset are not in its manifest and were left "
            f"out ({', '.join(os.path.basename(p) for p in unlisted[:3])}{', ...' if len(unlisted) > 3 else ''}); "
            f"if they belong to it, merge again: hframe index {out} --merge {shlex.quote(_parts_glob(out))}"
        )
    if resumed:
        manifest = write_manifest(out, listed, check_parts=False, lock=lock)
        settings.note(f"{out}: wrote {mpath} again ({len(manifest.shards)} shards, {manifest.frame_count} frames)")
        return ResumeResult("resumed", resumed[-1], notes, manifest)
    settings.note(f"{out}: dataset already complete ({mpath}); nothing to resume")
    remove_checkpoint_files(out)  # what a sharded run killed after its manifest left (its source list)
    return ResumeResult("already_complete", None, notes)


def _finished_parts(out: str, numbers: set[int], listed: list[str]) -> set[int]:
    """The numbers of ``out``'s parts, all finished: those with a file beside it (``numbers``)
    and those its manifest names (``listed``).

    Raises:
        NothingToResume: a part before the last one seen is missing or unfinished, or a shard
            the manifest names that is not a part is.
    """

    numbers = numbers | {k for k in (part_number(out, p) for p in listed) if k is not None}
    finished = {k for k in numbers if _finished(shard_path(out, k))}
    for k in sorted(numbers - finished):  # a run killed before its first checkpoint left a lock
        with OutputLock(shard_path(out, k)):  # file (taken over and removed), or runs now (refused)
            pass
    missing = [k for k in range(max(numbers) + 1) if k not in finished] if numbers else []
    if missing:
        raise NothingToResume(f"{out}: {missing_parts(out, missing)}")
    gone = [p for p in listed if part_number(out, p) is None and not _finished(p)]
    if gone:
        raise NothingToResume(f"{out}: {gone[0]}, a shard the dataset names, is missing or unfinished")
    return finished


def _finished(path: str | os.PathLike[str]) -> bool:
    return os.path.exists(path) and get_index_path(path).exists() and not _interrupted(path)


def _parts_glob(out: str) -> str:
    p = Path(out)
    return os.fspath(p.with_name(f"{p.stem}-*{p.suffix}") if p.suffix else p.with_name(f"{p.name}-*"))
