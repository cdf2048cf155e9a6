"""``FrameDataset`` with a real torch ``DataLoader``: forked workers, batches via read_many,
splits, labels, decoding; checked against the source files decoded independently."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest
from PIL import Image

import hframe_cli as h
from hframe_cli.errors import InputError

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from hframe_cli.training.dataset import FrameDataset  # noqa: E402

SIDE = 12


def tiny_rgb(img: Image.Image) -> torch.Tensor:
    """A picklable transform: RGB, SIDE x SIDE, as a uint8 CHW tensor."""
    rgb = img.convert("RGB").resize((SIDE, SIDE))
    return torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(SIDE, SIDE, 3).permute(2, 0, 1)


def digest(t: torch.Tensor) -> str:
    return hashlib.md5(bytes(t.flatten().tolist())).hexdigest()


@pytest.fixture
def split_pack(photos, tmp_path, cli) -> Path:
    out = tmp_path / "s.hframe"
    r = cli(["pack", str(photos), "-o", str(out), "--split", "train=0.7,val=0.3", "-q"])
    assert r.exit_code == 0, r.stderr
    return out


def test_items_are_the_exact_bytes_with_class_indices(packed, photos):
    ds = FrameDataset(packed)
    files = sorted(p for p in photos.rglob("*") if p.is_file())
    assert len(ds) == len(files) and ds.classes == sorted({p.parent.name for p in files})
    by_name = {str(p.relative_to(photos)): p for p in files}
    for k in range(len(ds)):
        data, target = ds[k]
        name = ds.reader.row(ds.frame_ids[k])["name"]
        assert data == by_name[name].read_bytes()
        assert ds.classes[target] == by_name[name].parent.name
    assert ds[-1] == ds[len(ds) - 1] and ds[-len(ds)] == ds[0]
    for wrong in (len(ds), -len(ds) - 1):
        with pytest.raises(IndexError):
            ds[wrong]
        with pytest.raises(IndexError):
            ds.__getitems__([0, wrong])
    assert ds.__getitems__([-1, 0]) == [ds[len(ds) - 1], ds[0]]
    assert ds.__getitems__([3, 0, 5]) == [ds[3], ds[0], ds[5]]  # one read_many, same items


def test_dataloader_with_forked_workers_yields_every_frame_once(split_pack, photos):
    """Real DataLoader: 2 forked workers, shuffled batches through __getitems__, PIL decode and a
    transform; the (image, label) multiset equals the sources decoded independently."""
    parts = [FrameDataset(split_pack, split=s, decode="pil", transform=tiny_rgb) for s in ("train", "val")]
    assert parts[0].classes == parts[1].classes and len(parts[0]) + len(parts[1]) == 30
    assert set(parts[0].frame_ids).isdisjoint(parts[1].frame_ids)
    got = []
    for ds in parts:
        loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(7))
        for images, targets in loader:
            assert images.shape[1:] == (3, SIDE, SIDE) and images.dtype == torch.uint8
            got += [(digest(img), int(t)) for img, t in zip(images, targets)]
    want = []
    files = sorted(p for p in photos.rglob("*") if p.is_file())
    classes = sorted({p.parent.name for p in files})
    for p in files:
        with Image.open(p) as img:
            want.append((digest(tiny_rgb(img)), classes.index(p.parent.name)))
    assert sorted(got) == sorted(want)


def test_filters_targets_and_decoders(split_pack, photos):
    cats = FrameDataset(split_pack, label="cats", target=None)
    assert len(cats) == 10 and all(isinstance(x, bytes) for x in (cats[0], cats[9]))
    named = FrameDataset(split_pack, match="dogs/*.png", target="name", decode=len)
    assert [t for _, t in (named[k] for k in range(len(named)))] == sorted(
        str(p.relative_to(photos)) for p in (photos / "dogs").glob("*.png")
    )
    assert all(n == (photos / t).stat().st_size for n, t in (named[k] for k in range(len(named))))
    gray = FrameDataset(split_pack, decode="pil", mode="L", target_transform=lambda t: t * 10)
    img, t = gray[0]
    assert img.mode == "L" and t % 10 == 0
    for kwargs, message in (
        ({"decode": "jpeg"}, "decode must be one of"),
        ({"mode": "RGB"}, 'mode and size apply to decode="pil" only'),
        ({"target": "nope"}, "target: unknown column 'nope'"),
        ({"split": "test"}, "no frames selected (split='test')"),
    ):
        with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
            FrameDataset(split_pack, **kwargs)


def test_unlabelled_frames_need_target_none(photos, tmp_path, cli):
    out = tmp_path / "u.hframe"
    assert cli(["pack", str(photos), "-o", str(out), "--label-from", "none", "-q"]).exit_code == 0
    with pytest.raises(InputError, match="30 selected frames have no label"):
        FrameDataset(out)
    assert len(FrameDataset(out, target=None)) == 30


def test_sharded_dataset_and_pickling(photos, tmp_path, cli):
    out = tmp_path / "sh.hframe"
    r = cli(["pack", str(photos), "-o", str(out), "--max-pack-bytes", "40KB", "-q", "--json"])
    assert r.exit_code == 0, r.stderr
    assert len(json.loads(r.stdout).get("shards", [])) > 1, r.stdout
    ds = FrameDataset(out)
    assert len(ds) == 30 and ds.frame_ids == list(range(30))
    with h.open_pack(out) as reader:
        assert [ds[k][0] for k in range(30)] == [reader.read(i) for i in range(30)]
    blob = pickle.dumps(ds)  # what a spawned DataLoader worker receives
    assert len(blob) < 2048, len(blob)  # paths, ids and targets: no index tables, no open files
    clone = pickle.loads(blob)
    assert [clone[k] for k in range(30)] == [ds[k] for k in range(30)]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_memory_mapped_dataset_in_forked_and_spawned_workers(packed, context):
    """memory_map=True reaches the reader, survives the trip to each kind of worker, and every
    frame comes out once with its exact bytes."""
    ds = FrameDataset(packed, target=None, memory_map=True)
    assert ds.reader._map is not None and pickle.loads(pickle.dumps(ds)).reader.memory_map
    with h.open_pack(packed) as reader:
        want = sorted(reader.read(i) for i in range(len(reader)))
    loader = DataLoader(
        ds, batch_size=4, num_workers=2, multiprocessing_context=context, collate_fn=as_list, shuffle=True
    )
    got = sorted(item for batch in loader for item in batch)
    assert got == want


def as_list(batch: list) -> list:
    return batch


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_over_http_reads_every_frame_once_with_the_right_md5(photos, tmp_path, context):
    """A pack behind a URL: 2 workers (forked, or spawned from a pickled dataset) each open their
    own connections; every frame comes back once, byte for byte."""
    from range_server import RangeServer

    h.pack([photos], tmp_path / "p.hframe")
    want = {
        r["frame_id"]: r["md5"]
        for r in h.open_pack(tmp_path / "p.hframe").table.select(["frame_id", "md5"]).to_pylist()
    }
    with RangeServer(tmp_path) as srv:
        ds = FrameDataset(srv.url("p.hframe"), target=None)
        loader = DataLoader(
            ds,
            batch_size=4,
            shuffle=True,
            num_workers=2,
            multiprocessing_context=context,
            generator=torch.Generator().manual_seed(3),
            collate_fn=as_list,
        )
        got = [hashlib.md5(sample).hexdigest() for batch in loader for sample in batch]
    assert sorted(got) == sorted(want.values()) and len(got) == len(want)


def test_size_decodes_jpegs_at_a_reduced_scale_and_resizes_exactly(tmp_path):
    """size=: a JPEG much larger than asked is decoded in draft mode (1/4 here: Pillow reports
    the reduced size before decoding) and comes out at exactly the size asked, close to a full
    decode resized; a PNG (no draft mode) is decoded whole and resized alike."""
    from conftest import make_image

    from hframe_cli.training.dataset import _resized

    src = tmp_path / "src"
    make_image(src / "big.jpg", (800, 600), "RGB", 1)
    make_image(src / "big.png", (800, 600), "RGB", 2)
    img = Image.open(src / "big.jpg")
    out = _resized(img, 100, "RGB")
    assert img.size == (200, 150) and out.size == (133, 100)  # decoded at 1/4 (1/8 is too small); shorter side 100
    h.pack([src], tmp_path / "p.hframe")
    ds = FrameDataset(tmp_path / "p.hframe", decode="pil", mode="RGB", size=(64, 48), target=None)
    for k in range(len(ds)):
        got = ds[k]
        assert got.size == (64, 48) and got.mode == "RGB"
        full = Image.open(src / ds.reader.row(ds.frame_ids[k])["name"]).convert("RGB").resize((64, 48))
        diff = sum(abs(a - b) for a, b in zip(got.tobytes(), full.tobytes())) / len(full.tobytes())
        assert diff < 12, diff  # the same picture (draft decoding differs in detail only)
    with pytest.raises(InputError, match="size"):
        FrameDataset(tmp_path / "p.hframe", decode="pil", size=0)
    with pytest.raises(InputError, match='decode="pil"'):
        FrameDataset(tmp_path / "p.hframe", size=64)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_with_a_cache_and_read_ahead_makes_no_frame_request_in_epoch_two(tmp_path, context):
    """Remote pack, node cache, the sampler's read-ahead, 2 workers (forked or spawned): every
    frame of each epoch comes once, byte for byte; epoch 2 asks the server for no frame (what
    the workers send is opening the pack again)."""
    from range_server import RangeServer

    from hframe_cli.training.sampler import BlockShuffleSampler

    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for i in range(48):  # (2 MB: more than opening the pack reads)
        (blobs / f"{i:02d}.bin").write_bytes(bytes([i]) * 100 + os.urandom(40_000))
    h.pack([blobs], tmp_path / "p.hframe")
    with h.open_pack(tmp_path / "p.hframe") as p:
        want = sorted(p.read(i) for i in range(len(p)))
    with RangeServer(tmp_path) as srv:
        ds = FrameDataset(srv.url("p.hframe"), target=None, cache_dir=tmp_path / "cache")
        sampler = BlockShuffleSampler(ds, seed=2, block=4, window=2, read_ahead=16, read_ahead_batch=4)
        loader = DataLoader(
            ds, batch_size=4, sampler=sampler, num_workers=2, multiprocessing_context=context, collate_fn=as_list
        )
        asked = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            before = srv.requests["/p.hframe"]
            got = sorted(item for batch in loader for item in batch)
            asked.append(srv.requests["/p.hframe"] - before)
            assert got == want
            assert sampler.ahead is not None and sampler.ahead.error is None and sampler.ahead.fetched > 0
    assert asked[0] > 10 and asked[1] <= 2 * 3, asked  # (epoch 2: each worker's opening requests at most)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def kept_after_freeing() -> int:
    """Bytes glibc keeps at the top of its heap after 40 MiB of 1 MiB buffers are freed: all of
    them where freed heap is kept, a trim's leftover where not."""
    blobs = [bytearray(1 << 20) for _ in range(40)]
    del blobs
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().keepcost)


