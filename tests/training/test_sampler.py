"""BlockShuffleSampler: every item once per epoch across ranks, deterministic, block-local (reads
coalesce), resumable mid-epoch; and a real 2-process torch.distributed (gloo) run over a pack
and over a sharded dataset."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import hframe_cli as h
from hframe_cli.errors import InputError
from hframe_cli.read.reader import ReadStats
from hframe_cli.training.sampler import BlockShuffleSampler


@pytest.mark.parametrize("n", [1, 7, 64, 1000, 1003])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_item_once_per_epoch_across_ranks_in_equal_parts(n, world):
    for drop_last in (False, True):
        if drop_last and n < world:
            with pytest.raises(InputError):
                BlockShuffleSampler(n, rank=0, world_size=world, drop_last=True)
            continue
        parts = [
            list(BlockShuffleSampler(n, rank=r, world_size=world, drop_last=drop_last, block=8, window=3, seed=5))
            for r in range(world)
        ]
        lengths = {len(p) for p in parts}
        assert len(lengths) == 1  # equal parts
        seen = [i for p in parts for i in p]
        if drop_last:
            assert len(seen) == n - n % world and len(set(seen)) == len(seen)
        else:
            assert set(seen) == set(range(n)) and len(seen) == -(-n // world) * world
            assert len(seen) - len(set(seen)) == len(seen) - n  # only the padding repeats


def test_the_order_is_a_function_of_seed_and_epoch_only():
    a = BlockShuffleSampler(5000, seed=1, rank=0, world_size=1)
    b = BlockShuffleSampler(5000, seed=1, rank=0, world_size=1)
    assert list(a) == list(b) and sorted(a.order()) == list(range(5000))
    a.set_epoch(1)
    assert list(a) != list(b) and sorted(list(a)) == list(range(5000))
    assert list(BlockShuffleSampler(5000, seed=2, rank=0, world_size=1)) != list(b)
    # another process (another hash seed) computes the same order
    code = "from hframe_cli.training.sampler import BlockShuffleSampler as S; print(list(S(5000, seed=1, rank=0, world_size=1))[:50])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONHASHSEED": "77"})
    assert out.stdout.strip() == str(list(b)[:50])


def test_the_order_is_block_local():
    """Consecutive items are close: each window of blocks spans few distinct blocks."""
    s = BlockShuffleSampler(100_000, block=64, window=8, seed=3, rank=0, world_size=1)
    order = s.order()
    for k in range(0, 10_000, 512):  # any 512 consecutive items touch about 8 blocks of 64
        assert len({i // 64 for i in order[k : k + 512]}) <= 16
    plain = BlockShuffleSampler(100_000, block=1, window=1, seed=3, rank=0, world_size=1).order()
    assert len({i // 64 for i in plain[:512]}) > 300  # a plain shuffle touches a block per item


def test_resuming_after_k_items_gives_exactly_the_rest():
    for world, rank, k in ((1, 0, 0), (1, 0, 333), (3, 2, 100), (4, 1, 250)):
        s = BlockShuffleSampler(1003, seed=9, rank=rank, world_size=world, block=16, window=4)
        s.set_epoch(4)
        full = list(s)
        it = iter(s)
        first = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(s.state_dict()))  # survives a checkpoint file
        assert state["consumed"] == k and first == full[:k]
        again = BlockShuffleSampler(1003, seed=9, rank=rank, world_size=world, block=16, window=4)
        again.load_state_dict(state)
        assert list(again) == full[k:]
        assert list(again) == full  # the next iteration is a whole epoch again
    with pytest.raises(InputError, match="another run"):
        BlockShuffleSampler(1003, seed=10, rank=0, world_size=1).load_state_dict(
            BlockShuffleSampler(1003, seed=9, rank=0, world_size=1).state_dict()
        )


def test_shards_are_blocks_boundaries_in_a_dataset(photos, tmp_path):
    h.pack([photos], tmp_path / "ds.hframe", max_pack_bytes=20_000)
    with h.open_pack(tmp_path / "ds.hframe") as d:
        s = BlockShuffleSampler(d, block=4, window=1, seed=0, rank=0, world_size=1)
        assert len(s.groups) == len(d.shard_paths) > 2
        starts = d.shard_starts
        shard = [max(j for j, st in enumerate(starts) if st <= i) for i in s.order()]
        # one window a block: each shard's items come as one run (blocks never straddle shards)
        assert sum(a != b for a, b in zip(shard, shard[1:])) == len(starts) - 1


def _blob_pack(tmp_path: Path, n: int, sizes: tuple[int, int], seed: int) -> Path:
    """``n`` random blobs named 0000.bin... packed into ``tmp_path/p.hframe``; their folder."""
    rng = random.Random(seed)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        (src / f"{i:04d}.bin").write_bytes(rng.randbytes(rng.randrange(*sizes)))
    h.pack([src], tmp_path / "p.hframe")
    return src


def test_block_local_batches_coalesce_into_fewer_reads(tmp_path):
    _blob_pack(tmp_path, 4000, (1000, 4000), seed=0)
    with h.open_pack(tmp_path / "p.hframe") as p:
        calls = {}
        for name, sampler in (
            ("block", BlockShuffleSampler(p, block=64, window=4, seed=1, rank=0, world_size=1)),
            ("random", BlockShuffleSampler(p, block=1, window=1, seed=1, rank=0, world_size=1)),
        ):
            order = list(sampler)
            stats = ReadStats()
            for k in range(0, 2560, 256):
                p.read_many(order[k : k + 256], stats=stats)
            calls[name] = stats.read_calls / 10
        assert calls["block"] * 5 <= calls["random"], calls  # measured: about 8 vs 250 reads a batch


# -- a real 2-process torch.distributed run --------------------------------------------------------

WORKER = r"""
import hashlib, json, sys
import torch.distributed as dist
from torch.utils.data import DataLoader
from hframe_cli.training.sampler import BlockShuffleSampler
from hframe_cli.training.dataset import FrameDataset

