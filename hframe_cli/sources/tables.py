"""Rows of Parquet tables as sources (``pack --from parquet``): one frame per row, from a binary column.

The Hugging Face datasets layout keeps images as a struct column ``image {bytes, path}`` and
a class as an integer column (its names in the schema's ``huggingface`` metadata): so
``--column image.bytes --name-column image.path --label-column label``. A dotted name is a
field of a struct column (a top-level column of that very name comes first).

Listing reads the data column once, one row group at a time, to learn each row's size (a
Parquet file keeps no per-row lengths); the name column comes with it. A row is then a
located source (``locator.py``): the table, its size and time when listed, the row group and
the row's place in it. Frames keep the table's order, tables in the order given, not sorted
by name: a row group is decoded once for all its rows (``_Groups`` keeps the last few decoded,
shared by the loading threads; a packing worker decodes the groups its chunks of rows fall in),
where name order would decode a group again for every row.

Names: the name column's value, normalized as a tar member's (``archives.member_name``); where
there is no name column, or a row's is null or empty, ``STEM/ROW`` (the table's file name
without ``.parquet`` and the row number, 9 digits). A name given twice is refused. A row's
time is its table's modification time. Its ``source`` is ``TABLE#row=N`` (the table's file
name); its label, with ``--label-column``, the column's value as text (a class number as its
class name when the table's metadata has the names).

Imports inside functions: ``pyarrow``, ``pyarrow.compute`` and ``pyarrow.parquet``, loaded only
when a table is read.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any

from ..errors import InputError
from .archives import member_name
from .locator import SourceChanged, tagged, untagged

__all__ = ["TableColumns", "TableRow", "list_table", "read_row", "row_origin", "row_shown", "row_unchanged"]

_KIND = "parquet"
_FIELDS = 7  # row group, row in it, row in the table, table size, table mtime, label column, data column
#: decoded row groups kept per process, at most; a group is let go as soon as all its rows were
#: read (loading threads a few batches apart, or a packing worker's chunk, may need two or three)
_KEEP_GROUPS = 4
_BATCH_ROWS = 1024  # rows decoded at a time by a listing


@dataclass(frozen=True, slots=True)
class TableColumns:
    """Which columns hold the frames' bytes, names and labels (``--column``, ``--name-column``,
    ``--label-column``)."""

    data: str
    name: str | None = None
    label: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"data": self.data, "name": self.name, "label": self.label}


@dataclass(frozen=True, slots=True)
class TableRow:
    """One row found in a table: a frame's ``name``, its locator (``path``), size and time; or,
    with ``problem`` set, a row that is not packed and why."""

    name: str
    path: str
    size: int
    mtime_ns: int
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class _Row:
    table: str
    group: int
    index: int  # in its group
    row: int  # in the table
    table_size: int
    table_mtime_ns: int
    label: str  # the label column ("" for none)
    data: str


def _parse(path: str) -> _Row:
    table, (group, index, row, size, mtime, label, data) = untagged(path, _FIELDS)
    return _Row(table, int(group), int(index), int(row), int(size), int(mtime), label, data)


def row_shown(path: str) -> str:
    """``TABLE#row=N`` (the table's path), for messages."""
    r = _parse(path)
    return f"{r.table}#row={r.row}"


def row_origin(path: str) -> str:
    """The frame's ``source``: ``TABLE#row=N``, the table by its file name (the same table packed
    from anywhere gives the same bytes)."""
    r = _parse(path)
    return f"{os.path.basename(r.table)}#row={r.row}"


def row_unchanged(path: str) -> bool:
    r = _parse(path)
    try:
        st = os.stat(r.table)
    except OSError:
        return False
    return (st.st_size, st.st_mtime_ns) == (r.table_size, r.table_mtime_ns)


# -- columns ---------------------------------------------------------------------------------


