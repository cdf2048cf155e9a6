"""A PyTorch ``Dataset`` over a pack or a sharded dataset, on the same reader as everything else.

::

    from torch.utils.data import DataLoader
    from hframe_cli.training import FrameDataset

    train = FrameDataset("photos.hframe", split="train", decode="pil", transform=to_tensor)
    loader = DataLoader(train, batch_size=256, shuffle=True, num_workers=8)

An item is ``(sample, target)``:

- sample: the frame's exact bytes; or, with ``decode="pil"``, the image decoded by Pillow
  (converted to ``mode`` if given); or whatever a ``decode(data)`` callable returns; then passed
  through ``transform``;
- target: with ``target="label"`` (the default) the index of the frame's label in ``classes``,
  the sorted labels of the *whole* pack, so that every split numbers the classes alike; with
  ``target=None`` there is none and an item is the sample alone; any other index column name
  gives that column's value.

A DataLoader batch is read through ``__getitems__``: one ``read_many`` (coalesced, parallel
range reads) per batch instead of one read per item.

The dataset is fork- and spawn-safe: the reader reopens its file in each process (fork) and
pickles as its path (spawn).

In a DataLoader worker (a process torch made to run the dataset; never the process that made
the DataLoader), the first batch asks glibc to keep freed memory rather than give it back to
the kernel (``processes.keep_freed_heap``): a batch is hundreds of new ``bytes`` freed
together, and by default glibc trims them off its heap after every batch and the next batch
faults every page in again (a warm epoch of 34 KB JPEGs from the node cache: 72-84 thousand
frames/s a worker's steady rate before, 200-240 thousand after; from a local pack 125-145 →
200-285 thousand). ``HFRAME_MALLOC=0`` leaves malloc alone, as does a ``MALLOC_TOP_PAD_``,
``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_MMAP_THRESHOLD_`` set in the environment. torch itself is optional here: the class derives from
``torch.utils.data.Dataset`` when torch is installed and from ``object`` otherwise (a map-style
dataset is ``__len__`` plus ``__getitem__``), and importing ``hframe_cli`` never imports this
module.

Imports inside functions: Pillow, only when frames are decoded to images.
"""

from __future__ import annotations

import io
import operator
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..format.index import select_rows
from ..processes import keep_freed_heap, may_keep_freed_heap
from ..read.dataset import open_pack

if TYPE_CHECKING:
    _Base = object
else:
    try:
        from torch.utils.data import Dataset as _Base
    except ImportError:  # torch is optional: any map-style consumer works with object
        _Base = object

__all__ = ["FrameDataset"]

_DECODERS = ("bytes", "pil")


