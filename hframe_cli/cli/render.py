"""All presentation: rich tables on a terminal, plain text / TSV / CSV / JSON otherwise.

Data goes to stdout, everything else (progress, summaries, errors) to stderr. Whether a
stream is an interactive terminal is decided in one place, ``interactive()``, which the
``HFRAME_TTY`` environment variable (``1``/``0``) overrides for tests and scripts.

Imports inside functions: rich, tqdm and ElementTree when something is drawn or a JUnit report
written; ``names``/``durable`` where a sharded summary or a report needs them (start-up of every
command).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

from ..errors import InputError, StorageError
from ..locations import redact, shown_url
from ..units import count, format_bytes
from .rows import cell_text, default_hint, field_text, table_columns, write_rows

__all__ = ["dump_header", "error", "index_rows", "interactive", "pack_summary", "progress"]


def interactive(stream: IO[Any]) -> bool:
    """True when ``stream`` is a terminal a person watches (``HFRAME_TTY=1/0`` overrides)."""
    forced = os.environ.get("HFRAME_TTY")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich exits 1 here ("problems in the data" for hframe); raise what a plain write
            # raises instead, so the command decides its status (see cli.main and verify)
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "broken pipe")

    stream = sys.stderr if stderr else sys.stdout
    return _Console(file=stream, force_terminal=interactive(stream), highlight=False, soft_wrap=False)


def error(message: str) -> None:
    """One line on stderr: ``hframe: error: <message>`` (a URL's password hidden, as in every
    message line: ``locations.redact``)."""
    sys.stderr.write(f"hframe: error: {redact(message)}\n")
    sys.stderr.flush()


def note(message: str) -> None:
    sys.stderr.write(f"hframe: {redact(message)}\n")


def warning(message: str) -> None:
    """One line on stderr, even with ``-q``: something an operator should know (a run died)."""
    sys.stderr.write(f"hframe: warning: {redact(message)}\n")
    sys.stderr.flush()


def locked_skip(output: str, message: str, as_json: bool, quiet: bool) -> None:
    """``--skip-if-locked`` met a lock: nothing was done, and that is not an error."""
    if as_json:
        print_json({"ok": True, "pack": output, "skipped": "locked", "reason": message})
    elif not quiet:
        note(f"skipped: {message}")


#: a ``--json`` document went to standard output in this process (``json_failure`` then adds none)
json_printed = False


def print_json(doc: Any) -> None:
    global json_printed
    json_printed = True
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=_json_default) + "\n")


def json_failure(message: str, exit_code: int) -> None:
    """A ``--json`` command that failed before it printed its document prints this one instead:
    ``jq`` after it reads a verdict, not an empty input. The same one line went to stderr."""
    if not json_printed:
        print_json({"ok": False, "error": message, "exit_code": exit_code})


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


@contextmanager
def progress(total_frames: int, total_bytes: int, quiet: bool, label: str = "packing") -> Iterator[Any]:
    """A progress callback ``(frames_done, bytes_done)``: a bar on a terminal, else nothing."""
    if quiet or not interactive(sys.stderr):
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        desc=label,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
        mininterval=0.2,
    )
    state = {"bytes": 0}

    def update(frames: int, done: int) -> None:
        bar.update(done - state["bytes"])
        state["bytes"] = done
        bar.set_postfix_str(f"{frames}/{total_frames} frames", refresh=False)

    try:
        yield update
    finally:
        bar.close()


def progress_factory(quiet: bool, label: str) -> Callable[[int, int], Any] | None:
    """``progress`` with ``label``, for a core call that first works out its totals; None where
    no bar would be shown, so that the call does not work them out for nothing."""
    if quiet or not interactive(sys.stderr):
        return None
    return lambda frames, nbytes: progress(frames, nbytes, False, label=label)


def event_logger(quiet: bool) -> Callable[[str], None] | None:
    """One line per event (start, checkpoint, resume point, skipped, done) on stderr, when not
    quiet and not on a terminal (a terminal shows the progress bar instead)."""
    if quiet or interactive(sys.stderr):
        return None

    def log(message: str) -> None:
        sys.stderr.write(f"hframe: {redact(message)}\n")
        sys.stderr.flush()

    return log


def resume_summary(outcome: Any, output: str, as_json: bool, quiet: bool) -> None:
    output = shown_url(output)
    if outcome.status == "skipped":
        locked_skip(output, outcome.notes[0], as_json, quiet)
        return
    res = outcome.result
    if not quiet:
        for line in outcome.notes:  # warnings (a torn checkpoint): stderr, even with --json
            note(line)
    if as_json:
        doc = res.to_dict() if res is not None else {"ok": True, "pack": output, "resumed_from_frame": None}
        doc["status"] = outcome.status
        print_json(doc)
        return
    if res is None:
        if not quiet:
            note(
                f"{output}: "
                + (
                    "already complete; nothing to resume"
                    if outcome.status == "already_complete"
                    else "uploading finished"
                    if outcome.status == "published"
                    else "publishing finished"
                )
            )
        return
    verb = {"resumed": f"resumed from frame {res.resumed_from_frame}:", "restarted": "started over:"}[outcome.status]
    pack_summary(res, False, quiet, verb=f"{verb} packed")


def pack_outcome(outcome: Any, as_json: bool, quiet: bool) -> None:
    """What ``pack`` did, in the form its mode calls for (``api.PackOutcome``); for an
    object-store output, what was uploaded (JSON: ``published``; else one more line)."""
    published = getattr(outcome, "published", None)
    extra = {"published": published.to_dict()} if published is not None else None
    if outcome.mode == "plan":
        files, nbytes = outcome.planned
        if as_json:
            print_json({"ok": True, "plan": outcome.plan_file, "files": files, "bytes": nbytes})
        elif not quiet:
            note(
                f"planned {count(files, 'file')} ({format_bytes(nbytes)}) for {outcome.output}: {outcome.plan_file}; "
                f"pack from it with 'hframe pack --plan {outcome.plan_file} -o OUT' (with --shard-of I/N, one part)"
            )
    elif outcome.mode == "skipped":
        locked_skip(outcome.output, outcome.skipped, as_json, quiet)
    elif outcome.mode == "dry-run":
        dry_run(outcome.plan, outcome.output, as_json, quiet)
    elif outcome.mode == "update":
        update_summary(outcome.plan, outcome.result, outcome.output, as_json, quiet, extra)
    elif outcome.mode == "sharded":
        sharded_summary(outcome.manifest, outcome.results, outcome.output, as_json, quiet, extra)
    else:
        pack_summary(outcome.result, as_json, quiet, extra=extra)
    if published is not None and not as_json and not quiet:
        note(published.summary(outcome.output))


def update_summary(
    plan: Any, result: Any, output: str, as_json: bool, quiet: bool, extra: dict[str, Any] | None = None
) -> None:
    if as_json:
        doc = result.to_dict() if result is not None else {"ok": True, "pack": output}
        doc["update"] = plan.to_dict()
        doc["changed"] = plan.status != "up_to_date"
        print_json({**doc, **(extra or {})})
        return
    if result is None:
        if not quiet:
            note(f"{output}: up to date ({count(plan.frames, 'frame')}; nothing changed, nothing written)")
        return
    verb = {"new": "packed", "append": f"appended {len(plan.added)} new files:", "repack": "repacked"}[plan.status]
    pack_summary(result, False, quiet, verb=verb)


def dry_run(plan: Any, output: str, as_json: bool, quiet: bool) -> None:
    """``pack --update --dry-run``: one line per file that would be written or dropped, on
    stdout (``new``, ``changed``, ``removed``, then the name, then why), and what the run would do
    on stderr."""
    files = count(len(plan.added), "new file")
    frames = count(plan.frames, "frame")
    would = {
        "new": f"would be a new pack of {files}",
        "up_to_date": f"is up to date ({frames}): nothing would be written",
        "append": f"would get {files} appended to its {frames} (ids kept)",
        "repack": f"would be repacked ({plan.summary()}; {frames} now)",
    }[plan.status]
    if as_json:
        doc = {"ok": True, "pack": output, "dry_run": True, "update": plan.to_dict(), "leftover": plan.leftover}
        doc["files"] = [_plan_item(what, name, why) for what, name, why in _plan_rows(plan)]
        print_json(doc)
        return
    out = sys.stdout
    for what, name, why in _plan_rows(plan):
        out.write(f"{what:<8} {name}" + (f"  ({why})" if why else "") + "\n")
    out.flush()
    if not quiet:
        note(f"dry run: {output} {would}" + (f"; {plan.leftover}" if plan.leftover else ""))


def _plan_rows(plan: Any) -> Iterator[tuple[str, str, str | None]]:
    def shown(name: bytes) -> str:  # as index shows it: control characters cannot fake a line
        return cell_text(name.decode("utf-8", "backslashreplace"))

    for s in plan.added:
        yield "new", shown(s.name), None
    for name in plan.changed:
        yield "changed", shown(name), plan.reasons.get(name)
    for name in plan.removed:
        yield "removed", shown(name), None


def _plan_item(what: str, name: str, why: str | None) -> dict[str, Any]:
    return {"change": what, "name": name, **({"why": why} if why else {})}


def sharded_summary(
    manifest: Any, results: Any, output: str, as_json: bool, quiet: bool, extra: dict[str, Any] | None = None
) -> None:
    from ..names import manifest_name  # (here: every command imports this module at start-up)

    if as_json:
        print_json(
            {
                **(extra or {}),
                "ok": True,
                "dataset": output,
                "manifest": manifest_name(output),
                "frame_count": manifest.frame_count,
                "shards": [
                    {
                        "path": e.path,
                        "uuid": e.uuid,
                        "frame_count": e.frame_count,
                        "pack_bytes": e.pack_bytes,
                        "first_frame": e.first_frame,
                    }
                    for e in manifest.shards
                ],
                "skipped": [{"path": r.path, "reason": r.reason} for res in results for r in res.skipped],
            }
        )
        return
    for res in results:
        for r in res.skipped:
            note(f"skipped {r.path}: {r.reason}")
    if not quiet:
        total = sum(e.pack_bytes for e in manifest.shards)
        note(
            f"packed {count(manifest.frame_count, 'frame')} into {count(len(manifest.shards), 'shard')} "
            f"({format_bytes(total)}); "
            f"dataset manifest {shown_url(manifest_name(output))}"
        )


def pack_summary(
    result: Any, as_json: bool, quiet: bool, verb: str = "packed", extra: dict[str, Any] | None = None
) -> None:
    if as_json:
        print_json({**result.to_dict(), **(extra or {})})
        return
    for r in result.skipped:
        note(f"skipped {r.path}: {r.reason}")
    if quiet:
        return
    rate = result.payload_bytes / result.elapsed_s if result.elapsed_s > 0 else 0.0
    note(
        f"{verb} {count(result.frame_count, 'frame')} ({format_bytes(result.payload_bytes)}) into {result.path} "
        f"in {result.elapsed_s:.2f} s ({format_bytes(rate)}/s); self-check of {count(result.self_checked, 'frame')} "
        f"ok"
        + (f"; skipped {len(result.skipped)}" if result.skipped else "")
        + (f"; {count(len(result.warnings), 'warning')}" if getattr(result, "warnings", None) else "")
    )


def _flatten(prefix: str, doc: Any, out: list[tuple[str, str]]) -> None:
    if isinstance(doc, dict):
        for k, v in doc.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    elif isinstance(doc, list):
        for k, v in enumerate(doc):
            _flatten(f"{prefix}.{k}", v, out)
    else:
        text = "" if doc is None else str(doc).lower() if isinstance(doc, bool) else str(doc)
        out.append((prefix, text))


def dump_header(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    rows: list[tuple[str, str]] = []
    _flatten("", doc, rows)
    if interactive(sys.stdout):
        from rich.table import Table

        table = Table(show_header=True, header_style="bold")
        table.add_column("field")
        table.add_column("value", overflow="fold")
        for k, v in rows:
            table.add_row(k, v)
        _console().print(table)
    else:
        for k, v in rows:
            sys.stdout.write(f"{k}\t{field_text(v)}\n")


def frame_head(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    sys.stdout.write(
        f"frame {doc['frame_id']} {field_text(doc['name'])}: offset {doc['offset']}, length {doc['length']}, "
        f"index type {doc['media_type']}, sniffed {doc['sniffed_type']}\n"
    )
    raw = bytes.fromhex(doc["hex"].replace(" ", ""))
    for start in range(0, len(raw), 16):
        chunk = raw[start : start + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        sys.stdout.write(f"{doc['offset'] + start:012x}  {chunk.hex(' '):<47}  {text}\n")


def index_rows(table: pa.Table, fmt: str | None, *, header: bool = True, columns_given: bool = False) -> None:
    """Print index rows in ``fmt`` (default: an aligned table on a terminal, TSV on a pipe).

    The table without ``columns_given`` shows ``rows.TABLE_COLUMNS`` and says on stderr how to
    see the rest; every other format prints every column (pipes keep the full TSV)."""

    if fmt is None:
        fmt = "table" if interactive(sys.stdout) else "tsv"
    hint = None
    if fmt == "table" and not columns_given:
        shown = table_columns(table)
        hint = default_hint(shown, table.column_names, table.num_rows)
        table = table.select(shown)
    write_rows(table, fmt, sys.stdout, header=header)
    sys.stdout.flush()
    if hint is not None:
        note(hint)


# -- verify ---------------------------------------------------------------------------------

MAX_PROBLEM_LINES = 20


def _pack_line(p: Any) -> str:
    rate = p.bytes_checked / p.elapsed_s if p.elapsed_s > 0 else 0.0
    facts = (
        f"{p.frames_checked} of {count(p.frames_total, 'frame')} checked ({p.selection}, {p.mode}), "
        f"{format_bytes(p.bytes_checked)} in {p.elapsed_s:.2f} s ({format_bytes(rate)}/s)"
    )
    if p.error:
        return _cannot_verify(p)
    if not p.problems:
        return f"{p.pack}: ok: {facts}"
    more = "; stopped early (--max-errors)" if p.stopped_early else ""
    return f"{p.pack}: {_problems_in_frames(p)}: {facts}{more}"


def _problems_in_frames(p: Any) -> str:
    return f"{count(len(p.problems), 'problem')} in {count(len(p.bad_frames), 'frame')}"


def _cannot_verify(p: Any) -> str:
    """``PACK: cannot verify: why``, the pack named once (errors often start with it already)."""
    why = p.error.removeprefix(f"{p.pack}: ")
    return f"{p.pack}: cannot verify: {why}"


def verify_report(report: Any, *, as_json: bool, as_jsonl: bool, quiet: bool) -> None:
    """Print a ``VerifyReport``: table on a terminal, plain lines on a pipe, or JSON / JSONL."""
    if as_json:
        print_json(report.to_dict())
        return
    if as_jsonl:
        for p in report.packs:
            if p.error:
                sys.stdout.write(json.dumps({"pack": p.pack, "check": "error", "message": p.error}) + "\n")
            for prob in p.problems:
                sys.stdout.write(json.dumps({"pack": p.pack, **prob.to_dict()}, ensure_ascii=False) + "\n")
        return
    if quiet:
        return
    out = sys.stdout
    for p in report.packs:
        if p.error:  # an error, not a finding: stderr, as every other command's
            sys.stderr.write(_cannot_verify(p) + "\n")
        for prob in p.problems[:MAX_PROBLEM_LINES]:
            out.write(prob.message + "\n")
        if len(p.problems) > MAX_PROBLEM_LINES:
            out.write(f"{p.pack}: ... and {len(p.problems) - MAX_PROBLEM_LINES} more problems (--json lists all)\n")
    if interactive(out):
        from rich.table import Table

        t = Table(show_header=True, header_style="bold")
        for col in ("pack", "status", "frames", "checked", "bytes", "MB/s", "problems"):
            t.add_column(col, justify="right" if col not in ("pack", "status") else "left")
        for p in report.packs:
            rate = p.bytes_checked / p.elapsed_s / 1e6 if p.elapsed_s > 0 else 0.0
            style = {"ok": "green", "problems": "red", "error": "yellow"}[p.status]
            t.add_row(
                p.pack,
                f"[{style}]{p.status}[/]",
                str(p.frames_total),
                str(p.frames_checked),
                format_bytes(p.bytes_checked),
                f"{rate:.0f}",
                str(len(p.problems)),
            )
        _console().print(t)
    else:
        for p in report.packs:
            if not p.error:
                out.write(_pack_line(p) + "\n")
    if len(report.packs) > 1:
        d = report.to_dict()
        out.write(
            f"verified {count(d['packs_total'], 'pack')}: {d['packs_ok']} ok, {d['packs_with_problems']} with problems, "
            f"{d['packs_not_verified']} not verified; {count(d['frames_checked'], 'frame')}, "
            f"{format_bytes(d['bytes_checked'])} checked\n"
        )


def verify_outcome(report: Any, *, junit: str | None, as_json: bool, as_jsonl: bool, quiet: bool) -> None:
    """The JUnit file if asked, then the report on stdout (a reader that stops early, ``| head``,
    changes nothing: the verdict is the exit status)."""
    if junit is not None:
        write_junit(report, junit)
    try:
        verify_report(report, as_json=as_json, as_jsonl=as_jsonl, quiet=quiet)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def write_junit(report: Any, path: str) -> None:
    """A JUnit XML file with one testcase per pack (failure = problems, error = cannot verify)."""
    from xml.etree import ElementTree as ET

    from ..durable import replaced  # (here: every command imports this module at start-up)

    d = report.to_dict()
    suite = ET.Element(
        "testsuite",
        name="hframe verify",
        tests=str(d["packs_total"]),
        failures=str(d["packs_with_problems"]),
        errors=str(d["packs_not_verified"]),
        time=f"{d['elapsed_s']:.3f}",
    )
    for p in report.packs:
        case = ET.SubElement(suite, "testcase", classname="hframe.verify", name=p.pack, time=f"{p.elapsed_s:.3f}")
        if p.error:
            ET.SubElement(case, "error", message=p.error).text = p.error
        elif p.problems:
            el = ET.SubElement(case, "failure", message=_problems_in_frames(p))
            el.text = "\n".join(prob.message for prob in p.problems)
        ET.SubElement(case, "system-out").text = _pack_line(p)
    root = ET.Element("testsuites")
    root.append(suite)
    tree = ET.ElementTree(root)
    ET.indent(tree)
    try:
        with replaced(path, durable=False) as tmp:  # a report: never torn, and a crash may lose it
            tree.write(tmp, encoding="utf-8", xml_declaration=True)
    except OSError as e:  # a path that cannot name a file is bad input; a disk that fails is not
        bad_path = e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EROFS)
        raise (InputError if bad_path else StorageError)(
            f"{path}: cannot write the JUnit report ({e.strerror})"
        ) from None


# -- bench ------------------------------------------------------------------------------------


def _side_line(label: str, d: dict[str, Any]) -> str:
    fl, bl = d["frame_latency_ms"], d["batch_latency_ms"]
    line = (
        f"{label}: {d['frames_per_s']:.0f} frames/s, {d['mb_per_s']:.1f} MB/s; frame latency ms p50 {fl['p50']:.3f} "
        f"p95 {fl['p95']:.3f} p99 {fl['p99']:.3f} max {fl['max']:.3f}; batch ms p50 {bl['p50']:.2f} p99 {bl['p99']:.2f}; "
        f"{d['read_calls']} read calls, {format_bytes(d['bytes_read'])} read for {format_bytes(d['bytes_requested'])} requested"
    )
    if d["decode_s"] is not None:
        line += f"; decode {d['decode_frames_per_s']:.0f} frames/s ({d['decode_s']:.3f} s)"
    if d["md5_checked"]:
        line += f"; md5 {d['md5_checked'] - d['md5_mismatches']}/{d['md5_checked']} ok"
    return line


def bench_result(result: Any, as_json: bool) -> None:
    """Print a ``BenchResult``: JSON, a table on a terminal, or plain lines on a pipe."""
    d = result.to_dict()
    if as_json:
        print_json(d)
        return
    head = (
        f"bench-{d['mode']} {d['pack']}: {d['batches']} batches x {d['frames_per_batch']} frames, sampler "
        f"{d['sampler']} (seed {d['seed']}), workers {d['workers']}, coalesce gap {d['coalesce_gap']}, "
        f"cache {d['cache_method']}" + (", memory map" if d["memory_map"] else "")
    )
    if d["mode"] == "cold" and not d["cold"]:
        head += " -- WARNING: the page cache could not be evicted, these numbers are NOT cold"
    out = sys.stdout
    if interactive(out):
        from rich.table import Table

        sides = [("hframe", d["hframe"])] + ([("loose files", d["loose"])] if d["loose"] else [])
        t = Table(title=head, show_header=True, header_style="bold", title_justify="left")
        t.add_column("metric")
        for label, _ in sides:
            t.add_column(label, justify="right")
        rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
            ("frames/s", lambda s: f"{s['frames_per_s']:.0f}"),
            ("MB/s", lambda s: f"{s['mb_per_s']:.1f}"),
            (
                "frame latency p50 / p95 / p99 / max (ms)",
                lambda s: " / ".join(f"{s['frame_latency_ms'][k]:.3f}" for k in ("p50", "p95", "p99", "max")),
            ),
            (
                "batch latency p50 / p99 (ms)",
                lambda s: f"{s['batch_latency_ms']['p50']:.2f} / {s['batch_latency_ms']['p99']:.2f}",
            ),
            ("read calls", lambda s: str(s["read_calls"])),
            (
                "bytes read / requested",
                lambda s: f"{format_bytes(s['bytes_read'])} / {format_bytes(s['bytes_requested'])}",
            ),
        ]
        if d["hframe"]["decode_s"] is not None:
            rows.append(
                ("decode frames/s", lambda s: "" if s["decode_s"] is None else f"{s['decode_frames_per_s']:.0f}")
            )
        for name, fn in rows:
            t.add_row(name, *[fn(s) for _, s in sides])
        _console().print(t)
    else:
        out.write(head + "\n")
        out.write(_side_line("hframe", d["hframe"]) + "\n")
        if d["loose"]:
            out.write(_side_line("loose", d["loose"]) + "\n")
    if d["ratio_vs_loose"] is not None:
        out.write(f"hframe vs loose files: {d['ratio_vs_loose']:.2f}x the frames/s\n")
    if d.get("remote"):
        out.write(_remote_line(d["remote"]) + "\n")


def _remote_line(c: dict[str, int]) -> str:
    """``remote: 41 requests, 10.2 MB, 2 retries, 0 throttles`` (a remote pack's counters)."""
    return (
        f"remote: {c['requests']} requests, {format_bytes(c['bytes'])}, {c['retries']} retries, "
        f"{c['throttles']} throttles"
    )


def prefetched(doc: dict[str, Any], as_json: bool, quiet: bool) -> None:
    if as_json:
        print_json(doc)
        return
    if not quiet:
        note(
            f"{doc['pack']}: {count(doc['frames'], 'frame')} ({format_bytes(doc['bytes'])}) in the cache: "
            f"{doc['fetched']} fetched ({format_bytes(doc['fetched_bytes'])}, {count(doc['requests'], 'request')}), "
            f"{doc['held_already']} held already, in {doc['seconds']:.2f} s"
        )


def sheet_drawn(doc: dict[str, Any], output: str, as_json: bool, quiet: bool) -> None:
    """After ``hframe sheet``: its layout and tiles as JSON, or one line."""
    if as_json:
        print_json({"output": output, **doc})
    elif not quiet and output != "-":
        bad = f", {doc['undecodable']} that could not be decoded" if doc["undecodable"] else ""
        note(
            f"wrote {output}: {count(doc['frames'], 'frame')} of {doc['selected']}{bad}, "
            f"{doc['width']} x {doc['height']} px"
        )


def cache_report(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    out = sys.stdout
    out.write(f"{doc['cache']}: {format_bytes(doc['bytes'])} of {format_bytes(doc['limit'])}")
    out.write(f", {format_bytes(doc['freed'])} freed\n" if doc["freed"] else "\n")
    for p in doc["packs"]:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(p["last_used"])) if p["last_used"] else "-"
        out.write(
            f"{p['url']}\t{p['uuid']}\t{format_bytes(p['bytes'])}\tused {used}\t"
            f"{p['hits']} hits, {p['misses']} misses\n"
        )
    kept = doc.get("kept") or {}
    if kept.get("files"):
        files = f"{kept['files']} file{'s' if kept['files'] != 1 else ''}"
        out.write(f"kept opens (headers, indexes)\t{files}\t{format_bytes(kept['bytes'])}\n")
    for o in doc.get("old_layouts", []):
        out.write(
            f"{o['folder']}: {format_bytes(o['bytes'])} of an older hframe's cache, not read (--clear removes it)\n"
        )
