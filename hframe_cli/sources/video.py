"""Video inputs: recognise them, and cut them into frames with PyAV (``--video-frames``).

Frames are decoded one at a time (bounded memory, whatever the video's length) with the
decoder's own threads, converted to RGB and stored as JPEG (``--frame-format jpeg:Q``) or PNG.
Encoded packets are not stored: in inter-coded streams (H.264, VP9, MPEG-4) most packets cannot
be decoded on their own, which would defeat random access. Every mode decodes every frame, so
``frame_index`` is the exact position of the frame in presentation order; only the frames kept
are converted and encoded. The same file and options always give the same bytes (FFmpeg's
decoders are bit-exact; Pillow's encoders are deterministic).

A video that breaks part-way (corrupt data, truncated file) yields the frames decoded before the
damage, then ``VideoFrames.damage`` says what went wrong; PyAV is imported only here.

Imports inside functions: PyAV, only when a video is cut (slow to load).
"""

from __future__ import annotations

import io
import math
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..processes import usable_cpus

__all__ = [
    "VIDEO_EXTENSIONS",
    "VideoFrame",
    "VideoFrames",
    "looks_like_video",
    "parse_frame_format",
    "parse_video_frames",
]

VIDEO_EXTENSIONS = frozenset(
    {
        "3g2", "3gp", "asf", "avi", "f4v", "flv", "m2ts", "m2v", "m4v", "mkv", "mov", "mp4", "mpeg",
        "mpg", "mts", "mxf", "ogv", "ts", "vob", "webm", "wmv",
    }
)  # fmt: skip
_IMAGE_BRANDS = (b"heic", b"heix", b"hevc", b"mif1", b"msf1", b"avif", b"avis")
SNIFF_VIDEO_BYTES = 32
_ENCODE_THREADS = 2


