"""md5 of many frames side by side (``hframe_cli/format/md5x.h`` through ``_md5x.c``, ``format.hashing``): the
digests are hashlib's, bit for bit, in every build this CPU can run (AVX-512, AVX2, baseline),
at every length around md5's block and padding boundaries, with lanes refilled while others
are still hashing (issue 35)."""

from __future__ import annotations

import hashlib
import mmap
import random

import pytest

from hframe_cli.format import hashing

md5x = hashing.md5x
needs_md5x = pytest.mark.skipif(md5x is None, reason="the compiled part is not built here (or HFRAME_NATIVE=0)")


def _builds() -> list[int]:
    return list(range(md5x.isa() + 1)) if md5x is not None else []


def _frames(rng: random.Random) -> list:
    data = rng.randbytes(300_000)
    view = memoryview(data)
    frames: list = [data[:n] for n in range(0, 200)]  # every length of 0-3 blocks and their padding
    frames += [data[7 : 7 + n] for n in (255, 256, 257, 4095, 4096, 4097, 65536)]  # unaligned starts
    frames += [view[rng.randrange(1000) :][: rng.randrange(0, 120_000)] for _ in range(100)]
    frames += [bytearray(rng.randbytes(rng.randrange(0, 5000))) for _ in range(20)]
    return frames


@needs_md5x
@pytest.mark.parametrize("build", _builds())
def test_every_build_gives_hashlibs_digests_at_every_length(build):
    rng = random.Random(build)
    frames = _frames(rng)
    rng.shuffle(frames)
    assert md5x.md5_each(frames, build) == [hashlib.md5(f).digest() for f in frames]


@needs_md5x
@pytest.mark.parametrize("build", _builds())
def test_lanes_refilled_beside_a_long_frame_and_fewer_frames_than_lanes(build):
    """One long frame keeps its lane for the whole call while the other 15 take short frames one
    after another; and calls with 0, 1 and 15 frames leave lanes idle throughout."""
    rng = random.Random(7)
    long = rng.randbytes(1 << 20)
    frames = [long] + [rng.randbytes(rng.randrange(0, 300)) for _ in range(2000)] + [long[:99_999]]
    assert md5x.md5_each(frames, build) == [hashlib.md5(f).digest() for f in frames]
    for n in (0, 1, 15, 16, 17):
        assert md5x.md5_each(frames[1 : 1 + n], build) == [hashlib.md5(f).digest() for f in frames[1 : 1 + n]]


@needs_md5x
def test_slices_of_a_map_and_the_best_build_by_default(tmp_path):
    rng = random.Random(3)
    path = tmp_path / "pack"
    path.write_bytes(rng.randbytes(1 << 20))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        view = memoryview(m)
        spans = sorted((a, a + rng.randrange(0, 50_000)) for a in rng.sample(range(900_000), 300))
        frames = [view[a:b] for a, b in spans]
        assert md5x.md5_each(frames) == [hashlib.md5(m[a:b]).digest() for a, b in spans]
        del frames, view


@needs_md5x
def test_a_build_this_cpu_cannot_run_is_refused_and_non_buffers_raise():
    with pytest.raises(TypeError):
        md5x.md5_each([b"abc", "not bytes"])
    if md5x.isa() < len(md5x.ISAS) - 1:
        with pytest.raises(ValueError, match="cannot run"):
            md5x.md5_each([b"abc"], len(md5x.ISAS) - 1)


def test_md5_each_without_the_compiled_part_gives_the_same_digests(monkeypatch):
    rng = random.Random(11)
    frames = _frames(rng)
    want = [hashlib.md5(f).digest() for f in frames]
    assert hashing.md5_each(frames) == want
    monkeypatch.setattr(hashing, "md5x", None)
    assert hashing.md5_each(frames) == want