def _field_path(schema: Any, dotted: str, table: str, option: str) -> list[str]:
    """The path of a (possibly nested) field: ``image.bytes`` → ["image", "bytes"]."""
    import pyarrow as pa

    if schema.get_field_index(dotted) >= 0:
        return [dotted]
    parts = dotted.split(".")
    typ: Any = None
    for depth, part in enumerate(parts):
        if depth == 0:
            i = schema.get_field_index(part)
            typ = schema.field(i).type if i >= 0 else None
        elif pa.types.is_struct(typ) and typ.get_field_index(part) >= 0:
            typ = typ.field(typ.get_field_index(part)).type
        else:
            typ = None
        if typ is None:
            names = ", ".join(schema.names[:12])
            raise InputError(f"{table}: {option} {dotted}: no such column (the table has: {names})")
    return parts


def _field_type(schema: Any, parts: list[str]) -> Any:
    typ = schema.field(parts[0]).type
    for part in parts[1:]:
        typ = typ.field(typ.get_field_index(part)).type
    return typ


def _column(table: Any, parts: list[str]) -> Any:
    """A (nested) field of a table read with only that field, as one array."""
    import pyarrow.compute as pc

    col = table.column(parts[0])
    if hasattr(col, "num_chunks"):  # (a table's column; a record batch's is one array already)
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()  # (one chunk: no copy)
    for part in parts[1:]:
        col = pc.struct_field(col, part)
    return col


def _check_types(schema: Any, cols: TableColumns, table: str) -> dict[str, list[str]]:
    """The field paths of ``cols``, each checked for a type it can be used as."""
    import pyarrow as pa

    paths = {"data": _field_path(schema, cols.data, table, "--column")}
    typ = _field_type(schema, paths["data"])
    if not (pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_binary_view(typ)):
        raise InputError(f"{table}: --column {cols.data} is {typ}, not binary: hframe packs a column of bytes")
    for key, option, value in (("name", "--name-column", cols.name), ("label", "--label-column", cols.label)):
        if value is None:
            continue
        paths[key] = _field_path(schema, value, table, option)
        typ = _field_type(schema, paths[key])
        if pa.types.is_dictionary(typ):
            typ = typ.value_type
        text = pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_string_view(typ)
        ok = text or (key == "name" and pa.types.is_binary(typ)) or (key == "label" and pa.types.is_integer(typ))
        if not ok:
            kinds = "text" if key == "name" else "text or integers"
            raise InputError(f"{table}: {option} {value} is {typ}, not {kinds}")
    return paths


def _class_names(schema: Any, label: str | None) -> list[str] | None:
    """A Hugging Face ``ClassLabel``'s names for the label column, from the schema's metadata."""
    if label is None or not schema.metadata or b"huggingface" not in schema.metadata:
        return None
    try:
        info = json.loads(schema.metadata[b"huggingface"])
        feature = info.get("info", {}).get("features", {}).get(label, {})
        names = feature.get("names") if isinstance(feature, dict) else None
    except (ValueError, AttributeError):
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


def _open(table: str) -> tuple[Any, os.stat_result]:
    import pyarrow.parquet as pq

    try:
        st = os.stat(table)
    except OSError as e:
        raise InputError(f"{table}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{table}: --from parquet needs a Parquet file")
    try:
        # no pre-buffering and (below) no threads of pyarrow's own: a process that has started
        # none can still fork its packing workers (processes.fork_is_safe)
        return pq.ParquetFile(table, memory_map=False, pre_buffer=False), st
    except (OSError, ValueError) as e:  # pyarrow.ArrowInvalid: not Parquet
        raise InputError(f"{table}: not a Parquet table ({str(e).splitlines()[0]})") from None


# -- listing ---------------------------------------------------------------------------------


