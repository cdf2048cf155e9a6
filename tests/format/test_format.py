"""The byte layout: header, record header and trailer encode/decode, and magic sniffing."""

from __future__ import annotations

import struct
import uuid

import pytest

from hframe_cli.errors import FormatError, IncompletePack, NotAPack, UnsupportedVersion
from hframe_cli.format.layout import (
    HEADER_SIZE,
    MAGIC,
    RECORD_FIXED,
    TRAILER_SIZE,
    Header,
    RecordHeader,
    Trailer,
    record_header_size,
    sniff_media_type,
)

U = uuid.UUID("12345678-1234-5678-1234-567812345678")


def test_header_round_trip_has_fixed_size_and_magic_first():
    raw = Header(U, 1_700_000_000_000_000, alignment=4096).encode()
    assert len(raw) == HEADER_SIZE == 128
    assert raw.startswith(MAGIC)
    h = Header.decode(raw)
    assert (h.uuid, h.created_us, h.alignment, h.version) == (U, 1_700_000_000_000_000, 4096, (1, 0))


def test_header_layout_is_little_endian_at_documented_offsets():
    raw = Header(U, 0x0102030405060708, alignment=512).encode()
    major, minor, size, flags, alignment = struct.unpack_from("<HHIII", raw, 8)
    assert (major, minor, size, flags, alignment) == (1, 0, 128, 1, 512)
    assert struct.unpack_from("<q", raw, 24)[0] == 0x0102030405060708
    assert raw[32:48] == U.bytes


def test_not_a_pack_names_what_was_found():
    with pytest.raises(NotAPack, match=r"x\.jpg: not a frame pack .*found ff d8 ff e0"):
        Header.decode(b"\xff\xd8\xff\xe0" + b"\0" * 200, "x.jpg")
    with pytest.raises(NotAPack, match="an empty file"):
        Header.decode(b"", "empty")


def test_newer_major_version_is_refused_naming_both():
    raw = bytearray(Header(U, 0, version=(2, 0)).encode())
    with pytest.raises(UnsupportedVersion, match=r"format version 2\.0 is not supported .*major version 1"):
        Header.decode(bytes(raw))


def test_header_checksum_catches_any_flipped_byte():
    good = Header(U, 123).encode()
    for pos in range(8, HEADER_SIZE):
        bad = bytearray(good)
        bad[pos] ^= 0x40
        with pytest.raises(FormatError):
            Header.decode(bytes(bad))


def test_record_header_pads_payload_to_alignment():
    rec = RecordHeader(7, 10, 10, b"\x01" * 16, 99, b"a/b.jpg")
    for start, align in ((128, 1), (128, 4096), (5000, 512)):
        raw = rec.encode(start, align)
        assert len(raw) == record_header_size(start, len(b"a/b.jpg"), 0, align)
        assert (start + len(raw)) % align == 0
        parsed, size = RecordHeader.decode(raw[:RECORD_FIXED], raw[RECORD_FIXED : RECORD_FIXED + 7], "t")
        assert parsed == rec and size == len(raw)


def test_record_header_crc_detects_corrupt_name():
    raw = bytearray(RecordHeader(0, 1, 1, b"\0" * 16, 0, b"name").encode(128, 1))
    raw[RECORD_FIXED] ^= 1
    with pytest.raises(FormatError, match="record header checksum mismatch"):
        RecordHeader.decode(bytes(raw[:RECORD_FIXED]), bytes(raw[RECORD_FIXED : RECORD_FIXED + 4]), "t")


def test_trailer_must_sit_at_the_end_and_match_the_header():
    h = Header(U, 0)
    t = Trailer(3, 300, 1000, U).encode()
    assert len(t) == TRAILER_SIZE
    assert Trailer.decode(t, 1000 + TRAILER_SIZE, h).frame_count == 3
    with pytest.raises(IncompletePack, match="trailer says data ends at 1000"):
        Trailer.decode(t, 1001 + TRAILER_SIZE, h)
    with pytest.raises(IncompletePack, match="no trailer"):
        Trailer.decode(b"\0" * TRAILER_SIZE, 2000, h)
    with pytest.raises(FormatError, match="differs from header"):
        Trailer.decode(t, 1000 + TRAILER_SIZE, Header(uuid.uuid4(), 0))


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"\xff\xd8\xff\xe0\0\x10JFIF", "jpeg"),
        (b"\x89PNG\r\n\x1a\n\0\0\0\r", "png"),
        (b"GIF89a\x01\0", "gif"),
        (b"RIFF\x10\0\0\0WEBPVP8 ", "webp"),
        (b"BM\x36\0\0\0\0\0\0\0\x36\0\0\0\x28\0\0\0", "bmp"),  # info header (40)
        (b"BM\x1a\0\0\0\0\0\0\0\x1a\0\0\0\x0c\0\0\0", "bmp"),  # core header (12)
        (b"BM\x8a\0\0\0\0\0\0\0\x8a\0\0\0\x7c\0\0\0", "bmp"),  # v5 header (124)
        (b"BM\x36\0\0\0\0\0\0\0\x36\0\0\0\x29\0\0\0", "unknown"),  # no such DIB header size
        (b"BMW 320i, 1987, blue: 18 bytes+", "unknown"),  # text that starts with BM
        (b"BM\x36\0\0\0\0\0\0\0\x36\0\0\0\x28", "unknown"),  # too short to hold the header size
        (b"II*\0\x08\0", "tiff"),
        (b"MM\0*\0\0", "tiff"),
        (b"\x00\x01\x02", "unknown"),
        (b"", "unknown"),
    ],
)
def test_sniff_media_type(head, kind):
    assert sniff_media_type(head) == kind
