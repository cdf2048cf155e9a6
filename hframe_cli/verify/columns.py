"""The index columns ``verify`` compares, as Python sequences indexed by frame id.

Read once with ``IndexCols.read`` (media type and codec dictionary-encoded), converted with
``IndexCols.from_table``: every row, or only the rows a walk needs (a parallel part, a sample)
with the rest converted on demand by ``ensure``, so a report never shows a placeholder row.
"""

from __future__ import annotations

import binascii
from array import array
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..format.index import int64_column, read_index
from ..format.layout import CODEC_IDS, KIND_IDS

__all__ = ["IndexCols"]


@dataclass
class IndexCols:
    """The index columns verify compares, as Python sequences indexed by frame id."""

    offset: MutableSequence[int]  # array('q') or list
    length: MutableSequence[int]
    record_offset: MutableSequence[int]
    md5: bytes | bytearray  # 16 bytes per frame
    names: list[bytes]
    media: list[str]
    raw_length: MutableSequence[int]
    codec: list[int]  # codec ids (-1: a name this release does not know)
    kind: list[int]  # kind ids (-1: a name this release does not know)
    mtime_us: MutableSequence[int]  # source_mtime, microseconds since 1970
    #: where only some rows are converted: the table, to convert others on demand (``ensure``),
    #: and one byte per row, 1 once converted
    table: pa.Table | None = None
    converted: bytearray = field(default_factory=bytearray)

    @staticmethod
    def read(path: str, stream: Any = None) -> pa.Table:
        """The whole index, as every command reads it (every page, each checked against its CRC:
        damage in a column verify does not compare is found too), with media type, codec and kind
        dictionary-encoded; from ``stream`` (an open index file) if given."""
        return read_index(path, None, as_dictionary=("media_type", "codec", "kind"), stream=stream)

    @classmethod
    def from_table(cls, t: pa.Table, ranges: list[tuple[int, int]] | None = None) -> IndexCols:
        """Rows of ``t`` (from ``read``) as Python sequences: all of them, or only those in
        ``ranges``. The sequences are full length either way, so frame ids index them directly;
        a row outside ``ranges`` holds a placeholder until ``ensure`` converts it."""
        n = t.num_rows
        if ranges is None or ranges == [(0, n)]:
            return cls._from_table(t)

        def zeros() -> array[int]:  # slice-assigning an array('q') into another is a memcpy
            z = array("q")
            z.frombytes(bytes(8 * n))
            return z

        out = cls(
            zeros(),
            zeros(),
            zeros(),
            bytearray(16 * n),
            [b""] * n,
            ["unknown"] * n,
            zeros(),
            [0] * n,
            [0] * n,
            zeros(),
            t,
            bytearray(n),
        )
        for a, b in ranges:
            out.ensure(a, b)
        return out

    def ensure(self, a: int, b: int) -> None:
        """Rows [a, b) converted, for a careful path that reports frames outside the rows asked
        for (a part of a parallel walk, a sample): never a placeholder in a report."""
        if self.table is None:
            return
        a, b = max(0, a), min(len(self.offset), b)
        if a >= b or self.converted.find(0, a, b) < 0:
            return
        part = self._from_table(self.table.slice(a, b - a))
        self.offset[a:b] = part.offset
        self.length[a:b] = part.length
        self.record_offset[a:b] = part.record_offset
        self.names[a:b] = part.names
        self.media[a:b] = part.media
        self.raw_length[a:b] = part.raw_length
        self.codec[a:b] = part.codec
        self.kind[a:b] = part.kind
        self.mtime_us[a:b] = part.mtime_us
        self.md5[16 * a : 16 * b] = part.md5  # type: ignore[index]  # a bytearray here
        self.converted[a:b] = b"\1" * (b - a)

    @classmethod
    def _from_table(cls, t: pa.Table) -> IndexCols:
        n = t.num_rows
        md5_col = t.column("md5").combine_chunks() if n else pa.array([], pa.string())
        md5 = _md5_column_bytes(md5_col)
        name_col = t.column("name").combine_chunks() if n else pa.array([], pa.string())
        # the same buffers read as binary: bytes values, without a cast (pyarrow.compute, ~45 ms)
        names: list[bytes] = pa.Array.from_buffers(
            pa.binary(), n, name_col.buffers(), name_col.null_count, name_col.offset
        ).to_pylist()
        raw_col = t.column("name_raw")
        if raw_col.null_count < n:  # names that are not UTF-8: the exact bytes
            for k, raw in enumerate(raw_col.to_pylist()):
                if raw is not None:
                    names[k] = raw
        return cls(
            int64_column(t, "offset"),
            int64_column(t, "length"),
            int64_column(t, "record_offset"),
            md5,
            names,
            _rows_of(t.column("media_type"), str),
            int64_column(t, "raw_length"),
            _rows_of(t.column("codec"), lambda c: CODEC_IDS.get(c, -1)),
            _rows_of(t.column("kind"), lambda k: KIND_IDS.get(k, -1)),
            int64_column(t, "source_mtime"),
        )


