"""``verify --html FILE``: a rendering of the ``--json`` report, self-contained (no script, no
external reference), with the damaged frames' names and thumbnails; rendered by a real headless
browser (Debian's chromium, which ``.ci/run`` installs) and checked by its screenshot and text."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_photos, run_bin
from PIL import Image

CREATED = ["--created", "1700000000"]


class Page(HTMLParser):
    """The page's text, and every attribute that could load something."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.loads: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for k, v in attrs:
            if k in ("src", "href", "srcset", "data", "poster", "action", "background"):
                self.loads.append((tag, k, v or ""))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def damage(pack: Path, frame: int) -> dict:
    row = pq.read_table(f"{pack}.index.parquet").to_pylist()[frame]
    data = bytearray(pack.read_bytes())
    at = row["offset"] + row["length"] // 2  # in the middle: the md5 fails, the image still decodes
    data[at : at + 8] = bytes(8)
    pack.write_bytes(bytes(data))
    return row


@pytest.fixture
def packs(tmp_path: Path) -> tuple[Path, Path, dict]:
    src = make_photos(tmp_path / "src", 30)
    odd = next(p for p in sorted(src.rglob("*.jpg")))
    odd.rename(odd.with_name("<b>x&y.jpg"))  # a name that must be escaped
    good, bad = tmp_path / "good.hframe", tmp_path / "bad.hframe"
    for out in (good, bad):
        assert run_bin(["pack", str(src), "-o", str(out), "-q", *CREATED]).returncode == 0
    names = pq.read_table(f"{bad}.index.parquet", columns=["name"]).column("name").to_pylist()
    row = damage(bad, names.index(next(n for n in names if n.endswith("<b>x&y.jpg"))))
    return good, bad, row


def test_the_page_is_the_json_report_with_names_and_thumbnails_and_loads_nothing(packs, tmp_path):
    good, bad, row = packs
    page_file = tmp_path / "r.html"
    r = run_bin(["verify", str(good), str(bad), "--html", str(page_file), "--json"])
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    page = parse(page_file)
    text = " ".join(page.text)
    assert "PROBLEMS: 1 in 1 pack(s)" in text and f"{doc['frames_checked']:,} of {doc['frames_total']:,}" in text
    (problem,) = doc["packs"][1]["problems"]
    assert problem["name"] in text and problem["expected"] in text and problem["found"] in text
    assert "<b>x&y.jpg" in text and "<b>" not in page.tags  # escaped: text, never markup
    assert not {"script", "link", "iframe", "object", "embed", "base"} & page.tags
    assert all(v.startswith("data:image/jpeg;base64,") for _, _, v in page.loads) and len(page.loads) == 1
    raw = page_file.read_text()
    assert not re.search(r"url\(|@import|https?://", raw)
    (_, _, uri) = page.loads[0]
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as im:
        with Image.open(tmp_path / "src" / row["name"]) as original:  # the damaged frame, still decodable
            original.thumbnail((128, 128))
            assert im.format == "JPEG" and im.size == original.size


def test_a_clean_run_says_ok_and_a_run_that_could_not_verify_says_so(packs, tmp_path):
    good, _, _ = packs
    r = run_bin(["verify", str(good), "--html", str(tmp_path / "ok.html"), "-q"])
    assert r.returncode == 0
    text = " ".join(parse(tmp_path / "ok.html").text)
    assert "OK: 1 pack(s), no problem found" in text and "thumbnail" not in text
    (tmp_path / "trunc.hframe").write_bytes(good.read_bytes()[:1000])
    shutil.copyfile(f"{good}.index.parquet", tmp_path / "trunc.hframe.index.parquet")
    r = run_bin(["verify", str(tmp_path / "trunc.hframe"), "--html", str(tmp_path / "err.html"), "-q"])
    text = " ".join(parse(tmp_path / "err.html").text)
    assert r.returncode in (1, 2) and ("NOT VERIFIED" in text or "PROBLEMS" in text) and "trunc.hframe" in text


def test_merged_job_array_parts_of_a_dataset_show_every_shard(tmp_path):
    src = make_photos(tmp_path / "src", 40)
    ds = tmp_path / "ds.hframe"
    assert run_bin(["pack", str(src), "-o", str(ds), "-q", "--max-pack-bytes", "30KiB", *CREATED]).returncode == 0
    shards = sorted(tmp_path.glob("ds-*.hframe"))
    assert len(shards) >= 2
    damage(shards[-1], 0)
    parts = []
    for i in range(2):
        r = run_bin(["verify", str(ds), "--shard-of", f"{i}/2", "--json"])
        parts.append(tmp_path / f"part{i}.json")
        parts[-1].write_bytes(r.stdout)
    r = run_bin(["verify", "--merge", *map(str, parts), "--html", str(tmp_path / "m.html"), "--json"])
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    text = " ".join(parse(tmp_path / "m.html").text)
    assert all(p["pack"] in text for p in doc["packs"]) and len(doc["packs"]) == len(shards)
    assert shards[-1].name in text and "PROBLEMS: 1" in text


def test_a_report_that_cannot_be_written_is_one_line_exit_2(packs, tmp_path):
    good, _, _ = packs
    r = run_bin(["verify", str(good), "--html", str(tmp_path / "no" / "r.html")])
    err = r.stderr.decode()
    assert r.returncode == 2 and "cannot write the HTML report" in err and err.count("\n") == 1


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(chromium() is None, reason="no headless browser here (.ci/run installs Debian's chromium)")
def test_a_headless_browser_renders_the_verdict_and_the_damaged_frame(packs, tmp_path):
    good, bad, row = packs
    page_file = tmp_path / "r.html"
    assert run_bin(["verify", str(good), str(bad), "--html", str(page_file), "-q"]).returncode == 1
    browser = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]
    # (no network here: without these it tries, and waits for, Google's hosts at every start)
    browser += ["--disable-quic", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    browser += [f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900"]
    shot = tmp_path / "r.png"
    subprocess.run([*browser, f"--screenshot={shot}", page_file.as_uri()], capture_output=True, timeout=120, check=True)
    with Image.open(shot) as im:
        assert im.size == (1200, 900)
        rgb = im.convert("RGB")
        assert len(set(rgb.getcolors(1 << 20) or [])) > 10  # drawn, not a blank page
        # the verdict banner's pink (#fde4e4) is on screen
        assert any(
            abs(c[1][0] - 0xFD) < 6 and abs(c[1][1] - 0xE4) < 6 and abs(c[1][2] - 0xE4) < 6
            for c in rgb.getcolors(1 << 20)
        )
    dom = subprocess.run([*browser, "--dump-dom", page_file.as_uri()], capture_output=True, timeout=120, check=True)
    text = dom.stdout.decode()
    assert "PROBLEMS: 1 in 1 pack(s)" in text and "&lt;b&gt;x&amp;y.jpg" in text
