"""The Parquet index: its schema, metadata keys, file naming, building, reading and writing.

This module is the one place that knows the index columns (``man/hframe.5`` documents them).
Rows are accumulated in compact typed arrays (``IndexBuilder``), never as one Python
object per frame, so memory grows by tens of bytes per frame, not kilobytes.

Imports inside functions: ``pyarrow.compute``, only where a column is computed (readers that
never filter skip it).
"""

from __future__ import annotations

import binascii
import hashlib
import math
import os
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import accumulate
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import FormatError, IndexMismatch, InputError, NotFound, UnsupportedVersion
from ..locations import with_suffix
from ..names import INDEX_SUFFIX
from .labels import parent_label
from .layout import CODEC_NAMES, FORMAT_VERSION, KIND_IDS, KIND_NAMES, MEDIA_TYPES

__all__ = [
    "INDEX_SCHEMA",
    "INDEX_SCHEMA_VERSION",
    "INDEX_SUFFIX",
    "SCHEMA",
    "IndexBuilder",
    "IndexMeta",
    "get_index_path",
    "int64_column",
    "index_location",
    "read_index",
    "read_index_meta",
    "write_index",
]

#: (major, minor) of the index schema; readers refuse a newer major.
INDEX_SCHEMA_VERSION = (1, 1)  # 1.1 added the mode column
INDEX_SCHEMA = f"{INDEX_SCHEMA_VERSION[0]}.{INDEX_SCHEMA_VERSION[1]}"
ROW_GROUP_SIZE = 1 << 20