class FrameDataset(_Base):
    """The frames of a pack (or sharded dataset) selected by ``split``/``label``/``kind``/``match``.

    Args:
        path: a pack, or the output name of a sharded dataset (``NAME.dataset.json`` beside it).
        split, label, kind: keep only frames with this split / label / kind (as ``hframe index``).
        match: keep only frames whose name matches this glob.
        decode: ``"bytes"`` (default), ``"pil"``, or a callable ``decode(data) -> sample``.
        mode: with ``decode="pil"``, convert every image to this Pillow mode (for example "RGB").
        size: with ``decode="pil"``, resize every image: an int makes its shorter side that long
            (aspect kept, as torchvision's ``Resize(int)``), a (width, height) pair makes it that
            size. A JPEG to be shrunk is decoded at a reduced scale first (Pillow's draft mode:
            1/2, 1/4 or 1/8, never below the size asked), which is most of the decoding saved.
        transform: applied to each sample after decoding.
        target: ``"label"`` (class index), ``None`` (samples only) or an index column name.
        target_transform: applied to each target.
        workers: read threads per ``read_many`` (default: the reader's own choice per batch).
        memory_map: read a local pack through a memory map (``PackReader``): for small frames
            read warm; a pack truncated in place while mapped then kills the worker (SIGBUS).
        cache_dir, cache_limit: a remote pack's node-local cache (``PackReader``; default
            ``HFRAME_CACHE_DIR``): epochs after the first read its frames from local disk, and
            every DataLoader worker and rank on the node shares it.

    Raises:
        InputError: an unknown ``decode``, ``target`` column or filter value, an empty
            selection, or frames without a label when ``target="label"``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        split: str | None = None,
        label: str | None = None,
        kind: str | None = None,
        match: str | None = None,
        decode: str | Callable[[bytes], Any] | None = None,
        mode: str | None = None,
        size: int | tuple[int, int] | None = None,
        transform: Callable[[Any], Any] | None = None,
        target: str | None = "label",
        target_transform: Callable[[Any], Any] | None = None,
        workers: int | None = None,
        memory_map: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        _check_decoding(decode, mode, size)
        self.path = os.fspath(path)
        options: dict[str, Any] = {"cache_dir": cache_dir, "cache_limit": cache_limit} if cache_dir is not None else {}
        self.reader = open_pack(path, workers=workers, memory_map=memory_map, **options)
        table = self.reader.table
        if target is not None and target not in table.column_names:
            raise InputError(f"target: unknown column {target!r} (columns: {', '.join(table.column_names)})")
        labels = table.column("label").to_pylist()
        #: the sorted labels of the whole pack; a target is an index into this list
        self.classes: list[str] = sorted({x for x in labels if x is not None})
        self.class_to_idx: dict[str, int] = {c: k for k, c in enumerate(self.classes)}
        chosen = self._select(table, target, {"split": split, "label": label, "kind": kind}, match)
        #: the frame ids (global for a sharded dataset) of the items, in order
        self.frame_ids: list[int] = chosen.column("frame_id").to_pylist()
        self.targets: list[Any] | None = self._targets(chosen, target)
        self.decode = decode
        self.mode = mode
        self.size = size
        self.transform = transform
        self.target_transform = target_transform
        self._pid = os.getpid()  # (a batch in another process: a DataLoader worker's heap kept, once)

    def _select(self, table: Any, target: str | None, equal: dict[str, str | None], match: str | None) -> Any:
        """The rows the filters choose (an error if none), with the columns the items need."""
        columns = list(dict.fromkeys(["frame_id", "name", *([target] if target is not None else [])]))
        chosen = select_rows(table, columns, name_glob=match, equal=equal)
        if chosen.num_rows == 0:
            wanted = ", ".join(f"{k}={v!r}" for k, v in [*equal.items(), ("match", match)] if v)
            raise InputError(f"{self.path}: no frames selected ({wanted or 'the pack is empty'})")
        return chosen

    def _targets(self, chosen: Any, target: str | None) -> list[Any] | None:
        """Each item's target: its label's index in ``classes`` (every chosen frame must have a
        label), another column's value, or none."""
        if target is None:
            return None
        if target != "label":
            return chosen.column(target).to_pylist()  # type: ignore[no-any-return]
        names = chosen.column("name").to_pylist()
        values = chosen.column("label").to_pylist()
        missing = [n for n, v in zip(names, values) if v is None]
        if missing:
            raise InputError(
                f"{self.path}: {len(missing)} selected frames have no label (first: {missing[0]!r}); "
                "pack with --label-from, or use target=None"
            )
        return [self.class_to_idx[v] for v in values]

    def __len__(self) -> int:
        return len(self.frame_ids)

    def _position(self, index: Any, n: int) -> int:
        """Item ``index`` (negative from the end) of ``n`` as a position (``n``: ``len(self)``,
        taken once per batch: this runs for every item of every batch)."""
        k = operator.index(index)  # ints, numpy and torch integers
        if 0 <= k < n:
            return k
        if -n <= k < 0:
            return k + n
        raise IndexError(f"index {k} out of range for {n} items")

    def _item(self, k: int, data: bytes) -> Any:
        sample: Any = data
        if self.decode == "pil":
            from PIL import Image

            img = Image.open(io.BytesIO(data))
            if self.size is not None:
                img = _resized(img, self.size, self.mode)
            sample = img.convert(self.mode) if self.mode is not None and img.mode != self.mode else img
            sample.load()
        elif callable(self.decode):
            sample = self.decode(data)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.targets is None:
            return sample
        target = self.targets[k]
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __getitem__(self, index: Any) -> Any:
        k = self._position(index, len(self.frame_ids))
        return self._item(k, self.reader.read(self.frame_ids[k]))

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        """A DataLoader batch: every frame read in one ``read_many``."""
        if getattr(self, "_pid", -1) != os.getpid():
            self._pid = os.getpid()
            _worker_keeps_heap()
        n, position, frame_ids = len(self.frame_ids), self._position, self.frame_ids
        ks = [position(i, n) for i in indices]
        datas = self.reader.read_many([frame_ids[k] for k in ks])
        return [self._item(k, data) for k, data in zip(ks, datas)]

    @property
    def caches(self) -> bool:
        """Whether the frames are read through a node cache (a remote pack with ``cache_dir``)."""
        return bool(getattr(self.reader, "caches", False))

    def widen(self, in_flight: int) -> None:
        """Allow this process's reader ``in_flight`` requests at once (``PackReader.widen``)."""
        widen = getattr(self.reader, "widen", None)
        if widen is not None:
            widen(in_flight)

    def fill_ahead(self, indices: Sequence[Any], *, later: Sequence[int] | None = None, run: int = 0) -> int:
        """Fetch the frames of these items into the node cache without reading them back
        (``BlockShuffleSampler``'s read-ahead). Returns how many were fetched. ``later`` (a mask
        over frame ids, the frames the epoch reads later) and ``run``: each fetch also takes the
        pack's next frames that the mask holds, up to ``run`` bytes (``PackReader.fill_cache``)."""
        return int(self.reader.fill_cache(self.frames_of(indices), later=later, run=run))

    def frames_of(self, indices: Iterable[Any]) -> list[int]:
        """The frame ids (of the pack, or of the dataset's shards in turn) of these items."""
        frame_ids, position, n = self.frame_ids, self._position, len(self.frame_ids)
        return [frame_ids[position(i, n)] for i in indices]

    def __repr__(self) -> str:
        return f"FrameDataset({self.path!r}, {len(self)} frames, {len(self.classes)} classes)"


