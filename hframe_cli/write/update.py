"""``pack --update``: bring a published pack up to date with its sources (for cron).

Policy (``man/hframe.1``, UPDATE): nothing changed => nothing is written; only new files => a new
pack with the existing records copied verbatim (frame ids and offsets kept) and the new files
appended in name order; any file changed or removed => a full repack.

Imports inside functions: the packer (``run``, ``writer``, the reader), only when there is
something to write: a no-op run (cron's usual one) starts faster without them.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid as uuid_mod
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import InputError
from ..faults import fault_point
from ..format.index import get_index_path
from ..names import index_name, partial_name
from ..sources.located import open_source
from ..sources.media import MediaOptions
from ..sources.sourcelist import Source, SourceList
from .checkpoint import Checkpoint, CheckpointPolicy, load_checkpoint, remove_checkpoint_files
from .settings import PackSettings

if TYPE_CHECKING:  # the packer is imported when there is something to pack: a no-op run (cron's
    # usual one) starts faster without it
    from .lock import OutputLock
    from .run import PackResult

__all__ = ["UpdatePlan", "decide", "dry_run", "plan_update", "update_pack"]


@dataclass
class UpdatePlan:
    """What ``--update`` found: ``status`` is new, up_to_date, append or repack.

    ``reasons`` says why each changed file counts as changed (``size 4410 -> 4420 bytes``);
    ``why`` why the run repacks when not for changed or removed files (videos, a dictionary);
    ``leftover`` what an interrupted earlier run left, which the run settles first.
    """

    status: str
    added: list[Source] = field(default_factory=list)
    changed: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    frames: int = 0
    alignment: int = 1  # of the existing pack: appended records keep it
    data_end: int = 0  # where the existing pack's records end
    reasons: dict[bytes, str] = field(default_factory=dict)
    why: str | None = None
    leftover: str | None = None

    def summary(self) -> str:
        """``3 new, 2 changed, 1 removed`` (the counts that are not zero), or ``the videos ...``."""
        parts = [
            f"{n} {what}"
            for n, what in ((len(self.added), "new"), (len(self.changed), "changed"), (len(self.removed), "removed"))
            if n
        ]
        return ", ".join(parts) + (f"; {self.why}" if self.why else "") if parts else (self.why or "nothing changed")

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "added": len(self.added),
            "changed": len(self.changed),
            "removed": len(self.removed),
            "existing_frames": self.frames,
            **({"why": self.why} if self.why else {}),
        }


def _viewed(column: pa.ChunkedArray, as_type: pa.DataType) -> list[Any]:
    """The column's values seen as ``as_type`` (same layout: text as bytes, a timestamp as its
    integer), without ``cast``, which loads pyarrow.compute (30 ms of a cron run's no-op)."""
    if as_type == pa.binary() and pa.types.is_large_string(column.type):
        as_type = pa.large_binary()
    return [v for chunk in column.chunks for v in chunk.view(as_type).to_pylist()]


def plan_update(
    sources: SourceList,
    output: str | os.PathLike[str],
    *,
    checksum: bool = False,
    videos: bool = False,
    sealed: bool = False,
) -> UpdatePlan:
    """Compare ``sources`` with the published pack's index (size + mtime, md5 with ``checksum``);
    with ``sealed``, with the sealed ``.partial`` pack an interrupted run was publishing.

    With ``videos``, frames cut from a video stand for that video (its name, size and mtime;
    ``checksum`` cannot apply to it, as the pack holds frames, not the file)."""
    opened = _published_columns(os.fspath(output), sealed, checksum, videos)
    if opened is None:
        return UpdatePlan("new", list(sources.sources))
    table, alignment, data_end = opened
    old_names = _exact_names(table)
    sizes = table.column("source_size").to_pylist()
    mtimes_us = _viewed(table.column("source_mtime"), pa.int64())
    # the usual cron run, nothing new: the columns compared whole, without a Source object per file
    if not videos and not checksum and old_names == sources.names and sizes == sources.sizes:
        if mtimes_us == [ns // 1000 for ns in sources.mtimes_ns]:
            return UpdatePlan("up_to_date", frames=table.num_rows, alignment=alignment, data_end=data_end)
    md5s = table.column("md5").to_pylist() if checksum else [None] * table.num_rows
    old = _published(table, old_names, sizes, mtimes_us, md5s, videos)
    current = {_key(s.name, videos): s for s in sources.sources}
    added = [s for key, s in current.items() if key not in old]
    removed = sorted(n for n in old if n not in current)
    reasons: dict[bytes, str] = {}
    for name, s in current.items():
        was = old.get(name)
        if was is None or (was[0] == s.size and was[1] == s.mtime_ns // 1000 and not checksum):
            continue  # new, or unchanged by size and time
        reason = _why_changed(s, *was, checksum)
        if reason is not None:
            reasons[name] = reason
    status = "append" if added else "up_to_date"
    if reasons or removed:
        status = "repack"
    return UpdatePlan(status, added, sorted(reasons), removed, table.num_rows, alignment, data_end, reasons)


def _published_columns(out: str, sealed: bool, checksum: bool, videos: bool) -> tuple[pa.Table, int, int] | None:
    """The index columns an update compares, with the pack's alignment and data end; None when
    there is no pack. With ``sealed``, of the pair an interrupted run sealed, whichever of its
    two renames it got to."""
    from ..read.reader import PackReader

    pack, index = out, os.fspath(get_index_path(out))
    if sealed:
        pack = partial_name(out) if os.path.exists(partial_name(out)) else out
        index = partial_name(index) if os.path.exists(partial_name(index)) else index
    if not os.path.exists(pack):
        return None
    with PackReader(pack, index) as reader:  # refuses an incomplete pack or a mismatched index
        cols = ["name", "name_raw", "source_size", "source_mtime"]
        table = reader.read_index_columns(cols + ["md5"] * checksum + ["kind", "source"] * videos)
        return table, reader.info.header.alignment, reader.info.trailer.data_end


def _exact_names(table: pa.Table) -> list[bytes]:
    """The frames' names as exact bytes, a whole column at a time (``name_raw`` where a name is
    not UTF-8)."""
    names = _viewed(table.column("name"), pa.binary())
    raw = table.column("name_raw")
    if raw.null_count < len(raw):
        names = [n if r is None else r for n, r in zip(names, raw.to_pylist())]
    return names


def _published(
    table: pa.Table,
    names: list[bytes],
    sizes: list[int],
    mtimes_us: list[int],
    md5s: list[str | None],
    videos: bool,
) -> dict[bytes, tuple[int, int, str | None]]:
    """What the pack holds, as a source would be matched with it: name → (size, mtime in µs,
    md5); with ``videos``, a video's frames as the one video they were cut from (no md5)."""
    if not videos:
        return dict(zip(names, zip(sizes, mtimes_us, md5s)))
    old: dict[bytes, tuple[int, int, str | None]] = {}
    t = table.select(["kind", "source"]).to_pydict()
    for name, size, us, md5, kind, source in zip(names, sizes, mtimes_us, md5s, t["kind"], t["source"]):
        if kind == "video_frame" and source is not None:
            old.setdefault(source.encode(), (size, us, None))
        else:
            old[_key(name, videos)] = (size, us, md5)
    return old


def _why_changed(s: Source, size: int, us: int, md5: str | None, checksum: bool) -> str | None:
    """Why source ``s`` is not the file the pack holds (size, then time, then with ``checksum``
    its md5, read whole), or None when it is."""
    if s.size != size:
        return f"size {size} -> {s.size} bytes"
    if s.mtime_ns // 1000 != us:
        return f"modified {_utc(us)} -> {_utc(s.mtime_ns // 1000)}"
    if checksum and md5 is not None:
        digest = hashlib.md5()
        with open_source(s.path, s.size) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != md5:
            return f"md5 {md5} -> {digest.hexdigest()} (same size and time)"
    return None


def _utc(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + f".{us % 1_000_000:06d}Z"


def decide(plan: UpdatePlan, out: str, media: MediaOptions) -> UpdatePlan:
    """The policy beyond the file comparison: when an append would be wrong, a repack (``why``)."""
    if plan.status == "repack" and _renamed(plan):
        plan.why = (
            "every name changed: files listed one by one or on stdin are now named by their path as given, "
            "as tar names them (they were named relative to their common parent); --base DIR names them "
            "relative to DIR"
        )
    elif media.video_frames is not None and plan.status == "append":
        plan.status, plan.why = "repack", "with --video-frames an update repacks instead of appending"
    elif media.wants_dictionary and plan.status == "append" and not _has_dictionary(out):
        plan.status, plan.why = "repack", "the zstd dictionary is trained on all inputs: the pack has none yet"
    return plan


def _renamed(plan: UpdatePlan) -> bool:
    """Every frame is "removed" and most come back as new names that end with the old ones: the
    pack was named by hframe 0.1's common-parent rule for lists, and nothing else changed."""
    if not plan.removed or len(plan.removed) != plan.frames or len(plan.added) < len(plan.removed):
        return False
    old = set(plan.removed)
    found = sum(
        any(s.name[i + 1 :] in old for i in range(len(s.name)) if s.name[i : i + 1] == b"/") for s in plan.added
    )
    return found * 2 >= len(old)


def dry_run(
    sources: SourceList, output: str | os.PathLike[str], *, checksum: bool = False, media: MediaOptions | None = None
) -> UpdatePlan:
    """``pack --update --dry-run``: the plan ``update_pack`` would follow, and why. Nothing is
    written, locked or settled: an interrupted run's leftovers are only described, and a sealed
    pack that run was publishing (or had renamed, but not its index) is what the plan compares
    with, as the update would publish it first."""
    from ..read.dataset import get_manifest_path
    from .writer import half_done_publish

    out = os.fspath(output)
    if not os.path.exists(out) and get_manifest_path(out).exists():
        raise InputError(f"{out}: --update of a sharded dataset is not supported yet; repack it with --force")
    media = media or MediaOptions()
    state = "publishing" if half_done_publish(out) else _interrupted_run(out)
    videos = media.video_frames is not None
    plan = decide(plan_update(sources, out, checksum=checksum, videos=videos, sealed=state == "publishing"), out, media)
    if state == "publishing":
        plan.leftover = "an interrupted run's sealed pack would be published first (compared with above)"
    elif state == "packing":
        plan.leftover = "an interrupted run's partial pack would be discarded first"
    return plan


def _key(name: bytes, videos: bool) -> bytes:
    """How a source is matched with the index: its exact name, or with videos its name as the
    ``source`` column holds it (not-UTF-8 bytes shown as \\xNN)."""
    return name.decode("utf-8", "backslashreplace").encode() if videos else name


def _has_dictionary(pack: str) -> bool:
    from ..format.layout import FLAG_DICT, HEADER_SIZE, Header

    with open(pack, "rb") as f:
        return bool(Header.decode(f.read(HEADER_SIZE), pack).flags & FLAG_DICT)


def update_pack(
    sources: SourceList,
    out: str,
    settings: PackSettings,
    *,
    lock: OutputLock,
    checksum: bool = False,
) -> tuple[UpdatePlan, PackResult | None]:
    """Bring the published pack ``out`` (whose ``lock`` the caller holds: the plan is made under
    it, as a pack that another run is about to replace would republish a stale plan) up to date
    with ``sources`` (``pack --update``).

    Policy (``man/hframe.1``, UPDATE): nothing changed ⇒ nothing is written; only new files ⇒ a
    new pack with the existing records copied verbatim (same frame ids and offsets) and the new
    files appended in name order; any file changed or removed ⇒ a full repack (frame ids follow
    the sorted inputs again). The old pack stays published until the new one replaces it
    atomically; an interrupted append is simply run again (it writes no checkpoints).
    """
    from ..read.dataset import get_manifest_path

    lock.require(out)
    if not os.path.exists(out) and get_manifest_path(out).exists():
        raise InputError(f"{out}: --update of a sharded dataset is not supported yet; repack it with --force")
    _settle_interrupted_run(out, settings)
    videos = settings.media.video_frames is not None
    plan = decide(plan_update(sources, out, checksum=checksum, videos=videos), out, settings.media)
    fault_point("after-plan")
    if plan.status == "up_to_date":
        return plan, None
    from .run import write_pack

    if plan.status in ("new", "repack"):
        if plan.status == "repack":
            settings.note(f"update: {plan.summary()}: full repack")
        return plan, write_pack(sources, out, settings, lock=lock, force=True)
    return plan, _append(plan, sources, out, lock, settings)


def _settle_interrupted_run(out: str, settings: PackSettings) -> None:
    """What an earlier, interrupted run of this output left (called holding the lock).

    A run that died while publishing is finished (its pack was sealed and self-checked). A run
    that died while packing is abandoned: ``--update`` compares the sources with the published
    pack again, which that run never changed, and writes what is needed from there.
    """
    state = _interrupted_run(out)
    if state is None:
        return
    from .run import finish_publishing

    if state == "publishing":
        finish_publishing(out)
        settings.note(f"update: finished publishing {out}, left by an interrupted run")
    elif state == "packing":
        remove_checkpoint_files(out)
        for leftover in (partial_name(out), partial_name(index_name(out))):
            with suppress(FileNotFoundError):
                os.unlink(leftover)
        settings.note(f"update: discarded the partial pack of an interrupted run; {out} is unchanged")


def _interrupted_run(out: str) -> str | None:
    """``publishing`` (sealed, not yet renamed), ``packing`` (a partial pack) or None."""
    ckpt, _ = load_checkpoint(out)
    if ckpt is not None and ckpt.phase == "publishing":
        return "publishing"
    if ckpt is not None or os.path.exists(partial_name(out)):
        return "packing"
    return None


def _append(
    plan: UpdatePlan,
    sources: SourceList,
    out: str,
    lock: OutputLock,
    settings: PackSettings,
) -> PackResult:
    """A new pack: the published records copied verbatim (ids and offsets kept), then the new
    files (no checkpoints: an interrupted append is run again)."""
    from .run import abandon_on_bad_data, run_loop
    from .writer import PackWriter

    pack_uuid = None
    created_us = settings.created_us
    if created_us is None:
        created_us = time.time_ns() // 1000
        pack_uuid = str(uuid_mod.uuid4())
    settings = replace(settings, checkpoints=CheckpointPolicy(enabled=False))
    settings.note(f"update: appending {len(plan.added)} new files to {plan.frames} existing frames")
    added = SourceList(plan.added, list(sources.rejected))
    ckpt = Checkpoint(output=out, phase="packing", options={}, fingerprint="", source_count=len(plan.added))
    writer = PackWriter(
        out, alignment=plan.alignment, created_us=created_us, pack_uuid=pack_uuid, force=True, lock=lock
    )
    with writer:
        writer.copy_records_from(out, plan.data_end)
        with abandon_on_bad_data(out):
            return run_loop(writer, added, ckpt, settings, skipped=list(sources.rejected))
