"""verify's compiled loop over sound frames (``hframe_cli/verify/_walk.c``) gives exactly the
answer of the Python loop it stands in for (``Verifier.clean_run``), on sound packs and on packs
with a byte flipped anywhere (issue 35)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_image, real_media, run_bin

import hframe_cli.verify.walk as walk_mod
from hframe_cli.format.layout import HEADER_SIZE, MEDIA_TYPES, expected_magic
from hframe_cli.verify import compiled
from hframe_cli.verify.columns import IndexCols

pytestmark = pytest.mark.skipif(
    compiled.walk is None, reason="the compiled part is not built here (or HFRAME_NATIVE=0)"
)
MAGICS = {m: expected_magic(m) for m in MEDIA_TYPES}


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    """Blobs of many sizes (empty too), names that are not ASCII, images of ours and made by
    others (their magic bytes checked), one frame compressed (it stops a clean run)."""
    src = tmp_path_factory.mktemp("walk") / "src"
    rng = random.Random(5)
    for i in range(400):
        p = src / f"d{i % 4}" / f"{i:04d}-é.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(rng.choice([0, 1, 40, 700, 3000])))
    for i in range(4):
        make_image(src / "img" / f"{i}.png", (16 + i, 9 + i), "RGB", i)
        make_image(src / "img" / f"{i}.jpg", (16 + i, 9 + i), "L", i)
    (src / "real").mkdir()
    for i, p in enumerate(real_media()[:12]):
        shutil.copyfile(p, src / "real" / f"{i:02d}-{p.name}")
    (src / "text.txt").write_bytes(b"compress me " * 400)
    out = src.parent / "w.hframe"
    r = run_bin(["pack", str(src), "-o", str(out), "-q", "--allow-empty", "--compress", "zstd"])
    assert r.returncode == 0, r.stderr
    return out


def _runs(wb: bytes, ws: int, idx: IndexCols, start: tuple[int, int], stop: int, end: int, monkeypatch):
    """(C answer, Python answer) of ``clean_run`` from (pos, frame) ``start``."""
    magics = [MAGICS.get(m) for m in idx.media]
    seen = []
    me = SimpleNamespace(on_progress=lambda frames, nbytes: seen.append((frames, nbytes)))
    answers = []
    for loop in (compiled.walk, None):
        monkeypatch.setattr(walk_mod, "walk", loop)
        answers.append((walk_mod.Verifier.clean_run(me, wb, ws, *start, stop, end, idx, magics, 0), list(seen)))
        seen.clear()
    return answers


def test_it_walks_a_sound_pack_as_python_does(pack, monkeypatch):
    idx = IndexCols.from_table(IndexCols.read(f"{pack}.index.parquet"))
    data = pack.read_bytes()
    n = len(idx.offset)
    c, py = _runs(data, 0, idx, (HEADER_SIZE, 0), n, len(data) - 64, monkeypatch)
    assert c == py and c[0][1] > 300  # a long run, up to the compressed frame
    rng = random.Random(1)
    for _ in range(60):  # windows of the pack (a chunk in memory), runs from any frame in them
        i = rng.randrange(n)
        ws = idx.record_offset[max(0, i - rng.randrange(3))] - rng.randrange(2)
        we = min(len(data), ws + rng.randrange(100, 60_000))
        start = (idx.record_offset[i], i)
        stop = rng.choice([n, min(n, i + rng.randrange(1, 50))])
        c, py = _runs(data[ws:we], ws, idx, start, stop, rng.choice([len(data) - 64, we]), monkeypatch)
        assert c == py, (i, ws, we)


def test_it_stops_where_python_does_at_any_flipped_byte(pack, monkeypatch):
    idx = IndexCols.from_table(IndexCols.read(f"{pack}.index.parquet"))
    data = pack.read_bytes()
    n = len(idx.offset)
    rng = random.Random(2)
    # every byte of the first records (headers, names, padding, magic, payload), then anywhere
    spots = list(range(HEADER_SIZE, idx.offset[3] + 40)) + [
        rng.randrange(HEADER_SIZE, len(data) - 64) for _ in range(300)
    ]
    (sound_end, sound_frames, _), _ = _runs(data, 0, idx, (HEADER_SIZE, 0), n, len(data) - 64, monkeypatch)[0]
    for at in spots:
        damaged = bytearray(data)
        damaged[at] ^= 1 << rng.randrange(8)
        c, py = _runs(bytes(damaged), 0, idx, (HEADER_SIZE, 0), n, len(data) - 64, monkeypatch)
        assert c == py, at
        if at < sound_end:  # every byte the run passes is checked (CRC, name, padding, md5): it stops
            assert c[0][1] < sound_frames and c[0][0] <= at, at


def test_columns_as_lists_or_arrays_give_the_same_answer(pack, monkeypatch):
    idx = IndexCols.from_table(IndexCols.read(f"{pack}.index.parquet"))
    data = pack.read_bytes()
    as_lists = IndexCols(
        **{
            k: (list(v) if k in ("offset", "length", "record_offset", "raw_length", "mtime_us") else v)
            for k, v in vars(idx).items()
        }
    )
    n = len(idx.offset)
    a = _runs(data, 0, idx, (HEADER_SIZE, 0), n, len(data) - 64, monkeypatch)
    b = _runs(data, 0, as_lists, (HEADER_SIZE, 0), n, len(data) - 64, monkeypatch)
    assert a == b and a[0] == a[1]
