"""The pack byte layout (format v1): header, record headers, trailer, magic sniffing.

This module is the only place that knows byte positions. ``man/hframe.5`` documents
the same layout for people; keep the two in step. All integers are little-endian.

::

    offset 0      header     128 bytes  (HEADER below)
                  record 0   record header (RECORD_FIXED + name + extra + zero padding)
                             payload: the source bytes verbatim, ``length`` bytes
                  record 1   ...
    size - 64     trailer    64 bytes   (TRAILER below); written last, marks the pack complete
"""

from __future__ import annotations

import mmap
import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError, IncompletePack, NotAPack, UnsupportedVersion

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "MEDIA_TYPES",
    "RECORD_MAGIC",
    "SUPPORTED_MAJOR",
    "TRAILER_MAGIC",
    "TRAILER_SIZE",
    "Header",
    "RecordHeader",
    "Trailer",
    "align_up",
    "record_header_size",
    "sniff_media_type",
]

#: (major, minor). Readers accept any minor of a supported major; a new major is refused.
#: A pack is written as 1.0 unless it uses what 1.1 added (per-frame compression, the extra
#: field of record headers), so packs without those stay byte-identical to 1.0 ones.
FORMAT_VERSION = (1, 0)
FORMAT_VERSION_EXTRAS = (1, 1)
SUPPORTED_MAJOR = (1,)

MAGIC = b"\x89HFRAME\n"  # 8 bytes; the high bit and \n catch 7-bit and newline-mangling transfers
TRAILER_MAGIC = b"\x89HFEND\r\n"  # 8 bytes
RECORD_MAGIC = b"HFR1"  # 4 bytes

# header: magic, major, minor, header_size, flags, alignment, created_us, uuid, reserved, crc32
_HEADER = struct.Struct("<8sHHIIIq16s76xI")
HEADER_SIZE = _HEADER.size  # 128

# record: magic, header_size, frame_id, length, raw_length, md5, mtime_ns, codec, kind,
#         name_len, extra_len, flags, crc32; followed by name, extra, zero padding
_RECORD = struct.Struct("<4sIQQQ16sqHHIIII")
RECORD_FIXED = _RECORD.size  # 76
RECORD_STRUCT = _RECORD

# trailer: magic, major, minor, trailer_size, frame_count, payload_bytes, data_end, uuid,
#          flags, crc32
_TRAILER = struct.Struct("<8sHHIQQQ16sII")
TRAILER_SIZE = _TRAILER.size  # 64

FLAG_ALIGNED = 1  # header flag: payloads start on multiples of ``alignment``
FLAG_COMPRESSED = 2  # header flag (1.1): some frames are stored with a codec other than none
FLAG_DICT = 4  # header flag (1.1): record 0's extra field holds a zstd dictionary

RECORD_FLAG_DICT = 1  # record flag (1.1): the payload was compressed with the pack's dictionary

#: Codec ids stored in record headers (the registry of names lives in the index schema).
CODEC_IDS = {"none": 0, "zstd": 1}
#: Frame kinds stored in record headers.
KIND_IDS = {"image": 0, "video_frame": 1, "blob": 2}
KIND_NAMES = {v: k for k, v in KIND_IDS.items()}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items()}

MAX_NAME_BYTES = 65535
MAX_EXTRA_BYTES = 1 << 20


# The extra field (1.1): a sequence of entries, each u16 tag, u32 length, value. Readers skip
# tags they do not know.
_EXTRA_ENTRY = struct.Struct("<HI")
EXTRA_META = 1  # per-frame metadata: compact JSON object (see man/hframe.5)
EXTRA_ZSTD_DICT = 2  # the pack's zstd dictionary (only in record 0)


def encode_extra(meta: bytes | None = None, zstd_dict: bytes | None = None) -> bytes:
    """The extra field of a record header: the frame's metadata JSON and/or the pack dictionary."""
    parts = []
    for tag, value in ((EXTRA_META, meta), (EXTRA_ZSTD_DICT, zstd_dict)):
        if value:
            parts.append(_EXTRA_ENTRY.pack(tag, len(value)))
            parts.append(value)
    return b"".join(parts)


