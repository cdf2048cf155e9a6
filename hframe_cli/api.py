"""The front door: ``pack`` and ``resume`` exactly as the ``hframe`` command runs them.

``pack(paths, output, options)`` takes the output lock first (``guard.writer_run``: before a
source is listed or a plan made), lists the sources, then dispatches: ``update`` →
``update.update_pack``; ``shard_of`` → one part of a job array (``shards.pack_part``, locking
its own shard); otherwise ``shards.pack_sharded`` (one plain pack when everything fits
``max_pack_bytes``). ``resume(output)`` continues an interrupted run, sharded or not.

The CLI builds a ``PackOptions`` from its flags, calls one of these and renders the outcome; a
Python caller gets the same decisions. This module imports nothing heavy at load time, so a run
that finds its output locked gives up before pyarrow is loaded.

Imports inside functions: every ``write``/``read``/``storage`` module a mode needs, in that mode
only; a run that finds its output locked gives up before pyarrow is loaded
(``tests/test_structure.py`` checks it).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, BinaryIO

from .durable import special_file
from .errors import InputError, Interrupted, NothingToResume, PackLocked
from .locations import is_remote, shown_url
from .names import checkpoint_name, partial_name, plan_list_name, previous_checkpoint_name, stdin_name
from .sources.archives import label_extension
from .sources.inputs import DEFAULT_MAX_FRAME_BYTES, collect_sources
from .sources.tables import TableColumns
from .write.guard import writer_run

if TYPE_CHECKING:
    from .read.dataset import Manifest
    from .sources.media import MediaOptions
    from .sources.sourcelist import SourceList
    from .write.lock import OutputLock
    from .write.run import CheckpointPolicy, PackResult, ResumeResult
    from .write.settings import PackSettings
    from .write.update import UpdatePlan
    from .write.upload import PublishReport

__all__ = ["PackOptions", "PackOutcome", "pack", "resume_pack"]

EventFn = Callable[[str], None]
ProgressFn = Callable[[int, int], None]


@dataclass
class PackOptions:
    """Everything ``hframe pack`` can be told, besides the sources and the output.

    Attributes follow the command's flags (``man/hframe.1``); ``None`` means the command's
    default. ``progress`` is called once the sources are listed, with (frames, bytes), and
    returns a context manager that yields the per-frame progress callback (or None).
    """

    #: ``tar``, ``zip`` or ``parquet``: every path is such a file, and its members or rows are
    #: the sources (``parquet`` needs ``table_columns``)
    archives: str | None = None
    table_columns: TableColumns | None = None
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    base: str | None = None
    stdin: BinaryIO | None = None  # where a "-" source reads its list
    null_separated: bool = False
    skip_bad: bool = False
    allow_empty: bool = False
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    force: bool = False
    alignment: int = 1
    created_us: int | None = None
    self_check_frames: int | None = None
    workers: int | None = None
    checkpoints: CheckpointPolicy | None = None
    max_pack_bytes: int | None = None
    shard_of: str | None = None
    update: bool = False
    #: list the sources once and write them (sorted, checked) to ``OUT.plan.parquet``, nothing else
    plan_only: bool = False
    #: take the sources from this plan file (``plan_only`` wrote it) instead of listing them
    plan: str | None = None
    checksum: bool = False
    dry_run: bool = False  # with update: the plan, nothing written or locked (mode "dry-run")
    media: MediaOptions | None = None
    wait: float = 0.0
    skip_if_locked: bool = False  # another run holds the output: do nothing (mode "skipped")
    handle_signals: bool = False
    on_event: EventFn | None = None
    on_warning: EventFn | None = None
    progress: Callable[[int, int], AbstractContextManager[ProgressFn | None]] | None = None


@dataclass
class PackOutcome:
    """What ``pack`` did: ``mode`` is pack, sharded, part, update, dry-run (``plan`` is what
    ``update`` would do) or skipped (``skip_if_locked`` met a lock; ``skipped`` says whose).

    ``results`` holds one ``PackResult`` per pack written (none for an update that found
    nothing to do); for a single pack its fields are also readable here (``outcome.frame_count``).
    """

    mode: str
    output: str
    results: list[PackResult] = field(default_factory=list)
    manifest: Manifest | None = None
    plan: UpdatePlan | None = None
    skipped: str | None = None
    #: an object-store output: what was uploaded (``upload.PublishReport``)
    published: PublishReport | None = None
    #: mode "plan": the plan file written, and how many files and bytes it lists
    plan_file: str | None = None
    planned: tuple[int, int] | None = None

    @property
    def result(self) -> PackResult | None:
        return self.results[-1] if self.results else None

    def __getattr__(self, name: str) -> Any:
        results = self.__dict__.get("results") or []
        if len(results) == 1 and not name.startswith("_"):
            return getattr(results[0], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


def pack(
    paths: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    options: PackOptions | None = None,
    **kw: Any,
) -> PackOutcome:
    """Pack ``paths`` (files, folders, or ``-`` for a list on ``options.stdin``) into ``output``:
    the library form of ``hframe pack``, with the same decisions.

    Options come as a ``PackOptions`` or as its fields by keyword (``h.pack(["photos/"],
    "p.hframe", update=True)``).

    Raises:
        PackLocked: another run holds the output (after ``wait`` seconds).
        InputError, IntegrityError, StorageError, Interrupted: as ``pack_sources``.
    """
    opts = options or PackOptions()
    if kw:
        known = {f.name for f in fields(PackOptions)}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise TypeError(f"pack() got unknown option(s): {', '.join(unknown)}")
        opts = PackOptions(**{**{f.name: getattr(opts, f.name) for f in fields(PackOptions)}, **kw})
    out = os.fspath(output)
    if opts.dry_run and not opts.update:
        raise InputError("--dry-run only applies with --update (on a pack that does not exist, every file is new)")
    if is_remote(out):
        return _pack_remote([os.fspath(p) for p in paths], out, opts)
    if os.path.isdir(out):  # before the lock: OUT.lock, .partial and the rest would sit beside it
        raise InputError(f"{out}: is a folder; -o names the pack file to write (e.g. -o {out.rstrip('/')}/NAME.hframe)")
    if special_file(out):  # (a pack is renamed into place: --force over /dev/null would replace it)
        raise InputError(f"{out}: is not a regular file (a device or pipe); -o names the pack file to write")
    target = out
    if opts.shard_of is not None and (opts.update or opts.plan_only):
        raise InputError(
            f"--shard-of packs a new part; it cannot be combined with {'--update' if opts.update else '--plan-only'}"
        )
    if opts.dry_run:  # reads only: no lock taken, nothing an earlier run left is settled
        return _dry_run([os.fspath(p) for p in paths], out, opts)
    if opts.shard_of is not None:  # a job-array part writes (and locks) its own shard
        from .read.dataset import shard_path
        from .write.shards import parse_shard_of

        target = os.fspath(shard_path(out, parse_shard_of(opts.shard_of)[0]))
    try:
        with writer_run(
            target,
            wait=opts.wait,
            handle_signals=opts.handle_signals,
            on_event=opts.on_event,
            on_warning=opts.on_warning,
        ) as lock:
            return _pack_locked([os.fspath(p) for p in paths], out, opts, lock)
    except PackLocked as e:
        if not opts.skip_if_locked:
            raise
        return PackOutcome("skipped", target, skipped=str(e))


def _dry_run(paths: list[str], out: str, opts: PackOptions, *, held: bool = False) -> PackOutcome:
    """``pack --update --dry-run``: the update's plan without its lock or any write. A live run
    holding the output is reported as the update would report it (``PackLocked``, or "skipped");
    a dead run's lock is described, not taken over. ``held``: this run holds the lock (a remote
    output's staged build), so there is no other holder to look for."""
    from .write.lock import peek_lock
    from .write.update import dry_run

    try:
        holder = None if held else peek_lock(out, wait=opts.wait)
    except PackLocked as e:
        if not opts.skip_if_locked:
            raise
        return PackOutcome("skipped", out, skipped=str(e))
    media, srcs = _media_and_sources(paths, out, opts)
    plan = dry_run(srcs, out, checksum=opts.checksum, media=media)
    if holder is not None:
        stale = f"a stale lock left by a run that died ({holder.removeprefix('stale: ')}) would be taken over"
        plan.leftover = f"{stale}; {plan.leftover}" if plan.leftover else stale
    return PackOutcome("dry-run", out, plan=plan)


