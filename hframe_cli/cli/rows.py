"""Index rows as text: an aligned table for people, TSV, CSV, JSON Lines and JSON for programs.

Every format streams: rows are formatted and written a chunk at a time, so the first lines
appear at once and a reader that stops early (``| head``) costs nothing more. The table is plain
aligned text (as ``ls -l`` prints), widths taken from the whole selection up front with Arrow
compute, the name last and never cut. Without ``--columns`` it shows ``TABLE_COLUMNS`` (those
with any value in the selection) and says on stderr how to see the rest.

Imports inside functions: pyarrow, only where rows are rendered from a table (start-up of
commands that print none).
"""

from __future__ import annotations

import csv
import json
import re
import unicodedata
from collections.abc import Iterator
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: render imports field_text on every command
    import pyarrow as pa

__all__ = [
    "TABLE_COLUMNS",
    "cell_text",
    "default_hint",
    "display_width",
    "field_text",
    "plain_value",
    "table_columns",
    "write_rows",
]

#: what a person looking at a pack wants first; ``name`` goes last whatever the order
TABLE_COLUMNS = ("frame_id", "length", "media_type", "width", "height", "label", "split", "pts_s", "name")
CHUNK = 1024  # rows formatted per write
MAX_CELL = 32  # a table cell (not the name) longer than this is cut with "…"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def field_text(value: Any) -> str:
    """A TSV field: tabs, newlines and backslashes escaped (``\\t``, ``\\n``, ``\\\\``)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime):
        value = value.isoformat().replace("+00:00", "Z")
    text = str(value)
    if any(c in text for c in "\\\t\n\r"):
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def plain_value(value: Any) -> Any:
    """A value for CSV and JSON: bytes as hex, times as ISO 8601 UTC."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


def cell_text(value: Any) -> str:
    """A table cell: as TSV, with every other control character (ESC...) shown as ``\\xNN`` so a
    name cannot drive the terminal."""
    text = field_text(value)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if _CONTROL.search(text) else text


def _rows(table: pa.Table) -> Iterator[list[dict[str, Any]]]:
    for batch in table.to_batches(max_chunksize=CHUNK):
        yield batch.to_pylist()


def table_columns(table: pa.Table) -> list[str]:
    """The default table columns that ``table`` has and that hold a value in some row."""
    if table.num_rows == 0:
        return [
            c for c in TABLE_COLUMNS if c in table.column_names and c in ("frame_id", "length", "media_type", "name")
        ]
    return [c for c in TABLE_COLUMNS if c in table.column_names and table.column(c).null_count < table.num_rows]


def write_rows(table: pa.Table, fmt: str, out: IO[str], *, header: bool = True) -> None:
    """``table``'s rows in ``fmt`` (table, tsv, csv, jsonl or json) on ``out``, a chunk at a time."""
    names = table.column_names
    if fmt == "table":
        _write_table(table, out, header)
    elif fmt == "tsv":
        if header:
            out.write("\t".join(names) + "\n")
        for rows in _rows(table):
            out.write("".join("\t".join(field_text(row[n]) for n in names) + "\n" for row in rows))
    elif fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        if header:
            w.writerow(names)
        for rows in _rows(table):
            w.writerows(["" if row[n] is None else plain_value(row[n]) for n in names] for row in rows)
    elif fmt in ("jsonl", "json"):
        sep = "\n  " if fmt == "json" else ""
        end = "\n" if fmt == "jsonl" else ""
        out.write("[" if fmt == "json" else "")
        first = True
        for rows in _rows(table):
            for row in rows:
                line = json.dumps({k: plain_value(v) for k, v in row.items()}, ensure_ascii=False)
                out.write(("" if first or fmt == "jsonl" else ",") + sep + line + end)
                first = False
        if fmt == "json":
            out.write("\n]\n" if not first else "]\n")
    else:
        raise ValueError(f"unknown row format {fmt!r}")


def _write_table(table: pa.Table, out: IO[str], header: bool) -> None:
    import pyarrow as pa

    names = table.column_names
    if "name" in names:  # the name last: it is the one cell that is never cut or padded
        names = [n for n in names if n != "name"] + ["name"]
    kinds = [table.schema.field(n).type for n in names]
    number = [pa.types.is_integer(k) or pa.types.is_floating(k) for k in kinds]
    widths = [_width(table, n) for n in names]
    if header:
        widths = [max(w, len(n)) for w, n in zip(widths, names)]
    last = len(names) - 1

    def line(cells: list[str]) -> str:
        parts = []
        for i, (text, width) in enumerate(zip(cells, widths)):
            if i == last:
                parts.append(text)
                continue
            shown = display_width(text)
            if shown > width and not number[i]:  # a number is never cut: it overflows instead
                text = _cut(text, width)
                shown = display_width(text)
            pad = " " * max(0, width - shown)
            parts.append(pad + text if number[i] else text + pad)
        return "  ".join(parts).rstrip() + "\n"

    if header:
        out.write(line(list(names)))
    for rows in _rows(table):
        out.write("".join(line([cell_text(row[n]) for n in names]) for row in rows))


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: East Asian wide and full-width characters take two."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, the last one an ellipsis."""
    out, used = [], 0
    for c in text:
        w = 2 if unicodedata.east_asian_width(c) in "WF" else 1
        if used + w > width - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "…"


def _width(table: pa.Table, name: str) -> int:
    """The widest cell of a column as shown (a text column's at most ``MAX_CELL``): integers from
    their extremes, floats from every value's text, other columns from their distinct values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(name)
    if table.num_rows == 0 or col.null_count == len(col):
        return 0
    kind = col.type
    if pa.types.is_integer(kind):
        lo, hi = pc.min_max(col).values()
        return max(len(str(lo.as_py())), len(str(hi.as_py())))
    values = col.to_pylist() if pa.types.is_floating(kind) else pc.unique(col).to_pylist()
    widest = max((display_width(cell_text(v)) for v in values), default=0)
    return widest if pa.types.is_floating(kind) else min(MAX_CELL, widest)


def default_hint(shown: list[str], all_columns: list[str], rows: int) -> str:
    """How to see the rest: ``30 frames; 6 of 22 columns shown; more with -c ..., all with -f tsv``."""
    frames = f"{rows} frame{'' if rows == 1 else 's'}"
    if len(shown) == len(all_columns):
        return frames
    return (
        f"{frames}; {len(shown)} of {len(all_columns)} columns shown; "
        "more with -c (e.g. -c name,offset,md5), all with -f tsv"
    )