def list_table(table: str, cols: TableColumns) -> Iterator[TableRow]:
    """The rows of ``table``, in order, one row group read at a time.

    Raises:
        InputError: not a Parquet file; a column missing or of a type that cannot be used.
    """
    import pyarrow.compute as pc

    pf, st = _open(table)
    schema = pf.schema_arrow
    paths = _check_types(schema, cols, table)
    stem = os.path.basename(table)
    stem = stem[: -len(".parquet")] if stem.endswith(".parquet") else stem
    wanted = [".".join(paths["data"])] + ([".".join(paths["name"])] if "name" in paths else [])

    def sized(group: int) -> tuple[list[int | None], list[Any]]:  # (on a listing thread)
        # in batches of rows: a group read whole holds its pages twice over (a GB for 330 MB of
        # JPEGs), and the page faults of that memory were most of a listing's time
        sizes: list[int | None] = []
        names: list[Any] = []
        try:
            own, _ = _open(table)  # (a reader of its own on each thread)
            for batch in own.iter_batches(
                batch_size=_BATCH_ROWS, row_groups=[group], columns=wanted, use_threads=False
            ):
                sizes += pc.binary_length(_column(batch, paths["data"])).to_pylist()
                names += _column(batch, paths["name"]).to_pylist() if "name" in paths else [None] * batch.num_rows
        except (OSError, ValueError) as e:
            raise InputError(
                f"{table}: row group {group} cannot be read ({str(e).splitlines()[0]}; damaged table)"
            ) from None
        return sizes, names

    # row groups are decoded two at a time (most of a listing; pyarrow lets go of the GIL) and
    # taken in order; only their sizes and names are kept
    row = 0
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="hframe-list") as pool:
        groups = iter(range(pf.num_row_groups))
        ahead = deque(pool.submit(sized, g) for g in islice(groups, 2))
        group = 0
        while ahead:
            sizes, names = ahead.popleft().result()
            following = next(groups, None)
            if following is not None:
                ahead.append(pool.submit(sized, following))
            for index, (size, raw) in enumerate(zip(sizes, names)):
                path = tagged(table, _KIND, group, index, row, st.st_size, st.st_mtime_ns, cols.label or "", cols.data)
                name = _row_name(raw, stem, row)
                if name is None:
                    yield TableRow(
                        "", path, 0, st.st_mtime_ns, f"its name {raw!r} has a '..' part or is empty after '/'"
                    )
                elif size is None:
                    yield TableRow(name, path, 0, st.st_mtime_ns, f"no bytes in {cols.data} (null)")
                else:
                    yield TableRow(name, path, size, st.st_mtime_ns)
                row += 1
            group += 1


def _row_name(raw: str | bytes | None, stem: str, row: int) -> str | None:
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    if not raw:
        return f"{stem}/{row:09d}"
    return member_name(raw)


# -- reading ---------------------------------------------------------------------------------


class _Groups:
    """Decoded row groups (their data and label values), the last few kept per process; a group
    asked for by two threads at once is decoded by one of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.kept: OrderedDict[tuple[Any, ...], tuple[threading.Event, list[Any]]] = OrderedDict()
        self.unread: dict[tuple[Any, ...], set[int]] = {}  # rows of a kept group not read yet

    def get(self, r: _Row) -> tuple[_Values, list[str | None] | None]:
        """The decoded values of ``r``'s row group (decoded now, or by another thread)."""
        key = (r.table, r.table_size, r.table_mtime_ns, r.group, r.data, r.label)
        with self.lock:
            if self.pid != os.getpid():  # a forked child: what the parent was decoding is not coming
                self.kept, self.unread, self.pid = OrderedDict(), {}, os.getpid()
            entry = self.kept.get(key)
            mine = entry is None
            if mine:
                entry = (threading.Event(), [])
                self.kept[key] = entry
                while len(self.kept) > _KEEP_GROUPS:
                    self.unread.pop(self.kept.popitem(last=False)[0], None)
            else:
                self.kept.move_to_end(key)
        assert entry is not None
        done, box = entry
        if mine:
            try:
                box.append(_decode(r))
            except BaseException as e:
                box.append(e)
                with self.lock:
                    if self.kept.get(key) is entry:
                        del self.kept[key]  # the next asker tries again
                raise
            finally:
                done.set()
        done.wait()
        value = box[0]
        if isinstance(value, BaseException):
            raise value
        with self.lock:  # the group's last row read: let it go now, not when it is the oldest
            unread = self.unread.get(key) if key in self.kept else None
            if unread is None and key in self.kept:
                unread = self.unread[key] = set(range(len(value[0])))
            if unread is not None:
                unread.discard(r.index)
                if not unread:
                    del self.kept[key], self.unread[key]
        return value  # type: ignore[no-any-return]