def decode_extra(extra: bytes | memoryview, where: str = "record") -> dict[int, bytes]:
    """The entries of an extra field, by tag (unknown tags are kept, callers ignore them)."""
    out: dict[int, bytes] = {}
    pos = 0
    while pos < len(extra):
        if pos + _EXTRA_ENTRY.size > len(extra):
            raise FormatError(f"{where}: extra field truncated")
        tag, n = _EXTRA_ENTRY.unpack_from(extra, pos)
        pos += _EXTRA_ENTRY.size
        if pos + n > len(extra):
            raise FormatError(f"{where}: extra field entry {tag} runs past the field")
        out[tag] = bytes(extra[pos : pos + n])
        pos += n
    return out


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def align_up(value: int, alignment: int) -> int:
    """Round ``value`` up to a multiple of ``alignment`` (a power of two, or 1)."""
    return (value + alignment - 1) & ~(alignment - 1)


@dataclass(frozen=True)
class Header:
    """The fixed header at offset 0."""

    uuid: uuid.UUID
    created_us: int
    alignment: int = 1
    version: tuple[int, int] = FORMAT_VERSION
    flags: int = 0

    def encode(self) -> bytes:
        flags = self.flags | (FLAG_ALIGNED if self.alignment > 1 else 0)
        body = _HEADER.pack(
            MAGIC,
            self.version[0],
            self.version[1],
            HEADER_SIZE,
            flags,
            self.alignment,
            self.created_us,
            self.uuid.bytes,
            0,
        )
        return body[:-4] + struct.pack("<I", _crc(body[:-4]))

    @classmethod
    def decode(cls, data: bytes, where: str = "pack") -> Header:
        """Parse and validate a header; ``where`` names the file in error messages."""
        if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
            found = data[:8].hex(" ") if data else "an empty file"
            raise NotAPack(f"{where}: not a frame pack (expected magic {MAGIC.hex(' ')}, found {found})")
        if len(data) < HEADER_SIZE:
            raise IncompletePack(f"{where}: header truncated ({len(data)} of {HEADER_SIZE} bytes)")
        magic, major, minor, size, flags, alignment, created_us, raw_uuid, crc = _HEADER.unpack(data[:HEADER_SIZE])
        if crc != _crc(data[: HEADER_SIZE - 4]):
            raise FormatError(f"{where}: header checksum mismatch (header bytes are corrupt)")
        if major not in SUPPORTED_MAJOR:
            raise UnsupportedVersion(
                f"{where}: format version {major}.{minor} is not supported "
                f"(this hframe reads major version {', '.join(map(str, SUPPORTED_MAJOR))})"
            )
        if size != HEADER_SIZE or alignment < 1 or alignment & (alignment - 1):
            raise FormatError(f"{where}: header fields invalid (size {size}, alignment {alignment})")
        return cls(uuid.UUID(bytes=raw_uuid), created_us, alignment, (major, minor), flags & ~FLAG_ALIGNED)


_RECORD_HEAD = struct.Struct("<4sIQQQ16sqHHIII")  # the fixed part without its CRC
_U32 = struct.Struct("<I")


def encode_record(
    size: int,
    frame_id: int,
    length: int,
    raw_length: int,
    md5: bytes,
    mtime_ns: int,
    codec: int,
    kind: int,
    name: bytes,
    extra: bytes = b"",
    flags: int = 0,
) -> bytes:
    """A complete record header of ``size`` bytes (fixed part, CRC, name, extra, zero padding)."""
    head = _RECORD_HEAD.pack(
        RECORD_MAGIC, size, frame_id, length, raw_length, md5, mtime_ns, codec, kind, len(name), len(extra), flags
    )
    crc = zlib.crc32(name, zlib.crc32(head))
    if extra:
        crc = zlib.crc32(extra, crc)
    pad = size - RECORD_FIXED - len(name) - len(extra)
    return b"".join((head, _U32.pack(crc & 0xFFFFFFFF), name, extra, b"\0" * pad if pad else b""))


def record_header_size(record_offset: int, name_len: int, extra_len: int, alignment: int) -> int:
    """Size of a record header starting at ``record_offset``, padding included."""
    end = record_offset + RECORD_FIXED + name_len + extra_len
    return align_up(end, alignment) - record_offset