def _pack_remote(paths: list[str], url: str, opts: PackOptions) -> PackOutcome:
    """``pack`` to an object store: build in the staging folder (locked as a local output),
    then publish (``write/upload.py``). Without ``--update`` or ``--force`` a pack already published
    there is refused, as a local one is."""

    from .storage.objectstore import check_bucket
    from .storage.policy import RequestPolicy
    from .write.upload import fetch_for_update, finish_interrupted_publish, publish, published_version, staging_path

    shown = shown_url(url)
    if opts.shard_of is not None:
        raise InputError(f"{shown}: --shard-of writes parts to a local or shared folder, not to a remote location")
    stage = staging_path(url)
    try:
        with (
            _remote_interruptions(url),
            writer_run(
                stage,
                wait=opts.wait,
                handle_signals=opts.handle_signals,
                on_event=opts.on_event,
                on_warning=opts.on_warning,
            ) as lock,
        ):
            check_bucket(url, RequestPolicy.from_env())  # before anything is built for it
            if opts.update:
                finish_interrupted_publish(url, opts.on_event)  # its index is the one to update
                fetch_for_update(url, stage, opts.on_event)
            elif not opts.force and published_version(url):
                raise InputError(f"{shown}: already exists (--force replaces it, --update adds to it)")
            staged = replace(opts, force=opts.force or not opts.update)
            if opts.dry_run:
                local = _dry_run(paths, stage, staged, held=True)
            else:
                local = _pack_locked(paths, stage, staged, lock)
            if local.mode in ("dry-run", "plan"):  # nothing built to publish (a plan stays staged)
                return replace(local, output=shown)
            report = publish(stage, url, opts.on_event)
    except PackLocked as e:
        if not opts.skip_if_locked:
            raise
        return PackOutcome("skipped", shown, skipped=str(e))
    results = [report.remote_result(r) for r in local.results]
    return replace(local, output=shown, results=results, published=report)