_GROUPS = _Groups()


def _decode(r: _Row) -> tuple[_Values, list[str | None] | None]:
    """The data (and label) values of row group ``r.group``, the table checked against its listing."""
    try:
        pf, st = _open(r.table)
    except InputError as e:
        raise SourceChanged(str(e).partition(": ")[2] or str(e)) from None
    if (st.st_size, st.st_mtime_ns) != (r.table_size, r.table_mtime_ns):
        raise SourceChanged(f"{r.table} changed since it was listed")
    schema = pf.schema_arrow
    cols = TableColumns(r.data, None, r.label or None)
    try:
        paths = _check_types(schema, cols, r.table)
        wanted = [".".join(paths["data"])] + ([".".join(paths["label"])] if "label" in paths else [])
        part = pf.read_row_group(r.group, columns=wanted, use_threads=False)
    except InputError as e:
        raise SourceChanged(str(e)) from None
    except (OSError, ValueError, IndexError) as e:
        raise SourceChanged(f"row group {r.group} cannot be read ({str(e).splitlines()[0]}; damaged table)") from None
    data = _Values(_column(part, paths["data"]))
    labels = None
    if "label" in paths:
        values = _column(part, paths["label"]).to_pylist()
        names = _class_names(schema, cols.label)
        labels = [_label_text(v, names) for v in values]
    return data, labels


class _Values:
    """A binary column's values, each copied out of Arrow's buffers when asked for: a group's
    values as Python objects all at once cost a second copy of the group, and in a packing
    worker of a few hundred MB, page faults made most of a table's packing time."""

    def __init__(self, array: Any) -> None:
        import pyarrow as pa

        if pa.types.is_binary_view(array.type):
            array = array.cast(pa.large_binary())
        _, offsets, data = array.buffers()[:3]
        self.length = len(array)
        view = memoryview(offsets) if offsets else memoryview(bytes(8))
        wide = view.cast("q") if pa.types.is_large_binary(array.type) else view.cast("i")
        self.offsets = wide[array.offset : array.offset + self.length + 1]
        self.data = memoryview(data) if data is not None else memoryview(b"")
        self.valid = array.is_valid().to_pylist() if array.null_count else None
        self.array = array  # (its buffers stay alive while the views are used)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> bytes | None:
        if self.valid is not None and not self.valid[i]:
            return None
        return self.data[self.offsets[i] : self.offsets[i + 1]].tobytes()


def _label_text(value: Any, names: list[str] | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and names is not None and 0 <= value < len(names):
        return names[value]
    return str(value)


def read_row(path: str, size: int) -> tuple[bytes, dict[str, str]]:
    """A row's bytes and its frame's metadata (``source``, and ``label`` with a label column),
    checked against the size it was listed with."""
    r = _parse(path)
    data, labels = _GROUPS.get(r)
    if r.index >= len(data):
        raise SourceChanged(f"row group {r.group} has no row {r.index} (damaged table)")
    value = data[r.index]
    if value is None or len(value) != size:
        raise SourceChanged(f"holds {0 if value is None else len(value)} bytes where it was listed with {size}")
    meta = {"source": f"{os.path.basename(r.table)}#row={r.row}"}
    if labels is not None and labels[r.index] is not None:
        meta["label"] = labels[r.index]  # type: ignore[assignment]
    return value, meta
