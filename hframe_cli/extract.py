"""``get`` with filters: write every selected frame to a folder, under its name in the pack."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError
from .index import select_rows

__all__ = ["extract_frames"]

_BATCH = 256


def safe_relative(name: str) -> str:
    """A frame name as a path under the output folder; refuses names that would leave it."""
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise InputError(f"frame name {name!r} is not a safe relative path; extract it by id instead")
    return os.path.join(*parts)


def extract_frames(
    pack: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    name_glob: str | None,
    equal: dict[str, str | None],
    *,
    stored: bool = False,
) -> int:
    """Write the frames of ``pack`` selected by ``name_glob`` and ``equal`` (see
    ``index.select_rows``) to ``folder``/NAME, each atomically (NAME.partial, then a rename).
    Returns how many were written; an existing file is replaced."""
    from .reader import open_pack

    with open_pack(pack) as reader:
        rows = select_rows(reader.table, ["frame_id", "name"], name_glob, equal)
        ids = rows.column("frame_id").to_pylist()
        names = [safe_relative(n) for n in rows.column("name").to_pylist()]
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        for a in range(0, len(ids), _BATCH):
            batch = ids[a : a + _BATCH]
            datas = [reader.read_stored(i) for i in batch] if stored else reader.read_many(batch)
            for name, data in zip(names[a : a + _BATCH], datas):
                path = out / name
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".partial")
                tmp.write_bytes(data)
                os.replace(tmp, path)
    return len(ids)
