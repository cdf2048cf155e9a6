"""``hframe sheet``: a contact sheet, a grid of frames with a caption under each.

The frames are chosen as ``get`` chooses them (ids or names, ``--match``/``--label``/``--split``/
``--kind``), or as a seeded random sample of them; they are shown in frame id order, which puts a
clip's frames in time order (a video's frames are packed in order). Each is read through the
reader (a pack, a dataset, a remote pack: its node cache too), decoded to a thumbnail on a few
threads (Pillow's draft mode for JPEGs: a thumbnail needs an eighth of the pixels, and decoding
releases the GIL) and pasted centred in its tile. Under it: its id and label, its name, and its
size (``W x H``) or, for a video frame, its time in the clip.

A frame that cannot be decoded is a tile marked in red with the reason; a frame that is not an
image (a blob) is a grey tile saying what it is. Neither stops the sheet. ``Sheet.tiles`` says
where each frame's thumbnail is in the image (``--json``), so a test (or a tool) can find it.
"""

from __future__ import annotations

import io
import math
import os
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from PIL import Image, ImageDraw, ImageFont

from ..durable import write_atomically
from ..errors import InputError, NotFound
from ..format.index import describe_filters, select_rows
from ..format.layout import MEDIA_TYPES
from ..processes import usable_cpus
from ..read.dataset import open_pack

__all__ = [
    "DEFAULT_SAMPLE",
    "FORMATS",
    "MAX_FRAMES",
    "Sheet",
    "Tile",
    "contact_sheet",
    "image_format",
    "save",
    "thumbnail",
]

#: frames on a sheet when none are chosen: a seeded sample of this many
DEFAULT_SAMPLE = 64
#: the most frames one sheet shows (a 4096-frame sheet of 192 px tiles is ~100 megapixels)
MAX_FRAMES = 4096
#: image formats a sheet is written in, by the output's extension
FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP"}

#: the index's media types of images (a frame of another that does not decode is no damage)
IMAGE_TYPES = frozenset(t for t in MEDIA_TYPES if t != "unknown")

_BACKGROUND = (24, 24, 24)
_TILE = (40, 40, 40)
_TEXT = (230, 230, 230)
_DIM = (150, 150, 150)
_BAD = (200, 40, 40)
_PLACEHOLDER = (70, 70, 70)
_PAD = 6
_LINES = 3


@dataclass
class Tile:
    """One frame on the sheet: where its tile is, where its thumbnail went (``thumb``: x, y,
    width, height; None when it could not be decoded or is no image), and what it says."""

    frame_id: int
    name: str
    box: tuple[int, int, int, int]
    thumb: tuple[int, int, int, int] | None
    caption: list[str]
    problem: str | None = None  # why no thumbnail (cannot decode: ...; not an image: ...)


@dataclass
class Sheet:
    """What ``contact_sheet`` drew: the image, its tiles in order, and the layout."""

    image: Image.Image
    tiles: list[Tile] = field(default_factory=list)
    columns: int = 0
    tile_size: int = 0
    selected: int = 0  # frames the selection chose (before a sample)

    def describe(self) -> dict[str, Any]:
        return {
            "width": self.image.width,
            "height": self.image.height,
            "columns": self.columns,
            "tile_size": self.tile_size,
            "frames": len(self.tiles),
            "selected": self.selected,
            "undecodable": sum(t.problem is not None and t.problem.startswith("cannot decode") for t in self.tiles),
            "tiles": [asdict(t) for t in self.tiles],
        }


def thumbnail(data: bytes, size: int) -> Image.Image:
    """The frame's image scaled to fit ``size`` x ``size`` (aspect kept), in RGB: Pillow's draft
    mode first (a JPEG decoded at 1/2, 1/4 or 1/8 scale where that is still large enough), then
    ``Image.thumbnail``. Raises what Pillow raises for bytes it cannot decode."""
    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (size, size))
        if getattr(im, "n_frames", 1) > 1:
            im.seek(0)  # (an animated GIF or a multi-page TIFF: its first frame)
        im.load()
        # (a palette with a transparent colour goes through RGBA: the same pixels, no warning)
        rgb = (im.convert("RGBA") if im.mode == "P" else im).convert("RGB")
    rgb.thumbnail((size, size))
    return rgb


