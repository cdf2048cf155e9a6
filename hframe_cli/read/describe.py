"""What ``dump-header`` shows: header, trailer and index metadata of a pack, and frame heads.

Unlike ``PackReader`` this is tolerant: an incomplete pack or a missing index is described
(with the reason) rather than refused, because that is when people look.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import FormatError, HframeError, IncompletePack
from ..format.index import format_time_us, index_location
from ..format.layout import (
    FLAG_COMPRESSED,
    FLAG_DICT,
    HEADER_SIZE,
    MAGIC,
    TRAILER_SIZE,
    Header,
    Trailer,
    sniff_media_type,
)
from ..locations import shown_url
from ..storage.access import open_storage
from .dataset import DatasetReader, Manifest, is_dataset, manifest_location
from .reader import FrameKey, PackReader, read_dictionary
from .snapshot import pinned_index, until_settled

__all__ = ["describe_pack", "frame_head"]


def describe_pack(path: str | os.PathLike[str], index_path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Header, trailer (or why there is none) and index metadata (or why it is unusable).

    A sharded dataset (no file at ``path``, a manifest beside it) is described by its manifest.

    Raises:
        NotAPack / UnsupportedVersion / FormatError: the header itself is unreadable.
    """
    manifest_path = manifest_location(path)
    if index_path is None and is_dataset(path):
        manifest = Manifest.load(manifest_path)
        return {
            "ok": True,
            "dataset": shown_url(os.fspath(path)),  # a URL's query (a signature?) is not printed
            "manifest": shown_url(os.fspath(manifest_path)),
            "manifest_version": manifest.version,
            "frame_count": manifest.frame_count,
            "shards": [e.__dict__ for e in manifest.shards],
        }
    # republished while being read (Overtaken): describe the new one
    return until_settled(lambda: _describe_file(path, index_path), os.fspath(path))


def _describe_file(path: str | os.PathLike[str], index_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    storage = open_storage(path)
    try:
        size = storage.size()
        header = Header.decode(storage.read_at(0, HEADER_SIZE), storage.location)
        out: dict[str, Any] = {
            "ok": True,
            "pack": storage.location,
            "pack_bytes": size,
            "header": {
                "magic": MAGIC.hex(" "),
                "format_version": f"{header.version[0]}.{header.version[1]}",
                "uuid": str(header.uuid),
                "created": format_time_us(header.created_us),
                "created_us": header.created_us,
                "alignment": header.alignment,
                "flags": header.flags,
                "compressed": bool(header.flags & FLAG_COMPRESSED),
                "zstd_dict_bytes": None,
                "header_bytes": HEADER_SIZE,
            },
        }
        if header.flags & FLAG_DICT:
            try:
                out["header"]["zstd_dict_bytes"] = len(read_dictionary(storage))
            except FormatError as e:
                out["ok"] = False
                out["problem"] = str(e)
        tail = storage.read_at(size - TRAILER_SIZE, TRAILER_SIZE) if size >= TRAILER_SIZE else b""
        try:
            trailer = Trailer.decode(tail, size, header, storage.location)
            out["complete"] = True
            out["trailer"] = {
                "frame_count": trailer.frame_count,
                "payload_bytes": trailer.payload_bytes,
                "data_end": trailer.data_end,
                "trailer_bytes": TRAILER_SIZE,
            }
        except IncompletePack as e:
            out["ok"] = False
            out["complete"] = False
            out["trailer"] = None
            out["problem"] = str(e)
            trailer = None
        ipath = os.fspath(index_path) if index_path is not None else index_location(os.fspath(path))
        try:
            # the index of this pack (its .partial twin mid-publish: man/hframe.5)
            index, meta = pinned_index(storage, ipath, {str(header.uuid)})
            index.close()
            out["index"] = {"path": index.location, **meta.__dict__}
            if trailer is not None:
                try:
                    meta.check_pack(str(header.uuid), size, trailer.frame_count, ipath)
                except FormatError as e:
                    out["ok"] = False
                    out["index_problem"] = str(e)
        except HframeError as e:
            out["index"] = None
            out["index_problem"] = str(e)
        return out
    finally:
        storage.close()


def frame_head(reader: PackReader | DatasetReader, key: FrameKey, nbytes: int) -> dict[str, Any]:
    """The first ``nbytes`` bytes of a frame, hex-dumped, with where they lie and their type."""
    i = reader.frame_id(key)
    offset, length = reader.range_of(i)
    data = reader.head(i, nbytes)
    row = reader.row(i)
    return {
        "frame_id": i,
        "name": row["name"],
        "offset": offset,
        "length": length,
        "md5": row["md5"],
        "media_type": row["media_type"],
        "codec": row["codec"],
        "sniffed_type": sniff_media_type(data),
        "bytes": len(data),
        "hex": data.hex(" "),
    }
