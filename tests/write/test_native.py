"""The compiled packing loop (``hframe_cli/write/_blobs.c``): built where it can be, and byte for
byte the pure-Python path's output, or it declines the chunk (issue 35)."""

from __future__ import annotations

import os
import re
import shutil
import sysconfig
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_image, real_media, run_bin, same_pack
from hypothesis import given, settings
from hypothesis import strategies as st

import hframe_cli.write.parallel as fanout
from hframe_cli.format.index import IndexMeta
from hframe_cli.format.layout import KIND_IDS, MAX_NAME_BYTES, sniff_media_type
from hframe_cli.sources.inputs import collect_sources
from hframe_cli.sources.media import FramePrep, MediaOptions
from hframe_cli.verify.compiled import walk
from hframe_cli.write import compiled
from hframe_cli.write.loading import STREAM_ABOVE
from hframe_cli.write.writer import ChunkWriter

blobs = compiled.blobs
needs_it = pytest.mark.skipif(blobs is None, reason="the compiled part is not built here (or HFRAME_NATIVE=0)")
CREATED = ["--created", "1700000000"]
BLOB, IMAGE = KIND_IDS["blob"], KIND_IDS["image"]


def _images(where: Path) -> list[tuple[Path, bool]]:
    """Images of ours and made by others, and whether the compiled loop takes each: JPEG and
    PNG whose header ``imagehead`` reads without Pillow."""
    from hframe_cli.sources import imagehead

    where.mkdir(parents=True, exist_ok=True)
    ours = []
    for i, (mode, ext) in enumerate([("RGB", "png"), ("L", "jpg"), ("RGBA", "png"), ("P", "png"), ("CMYK", "jpg")]):
        make_image(where / f"{i}.{ext}", (20 + i, 11 + i), mode, i)
        ours.append(where / f"{i}.{ext}")
    (where / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    ours.append(where / "broken.jpg")
    out = []
    for p in [*ours, *real_media()]:
        data = p.read_bytes()
        media = sniff_media_type(data[:18])
        fast = imagehead._jpeg(data) if media == "jpeg" else imagehead._png(data) if media == "png" else None
        out.append((p, fast is not None and max(fast[:2]) < 2**31))
    assert any(t for _, t in out) and not all(t for _, t in out)
    return out


def test_it_is_built_where_a_compiler_and_the_headers_are():
    """pip builds it as optional: a broken build would pass unnoticed, every pack in Python."""
    if os.environ.get("HFRAME_NATIVE", "1") == "0":
        assert blobs is None
        return
    headers = Path(sysconfig.get_paths()["include"], "Python.h").exists()
    if not (headers and (shutil.which("cc") or shutil.which("gcc"))):
        pytest.skip("no C compiler or Python headers on this machine: hframe packs in Python")
    assert blobs is not None, "a C compiler is here, yet hframe_cli/write/_blobs.c was not built"
    assert walk is not None, "a C compiler is here, yet hframe_cli/verify/_walk.c was not built"
    r = run_bin(["--version"])
    assert r.returncode == 0 and re.search(
        rb" \(compiled: list, pack, verify, md5 x16 (avx512f|avx2|baseline)\)\n$", r.stdout
    )


@needs_it
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_its_crc32_is_zlibs(data, start):
    assert blobs.crc32(data, start) == zlib.crc32(data, start)


SIGNATURES = [
    b"\xff\xd8\xff",
    b"\x89PNG\r\n\x1a\n",
    b"GIF87a",
    b"GIF89a",
    b"BM" + bytes(12) + (40).to_bytes(4, "little"),
    b"II*\x00",
    b"MM\x00*",
    b"RIFF\x00\x00\x00\x00WEBP",
]


@needs_it
@settings(max_examples=500, deadline=None)
@given(st.sampled_from([b"", *SIGNATURES]), st.binary(max_size=24), st.integers(0, 24))
def test_it_sniffs_as_the_layout_does(prefix, tail, cut):
    """Signatures, their prefixes cut short, and what follows them, random or not."""
    for head in (prefix + tail, (prefix + tail)[:cut], tail, prefix[:cut]):
        assert blobs.media_known(head) == (sniff_media_type(head[:18]) != "unknown"), head


def _tree(root: Path) -> Path:
    """Blobs of every small size (empty included), names that are not UTF-8 or not ASCII, in
    nested folders (labels), the way a listing sorts them."""
    for i in range(300):
        p = root / f"c{i % 3}" / ("sub" if i % 5 == 0 else "") / f"{i:04d}-é.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(i % 7) + bytes([i % 256]) * (i * 13 % 5000))
    with open(os.path.join(os.fsencode(root / "c0"), b"caf\xe9.bin"), "wb") as f:
        f.write(b"latin-1 name")
    (root / "top.bin").write_bytes(b"at the top, no label")
    return root


def _written(sources, first: int, end: int, native: bool, monkeypatch, path: Path, start: int, first_frame: int):
    """The bytes and chunk ``_add_sources`` makes of sources first..end-1, written at ``start``
    with frame ids from ``first_frame`` (``ChunkWriter.write_at``)."""
    monkeypatch.setattr(fanout, "blobs", blobs if native else None)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = ChunkWriter(fd, path)
        problems: list = []
        fanout._add_sources(chunk, sources, first, end, FramePrep(MediaOptions()), False, problems)
        assert problems == [] and len(chunk) == end - first
        done = chunk.write_at(start, first_frame)
    finally:
        os.close(fd)
    return path.read_bytes()[start:], done


@needs_it
def test_a_chunk_of_blobs_is_the_python_paths_chunk(tmp_path, monkeypatch):
    srcs = collect_sources([str(_tree(tmp_path / "src"))], allow_empty=True)
    n = len(srcs)
    calls = []
    monkeypatch.setattr(ChunkWriter, "add_records", _spy(ChunkWriter.add_records, calls))
    for first, end, start, frame in [(0, n, 128, 0), (7, 140, 4096 + 3, 1234567), (n - 1, n, 10**7, 2**40)]:
        a, wa = _written(srcs, first, end, True, monkeypatch, tmp_path / "a.bin", start, frame)
        b, wb = _written(srcs, first, end, False, monkeypatch, tmp_path / "b.bin", start, frame)
        assert a == b and len(a) == wa.size
        meta = IndexMeta("1.1", "1", "0" * 32, "t", end - first, 1, 1, 1, "x")
        assert wa.rows.to_table(meta).equals(wb.rows.to_table(meta))
        assert (wa.digest_input, wa.payload_bytes, wa.size) == (wb.digest_input, wb.payload_bytes, wb.size)
    assert len(calls) == 3  # the compiled loop took each chunk, the Python one none


@needs_it
def test_a_chunk_with_images_is_the_python_paths_chunk(tmp_path, monkeypatch):
    """JPEG and PNG images among the blobs, ours and made by others: the same records (their
    size and mode in the header's extra), rows (width, height, mode) and digest input."""
    src = _tree(tmp_path / "src")
    taken = [p for p, t in _images(tmp_path / "img") if t]
    for i, p in enumerate(taken):
        shutil.copyfile(p, src / f"c{i % 3}" / f"{i:04d}-img-{p.name}")
    srcs = collect_sources([str(src)], allow_empty=True)
    n = len(srcs)
    calls = []
    monkeypatch.setattr(ChunkWriter, "add_records", _spy(ChunkWriter.add_records, calls))
    for first, end, start, frame in [(0, n, 128, 0), (n // 3, n - 5, 77, 99)]:
        a, wa = _written(srcs, first, end, True, monkeypatch, tmp_path / "a.bin", start, frame)
        b, wb = _written(srcs, first, end, False, monkeypatch, tmp_path / "b.bin", start, frame)
        assert a == b and len(a) == wa.size
        meta = IndexMeta("1.1", "1", "0" * 32, "t", end - first, 1, 1, 1, "x")
        table = wa.rows.to_table(meta)
        assert table.equals(wb.rows.to_table(meta))
        assert table.column("width").null_count < table.num_rows  # images are there, and described
        assert (wa.digest_input, wa.payload_bytes, wa.size, wa.extras) == (
            wb.digest_input,
            wb.payload_bytes,
            wb.size,
            True,
        )
    assert len(calls) == 2


def _spy(method, calls):
    def spied(self, *args, **kw):
        calls.append(args[0][:1])
        return method(self, *args, **kw)

    return spied


@needs_it
def test_it_declines_what_is_not_a_plain_blob_as_listed(tmp_path):
    srcs = collect_sources([str(_tree(tmp_path / "src"))], allow_empty=True)
    paths, names, sizes, mtimes = (list(c) for c in srcs.columns())
    n = len(paths)

    def read(paths=paths, names=names, sizes=sizes, mtimes=mtimes, max_size=STREAM_ABOVE, first=0, end=n, meta=True):
        return blobs.read_chunk(paths, sizes, mtimes, names, first, end, MAX_NAME_BYTES, max_size, BLOB, IMAGE, meta)

    assert read() is not None
    k = n // 2
    assert read(sizes=sizes[:k] + [sizes[k] + 1] + sizes[k + 1 :]) is None  # changed size
    assert read(mtimes=mtimes[:k] + [mtimes[k] + 1] + mtimes[k + 1 :]) is None  # touched since listed
    assert read(paths=paths[:k] + [paths[k] + ".gone"] + paths[k + 1 :]) is None  # vanished
    assert read(paths=paths[:k] + [paths[k] + "\0member"] + paths[k + 1 :]) is None  # a located source
    assert read(names=names[:k] + [b"x" * (MAX_NAME_BYTES + 1)] + names[k + 1 :]) is None
    assert read(max_size=max(sizes) - 1) is None  # one file to stream
    assert read(first=1) is not None
    grown = Path(paths[0])
    grown.write_bytes(grown.read_bytes() + b"!")
    os.utime(grown, ns=(mtimes[0], mtimes[0]))  # the same mtime, one byte more than listed
    assert read() is None and read(first=1) is not None
    # images: JPEG and PNG with a header it reads are taken; other formats, headers the Python
    # path would ask Pillow about, and images without their metadata (--no-image-meta) are not
    for image, taken in _images(tmp_path / "img"):
        shutil.copyfile(image, paths[0])
        st0 = os.stat(paths[0])
        listed = {"sizes": [st0.st_size, *sizes[1:]], "mtimes": [st0.st_mtime_ns, *mtimes[1:]]}
        assert (read(**listed) is not None) == taken, image
        assert read(**listed, meta=False) is None or sniff_media_type(Path(image).read_bytes()[:18]) == "unknown"
    with pytest.raises(ValueError):
        blobs.read_chunk(paths, sizes[:-1], mtimes, names, 0, n, MAX_NAME_BYTES, STREAM_ABOVE, BLOB, IMAGE, 1)
    with pytest.raises(ValueError):
        blobs.number(bytearray(10), (0).to_bytes(8, "little"), 0)


@needs_it
def test_hframe_pack_takes_the_compiled_loop_to_the_same_pack(tmp_path):
    """The command end to end, with workers: the same bytes with and without the compiled
    loop, and no worker fell back (a worker that raises is replaced by the one-writer loop,
    silently but for an event: the pack would be right, and the compiled loop never used)."""
    src = tmp_path / "src"
    for i in range(5000):
        p = src / f"d{i // 1000}" / f"{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(100 + i % 3000))
    for i, real in enumerate(real_media()[:20]):  # chunks with images take the Python path
        shutil.copyfile(real, src / "d2" / f"{i:05d}-{real.name}")
    out, ref = tmp_path / "n.hframe", tmp_path / "p.hframe"
    r = run_bin(["pack", str(src), "-o", str(out), "--workers", "2", *CREATED])
    assert r.returncode == 0, r.stderr
    assert b"worker stopped" not in r.stderr, r.stderr
    r = run_bin(["pack", str(src), "-o", str(ref), "--workers", "2", *CREATED], env={"HFRAME_NATIVE": "0"})
    assert r.returncode == 0, r.stderr
    assert same_pack(out, ref)
    t = pq.read_table(f"{out}.index.parquet")
    assert t.num_rows == 5000 + len(real_media()[:20])
    assert run_bin(["verify", str(out), "-q"]).returncode == 0


def test_without_it_packing_runs_in_python(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(50):
        (src / f"{i}.bin").write_bytes(os.urandom(300))
    r = run_bin(["--version"], env={"HFRAME_NATIVE": "0"})
    assert r.stdout.endswith(b" (compiled: none (HFRAME_NATIVE=0))\n")
    r = run_bin(
        ["pack", str(src), "-o", str(tmp_path / "p.hframe"), "--workers", "2", "-q"], env={"HFRAME_NATIVE": "0"}
    )
    assert r.returncode == 0, r.stderr
    assert run_bin(["verify", str(tmp_path / "p.hframe"), "-q"]).returncode == 0