def _rows_of(col: pa.ChunkedArray, convert: Callable[[Any], Any]) -> list[Any]:
    """``convert`` of every value of a string column without nulls, converting each distinct
    value once where the column is dictionary-encoded (a column of one value: no per-row work)."""
    out: list[Any] = []
    for chunk in col.chunks:
        if pa.types.is_dictionary(chunk.type):
            values = [convert(v) for v in chunk.dictionary.to_pylist()]
            if len(values) == 1:
                out.extend(values * len(chunk))
            else:
                out.extend([values[k] for k in chunk.indices.to_pylist()])
        else:
            out.extend([convert(v) for v in chunk.to_pylist()])
    return out


def _md5_column_bytes(col: pa.Array) -> bytes:
    """16 bytes per row from the hex md5 column: straight from its buffers when every value is
    32 characters (the usual case), else value by value (bad values become ff..ff)."""
    n = len(col)
    if n and col.null_count == 0:
        offsets = memoryview(col.buffers()[1]).cast("i")[col.offset : col.offset + n + 1]
        o0 = offsets[0]
        if offsets.tobytes() == array("i", range(o0, o0 + 32 * n + 1, 32)).tobytes():
            try:
                return binascii.unhexlify(memoryview(col.buffers()[2])[o0 : o0 + 32 * n])
            except (binascii.Error, ValueError):
                pass
    return b"".join(_md5_bytes(h) if h is not None else b"\xff" * 16 for h in col.to_pylist())


def _md5_bytes(h: str) -> bytes:
    try:
        b = bytes.fromhex(h)
        return b if len(b) == 16 else b"\xff" * 16
    except ValueError:
        return b"\xff" * 16


def wrong_source_sizes(t: pa.Table) -> list[tuple[int, int, int]]:
    """(row, source_size, raw_length) of every frame not cut from a video whose source_size is
    not its raw length: such a frame is its whole source file, stored as it was."""
    if "source_size" not in t.column_names:
        return []
    sizes, raws = int64_column(t, "source_size"), int64_column(t, "raw_length")
    if sizes.tobytes() == raws.tobytes():
        return []
    differ = [(row, s, r) for row, (s, r) in enumerate(zip(sizes, raws)) if s != r]
    kinds = t.column("kind").to_pylist()
    return [(row, s, r) for row, s, r in differ if kinds[row] != "video_frame"]


def wrong_frame_ids(t: pa.Table) -> list[tuple[int, int]]:
    """(row, frame_id) of every row whose frame_id is not its row number (frame ids are row
    numbers: the reader and every command rely on it)."""
    ids = int64_column(t, "frame_id")
    if ids.tobytes() == array("q", range(len(ids))).tobytes():
        return []
    return [(row, v) for row, v in enumerate(ids) if v != row]