@contextmanager
def _remote_interruptions(url: str) -> Iterator[None]:
    """A signal during a build or upload for ``url``, told in its terms (not the staging
    folder's): what readers see there and that ``resume`` goes on."""

    try:
        yield
    except Interrupted as e:
        how = re.search(r"interrupted by \w+", str(e))
        shown = shown_url(url)
        raise Interrupted(
            f"{shown}: {how.group(0) if how else 'interrupted'}; readers there see a complete version "
            f"(the one before, or this one); 'hframe resume {shown}' finishes the build and the upload"
        ) from None


def _resume_remote(url: str, settings: PackSettings, *, rescan: bool, wait: float) -> ResumeResult:
    """``resume`` of an object-store output: finish the staged build if it was interrupted,
    then publish what is not at the location yet (an interrupted upload goes on where it
    stopped, pack by pack)."""

    from .read.dataset import manifest_location
    from .write.run import ResumeResult
    from .write.upload import publish, staging_path

    shown = shown_url(url)
    stage = staging_path(url, create=False)
    if not os.path.isdir(os.path.dirname(stage)):
        raise NothingToResume(f"{shown}: nothing to resume (no build of it in {os.path.dirname(stage)})")
    on_event = settings.on_event
    with (
        _remote_interruptions(url),
        writer_run(stage, wait=wait, handle_signals=settings.handle_signals, on_event=on_event) as lock,
    ):
        try:
            result = _resume_locked(stage, settings, lock, rescan=rescan)
        except NothingToResume:
            result = None
        if result is None and not os.path.exists(stage) and not os.path.exists(manifest_location(stage)):
            raise NothingToResume(f"{shown}: nothing to resume (no build of it in {os.path.dirname(stage)})")
        report = publish(stage, url, on_event)
    if result is None:
        if not report.uploaded:
            raise NothingToResume(f"{shown}: nothing to resume (the staged build is published)")
        result = ResumeResult("published", None, [f"uploaded {len(report.uploaded)} objects"])
    if result.result is not None:
        result = replace(result, result=report.remote_result(result.result))
    result.notes.append(report.summary(url))
    return result


def plan_location(output: str) -> str:
    """Where ``pack --plan-only`` writes the plan of ``output``."""

    return plan_list_name(output)


