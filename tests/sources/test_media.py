"""Video frames (PyAV), image metadata (Pillow), labels and splits, through the real ``hframe``.

Videos are encoded in the tests with PyAV (mpeg4, h264, vp9) with known frame counts, rates and
keyframe intervals; expectations about keyframes come from an independent demux of the packets.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import signal
from fractions import Fraction
from pathlib import Path

import av
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FRAMES, GOP, RATE, killed_and_resumed, make_photos, make_video, run_bin, run_cli
from PIL import Image, ImageDraw

import hframe_cli as h
from hframe_cli.format.labels import split_of


def keyframe_indices(path: Path) -> list[int]:
    """Frame positions (presentation order) of the keyframes, from the packets alone."""
    with av.open(str(path)) as c:
        packets = [(p.pts, p.is_keyframe) for p in c.demux(video=0) if p.size]
    order = sorted(pts for pts, _ in packets)
    return sorted(order.index(pts) for pts, key in packets if key)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clips")
    make_video(root / "a" / "one.mp4", "mpeg4")
    make_video(root / "b" / "two.mkv", "libx264")
    make_video(root / "b" / "three.webm", "libvpx-vp9")
    return root


def index_rows(pack: Path) -> list[dict]:
    return pq.read_table(f"{pack}.index.parquet").to_pylist()


def pack(args: list[str]) -> None:
    r = run_cli(["pack", *args, "-q"])
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize(
    ("mode", "indices"),
    [
        ("all", list(range(FRAMES))),
        ("every:4", list(range(0, FRAMES, 4))),
        ("fps:2", list(range(0, FRAMES, RATE // 2))),
    ],
)
def test_video_modes_give_the_expected_frames_and_times(clips, tmp_path, mode, indices):
    out = tmp_path / "v.hframe"
    pack([str(clips), "-o", str(out), "--video-frames", mode])
    rows = index_rows(out)
    for clip in ("a/one.mp4", "b/three.webm", "b/two.mkv"):
        mine = [r for r in rows if r["source"] == clip]
        assert [r["frame_index"] for r in mine] == indices, (clip, mode)
        assert [r["pts_s"] for r in mine] == pytest.approx([i / RATE for i in indices]), clip
        assert [r["name"] for r in mine] == [f"{clip}#frame={i}" for i in indices]
        assert {(r["kind"], r["media_type"], r["width"], r["height"], r["mode"]) for r in mine} == {
            ("video_frame", "jpeg", 64, 48, "RGB")
        }
        assert {r["label"] for r in mine} == {clip.split("/")[0]}
        assert {r["source_size"] for r in mine} == {(clips / clip).stat().st_size}
        assert [r["keyframe"] for r in mine] == [i in keyframe_indices(clips / clip) for i in indices]
    assert run_cli(["verify", str(out)]).exit_code == 0
    r = run_cli(["index", str(out), "--kind", "video_frame", "-c", "name", "--no-header"])
    assert r.stdout.split() == [row["name"] for row in rows]
    r = run_cli(["index", str(out), "--kind", "image", "-c", "name", "--no-header"])
    assert (
        r.exit_code == 2 and r.stdout == "" and "no frame matches --kind 'image'" in r.stderr
    )  # a filter that selects nothing


def test_keyframes_mode_and_max_frames(clips, tmp_path):
    out = tmp_path / "k.hframe"
    pack([str(clips), "-o", str(out), "--video-frames", "keyframes", "--frame-format", "png"])
    rows = index_rows(out)
    for clip in ("a/one.mp4", "b/three.webm", "b/two.mkv"):
        got = [r["frame_index"] for r in rows if r["source"] == clip]
        assert got == keyframe_indices(clips / clip) and len(got) >= FRAMES // GOP, clip
    assert {r["media_type"] for r in rows} == {"png"} and all(r["keyframe"] for r in rows)
    out2 = tmp_path / "m.hframe"
    pack([str(clips), "-o", str(out2), "--video-frames", "all", "--max-frames-per-video", "3"])
    assert [r["frame_index"] for r in index_rows(out2)] == [0, 1, 2] * 3


def test_video_frames_read_back_deterministically(clips, tmp_path):
    a, b = tmp_path / "a.hframe", tmp_path / "b.hframe"
    for out in (a, b):
        pack([str(clips), "-o", str(out), "--video-frames", "every:7", "--frame-format", "jpeg:75", "--created", "1"])
    assert a.read_bytes() == b.read_bytes()
    r = run_cli(["get", str(a), "b/two.mkv#frame=14"])
    assert r.exit_code == 0
    img = Image.open(io.BytesIO(r.stdout_bytes))
    assert img.format == "JPEG" and img.size == (64, 48)
    # the stored frame is the decoded video frame: compare with PyAV's own decode of frame 14
    with av.open(str(clips / "b" / "two.mkv")) as c:
        ref = list(c.decode(video=0))[14].to_image()
    diff = sum(abs(x - y) for x, y in zip(img.convert("RGB").tobytes(), ref.tobytes())) / (64 * 48 * 3)
    assert diff < 8  # JPEG quality 75 of the same picture


def test_video_recognised_by_content_not_only_extension(clips, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "clip.bin").write_bytes((clips / "a" / "one.mp4").read_bytes())
    (src / "notes.bin").write_bytes(b"plain bytes, not a video" * 4)
    out = tmp_path / "c.hframe"
    pack([str(src), "-o", str(out), "--video-frames", "every:10"])
    names = [r["name"] for r in index_rows(out)]
    assert names == ["clip.bin#frame=0", "clip.bin#frame=10", "clip.bin#frame=20", "notes.bin"]
    # without --video-frames a video is just a file, stored verbatim
    out2 = tmp_path / "plain.hframe"
    pack([str(src), "-o", str(out2)])
    with h.open_pack(out2) as p:
        assert p["clip.bin"] == (clips / "a" / "one.mp4").read_bytes()


def test_non_video_with_video_extension_is_rejected(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "fake.mp4").write_bytes(b"this is not a video at all\n" * 20)
    (src / "ok.bin").write_bytes(b"x" * 100)
    out = tmp_path / "f.hframe"
    r = run_cli(["pack", str(src), "-o", str(out), "--video-frames", "all"])
    assert r.exit_code == 2 and "fake.mp4" in r.stderr and "not a video" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()
    r = run_cli(["pack", str(src), "-o", str(out), "--video-frames", "all", "--skip-bad", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["frame_count"] == 1
    assert [s["path"].endswith("fake.mp4") for s in doc["skipped"]] == [True]


@pytest.mark.parametrize(
    ("name", "codec", "opts"), [("t.mp4", "libx264", {"movflags": "faststart"}), ("t.webm", "libvpx-vp9", {})]
)
def test_truncated_video_keeps_the_good_frames_with_skip_bad(tmp_path, name, codec, opts):
    full = make_video(tmp_path / "full" / name, codec, n=60, **opts)
    src = tmp_path / "src"
    src.mkdir()
    data = full.read_bytes()
    (src / name).write_bytes(data[: len(data) * 6 // 10])
    out = tmp_path / "t.hframe"
    r = run_cli(["pack", str(src), "-o", str(out), "--video-frames", "all"])
    assert r.exit_code == 2 and name in r.stderr and "damaged video" in r.stderr, r.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()
    r = run_cli(["pack", str(src), "-o", str(out), "--video-frames", "all", "--skip-bad", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert 0 < doc["frame_count"] < 60
    assert len(doc["warnings"]) == 1 and "damaged video" in doc["warnings"][0]["reason"]
    rows = index_rows(out)
    assert [r["frame_index"] for r in rows] == list(range(doc["frame_count"]))
    assert run_cli(["verify", str(out)]).exit_code == 0


def test_video_pack_resumes_byte_identical_after_sigkill(clips, tmp_path):
    args = ["--video-frames", "every:3", "--created", "1700000000", "--checkpoint-every", "1", "-q"]
    clean, out, resumed = killed_and_resumed(clips, tmp_path, args, "after-frame:2")
    assert resumed["resumed_from_frame"] == 10  # two videos of 10 frames committed
    assert out.read_bytes() == clean.read_bytes()
    assert Path(f"{out}.index.parquet").read_bytes() == Path(f"{clean}.index.parquet").read_bytes()


def test_verify_checks_source_size_of_frames_not_cut_from_a_video(clips, photos, tmp_path):
    """A frame that is a whole file has source_size = raw length; a video frame's is its video's,
    which verify cannot check from the pack (hframe.1, verify)."""
    src = tmp_path / "mixed"
    shutil.copytree(photos, src / "photos")
    shutil.copytree(clips, src / "clips")
    out = tmp_path / "m.hframe"
    pack([str(src), "-o", str(out), "--video-frames", "every:8"])
    assert run_cli(["verify", str(out), "-q"]).exit_code == 0
    t = pq.read_table(f"{out}.index.parquet")
    rows = t.to_pylist()
    video = next(r["frame_id"] for r in rows if r["kind"] == "video_frame")
    image = next(r["frame_id"] for r in rows if r["kind"] == "image")
    assert rows[video]["source_size"] != rows[video]["raw_length"]
    sizes = t.column("source_size").to_pylist()
    sizes[image] += 1
    i = t.schema.get_field_index("source_size")
    pq.write_table(t.set_column(i, t.schema.field(i), pa.array(sizes, t.schema.field(i).type)), f"{out}.index.parquet")
    r = run_cli(["verify", str(out), "--json"])
    (problem,) = json.loads(r.stdout)["packs"][0]["problems"]
    assert r.exit_code == 1 and problem["check"] == "index" and problem["frame_id"] == image
    assert f"source_size {sizes[image]} is not the frame's raw length {sizes[image] - 1}" in problem["message"]


def test_image_metadata_from_headers(photos, tmp_path):
    out = tmp_path / "p.hframe"
    pack([str(photos), "-o", str(out)])
    rows = index_rows(out)
    assert rows
    for r in rows:
        with Image.open(photos / r["name"]) as img:
            assert (r["width"], r["height"], r["mode"]) == (img.width, img.height, img.mode), r["name"]
    out2 = tmp_path / "n.hframe"
    pack([str(photos), "-o", str(out2), "--no-image-meta"])
    assert {r["width"] for r in index_rows(out2)} == {None}


def test_unreadable_image_header_is_a_warning_unless_strict(tmp_path):
    src = make_photos(tmp_path / "src", 3)
    bad = src / "cats" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 40)
    out = tmp_path / "w.hframe"
    r = run_cli(["pack", str(src), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [w["path"] for w in doc["warnings"]] == [str(bad)]
    row = next(r for r in index_rows(out) if r["name"] == "cats/broken.jpg")
    assert row["width"] is None and row["media_type"] == "jpeg"
    r = run_cli(["pack", str(src), "-o", str(tmp_path / "s.hframe"), "--strict-images"])
    assert r.exit_code == 2 and "broken.jpg" in r.stderr and "header" in r.stderr


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_png_wider_than_its_format_allows_is_an_unreadable_header(tmp_path, native):
    """PNG's IHDR holds 32-bit sides but the format allows 2^31 - 1 (and the index's width is
    int32): a header beyond that is unreadable, a warning naming the file (the pack's other
    frames keep theirs), not an internal error; with --strict-images, exit 2. The compiled
    loop declines such a chunk to Python, which says the same."""
    import struct
    import zlib

    def png(width: int, height: int) -> bytes:
        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 7)) + chunk(b"IEND", b"")
        )

    src = make_photos(tmp_path / "src", 3)
    (src / "wide").mkdir()
    (src / "wide" / "a.png").write_bytes(png(1 << 31, 1))
    (src / "wide" / "b.png").write_bytes(png((1 << 32) - 1, (1 << 32) - 1))
    out = tmp_path / "w.hframe"
    r = run_bin(["pack", str(src), "-o", str(out), "--json"], env={"HFRAME_NATIVE": native})
    assert r.returncode == 0, r.stderr
    warned = {w["path"]: w for w in json.loads(r.stdout)["warnings"]}
    assert sorted(warned) == [str(src / "wide" / "a.png"), str(src / "wide" / "b.png")]
    assert "2147483648x1" in json.dumps(warned[str(src / "wide" / "a.png")])
    rows = {r["name"]: r for r in index_rows(out)}
    assert rows["wide/a.png"]["width"] is None and rows["wide/a.png"]["media_type"] == "png"
    assert all(r["width"] for n, r in rows.items() if not n.startswith("wide/"))
    r = run_bin(["pack", str(src), "-o", str(tmp_path / "s.hframe"), "--strict-images"], env={"HFRAME_NATIVE": native})
    assert r.returncode == 2 and b"a.png" in r.stderr and b"Traceback" not in r.stderr


def test_bmps_are_told_from_blobs_that_start_with_bm(tmp_path):
    """ "BM" is two bytes: one random blob in 65,536 and text such as "BMW ..." start with it.
    Only a frame with a BMP's DIB header size is a BMP (a blob called one got a warning and a
    wrong media type); real BMPs, Pillow's and the one CPython ships, still are."""
    src = tmp_path / "src"
    (src / "bmp").mkdir(parents=True)
    (src / "blob").mkdir()
    base = Image.new("RGB", (37, 21), (200, 30, 90))
    ImageDraw.Draw(base).line((0, 0, 36, 20), fill=(0, 0, 0))
    made = {"rgb.bmp": base, "rgba.bmp": base.convert("RGBA"), "p.bmp": base.convert("P"), "l.bmp": base.convert("L")}
    made["1.bmp"] = base.convert("1")
    for name, img in made.items():
        img.save(src / "bmp" / name, "BMP")
    shipped = sorted(Path(os.__file__).parent.glob("test/**/*.bmp"))[:1]
    for f in shipped:
        (src / "bmp" / "cpython.bmp").write_bytes(f.read_bytes())
    rng = random.Random(7)
    for k in range(40):
        (src / "blob" / f"{k:02}.bin").write_bytes(b"BM" + rng.randbytes(rng.randrange(0, 300)))
    (src / "blob" / "car.txt").write_bytes(b"BMW 320i, 1987, blue, 4 doors\n")
    out = tmp_path / "b.hframe"
    r = run_cli(["pack", str(src), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["warnings"] == []
    rows = {row["name"]: row for row in index_rows(out)}
    bmps = {n for n, row in rows.items() if row["media_type"] == "bmp"}
    assert bmps == {f"bmp/{n}" for n in made} | ({"bmp/cpython.bmp"} if shipped else set())
    for name in bmps:
        with Image.open(src / name) as img:
            assert (rows[name]["width"], rows[name]["height"], rows[name]["mode"]) == (img.width, img.height, img.mode)
    assert all(rows[n]["width"] is None for n in rows if n.startswith("blob/"))
    assert run_cli(["verify", str(out)]).exit_code == 0


def test_splits_are_deterministic_by_name_and_stable_when_files_are_added(tmp_path):
    src = tmp_path / "src"
    for i in range(200):
        (src / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 4}" / f"{i:03d}.bin").write_bytes(b"%d" % i)
    out = tmp_path / "s.hframe"
    pack([str(src), "-o", str(out), "--split", "train=0.8,val=0.1,test=0.1"])
    rows = {r["name"]: r["split"] for r in index_rows(out)}
    spec = [("train", 0.8), ("val", 0.1), ("test", 0.1)]
    assert rows == {n: split_of(n.encode(), spec) for n in rows}
    # the documented rule, recomputed independently: first 8 bytes of sha256 as a fraction of 2^64
    x = int.from_bytes(hashlib.sha256(b"c0/000.bin").digest()[:8], "big") / 2**64
    assert rows["c0/000.bin"] == ("train" if x < 0.8 else "val" if x < 0.9 else "test")
    counts = {s: list(rows.values()).count(s) for s in ("train", "val", "test")}
    assert 130 <= counts["train"] <= 185 and counts["val"] > 5 and counts["test"] > 5
    for i in range(200, 260):
        (src / "c9").mkdir(exist_ok=True)
        (src / "c9" / f"{i}.bin").write_bytes(b"new")
    out2 = tmp_path / "s2.hframe"
    pack([str(src), "-o", str(out2), "--split", "train=0.8,val=0.1,test=0.1"])
    again = {r["name"]: r["split"] for r in index_rows(out2)}
    assert {n: again[n] for n in rows} == rows
    r = run_cli(["index", str(out), "--split", "val", "-c", "name", "--no-header"])
    assert sorted(r.stdout.split()) == sorted(n for n, s in rows.items() if s == "val")


def test_video_frames_of_one_video_share_a_split(clips, tmp_path):
    out = tmp_path / "v.hframe"
    pack([str(clips), "-o", str(out), "--video-frames", "every:5", "--split", "train=0.5,val=0.5"])
    by_source: dict[str, set] = {}
    for r in index_rows(out):
        by_source.setdefault(r["source"], set()).add(r["split"])
    assert all(len(s) == 1 for s in by_source.values())
    assert by_source["a/one.mp4"] == {split_of(b"a/one.mp4", [("train", 0.5), ("val", 0.5)])}


def test_labels_from_csv_or_none_survive_rebuild_and_filter_get(tmp_path):
    src = make_photos(tmp_path / "src", 6)
    csv = tmp_path / "labels.csv"
    csv.write_text("name,label\ncats/000.png,tabby\ndogs/001.jpg,husky\n")
    out = tmp_path / "l.hframe"
    pack([str(src), "-o", str(out), "--label-from", str(csv)])
    labels = {r["name"]: r["label"] for r in index_rows(out)}
    assert labels["cats/000.png"] == "tabby" and labels["dogs/001.jpg"] == "husky"
    assert [n for n, lab in labels.items() if lab is None] == sorted(set(labels) - {"cats/000.png", "dogs/001.jpg"})
    before = pq.read_table(f"{out}.index.parquet")
    Path(f"{out}.index.parquet").unlink()
    assert run_cli(["index", str(out), "--rebuild", "-q"]).exit_code == 0
    assert pq.read_table(f"{out}.index.parquet").equals(before)
    dest = tmp_path / "x"
    r = run_cli(["get", str(out), "--label", "husky", "-o", str(dest)])
    assert r.exit_code == 0, r.stderr
    assert [p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()] == ["dogs/001.jpg"]
    assert (dest / "dogs" / "001.jpg").read_bytes() == (src / "dogs" / "001.jpg").read_bytes()
    out2 = tmp_path / "none.hframe"
    pack([str(src), "-o", str(out2), "--label-from", "none"])
    assert {r["label"] for r in index_rows(out2)} == {None}
    r = run_cli(["pack", str(src), "-o", str(tmp_path / "bad.hframe"), "--split", "train=0.9,val=0.2"])
    assert r.exit_code == 2 and "sum" in r.stderr


def test_resume_refuses_a_changed_labels_csv(tmp_path):
    src = make_photos(tmp_path / "src", 12)
    csv = tmp_path / "labels.csv"
    csv.write_text("cats/000.png,a\n")
    out = tmp_path / "r.hframe"
    args = ["pack", str(src), "-o", str(out), "--label-from", str(csv), "--checkpoint-every", "2", "-q"]
    assert run_bin(args, env={"HFRAME_FAULT": "after-frame:5"}).returncode == -signal.SIGKILL
    csv.write_text("cats/000.png,b\n")
    r = run_bin(["resume", str(out)])
    assert r.returncode == 2 and b"labels CSV changed" in r.stderr
    csv.write_text("cats/000.png,a\n")
    assert run_bin(["resume", str(out), "-q"]).returncode == 0
    assert h.open_pack(out).row("cats/000.png")["label"] == "a"


def test_sigterm_in_the_middle_of_a_video_rolls_it_back_and_resume_finishes(tmp_path):
    src = tmp_path / "src"
    make_video(src / "a.mp4", "mpeg4", n=12)
    make_video(src / "b.mp4", "mpeg4", n=300, size=(320, 240))  # (the signal comes some 55 frames in)
    args = ["--video-frames", "all", "--frame-format", "png", "--created", "1700000000", "-q"]
    clean = tmp_path / "clean.hframe"
    assert run_bin(["pack", str(src), "-o", str(clean), *args]).returncode == 0
    out = tmp_path / "t.hframe"
    import os
    import subprocess
    import time

    from conftest import hframe_bin

    proc = subprocess.Popen([hframe_bin(), "pack", str(src), "-o", str(out), *args], stderr=subprocess.PIPE)
    partial = Path(f"{out}.partial")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not partial.exists() or partial.stat().st_size < 60_000):
        time.sleep(0.01)  # wait until b.mp4 is well under way
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"b.mp4" in err and b"starts again on resume" in err
    r = run_bin(["resume", str(out), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed_from_frame"] == 12  # a.mp4 kept, b.mp4 cut again
    assert out.read_bytes() == clean.read_bytes()
    assert os.path.getsize(f"{out}.index.parquet") == os.path.getsize(f"{clean}.index.parquet")


def test_header_parser_agrees_with_pillow_on_many_variants(tmp_path):
    from hframe_cli.format.layout import SNIFF_BYTES, sniff_media_type
    from hframe_cli.sources.imagehead import _jpeg, _png, image_info

    base = Image.new("RGB", (37, 23), (200, 30, 90))
    ImageDraw.Draw(base).rectangle((3, 4, 20, 15), fill=(10, 250, 30))
    variants: list[tuple[str, bytes]] = []
    for mode in ("L", "RGB", "CMYK"):
        for kw in ({}, {"progressive": True}, {"quality": 30, "subsampling": 2}, {"restart_marker_blocks": 1}):
            buf = io.BytesIO()
            base.convert(mode).save(buf, "JPEG", **kw)
            variants.append((f"jpeg {mode} {kw}", buf.getvalue()))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: does not change the stored size
    buf = io.BytesIO()
    base.save(buf, "JPEG", exif=exif.tobytes())
    variants.append(("jpeg exif", buf.getvalue()))
    for mode in ("1", "L", "LA", "P", "RGB", "RGBA"):
        buf = io.BytesIO()
        base.convert(mode).save(buf, "PNG")
        variants.append((f"png {mode}", buf.getvalue()))
    buf = io.BytesIO()
    Image.new("I;16", (5, 7)).save(buf, "PNG")  # 16-bit grey: the fast parser defers to Pillow
    variants.append(("png I;16", buf.getvalue()))
    buf = io.BytesIO()
    base.convert("P").save(buf, "PNG", transparency=0)
    variants.append(("png P transparency", buf.getvalue()))
    fast_hits = 0
    for label, data in variants:
        media = sniff_media_type(data[:SNIFF_BYTES])
        with Image.open(io.BytesIO(data)) as img:
            want = (img.width, img.height, img.mode)
        assert image_info(data, media) == want, label
        fast = _jpeg(data) if media == "jpeg" else _png(data)
        fast_hits += fast is not None
        assert fast in (None, want), label  # the fast parser either agrees or defers to Pillow
    assert fast_hits >= len(variants) - 3  # and it does decide the common cases itself


def test_a_frame_name_that_clashes_with_an_input_file_is_refused(clips, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "v.mp4").write_bytes((clips / "a" / "one.mp4").read_bytes())
    (src / "v.mp4#frame=10").write_bytes(b"a file named like a frame")
    out = tmp_path / "c.hframe"
    r = run_cli(["pack", str(src), "-o", str(out), "--video-frames", "every:10"])
    assert r.exit_code == 2 and "v.mp4#frame=10" in r.stderr and "also the name of an input file" in r.stderr
    r = run_cli(["pack", str(src), "-o", str(out), "--video-frames", "every:10", "--skip-bad", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and [n["name"] for n in index_rows(out)] == ["v.mp4#frame=10"]
    assert doc["skipped"][0]["path"].endswith("v.mp4")


def test_get_into_a_folder_keeps_exact_names_and_stays_inside(tmp_path):
    src = tmp_path / "n"
    (src / "d").mkdir(parents=True)
    (src / "d" / os.fsdecode(b"\xff.txt")).write_bytes(b"raw name")
    (src / "d" / "\\xff.txt").write_bytes(b"literal name")  # what the first one's display name reads
    out = tmp_path / "n.hframe"
    pack([str(src), "-o", str(out)])
    dest = tmp_path / "x"
    assert run_cli(["get", str(out), "--match", "*", "-o", str(dest)]).exit_code == 0
    assert (dest / "d" / os.fsdecode(b"\xff.txt")).read_bytes() == b"raw name"
    assert (dest / "d" / "\\xff.txt").read_bytes() == b"literal name"
    # a symlink inside the folder that leads out of it is not followed
    (tmp_path / "y" / "d").mkdir(parents=True)
    (tmp_path / "y" / "d" / "f.bin").write_bytes(b"data")
    out2 = tmp_path / "y.hframe"
    pack([str(tmp_path / "y"), "-o", str(out2)])
    outside, sl = tmp_path / "outside", tmp_path / "sl"
    outside.mkdir()
    sl.mkdir()
    (sl / "d").symlink_to(outside)
    r = run_cli(["get", str(out2), "--match", "*", "-o", str(sl)])
    assert r.exit_code == 2 and "symlink" in r.stderr and list(outside.iterdir()) == []


def test_files_that_only_look_like_videos_are_packed_as_files_small_or_streamed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    small = b"\0\0\0 ftypM4A " + b"x" * 1000  # an ISO-container audio header: not a video
    big = b"\0\0\0 ftypM4A " + b"y" * (33 << 20)  # above the streaming threshold
    (src / "small.bin").write_bytes(small)
    (src / "big.bin").write_bytes(big)
    out = tmp_path / "o.hframe"
    pack([str(src), "-o", str(out), "--video-frames", "all"])
    with h.open_pack(out) as p:
        assert p["small.bin"] == small and p["big.bin"] == big


def test_update_of_a_video_pack_with_nothing_changed_writes_nothing(clips, tmp_path):
    out = tmp_path / "u.hframe"
    pack([str(clips), "-o", str(out), "--video-frames", "every:10"])
    before = out.stat().st_mtime_ns
    r = run_cli(["pack", str(clips), "-o", str(out), "--video-frames", "every:10", "--update", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["changed"] is False
    assert out.stat().st_mtime_ns == before
    frames = len(index_rows(out))
    r = run_cli(["pack", str(clips), "-o", str(out), "--video-frames", "every:10", "--update", "-n"])
    assert r.stderr == f"hframe: dry run: {out} is up to date ({frames} frames): nothing would be written\n"
    make_video(clips / "b" / "four.mp4", "mpeg4", n=10)  # a new video: the pack is rebuilt with it
    try:
        r = run_cli(["pack", str(clips), "-o", str(out), "--video-frames", "every:10", "--update", "--json"])
        assert r.exit_code == 0 and json.loads(r.stdout)["changed"] is True
        assert "b/four.mp4" in {row["source"] for row in index_rows(out)}
    finally:
        (clips / "b" / "four.mp4").unlink()


def test_rebuild_refuses_frame_metadata_of_the_wrong_type(tmp_path):
    from hframe_cli.write.writer import PackWriter

    out = tmp_path / "m.hframe"
    with PackWriter(out) as w:
        w.add(b"a.bin", b"payload", meta={"width": -5, "height": 2, "mode": "L"})  # a writer bug, or a crafted pack
        w.seal()
        w.publish()
    r = run_cli(["index", str(out), "--rebuild"])
    assert r.exit_code == 1 and "frame 0" in r.stderr and "'width'" in r.stderr and "Traceback" not in r.stderr


def test_update_matches_a_video_whose_name_is_not_utf8(clips, tmp_path):
    src = tmp_path / "v"
    src.mkdir()
    (src / os.fsdecode(b"b\xff.mp4")).write_bytes((clips / "a" / "one.mp4").read_bytes())
    (src / "plain.txt").write_bytes(b"plain")
    out = tmp_path / "u.hframe"
    pack([str(src), "-o", str(out), "--video-frames", "every:10"])
    r = run_cli(["pack", str(src), "-o", str(out), "--video-frames", "every:10", "--update", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["changed"] is False, r.stdout


def test_frame_keys_are_ints_or_names_not_bools(packed):
    with h.open_pack(packed) as p:
        with pytest.raises(h.InputError, match="bool"):
            p.frame_id(True)


def make_sparse_video(path: Path, codec: str, n: int = 69, gap: int = 6, rate: int = 30) -> Path:
    """A variable-rate file as screen recorders and AVI writers make them: ``n`` frames stored,
    timestamps ``gap`` frame periods apart (the repeated frames in between are not stored)."""
    return make_video(path, codec, n=n, rate=rate, pts_step=gap)


@pytest.mark.parametrize(("name", "codec"), [("s.avi", "mpeg4"), ("s.mkv", "libx264"), ("s.webm", "libvpx-vp9")])
def test_a_sparse_variable_rate_video_is_not_called_damaged(tmp_path, name, codec):
    """Its container may declare every frame period (AVI: 409 for 69 stored); its timestamps
    reach the end, so nothing is missing."""
    video = make_sparse_video(tmp_path / "src" / name, codec)
    with av.open(str(video)) as c:
        declared, stored = c.streams.video[0].frames, sum(1 for _ in c.decode(video=0))
    assert stored == 69
    out = tmp_path / "s.hframe"
    r = run_cli(["pack", str(tmp_path / "src"), "-o", str(out), "--video-frames", "all", "--json"])
    assert r.exit_code == 0, (declared, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["frame_count"] == 69 and doc["warnings"] == [], (declared, doc["warnings"])


def test_a_truncated_avi_is_still_damaged(tmp_path):
    full = make_sparse_video(tmp_path / "full" / "t.avi", "mpeg4", n=90, gap=1)
    src = tmp_path / "src"
    src.mkdir()
    data = full.read_bytes()
    (src / "t.avi").write_bytes(data[: len(data) * 6 // 10])
    r = run_cli(["pack", str(src), "-o", str(tmp_path / "t.hframe"), "--video-frames", "all"])
    assert r.exit_code == 2 and "t.avi" in r.stderr and "damaged video" in r.stderr, r.stderr


def test_a_video_whose_last_frame_is_held_is_complete(tmp_path):
    """Every frame the container lists is there; the last one stays on screen for 9 s (a
    slideshow, a screen recording): not a truncated file."""
    path = tmp_path / "src" / "held.mp4"
    path.parent.mkdir()
    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        packets = []
        for i in range(11):
            frame = av.VideoFrame.from_image(Image.new("RGB", (64, 48), (i * 20 % 256, 90, 30)))
            frame.pts, frame.time_base = i, Fraction(1, 10)
            packets += list(s.encode(frame))
        packets += list(s.encode())
        max(packets, key=lambda p: p.pts).duration = 90
        for p in packets:
            c.mux(p)
    with av.open(str(path)) as c:
        st = c.streams.video[0]
        assert st.frames == 11 and float(st.duration * st.time_base) == pytest.approx(10.0)
    r = run_cli(["pack", str(tmp_path / "src"), "-o", str(tmp_path / "h.hframe"), "--video-frames", "all", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["frame_count"] == 11 and doc["warnings"] == []
