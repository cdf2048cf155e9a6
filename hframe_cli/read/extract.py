"""``get`` with filters: write every selected frame to a folder, under its name in the pack.

Imports inside functions: tarfile, only for ``get --tar``.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from ..durable import replaced
from ..errors import InputError, NotFound
from ..format.index import describe_filters, select_rows
from ..names import partial_name
from .dataset import open_pack

__all__ = ["extract_frames", "write_frame"]

_BATCH = 256


def safe_relative(name: bytes) -> str:
    """A frame name (exact bytes) as a path under the output folder; refuses names that would
    leave it."""
    text = os.fsdecode(name)
    if "\0" in text:
        shown = name.decode("utf-8", "backslashreplace")
        raise InputError(f"frame name {shown!r} contains a NUL byte, which no file name can; extract it by id instead")
    parts = text.split("/")
    if text.startswith("/") or any(p in ("", ".", "..") for p in parts):
        shown = name.decode("utf-8", "backslashreplace")
        raise InputError(f"frame name {shown!r} is not a safe relative path; extract it by id instead")
    return os.path.join(*parts)


def _write_inside(root: str, rel: str, data: bytes, shown: str) -> None:
    """Write ``data`` to ``root/rel`` atomically, never through a symlink out of ``root``."""
    path = os.path.join(root, rel)
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise InputError(
            f"{path}: cannot write frame {shown!r} ({e.strerror}; another frame's name is a file there?)"
        ) from None
    real_parent = os.path.realpath(parent)
    if real_parent != root and not real_parent.startswith(root + os.sep):
        raise InputError(f"{path}: refusing to write frame {shown!r} through a symlink that leaves {root}")
    tmp = partial_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise InputError(f"{path}: cannot write frame {shown!r} ({e.strerror})") from None


def get_frames(
    pack: str | os.PathLike[str],
    keys: int | str | Sequence[int | str] | None,
    output: str | os.PathLike[str] | None,
    *,
    match: str | None = None,
    equal: dict[str, str | None] | None = None,
    stored: bool = False,
    stdout: BinaryIO | None = None,
    no_clobber: bool = False,
    as_tar: bool = False,
) -> int | None:
    """``hframe get``: frames by id or name (``keys``), or those ``match``/``equal`` select.

    One frame goes to ``stdout`` or the file ``output`` (``"-"``: stdout) as its bytes; several
    go into the folder ``output`` (FOLDER/NAME each), or with ``as_tar`` as one tar stream to
    stdout or the file ``output``. ``stdout`` is None where binary data must not go (a
    terminal). An existing file is replaced, unless ``no_clobber``. Returns how many frames were
    written, or None for one frame's bytes.

    Raises:
        InputError: frames and filters together, neither, several frames with nowhere to put
            them, nowhere to write, an existing file with ``no_clobber``.
        NotFound: no such frame, or no frame the filters select.
    """
    equal = equal or {}
    keys = [] if keys is None else [keys] if isinstance(keys, (int, str)) else list(keys)
    filtered = bool(match or any(equal.values()))
    if output is not None and os.fspath(output) == "-":
        output = None  # as tar -f - and curl -o -
    if filtered and keys:
        raise InputError("--match/--label/--split/--kind select frames: give them without a FRAME")
    if not filtered and not keys:
        raise InputError("give a FRAME (or several, or -T FILE), or filters (--match/--label/--split/--kind)")
    if output is None and stdout is None:
        raise InputError("refusing to write binary frame data to a terminal; redirect stdout or use -o FILE")
    try:
        if len(keys) == 1 and not as_tar:
            _get_one(pack, keys[0], output, stdout, stored, no_clobber)
            return None
        if as_tar:
            return _write_tar(pack, keys, match, equal, output, stdout, stored, no_clobber)
        if output is None:
            raise InputError("several frames: give -o FOLDER, or --format tar for one stream on stdout")
        return extract_frames(pack, output, match, equal, keys=keys, stored=stored, no_clobber=no_clobber)
    except NotFound as e:
        globs = [k for k in keys if isinstance(k, str) and any(c in k for c in "*?[")]
        if not globs or "no frame named" not in str(e):
            raise
        raise NotFound(
            f"{e} (a FRAME is an exact name; to select by a glob use --match {shlex.quote(globs[0])})"
        ) from None


def _get_one(
    pack: str | os.PathLike[str],
    key: int | str,
    output: str | os.PathLike[str] | None,
    stdout: BinaryIO | None,
    stored: bool,
    no_clobber: bool,
) -> None:
    if output is not None and no_clobber and os.path.lexists(output):
        raise InputError(f"{os.fspath(output)}: already exists (--no-clobber)")

    with open_pack(pack) as reader:
        data = reader.read_stored(key) if stored else reader.read(key)
    if output is not None:
        write_frame(output, data, no_clobber=no_clobber)
    elif stdout is not None:
        stdout.write(data)
        stdout.flush()


def _selected(
    reader: Any, keys: Sequence[int | str], match: str | None, equal: dict[str, str | None], where: str
) -> tuple[list[int], list[bytes]]:
    """Frame ids and exact names: of ``keys`` in the order given, or of the rows the filters select."""
    if keys:
        ids = [reader.frame_id(k) for k in keys]
        table = reader.table
        names, raws = table.column("name"), table.column("name_raw")
        raw_names = [raws[i].as_py() or names[i].as_py().encode() for i in ids]
        return ids, raw_names
    rows = select_rows(reader.table, ["frame_id", "name", "name_raw"], match, equal)
    ids = rows.column("frame_id").to_pylist()
    if not ids:
        raise NotFound(f"{where}: no frame matches {describe_filters(match, equal)}")
    raw_names = [
        raw if raw is not None else name.encode()
        for name, raw in zip(rows.column("name").to_pylist(), rows.column("name_raw").to_pylist())
    ]
    return ids, raw_names


def _write_tar(
    pack: str | os.PathLike[str],
    keys: Sequence[int | str],
    match: str | None,
    equal: dict[str, str | None],
    output: str | os.PathLike[str] | None,
    stdout: BinaryIO | None,
    stored: bool,
    no_clobber: bool,
) -> int:
    """The frames as one tar stream to ``stdout``, or atomically into the file ``output``."""

    with open_pack(pack) as reader:
        ids, raw_names = _selected(reader, keys, match, equal, os.fspath(pack))
        rels = [safe_relative(n) for n in raw_names]  # as extraction into a folder would name them
        if output is None:
            assert stdout is not None
            _tar_into(stdout, reader, ids, rels, stored)
            stdout.flush()
            return len(ids)
        _write_whole(os.fspath(output), lambda f: _tar_into(f, reader, ids, rels, stored), no_clobber)
    return len(ids)


def _tar_into(sink: BinaryIO, reader: Any, ids: list[int], rels: list[str], stored: bool) -> None:
    """A POSIX (pax) tar stream of the frames: any name length, exact name bytes, each member
    with its frame's source mtime."""
    import tarfile

    mtimes = reader.table.column("source_mtime")
    with tarfile.open(
        fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for a in range(0, len(ids), _BATCH):
            batch = ids[a : a + _BATCH]
            datas = [reader.read_stored(i) for i in batch] if stored else reader.read_many(batch)
            for i, rel, data in zip(batch, rels[a : a + _BATCH], datas):
                info = tarfile.TarInfo(rel.replace(os.sep, "/"))
                info.size, info.mode = len(data), 0o644
                info.mtime = mtimes[i].value // 1_000_000 if mtimes[i].is_valid else 0
                tar.addfile(info, io.BytesIO(data))


def write_frame(path: str | os.PathLike[str], data: bytes, *, no_clobber: bool = False) -> None:
    """Write one frame's bytes to ``path``, whole or not at all (``_write_whole``).

    Raises:
        InputError: the folder does not exist, the file cannot be written, or it exists and
            ``no_clobber`` (one line, the path).
    """
    _write_whole(os.fspath(path), lambda f: f.write(data), no_clobber)


def _write_whole(out: str, write: Callable[[BinaryIO], object], no_clobber: bool) -> None:
    """``out`` as ``write`` writes it, whole or not at all: through ``durable.replaced``
    (``OUT.partial``, then a rename; a device or pipe such as ``/dev/null`` is written into,
    never replaced), or with ``no_clobber`` through a link of ``OUT.partial``, which fails if
    ``out`` appeared meanwhile.

    Raises:
        InputError: ``out`` exists and ``no_clobber``, or it cannot be written (one line).
    """
    if no_clobber and os.path.lexists(out):
        raise InputError(f"{out}: already exists (--no-clobber)")
    try:
        if not no_clobber:
            with replaced(out, durable=False) as tmp, open(tmp, "wb") as f:
                write(f)
            return
        tmp = partial_name(out)
        try:
            with open(tmp, "wb") as f:
                write(f)
            os.link(tmp, out)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except FileExistsError:
        raise InputError(f"{out}: already exists (--no-clobber)") from None
    except OSError as e:
        raise InputError(f"{out}: cannot write: {e.strerror}") from None


def extract_frames(
    pack: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    name_glob: str | None,
    equal: dict[str, str | None],
    *,
    keys: Sequence[int | str] = (),
    stored: bool = False,
    no_clobber: bool = False,
) -> int:
    """Write the frames of ``pack`` named by ``keys`` (ids or names), or else selected by
    ``name_glob`` and ``equal`` (see ``index.select_rows``), to ``folder``/NAME, each atomically
    (NAME.partial, then a rename).
    Names are the exact stored bytes (``name_raw`` where they are not UTF-8). Returns how many
    were written; an existing file is replaced, unless ``no_clobber`` (then nothing is written).

    Raises:
        NotFound: no frame is selected.
        InputError: a name that would leave the folder, two names that cannot both be files
            (``a`` and ``a/b``), a symlink inside the folder that points out of it, or with
            ``no_clobber`` a file that exists.
    """

    with open_pack(pack) as reader:
        ids, raw_names = _selected(reader, keys, name_glob, equal, os.fspath(pack))
        rels = [safe_relative(n) for n in raw_names]
        if no_clobber:
            existing = next((os.path.join(folder, r) for r in rels if os.path.lexists(os.path.join(folder, r))), None)
            if existing is not None:
                raise InputError(f"{existing}: already exists (--no-clobber); nothing was written")
        Path(folder).mkdir(parents=True, exist_ok=True)
        root = os.path.realpath(folder)
        for a in range(0, len(ids), _BATCH):
            batch = ids[a : a + _BATCH]
            datas = [reader.read_stored(i) for i in batch] if stored else reader.read_many(batch)
            for rel, raw, data in zip(rels[a : a + _BATCH], raw_names[a : a + _BATCH], datas):
                _write_inside(root, rel, data, raw.decode("utf-8", "backslashreplace"))
    return len(ids)