path, port, rank, out, skip = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
ds = FrameDataset(path, target=None)
sampler = BlockShuffleSampler(ds, block=4, window=2, seed=11)  # rank and world size from torch.distributed
sampler.set_epoch(3)
if skip:  # a job restarted after `skip` batches of 4
    first = BlockShuffleSampler(ds, block=4, window=2, seed=11)
    first.set_epoch(3)
    sampler.load_state_dict(first.state_dict(consumed=skip * 4))
loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=lambda b: b)
got = [hashlib.md5(x).hexdigest() for batch in loader for x in batch]
json.dump({"rank": rank, "items": list(sampler.part())[skip * 4:], "md5": got}, open(out, "w"))
dist.barrier()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(path: Path, tmp_path: Path, skip: int = 0) -> list[dict]:
    pytest.importorskip("torch")
    port = _free_port()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    outs = [tmp_path / f"rank{r}-{skip}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(path), str(port), str(r), str(outs[r]), str(skip)], stderr=subprocess.PIPE
        )
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err.decode()[-2000:]
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.parametrize("sharded", [False, True])
def test_two_ranks_read_every_frame_exactly_once_with_the_right_bytes(photos, tmp_path, sharded):
    out = tmp_path / "p.hframe"
    h.pack([photos], out, **({"max_pack_bytes": 20_000} if sharded else {}))
    with h.open_pack(out) as p:
        want = p.table.column("md5").to_pylist()
        assert len(want) % 2 == 0  # 30 photos: no padding, so exactly once
    ranks = _run_ranks(out, tmp_path)
    items = [i for r in ranks for i in r["items"]]
    assert sorted(items) == list(range(len(want)))  # each frame exactly once across the ranks
    for r in ranks:
        assert r["md5"] == [want[i] for i in r["items"]]  # the right bytes, in the sampler's order
    resumed = _run_ranks(out, tmp_path, skip=2)  # restarted after 2 batches: exactly the rest
    for before, after in zip(ranks, resumed):
        assert after["items"] == before["items"][8:] and after["md5"] == before["md5"][8:]


def test_the_state_of_a_finished_epoch_resumes_with_the_next_epoch_whole():
    s = BlockShuffleSampler(100, seed=1, rank=0, world_size=1)
    s.set_epoch(3)
    list(s)
    state = s.state_dict()  # taken at the end of epoch 3
    epoch4 = s.order(4)
    for set_first in (False, True):  # set_epoch before loading (torchdata loads lazily) or after
        t = BlockShuffleSampler(100, seed=1, rank=0, world_size=1)
        if set_first:
            t.set_epoch(4)
        t.load_state_dict(state)
        if not set_first:
            t.set_epoch(4)
        assert t.epoch == 4 and list(t) == epoch4
    t = BlockShuffleSampler(100, seed=1, rank=0, world_size=1)
    t.load_state_dict(state)
    assert list(t) == epoch4  # without set_epoch too


