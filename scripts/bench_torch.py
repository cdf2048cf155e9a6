#!/usr/bin/env python3
"""Benchmark a PyTorch DataLoader over ``FrameDataset`` against the same loader over loose files.

Usage: python scripts/bench_torch.py DATA_DIR [--frames 8192] [--batch 256] [--workers 2]
       [--repeat 3] [--seed 1] [--decode] [--decode-size 224]

DATA_DIR holds ``jpegs/`` (``scripts/make_bench_data.py``) and ``_bench_out/jpegs.hframe``,
the pack of that folder (``scripts/bench_pack.py``). ``--frames`` frames are drawn at random
(seeded) and both methods load exactly those, in the same shuffled order, through
``torch.utils.data.DataLoader(batch_size=--batch, num_workers=--workers)`` (forked workers):

* ``hframe``: ``FrameDataset(pack, target=None)``; each batch is one ``read_many`` (``__getitems__``);
* ``loose``:  a minimal map-style dataset whose ``__getitem__`` opens, reads and closes a file
  (what ``ImageFolder`` does before decoding);
* ``hframe_in_process`` / ``loose_in_process`` (information only): the same batches read in
  this process without a DataLoader, so without its worker start-up and the pickling of every
  sample through worker queues, which both loaders pay alike.

Samples are the raw bytes (the collate function returns the list) unless ``--decode``, which
decodes every JPEG with Pillow in both (then decoding dominates both equally).

Cold: before every timed run the pack, its index and every loose file are evicted from the page
cache (``posix_fadvise(DONTNEED)``); warm: one untimed run first. Methods alternate run by run;
the median is reported. Correctness: both loaders return the same bytes (checked once).

* ``hframe_read_in_workers`` / ``loose_read_in_workers``: the same loaders, but the workers hand
  only each item's length to the main process. With raw bytes, the worker-to-main pipe (every
  byte pickled through it: about 0.35 s of hframe's 0.46 s for 8,192 JPEGs, warm, on 2 cores) is
  paid alike by both methods and caps their ratio; a job that decodes in its workers ships
  tensors (shared memory) instead, so this row is what the storage layout changes for it.

* ``hframe_block_local``: as many frames in ``BlockShuffleSampler``'s order (block 64, window 4),
  against ``hframe`` (a random sample): what a block-local shuffle buys a cold epoch.

With ``--decode-size N``, also (warm) JPEGs decoded to N px (shorter side) by
``FrameDataset(decode="pil", size=N)`` (Pillow's draft mode) against a full decode and resize.

Targets (reported, not enforced): cold frames/s, hframe ÷ loose ≥ 2 (the product's reason to be),
with raw bytes shipped and with the read in the workers; block-local ÷ random ≥ 1.5; warm is
reported without one.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench_pack import verdict

from hframe_cli.storage.access import evict_from_page_cache
from hframe_cli.training.dataset import FrameDataset
from hframe_cli.training.sampler import BlockShuffleSampler

try:
    import torch
    from torch.utils.data import DataLoader
except ImportError:  # pragma: no cover - the script needs torch
    sys.exit("bench_torch.py needs torch: pip install 'hframe[torch]'")


class LooseFiles:
    """The baseline: one open/read/close per item."""

    def __init__(self, paths: list[str], decode: bool) -> None:
        self.paths, self.decode = paths, decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, k: int) -> Any:
        with open(self.paths[k], "rb") as f:
            data = f.read()
        return _pil(data) if self.decode else data


class Sizes:
    """A dataset whose workers read (and decode) every item but hand only its length to the
    main process: the read path inside DataLoader workers, without the worker-to-main pipe that
    carries every raw byte (a job that decodes and augments in its workers ships tensors instead)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, k: int) -> Any:
        return len(self.ds[k])

    def __getitems__(self, ks: list[int]) -> list[Any]:
        if hasattr(self.ds, "__getitems__"):
            return [len(x) for x in self.ds.__getitems__(ks)]
        return [len(self.ds[k]) for k in ks]


def _pil(data: bytes) -> Any:
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.load()
    return img.size


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


