"""``BlockShuffleSampler``: the order a training job reads a pack in, random enough to train on
and local enough that cold reads coalesce; split by rank, resumable mid-epoch.

::

    from torch.utils.data import DataLoader
    from hframe_cli.training import BlockShuffleSampler, FrameDataset

    ds = FrameDataset("photos.hframe", decode="pil")
    sampler = BlockShuffleSampler(ds, seed=0)          # rank and world size from torch.distributed
    loader = DataLoader(ds, batch_size=256, sampler=sampler, num_workers=8)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader: ...

The order of one epoch (same for a given seed, epoch, length, world size and settings, in every
process): the items are cut into blocks of ``block`` neighbours (items of one shard only, for a
sharded dataset); the shards' order is shuffled, then the order of the blocks inside each shard;
then the items of each run of ``window`` consecutive blocks are shuffled among themselves. A
batch therefore draws from a few windows of neighbouring frames, and its reads merge into few
large ones (``read_many`` coalesces them) instead of one seek per frame. ``block=1, window=1``
is a plain shuffle of the items.

Ranks: the epoch's order is cut into ``world_size`` contiguous, equal parts and rank ``r`` takes
part ``r``. With ``drop_last=False`` (default) the order is first padded with its own first
items up to a multiple of ``world_size`` (as ``DistributedSampler`` does: a few items are seen
twice); with ``drop_last=True`` the last ``len % world_size`` items of the order are left out of
that epoch. Either way every rank gets the same number of items and, without padding, every
item is in exactly one rank's part.

Resuming: ``state_dict(consumed=N)`` records how far this rank got: N items taken by the
training loop since this iteration began (a DataLoader reads ahead of the batches it has handed
out, so pass ``batches_done * batch_size`` of the current loop; without it, the items this
sampler yielded are counted). ``load_state_dict`` makes the next ``__iter__`` go on with exactly
the items that rank had not seen (``len()`` is then what is left), then epochs start from the
beginning again; ``set_epoch`` to another epoch starts that one from its beginning. The state of
a finished epoch loads as the start of the next one (epoch + 1, whole), so a checkpoint taken at
an epoch's end resumes with the next epoch whether ``set_epoch`` comes before or after loading.
torchdata's ``StatefulDataLoader`` calls ``state_dict()`` and ``load_state_dict`` itself, as
the batch it hands out was drawn (so without the read-ahead): ``loader.state_dict()`` is all a
checkpoint needs.
torch is optional: the class derives from ``torch.utils.data.Sampler`` when torch is there.

Imports inside functions: ``torch.distributed``, only to ask for the rank and world size (torch
is optional).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .readahead import READ_AHEAD_RUN, ReadAhead

if TYPE_CHECKING:
    _Base = object
else:
    try:
        from torch.utils.data import Sampler as _Base
    except ImportError:  # torch is optional
        _Base = object

__all__ = ["BlockShuffleSampler"]

STATE_VERSION = 1


class BlockShuffleSampler(_Base):
    """Block-local shuffle of the items of ``data_source``, this rank's equal part of it.

    Args:
        data_source: a ``FrameDataset``, a reader (``open_pack``), or a length.
        block: neighbouring items per block (the unit whose order is shuffled).
        window: consecutive blocks whose items are shuffled among themselves. With
            ``block * window`` about the batch size, a batch is read in about ``window`` runs
            (measured on 20,000 blobs, batches of 256: 4 reads with 64 x 4, 30 with 64 x 8 and
            1.6x the bytes, 243 for a plain shuffle); a larger window mixes more and reads more.
        seed: the seed of every epoch's order (with the epoch number).
        shuffle: False keeps the items in order (still split by rank).
        rank, world_size: this process's part; default from ``torch.distributed`` when it is
            initialised, else 0 and 1.
        drop_last: leave out the last items instead of padding (see the module docstring).
        read_ahead: items past the last one handed out to fetch into the node cache in the
            background (``readahead.py``; 0: none): a ``FrameDataset`` of a remote pack with a
            cache only. A few batches' worth (``8 * batch_size``) keeps a remote epoch's
            workers reading from local disk. The last ``read_ahead // 2`` items handed out are
            fetched too (a DataLoader's queue: handed out, not yet read).
        read_ahead_batch: items per background fetch (the batch size is a good choice).
        read_ahead_in_flight: requests the read-ahead keeps in flight (its reader's, in the
            sampler's process; the workers keep their own ``HFRAME_IO_IN_FLIGHT`` each).
        read_ahead_run: bytes one read-ahead request may cover (0: the frames asked for only).
            A frame's request also takes the pack's next frames that this epoch reads later
            (and the cache lacks), up to this many bytes from its start: bytes the epoch
            fetches anyway, in fewer requests. A shuffled order asks for frames scattered
            over the pack, one request each, which is the cost of a remote epoch; this
            turns it into runs. The cache must hold the epoch's frames for that to pay (as
            it must for the next epoch to be read from it); what a fetch adds is fetched
            and kept about 8 MiB at a time.
    """

    def __init__(
        self,
        data_source: Any,
        *,
        block: int = 64,
        window: int = 4,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        read_ahead: int = 0,
        read_ahead_batch: int = 256,
        read_ahead_in_flight: int = 64,
        read_ahead_run: int = READ_AHEAD_RUN,
    ) -> None:
        if block < 1 or window < 1:
            raise InputError(f"block and window must be at least 1 (got {block}, {window})")
        self.n = data_source if isinstance(data_source, int) else len(data_source)
        if self.n < 1:
            raise InputError("nothing to sample: the data source is empty")
        rank, world_size = _distributed(rank, world_size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise InputError(f"rank must be in 0..world_size-1 (got rank {rank}, world size {world_size})")
        if drop_last and self.n < world_size:
            raise InputError(f"{self.n} items cannot give each of {world_size} ranks one with drop_last")
        self.block, self.window, self.seed, self.shuffle = block, window, seed, shuffle
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        #: item ranges [start, end) that blocks never straddle (a sharded dataset's shards)
        self.groups = _groups(data_source, self.n)
        if read_ahead < 0 or read_ahead_batch < 1 or read_ahead_run < 0:
            raise InputError("read_ahead and read_ahead_run must be at least 0 and read_ahead_batch at least 1")
        if read_ahead and not getattr(data_source, "caches", False):
            raise InputError(
                "read_ahead needs a FrameDataset of a remote pack with a node cache "
                "(cache_dir=... or HFRAME_CACHE_DIR): the workers find what it fetched there"
            )
        self.read_ahead, self.read_ahead_batch = read_ahead, read_ahead_batch
        self._fill = getattr(data_source, "fill_ahead", None) if read_ahead else None
        self._widen = getattr(data_source, "widen", None) if read_ahead else None
        self._frames_of = getattr(data_source, "frames_of", None) if read_ahead else None
        self.read_ahead_in_flight, self.read_ahead_run = read_ahead_in_flight, read_ahead_run
        #: the current iteration's read-ahead (None: none, or none running)
        self.ahead: ReadAhead | None = None
        self.epoch = 0
        self._yielded = 0  # items of the epoch's part handed out (a resumed iteration's skip included)
        self._start = 0  # where the current iteration began in the part (after a resume: its offset)
        self._resume_at = 0  # items of this rank's part the next iteration skips (load_state_dict)

    # -- the order -----------------------------------------------------------------------------

    def order(self, epoch: int | None = None) -> list[int]:
        """Every item, in this epoch's order (the same in every process)."""
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return list(range(self.n))
        rng = random.Random(f"hframe-sampler:{self.seed}:{epoch}")  # a str seed: no hash randomisation
        groups = list(self.groups)
        rng.shuffle(groups)  # shards first
        blocks: list[range] = []
        for start, end in groups:
            mine = [range(a, min(a + self.block, end)) for a in range(start, end, self.block)]
            rng.shuffle(mine)  # then the blocks inside each shard
            blocks += mine
        out: list[int] = []
        for w in range(0, len(blocks), self.window):
            items = [i for b in blocks[w : w + self.window] for i in b]
            rng.shuffle(items)  # then the items of a window of blocks
            out += items
        return out

    def part(self, epoch: int | None = None) -> list[int]:
        """This rank's items of the epoch, in order."""
        order = self.order(epoch)
        per = self._part_len()
        if not self.drop_last and per * self.world_size > self.n:
            pad = per * self.world_size - self.n
            order += (order * (pad // self.n + 1))[:pad]
        return order[self.rank * per : (self.rank + 1) * per]

    def _part_len(self) -> int:
        return self.n // self.world_size if self.drop_last else -(-self.n // self.world_size)

    def __len__(self) -> int:
        """The items the next iteration yields: this rank's part, less what a resume skips."""
        return self._part_len() - self._resume_at

    def __iter__(self) -> Iterator[int]:
        items = self.part()
        start, self._resume_at = self._resume_at, 0
        self._start = self._yielded = start  # from now: state_dict() counts this iteration
        return self._walk(items, start)

    def _walk(self, items: list[int], start: int) -> Iterator[int]:
        if self._fill is None:
            for i in items[start:]:
                self._yielded += 1
                yield i
            return
        if self._widen is not None:  # (here: after a DataLoader forked its workers, which keep their own)
            self._widen(self.read_ahead_in_flight)
        # (fetches of a batch at once: enough to keep the reader's requests in flight busy)
        ahead = self.ahead = ReadAhead(
            self._fill,
            items[start:],
            ahead=self.read_ahead,
            batch=self.read_ahead_batch,
            in_flight=4,
            frames_of=self._frames_of,
            run=self.read_ahead_run,
            behind=self.read_ahead // 2,
        )
        try:
            for n, i in enumerate(items[start:], 1):
                self._yielded += 1
                ahead.handed_out(n)  # (before the item goes: read-ahead knows it is handed out)
                yield i
        finally:  # the epoch's end, or the iteration dropped (set_epoch, a break): stop fetching
            ahead.stop()

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's order from the next iteration on (call it before each epoch). Another
        epoch than a resumed state's starts from its beginning."""
        if epoch != self.epoch:
            self._resume_at = self._yielded = self._start = 0
        self.epoch = epoch

    # -- resuming ------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where this rank is in the epoch. ``consumed``: the items the training loop took since
        this iteration began (``batches_done * batch_size`` of this loop; a resumed iteration's
        skipped items are added here). Default: the items this sampler yielded, which a
        DataLoader's read-ahead makes more than were trained on."""
        done = self._yielded if consumed is None else self._start + consumed
        if consumed is not None and consumed < 0 or not 0 <= done <= self._part_len():
            raise InputError(f"consumed must be in 0..{self._part_len() - self._start} (got {consumed})")
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "consumed": done,
            "seed": self.seed,
            "n": self.n,
            "rank": self.rank,
            "world_size": self.world_size,
            "block": self.block,
            "window": self.window,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "groups": len(self.groups),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on where ``state`` was taken: same epoch, the items not yet consumed next (a finished
        epoch: the next epoch, whole)."""
        if state.get("version") != STATE_VERSION:
            raise InputError(f"sampler state version {state.get('version')!r}: this release reads {STATE_VERSION}")
        mine = self.state_dict(0)
        differ = [
            k
            for k in ("n", "seed", "rank", "world_size", "block", "window", "shuffle", "drop_last", "groups")
            if state.get(k) != mine[k]
        ]
        if differ:
            raise InputError(
                "sampler state is for another run ("
                + ", ".join(f"{k} {state.get(k)!r} vs {mine[k]!r}" for k in differ)
                + "): the order would not be the same"
            )
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self._part_len():
            raise InputError(f"sampler state: consumed {consumed} is not in 0..{self._part_len()}")
        if consumed == self._part_len():  # that epoch is over: the next one, from its beginning
            self.epoch = int(state["epoch"]) + 1
            self._resume_at = self._yielded = self._start = 0
            return
        self.epoch = int(state["epoch"])
        self._resume_at = self._yielded = self._start = consumed


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """The rank and world size given, else torch.distributed's, else 0 and 1."""
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank() if rank is None else rank), (
                dist.get_world_size() if world_size is None else world_size
            )
    except ImportError:
        pass
    return (0 if rank is None else rank), (1 if world_size is None else world_size)


def _groups(source: Any, n: int) -> Sequence[tuple[int, int]]:
    """Item ranges of one shard each (a ``FrameDataset`` or reader over a sharded dataset), else
    one range of all items."""
    reader = getattr(source, "reader", source)
    starts = getattr(reader, "shard_starts", None)
    if not starts or len(starts) < 2:
        return [(0, n)]
    ids = getattr(source, "frame_ids", None)  # a FrameDataset's items are these frame ids
    if ids is None:
        ids = range(n)
    shard = [bisect.bisect_right(starts, f) - 1 for f in ids]
    groups: list[tuple[int, int]] = []
    a = 0
    for k in range(1, n + 1):
        if k == n or shard[k] != shard[a]:
            groups.append((a, k))
            a = k
    return groups
