"""Per-frame compression: zstd with an optional trained dictionary, and the way back.

Every frame is compressed on its own, so random access survives: a reader decompresses just
the frames it reads. A frame that does not shrink (JPEG, PNG, already-compressed data) is
stored raw and recorded as codec ``none``. A dictionary trained on a deterministic sample of
the inputs lets small records compress well; it is stored in the pack (record 0's extra field,
``man/hframe.5``) so the pack stays self-contained.

Imports inside functions: zstandard, only for compressed packs.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DictionaryUnavailable, FormatError, InputError, OutOfMemory
from .layout import CODEC_IDS, MAX_EXTRA_BYTES, RECORD_FLAG_DICT

__all__ = [
    "Compression",
    "Decompressor",
    "ZstdDecoder",
    "register_decoder",
    "check_dictionary",
    "MAX_RAW_BYTES",
    "parse_compress",
    "sample_for_dictionary",
    "train_dictionary",
]

ZSTD = CODEC_IDS["zstd"]
NONE = CODEC_IDS["none"]
#: No frame decompresses to more than this (a declared size above it is a decompression bomb).
MAX_RAW_BYTES = 1 << 30
#: A frame whose raw size is above this is hashed in pieces as it decompresses (``digest``),
#: where the whole is not needed: verify's memory stays bounded whatever a pack declares.
DIGEST_IN_PIECES_ABOVE = 32 << 20
_PIECE = 1 << 20
#: Compressed frames must save at least this fraction, else the raw bytes are stored.
_MIN_SAVING = 1 / 64
DEFAULT_LEVEL = 3
DICT_SIZE = 64 << 10
_SAMPLE_FILES = 4096
_SAMPLE_BYTES = 16 << 20


def parse_compress(text: str | None) -> int | None:
    """``none`` → None; ``zstd`` / ``zstd:LEVEL`` → the level (1..22, negative for fast modes)."""
    if text is None or text == "none":
        return None
    name, _, level = text.partition(":")
    if name != "zstd":
        raise InputError(f"--compress {text!r}: expected none, zstd or zstd:LEVEL")
    if not level:
        return DEFAULT_LEVEL
    try:
        value = int(level)
    except ValueError:
        raise InputError(f"--compress {text!r}: the level must be an integer") from None
    if not -7 <= value <= 22 or value == 0:
        raise InputError(f"--compress {text!r}: the level must be 1..22 (or -7..-1 for the fast modes)")
    return value


@dataclass(frozen=True)
class Compressed:
    """One frame ready to store: the bytes, codec id and record flags."""

    data: bytes
    codec: int
    flags: int


class Compression:
    """Compresses frames (thread-safe: one zstd compressor per thread).

    Args:
        level: zstd level.
        dictionary: the raw dictionary bytes, or None.
    """

    def __init__(self, level: int, dictionary: bytes | None = None) -> None:
        import zstandard as zstd

        self.level = level
        self.dictionary = dictionary
        self._dict = zstd.ZstdCompressionDict(dictionary) if dictionary else None
        if self._dict is not None:
            self._dict.precompute_compress(level=level)
        self._local = threading.local()

    def _compressor(self) -> Any:
        c = getattr(self._local, "c", None)
        if c is None:
            import zstandard as zstd

            c = zstd.ZstdCompressor(level=self.level, dict_data=self._dict, write_checksum=False)
            self._local.c = c
        return c

    def compress(self, data: bytes) -> Compressed:
        """The frame as stored: compressed when that saves space, else raw (codec none)."""
        if len(data) < 16:
            return Compressed(data, NONE, 0)
        out = self._compressor().compress(data)
        if len(out) > len(data) * (1 - _MIN_SAVING):
            return Compressed(data, NONE, 0)
        return Compressed(out, ZSTD, RECORD_FLAG_DICT if self._dict is not None else 0)


class ZstdDecoder:
    """Decodes zstd frames (codec 1), with the pack's dictionary where a record's flag says so.
    Thread-safe: one zstd decompressor per thread and kind (with or without the dictionary)."""

    def __init__(self, dictionary: bytes | None, where: str) -> None:
        self.dictionary = dictionary
        self.where = where
        self._local = threading.local()

    def _get(self, with_dict: bool) -> Any:
        key = "d" if with_dict else "p"
        d = getattr(self._local, key, None)
        if d is None:
            import zstandard as zstd

            if with_dict and self.dictionary is None:
                raise DictionaryUnavailable(
                    f"{self.where}: a frame needs the pack's zstd dictionary, and the pack has none"
                )
            zd = zstd.ZstdCompressionDict(self.dictionary) if with_dict and self.dictionary else None
            d = zstd.ZstdDecompressor(dict_data=zd)
            setattr(self._local, key, d)
        return d

    @staticmethod
    def _check_size(data: bytes | memoryview, raw_length: int, frame: str) -> None:
        import zstandard as zstd

        try:
            params = zstd.get_frame_parameters(data)
        except zstd.ZstdError as e:
            raise FormatError(f"{frame}: not a zstd frame ({e})") from None
        if params.content_size != raw_length:
            raise FormatError(
                f"{frame}: zstd frame declares {params.content_size} bytes, the record says {raw_length}"
                + (" (decompression bomb?)" if params.content_size > MAX_RAW_BYTES else "")
            )

    def digest(
        self, data: bytes | memoryview, flags: int, raw_length: int, frame: str, head: int
    ) -> tuple[bytes, bytes]:
        """(md5 of the raw bytes, their first ``head`` bytes), decompressing in 1 MiB pieces."""
        import zstandard as zstd

        self._check_size(data, raw_length, frame)
        md5, first, total = hashlib.md5(), b"", 0
        try:
            with self._get(bool(flags & RECORD_FLAG_DICT)).stream_reader(data, read_across_frames=False) as r:
                while piece := r.read(_PIECE):
                    total += len(piece)
                    if total > raw_length:
                        break
                    if len(first) < head:
                        first += piece[: head - len(first)]
                    md5.update(piece)
        except zstd.ZstdError as e:
            raise FormatError(f"{frame}: zstd data does not decompress ({e})") from None
        if total != raw_length:
            raise FormatError(f"{frame}: decompressed to {total} bytes or more, the record says {raw_length}")
        return md5.digest(), first

    def decode(self, data: bytes | memoryview, flags: int, raw_length: int, frame: str) -> bytes:
        import zstandard as zstd

        self._check_size(data, raw_length, frame)
        try:
            out: bytes = self._get(bool(flags & RECORD_FLAG_DICT)).decompress(data, max_output_size=raw_length)
        except zstd.ZstdError as e:
            raise FormatError(f"{frame}: zstd data does not decompress ({e})") from None
        if len(out) != raw_length:
            raise FormatError(f"{frame}: decompressed to {len(out)} bytes, the record says {raw_length}")
        return out

    def decode_many(self, datas: list[bytes], raw_lengths: list[int], with_dict: bool) -> list[bytes]:
        """All of ``datas`` in one call into zstd (sizes checked by zstd against ``raw_lengths``).

        Raises:
            zstandard.ZstdError: some frame failed (the caller retries frame by frame).
        """
        sizes = array("Q", raw_lengths).tobytes()
        result = self._get(with_dict).multi_decompress_to_buffer(datas, decompressed_sizes=sizes, threads=1)
        return [seg.tobytes() for seg in result]


#: Codec id (``layout.CODEC_IDS``, the on-disk number) → decoder class. A new codec registers its
#: decoder here (``register_decoder``); readers, verify and ``get`` find it through ``Decompressor``.
_DECODERS: dict[int, Callable[[bytes | None, str], Any]] = {ZSTD: ZstdDecoder}


def register_decoder(codec: int, factory: Callable[[bytes | None, str], Any]) -> None:
    """Make frames stored with ``codec`` readable: ``factory(dictionary, where)`` returns an
    object with ``decode(data, flags, raw_length, frame) -> bytes`` (and, optionally,
    ``decode_many(datas, raw_lengths, with_dict) -> list[bytes]`` for batches)."""
    _DECODERS[codec] = factory


class Decompressor:
    """Turns stored frames back into their raw bytes, whatever their codec (thread-safe)."""

    def __init__(self, dictionary: bytes | None = None, where: str = "pack", *, dictionary_lost: bool = False) -> None:
        self.dictionary = dictionary
        self.where = where
        #: the pack has a dictionary that could not be read (already reported as such): the
        #: frames that need it cannot be checked, which says nothing about their own bytes
        self.dictionary_lost = dictionary_lost
        self._decoders: dict[int, Any] = {}

    def _decoder(self, codec: int, frame: str) -> Any:
        d = self._decoders.get(codec)
        if d is None:
            factory = _DECODERS.get(codec)
            if factory is None:
                raise FormatError(f"{frame}: unknown codec {codec}")
            d = self._decoders.setdefault(codec, factory(self.dictionary, self.where))
        return d

    def batches(self, codec: int) -> bool:
        """Whether frames of ``codec`` can be decoded many at a time (``decode_many``)."""
        factory = _DECODERS.get(codec)
        return factory is not None and hasattr(factory, "decode_many")

    def decode(self, data: bytes | memoryview, codec: int, flags: int, raw_length: int, frame: str) -> bytes:
        """The raw bytes of a stored frame; ``frame`` names it in errors.

        Raises:
            FormatError: an unknown codec, a declared size that is absurd (a decompression
                bomb) or differs from the record, or data that does not decompress.
        """
        if codec == NONE:
            return bytes(data)
        decoder = self._decoder(codec, frame)
        if raw_length > MAX_RAW_BYTES:
            raise FormatError(
                f"{frame}: refusing to decompress: declared size {raw_length} bytes exceeds the "
                f"{MAX_RAW_BYTES}-byte limit (decompression bomb?)"
            )
        try:
            out: bytes = decoder.decode(data, flags, raw_length, frame)
        except MemoryError:
            raise OutOfMemory(
                f"{frame}: not enough memory to decompress its {raw_length} bytes (the process may "
                "not take that much; 'hframe verify' checks such frames in pieces)"
            ) from None
        return out

    def digest(
        self, data: bytes | memoryview, codec: int, flags: int, raw_length: int, frame: str, head: int
    ) -> tuple[bytes, bytes]:
        """(md5 of a stored frame's raw bytes, their first ``head`` bytes), in bounded memory
        where the codec can decompress in pieces.

        Raises:
            FormatError: as ``decode``.
        """
        decoder = self._decoder(codec, frame)
        if raw_length > MAX_RAW_BYTES:
            raise FormatError(
                f"{frame}: refusing to decompress: declared size {raw_length} bytes exceeds the "
                f"{MAX_RAW_BYTES}-byte limit (decompression bomb?)"
            )
        if hasattr(decoder, "digest"):
            pair: tuple[bytes, bytes] = decoder.digest(data, flags, raw_length, frame, head)
            return pair
        raw = self.decode(data, codec, flags, raw_length, frame)
        return hashlib.md5(raw).digest(), raw[:head]

    def decode_many(
        self,
        datas: list[bytes],
        ids: list[int],
        raw_lengths: list[int],
        with_dict: bool,
        where: str,
        codec: int = ZSTD,
    ) -> None:
        """Decompress ``datas`` (all of ``codec``) in place, in one call where the codec can.

        The output sizes come from ``raw_lengths`` (from the index, each at most
        ``MAX_RAW_BYTES``), so a frame that declares or holds more than that fails instead of
        allocating; any failure is retried frame by frame to name the frame and the reason.
        """
        flags = RECORD_FLAG_DICT if with_dict else 0

        def one_by_one() -> list[bytes]:
            return [
                self.decode(data, codec, flags, raw, f"{where}: frame {i}")
                for data, raw, i in zip(datas, raw_lengths, ids)
            ]

        if max(raw_lengths) > MAX_RAW_BYTES or min(raw_lengths) < 1 or not self.batches(codec):
            datas[:] = one_by_one()
            return
        try:
            out = self._decoder(codec, where).decode_many(datas, raw_lengths, with_dict)
        except Exception:  # noqa: BLE001 - any failure: frame by frame, to name the frame and why
            out = one_by_one()
        datas[:] = out  # the codec has checked every size: a frame larger or smaller than its size fails


def check_dictionary(data: bytes, level: int, where: str) -> None:
    """Refuse a dictionary zstd cannot use, or one too large for a record header's extra field.

    Raises:
        InputError: naming ``where`` and the reason.
    """
    import zstandard as zstd

    if len(data) > MAX_EXTRA_BYTES - 64:
        raise InputError(f"{where}: {len(data)} bytes; a stored dictionary is at most {MAX_EXTRA_BYTES - 64} bytes")
    try:
        zstd.ZstdCompressionDict(data).precompute_compress(level=level)
    except zstd.ZstdError as e:
        raise InputError(f"{where}: not a usable zstd dictionary ({e})") from None


def sample_for_dictionary(sizes: Sequence[int]) -> list[int]:
    """Which inputs train the dictionary: an even, deterministic spread over the sorted list
    (at most 4096 files and about 16 MiB)."""
    n = len(sizes)
    if n == 0:
        return []
    mean = max(1, sum(sizes) // n)
    want = max(1, min(n, _SAMPLE_FILES, _SAMPLE_BYTES // mean))
    return sorted({i * n // want for i in range(want)})


def train_dictionary(samples: Sequence[bytes], level: int, size: int = DICT_SIZE) -> bytes | None:
    """A zstd dictionary trained on ``samples`` (deterministic: one thread, fixed parameters),
    or None when there is too little to learn from."""
    import zstandard as zstd

    kept: list[Any] = [s for s in samples if s]
    total = sum(map(len, kept))
    if len(kept) < 8 or total < 4096:
        return None
    size = max(1024, min(size, total // 8))
    try:
        d = zstd.train_dictionary(size, kept, level=level, k=1024, d=8, threads=1)
    except zstd.ZstdError:
        return None
    return bytes(d.as_bytes())