def _choose(reader: Any, keys: Sequence[int | str], match: str | None, equal: dict[str, str | None]) -> list[int]:
    """Frame ids of ``keys``, or of the rows the filters select (all rows when none)."""
    if keys:
        return [reader.frame_id(k) for k in keys]
    rows = select_rows(reader.table, ["frame_id"], match, equal)
    ids: list[int] = rows.column("frame_id").to_pylist()
    if not ids:
        raise NotFound(f"{reader.shown}: no frame matches {describe_filters(match, equal)}")
    return ids


def _caption(row: dict[str, Any], width: int, font: Any) -> list[str]:
    """Three lines: ``#id label``, the name (its end, where it is too long), the size or time."""
    first = f"#{row['frame_id']}" + (f"  {row['label']}" if row.get("label") else "")
    if row.get("pts_s") is not None:
        third = f"t={row['pts_s']:.3f} s" + (
            f"  frame {row['frame_index']}" if row.get("frame_index") is not None else ""
        )
    elif row.get("width"):
        third = f"{row['width']} x {row['height']}"
    else:
        third = f"{row['media_type']}, {row['length']} bytes"
    return [_fit(first, width, font), _fit(row["name"], width, font, keep_end=True), _fit(third, width, font)]


def _fit(text: str, width: int, font: Any, keep_end: bool = False) -> str:
    """``text`` cut (with an ellipsis) to fit ``width`` pixels."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength("…" + text if keep_end else text + "…") > width:
        text = text[1:] if keep_end else text[:-1]
    return "…" + text if keep_end else text + "…"


def _font(size: int) -> Any:
    try:
        return ImageFont.load_default(size=size)  # (FreeType: a scalable font; Pillow >= 10.1)
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()


def contact_sheet(
    pack: str | os.PathLike[str],
    keys: Sequence[int | str] = (),
    *,
    match: str | None = None,
    equal: dict[str, str | None] | None = None,
    sample: int | None = None,
    seed: int = 0,
    columns: int = 8,
    tile_size: int = 192,
    workers: int | None = None,
) -> Sheet:
    """Draw the frames of ``pack`` chosen by ``keys`` or the filters (all when neither), or a
    seeded random ``sample`` of those (``DEFAULT_SAMPLE`` when nothing is chosen), in frame id
    order, ``columns`` to a row, each thumbnail in a ``tile_size`` square.

    Raises:
        InputError: frames and filters together, a sample below 1, a layout out of range, more
            than ``MAX_FRAMES`` frames.
        NotFound: no such frame, or none the filters select.
    """
    equal = equal or {}
    filtered = bool(match or any(equal.values()))
    if keys and filtered:
        raise InputError("--match/--label/--split/--kind select frames: give them without a FRAME")
    if sample is not None and sample < 1:
        raise InputError("--sample must be at least 1")
    if not 1 <= columns <= 64:
        raise InputError(f"--columns {columns}: give 1 to 64")
    if not 32 <= tile_size <= 1024:
        raise InputError(f"--tile {tile_size}: give 32 to 1024 (pixels)")
    if not keys and not filtered and sample is None:
        sample = DEFAULT_SAMPLE
    with open_pack(pack) as reader:
        chosen = _choose(reader, keys, match, equal)
        selected = len(chosen)
        if sample is not None and sample < len(chosen):
            chosen = random.Random(seed).sample(chosen, sample)
        if not keys:
            chosen.sort()  # (a clip's frames in time order)
        if len(chosen) > MAX_FRAMES:
            raise InputError(f"{len(chosen)} frames: a sheet shows at most {MAX_FRAMES} (use --sample N)")
        columns_wanted = [
            "frame_id",
            "name",
            "label",
            "width",
            "height",
            "pts_s",
            "frame_index",
            "media_type",
            "length",
        ]
        table = reader.table
        present = [c for c in columns_wanted if c in table.column_names]
        picked = table.select(present).take(chosen).to_pylist()
        datas = reader.read_many(chosen)
    return _draw(picked, datas, columns, tile_size, workers, selected)


def _draw(
    rows: list[dict[str, Any]], datas: list[bytes], columns: int, size: int, workers: int | None, selected: int
) -> Sheet:
    font_px = max(10, min(16, size // 12))
    font = _font(font_px)
    line = font_px + 3
    cols = min(columns, len(rows))
    tile_w, tile_h = size + 2 * _PAD, size + 2 * _PAD + _LINES * line
    grid_rows = math.ceil(len(rows) / cols)
    sheet = Image.new("RGB", (cols * tile_w + _PAD, grid_rows * tile_h + _PAD), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)

    def decode(k: int) -> Image.Image | str:
        row, data = rows[k], datas[k]
        try:  # (a frame the index does not call an image may still be one: sniffing is cautious)
            return thumbnail(data, size)
        except Exception as e:  # (Pillow raises many kinds for damaged bytes)
            if row.get("media_type") not in IMAGE_TYPES:
                return f"not an image: {row.get('media_type')}, {len(data)} bytes"
            return f"cannot decode: {' '.join(str(e).split()) or type(e).__name__}"

    n = len(rows)
    with ThreadPoolExecutor(max_workers=workers or min(8, usable_cpus() + 1)) as pool:
        thumbs = list(pool.map(decode, range(n)))
    tiles = []
    for k, (row, thumb) in enumerate(zip(rows, thumbs)):
        x, y = _PAD + (k % cols) * tile_w, _PAD + (k // cols) * tile_h
        draw.rectangle((x, y, x + tile_w - _PAD - 1, y + size + _PAD - 1), fill=_TILE)
        caption = _caption(row, size, font)
        placed = None
        problem = None
        if isinstance(thumb, Image.Image):
            tx = x + (size - thumb.width) // 2 + _PAD // 2
            ty = y + (size - thumb.height) // 2 + _PAD // 2
            sheet.paste(thumb, (tx, ty))
            placed = (tx, ty, thumb.width, thumb.height)
        else:
            problem = thumb
            bad = problem.startswith("cannot decode")
            fill = _BAD if bad else _PLACEHOLDER
            box = (x + _PAD // 2, y + _PAD // 2, x + _PAD // 2 + size - 1, y + _PAD // 2 + size - 1)
            draw.rectangle(box, fill=fill)
            if bad:  # a cross: damaged, whatever the words say
                draw.line((box[0], box[1], box[2], box[3]), fill=_TEXT, width=3)
                draw.line((box[0], box[3], box[2], box[1]), fill=_TEXT, width=3)
            words = _wrap(problem, size - 8, font)
            for i, text in enumerate(words[:6]):
                draw.text((box[0] + 4, box[1] + 4 + i * line), text, fill=_TEXT, font=font)
        for i, text in enumerate(caption):
            draw.text((x + _PAD // 2, y + size + _PAD + i * line), text, fill=_TEXT if i == 0 else _DIM, font=font)
        tiles.append(Tile(row["frame_id"], row["name"], (x, y, tile_w - _PAD, tile_h - _PAD), placed, caption, problem))
    return Sheet(sheet, tiles, cols, size, selected)


def _wrap(text: str, width: int, font: Any) -> list[str]:
    lines: list[str] = []
    current = ""
    for word in text.split():
        candidate = f"{current} {word}".strip()
        if font.getlength(candidate) <= width or not current:
            current = _fit(candidate, width, font)
        else:
            lines.append(current)
            current = _fit(word, width, font)
    if current:
        lines.append(current)
    return lines


def image_format(output: str) -> str:
    """The format to write ``output`` in, from its extension (``-``: PNG).

    Raises:
        InputError: an extension that is none of ``FORMATS``.
    """
    if output == "-":
        return "PNG"
    ext = os.path.splitext(output)[1].lower()
    if ext not in FORMATS:
        raise InputError(f"{output}: write a sheet as {', '.join(FORMATS)} (or - for PNG on stdout)")
    return FORMATS[ext]


def save(sheet: Sheet, output: str, stdout: BinaryIO | None) -> None:
    """Write the sheet to ``output`` in the format its extension names (JPEG at quality 90),
    whole or not at all; ``-``: PNG on ``stdout`` (None: a terminal, refused)."""
    fmt = image_format(output)
    buf = io.BytesIO()
    sheet.image.save(buf, fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))
    if output != "-":
        try:
            write_atomically(output, buf.getvalue(), durable=False)
        except OSError as e:
            raise InputError(f"{output}: cannot write the sheet ({e.strerror or e})") from None
    elif stdout is None:
        raise InputError("refusing to write an image to a terminal; redirect stdout or use -o FILE")
    else:
        stdout.write(buf.getvalue())
        stdout.flush()
