"""One pack run's settings, one frozen value from the front door (``api.pack``) to the packing loop.

Its fields are of two kinds. ``RECORDED`` ones decide the pack's bytes: they are written into
the checkpoint and a sharded run's plan (``to_dict``), and a resumed run, a shard packed later
or a job-array part run again takes them from there (``restored``), so that it writes the bytes
the interrupted run would have written. The others say how this process runs: reader threads,
checkpoint cadence, signals, callbacks; a resume takes those from its own caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..sources.media import MediaOptions
from ..verify import DEFAULT_SELF_CHECK
from .checkpoint import CheckpointPolicy

if TYPE_CHECKING:
    from .writer import SealedPack

__all__ = ["RECORDED", "EventFn", "PackSettings", "ProgressFn"]

ProgressFn = Callable[[int, int], None]
EventFn = Callable[[str], None]

#: The settings a checkpoint or a sharded plan keeps (``PackSettings.to_dict``).
RECORDED = ("alignment", "created_us", "skip_bad", "self_check_frames", "media")


@dataclass(frozen=True)
class PackSettings:
    """How one run packs: what ``write_pack``, ``update_pack``, the shard and part drivers and
    the packing loop are told, as one value (changed with ``dataclasses.replace``)."""

    #: payload alignment in bytes (a power of two)
    alignment: int = 1
    #: a fixed creation time in µs (the output is then byte-for-byte reproducible); None: now
    created_us: int | None = None
    #: leave out sources that vanish, change or cannot be read while packing
    skip_bad: bool = False
    #: frames read back from disk and compared before publishing
    self_check_frames: int = DEFAULT_SELF_CHECK
    #: compression, dictionary, video, image-metadata, label and split options
    media: MediaOptions = field(default_factory=MediaOptions)
    #: reader threads (None: as ``run.py`` decides from the sources' sizes)
    workers: int | None = None
    checkpoints: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    #: stop cleanly on SIGINT/SIGTERM with a checkpoint (main thread only)
    handle_signals: bool = False
    #: called with (frames_done, bytes_done) after each frame
    on_progress: ProgressFn | None = None
    #: called with one line per event (start, checkpoint, skipped, done)
    on_event: EventFn | None = None
    #: called with the sealed, unpublished pack before the self-check (fault injection, monitoring)
    after_seal: Callable[[SealedPack], None] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``RECORDED`` settings as JSON-ready values (for a checkpoint or a plan)."""
        return {
            "alignment": self.alignment,
            "created_us": self.created_us,
            "skip_bad": self.skip_bad,
            "self_check_frames": self.self_check_frames,
            "media": self.media.to_dict(),
        }

    def restored(self, doc: Mapping[str, Any]) -> PackSettings:
        """These settings with the recorded ones of ``doc`` (``to_dict``, or the options of a
        checkpoint or plan written by an earlier version, which used the same keys)."""
        return replace(
            self,
            alignment=int(doc.get("alignment", 1)),
            created_us=doc.get("created_us"),
            skip_bad=bool(doc.get("skip_bad", False)),
            self_check_frames=int(doc.get("self_check_frames", DEFAULT_SELF_CHECK)),
            media=MediaOptions.from_dict(doc.get("media")),
        )

    def note(self, message: str) -> None:
        """Tell ``on_event`` (if any) one line."""
        if self.on_event is not None:
            self.on_event(message)