SCHEMA = pa.schema(
    [
        pa.field("frame_id", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("name_raw", pa.binary()),  # exact bytes, only where name is not valid UTF-8
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("md5", pa.string(), nullable=False),
        pa.field("media_type", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("codec", pa.string(), nullable=False),
        pa.field("raw_length", pa.int64(), nullable=False),
        pa.field("source_size", pa.int64(), nullable=False),
        pa.field("source_mtime", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("label", pa.string()),
        pa.field("split", pa.string()),
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        pa.field("source", pa.string()),
        pa.field("frame_index", pa.int64()),
        pa.field("pts_s", pa.float64()),
        pa.field("keyframe", pa.bool_()),
        pa.field("record_offset", pa.int64(), nullable=False),
        pa.field("mode", pa.string()),  # 1.1
    ]
)
#: Columns added by a minor version: an older index reads them as nulls.
ADDED_COLUMNS = {"mode": (1, 1)}
COLUMNS = tuple(SCHEMA.names)

_META_PREFIX = "hframe."


def get_index_path(pack_path: str | os.PathLike[str]) -> Path:
    """The index file that belongs to a pack: ``<pack>.index.parquet``."""
    return Path(os.fspath(pack_path) + INDEX_SUFFIX)


def index_location(pack: str | os.PathLike[str]) -> str:
    """``get_index_path`` as a string, right for URLs too (a ``Path`` would fold ``//``; the
    suffix goes on the URL's path, before any ``?query``)."""
    return with_suffix(pack, INDEX_SUFFIX)


def format_time_us(created_us: int) -> str:
    """ISO 8601 UTC with microseconds, as stored in ``hframe.pack_time``."""
    try:
        dt = datetime.fromtimestamp(created_us / 1_000_000, tz=timezone.utc)
    except (OverflowError, ValueError, OSError):  # a year beyond 1..9999: a crafted or damaged header
        return f"out of range ({created_us} us since 1970)"
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class IndexMeta:
    """The index-level metadata stored in the Parquet schema metadata."""

    format_version: str
    index_schema_version: str
    pack_uuid: str
    pack_time: str
    frame_count: int
    pack_bytes: int
    payload_bytes: int
    alignment: int
    hframe_version: str

    def to_metadata(self) -> dict[bytes, bytes]:
        return {(_META_PREFIX + k).encode(): str(v).encode() for k, v in self.__dict__.items()}

    @classmethod
    def from_metadata(cls, md: dict[bytes, bytes] | None, where: str) -> IndexMeta:
        md = md or {}
        values: dict[str, Any] = {}
        for key in cls.__dataclass_fields__:
            raw = md.get((_META_PREFIX + key).encode())
            if raw is None:
                raise FormatError(f"{where}: not an hframe index (metadata key {_META_PREFIX}{key} missing)")
            try:
                values[key] = raw.decode()
            except UnicodeDecodeError:
                raise FormatError(f"{where}: index metadata {_META_PREFIX}{key} is not text (damaged)") from None
        try:
            major = int(values["index_schema_version"].split(".")[0])
            for key in ("frame_count", "pack_bytes", "payload_bytes", "alignment"):
                values[key] = int(values[key])
        except ValueError:
            raise FormatError(f"{where}: index metadata holds a value that is not a number (damaged)") from None
        if major != INDEX_SCHEMA_VERSION[0]:
            raise UnsupportedVersion(
                f"{where}: index schema version {values['index_schema_version']} is not supported "
                f"(this hframe reads {INDEX_SCHEMA_VERSION[0]}.x)"
            )
        return cls(**values)

    def check_pack(self, pack_uuid: str, pack_bytes: int, frame_count: int, where: str) -> None:
        """Refuse an index that describes another pack, naming the field that differs."""
        for field, mine, theirs in (
            ("pack UUID", self.pack_uuid, pack_uuid),
            ("pack size", self.pack_bytes, pack_bytes),
            ("frame count", self.frame_count, frame_count),
        ):
            if mine != theirs:
                raise IndexMismatch(
                    f"{where}: index does not belong to this pack ({field}: index {mine}, pack {theirs}); "
                    "rebuild it with 'hframe index PACK --rebuild'"
                )


def display_name(name: bytes) -> str:
    """The ``name`` column value: UTF-8 text; invalid bytes shown as ``\\xNN``."""
    return name.decode("utf-8", "backslashreplace")


_MEDIA_CODE = {m: i for i, m in enumerate(MEDIA_TYPES)}
_UNKNOWN, _BLOB = _MEDIA_CODE["unknown"], KIND_IDS["blob"]
#: The compiled packing loop's media codes (blob, JPEG, PNG: ``write.compiled.MEDIA``) as this
#: index's media type and kind codes, and its image modes (``write.compiled.MODES``).
COMPILED_MEDIA = ("unknown", "jpeg", "png")
COMPILED_MODES = ("", "L", "RGB", "CMYK", "1", "P", "LA", "RGBA")
_COMPILED_MEDIA = bytes(_MEDIA_CODE[m] for m in COMPILED_MEDIA).ljust(256, b"\xff")
_COMPILED_KINDS = bytes(KIND_IDS["blob" if m == "unknown" else "image"] for m in COMPILED_MEDIA).ljust(256, b"\xff")


class IndexBuilder:
    """Accumulates index rows in typed arrays and turns them into an Arrow table."""

    def __init__(self) -> None:
        self._name_data = bytearray()
        self._name_offsets = array("q", [0])
        self._invalid_names: dict[int, bytes] = {}
        self._ints = {
            k: array("q") for k in ("offset", "length", "raw_length", "source_size", "mtime_us", "record_offset")
        }
        self._md5 = bytearray()
        self._codes = {k: array("b") for k in ("media_type", "kind", "codec")}
        self._int_columns = tuple(self._ints.values())  # the same arrays, for append
        self._code_columns = tuple(self._codes.values())
        self._labels: dict[bytes, int] = {}
        self._label_idx = array("i")
        # per-frame metadata (images, video frames, labels, splits): filled only when some frame
        # has any, with -1 / NaN for null
        self._meta_rows = 0
        self._meta: _MetaColumns | None = None
        self._released = False

    def __len__(self) -> int:
        return len(self._label_idx)

    def append(
        self,
        *,
        name: bytes,
        offset: int,
        length: int,
        md5: bytes,
        media_type: str,
        kind: int,
        codec: int,
        raw_length: int,
        source_size: int,
        mtime_ns: int,
        record_offset: int,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Add the row for the next frame (its frame id is the current length).

        ``meta`` holds the frame's metadata as stored in its record header (``FRAME_META_KEYS``);
        a ``label`` key, even None, overrides the parent-folder label.
        """
        if meta and "media_type" in meta and meta["media_type"] in MEDIA_TYPES:
            media_type = meta["media_type"]  # a compressed frame's type, sniffed before compression
        media_code = _MEDIA_CODE.get(media_type)
        if media_code is None or kind not in KIND_NAMES:  # before any column grows
            raise ValueError(
                f"{name.decode('utf-8', 'backslashreplace')}: media type {media_type!r} or kind {kind!r} is not one of "
                f"{', '.join(MEDIA_TYPES)} / {', '.join(map(str, KIND_NAMES))}"
            )
        row = len(self)
        if meta and "source_size" in meta:
            source_size = meta["source_size"]
        if meta and "label" in meta:
            value = meta["label"]
            label = None if value is None else str(value).encode()
        else:
            label = parent_label(name)
        self._add_row(
            name, offset, length, md5, media_code, kind, codec, raw_length, source_size, mtime_ns, record_offset, label
        )
        if meta:
            if self._meta is None:
                self._meta = _MetaColumns()
            self._meta.fill(row)
            self._meta.add(meta)
            self._meta_rows = row + 1

    def append_blob(
        self,
        name: bytes,
        offset: int,
        length: int,
        md5: bytes,
        mtime_ns: int,
        record_offset: int,
        source: str | None = None,
    ) -> None:
        """``append`` for a frame stored as it is with nothing to record but, maybe, its
        ``source``: an unknown media type (a blob), no compression, labelled by its parent
        folder (a pack of small files spends its time here, and keyword arguments cost)."""
        row = len(self)
        self._add_row(
            name, offset, length, md5, _UNKNOWN, _BLOB, 0, length, length, mtime_ns, record_offset, parent_label(name)
        )
        if source is not None:
            if self._meta is None:
                self._meta = _MetaColumns()
            self._meta.fill(row)
            self._meta.add_source(source)
            self._meta_rows = row + 1

    def extend_frames(
        self,
        names: list[bytes],
        offsets: array[int],
        lengths: array[int],
        md5s: bytes,
        mtimes_ns: list[int],
        record_offsets: array[int],
        media: bytes,
        widths: bytes,
        heights: bytes,
        modes: bytes,
    ) -> None:
        """The rows of a run of frames at once, their columns given whole: what ``append_blob``
        makes for a blob (``media`` code 0) and ``append`` for a JPEG or PNG image (1, 2) with
        its width, height and mode (``modes``: codes of ``COMPILED_MODES``) as its only metadata (the
        compiled loop's chunk, ``writer.ChunkWriter.add_records``)."""
        rows, count = len(self), len(names)
        if not (
            len(offsets) == len(lengths) == len(mtimes_ns) == len(record_offsets) == len(media) == len(modes) == count
            and len(md5s) == 16 * count
            and len(widths) == len(heights) == 4 * count
        ):
            raise ValueError("extend_frames: columns of different lengths")
        self._name_data += b"".join(names)
        ends, at = self._name_offsets, self._name_offsets[-1]
        for name in names:
            at += len(name)
            ends.append(at)
        try:
            b"\0".join(names).decode("utf-8")  # (no name holds a NUL: the whole is valid if each is)
        except UnicodeDecodeError:
            for j, name in enumerate(names):
                try:
                    name.decode("utf-8")
                except UnicodeDecodeError:
                    self._invalid_names[rows + j] = name
        offset_col, length_col, raw_lengths, source_sizes, mtimes_us, record_col = self._int_columns
        offset_col.extend(offsets)
        length_col.extend(lengths)
        raw_lengths.extend(lengths)
        source_sizes.extend(lengths)
        mtimes_us.extend([m // 1000 for m in mtimes_ns])
        record_col.extend(record_offsets)
        self._md5 += md5s
        media_types, kinds, codecs = self._code_columns
        media_types.frombytes(media.translate(_COMPILED_MEDIA))
        kinds.frombytes(media.translate(_COMPILED_KINDS))
        codecs.frombytes(bytes(count))
        labels, index = self._labels, []
        last_parent, last_idx = None, -1
        for name in names:
            parent = name[: name.rfind(b"/") + 1]  # (a run of frames mostly shares its folder)
            if parent != last_parent:
                label = parent_label(name)
                last_parent, last_idx = parent, -1 if label is None else labels.setdefault(label, len(labels))
            index.append(last_idx)
        self._label_idx.extend(index)
        if media.count(0) != count:  # images: their size and mode, as append adds them
            if self._meta is None:
                self._meta = _MetaColumns()
            w, h = array("i"), array("i")
            w.frombytes(widths)
            h.frombytes(heights)
            for j in range(count):
                if media[j]:
                    self._meta.fill(rows + j)
                    self._meta.add({"width": w[j], "height": h[j], "mode": COMPILED_MODES[modes[j]]})
                    self._meta_rows = rows + j + 1

    def _add_row(
        self,
        name: bytes,
        offset: int,
        length: int,
        md5: bytes,
        media_code: int,
        kind: int,
        codec: int,
        raw_length: int,
        source_size: int,
        mtime_ns: int,
        record_offset: int,
        label: bytes | None,
    ) -> None:
        row = len(self)
        self._name_data += name
        self._name_offsets.append(len(self._name_data))
        try:
            name.decode("utf-8")
        except UnicodeDecodeError:
            self._invalid_names[row] = name
        offsets, lengths, raw_lengths, source_sizes, mtimes_us, record_offsets = self._int_columns
        offsets.append(offset)
        lengths.append(length)
        raw_lengths.append(raw_length)
        source_sizes.append(source_size)
        mtimes_us.append(mtime_ns // 1000)
        record_offsets.append(record_offset)
        self._md5 += md5
        media_types, kinds, codecs = self._code_columns
        media_types.append(media_code)
        kinds.append(kind)
        codecs.append(codec)
        self._label_idx.append(-1 if label is None else self._labels.setdefault(label, len(self._labels)))

    def truncate(self, rows: int) -> None:
        """Drop rows past ``rows`` (used when a frame is abandoned mid-write)."""
        while len(self) > rows:
            self._label_idx.pop()
            for a in self._ints.values():
                a.pop()
            for c in self._codes.values():
                c.pop()
            self._name_offsets.pop()
            self._invalid_names.pop(len(self), None)
        if self._meta is not None:
            self._meta.truncate(rows)
            self._meta_rows = min(self._meta_rows, rows)
        del self._name_data[self._name_offsets[-1] :]
        del self._md5[rows * 16 :]

    def shift_offsets(self, by: int) -> None:
        """Move every row's payload and record offset ``by`` bytes (a chunk written by a
        ``fanout`` worker, whose rows were built before it knew where the chunk goes)."""
        for key in ("offset", "record_offset"):
            self._ints[key] = array("q", [x + by for x in self._ints[key]])
        self._int_columns = tuple(self._ints.values())

    def extend(self, other: IndexBuilder) -> None:
        """Append ``other``'s rows after these, as if each had been appended here in turn
        (labels and metadata values are renumbered into this builder's)."""
        rows, names_at = len(self), len(self._name_data)
        self._name_data += other._name_data
        self._name_offsets.extend([x + names_at for x in other._name_offsets[1:]])
        for row, value in other._invalid_names.items():
            self._invalid_names[rows + row] = value
        for mine, theirs in zip(self._int_columns, other._int_columns):
            mine.extend(theirs)
        self._md5 += other._md5
        for mine_c, theirs_c in zip(self._code_columns, other._code_columns):
            mine_c.extend(theirs_c)
        renumber = [self._labels.setdefault(label, len(self._labels)) for label in other._labels]
        self._label_idx.extend([-1 if i < 0 else renumber[i] for i in other._label_idx])
        if other._meta is not None:
            if self._meta is None:
                self._meta = _MetaColumns()
            self._meta.fill(rows)
            self._meta.extend(other._meta)
            self._meta_rows = rows + other._meta_rows

    def md5_hex(self, row: int) -> str:
        return bytes(self._md5[row * 16 : row * 16 + 16]).hex()

    def release(self) -> None:
        """Let go of the rows once the index is written (``PackWriter.seal``; ~95 bytes a frame,
        held through the self-check otherwise): the length stays, ``to_table`` refuses."""
        self._released = True
        self._name_data, self._name_offsets, self._invalid_names = bytearray(), array("q", [0]), {}
        self._ints = {k: array("q") for k in self._ints}
        self._int_columns = tuple(self._ints.values())
        self._md5 = bytearray()
        self._codes = {k: array("b") for k in self._codes}
        self._code_columns = tuple(self._codes.values())
        self._labels, self._meta = {}, None

    def to_table(self, meta: IndexMeta) -> pa.Table:
        if self._released:
            raise ValueError("the rows of this index were released once written")
        n = len(self)
        if self._invalid_names:
            names_bin = pa.Array.from_buffers(
                pa.large_binary(),
                n,
                [None, pa.py_buffer(self._name_offsets.tobytes()), pa.py_buffer(bytes(self._name_data))],
            )
            fixed = names_bin.to_pylist()
            raw: list[bytes | None] = [None] * n
            for row, value in self._invalid_names.items():
                fixed[row] = display_name(value).encode()
                raw[row] = value
            name = _utf8(array("q", accumulate(map(len, fixed), initial=0)), b"".join(fixed))
            name_raw = pa.array(raw, pa.binary())
        else:
            name = _utf8(self._name_offsets, self._name_data)
            name_raw = pa.nulls(n, pa.binary())

        def ints(key: str) -> pa.Array:
            return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self._ints[key].tobytes())])

        def coded(key: str, names: tuple[str, ...] | dict[int, str]) -> pa.Array:
            lookup = [""] * (max(names) + 1 if isinstance(names, dict) else len(names))
            for k, v in names.items() if isinstance(names, dict) else enumerate(names):
                lookup[k] = v
            return _coded_strings(self._codes[key], lookup)

        label = _coded_strings(self._label_idx, [display_name(k) for k in self._labels])
        md5_hex = binascii.hexlify(bytes(self._md5))
        md5_col = pa.Array.from_buffers(
            pa.string(),
            n,
            [None, pa.py_buffer(array("i", range(0, 32 * n + 1, 32)).tobytes()), pa.py_buffer(md5_hex)],
        )
        columns = {
            "frame_id": pa.array(range(n), pa.int64()),
            "name": name,
            "name_raw": name_raw,
            "offset": ints("offset"),
            "length": ints("length"),
            "md5": md5_col,
            "media_type": coded("media_type", MEDIA_TYPES),
            "kind": coded("kind", KIND_NAMES),
            "codec": coded("codec", CODEC_NAMES),
            "raw_length": ints("raw_length"),
            "source_size": ints("source_size"),
            "source_mtime": ints("mtime_us").view(pa.timestamp("us", tz="UTC")),
            "label": label,
            "record_offset": ints("record_offset"),
        }
        if self._meta is not None:
            self._meta.fill(n)
            columns.update(self._meta.to_arrays())
        else:
            columns.update({c: pa.nulls(n, SCHEMA.field(c).type) for c in _MetaColumns.COLUMNS})
        table = pa.table(columns, schema=SCHEMA)
        return table.replace_schema_metadata(meta.to_metadata())


#: Keys of the per-frame metadata (record header extra, ``man/hframe.5``) that are index columns.
FRAME_META_KEYS = ("width", "height", "mode", "source", "frame_index", "pts_s", "keyframe", "label", "split")


class _MetaColumns:
    """Typed arrays for the optional per-frame columns; -1 (ints), NaN (pts) and -1 codes are null."""

    COLUMNS = ("split", "width", "height", "source", "frame_index", "pts_s", "keyframe", "mode")
    _CODED = ("split", "source", "mode")

    def __init__(self) -> None:
        self.width = array("i")
        self.height = array("i")
        self.frame_index = array("q")
        self.pts_s = array("d")
        self.keyframe = array("b")
        self.codes = {k: array("i") for k in self._CODED}
        self.values: dict[str, dict[str, int]] = {k: {} for k in self._CODED}

    def __len__(self) -> int:
        return len(self.width)

    def fill(self, rows: int) -> None:
        """Null rows up to ``rows`` (frames without metadata)."""
        while len(self) < rows:
            self.add({})

    def add_source(self, source: str) -> None:
        """``add({"source": source})``: a located source's blob (``pack --from``, a prefix)."""
        self.width.append(-1)
        self.height.append(-1)
        self.frame_index.append(-1)
        self.pts_s.append(math.nan)
        self.keyframe.append(-1)
        codes, sources = self.codes, self.values["source"]
        codes["split"].append(-1)
        codes["mode"].append(-1)
        codes["source"].append(sources.setdefault(source, len(sources)))

    def add(self, meta: dict[str, Any]) -> None:
        if len(meta) == 3 and "width" in meta and "mode" in meta and "height" in meta:  # an image
            self.width.append(int(meta["width"]))
            self.height.append(int(meta["height"]))
            self.frame_index.append(-1)
            self.pts_s.append(math.nan)
            self.keyframe.append(-1)
            codes, values = self.codes, self.values
            codes["split"].append(-1)
            codes["source"].append(-1)
            modes = values["mode"]
            codes["mode"].append(modes.setdefault(str(meta["mode"]), len(modes)))
            return
        if len(meta) == 1 and "source" in meta:  # an archive member's blob (pack --from)
            self.add_source(str(meta["source"]))
            return

        def num(key: str) -> Any:
            v = meta.get(key)
            return -1 if v is None else v

        self.width.append(int(num("width")))
        self.height.append(int(num("height")))
        self.frame_index.append(int(num("frame_index")))
        pts = meta.get("pts_s")
        self.pts_s.append(math.nan if pts is None else float(pts))
        key = meta.get("keyframe")
        self.keyframe.append(-1 if key is None else int(bool(key)))
        for k in self._CODED:
            v = meta.get(k)
            self.codes[k].append(-1 if v is None else self.values[k].setdefault(str(v), len(self.values[k])))

    def extend(self, other: _MetaColumns) -> None:
        """Append ``other``'s rows (its coded values renumbered into these)."""
        self.width.extend(other.width)
        self.height.extend(other.height)
        self.frame_index.extend(other.frame_index)
        self.pts_s.extend(other.pts_s)
        self.keyframe.extend(other.keyframe)
        for k in self._CODED:
            values = self.values[k]
            renumber = [values.setdefault(v, len(values)) for v in other.values[k]]
            self.codes[k].extend([-1 if i < 0 else renumber[i] for i in other.codes[k]])

    def truncate(self, rows: int) -> None:
        arrays: list[array[Any]] = [self.width, self.height, self.frame_index, self.pts_s, self.keyframe]
        for a in arrays + list(self.codes.values()):
            del a[rows:]

    def to_arrays(self) -> dict[str, pa.Array]:
        n = len(self)
        keyframe = self.keyframe
        out = {
            "width": _with_nulls(pa.int32(), self.width, _valid_unless(-1, self.width)),
            "height": _with_nulls(pa.int32(), self.height, _valid_unless(-1, self.height)),
            "frame_index": _with_nulls(pa.int64(), self.frame_index, _valid_unless(-1, self.frame_index)),
            "keyframe": _with_nulls(
                pa.bool_(), _bitmap(bytes(map((1).__eq__, keyframe))), _valid_unless(-1, keyframe), n
            ),
            "pts_s": _with_nulls(pa.float64(), self.pts_s, bytes(map(float.__eq__, self.pts_s, self.pts_s))),
        }  # (pts_s: NaN, which is not equal to itself, is null)
        for k in self._CODED:
            out[k] = _coded_strings(self.codes[k], list(self.values[k]))
        return out


# Columns are built from their typed arrays with ``pa.Array.from_buffers``, nulls included:
# ``pyarrow.compute`` (a cast, ``if_else``) would cost every pack ~40 ms just to import it.

_BITS = bytes.maketrans(b"\x00\x01", b"01")


def _bitmap(flags: bytes) -> bytes:
    """Arrow's bitmap (bit i of byte i // 8, least significant first) of one 0/1 byte per row."""
    if not flags:
        return b""
    return int(flags.translate(_BITS)[::-1], 2).to_bytes((len(flags) + 7) // 8, "little")


def _valid_unless(null: int, values: array[Any]) -> bytes:
    """One byte per row: 1 where ``values`` is not ``null``."""
    return bytes(map(null.__ne__, values))


def _with_nulls(typ: pa.DataType, data: array[Any] | bytes, valid: bytes, n: int | None = None) -> pa.Array:
    """An array of ``typ`` over ``data`` (typed values, or a bitmap for booleans), null where
    ``valid`` has 0."""
    rows = len(valid) if n is None else n
    nulls = valid.count(0)
    validity = pa.py_buffer(_bitmap(valid)) if nulls else None
    buf = data if isinstance(data, bytes) else data.tobytes()
    return pa.Array.from_buffers(typ, rows, [validity, pa.py_buffer(buf)], null_count=nulls)


def _utf8(offsets: array[Any], data: bytes | bytearray) -> pa.Array:
    """A string column from int64 ``offsets`` into ``data`` (UTF-8, checked)."""
    if offsets[-1] > 0x7FFFFFFF:
        raise FormatError(f"frame names take {offsets[-1]} bytes: more than an index column holds (2 GiB)")
    arr = pa.Array.from_buffers(
        pa.string(), len(offsets) - 1, [None, pa.py_buffer(array("i", offsets).tobytes()), pa.py_buffer(bytes(data))]
    )
    arr.validate(full=True)
    return arr


def _coded_strings(codes: array[Any], values: Sequence[str]) -> pa.Array:
    """The string column of ``codes`` into ``values`` (-1: null)."""
    n = len(codes)
    if n and codes.count(codes[0]) == n:  # one value throughout (a pack of blobs: every code column)
        return pa.nulls(n, pa.string()) if codes[0] < 0 else pa.repeat(pa.scalar(values[codes[0]], pa.string()), n)
    pick = [*values, None]  # code -1 picks the None at the end
    return pa.array(list(map(pick.__getitem__, codes)), pa.string())


#: What pyarrow raises, one way or another, for a Parquet file that is damaged or crafted.
DAMAGED_PARQUET = (pa.ArrowException, OSError, KeyError, ValueError, IndexError)

#: The index file's own md5, in its footer: a flipped byte anywhere in the file is found by
#: verify. The md5 is taken over the whole file with its own 32 hex digits written as zeros.
FILE_MD5_KEY = b"hframe.file_md5"
_PLACEHOLDER = b"0" * 32


class _Hashing:
    """A write-only file that hashes what passes through it and keeps what came after ``mark()``
    (pyarrow writes the Parquet file to it; the footer comes last)."""

    closed = False

    def __init__(self, f: Any) -> None:
        self.f, self.md5, self.n = f, hashlib.md5(), 0
        self.tail: bytearray | None = None

    def mark(self) -> int:
        self.tail = bytearray()
        return self.n

    def write(self, data: bytes) -> int:
        self.md5.update(data)
        self.n += len(data)
        if self.tail is not None:
            self.tail += data
        return int(self.f.write(data))

    def flush(self) -> None:
        self.f.flush()

    def tell(self) -> int:
        return self.n

    def close(self) -> None:
        pass


def write_index(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """Write ``table`` as Parquet (zstd, large row groups, a CRC on every page, the file's own
    md5 in its footer) to ``path`` and fsync it."""
    with open(path, "wb") as f:
        sink = _Hashing(f)
        writer = pq.ParquetWriter(
            sink,
            table.schema,
            compression="zstd",
            use_dictionary=["media_type", "kind", "codec", "label", "split", "source"],
            write_statistics=["frame_id", "offset", "record_offset"],
            write_page_checksum=True,  # a damaged page fails its CRC in every reader (hframe.5)
        )
        try:
            writer.write_table(table, row_group_size=ROW_GROUP_SIZE)
            writer.add_key_value_metadata({FILE_MD5_KEY: _PLACEHOLDER})
            footer_at = sink.mark()
        finally:
            writer.close()
        assert sink.tail is not None
        key = sink.tail.find(FILE_MD5_KEY)
        at = sink.tail.find(_PLACEHOLDER, key)
        if key < 0 or at < 0:
            raise FormatError(f"{os.fspath(path)}: the Parquet writer did not keep the md5 slot in the footer")
        f.seek(footer_at + at)
        f.write(sink.md5.hexdigest().encode())
        f.flush()
        os.fsync(f.fileno())


def file_digest_problem(
    read_at: Callable[[int, int], bytes], size: int, footer: dict[bytes, bytes] | None, where: str
) -> str | None:
    """What is wrong with an index file by the md5 written into its footer (``write_index``), or
    None: it matches, or the index predates it (or another tool rewrote it): then only the page
    CRCs speak for it."""
    footer = footer or {}
    value = footer.get(FILE_MD5_KEY)
    tail = read_at(size - 8, 8) if size >= 8 else b""
    start = max(0, size - 8 - int.from_bytes(tail[:4], "little")) if len(tail) == 8 else 0
    raw_footer = read_at(start, size - start)
    key = raw_footer.find(FILE_MD5_KEY)
    if value is None:
        # another tool's rewrite has no such key; a damaged footer may still show it, whole or hit
        if key >= 0 or any(_one_byte_off(k, FILE_MD5_KEY) for k in footer):
            return f"{where}: index file is damaged (the md5 it was written with cannot be read from its footer)"
        return None
    found = raw_footer.find(value, key + len(FILE_MD5_KEY)) if key >= 0 else -1
    if found < 0 or len(value) != len(_PLACEHOLDER):
        return f"{where}: index file is damaged (the md5 it was written with cannot be read from its footer)"
    at = start + found  # the digest's own bytes are hashed as the zeros they were
    md5 = hashlib.md5()
    for lo, hi in ((0, at), (at + len(_PLACEHOLDER), size)):
        for pos in range(lo, hi, 8 << 20):
            md5.update(read_at(pos, min(8 << 20, hi - pos)))
        if hi == at:
            md5.update(_PLACEHOLDER)
    if md5.hexdigest().encode() != value:
        return f"{where}: index file is damaged (its md5 differs from the one written with it)"
    return None


def _one_byte_off(a: bytes, b: bytes) -> bool:
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1


def read_index_meta(path: str | os.PathLike[str], *, stream: Any = None) -> IndexMeta:
    """Read only the metadata of an index file (from ``stream``, an open file object, if given:
    ``path`` then only names it in messages)."""
    where = os.fspath(path)
    try:
        schema = pq.read_schema(stream if stream is not None else path)
    except FileNotFoundError as e:
        raise InputError(f"{where}: index not found (rebuild it with 'hframe index PACK --rebuild')") from e
    except DAMAGED_PARQUET as e:
        raise FormatError(f"{where}: not a readable Parquet index ({type(e).__name__}: {e})") from e
    return IndexMeta.from_metadata(schema.metadata, where)


def read_index(
    path: str | os.PathLike[str],
    columns: list[str] | None = None,
    *,
    as_dictionary: Sequence[str] = (),
    stream: Any = None,
) -> pa.Table:
    """Read index rows (all columns, or only ``columns``), from ``stream`` (an open file object)
    if given, else from ``path``.

    ``as_dictionary`` names string columns to return dictionary-encoded (indices into their
    distinct values): far cheaper than one Python string per row for columns such as
    ``media_type`` and ``codec``, which hold a handful of distinct values.
    """
    where = os.fspath(path)
    try:
        # ParquetFile, not read_table: the same rows without importing pyarrow.dataset (~90 ms)
        with pq.ParquetFile(
            stream if stream is not None else path,
            read_dictionary=list(as_dictionary) or None,
            page_checksum_verification=True,  # pages written without a CRC (before 0.x) are read as they are
        ) as pf:
            if columns is None:
                table = _conform(_with_added_columns(pf.read()), where)
                missing = [c for c in COLUMNS if c not in table.column_names]
                if missing:
                    raise FormatError(f"{where}: index has no column {missing[0]!r}")
                return table
            have = set(pf.schema_arrow.names)
            table = pf.read(columns=[c for c in columns if c in have])
        missing = [c for c in columns if c not in have and c in ADDED_COLUMNS]
        if missing:  # an index written before these columns existed: they read as nulls
            table = _with_added_columns(table, missing)
            table = table.select([c for c in columns if c in table.column_names])
        return _conform(table, where)
    except FileNotFoundError as e:
        raise InputError(f"{where}: index not found (rebuild it with 'hframe index PACK --rebuild')") from e
    except DAMAGED_PARQUET as e:
        raise FormatError(f"{where}: not a readable Parquet index ({type(e).__name__}: {e})") from e


def _conform(table: pa.Table, where: str) -> pa.Table:
    """The index columns in the schema's types (an index rewritten by another tool may use, say,
    large_string or int32), with no nulls where the schema allows none.

    Raises:
        FormatError: a column that cannot be read as its schema type, or nulls in a required one.
    """
    for k, name in enumerate(table.column_names):
        if name not in COLUMNS:
            continue
        want = SCHEMA.field(name)
        col = table.column(k)
        if col.type != want.type and not (pa.types.is_dictionary(col.type) and col.type.value_type == want.type):
            try:
                col = col.cast(want.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise FormatError(f"{where}: index column {name!r} is {col.type}, expected {want.type} ({e})") from None
            table = table.set_column(k, want, col)
        if not want.nullable and col.null_count:
            raise FormatError(f"{where}: index column {name!r} has {col.null_count} null values")
    return table


def _with_added_columns(table: pa.Table, names: list[str] | None = None) -> pa.Table:
    """``table`` with the columns added by later minor versions appended as nulls where absent."""
    for name in names if names is not None else list(ADDED_COLUMNS):
        if name not in table.column_names:
            table = table.append_column(SCHEMA.field(name), pa.nulls(table.num_rows, SCHEMA.field(name).type))
    return table


def current_format_version() -> str:
    return f"{FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}"


def glob_to_regex(glob: str) -> str:
    """A shell glob (``*``, ``?``, ``[...]``) as an anchored RE2 regex; ``*`` crosses ``/``,
    and ``*`` and ``?`` match any character, a newline too (as ``pack --include`` does)."""
    out = ["(?s)^"]
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = glob.find("]", i + 2 if glob[i + 1 : i + 2] in ("!", "]") else i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = glob[i + 1 : j].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                elif body.startswith("^"):
                    body = "\\" + body  # a literal ^, as in fnmatch: [!...] is the complement
                out.append("[" + body + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    out.append("$")
    return "".join(out)


def describe_filters(name_glob: str | None, equal: dict[str, str | None] | None) -> str:
    """The filters as typed: ``--match 'a*' --label cats``."""
    parts = [f"--match {name_glob!r}"] if name_glob else []
    parts += [f"--{col} {value!r}" for col, value in (equal or {}).items() if value is not None]
    return " ".join(parts) or "(no filter)"


def select_rows(
    table: pa.Table,
    columns: list[str] | None = None,
    name_glob: str | None = None,
    equal: dict[str, str | None] | None = None,
    *,
    must_match: str | None = None,
) -> pa.Table:
    """Index rows whose name matches ``name_glob`` and whose ``equal`` columns have the given
    values, with only ``columns`` (in that order).

    Raises:
        InputError: an unknown column name (the message lists the valid ones).
        NotFound: with ``must_match`` (the pack, for the message), filters that select nothing.
    """
    if columns:
        unknown = [c for c in columns if c not in table.column_names]
        if unknown:
            raise InputError(f"unknown column {unknown[0]!r} (columns: {', '.join(table.column_names)})")
    filtered = bool(name_glob) or any(v is not None for v in (equal or {}).values())
    if filtered:
        import pyarrow.compute as pc  # (about 0.1 s to import: only where a filter is computed)
    if name_glob:
        mask = pc.match_substring_regex(table.column("name"), glob_to_regex(name_glob))
        table = table.filter(mask)
    for col, value in (equal or {}).items():
        if value is not None:
            table = table.filter(pc.fill_null(pc.equal(table.column(col), pa.scalar(value, pa.string())), False))
    if must_match is not None and table.num_rows == 0 and filtered:
        raise NotFound(f"{must_match}: no frame matches {describe_filters(name_glob, equal)}")
    return table.select(columns) if columns else table


def int64_column(table: pa.Table, name: str) -> array[int]:
    """A non-null int64 column as an ``array('q')``: one memcpy, no Python int per row."""
    col = table.column(name).combine_chunks() if table.num_rows else pa.array([], pa.int64())
    out = array("q")
    if len(col):
        buf = col.buffers()[1]
        out.frombytes(memoryview(buf)[col.offset * 8 : (col.offset + len(col)) * 8])
    return out
