"""Width, height and mode of an image from its header, without decoding pixels.

JPEG (the SOF segment) and PNG (the IHDR chunk) are read here directly: they are most of what
gets packed, and Pillow's Python-level header parsing costs ~50-80 µs per image, enough to
slow packing of small JPEGs by a third. Anything else, or anything these parsers are not sure
about, goes to Pillow (``Image.open``, which also reads only the header), so the answers are
Pillow's modes in every case (``tests/sources/test_media.py`` compares them).

Imports inside functions: Pillow, only when a header must be decoded (start-up of listing).
"""

from __future__ import annotations

import io
import re
import struct

__all__ = ["MAX_SIDE", "image_info"]

#: the longest side an image header may give (PNG's own limit, 2^31 - 1; the index's width and
#: height are int32): a header beyond it is not an image hframe describes
MAX_SIDE = (1 << 31) - 1

_U16 = struct.Struct(">H")
_IHDR = struct.Struct(">IIBB")
# SOF markers: baseline, extended, progressive, lossless, and their arithmetic-coded forms
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
# PNG (color type, bit depth) -> Pillow mode, for the combinations whose mode is unambiguous
_PNG_MODES = {
    (0, 1): "1",
    (0, 2): "L",
    (0, 4): "L",
    (0, 8): "L",
    (2, 8): "RGB",
    (3, 1): "P",
    (3, 2): "P",
    (3, 4): "P",
    (3, 8): "P",
    (4, 8): "LA",
    (6, 8): "RGBA",
}


def image_info(data: bytes, media_type: str = "") -> tuple[int, int, str]:
    """(width, height, mode) of the image in ``data``.

    Raises:
        ValueError: the header cannot be parsed (the message says why).
    """
    fast = _jpeg(data) if media_type == "jpeg" else _png(data) if media_type == "png" else None
    width, height, mode = fast if fast is not None else _pillow(data)
    if not 0 < width <= MAX_SIDE or not 0 < height <= MAX_SIDE:
        raise ValueError(f"image size {width}x{height}: a side beyond 1..{MAX_SIDE} pixels")
    return width, height, mode


def _pillow(data: bytes) -> tuple[int, int, str]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return int(img.width), int(img.height), str(img.mode)
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for bad headers
        raise ValueError(pillow_message(e)) from None


def pillow_message(e: Exception) -> str:
    """A Pillow exception as one line, without the in-memory file's ``<_io.BytesIO object at
    0x...>`` (it names nothing and changes every run; the caller names the file or frame)."""
    text = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e))
    return f"{type(e).__name__}: {text}"


def _png(data: bytes) -> tuple[int, int, str] | None:
    """The IHDR chunk right after the signature; None when unsure (Pillow decides)."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, color = _IHDR.unpack_from(data, 16)
    mode = _PNG_MODES.get((color, depth))
    if mode is None or not width or not height:
        return None
    return width, height, mode


def _jpeg(data: bytes) -> tuple[int, int, str] | None:
    """Walk the marker segments to the first SOF; None when unsure (Pillow decides)."""
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # TEM, RSTn: no length
            pos += 2
            continue
        (length,) = _U16.unpack_from(data, pos + 2)
        if length < 2:
            return None
        if marker in _SOF:
            if pos + 10 > n:
                return None
            height, width = struct.unpack_from(">HH", data, pos + 5)
            mode = _JPEG_MODES.get(data[pos + 9])
            if mode is None or not width or not height:
                return None
            return width, height, mode
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any SOF
            return None
        pos += 2 + length
    return None
