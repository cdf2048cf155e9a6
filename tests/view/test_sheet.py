"""``hframe sheet``: every image it writes is opened and checked: its size, each tile's pixels
against a thumbnail made here of the frame the tile claims to show (Pillow directly, from the
source file, not through hframe), a damaged frame's tile marked, video frames in time order,
placeholders for blobs; over nginx and for a dataset as for a pack."""

from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_photos, make_video, nginx_serving, real_media, run_bin
from PIL import Image

CREATED = ["--created", "1700000000"]


def expected_thumbnail(path: Path, size: int) -> Image.Image:
    """What a tile of ``size`` should show of the image file at ``path``: a draft-mode decode,
    RGB, scaled to fit (as the man page says the sheet draws it)."""
    with Image.open(path) as im:
        im.draft("RGB", (size, size))
        im.load()
        rgb = (im.convert("RGBA") if im.mode == "P" else im).convert("RGB")
    rgb.thumbnail((size, size))
    return rgb


def sheet(args: list[str]) -> dict:
    r = run_bin(["sheet", *args, "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def names_to_ids(pack: Path) -> dict[str, int]:
    t = pq.read_table(f"{pack}.index.parquet", columns=["frame_id", "name"])
    return dict(zip(t.column("name").to_pylist(), t.column("frame_id").to_pylist()))


@pytest.fixture
def images(tmp_path: Path) -> tuple[Path, Path]:
    """Generated photos and real images made by others (Debian's and PyPI packages')."""
    src = make_photos(tmp_path / "src", 24)
    for k, m in enumerate(p for p in real_media(60) if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".gif")):
        if k == 16:
            break
        shutil.copyfile(m, src / f"real{k:02d}{m.suffix.lower()}")
    out = tmp_path / "p.hframe"
    assert run_bin(["pack", str(src), "-o", str(out), "-q", *CREATED]).returncode == 0
    return src, out


def test_each_tile_shows_the_thumbnail_of_its_frame(images, tmp_path):
    src, pack = images
    ids = names_to_ids(pack)
    png = tmp_path / "s.png"
    doc = sheet([str(pack), "-o", str(png), "--sample", "20", "--seed", "3", "--columns", "6", "--tile", "96"])
    with Image.open(png) as im:
        assert im.size == (doc["width"], doc["height"]) and im.format == "PNG"
        shown = im.convert("RGB")
    assert doc["frames"] == 20 and doc["selected"] == len(ids) and doc["columns"] == 6
    assert [t["frame_id"] for t in doc["tiles"]] == sorted(random.Random(3).sample(sorted(ids.values()), 20))
    compared = 0
    for t in doc["tiles"]:
        want = expected_thumbnail(src / t["name"], 96)
        x, y, w, h = t["thumb"]
        assert (w, h) == want.size and max(w, h) <= 96
        assert shown.crop((x, y, x + w, y + h)).tobytes() == want.tobytes(), t["name"]
        assert t["caption"][0].startswith(f"#{t['frame_id']}") and t["problem"] is None
        compared += 1
    assert compared == 20


def test_a_caption_says_id_label_name_and_size(images, tmp_path):
    src, pack = images
    doc = sheet([str(pack), "-o", str(tmp_path / "s.jpg"), "0", "5", "--tile", "128"])
    rows = pq.read_table(f"{pack}.index.parquet").to_pylist()
    for t, i in zip(doc["tiles"], [0, 5]):
        row = rows[i]
        first = f"#{i}" + (f"  {row['label']}" if row["label"] else "")
        assert t["caption"][0] == first and t["caption"][1].endswith(row["name"][-8:])
        assert t["caption"][2] == f"{row['width']} x {row['height']}"
    with Image.open(tmp_path / "s.jpg") as im:
        assert im.format == "JPEG" and im.size == (doc["width"], doc["height"])


def test_a_damaged_frame_is_a_marked_tile_and_the_rest_still_show(images, tmp_path):
    src, pack = images
    ids = names_to_ids(pack)
    victim = next(n for n in sorted(ids) if n.endswith(".jpg"))
    row = pq.read_table(f"{pack}.index.parquet").to_pylist()[ids[victim]]
    data = bytearray(pack.read_bytes())
    data[row["offset"] + 2 : row["offset"] + 400] = bytes(398)  # its JPEG headers gone
    pack.write_bytes(bytes(data))
    png = tmp_path / "d.png"
    keys = [str(ids[victim]), str(ids[victim] + 1)]
    r = run_bin(["sheet", str(pack), *keys, "-o", str(png), "--tile", "96"])
    assert r.returncode == 0 and "1 that could not be decoded" in r.stderr.decode()
    doc = sheet([str(pack), *keys, "-o", str(png), "--tile", "96"])
    bad, good = doc["tiles"]
    assert bad["thumb"] is None and bad["problem"].startswith("cannot decode") and good["thumb"] is not None
    assert doc["undecodable"] == 1
    with Image.open(png) as im:
        x, y, w, _ = bad["box"]
        area = im.convert("RGB").crop((x + 3, y + 3, x + 3 + 96, y + 3 + 96))
    px = area.tobytes()
    reds = sum(1 for k in range(0, len(px), 3) if px[k] > 150 and px[k + 1] < 80 and px[k + 2] < 80)
    assert reds > 0.5 * 96 * 96  # marked: mostly red


def test_blobs_are_placeholders_and_video_frames_come_in_time_order_with_their_times(tmp_path):
    src = tmp_path / "src"
    make_video(src / "clips" / "one.mp4", "libx264")
    (src / "blobs").mkdir()
    for i in range(3):
        (src / "blobs" / f"{i}.bin").write_bytes(bytes([i]) * 500)
    pack = tmp_path / "v.hframe"
    r = run_bin(["pack", str(src), "-o", str(pack), "-q", "--video-frames", "every:3", *CREATED])
    assert r.returncode == 0, r.stderr
    png = tmp_path / "v.png"
    doc = sheet([str(pack), "-o", str(png), "--match", "clips/*", "--tile", "64"])
    times = [float(t["caption"][2].split()[0][2:]) for t in doc["tiles"]]
    assert len(times) == 10 and times == sorted(times) and times[1] == pytest.approx(0.3)
    assert all(t["thumb"] is not None for t in doc["tiles"])
    doc = sheet([str(pack), "-o", str(png), "--match", "blobs/*"])
    assert [t["problem"] for t in doc["tiles"]] == ["not an image: unknown, 500 bytes"] * 3


def test_stdout_remote_and_dataset_give_the_same_sheet(images, tmp_path):
    src, pack = images
    args = ["--sample", "6", "--seed", "1", "--tile", "64"]
    local = run_bin(["sheet", str(pack), "-o", "-", *args])
    assert local.returncode == 0 and local.stdout[:8] == b"\x89PNG\r\n\x1a\n"
    site = tmp_path / "site"
    site.mkdir()
    for f in (pack, Path(f"{pack}.index.parquet")):
        shutil.copyfile(f, site / f.name)
    with nginx_serving(site, tmp_path / "ng") as base:
        remote = run_bin(["sheet", f"{base}/p.hframe", "-o", "-", *args])
    assert remote.returncode == 0 and remote.stdout == local.stdout
    ds = tmp_path / "ds.hframe"
    r = run_bin(["pack", str(src), "-o", str(ds), "-q", "--max-pack-bytes", "16KiB", *CREATED])
    assert r.returncode == 0, r.stderr
    assert len(list(tmp_path.glob("ds-*.hframe"))) > 1
    sharded = run_bin(["sheet", str(ds), "-o", "-", *args])
    assert sharded.returncode == 0 and sharded.stdout == local.stdout
    with Image.open(io.BytesIO(local.stdout)) as im:
        assert im.width > 64 * 6


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["-o", "s.gifx"], "write a sheet as"),
        (["--sample", "0"], "--sample must be at least 1"),
        (["3", "--label", "x"], "without a FRAME"),
        (["--columns", "0"], "--columns 0"),
        (["--tile", "5000"], "--tile 5000"),
    ],
)
def test_bad_options_are_one_line_exit_2(images, tmp_path, args, words):
    _, pack = images
    r = run_bin(["sheet", str(pack), *args], cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err
    assert not list(tmp_path.glob("s.*"))


def test_a_missing_frame_or_pack_is_one_line(images, tmp_path):
    _, pack = images
    r = run_bin(["sheet", str(pack), "99999", "-o", str(tmp_path / "s.png")])
    assert r.returncode != 0 and "99999" in r.stderr.decode() and r.stderr.decode().count("\n") == 1
    assert not (tmp_path / "s.png").exists()
    r = run_bin(["sheet", str(tmp_path / "nope.hframe"), "-o", str(tmp_path / "s.png")])
    assert r.returncode == 2 and "nope.hframe" in r.stderr.decode()