def test_consumed_counts_from_where_a_resumed_iteration_began():
    full = list(BlockShuffleSampler(100, seed=2, rank=0, world_size=1))
    s = BlockShuffleSampler(100, seed=2, rank=0, world_size=1)
    s.load_state_dict({**s.state_dict(0), "consumed": 40})
    assert len(s) == 60  # what the resumed iteration yields
    it = iter(s)
    got = [next(it) for _ in range(20)]  # two batches of 10 of this loop
    state = s.state_dict(consumed=20)
    assert state["consumed"] == 60 and got == full[40:60]
    u = BlockShuffleSampler(100, seed=2, rank=0, world_size=1)
    u.load_state_dict(state)
    assert list(u) == full[60:]
    for bad in (-5, 101):
        with pytest.raises(InputError, match="consumed"):
            BlockShuffleSampler(100, seed=2, rank=0, world_size=1).load_state_dict({**state, "consumed": bad})


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_with_exactly_the_rest(tmp_path, workers):
    """StatefulDataLoader takes the sampler's state itself (no ``consumed=``): the state of the
    batch it last handed out, not of its workers' read-ahead; a restart twice over still fits."""
    pytest.importorskip("torchdata.stateful_dataloader")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from hframe_cli.training.dataset import FrameDataset

    src = _blob_pack(tmp_path, 300, (100, 2000), seed=3)

    def loader():
        ds = FrameDataset(tmp_path / "p.hframe", target=None)
        sampler = BlockShuffleSampler(ds, block=8, window=2, seed=5, rank=0, world_size=1)
        sampler.set_epoch(2)
        dl = StatefulDataLoader(ds, batch_size=10, sampler=sampler, num_workers=workers, collate_fn=_as_list)
        return sampler, dl

    def take(dl, batches=None):
        it = iter(dl)
        got = []
        for k, batch in enumerate(it):
            got += batch
            if batches is not None and k + 1 == batches:
                break
        return got, dl.state_dict()

    sampler, dl = loader()
    full, _ = take(dl)
    assert sorted(full) == sorted((src / f).read_bytes() for f in sorted(p.name for p in src.iterdir()))
    _, dl = loader()
    first, state = take(dl, 7)  # a job stopped after 7 batches
    _, dl = loader()
    dl.load_state_dict(state)
    second, state = take(dl, 5)  # restarted, stopped again after 5 more
    sampler, dl = loader()
    dl.load_state_dict(state)
    rest, _ = take(dl)
    assert first + second + rest == full  # exactly the frames not yet seen, in the epoch's order
    assert len(first) == 70 and len(second) == 50
    sampler.set_epoch(3)  # the next epoch is whole again
    nxt, state = take(dl)
    assert sorted(nxt) == sorted(full) and nxt != full
    # a checkpoint at the end of an epoch; the restarted job sets the next epoch, then iterates
    # (torchdata applies the loaded state only then): that next epoch, whole, in its own order
    sampler, dl = loader()
    dl.load_state_dict(state)
    sampler.set_epoch(4)
    after, _ = take(dl)
    want = [(src / f"{i:04d}.bin").read_bytes() for i in BlockShuffleSampler(300, block=8, window=2, seed=5).order(4)]
    assert after == want


def _as_list(batch):
    return batch


def test_read_ahead_fetches_the_queued_items_handed_out_never_earlier_ones():
    """What read-ahead may fetch next: from the last ``behind`` items handed out (a
    DataLoader's queue, not yet read) to ``ahead`` past the last one, never earlier (those are
    being read), and nothing once stopped. Its fills here block until the test ends (only the
    rule is looked at; the sampler passes ``behind = read_ahead // 2``)."""
    import threading

    from hframe_cli.training.readahead import ReadAhead

    release = threading.Event()
    asked: list[list[int]] = []

    def fill(chunk):
        asked.append(list(chunk))
        release.wait(30)

    ra = ReadAhead(fill, list(range(1000)), ahead=24, batch=8, in_flight=1, behind=12)
    try:
        ra.handed_out(100)
        assert ra._next(0) == 100 - 12  # the queued 12, not the 88 before them
        assert ra._next(95) == 95  # (fetched up to there already: on from it)
        ra.handed_out(990)
        assert ra._next(0) == 978
        assert ReadAhead(fill, list(range(10)), ahead=4, behind=0)._next(0) == 0  # nothing handed out yet
        never = ReadAhead(fill, list(range(1000)), ahead=24, batch=8, in_flight=1)
        never.handed_out(100)
        assert never._next(0) == 100  # behind=0: none of those handed out
        never.stop(0)
        ra.stop(0)
        assert ra._next(990) is None
    finally:
        release.set()
    assert asked and all(len(c) <= 8 for c in asked)
