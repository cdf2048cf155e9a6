"""``bench-cold`` / ``bench-warm --plot FILE``: the figure is opened and checked (its size, a line
of each side's colour, its axes, units and legend as text in the SVG), a wrong extension or no
matplotlib is one line before anything is measured, and the JSON report is unchanged by it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import make_photos, run_bin
from PIL import Image

pytest.importorskip("matplotlib", reason="the plot extra (pip install 'hframe[plot]'; a test extra)")

HFRAME_BLUE, LOOSE_ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)


@pytest.fixture
def bench_pack(tmp_path: Path) -> tuple[Path, Path]:
    src = make_photos(tmp_path / "src", 80)
    out = tmp_path / "p.hframe"
    assert run_bin(["pack", str(src), "-o", str(out), "-q"]).returncode == 0
    return src, out


def colours(path: Path) -> set[tuple[int, int, int]]:
    with Image.open(path) as im:
        return {c for _, c in im.convert("RGB").getcolors(1 << 22) or []}


@pytest.mark.parametrize("mode", ["cold", "warm"])
def test_a_png_plot_shows_both_sides_distributions(bench_pack, tmp_path, mode):
    src, pack = bench_pack
    png = tmp_path / f"{mode}.png"
    args = [f"bench-{mode}", str(pack), "--frames", "16", "--batches", "4", "--compare", str(src), "--json"]
    r = run_bin([*args, "--plot", str(png)])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["hframe"]["frames"] == 64 and doc["loose"]["frames"] == 64
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (1100, 440)
    seen = colours(png)
    assert HFRAME_BLUE in seen and LOOSE_ORANGE in seen  # a line for each side


def test_an_svg_plot_names_its_axes_units_legend_and_percentiles(bench_pack, tmp_path):
    src, pack = bench_pack
    svg = tmp_path / "w.svg"
    r = run_bin(
        ["bench-warm", str(pack), "--frames", "16", "--batches", "5", "--seed", "2", "--json", "--plot", str(svg)]
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    text = svg.read_text()
    for words in ("frame latency (ms, log scale)", "batch latency (ms, log scale)", "share of frames done within it"):
        assert words in text
    assert "hframe bench-warm: 5 batches of 16 frames, p.hframe" in text
    p50 = doc["hframe"]["frame_latency_ms"]["p50"]
    legend = re.search(r"hframe \(p50 ([0-9.e+-]+) ms, p99 ([0-9.e+-]+) ms\)", text)
    assert legend is not None and float(legend.group(1)) == pytest.approx(p50, rel=0.01, abs=1e-3)
    assert "loose files" not in text  # no --compare: one side only


def test_a_plot_that_cannot_be_drawn_is_one_line_before_the_benchmark(bench_pack, tmp_path):
    _, pack = bench_pack
    r = run_bin(["bench-warm", str(pack), "--frames", "4", "--batches", "1", "--plot", str(tmp_path / "p.jpg")])
    err = r.stderr.decode()
    assert r.returncode == 2 and "write a plot as .png, .svg, .pdf" in err and err.count("\n") == 1
    blocker = tmp_path / "blocker"  # a matplotlib that fails to import, first on the path
    (blocker / "matplotlib").mkdir(parents=True)
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    r = run_bin(
        ["bench-warm", str(pack), "--frames", "4", "--batches", "1", "--plot", str(tmp_path / "p.png")], env=env
    )
    err = r.stderr.decode()
    assert r.returncode == 2 and "pip install 'hframe[plot]'" in err and err.count("\n") == 1
    assert not (tmp_path / "p.png").exists() and b"frames/s" not in r.stdout
