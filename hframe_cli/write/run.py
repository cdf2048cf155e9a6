"""``pack`` and ``resume``: sources in, a self-checked, published pack and index out.

Sources are read, hashed and prepared on a small thread pool (``loading.py`` in this room) while the
calling thread appends them in sorted order; frames larger than ``STREAM_ABOVE`` are streamed
in chunks, and videos are cut into frames here (``_add_video``). The same loop (``run_loop``)
serves a fresh run, a resumed one and an ``--update`` append; checkpoints are written as
``CheckpointPolicy`` says (see ``checkpoint.py`` for the files and their durability order).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import uuid as uuid_mod
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import FormatError, InputError, IntegrityError, Interrupted, NothingToResume
from ..faults import fault_point
from ..format.codec import sample_for_dictionary, train_dictionary
from ..format.index import current_format_version, get_index_path
from ..format.layout import HEADER_SIZE, KIND_IDS, SNIFF_BYTES, sniff_media_type
from ..locations import is_remote
from ..names import checkpoint_paths, index_name, partial_name
from ..processes import usable_cpus
from ..read.dataset import get_manifest_path
from ..sources.inputs import collect_sources
from ..sources.located import (
    SourceChanged,
    container_of,
    is_located,
    open_located,
    open_source,
    reading,
    shown,
    unchanged,
)
from ..sources.media import FramePrep, MediaOptions
from ..sources.objects import in_flight
from ..sources.sourcelist import Rejected, Source, SourceList
from ..sources.tables import TableColumns
from ..sources.video import VideoFrames, frame_name, has_video_extension, parse_frame_format, parse_video_frames
from ..units import count, format_bytes, format_duration, parse_created
from ..verify import DEFAULT_SELF_CHECK
from ..verify.selfcheck import self_check
from .checkpoint import (
    Checkpoint,
    CheckpointPolicy,
    load_checkpoint,
    load_sources,
    remove_checkpoint_files,
    save_sources,
    source_fingerprint,
)
from .guard import StopSignals, stop_signals, writer_run
from .loading import (
    STREAM_ABOVE,
    WITHOUT_SIZE,
    Loaded,
    add_loaded,
    child_may_load,
    loaded_by_child,
    loaded_in_order,
)
from .lock import OutputLock
from .parallel import fanout_workers, write_chunks
from .settings import EventFn, PackSettings, ProgressFn
from .writer import PackWriter, SealedPack, publish_partials

__all__ = [
    "CheckpointPolicy",
    "PackResult",
    "ResumeResult",
    "abandon_on_bad_data",
    "finish_publishing",
    "pack_sources",
    "parse_created",
    "resume_single",
    "run_loop",
    "write_pack",
]

_THREADS_ABOVE_MEAN = 16 << 10
#: With fewer small files than this, forking a loader costs more than it saves.
_CHILD_ABOVE_FILES = 2000


@dataclass
class PackResult:
    """What ``pack_sources`` wrote."""

    path: str
    index_path: str
    uuid: str
    frame_count: int
    payload_bytes: int
    pack_bytes: int
    pack_time: str
    self_checked: int
    elapsed_s: float
    skipped: list[Rejected] = field(default_factory=list)
    resumed_from_frame: int | None = None
    #: inputs packed with a problem noted (an unreadable image header, a video damaged part-way)
    warnings: list[Rejected] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:

        return {
            "ok": True,
            "format_version": current_format_version(),
            "pack": self.path,
            "index": self.index_path,
            "uuid": self.uuid,
            "pack_time": self.pack_time,
            "frame_count": self.frame_count,
            "payload_bytes": self.payload_bytes,
            "pack_bytes": self.pack_bytes,
            "self_checked": self.self_checked,
            "elapsed_s": round(self.elapsed_s, 6),
            "skipped": [{"path": r.path, "reason": r.reason} for r in self.skipped],
            "warnings": [{"path": r.path, "reason": r.reason} for r in self.warnings],
            "resumed_from_frame": self.resumed_from_frame,
        }


def pack_sources(
    sources: SourceList,
    output: str | os.PathLike[str],
    *,
    alignment: int = 1,
    created_us: int | None = None,
    force: bool = False,
    skip_bad: bool = False,
    self_check_frames: int = DEFAULT_SELF_CHECK,
    workers: int | None = None,
    checkpoints: CheckpointPolicy | None = None,
    handle_signals: bool = False,
    on_progress: ProgressFn | None = None,
    on_event: EventFn | None = None,
    after_seal: Callable[[SealedPack], None] | None = None,
    pack_uuid: str | None = None,
    media: MediaOptions | None = None,
) -> PackResult:
    """Write ``sources`` into a pack at ``output``, self-check it, and publish it: the library's
    keyword form of ``write_pack`` (the settings are ``PackSettings``' fields).

    Args:
        sources: from ``inputs.collect_sources`` (sorted, checked).
        force: replace an existing pack (and abandon an interrupted run's partial pack).
        pack_uuid: a fixed pack UUID (``resume`` uses the one chosen when the run started).

    Raises:
        as ``write_pack``; PackLocked: another run is writing ``output``.
    """
    settings = PackSettings(
        alignment=alignment,
        created_us=created_us,
        skip_bad=skip_bad,
        self_check_frames=self_check_frames,
        media=media or MediaOptions(),
        workers=workers,
        checkpoints=checkpoints or CheckpointPolicy(),
        handle_signals=handle_signals,
        on_progress=on_progress,
        on_event=on_event,
        after_seal=after_seal,
    )
    out = os.fspath(output)
    with writer_run(out, handle_signals=handle_signals, on_event=on_event) as lock:
        return write_pack(sources, out, settings, force=force, pack_uuid=pack_uuid, lock=lock)


def write_pack(
    sources: SourceList,
    out: str,
    settings: PackSettings,
    *,
    lock: OutputLock,
    force: bool = False,
    pack_uuid: str | None = None,
) -> PackResult:
    """Write ``sources`` into a pack at ``out`` (whose ``lock`` the caller holds), self-check it,
    and publish it.

    Before the first frame the run records its intent (``settings.to_dict()``, the sorted source
    list) beside the output, then checkpoints as ``settings.checkpoints`` says, so ``resume``
    can continue after a crash and produce the same bytes as an uninterrupted run.

    Raises:
        InputError: a bad source (without ``skip_bad``), an existing output, or an interrupted
            run's partial pack (without ``force``: use ``resume``).
        IntegrityError: the self-check failed; nothing was published.
        Interrupted: SIGINT/SIGTERM; a checkpoint was written.
    """
    lock.require(out)
    with stop_signals(settings.handle_signals) as stop:
        settings.media.check()
        settings = replace(settings, media=settings.media.with_label_csv_fixed())
        if not force and checkpoint_paths(out).checkpoint.exists() and not os.path.exists(out):
            raise InputError(
                f"{out}: an interrupted run left {partial_name(out)}; continue it with 'hframe resume {out}' "
                "or start over with --force"
            )
        if settings.created_us is None:
            settings = replace(settings, created_us=time.time_ns() // 1000)
            pack_uuid = pack_uuid or str(uuid_mod.uuid4())
        # with a fixed creation time and no fixed UUID, the UUID is derived from the frames at seal
        # time, so the same inputs give the same bytes
        if os.path.exists(out) and not force:
            raise InputError(f"{out}: already exists (use --force to replace it)")
        ckpt = Checkpoint(
            output=out,
            phase="packing",
            # how they were found (collect): resume walks the folders again
            options={**settings.to_dict(), "pack_uuid": pack_uuid, "collect": sources.collect},
            fingerprint=source_fingerprint(sources),
            source_count=len(sources),
            committed_bytes=HEADER_SIZE,
        )
        dictionary = _dictionary_for(sources, settings)  # a bad --zstd-dict fails before any file is made
        if settings.checkpoints.enabled:  # the intent, on disk before the partial pack exists: both or neither
            with stop.deferred():
                save_sources(out, sources)
                ckpt.save(out)
        writer = PackWriter(
            out,
            alignment=settings.alignment,
            created_us=settings.created_us,
            pack_uuid=pack_uuid,
            force=force,
            lock=lock,
            dictionary=dictionary,
        )
        with writer:
            writer.commit()
            with abandon_on_bad_data(out):
                return run_loop(writer, sources, ckpt, settings, skipped=list(sources.rejected))


@contextmanager
def abandon_on_bad_data(out: str) -> Iterator[None]:
    """A run that fails on bad input or a failed self-check is not resumable: drop its checkpoint.

    Crashes, signals and storage errors (disk full) keep it, so ``resume`` can continue. The
    partial pack of a failed self-check stays for inspection; that of a bad input is removed, as
    is that of a run stopped by a signal with no checkpoint to resume from (``--no-checkpoint``,
    an ``--update`` append): it could only mislead the next run.
    """
    try:
        yield
    except (InputError, IntegrityError) as e:
        remove_checkpoint_files(out)
        if isinstance(e, InputError):
            with suppress(FileNotFoundError):
                os.unlink(partial_name(out))
        raise
    except Interrupted:
        if not checkpoint_paths(out).checkpoint.exists():
            for leftover in (partial_name(out), partial_name(index_name(out))):
                with suppress(FileNotFoundError):
                    os.unlink(leftover)
        raise


def finish_publishing(out: str) -> None:
    """Complete the publish of a run whose checkpoint says it had begun (the pack was sealed and
    self-checked): the remaining renames, then the checkpoint files; a signal waits for both."""
    with stop_signals(False) as stop, stop.deferred(act_after=False):
        publish_partials(out)
        remove_checkpoint_files(out)


def _dictionary_for(sources: SourceList, settings: PackSettings) -> bytes | None:
    """The zstd dictionary of a new pack: read from ``--zstd-dict PATH``, or trained (``auto``)
    on an even, deterministic sample of the inputs that are not already-compressed images."""
    media = settings.media
    level = media.level
    if level is None or media.zstd_dict == "none":
        return None
    if media.zstd_dict != "auto":
        try:
            with open(media.zstd_dict, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InputError(f"--zstd-dict {media.zstd_dict}: cannot read: {e.strerror}") from None
        return data  # MediaOptions.check has made sure zstd can use it

    srcs = [s for s in sources.sources if s.size <= STREAM_ABOVE]
    if media.video_frames is not None:  # videos become JPEG/PNG frames: nothing to learn from them
        srcs = [s for s in srcs if not has_video_extension(s.name)]
    samples = []
    for i in sample_for_dictionary([s.size for s in srcs]):
        try:
            with open_source(srcs[i].path, srcs[i].size) as f:
                data = f.read()
        except OSError:
            continue  # reported when the file itself is packed
        if sniff_media_type(data[:SNIFF_BYTES]) in ("jpeg", "png", "gif", "webp"):
            continue
        samples.append(data)
    t0 = time.perf_counter()
    dictionary = train_dictionary(samples, level)
    if dictionary is None:
        settings.note("zstd dictionary: too little data to train one; compressing without a dictionary")
    else:
        settings.note(
            f"zstd dictionary: {len(dictionary)} bytes trained on {len(samples)} inputs "
            f"in {time.perf_counter() - t0:.2f} s",
        )
    return dictionary


def run_loop(
    writer: PackWriter,
    sources: SourceList,
    ckpt: Checkpoint,
    settings: PackSettings,
    *,
    start_source: int = 0,
    skipped: list[Rejected],
    resumed_from: int | None = None,
) -> PackResult:
    """The packing loop shared by ``write_pack``, ``resume_single`` and ``update_pack``: sources
    appended in order, checkpoints as ``settings.checkpoints`` says, then seal, self-check and
    publish."""
    t0 = time.perf_counter()
    run = _Run(writer, sources, ckpt, settings, skipped)
    try:
        with stop_signals(settings.handle_signals) as stop, stop.deferred(act_after=False):
            # a signal stops the loop after the current frame, with a checkpoint
            run.write(start_source, stop)
    except BaseException:
        with suppress(Exception):  # a checkpoint still on its thread ends before the run does
            run.settle()
        raise
    run.finish_writing(stop)
    sealed, checked = run.seal_and_publish(stop)
    return PackResult(
        path=run.out,
        index_path=os.fspath(writer.index_path),
        uuid=sealed.uuid,
        frame_count=sealed.frame_count,
        payload_bytes=sealed.payload_bytes,
        pack_bytes=sealed.pack_bytes,
        pack_time=sealed.pack_time,
        self_checked=checked,
        elapsed_s=time.perf_counter() - t0,
        skipped=skipped,
        resumed_from_frame=resumed_from,
        warnings=run.warnings,
    )


class _Commit(threading.Thread):
    """A checkpoint being committed: the pack's fsync, then the checkpoint saved."""

    def __init__(self, writer: PackWriter, ckpt: Checkpoint, out: str, next_source: int, why: str) -> None:
        super().__init__(name="hframe-checkpoint", daemon=True)
        self.writer, self.ckpt, self.out, self.next_source, self.why = writer, ckpt, out, next_source, why
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.writer.sync()
            self.ckpt.save(self.out)
        except BaseException as e:  # noqa: BLE001 - raised where the run settles it
            self.error = e


class _Run:
    """One run of the packing loop: the writer, its checkpoint, and what the run has met."""

    def __init__(
        self,
        writer: PackWriter,
        sources: SourceList,
        ckpt: Checkpoint,
        settings: PackSettings,
        skipped: list[Rejected],
    ) -> None:
        self.writer, self.sources, self.ckpt, self.settings = writer, sources, ckpt, settings
        self.policy = settings.checkpoints
        self.out = os.fspath(writer.path)
        self.skipped = skipped
        self.warnings: list[Rejected] = []
        self.done_bytes = 0  # of the sources before the one being written (all runs of this pack)
        self.started = (time.monotonic(), 0)  # when and at what done_bytes this run began
        self.last_frames, self.last_bytes, self.last_time = len(writer), writer.position, time.monotonic()
        self.prep = FramePrep(settings.media, writer.dictionary)
        self.videos = settings.media.video_frames is not None
        # a video's frames are named VIDEO#frame=N: an input file of such a name would clash
        self.input_names = {s.name for s in sources.sources if b"#frame=" in s.name} if self.videos else set()
        self.pending: _Commit | None = None  # a checkpoint being committed on a thread

    def write(self, start_source: int, stop: StopSignals) -> None:
        """Append every source from ``start_source`` in order, checkpointing as the policy says;
        a signal stops the loop after the current source (``Interrupted``)."""
        settings = self.settings
        count, sizes = len(self.sources), self.sources.sizes
        self.done_bytes = sum(sizes[:start_source])
        self.started = (time.monotonic(), self.done_bytes)
        faults = bool(os.environ.get("HFRAME_FAULT"))  # fault injection (tests): looked up once, not per frame
        how = reading(self.sources.paths[start_source]) if start_source < count else "parallel"
        # objects are fetched many at once on threads; a compressed tar is decompressed forward
        # by one reader: neither is cut into chunks for packing workers (rows are: each worker
        # decodes the row groups its chunks fall in, once)
        crew = fanout_workers(self, start_source, settings.workers) if how in ("parallel", "rows") else 0
        if crew:  # (its sources are the list's columns: no object per source)
            start_source = write_chunks(self, start_source, stop, faults, crew)
            if start_source == count:
                return
        todo = self.sources.sources[start_source:]
        workers = settings.workers
        by_child = False
        if workers is None:
            # threads pay off when hashing and copying dominate; for small files the per-file
            # Python work dominates and a second thread only contends for the GIL: a forked
            # process loads them instead, while this one writes
            small = sum(sizes) < _THREADS_ABOVE_MEAN * count
            workers = 1 if small else min(2, usable_cpus())
            by_child = small and not self.videos and len(todo) >= _CHILD_ABOVE_FILES and child_may_load()
        if how == "remote":  # waiting on the store, not on a core: many requests in flight
            workers, by_child = max(workers or 1, in_flight()), False
        elif how == "forward":
            workers = 1
        loaded = (
            loaded_by_child(todo, self.prep, self.videos)
            if by_child
            else loaded_in_order(todo, workers, self.prep, self.videos)
        )
        with closing(loaded):  # an error or a signal below ends the loader (and its child) at once
            self._write_loaded(loaded, start_source, stop, faults)

    def _write_loaded(
        self, loaded: Generator[Loaded, None, None], start_source: int, stop: StopSignals, faults: bool
    ) -> None:
        settings = self.settings
        for k, item in enumerate(loaded, start=start_source):
            self.add(k, item, stop)
            if item.error is not None:
                if not settings.skip_bad:
                    raise self.bad_input(item.source.path, item.error)
                self.skipped.append(Rejected(shown(item.source.path), item.error))  # listed in the summary
            self.done_bytes += item.source.size  # a skipped source is done too: the rest is what is left
            if settings.on_progress is not None:
                settings.on_progress(len(self.writer), self.done_bytes)
            if faults:
                fault_point("after-frame")
            if stop.signum is not None:
                raise self.interrupted(stop, stop.signum, k + 1, "")
            if self.checkpoint_due():
                self.checkpoint(k + 1, "periodic")

    @staticmethod
    def bad_input(path: str, error: str) -> InputError:
        """The error that ends a run (without ``--skip-bad``) at a source it cannot pack."""
        hint = "" if "--skip-bad" in error else " (use --skip-bad to leave it out)"
        return InputError(f"{shown(path)}: {error}{hint}")

    def add(self, k: int, item: Loaded, stop: StopSignals) -> None:
        """Write source ``k`` (loaded as ``item``): a video's frames, a streamed large file, or
        one prepared frame. What makes it unusable is left in ``item.error``."""
        src, writer = item.source, self.writer
        if item.video:
            answer = _add_video(writer, item, self.prep, stop, self.settings.skip_bad, self.input_names)
            if answer is _STOPPED:
                where = f" (in {src.path}, which starts again on resume)"
                raise self.interrupted(stop, stop.signum or signal.SIGINT, k, where)
            if answer is _NOT_A_VIDEO:  # only its first bytes looked like a video: pack the file as it is
                item.video, item.stream = False, item.data is None
                if item.data is not None:
                    item.frame = self.prep.prepare(src.name, item.data, item.md5, item.origin)
            elif answer is not None:
                self.warn(src, answer, "")
        if item.video:
            return  # its frames are in (or item.error says why not)
        if item.stream:
            try:
                f, meta = open_located(src.path, src.size)
                with f:
                    writer.add_stream(src.name, f, src.size, mtime_ns=src.mtime_ns, meta=meta)
            except (InputError, SourceChanged) as e:
                item.error = str(e)
            except FileNotFoundError:
                item.error = "vanished while packing"
            except OSError as e:
                item.error = f"cannot read: {e.strerror}"
            return
        if item.error is not None:
            return
        warning = add_loaded(writer, item, self.settings.media.strict_images)
        if warning is not None:
            self.warn(src, warning, WITHOUT_SIZE)

    def warn(self, src: Source, problem: str, consequence: str) -> None:
        self.warnings.append(Rejected(shown(src.path), problem))
        self.settings.note(f"warning: {shown(src.path)}: {problem}{consequence}")

    def checkpoint_due(self) -> bool:
        self.settle(done=False)  # a checkpoint committed on its thread is reported here
        policy, writer = self.policy, self.writer
        return policy.enabled and bool(
            (policy.every_frames and len(writer) - self.last_frames >= policy.every_frames)
            or (policy.every_bytes and writer.position - self.last_bytes >= policy.every_bytes)
            or (policy.every_seconds and time.monotonic() - self.last_time >= policy.every_seconds)
        )

    def checkpoint(self, next_source: int, why: str, *, wait: bool = True) -> None:
        """Commit what is written and save the checkpoint (when checkpoints are on).

        Without ``wait`` (``fanout``, whose workers go on packing meanwhile) the fsync and the
        save run on a thread: the disk's writeback no longer stalls the run. It is settled by
        the next ``checkpoint_due``, ``checkpoint`` or ``settle``; until then the checkpoint
        on disk is the one before, as if the run had stopped a little earlier."""
        if not self.policy.enabled:
            return
        self.settle()
        frames, committed = self.writer.flush()
        ckpt = dataclasses.replace(
            self.ckpt,
            frames=frames,
            committed_bytes=committed,
            next_source=next_source,
            skipped=[[r.path, r.reason] for r in self.skipped],
        )
        self.last_frames, self.last_bytes, self.last_time = frames, committed, time.monotonic()
        pending = _Commit(self.writer, ckpt, self.out, next_source, why)
        if not wait:
            pending.start()
            self.pending = pending
            return
        pending.run()  # here, on this thread
        self._finish(pending)

    def settle(self, *, done: bool = True) -> None:
        """Wait for a checkpoint still being committed on its thread, and raise what it met.
        ``done=False``: only if it has finished."""
        pending = self.pending
        if pending is None or (not done and pending.is_alive()):
            return
        self.pending = None
        pending.join()
        self._finish(pending)

    def _finish(self, commit: _Commit) -> None:
        """A commit that has ended: raise what it met, or make its checkpoint the run's and
        report it."""
        if commit.error is not None:
            raise commit.error
        self.ckpt = commit.ckpt
        if commit.why != "all frames written":  # that one is followed at once by the summary line
            self.settings.note(self.progress_line(commit.next_source, commit.why))

    def progress_line(self, next_source: int, why: str) -> str:
        """``checkpoint: 1,200 of 5,000 files (24%), 3.2 GB of 13.1 GB, 12.4 MB/s, about 14 min
        left; 1,200 frames committed``: a cron log's answer to "how far, how fast, how long"."""
        total_files, total_bytes = len(self.sources), self.sources.total_bytes
        done = self.done_bytes
        share = done / total_bytes if total_bytes else next_source / max(1, total_files)
        line = (
            f"checkpoint: {next_source:,} of {count(total_files, 'file', sep=',')} ({100 * share:.0f}%), "
            f"{format_bytes(done)} of {format_bytes(total_bytes)}"
        )
        elapsed = time.monotonic() - self.started[0]
        rate = (done - self.started[1]) / elapsed if elapsed > 0 else 0.0
        if rate > 0:
            line += f", {format_bytes(rate)}/s, about {format_duration((total_bytes - done) / rate)} left"
        line += f"; {count(self.ckpt.frames, 'frame', sep=',')} committed"
        return line if why == "periodic" else f"{line} ({why})"

    def interrupted(self, stop: StopSignals, signum: int, next_source: int, where: str) -> Interrupted:
        """Checkpoint, and the error that says how the run stopped and what to do next."""
        name = signal.Signals(signum).name
        with stop.deferred(act_after=False):
            self.checkpoint(next_source, f"stopped by {name}")
        return Interrupted(
            f"{self.out}: interrupted by {name} after {len(self.writer)} frames{where}; "
            + (
                f"checkpoint kept: run 'hframe resume {self.out}' to continue"
                if self.policy.enabled
                else "no checkpoint (checkpoints are off), partial pack removed: run the same command again"
            )
        )

    def finish_writing(self, stop: StopSignals) -> None:
        """The last checkpoint, once every source is in (none at all is bad input)."""
        if len(self.writer) == 0:
            raise InputError("nothing to pack: every input was skipped")
        with stop.deferred(act_after=False):
            self.checkpoint(len(self.sources), "all frames written")
        if stop.signum is not None:
            raise Interrupted(
                f"{self.out}: interrupted by {stop.name} after all {len(self.writer)} frames were written; "
                + (
                    f"checkpoint kept: run 'hframe resume {self.out}' to seal and publish"
                    if self.policy.enabled
                    else "no checkpoint, partial pack removed: run the same command again"
                )
            )

    def seal_and_publish(self, stop: StopSignals) -> tuple[SealedPack, int]:
        """Seal, self-check, publish: the sealed pack and how many frames the self-check read.
        A signal stops sealing and the self-check where they are (resume seals again); the
        publish is never cut in half."""
        writer, out = self.writer, self.out
        sealed = writer.seal()
        fault_point("after-seal")
        if self.settings.after_seal is not None:
            self.settings.after_seal(sealed)
        checked = self_check(sealed.partial_path, sealed.partial_index_path, self.settings.self_check_frames)
        with stop.deferred(act_after=False):  # a signal now comes too late
            if self.policy.enabled:
                self.ckpt.phase = "publishing"
                self.ckpt.save(out)
            writer.publish()
            remove_checkpoint_files(out)
        if stop.signum is not None:
            self.settings.note(f"{out}: {stop.name} arrived while publishing; the pack was published first")
        return sealed, checked


_STOPPED = "stopped"  # _add_video's answers besides None and a damage note (compared by identity)
_NOT_A_VIDEO = "not a video"


def _add_video(
    writer: PackWriter,
    item: Loaded,
    prep: FramePrep,
    stop: StopSignals,
    skip_bad: bool,
    input_names: set[bytes] | frozenset[bytes] = frozenset(),
) -> str | None:
    """Append the selected frames of one video. Returns None when all went well (or when it
    failed: ``item.error`` says why), a note about damage (the frames decoded before it are kept,
    with ``skip_bad``), ``_STOPPED`` after a signal (the video's frames are rolled back), or
    ``_NOT_A_VIDEO`` when only its bytes looked like a video (the caller packs it as a file).

    Raises:
        InputError: not a video (by its extension), or damaged, without ``skip_bad``.
    """

    src = item.source
    media = prep.options
    mode, param = parse_video_frames(media.video_frames or "all")
    fmt = parse_frame_format(media.frame_format)
    frames = VideoFrames(
        src.path, src.path, mode, param, fmt, media.max_frames_per_video, should_stop=lambda: stop.signum is not None
    )
    mark = writer.mark()
    group = prep.group_meta(src.name, group=src.name)
    kind = KIND_IDS["video_frame"]
    media_type = "jpeg" if fmt[0] == "jpeg" else "png"
    try:
        for vf in frames:
            meta = {
                "source": src.name.decode("utf-8", "backslashreplace"),
                "source_size": src.size,
                "frame_index": vf.index,
                "pts_s": vf.pts_s,
                "keyframe": vf.keyframe,
                "width": vf.width,
                "height": vf.height,
                "mode": "RGB",
                **group,
            }
            name = frame_name(src.name, vf.index)
            if name in input_names:
                writer.rollback(mark)
                item.error = (
                    f"frame name {name.decode('utf-8', 'backslashreplace')!r} is also the name of an input file; "
                    "rename that file or pack it separately"
                )
                return None
            writer.add(name, vf.data, mtime_ns=src.mtime_ns, media=media_type, kind=kind, meta=meta)
    except InputError as e:
        writer.rollback(mark)
        if not has_video_extension(src.name):
            return _NOT_A_VIDEO
        item.error = str(e).removeprefix(f"{src.path}: ")
        return None
    if frames.stopped:
        writer.rollback(mark)
        return _STOPPED
    if frames.damage is None:
        return None
    if not skip_bad:
        writer.rollback(mark)
        item.error = (
            f"damaged video: {frames.damage}; {frames.kept} frames were decoded before the damage "
            "(--skip-bad keeps them)"
        )
        return None
    return f"damaged video: {frames.damage}; kept the {frames.kept} frames decoded before it"


def _describe_changes(saved: list[Source], current: list[Source]) -> list[str]:
    old = {s.name: s for s in saved}
    new = {s.name: s for s in current}
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = sorted(
        n
        for n in set(old) & set(new)
        if (old[n].size, old[n].mtime_ns) != (new[n].size, new[n].mtime_ns)
        or (old[n].path != new[n].path and is_located(old[n].path))  # moved inside a rewritten archive
    )
    lines = []
    for label, names in (("added", added), ("removed", removed), ("changed", changed)):
        if names:
            more = f" (and {len(names) - 5} more)" if len(names) > 5 else ""
            shown = ", ".join(n.decode("utf-8", "backslashreplace") for n in names[:5])
            lines.append(f"{len(names)} {label}: {shown}{more}")
    return lines


def _current_sources(saved: SourceList) -> list[Source]:
    """The sources as they are now: folders walked again (as ``saved.collect`` says), listed
    files stat-ed again."""

    collect = saved.collect
    if collect.get("archives"):  # listed again: a member's place may have moved with its archive
        columns = collect.get("table_columns")
        return collect_sources(
            [a for a in collect["archives"] if is_remote(a) or os.path.isfile(a)],
            archives=collect["archive_kind"],
            table_columns=TableColumns(**columns) if columns else None,
            label_member=collect.get("label_member"),
            include=collect.get("include", ()),
            exclude=collect.get("exclude", ()),
            skip_bad=True,
            allow_empty=collect.get("allow_empty", False),
            max_frame_bytes=collect.get("max_frame_bytes", 1 << 30),
            output=collect.get("output"),
            require_some=False,
        ).sources
    folders = [a for a in collect.get("folders", []) if os.path.isdir(a)]
    found = collect_sources(
        folders + collect.get("prefixes", []),  # (a prefix lists again what is under it now)
        include=collect.get("include", ()),
        exclude=collect.get("exclude", ()),
        base=collect.get("base"),
        skip_bad=True,
        allow_empty=collect.get("allow_empty", False),
        max_frame_bytes=collect.get("max_frame_bytes", 1 << 30),
        output=collect.get("output"),
        require_some=False,
    )
    now = {s.name: s for s in found.sources}
    walked = tuple(os.path.join(f, "") for f in collect.get("folders", []))
    for s in saved.sources:
        if s.name in now or (walked and os.path.abspath(s.path).startswith(walked)):
            continue  # found again by the walk, or gone from a walked folder
        if is_located(s.path):  # (a shard's part of a list of members: its container is checked)
            if unchanged(s.path):
                now[s.name] = s
            elif os.path.exists(container_of(s.path)):
                now[s.name] = Source(s.path, s.name, s.size, -1)  # its archive changed: so may it
            continue
        try:
            st = os.stat(s.path)
        except OSError:
            continue
        now[s.name] = Source(s.path, s.name, st.st_size, st.st_mtime_ns)
    return sorted(now.values(), key=lambda s: s.name)


@dataclass
class ResumeResult:
    """What ``resume_pack`` did: ``status`` is resumed, restarted, already_complete or skipped
    (``skip_if_locked`` met a lock: ``notes`` says whose)."""

    status: str
    result: PackResult | None
    notes: list[str] = field(default_factory=list)
    manifest: Any = None  # set when a sharded run was resumed


def resume_single(out: str, settings: PackSettings, *, lock: OutputLock, rescan: bool = False) -> ResumeResult:
    """Continue an interrupted ``pack`` of the one pack ``out`` (whose ``lock`` the caller holds)
    from its last checkpoint, with the recorded settings of the run (``settings`` gives how this
    process runs it: threads, checkpoints, signals, callbacks). A sharded run or a dataset of
    parts is ``shards.py``'s, chosen by ``api.resume_pack``.

    The partial pack is cut back to the last committed offset, its rows are rebuilt from the
    record headers, the inputs are checked against the list saved at the start, and packing
    continues; the result is byte-identical to an uninterrupted run.

    Args:
        rescan: if the inputs changed since the run started, start over with the current
            inputs instead of refusing.

    Raises:
        NothingToResume: no partial pack, checkpoint or finished pack at ``out``.
        InputError: the inputs changed (without ``rescan``), listing what changed.
    """
    lock.require(out)
    ckpt, notes = load_checkpoint(out)  # notes (a torn checkpoint) are returned with the result
    partial = partial_name(out)
    if ckpt is None:
        if os.path.exists(partial):
            raise FormatError(
                f"{out}: {partial} exists but no usable checkpoint does; start over with "
                f"'hframe pack ... -o {out} --force'"
            )
        if os.path.exists(out) and get_index_path(out).exists():
            return ResumeResult("already_complete", None, notes)  # the caller says so, once

        if not os.path.exists(out) and get_manifest_path(out).exists():
            settings.note(f"{out}: dataset already complete ({get_manifest_path(out)}); nothing to resume")
            return ResumeResult("already_complete", None, notes)
        raise NothingToResume(f"{out}: nothing to resume (no partial pack, checkpoint or finished pack)")
    if ckpt.phase == "publishing":
        finish_publishing(out)
        settings.note(f"resume: finished publishing {out} (the pack was complete and self-checked)")
        return ResumeResult("resumed", None, notes)
    settings = settings.restored(ckpt.options)
    settings.media.with_label_csv_fixed()  # the labels CSV must be unchanged
    saved = load_sources(out)
    saved.collect = ckpt.options.get("collect", {})
    if source_fingerprint(saved) != ckpt.fingerprint:
        raise FormatError(f"{out}: the saved source list does not match the checkpoint; start over with --force")
    current = _current_sources(saved)
    changes = _describe_changes(saved.sources, current)
    if changes and not rescan:
        raise InputError(
            f"{out}: inputs changed since the run started: {'; '.join(changes)}; "
            "run 'hframe resume --rescan' to start over with the current inputs"
        )
    pack_uuid = ckpt.options.get("pack_uuid")

    def start_over(srcs: SourceList, status: str, keep_identity: bool) -> ResumeResult:
        # the same run again keeps its creation time and UUID; new inputs keep only a fixed time
        again = settings if keep_identity or pack_uuid is None else replace(settings, created_us=None)
        res = write_pack(srcs, out, again, lock=lock, force=True, pack_uuid=pack_uuid if keep_identity else None)
        res.resumed_from_frame = 0
        return ResumeResult(status, res, notes)

    if changes:
        settings.note(f"resume: inputs changed ({'; '.join(changes)}); starting over (--rescan)")
        return start_over(SourceList(current, [], saved.collect), "restarted", keep_identity=False)
    if ckpt.frames == 0 or not os.path.exists(partial):
        # killed before the first frame was committed: the same run again from the saved list
        settings.note(f"resume: {out}: nothing committed yet; packing the saved source list from the start")
        return start_over(saved, "resumed", keep_identity=True)
    writer = PackWriter(
        out,
        alignment=settings.alignment,
        created_us=settings.created_us,
        pack_uuid=pack_uuid,
        resume_at=ckpt.committed_bytes,
        lock=lock,
    )
    with writer:
        if len(writer) != ckpt.frames:
            raise FormatError(
                f"{partial}: {len(writer)} frames before the committed offset, checkpoint says {ckpt.frames}"
            )
        settings.note(
            f"resume: {out} from frame {ckpt.frames:,} (file {ckpt.next_source:,} of {ckpt.source_count:,}; "
            f"{format_bytes(ckpt.committed_bytes)} of the pack kept)",
        )
        with abandon_on_bad_data(out):
            res = run_loop(
                writer,
                saved,
                ckpt,
                settings,
                start_source=ckpt.next_source,
                skipped=ckpt.skipped_rejects,
                resumed_from=ckpt.frames,
            )
    return ResumeResult("resumed", res, notes)