@dataclass(frozen=True)
class RecordHeader:
    """The header written before each payload; enough to rebuild the index from the pack."""

    frame_id: int
    length: int
    raw_length: int
    md5: bytes
    mtime_ns: int
    name: bytes
    extra: bytes = b""
    codec: int = 0
    kind: int = 0
    flags: int = 0

    def encode(self, record_offset: int, alignment: int) -> bytes:
        size = record_header_size(record_offset, len(self.name), len(self.extra), alignment)
        return encode_record(
            size,
            self.frame_id,
            self.length,
            self.raw_length,
            self.md5,
            self.mtime_ns,
            self.codec,
            self.kind,
            self.name,
            self.extra,
            self.flags,
        )

    @classmethod
    def decode(cls, fixed: bytes, read_rest: bytes | None, where: str) -> tuple[RecordHeader, int]:
        """Parse a record header.

        Args:
            fixed: the first ``RECORD_FIXED`` bytes of the record.
            read_rest: the name and extra bytes that follow (``name_len + extra_len`` bytes),
                or ``None`` to only parse ``fixed`` and return lengths via the header.
            where: a location for error messages, such as ``"x.hframe: offset 128"``.

        Returns:
            The header and its total size (padding included).
        """
        if len(fixed) < RECORD_FIXED or fixed[:4] != RECORD_MAGIC:
            raise FormatError(f"{where}: no record header (found {fixed[:4].hex(' ') or 'end of file'})")
        (_, size, frame_id, length, raw_length, md5, mtime_ns, codec, kind, name_len, extra_len, flags, crc) = (
            _RECORD.unpack(fixed[:RECORD_FIXED])
        )
        rest = read_rest if read_rest is not None else b""
        if read_rest is not None:
            if len(rest) != name_len + extra_len or crc != _crc(fixed[: RECORD_FIXED - 4] + rest):
                raise FormatError(f"{where}: record header checksum mismatch (record header is corrupt)")
        if size < RECORD_FIXED + name_len + extra_len:
            raise FormatError(f"{where}: record header size {size} is too small")
        problem = record_field_problem(length, raw_length, codec, kind)
        if problem is not None:
            raise FormatError(f"{where}: frame {frame_id}: {problem}")
        header = cls(frame_id, length, raw_length, md5, mtime_ns, rest[:name_len], rest[name_len:], codec, kind, flags)
        return header, size

    @staticmethod
    def name_extra_lengths(fixed: bytes, where: str = "record") -> tuple[int, int]:
        """The (name_len, extra_len) stored in a record's fixed part.

        Raises:
            FormatError: lengths beyond what any writer produces (a damaged header; nothing
                that large is read).
        """
        fields = _RECORD.unpack(fixed[:RECORD_FIXED])
        if fields[9] > MAX_NAME_BYTES or fields[10] > MAX_EXTRA_BYTES:
            raise FormatError(
                f"{where}: record header declares a {fields[9]}-byte name and {fields[10]}-byte extra field"
            )
        return fields[9], fields[10]


@dataclass(frozen=True)
class Trailer:
    """The fixed trailer at the end of a complete pack."""

    frame_count: int
    payload_bytes: int
    data_end: int
    uuid: uuid.UUID
    version: tuple[int, int] = FORMAT_VERSION
    flags: int = 0

    def encode(self) -> bytes:
        body = _TRAILER.pack(
            TRAILER_MAGIC,
            self.version[0],
            self.version[1],
            TRAILER_SIZE,
            self.frame_count,
            self.payload_bytes,
            self.data_end,
            self.uuid.bytes,
            self.flags,
            0,
        )
        return body[:-4] + struct.pack("<I", _crc(body[:-4]))

    @classmethod
    def parse(cls, data: bytes, where: str = "pack") -> Trailer:
        """Parse trailer bytes, checking magic, size and checksum only (not where they sit)."""
        if len(data) != TRAILER_SIZE or data[:8] != TRAILER_MAGIC:
            raise IncompletePack(f"{where}: incomplete pack: no trailer")
        magic, major, minor, size, count, payload, data_end, raw_uuid, flags, crc = _TRAILER.unpack(data)
        if crc != _crc(data[:-4]) or size != TRAILER_SIZE:
            raise IncompletePack(f"{where}: incomplete pack: trailer checksum mismatch (trailer bytes are corrupt)")
        return cls(count, payload, data_end, uuid.UUID(bytes=raw_uuid), (major, minor), flags)

    @classmethod
    def decode(cls, data: bytes, file_size: int, header: Header | None, where: str = "pack") -> Trailer:
        """Parse the last ``TRAILER_SIZE`` bytes of a pack and check them against its header."""
        if file_size < HEADER_SIZE + TRAILER_SIZE or len(data) != TRAILER_SIZE or data[:8] != TRAILER_MAGIC:
            raise IncompletePack(
                f"{where}: incomplete pack: no trailer (truncated, or still being written; {file_size} bytes)"
            )
        trailer = cls.parse(data, where)
        if trailer.data_end != file_size - TRAILER_SIZE:
            raise IncompletePack(
                f"{where}: incomplete pack: trailer says data ends at {trailer.data_end}, "
                f"file has {file_size - TRAILER_SIZE} bytes before the trailer"
            )
        if header is not None:
            if trailer.uuid != header.uuid:
                raise FormatError(f"{where}: trailer UUID {trailer.uuid} differs from header {header.uuid}")
            if trailer.version != header.version:
                raise FormatError(
                    f"{where}: trailer version {trailer.version[0]}.{trailer.version[1]} differs from header"
                )
        return trailer