def _worker_keeps_heap() -> None:
    """In a DataLoader worker, keep freed heap (``keep_freed_heap``; see the module's notes),
    unless ``HFRAME_MALLOC=0`` or the environment sets malloc's thresholds itself."""
    if not may_keep_freed_heap():
        return
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return
    if get_worker_info() is not None:
        keep_freed_heap()


def _check_decoding(
    decode: str | Callable[[bytes], Any] | None, mode: str | None, size: int | tuple[int, int] | None
) -> None:
    """Refuse a decoder, mode or size ``FrameDataset`` cannot apply, before the pack is opened."""
    if decode is not None and not callable(decode) and decode not in _DECODERS:
        raise InputError(f"decode must be one of {', '.join(_DECODERS)} or a callable (got {decode!r})")
    if (mode is not None or size is not None) and decode != "pil":
        raise InputError('mode and size apply to decode="pil" only')
    if size is not None and not (
        (isinstance(size, int) and size > 0)
        or (isinstance(size, tuple) and len(size) == 2 and all(isinstance(x, int) and x > 0 for x in size))
    ):
        raise InputError(f"size must be a positive int or a (width, height) pair (got {size!r})")


def _resized(img: Any, size: int | tuple[int, int], mode: str | None) -> Any:
    """``img`` at ``size`` (see ``FrameDataset``): decoded at the smallest JPEG scale that is
    still at least that big (``draft``), then resized exactly."""
    w, h = img.size
    if isinstance(size, int):
        scale = size / min(w, h)
        target = (max(1, round(w * scale)), max(1, round(h * scale)))
    else:
        target = size
    if target[0] < w and target[1] < h:
        img.draft(mode or img.mode, target)  # JPEG only; other formats ignore it
    img = img.convert(mode) if mode is not None and img.mode != mode else img
    return img if img.size == target else img.resize(target, reducing_gap=None)
