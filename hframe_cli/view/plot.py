"""``bench-cold`` / ``bench-warm --plot FILE``: the latency distributions of a benchmark as a figure.

Two panels: each frame's read latency and each batch's, as cumulative distributions (the share of
frames or batches done within a time, time on a log axis in milliseconds), for hframe and, with
``--compare``, the same frames read as loose files; the legend gives each line's p50 and p99.
A cold and a warm run are two commands, two figures, titled by their mode.

Imports inside functions: matplotlib is an optional extra (``pip install 'hframe[plot]'``),
imported only when a plot is asked for; ``check_plotting`` says in one line when it is missing.
"""

from __future__ import annotations

import os
from typing import Any

from ..durable import replaced
from ..errors import InputError
from ..read.bench import percentile

__all__ = ["PLOT_FORMATS", "check_plotting", "plot_latencies"]

#: formats a plot is written in, by the output's extension
PLOT_FORMATS = (".png", ".svg", ".pdf")
#: the figure's size in inches and dots per inch (PNG: 1100 x 440 pixels)
SIZE_IN, DPI = (11.0, 4.4), 100


def check_plotting(path: str | os.PathLike[str]) -> None:
    """Refuse, before a benchmark runs, a plot that could not be written.

    Raises:
        InputError: an extension that is not one of ``PLOT_FORMATS``; matplotlib not installed.
    """
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext not in PLOT_FORMATS:
        raise InputError(f"{path}: write a plot as {', '.join(PLOT_FORMATS)}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(
            "--plot needs matplotlib, an optional extra: pip install 'hframe[plot]' (or pip install matplotlib)"
        ) from None


def _ecdf(values: list[float]) -> tuple[list[float], list[float]]:
    xs = sorted(v * 1000.0 for v in values)
    n = len(xs)
    return xs, [(k + 1) / n for k in range(n)]


def plot_latencies(result: Any, path: str | os.PathLike[str]) -> None:
    """Draw the frame- and batch-latency distributions of a ``BenchResult`` into ``path`` (its
    format from the extension), whole or not at all.

    Raises:
        InputError: as ``check_plotting``; the file cannot be written.
    """
    check_plotting(path)
    import matplotlib

    matplotlib.use("Agg")  # (no display: a file only)
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # (an SVG keeps its words as text)
    sides = [("hframe", result.pack_side, "#1f77b4")]
    if result.loose_side is not None:
        sides.append(("loose files", result.loose_side, "#ff7f0e"))
    fig, axes = plt.subplots(1, 2, figsize=SIZE_IN, dpi=DPI)
    for ax, what, attr in (
        (axes[0], "frame", "frame_latencies_s"),
        (axes[1], "batch", "batch_latencies_s"),
    ):
        for label, side, colour in sides:
            xs, ys = _ecdf(getattr(side, attr))
            if not xs:
                continue
            p50, p99 = percentile(xs, 0.50), percentile(xs, 0.99)  # (as the text report says them)
            ax.step(xs, ys, where="post", color=colour, label=f"{label} (p50 {p50:.3g} ms, p99 {p99:.3g} ms)")
        ax.set_xscale("log")
        ax.set_xlabel(f"{what} latency (ms, log scale)")
        ax.set_ylabel(f"share of {what}{'es' if what == 'batch' else 's'} done within it")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        ax.set_title(f"{what} latency")
    fig.suptitle(
        f"hframe bench-{result.mode}: {result.batches} batches of {result.frames_per_batch} frames, "
        f"{os.path.basename(result.pack)}" + (" (page cache evicted)" if result.cold else ""),
        fontsize=11,
    )
    fig.tight_layout()
    ext = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    try:
        with replaced(path, durable=False) as tmp:
            fig.savefig(tmp, format=ext)
    except OSError as e:
        raise InputError(f"{path}: cannot write the plot ({e.strerror or e})") from None
    finally:
        plt.close(fig)