def _media_and_sources(paths: list[str], out: str, opts: PackOptions) -> tuple[MediaOptions, SourceList]:
    from .sources.media import MediaOptions

    media = opts.media or MediaOptions()
    media.check()
    if opts.plan is not None:  # listed once by --plan-only; every part reads the same list
        from .write.checkpoint import read_source_list

        if paths:
            raise InputError("give the sources or a plan, not both")
        if not os.path.isfile(opts.plan):
            raise InputError(f"{opts.plan}: no such plan (write one with 'hframe pack SOURCE... -o OUT --plan-only')")
        return media, read_source_list(opts.plan, "the plan")
    if opts.archives is not None:
        if media.video_frames is not None:
            raise InputError(
                f"--video-frames with --from {opts.archives}: not supported yet (videos in archives are packed as files)"
            )
        if opts.base is not None:
            raise InputError(f"--base with --from {opts.archives}: members are named by their paths in the archive")
    label_member = label_extension(media.label_from)
    if label_member is not None and opts.archives not in ("tar", "zip"):
        raise InputError(f"--label-from {media.label_from}: a sample's member as its label is for --from tar or zip")
    return media, collect_sources(
        paths,
        archives=opts.archives,
        table_columns=opts.table_columns,
        label_member=label_member,
        stdin=opts.stdin,
        null_separated=opts.null_separated,
        include=opts.include,
        exclude=opts.exclude,
        base=opts.base,
        output=out,
        skip_bad=opts.skip_bad,
        max_frame_bytes=opts.max_frame_bytes,
        allow_empty=opts.allow_empty,
    )


def _pack_locked(paths: list[str], out: str, opts: PackOptions, lock: OutputLock) -> PackOutcome:
    """``pack`` holding ``lock`` (``out``'s; a part's shard with ``shard_of``): list the sources,
    then the one mode that applies, with one ``PackSettings`` for the run.

    An archive on standard input (``--from tar -``) is first copied to ``OUT.stdin`` (fsynced):
    members are read where they sit, and ``resume`` needs them again once standard input is
    gone. It is removed when the run ends, unless a checkpoint is kept for ``resume``."""
    if opts.archives is None or "-" not in paths:
        return _pack_listed(paths, out, opts, lock)
    if paths.count("-") > 1 or opts.plan_only or opts.shard_of is not None or opts.plan is not None:
        raise InputError(
            f"--from {opts.archives} -: standard input is one archive, read by this run alone "
            "(a plan or a job array needs a file every part can read)"
        )
    if opts.stdin is None:
        raise InputError(f"--from {opts.archives} -: no standard input")
    spool = stdin_name(out)
    try:
        _copy_stdin(opts.stdin, spool)
        outcome = _pack_listed([spool if p == "-" else p for p in paths], out, opts, lock)
    except BaseException:
        if not os.path.exists(checkpoint_name(out)):
            with suppress(FileNotFoundError):
                os.unlink(spool)
        raise
    with suppress(FileNotFoundError):
        os.unlink(spool)
    return outcome


def _copy_stdin(stdin: BinaryIO, spool: str) -> None:
    with open(spool, "wb") as f:
        while chunk := stdin.read(1 << 20):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    if os.path.getsize(spool) == 0:
        raise InputError("-: standard input is empty (no archive)")


