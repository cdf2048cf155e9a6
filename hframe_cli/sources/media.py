"""What ``pack`` does to each frame besides storing it: image metadata, compression, labels.

``MediaOptions`` is the one value that carries the media flags of a run (``--compress``,
``--zstd-dict``, ``--video-frames``, ``--frame-format``, ``--label-from``, ``--split``, ...) from the
CLI through ``pack``, ``resume``, shards and checkpoints. ``FramePrep`` applies them to one
frame: it runs on the reader threads, so Pillow header parsing and zstd (both release the GIL
for their heavy parts) overlap with writing.

Imports inside functions: ``video`` (and through it PyAV), only with ``--video-frames``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import FormatError, InputError
from ..format.codec import Compression, check_dictionary, parse_compress
from ..format.labels import LabelPolicy, is_member_label, parse_split, split_of
from ..format.layout import KIND_IDS, SNIFF_BYTES, sniff_media_type
from .imagehead import image_info

__all__ = ["FramePrep", "MediaOptions", "PreparedFrame"]

_IMAGE, _BLOB = KIND_IDS["image"], KIND_IDS["blob"]


@dataclass(frozen=True)
class MediaOptions:
    """The media flags of a pack run (JSON-serialisable, kept in checkpoints)."""

    compress: str = "none"
    zstd_dict: str = "none"  # auto | none | PATH
    video_frames: str | None = None  # all | keyframes | every:N | fps:R; None = videos stored as files
    frame_format: str = "jpeg:90"
    max_frames_per_video: int | None = None
    label_from: str = "parent"
    split: str | None = None
    image_meta: bool = True
    strict_images: bool = False
    label_csv_sha256: str | None = None  # fixed when the run starts: resume refuses a changed CSV

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> MediaOptions:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in (d or {}).items() if k in known})

    def check(self) -> None:
        """Refuse bad values early, naming the flag."""
        parse_compress(self.compress)
        parse_split(self.split)
        level = parse_compress(self.compress)
        if self.zstd_dict != "none" and level is None:
            raise InputError("--zstd-dict needs --compress zstd[:LEVEL]")
        if self.zstd_dict not in ("auto", "none") and level is not None:
            try:
                with open(self.zstd_dict, "rb") as f:
                    check_dictionary(f.read(), level, f"--zstd-dict {self.zstd_dict}")
            except OSError as e:
                raise InputError(f"--zstd-dict {self.zstd_dict}: cannot read: {e.strerror}") from None
        if self.video_frames is not None:
            from .video import parse_frame_format, parse_video_frames

            parse_video_frames(self.video_frames)
            parse_frame_format(self.frame_format)
        if self.max_frames_per_video is not None and self.max_frames_per_video < 1:
            raise InputError("--max-frames-per-video must be at least 1")

    def with_label_csv_fixed(self) -> MediaOptions:
        """These options with a ``--label-from CSV`` path made absolute and its SHA-256 recorded
        (at run start), or checked against the one recorded (on resume)."""
        if self.label_from in ("parent", "none") or is_member_label(self.label_from):
            return self
        path = os.path.abspath(self.label_from)
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            raise InputError(f"--label-from {self.label_from}: cannot read: {e.strerror}") from None
        if self.label_csv_sha256 is not None and digest != self.label_csv_sha256:
            raise InputError(
                f"{path}: the labels CSV changed since the run started; restore it, or start over with --force"
            )
        return replace(self, label_from=path, label_csv_sha256=digest)

    @property
    def level(self) -> int | None:
        return parse_compress(self.compress)

    @property
    def wants_dictionary(self) -> bool:
        return self.level is not None and self.zstd_dict != "none"


@dataclass
class PreparedFrame:
    """A frame as it goes into the pack."""

    data: bytes
    md5: bytes  # of the raw bytes
    raw_length: int
    codec: int = 0
    flags: int = 0
    media: str = "unknown"
    kind: int = _BLOB
    meta: dict[str, Any] = field(default_factory=dict)
    warning: str | None = None


class FramePrep:
    """Applies ``MediaOptions`` to frames (thread-safe)."""

    def __init__(self, options: MediaOptions, dictionary: bytes | None = None) -> None:
        self.options = options
        level = options.level
        self.compression = Compression(level, dictionary) if level is not None else None
        self.labels = LabelPolicy.parse(options.label_from)
        self.splits = parse_split(options.split)
        # a blob gets no metadata of its own under these options: it needs no preparing at all
        self.plain_blobs = self.compression is None and self.labels.kind == "parent" and not self.splits

    def group_meta(self, name: bytes, group: bytes | None = None) -> dict[str, Any]:
        """Label and split of a frame; ``group`` (a video's name) keeps a video's frames together."""
        meta: dict[str, Any] = {}
        key = group if group is not None else name
        if self.labels.kind != "parent":
            label = self.labels.label(key)
            if label is None and group is not None:
                label = self.labels.label(name)
            meta["label"] = label
        elif group is not None:
            meta["label"] = self.labels.label(group)
        if self.splits:
            meta["split"] = split_of(key, self.splits)
        return meta

    def prepare(
        self, name: bytes, data: bytes, md5: bytes | None = None, origin: dict[str, str] | None = None
    ) -> PreparedFrame | None:
        """Sniff, describe and (maybe) compress one frame held in memory (``origin``: what a
        located source brings, ``located.read_located``: its ``source``, and a table row's
        ``label``, which is kept over ``--label-from``'s); None when it is a blob stored as it
        is with nothing to record but its ``source`` (the writer's plain path, ``add_blob``)."""
        media = sniff_media_type(data[:SNIFF_BYTES])
        if media == "unknown" and self.plain_blobs and (not origin or origin.keys() == _SOURCE_ONLY):
            return None
        if md5 is None:
            md5 = hashlib.md5(data).digest()
        meta = self.group_meta(name)
        if origin:
            meta.update(origin)
        warning = None
        kind = _BLOB
        if media != "unknown":
            kind = _IMAGE
            if self.options.image_meta:
                try:
                    meta["width"], meta["height"], meta["mode"] = image_info(data, media)
                except ValueError as e:
                    warning = f"unreadable {media} header ({e})"
        frame = PreparedFrame(data, md5, len(data), media=media, kind=kind, meta=meta, warning=warning)
        if self.compression is not None and media not in _COMPRESSED_IMAGES:
            c = self.compression.compress(data)
            frame.data, frame.codec, frame.flags = c.data, c.codec, c.flags
            if c.codec and media != "unknown":
                meta["media_type"] = media  # the stored bytes no longer show it
        return frame


#: Formats that are compressed already: stored raw without trying zstd (it would not shrink them).
_COMPRESSED_IMAGES = frozenset({"jpeg", "png", "gif", "webp"})


_IMAGE_KEYS = frozenset({"width", "height", "mode"})
_SOURCE_ONLY = frozenset({"source"})


def encode_meta(meta: dict[str, Any]) -> bytes:
    """The metadata JSON stored in a record header (compact, sorted keys: deterministic)."""
    if not meta:
        return b""
    if meta.keys() == _IMAGE_KEYS and type(meta["width"]) is int and type(meta["height"]) is int:
        mode = meta["mode"]
        if mode.isalnum() or mode in _PLAIN_MODES:  # what json.dumps would write, written directly
            return b'{"height":%d,"mode":"%s","width":%d}' % (meta["height"], mode.encode(), meta["width"])
    if len(meta) == 1 and type(meta.get("source")) is str:  # an archive member's blob: written directly too
        source = meta["source"]
        if source.isascii() and source.isprintable() and '"' not in source and "\\" not in source:
            return b'{"source":"%s"}' % source.encode()  # (nothing JSON would escape)
        return b'{"source":%s}' % json.dumps(source, ensure_ascii=False).encode()
    return json.dumps(meta, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


_PLAIN_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "BGR;15", "BGR;16", "BGR;24"})


def decode_meta(data: bytes, where: str) -> dict[str, Any]:

    try:
        meta = json.loads(data)
    except ValueError as e:
        raise FormatError(f"{where}: frame metadata is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise FormatError(f"{where}: frame metadata is not a JSON object")
    for key, value in meta.items():
        kind = _META_TYPES.get(key)
        if value is None or kind is None:
            continue  # null, or a key from a later release: ignored
        ok = (
            (kind == "int32" and type(value) is int and 0 <= value < 2**31)
            or (kind == "int64" and type(value) is int and 0 <= value < 2**63)
            or (kind == "float" and type(value) in (int, float) and math.isfinite(value))
            or (kind == "bool" and type(value) is bool)
            or (kind == "str" and type(value) is str)
        )
        if not ok:
            raise FormatError(f"{where}: frame metadata {key!r} has an invalid value ({str(value)[:40]!r})")
    return meta


_META_TYPES = {
    "width": "int32",
    "height": "int32",
    "frame_index": "int64",
    "source_size": "int64",
    "pts_s": "float",
    "keyframe": "bool",
    "mode": "str",
    "label": "str",
    "split": "str",
    "source": "str",
    "media_type": "str",
}