def record_fields(buf: bytes | memoryview | mmap.mmap, pos: int) -> tuple[Any, ...]:
    """The raw fixed fields of the record header at ``buf[pos:]`` (no validation).

    Returns (magic, header_size, frame_id, length, raw_length, md5, mtime_ns, codec, kind,
    name_len, extra_len, flags, crc), as packed by ``RecordHeader.encode``.
    """
    return _RECORD.unpack_from(buf, pos)


def record_field_problem(length: int, raw_length: int, codec: int, kind: int) -> str | None:
    """What no writer of this format produces in a record's lengths, codec or kind (a crafted or
    damaged record whose CRC still matches), or None. Lengths are signed 64-bit in the index."""
    if length >= 1 << 63:
        return f"length {length} is beyond any pack"
    if raw_length >= 1 << 63:
        return f"raw length {raw_length} is beyond any frame"
    if codec not in CODEC_NAMES:
        return f"codec {codec} is not one this hframe knows ({', '.join(f'{v} {k}' for k, v in CODEC_IDS.items())})"
    if kind not in KIND_NAMES:
        return f"kind {kind} is not one this hframe knows ({', '.join(f'{v} {k}' for k, v in KIND_IDS.items())})"
    return None


def record_crc(buf: bytes | memoryview | mmap.mmap, pos: int, name_len: int, extra_len: int) -> int:
    """CRC-32 over a record header's checked bytes (fixed part without the CRC, name, extra)."""
    crc = zlib.crc32(buf[pos : pos + RECORD_FIXED - 4])
    return zlib.crc32(buf[pos + RECORD_FIXED : pos + RECORD_FIXED + name_len + extra_len], crc) & 0xFFFFFFFF


#: Media types sniffed from magic bytes, in the order they are tried.
MEDIA_TYPES = ("jpeg", "png", "gif", "webp", "bmp", "tiff", "unknown")

_SIGNATURES: tuple[tuple[str, bytes], ...] = (
    ("jpeg", b"\xff\xd8\xff"),
    ("png", b"\x89PNG\r\n\x1a\n"),
    ("gif", b"GIF87a"),
    ("gif", b"GIF89a"),
    ("bmp", b"BM"),
    ("tiff", b"II*\x00"),
    ("tiff", b"MM\x00*"),
)

SNIFF_BYTES = 18

#: The DIB header sizes a BMP can have (byte 14, little-endian): core (12), OS/2 2.x (16, 64),
#: info (40), the v2/v3 extensions (52, 56), v4 (108), v5 (124). "BM" alone is two bytes, which
#: one random blob in 65,536 starts with (and text such as "BMW ..."): such a blob is not a BMP.
_BMP_DIB_SIZES = frozenset({12, 16, 40, 52, 56, 64, 108, 124})


def sniff_media_type(head: bytes | memoryview) -> str:
    """Name the media type of a frame from its first bytes (``SNIFF_BYTES`` suffice)."""
    if not head:
        return "unknown"
    first = head[0]
    if first == 0xFF:
        return "jpeg" if head[:3] == b"\xff\xd8\xff" else "unknown"
    if first == 0x89:
        return "png" if head[:8] == b"\x89PNG\r\n\x1a\n" else "unknown"
    if first == 0x47:  # G
        return "gif" if head[:6] in (b"GIF87a", b"GIF89a") else "unknown"
    if first == 0x42:  # B
        bmp = head[:2] == b"BM" and len(head) >= 18 and int.from_bytes(head[14:18], "little") in _BMP_DIB_SIZES
        return "bmp" if bmp else "unknown"
    if first in (0x49, 0x4D):  # I, M
        return "tiff" if head[:4] in (b"II*\x00", b"MM\x00*") else "unknown"
    if first == 0x52:  # R
        return "webp" if head[:4] == b"RIFF" and head[8:12] == b"WEBP" else "unknown"
    return "unknown"


def expected_magic(media_type: str) -> bytes | None:
    """The leading bytes every frame of ``media_type`` starts with (None when unknown)."""
    for name, sig in _SIGNATURES:
        if name == media_type:
            return sig[:3] if name == "gif" else sig
    return b"RIFF" if media_type == "webp" else None