def _pack_listed(paths: list[str], out: str, opts: PackOptions, lock: OutputLock) -> PackOutcome:
    from .write.settings import PackSettings

    media, srcs = _media_and_sources(paths, out, opts)
    if opts.plan_only:
        from .write.checkpoint import write_source_list

        where = plan_location(out)
        # the plan fixes the creation time: every part, and every part run again, has the same header
        write_source_list(where, srcs, opts.created_us if opts.created_us is not None else time.time_ns() // 1000)
        return PackOutcome("plan", out, plan_file=where, planned=(len(srcs), srcs.total_bytes))
    if opts.checksum and not opts.update:
        raise InputError("--checksum only applies with --update")
    settings = PackSettings(
        alignment=opts.alignment,
        created_us=opts.created_us,
        skip_bad=opts.skip_bad,
        media=media,
        workers=opts.workers,
        handle_signals=opts.handle_signals,
        on_event=opts.on_event,
    )
    if opts.self_check_frames is not None:
        settings = replace(settings, self_check_frames=opts.self_check_frames)
    if opts.checkpoints is not None:
        settings = replace(settings, checkpoints=opts.checkpoints)
    progress = opts.progress(len(srcs), srcs.total_bytes) if opts.progress else nullcontext(None)
    with progress as on_progress:
        settings = replace(settings, on_progress=on_progress)
        if opts.update:
            from .write.update import update_pack

            plan, maybe = update_pack(srcs, out, settings, lock=lock, checksum=opts.checksum)
            return PackOutcome("update", out, [maybe] if maybe is not None else [], plan=plan)
        if opts.shard_of is not None:
            from .write.shards import pack_part

            result = pack_part(srcs, out, opts.shard_of, settings, lock=lock, plan=opts.plan, force=opts.force)
            return PackOutcome("part", out, [result])
        from .write.shards import DEFAULT_MAX_PACK_BYTES, pack_sharded

        most = opts.max_pack_bytes if opts.max_pack_bytes is not None else DEFAULT_MAX_PACK_BYTES
        manifest, results = pack_sharded(srcs, out, settings, lock=lock, max_pack_bytes=most, force=opts.force)
        return PackOutcome("sharded" if manifest is not None else "pack", out, results, manifest)


def resume_pack(
    output: str | os.PathLike[str],
    *,
    rescan: bool = False,
    workers: int | None = None,
    checkpoints: CheckpointPolicy | None = None,
    handle_signals: bool = False,
    on_progress: ProgressFn | None = None,
    on_event: EventFn | None = None,
    on_warning: EventFn | None = None,
    wait: float = 0.0,
    skip_if_locked: bool = False,
    shard_of: str | None = None,
) -> ResumeResult:
    """Continue an interrupted ``pack`` of ``output`` (``hframe resume``): a sharded run from its
    saved plan (``shards.resume_sharded``), the interrupted parts of a job array
    (``shards.resume_parts``), a single pack from its checkpoint (``run.resume_pack``). With
    ``shard_of`` (``pack --shard-of I/N --resume``), part I alone. The lock is taken before
    anything is read; with ``skip_if_locked`` a run that finds it held returns status
    ``skipped`` (``notes`` says whose).

    Raises:
        NothingToResume: nothing of the pack or dataset on disk.
        InputError: the inputs changed (without ``rescan``), listing what changed.
        PackLocked: another run holds the output.
    """
    from .write.settings import PackSettings

    out = part_output(os.fspath(output), shard_of)
    settings = PackSettings(workers=workers, handle_signals=handle_signals, on_progress=on_progress, on_event=on_event)
    if checkpoints is not None:
        settings = replace(settings, checkpoints=checkpoints)
    try:
        if is_remote(out):
            return _resume_remote(out, settings, rescan=rescan, wait=wait)
        with writer_run(
            out, wait=wait, handle_signals=handle_signals, on_event=on_event, on_warning=on_warning
        ) as lock:
            return _resume_locked(out, settings, lock, rescan=rescan)
    except PackLocked as e:
        if not skip_if_locked:
            raise
        from .write.run import ResumeResult

        return ResumeResult("skipped", None, [str(e)])


def part_output(output: str, shard_of: str | None) -> str:
    """What ``resume --shard-of I/N`` continues: part I's shard (``output`` without a part, or
    remote: pack refuses parts there)."""
    if shard_of is None or is_remote(output):
        return output
    from .read.dataset import shard_path
    from .write.shards import parse_shard_of

    return os.fspath(shard_path(output, parse_shard_of(shard_of)[0]))


def _resume_locked(out: str, settings: PackSettings, lock: OutputLock, *, rescan: bool) -> ResumeResult:
    """``resume_pack`` holding ``out``'s ``lock``: a sharded run from its plan, a dataset of
    parts, else the single pack (each with the settings its run recorded; ``settings`` says how
    this process runs it)."""
    from .write.checkpoint import load_checkpoint
    from .write.run import resume_single
    from .write.shards import load_plan, resume_parts, resume_sharded

    plan = load_plan(out)
    if plan is not None and load_checkpoint(out)[0] is None:  # an interrupted sharded run
        return resume_sharded(out, plan, settings, lock=lock)
    if plan is None and not any(
        os.path.exists(p) for p in (out, partial_name(out), checkpoint_name(out), previous_checkpoint_name(out))
    ):
        parts = resume_parts(out, settings, lock=lock)  # a dataset of parts (job array) or shards
        if parts is not None:
            return parts
    result = resume_single(out, settings, lock=lock, rescan=rescan)
    if not os.path.exists(checkpoint_name(out)):  # finished: an archive read from stdin is not needed
        with suppress(FileNotFoundError):
            os.unlink(stdin_name(out))
    return result