def _heap_probe(batch):
    return kept_after_freeing()


def test_a_spawned_dataloader_worker_keeps_its_freed_heap(packed, monkeypatch):
    """A batch is hundreds of new bytes freed together: a worker that gave them back to the
    kernel would fault every page in again the next batch. A spawned worker (a new interpreter:
    its heap says what glibc does) keeps them; with HFRAME_MALLOC=0 it does not."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc 2.33 or later")
    ds = FrameDataset(packed, target=None)
    kept = {}
    for setting in ("1", "0"):
        with monkeypatch.context() as m:
            m.setenv("HFRAME_MALLOC", setting)  # (a spawned worker starts with this environment)
            loader = DataLoader(
                ds, batch_size=4, num_workers=1, collate_fn=_heap_probe, multiprocessing_context="spawn"
            )
            kept[setting] = next(iter(loader))
    assert kept["1"] >= 32 << 20 and kept["0"] < 8 << 20, kept


def test_a_forked_dataloader_worker_asks_to_keep_its_heap_and_the_training_process_never(packed, tmp_path, monkeypatch):
    """Forked workers (their heap is the parent's, so it cannot say): each asks glibc once, at
    its first batch; the process that made the DataLoader never does; HFRAME_MALLOC=0 or a
    malloc threshold in the environment means none does."""
    import hframe_cli.training.dataset as dataset_mod

    def spy() -> bool:
        (tmp_path / f"asked-{os.getpid()}").touch()
        return True

    monkeypatch.setattr(dataset_mod, "keep_freed_heap", spy)
    ds = FrameDataset(packed, target=None)
    asked = {}
    for env in ({}, {"HFRAME_MALLOC": "0"}, {"MALLOC_TRIM_THRESHOLD_": "1000000"}):
        for f in tmp_path.glob("asked-*"):
            f.unlink()
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            loader = DataLoader(
                ds, batch_size=2, num_workers=2, collate_fn=lambda b: os.getpid(), multiprocessing_context="fork"
            )
            pids = set(loader)
        asked[tuple(env)] = {int(f.name.split("-")[1]) for f in tmp_path.glob("asked-*")}
        if not env:
            assert asked[()] == pids and len(pids) == 2 and os.getpid() not in pids
    assert asked[("HFRAME_MALLOC",)] == set() and asked[("MALLOC_TRIM_THRESHOLD_",)] == set()
    ds.__getitems__([0, 1])  # (here, in the training process: never asked)
    assert not (tmp_path / f"asked-{os.getpid()}").exists()