def sniff_video(head: bytes) -> bool:
    """Whether the first bytes look like a video container (mp4/mov, mkv/webm, avi, ...)."""
    if len(head) >= 12 and head[4:8] == b"ftyp":
        return head[8:12] not in _IMAGE_BRANDS  # HEIF/AVIF images share the ISO container
    if len(head) >= 8 and head[4:8] in (b"moov", b"mdat", b"wide", b"free"):
        return True
    return (
        head[:4] == b"\x1a\x45\xdf\xa3"  # Matroska / WebM
        or (head[:4] == b"RIFF" and head[8:12] == b"AVI ")
        or head[:4] in (b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3")  # MPEG program / elementary stream
        or head[:3] == b"FLV"
        or head[:4] == b"\x30\x26\xb2\x75"  # ASF / WMV
        or (len(head) > 188 and head[0] == 0x47 and head[188] == 0x47)  # MPEG-TS
    )


def has_video_extension(name: bytes | str) -> bool:
    text = os.fsdecode(name)
    return text.rpartition(".")[2].lower() in VIDEO_EXTENSIONS if "." in text else False


def looks_like_video(name: bytes | str, head: bytes) -> bool:
    """A video extension, or video magic bytes (confirmed later by opening the container)."""
    return has_video_extension(name) or sniff_video(head)


def parse_video_frames(text: str) -> tuple[str, float]:
    """``all`` | ``keyframes`` | ``every:N`` | ``fps:R`` → (mode, parameter)."""
    mode, _, arg = text.partition(":")
    if mode in ("all", "keyframes") and not arg:
        return mode, 0.0
    if mode in ("every", "fps") and arg:
        try:
            value = float(arg) if mode == "fps" else int(arg)
        except ValueError:
            value = 0
        if value > 0 and math.isfinite(value):
            return mode, float(value)
    raise InputError(f"--video-frames {text!r}: expected all, keyframes, every:N (N >= 1) or fps:R (R > 0)")


def parse_frame_format(text: str) -> tuple[str, int]:
    """``jpeg[:QUALITY]`` (1..100, default 90) or ``png`` → (format, quality)."""
    fmt, _, arg = text.partition(":")
    if fmt in ("jpeg", "jpg"):
        try:
            q = int(arg) if arg else 90
        except ValueError:
            q = 0
        if 1 <= q <= 100:
            return "jpeg", q
    elif fmt == "png" and not arg:
        return "png", 0
    raise InputError(f"--frame-format {text!r}: expected jpeg, jpeg:QUALITY (1-100) or png")


@dataclass(frozen=True)
class VideoFrame:
    """One extracted frame: its encoded image bytes and where it came from."""

    index: int  # position in presentation order, from 0
    pts_s: float | None
    keyframe: bool
    width: int
    height: int
    data: bytes


class VideoFrames:
    """Iterate the selected frames of one video; afterwards ``damage`` tells if it broke.

    Args:
        path: the video file.
        where: how errors name it.
        mode, param: from ``parse_video_frames``.
        frame_format: from ``parse_frame_format``.
        max_frames: stop after this many frames are kept.
        should_stop: checked after every decoded frame (a signal arrived): iteration ends early
            and ``stopped`` is set.

    Raises:
        InputError: on iteration, if the file is not a video FFmpeg can open (no video stream).
    """

    def __init__(
        self,
        path: str,
        where: str,
        mode: str,
        param: float,
        frame_format: tuple[str, int],
        max_frames: int | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.path = path
        self.should_stop = should_stop
        self.stopped = False  # should_stop said so: the frames so far are not the whole selection
        self.where = where
        self.mode, self.param = mode, param
        self.format, self.quality = frame_format
        self.max_frames = max_frames
        self.damage: str | None = None
        self.decoded = 0
        self.kept = 0

    def open(self) -> Any:
        import av

        try:
            container = av.open(self.path, metadata_errors="ignore")
        except Exception as e:  # noqa: BLE001 - FFmpeg reports bad input through many types
            raise InputError(f"{self.where}: not a video FFmpeg can read ({_reason(e)})") from None
        if not container.streams.video:
            container.close()
            raise InputError(f"{self.where}: not a video (the container has no video stream)")
        return container

    def __iter__(self) -> Iterator[VideoFrame]:
        container = self.open()
        try:
            yield from self._frames(container)
        finally:
            container.close()

    def _keep(self, index: int, t: float | None, key: bool, start: float) -> bool:
        if self.mode == "all":
            return True
        if self.mode == "keyframes":
            return key
        if self.mode == "every":
            return index % int(self.param) == 0
        # fps:R: the first frame at or after each point start + k/R
        if t is None:
            return False
        return t >= start + self._next_k / self.param - 1e-9

    def _frames(self, container: Any) -> Iterator[VideoFrame]:
        """Decode on this thread; convert and encode the kept frames on a few threads (Pillow
        and libswscale release the GIL), yielding them in order with few in flight."""
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # frame and slice threads where the decoder has them
        rate = float(stream.average_rate) if stream.average_rate else None
        start: float | None = None
        self._next_k = 0
        last_t: float | None = None
        workers = min(_ENCODE_THREADS, usable_cpus())
        pool = ThreadPoolExecutor(workers, thread_name_prefix="hframe-video") if workers > 1 else None
        pending: deque[tuple[int, float | None, bool, int, int, Future[bytes] | bytes]] = deque()

        def done() -> VideoFrame:
            index, t, key, w, h, data = pending.popleft()
            self.kept += 1
            return VideoFrame(index, t, key, w, h, data if isinstance(data, bytes) else data.result())

        try:
            try:
                for frame in container.decode(stream):
                    if self.should_stop is not None and self.should_stop():
                        self.stopped = True
                        return
                    index = self.decoded
                    self.decoded += 1
                    t = float(frame.time) if frame.time is not None else (index / rate if rate else None)
                    if start is None:
                        start = t if t is not None else 0.0
                    last_t = t
                    if not self._keep(index, t, bool(frame.key_frame), start):
                        continue
                    if self.mode == "fps" and t is not None:
                        self._next_k = math.floor((t - start) * self.param + 1e-9) + 1
                    data = pool.submit(self._encode, frame) if pool is not None else self._encode(frame)
                    pending.append((index, t, bool(frame.key_frame), frame.width, frame.height, data))
                    if len(pending) > 2 * workers:
                        yield done()
                    if self.max_frames is not None and self.kept + len(pending) >= self.max_frames:
                        while pending:
                            yield done()
                        return  # stopped on purpose: the rest is not checked
            except Exception as e:  # noqa: BLE001 - a decoder error ends the video, it is not a crash
                self.damage = f"decoding stopped after frame {self.decoded - 1}: {_reason(e)}"
            while pending:
                try:
                    frame_out = done()
                except Exception as e:  # noqa: BLE001 - a frame that cannot be encoded ends the video
                    self.damage = self.damage or f"a kept frame could not be encoded: {_reason(e)}"
                    return
                yield frame_out
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        if self.damage is None:
            self.damage = self._check_complete(container, stream, rate, last_t)

    def _check_complete(self, container: Any, stream: Any, rate: float | None, last_t: float | None) -> str | None:
        """A video that ends early without an error (truncated files often do) is damaged too.

        The evidence is the timestamps: frames that end well short of the duration the container
        gives. A declared frame count is not: a variable-rate or sparse file (dropped and repeated
        frames not stored, as AVI and screen recorders do) declares more frames than it holds
        while its timestamps reach the end. The count decides only where there is no duration.
        """
        declared = int(stream.frames or 0)
        if self.decoded == 0:
            return "no frame could be decoded"
        if declared and self.decoded >= declared:
            return None  # every frame the container lists is here (a last frame may be held long)
        duration = None
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None and len(container.streams) == 1:
            duration = container.duration / 1_000_000
        if duration is not None and last_t is not None:
            step = 1 / rate if rate else 0.0
            start = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
            if last_t + step < start + duration - max(2 * step, 0.25):
                return f"frames end at {last_t + step:.3f} s, the container says {start + duration:.3f} s (truncated?)"
            return None
        if declared and self.decoded < declared:
            return (
                f"only {self.decoded} of the {declared} frames the container declares could be decoded, "
                "and it gives no duration to judge by (truncated?)"
            )
        return None

    def _encode(self, frame: Any) -> bytes:
        img = frame.to_image()  # RGB, converted by libswscale
        buf = io.BytesIO()
        if self.format == "jpeg":
            img.save(buf, "JPEG", quality=self.quality)
        else:
            img.save(buf, "PNG")
        return buf.getvalue()


def frame_name(source_name: bytes, index: int) -> bytes:
    """The name of frame ``index`` of a video: ``clip.mp4#frame=120``."""
    return source_name + b"#frame=%d" % index


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text.replace("\n", " ")[:300]