def epoch(ds: Any, order: list[int], batch: int, workers: int) -> list[Any]:
    loader = DataLoader(ds, batch_size=batch, sampler=order, num_workers=workers, collate_fn=_as_list)
    out: list[Any] = []
    for b in loader:
        out.extend(b)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir")
    ap.add_argument("--frames", type=int, default=8192, help="frames loaded per run")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--decode", action="store_true", help="decode JPEGs with Pillow in both")
    ap.add_argument(
        "--decode-size", type=int, default=0, help="also: decode to this size, draft mode vs full decode (warm)"
    )
    args = ap.parse_args()
    pack = os.path.join(args.data_dir, "_bench_out", "jpegs.hframe")
    folder = os.path.join(args.data_dir, "jpegs")
    for p in (pack, folder):
        if not os.path.exists(p):
            ap.error(f"{p} not found: run scripts/make_bench_data.py and scripts/bench_pack.py first")

    ds = FrameDataset(pack, target=None, decode=_pil if args.decode else None)
    names = ds.reader.table.column("name").to_pylist()
    paths = [os.path.join(folder, n) for n in names]
    loose = LooseFiles(paths, args.decode)
    order = random.Random(args.seed).sample(range(len(ds)), min(args.frames, len(ds)))
    if not args.decode:
        small = order[:512]
        if epoch(ds, small, args.batch, args.workers) != epoch(loose, small, args.batch, args.workers):
            raise SystemExit("hframe and loose files returned different bytes")
    print(
        f"bench=torch frames={len(order)} batch={args.batch} workers={args.workers} decode={args.decode} "
        f"cpus={os.cpu_count()} load1={os.getloadavg()[0]:.2f} torch={torch.__version__}",
        flush=True,
    )
    files = [pack, pack + ".index.parquet", *[paths[k] for k in order]]
    batches = [order[i : i + args.batch] for i in range(0, len(order), args.batch)]
    # the same number of frames in a block-local order (BlockShuffleSampler's defaults: one rank's
    # contiguous share of an epoch), against the random order above
    block_order = BlockShuffleSampler(ds, seed=args.seed, rank=0, world_size=1).part()[: len(order)]
    files += [paths[k] for k in block_order]
    block_batches = [block_order[i : i + args.batch] for i in range(0, len(block_order), args.batch)]
    methods: dict[str, Callable[[], list[Any]]] = {
        "hframe": lambda: epoch(ds, order, args.batch, args.workers),
        "hframe_block_local": lambda: epoch(ds, block_order, args.batch, args.workers),
        "loose": lambda: epoch(loose, order, args.batch, args.workers),
        # read in the workers, only the lengths sent to the main process
        "hframe_read_in_workers": lambda: epoch(Sizes(ds), order, args.batch, args.workers),
        "loose_read_in_workers": lambda: epoch(Sizes(loose), order, args.batch, args.workers),
        # the same batches without a DataLoader (no worker processes, no IPC): the read path alone
        "hframe_in_process": lambda: [x for b in batches for x in ds.__getitems__(b)],
        "hframe_block_local_in_process": lambda: [x for b in block_batches for x in ds.__getitems__(b)],
        "loose_in_process": lambda: [loose[k] for b in batches for k in b],
    }
    med: dict[tuple[str, str], float] = {}
    for mode in ("cold", "warm"):
        if mode == "warm":
            for fn in methods.values():
                fn()
        walls: dict[str, list[float]] = {m: [] for m in methods}
        for r in range(1, args.repeat + 1):
            for name, fn in methods.items():
                if mode == "cold":
                    for f in files:
                        evict_from_page_cache(f)
                t0 = time.perf_counter()
                got = fn()
                wall = time.perf_counter() - t0
                assert len(got) == len(order)
                walls[name].append(wall)
                print(f"bench=torch mode={mode} method={name} run={r} wall_s={wall:.3f}", flush=True)
        for name, w in walls.items():
            med[mode, name] = statistics.median(w)
            print(
                f"bench=torch mode={mode} method={name} wall_s_median={med[mode, name]:.3f} "
                f"frames_per_s={len(order) / med[mode, name]:.0f}",
                flush=True,
            )
    verdict("hframe_vs_loose", med["cold", "loose"] / med["cold", "hframe"], 2.0, True, " mode=cold")
    verdict(
        "block_local_vs_random_sampler",
        med["cold", "hframe"] / med["cold", "hframe_block_local"],
        1.5,
        True,
        " mode=cold",
    )
    verdict(
        "hframe_vs_loose_read_in_workers",
        med["cold", "loose_read_in_workers"] / med["cold", "hframe_read_in_workers"],
        2.0,
        True,
        " mode=cold",
    )
    print(f"hframe_vs_loose={med['warm', 'loose'] / med['warm', 'hframe']:.3f} mode=warm target=none")
    for mode in ("cold", "warm"):
        ratio = med[mode, "loose_in_process"] / med[mode, "hframe_in_process"]
        print(f"hframe_vs_loose_in_process={ratio:.3f} mode={mode} target=none (no DataLoader: the read path alone)")
        ratio = med[mode, "hframe_in_process"] / med[mode, "hframe_block_local_in_process"]
        print(f"block_local_vs_random_in_process={ratio:.3f} mode={mode} target=none (no DataLoader)")
    if args.decode_size:
        decode_sizes(pack, order, args)
    return 0


def _full_then_resize(size: int) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        from PIL import Image

        img = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = img.size
        scale = size / min(w, h)
        return img.resize((max(1, round(w * scale)), max(1, round(h * scale)))).size

    return decode


class _Sizes:
    """Items as their decoded size only (what crosses the worker queue stays small)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, k: int) -> Any:
        return self.ds[k].size


def decode_sizes(pack: str, order: list[int], args: Any) -> None:
    """Warm: frames/s decoding every JPEG to --decode-size (shorter side) with draft mode
    (``FrameDataset(size=...)``) against a full decode then the same resize."""
    draft = _Sizes(FrameDataset(pack, target=None, decode="pil", mode="RGB", size=args.decode_size))
    full = FrameDataset(pack, target=None, decode=_full_then_resize(args.decode_size))
    some = order[: min(len(order), 2048)]
    runs: dict[str, list[float]] = {"draft": [], "full": []}
    for ds in (draft, full):
        epoch(ds, some[:256], args.batch, args.workers)  # warm
    for _ in range(args.repeat):
        for name, ds in (("draft", draft), ("full", full)):
            t0 = time.perf_counter()
            got = epoch(ds, some, args.batch, args.workers)
            runs[name].append(time.perf_counter() - t0)
            assert len(got) == len(some)
    for name, w in runs.items():
        print(
            f"bench=torch mode=warm decode={name} size={args.decode_size} frames_per_s={len(some) / statistics.median(w):.0f}"
        )
    print(
        f"draft_vs_full_decode={statistics.median(runs['full']) / statistics.median(runs['draft']):.3f} "
        f"size={args.decode_size} target=none"
    )


if __name__ == "__main__":
    sys.exit(main())
