"""``verify --html FILE``: the verify report as one self-contained HTML page for CI artifacts.

It is a rendering of the document ``verify --json`` prints (``VerifyReport.to_dict()``), never a
second source of truth: the verdict, what was checked (mode, selection), frames, bytes and
time, then each pack (each shard of a dataset, each pack of a merged job-array report) with
its problems: frame id, name, check, offset, length, expected and found. Where a damaged frame
still decodes, its thumbnail is inlined (a ``data:`` JPEG), so a reviewer sees what is wrong.

Self-contained, for offline artifact viewers: CSS inline, no script, no external reference (no
link, no remote image, no web font); every value from the report is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import os
import time
from typing import Any

from ..durable import write_atomically
from ..errors import InputError
from ..read.dataset import open_pack
from ..units import format_bytes
from ..version import __version__
from .sheet import thumbnail

__all__ = ["MAX_PROBLEMS_SHOWN", "MAX_THUMBNAILS", "html_report", "write_html_report"]

#: problems listed per pack (the JSON report has them all)
MAX_PROBLEMS_SHOWN = 500
#: thumbnails of damaged frames inlined in one report (each a few KB)
MAX_THUMBNAILS = 60
THUMB_PX = 128

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #1d1d1f; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.verdict { padding: 14px 18px; border-radius: 8px; font-size: 20px; font-weight: 600; margin: 12px 0 18px; }
.ok { background: #e3f6e5; color: #11632a; } .problems { background: #fde4e4; color: #9b1c1c; }
.error { background: #fff4d6; color: #7a5200; }
table { border-collapse: collapse; margin: 6px 0 12px; } th, td { padding: 5px 10px; text-align: left;
  vertical-align: top; border-bottom: 1px solid #e2e2e2; } th { background: #f5f5f7; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; }
.status-ok { color: #11632a; font-weight: 600; } .status-problems { color: #9b1c1c; font-weight: 600; }
.status-error { color: #7a5200; font-weight: 600; } .muted { color: #6e6e73; }
img.thumb { max-width: 128px; max-height: 128px; border: 1px solid #ccc; }
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _verdict(doc: dict[str, Any]) -> tuple[str, str]:
    if doc.get("ok"):
        return "ok", f"OK: {doc.get('packs_total', 0)} pack(s), no problem found"
    if doc.get("problems"):
        return "problems", f"PROBLEMS: {doc['problems']} in {doc.get('packs_with_problems', 0)} pack(s)"
    return "error", f"NOT VERIFIED: {doc.get('packs_not_verified', 0)} pack(s) could not be checked"


def _rows(pairs: list[tuple[str, Any]]) -> str:
    return "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in pairs)


def _seconds(s: Any) -> str:
    return f"{float(s or 0):.2f} s"


def thumbnails_of(doc: dict[str, Any], limit: int = MAX_THUMBNAILS) -> dict[tuple[str, int], str]:
    """``data:`` URIs of thumbnails of the damaged frames that still decode, by (pack, frame
    id), for the first ``limit`` of them; a pack that cannot be opened (a merged report's pack
    elsewhere) or a frame that does not decode simply has none."""
    out: dict[tuple[str, int], str] = {}
    for p in doc.get("packs", []):
        ids = sorted({pr["frame_id"] for pr in p.get("problems", []) if pr.get("frame_id") is not None})
        ids = ids[: max(0, limit - len(out))]
        if not ids:
            continue
        try:
            reader = open_pack(p["pack"], p.get("index"))
        except Exception:  # (gone, elsewhere, unreadable: the report says so without a picture)
            continue
        with reader:
            for i in ids:
                try:
                    im = thumbnail(reader.read_many([i])[0], THUMB_PX)
                except Exception:
                    continue
                buf = io.BytesIO()
                im.save(buf, "JPEG", quality=85)
                out[(p["pack"], i)] = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    return out


def html_report(doc: dict[str, Any], thumbs: dict[tuple[str, int], str] | None = None, command: str = "") -> str:
    """The page for the report ``doc`` (``VerifyReport.to_dict()``), with ``thumbs`` from
    ``thumbnails_of``."""
    thumbs = thumbs or {}
    kind, words = _verdict(doc)
    rate = doc.get("bytes_per_s") or 0
    summary = [
        ("exit status", _e(doc.get("exit_code"))),
        (
            "packs",
            _e(
                f"{doc.get('packs_total', 0)} ({doc.get('packs_ok', 0)} ok, "
                f"{doc.get('packs_with_problems', 0)} with problems, {doc.get('packs_not_verified', 0)} not verified)"
            ),
        ),
        ("frames checked", _e(f"{doc.get('frames_checked', 0):,} of {doc.get('frames_total', 0):,}")),
        ("bytes checked", _e(format_bytes(int(doc.get("bytes_checked") or 0)))),
        ("time", _e(_seconds(doc.get("elapsed_s")) + (f" ({format_bytes(int(rate))}/s)" if rate else ""))),
        ("problems", _e(doc.get("problems", 0))),
        ("pack format version", _e(doc.get("format_version"))),
    ]
    if "part" in doc:
        part = doc["part"]
        summary.append(("job-array part", _e(f"{part['index']} of {part['count']}")))
    if command:
        summary.append(("command", f"<code>{_e(command)}</code>"))
    packs_table = "".join(
        "<tr>"
        f"<td><code>{_e(p['pack'])}</code></td>"
        f"<td class='status-{_e(p['status'])}'>{_e(p['status'])}</td>"
        f"<td>{_e(p.get('mode'))}</td><td>{_e(p.get('selection'))}</td>"
        f"<td class='num'>{p.get('frames_checked', 0):,} / {p.get('frames_total', 0):,}</td>"
        f"<td class='num'>{_e(format_bytes(int(p.get('bytes_checked') or 0)))}</td>"
        f"<td class='num'>{_e(_seconds(p.get('elapsed_s')))}</td>"
        f"<td class='num'>{len(p.get('problems', []))}</td>"
        f"<td>{_e(p.get('error') or '')}</td>"
        "</tr>"
        for p in doc.get("packs", [])
    )
    sections = []
    for p in doc.get("packs", []):
        problems = p.get("problems", [])
        if not problems and not p.get("error"):
            continue
        parts = [f"<h2>{_e(p['pack'])} <span class='status-{_e(p['status'])}'>{_e(p['status'])}</span></h2>"]
        if p.get("error"):
            parts.append(f"<p class='status-error'>could not be verified: {_e(p['error'])}</p>")
        if problems:
            rows = []
            for pr in problems[:MAX_PROBLEMS_SHOWN]:
                fid = pr.get("frame_id")
                uri = thumbs.get((p["pack"], fid)) if fid is not None else None
                picture = (
                    f"<img class='thumb' alt='frame {_e(fid)}' src='{uri}'>"
                    if uri
                    else "<span class='muted'>none</span>"
                )
                detail = ""
                if pr.get("expected") is not None or pr.get("found") is not None:
                    detail = (
                        f"<br><span class='muted'>expected</span> <code>{_e(pr.get('expected'))}</code>"
                        f"<br><span class='muted'>found</span> <code>{_e(pr.get('found'))}</code>"
                    )
                rows.append(
                    "<tr>"
                    f"<td class='num'>{_e(fid if fid is not None else '-')}</td>"
                    f"<td><code>{_e(pr.get('name') or '')}</code></td>"
                    f"<td>{_e(pr.get('check'))}</td>"
                    f"<td class='num'>{_e(pr.get('offset') if pr.get('offset') is not None else '')}</td>"
                    f"<td class='num'>{_e(pr.get('length') if pr.get('length') is not None else '')}</td>"
                    f"<td>{_e(pr.get('message'))}{detail}</td>"
                    f"<td>{picture}</td>"
                    "</tr>"
                )
            more = len(problems) - MAX_PROBLEMS_SHOWN
            parts.append(
                "<table><tr><th>frame</th><th>name</th><th>check</th><th>offset</th><th>length</th>"
                f"<th>what failed</th><th>thumbnail</th></tr>{''.join(rows)}</table>"
                + (
                    f"<p class='muted'>... and {more} more problems: the --json report lists all.</p>"
                    if more > 0
                    else ""
                )
            )
        sections.append("".join(parts))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>hframe verify: {_e(words)}</title><style>{_CSS}</style></head><body>"
        f"<h1>hframe verify</h1><div class='muted'>{_e(stamp)}, hframe {_e(__version__)}</div>"
        f"<div class='verdict {kind}' id='verdict'>{_e(words)}</div>"
        f"<table>{_rows(summary)}</table>"
        "<h2>Packs</h2><table><tr><th>pack</th><th>status</th><th>mode</th><th>selection</th><th>frames</th>"
        f"<th>bytes</th><th>time</th><th>problems</th><th>error</th></tr>{packs_table}</table>"
        + "".join(sections)
        + "</body></html>\n"
    )


def write_html_report(doc: dict[str, Any], path: str | os.PathLike[str], command: str = "") -> None:
    """Write the page for ``doc`` (with the thumbnails of its damaged frames) to ``path``,
    whole or not at all (``path.partial``, then a rename)."""
    page = html_report(doc, thumbnails_of(doc), command)
    try:
        write_atomically(path, page, durable=False)
    except OSError as e:
        raise InputError(f"{path}: cannot write the HTML report ({e.strerror or e})") from None
