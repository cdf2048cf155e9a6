"""The ``hframe`` command: typer options → one core call → render. Errors → exit codes in ``main``.

Imports inside functions: each command imports the core it calls, so that ``hframe -V``,
``--help`` and a locked run start fast (start-up is measured by ``scripts/bench_perframe.py``).
"""

# No ``from __future__ import annotations`` here: typer would then eval every option's annotation
# string at start-up (about 50 ms on every command).
import contextlib
import os
import shlex
import sys
import warnings
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from ..errors import (
    EXIT_DATA,
    EXIT_ENV,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    HframeError,
    InputError,
)
from ..locations import redact
from ..read.cache import CacheWarning
from ..signals import pending_signal
from ..units import count, parse_created, parse_size
from ..version import __version__
from . import render

app = typer.Typer(
    name="hframe",
    help="Build and inspect frame packs: many small media files in one file, with a Parquet index.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help as tar and git print it: plain text, the same on a terminal and a pipe
    epilog="See 'man hframe' for every command, option and exit code, and 'man 5 hframe' for the file format.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        metavar="SECONDS",
        help="If another run holds the output, wait up to SECONDS for it (like flock -w); default: exit 3 at once.",
        min=0,
    ),
]
SkipLockedOpt = Annotated[
    bool,
    typer.Option(
        "--skip-if-locked",
        help="If another run holds the output, do nothing and exit 0 (cron: an overlapping run is not an error).",
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no summary; errors only.")]
#: the pack a reading command reads: every location the reader opens
PackArg = Annotated[
    str,
    typer.Argument(
        metavar="PACK",
        help="The pack or dataset: a file, or a URL (http(s)://, s3://, gs://, hdfs://).",
    ),
]
#: the name filter, one spelling in every command (``index`` took ``--name GLOB``, still accepted)
MatchOpt = Annotated[
    Optional[str], typer.Option("--match", metavar="GLOB", help="Only frames whose name matches this glob.")
]
LabelOpt = Annotated[Optional[str], typer.Option("--label", metavar="LABEL", help="Only frames with this label.")]
SplitOpt = Annotated[
    Optional[str], typer.Option("--split", metavar="SPLIT", help="Only frames in this split (train, val, ...).")
]
KindOpt = Annotated[
    Optional[str], typer.Option("--kind", metavar="KIND", help="Only frames of this kind: image, video_frame or blob.")
]


# 1-3 real examples per command, shown at the end of its --help (tests/cli/test_docs.py checks that
# every flag they use exists). No square brackets: rich would read them as markup.
EXAMPLES = {
    "pack": [
        "hframe pack photos/ -o photos.hframe",
        "find photos -name '*.jpg' | hframe pack - -o jpegs.hframe --base photos",
        "hframe pack photos/ -o photos.hframe --update -q --skip-if-locked    # cron",
    ],
    "resume": [
        "hframe resume photos.hframe                # after a crash, kill or Ctrl-C",
        "hframe resume photos.hframe --rescan       # the inputs changed meanwhile: start over",
    ],
    "verify": [
        "hframe verify photos.hframe",
        "hframe verify '*.hframe' --sample 5% --seed 7",
        "hframe verify photos.hframe --junit junit.xml --json > report.json    # CI",
    ],
    "bench-cold": [
        "hframe bench-cold photos.hframe --frames 256 --batches 20",
        "hframe bench-cold photos.hframe --compare photos/ --json",
    ],
    "bench-warm": [
        "hframe bench-warm photos.hframe --frames 256 --batches 20 --seed 1",
        "hframe bench-warm photos.hframe --sampler block-local --decode",
    ],
    "dump-header": [
        "hframe dump-header photos.hframe",
        "hframe dump-header photos.hframe --frame 42 --bytes 16",
    ],
    "index": [
        "hframe index photos.hframe                                # a readable table on a terminal",
        "hframe index photos.hframe -c frame_id,name,length --label cats -f csv",
        "hframe index photos.hframe --rebuild",
    ],
    "prefetch": [
        "hframe prefetch https://data.example.com/train.hframe --cache-dir /local/hframe-cache",
        "HFRAME_CACHE_DIR=/local/cache hframe prefetch s3://bucket/train.hframe --sample 20000 --seed 1",
        "hframe prefetch s3://bucket/train.hframe --part 3/8    # this node's eighth",
    ],
    "cache": [
        "hframe cache --cache-dir /local/hframe-cache",
        "hframe cache --cache-dir /local/hframe-cache --prune --cache-limit 200G --json",
    ],
    "get": [
        "hframe get photos.hframe 42 > a.jpg",
        "hframe get photos.hframe 1 2 3 -o out/",
        "hframe index photos.hframe -c name --label cats --no-header | hframe get photos.hframe -T - --format tar | tar x",
    ],
    "mount": [
        "mkdir -p mnt && hframe mount photos.hframe mnt --background && ls -l mnt/cats && hframe umount mnt",
        "mkdir -p mnt && hframe mount https://data.example.com/photos.hframe mnt",
    ],
    "umount": ["mkdir -p mnt && hframe mount photos.hframe mnt -b && hframe umount mnt"],
    "sheet": [
        "hframe sheet photos.hframe -o sheet.jpg",
        "hframe sheet photos.hframe --label cats --sample 32 --seed 7 -o cats.png",
        "hframe sheet photos.hframe 0 1 2 3 --columns 2 --tile 128 -o first4.png",
    ],
}


CommandFunction = TypeVar("CommandFunction", bound=Callable[..., Any])


class _Command(typer.core.TyperCommand):
    """Help as tar and git print it: ``Usage: hframe get [OPTIONS] PACK [FRAME...]`` (typer would
    write ``{PACK}``), and the examples verbatim at the end, one a line, never rewrapped."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                metavar = param.metavar or (param.name or "").upper()
                pieces.append(metavar if param.required else f"[{metavar}]")
        return pieces

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        if self.epilog:
            formatter.write_paragraph()
            formatter.write("Examples:\n")
            for line in self.epilog.splitlines():
                formatter.write(f"  {line}\n")


def _command(name: str, short: str) -> Callable[[CommandFunction], CommandFunction]:
    """``@app.command`` with hframe's help layout, a short line for ``hframe -h`` and the examples."""
    return app.command(name, cls=_Command, short_help=short, epilog="\n".join(EXAMPLES[name]))


class RowFormat(str, Enum):
    table = "table"
    tsv = "tsv"
    csv = "csv"
    jsonl = "jsonl"
    json = "json"


def _version(value: bool) -> None:
    if value:
        from ..format.hashing import md5x
        from ..native import describe
        from ..sources.compiled import scan
        from ..verify.compiled import walk
        from ..write.compiled import blobs

        md5 = f"md5 x16 {md5x.ISAS[md5x.isa()]}" if md5x is not None else "md5"
        parts = {"list": scan, "pack": blobs, "verify": walk, md5: md5x}
        sys.stdout.write(f"hframe {__version__} ({describe(parts)})\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    io_timeout: Annotated[
        Optional[float],
        typer.Option(
            "--io-timeout",
            metavar="SECONDS",
            help="Remote packs: give up a read (with its retries) after this long (default 120; HFRAME_IO_TIMEOUT).",
            min=0.001,
        ),
    ] = None,
    cache_dir: Annotated[
        Optional[str],
        typer.Option(
            "--cache-dir",
            metavar="DIR",
            help="Remote packs: keep and read frames in this node-local cache (HFRAME_CACHE_DIR; '' for none).",
        ),
    ] = None,
    cache_limit: Annotated[
        Optional[str],
        typer.Option(
            "--cache-limit",
            metavar="SIZE",
            help="The most the cache may hold, e.g. 200G (HFRAME_CACHE_LIMIT; default: half its disk).",
        ),
    ] = None,
) -> None:
    """Build and inspect frame packs: many small media files in one file, with a Parquet index."""
    if io_timeout is not None:  # read by remote.RequestPolicy.from_env wherever a remote file opens
        os.environ["HFRAME_IO_TIMEOUT"] = repr(io_timeout)
    # read by read/cache.cache_settings wherever a remote pack opens (this process's readers)
    if cache_dir is not None:
        os.environ["HFRAME_CACHE_DIR"] = cache_dir
    if cache_limit is not None:
        parse_size(cache_limit, "--cache-limit")  # (refused here, not at the first remote read)
        os.environ["HFRAME_CACHE_LIMIT"] = cache_limit


def _frame_key(frame: str, by_name: bool) -> int | str:
    return int(frame) if frame.isdigit() and not by_name else frame


@_command("pack", "Pack files into one pack and its Parquet index.")
def pack(
    sources: Annotated[
        list[str],
        typer.Argument(
            metavar="SOURCE...",
            help="Files, folders (recursive), s3:// gs:// hdfs:// prefixes, or - for a list on stdin (with --from: "
            "archives or tables; with --plan: the plan).",
        ),
    ],
    output: Annotated[str, typer.Option("--output", "-o", metavar="FILE", help="The pack to write (.hframe).")],
    from_archive: Annotated[
        Optional[str],
        typer.Option(
            "--from",
            metavar="tar|zip|parquet",
            help="Every SOURCE is an archive or a Parquet table (globs and {000..099} ranges expanded): pack its "
            "members, read in place as if it were extracted, or its rows (with --column).",
        ),
    ] = None,
    column: Annotated[
        Optional[str],
        typer.Option(
            "--column",
            metavar="COL",
            help="--from parquet: the binary column of the frames' bytes (a struct's field as image.bytes).",
        ),
    ] = None,
    name_column: Annotated[
        Optional[str],
        typer.Option(
            "--name-column",
            metavar="COL",
            help="--from parquet: the column of the frames' names (default: TABLE/ROW-NUMBER).",
        ),
    ] = None,
    label_column: Annotated[
        Optional[str],
        typer.Option(
            "--label-column",
            metavar="COL",
            help="--from parquet: the column of the frames' labels (class numbers as their names, when the table says them).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing pack.")] = False,
    align: Annotated[
        int,
        typer.Option("--align", metavar="N", help="Start every payload on a multiple of N bytes (4096 for O_DIRECT)."),
    ] = 1,
    created: Annotated[
        Optional[str],
        typer.Option(
            "--created",
            metavar="TIME",
            help="Fixed creation time (epoch seconds or ISO 8601); makes the output reproducible. Default: SOURCE_DATE_EPOCH, else now.",
        ),
    ] = None,
    include: Annotated[
        Optional[list[str]],
        typer.Option("--include", metavar="GLOB", help="Only names matching this glob (repeatable)."),
    ] = None,
    exclude: Annotated[
        Optional[list[str]],
        typer.Option("--exclude", metavar="GLOB", help="Leave out names matching this glob (repeatable)."),
    ] = None,
    base: Annotated[
        Optional[str],
        typer.Option(
            "--base",
            metavar="DIR",
            help="Name files relative to DIR (default: relative to a folder argument; listed files by their path as given, as tar); a URL names files at URLs relative to it.",
        ),
    ] = None,
    null: Annotated[bool, typer.Option("--null", "-0", help="The stdin list is NUL-separated (find -print0).")] = False,
    skip_bad: Annotated[
        bool,
        typer.Option(
            "--skip-bad",
            help="Leave out unreadable, vanished, changed, empty, oversized or duplicate inputs instead of failing.",
        ),
    ] = False,
    allow_empty: Annotated[bool, typer.Option("--allow-empty", help="Pack zero-byte files as empty frames.")] = False,
    max_frame_bytes: Annotated[
        str, typer.Option("--max-frame-bytes", metavar="SIZE", help="Refuse inputs larger than this (e.g. 256MiB).")
    ] = "1GiB",
    self_check: Annotated[
        int, typer.Option("--self-check", metavar="N", help="Frames read back from disk and checked before publishing.")
    ] = 20,
    workers: Annotated[
        Optional[int],
        typer.Option(
            "--workers",
            metavar="N",
            help="Packing processes (default: one per CPU, up to 8, for 2,000+ files or 64 MiB+; 1: this "
            "process alone). Packs with --align, a zstd dictionary or videos use N reader threads instead. "
            "The bytes are the same for every N.",
            min=1,
        ),
    ] = None,
    checkpoint_every: Annotated[
        int,
        typer.Option("--checkpoint-every", metavar="N", help="Checkpoint every N frames (0: never by count).", min=0),
    ] = 100_000,
    checkpoint_bytes: Annotated[
        str,
        typer.Option(
            "--checkpoint-bytes", metavar="SIZE", help="Checkpoint every SIZE bytes written (0: never by size)."
        ),
    ] = "4GiB",
    checkpoint_seconds: Annotated[
        float,
        typer.Option(
            "--checkpoint-seconds", metavar="SECONDS", help="Checkpoint every S seconds (0: never by time).", min=0
        ),
    ] = 30.0,
    no_checkpoint: Annotated[
        bool, typer.Option("--no-checkpoint", help="Write no checkpoints (a crashed run cannot be resumed).")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Continue an interrupted run of this output instead (same as 'hframe resume OUTPUT')."
        ),
    ] = False,
    max_pack_bytes: Annotated[
        str,
        typer.Option(
            "--max-pack-bytes",
            metavar="SIZE",
            help="Split the output into shards NAME-00000.hframe... of at most SIZE, with a dataset manifest NAME.hframe.dataset.json.",
        ),
    ] = "16GiB",
    shard_of: Annotated[
        Optional[str],
        typer.Option(
            "--shard-of",
            metavar="I/N|env|env/N",
            help="Pack only part I of N of the sorted inputs, as NAME-0000I.hframe (job arrays; merge with 'hframe index NAME --merge'). env: I and N from a Slurm array; env/N: I from Slurm or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX).",
        ),
    ] = None,
    plan_only: Annotated[
        bool,
        typer.Option(
            "--plan-only",
            help="List the sources once and write them, sorted and checked, to OUT.plan.parquet; pack nothing (job arrays: every part then reads it with --plan).",
        ),
    ] = False,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="SOURCE is a plan written by --plan-only: take the sources from it instead of listing them.",
        ),
    ] = False,
    update: Annotated[
        bool,
        typer.Option(
            "--update",
            help="Bring an existing pack up to date: nothing changed => no rewrite; new files => appended (old frame ids kept); changed or removed => full repack.",
        ),
    ] = False,
    checksum: Annotated[
        bool, typer.Option("--checksum", help="With --update, also compare md5s (reads every source).")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            "-n",
            help="With --update: list what would be appended or repacked, and why; write nothing (as rsync -n).",
        ),
    ] = False,
    compress: Annotated[
        str,
        typer.Option(
            "--compress",
            metavar="none|zstd[:LEVEL]",
            help="Per-frame compression: none or zstd[:LEVEL]. Frames that do not shrink (JPEG, PNG) are stored raw.",
        ),
    ] = "none",
    zstd_dict: Annotated[
        str,
        typer.Option(
            "--zstd-dict",
            metavar="auto|none|FILE",
            help="auto (train one on a sample of the inputs), none, or a dictionary FILE; stored in the pack.",
        ),
    ] = "none",
    video_frames: Annotated[
        Optional[str],
        typer.Option(
            "--video-frames",
            metavar="all|keyframes|every:N|fps:R",
            help="Cut videos into frames: all, keyframes, every:N or fps:R (default: videos are packed as files).",
        ),
    ] = None,
    frame_format: Annotated[
        str,
        typer.Option(
            "--frame-format",
            metavar="jpeg[:Q]|png",
            help="How video frames are stored: jpeg[:QUALITY] (default 90) or png.",
        ),
    ] = "jpeg:90",
    max_frames_per_video: Annotated[
        Optional[int],
        typer.Option("--max-frames-per-video", metavar="N", help="Keep at most N frames of each video.", min=1),
    ] = None,
    label_from: Annotated[
        str,
        typer.Option(
            "--label-from",
            metavar="parent|none|CSV|.EXT",
            help="Frame labels: parent (folder name), none, a CSV file of name,label, or (--from tar|zip) "
            "each sample's .EXT member (WebDataset's .cls).",
        ),
    ] = "parent",
    split: Annotated[
        Optional[str],
        typer.Option(
            "--split",
            metavar="NAME=FRACTION,...",
            help="Assign splits by a hash of each name, e.g. train=0.9,val=0.1 (a video's frames stay together).",
        ),
    ] = None,
    no_image_meta: Annotated[
        bool, typer.Option("--no-image-meta", help="Do not read width, height and mode from image headers.")
    ] = False,
    strict_images: Annotated[
        bool,
        typer.Option("--strict-images", help="An image whose header cannot be read is bad input (default: a warning)."),
    ] = False,
    wait: WaitOpt = 0.0,
    skip_if_locked: SkipLockedOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Pack files into OUTPUT and its index OUTPUT.index.parquet, self-check, then publish."""
    from ..api import PackOptions
    from ..api import pack as pack_files
    from ..sources.media import MediaOptions
    from ..sources.tables import TableColumns

    policy = _checkpoint_policy(checkpoint_every, checkpoint_bytes, checkpoint_seconds, no_checkpoint)
    if resume:
        _resume(
            output,
            shard_of=shard_of,
            rescan=False,
            workers=workers,
            policy=policy,
            json_out=json_out,
            quiet=quiet,
            wait=wait,
            skip_if_locked=skip_if_locked,
        )
        return
    media = MediaOptions(
        compress=compress,
        zstd_dict=zstd_dict,
        video_frames=video_frames,
        frame_format=frame_format,
        max_frames_per_video=max_frames_per_video,
        label_from=label_from,
        split=split,
        image_meta=not no_image_meta,
        strict_images=strict_images,
    )
    if column is None and (name_column is not None or label_column is not None):
        raise InputError("--name-column and --label-column go with --column (and --from parquet)")
    options = PackOptions(
        archives=from_archive,
        table_columns=TableColumns(column, name_column, label_column) if column is not None else None,
        include=include or (),
        exclude=exclude or (),
        base=base,
        stdin=sys.stdin.buffer,
        null_separated=null,
        skip_bad=skip_bad,
        allow_empty=allow_empty,
        max_frame_bytes=parse_size(max_frame_bytes, "--max-frame-bytes"),
        force=force,
        alignment=align,
        created_us=parse_created(created),
        self_check_frames=self_check,
        workers=workers,
        checkpoints=policy,
        max_pack_bytes=parse_size(max_pack_bytes, "--max-pack-bytes"),
        shard_of=shard_of,
        update=update,
        plan_only=plan_only,
        plan=_one_plan(sources) if plan else None,
        checksum=checksum,
        dry_run=dry_run,
        media=media,
        wait=wait,
        handle_signals=True,
        on_event=render.event_logger(quiet or json_out),
        on_warning=render.warning,
        progress=lambda frames, nbytes: render.progress(frames, nbytes, quiet or json_out),
        skip_if_locked=skip_if_locked,
    )
    render.pack_outcome(pack_files([] if plan else sources, output, options), json_out, quiet)


def _one_plan(sources: list[str]) -> str:
    if len(sources) != 1:
        raise InputError(f"--plan takes one SOURCE, the plan file (got {len(sources)})")
    return sources[0]


def _checkpoint_policy(every: int, every_bytes: str, seconds: float, off: bool) -> Any:
    from ..write.checkpoint import CheckpointPolicy

    return CheckpointPolicy(every, parse_size(every_bytes, "--checkpoint-bytes"), seconds, not off)


def _resume(
    output: str,
    *,
    rescan: bool,
    workers: int | None,
    policy: Any,
    json_out: bool,
    quiet: bool,
    wait: float,
    skip_if_locked: bool,
    shard_of: str | None = None,
) -> None:
    from ..api import part_output, resume_pack

    outcome = resume_pack(
        output,
        shard_of=shard_of,
        rescan=rescan,
        workers=workers,
        checkpoints=policy,
        handle_signals=True,
        on_event=render.event_logger(quiet or json_out),
        on_warning=render.warning,
        wait=wait,
        skip_if_locked=skip_if_locked,
    )
    render.resume_summary(outcome, part_output(os.fspath(output), shard_of), json_out, quiet)


@_command("resume", "Continue an interrupted pack from its last checkpoint.")
def resume_cmd(
    output: Annotated[str, typer.Argument(metavar="PACK", help="The pack an interrupted 'hframe pack' was writing.")],
    rescan: Annotated[
        bool,
        typer.Option(
            "--rescan", help="If the inputs changed since the run started, start over with them instead of refusing."
        ),
    ] = False,
    workers: Annotated[
        Optional[int], typer.Option("--workers", metavar="N", help="Packing processes, as for pack.", min=1)
    ] = None,
    wait: WaitOpt = 0.0,
    skip_if_locked: SkipLockedOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Continue an interrupted pack from its last checkpoint (byte-identical to an uninterrupted run)."""
    _resume(
        output,
        rescan=rescan,
        workers=workers,
        policy=None,
        json_out=json_out,
        quiet=quiet,
        wait=wait,
        skip_if_locked=skip_if_locked,
    )


@_command("verify", "Check packs: header, trailer, index and every frame's md5.")
def verify(
    packs: Annotated[
        list[str],
        typer.Argument(
            metavar="PACK...",
            help="Packs or datasets to check: files (globs are expanded) or URLs (http(s)://, s3://, gs://, hdfs://).",
        ),
    ],
    sample: Annotated[
        Optional[str],
        typer.Option(
            "--sample", metavar="P%|N", help="Check a sample: P% of frames or N frames, in runs of neighbours."
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Sampler seed: the same seed checks the same frames.")
    ] = 0,
    frames: Annotated[
        Optional[str], typer.Option("--frames", metavar="A:B", help="Check only frames A:B (B exclusive).")
    ] = None,
    decode: Annotated[bool, typer.Option("--decode", help="Also decode every image fully with Pillow.")] = False,
    no_index: Annotated[bool, typer.Option("--no-index", help="Check from the pack's record headers alone.")] = False,
    max_errors: Annotated[
        Optional[int], typer.Option("--max-errors", metavar="N", help="Stop after N problems.", min=1)
    ] = None,
    workers: Annotated[
        Optional[int],
        typer.Option(
            "--workers",
            metavar="N",
            help="Parts of a large pack checked at once, in parallel processes (default: one per core, at most 4).",
            min=1,
        ),
    ] = None,
    shard_of: Annotated[
        Optional[str],
        typer.Option(
            "--shard-of",
            metavar="I/N|env|env/N",
            help="Check only part I of N of the packs (shards of a dataset, globs), balanced by bytes: one job-array task each; merge their --json reports with --merge.",
        ),
    ] = None,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge", help="PACK... are --json reports of verify runs (the parts of a --shard-of run): one verdict."
        ),
    ] = False,
    junit: Annotated[
        Optional[Path],
        typer.Option("--junit", metavar="FILE", help="Also write a JUnit XML report (one testcase per pack)."),
    ] = None,
    html_file: Annotated[
        Optional[Path],
        typer.Option(
            "--html",
            metavar="FILE",
            help="Also write the report as one self-contained HTML page (thumbnails of damaged frames inline).",
        ),
    ] = None,
    json_out: JsonOpt = False,
    jsonl: Annotated[bool, typer.Option("--jsonl", help="Print one JSON line per problem.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Check packs: header, trailer, index, layout and every frame's md5 (exit 1 on any problem)."""
    from ..verify.many import merge_reports, verify_packs
    from ..verify.report import parse_frames, parse_sample

    if merge:
        if sample or frames or decode or no_index or workers or shard_of or max_errors:
            raise InputError("--merge reads reports: it takes no checking options")
        report = merge_reports(packs)
    else:
        part = None
        if shard_of:  # (shards brings the packing modules: ~15 ms a plain verify need not pay)
            from ..write.shards import parse_shard_of

            part = parse_shard_of(shard_of)
        report = verify_packs(
            packs,
            use_index=not no_index,
            sample=parse_sample(sample) if sample else None,
            seed=seed,
            frames=parse_frames(frames) if frames else None,
            decode=decode,
            max_errors=max_errors,
            workers=workers,
            progress=render.progress_factory(quiet or json_out or jsonl, label="verifying"),
            part=part,
        )
    if html_file is not None:
        from ..view.report import write_html_report

        write_html_report(report.to_dict(), html_file, shlex.join(["hframe", *sys.argv[1:]]))
    render.verify_outcome(
        report, junit=os.fspath(junit) if junit else None, as_json=json_out, as_jsonl=jsonl, quiet=quiet
    )
    raise typer.Exit(report.exit_code)


class Sampler(str, Enum):
    random = "random"
    block_local = "block-local"
    sequential = "sequential"


class CacheMethod(str, Enum):
    auto = "auto"
    drop_caches = "drop_caches"
    fadvise = "fadvise"
    none = "none"


def _bench_command(mode: str) -> Any:
    def command(
        pack: PackArg,
        frames: Annotated[int, typer.Option("--frames", metavar="N", help="Frames per batch.")] = 256,
        batches: Annotated[int, typer.Option("--batches", metavar="N", help="Number of batches.")] = 10,
        seed: Annotated[
            int, typer.Option("--seed", metavar="N", help="Sampler seed (the generator is seeded once).")
        ] = 0,
        sampler: Annotated[
            Sampler, typer.Option("--sampler", metavar="random|block-local|sequential", help="How frame ids are drawn.")
        ] = Sampler.random,
        block_size: Annotated[
            Optional[int],
            typer.Option(
                "--block-size",
                metavar="N",
                help="Frames per block for --sampler block-local (default: --frames).",
                min=1,
            ),
        ] = None,
        workers: Annotated[
            Optional[int],
            typer.Option("--workers", metavar="N", help="Read threads (default min(16, max(1, frames // 4)))."),
        ] = None,
        coalesce_gap: Annotated[
            Optional[int],
            typer.Option(
                "--coalesce-gap",
                metavar="BYTES",
                help="Merge reads of frames at most this many bytes apart (0 disables; default 8192, remote 65536).",
                min=0,
            ),
        ] = None,
        max_read: Annotated[
            Optional[str],
            typer.Option(
                "--max-read",
                metavar="SIZE",
                help="Largest single read; bigger frames are split (default 2MiB, remote 8MiB).",
            ),
        ] = None,
        method: Annotated[
            CacheMethod,
            typer.Option(
                "--method", metavar="auto|drop_caches|fadvise|none", help="Cache eviction before each cold batch."
            ),
        ] = CacheMethod.auto,
        compare: Annotated[
            Optional[Path],
            typer.Option("--compare", metavar="DIR", help="Also read the same frames as loose files from this folder."),
        ] = None,
        decode: Annotated[
            bool, typer.Option("--decode", help="Decode every frame with Pillow (timed separately).")
        ] = False,
        md5: Annotated[bool, typer.Option("--md5", help="Hash every frame read and compare with the index.")] = False,
        memory_map: Annotated[
            bool, typer.Option("--memory-map", help="Read through a memory map of the pack (bench-warm only).")
        ] = False,
        plot: Annotated[
            Optional[Path],
            typer.Option(
                "--plot",
                metavar="FILE",
                help="Also draw the frame and batch latency distributions (.png, .svg or .pdf; needs matplotlib).",
            ),
        ] = None,
        json_out: JsonOpt = False,
    ) -> None:
        from ..read.bench import run_bench

        if plot is not None:
            from ..view.plot import check_plotting

            check_plotting(plot)  # (before the benchmark: it may take a while)

        result = run_bench(
            pack,
            mode=mode,
            frames=frames,
            batches=batches,
            seed=seed,
            sampler=sampler.value,
            block_size=block_size,
            workers=workers,
            coalesce_gap=coalesce_gap,
            max_read=parse_size(max_read, "--max-read") if max_read is not None else None,
            method=method.value,
            compare=compare,
            decode=decode,
            md5=md5,
            memory_map=memory_map,
        )
        if plot is not None:
            from ..view.plot import plot_latencies

            plot_latencies(result, plot)
        render.bench_result(result, json_out)
        raise typer.Exit(result.exit_code)

    command.__doc__ = (
        "Time random reads with the page cache evicted before every batch (optionally vs loose files)."
        if mode == "cold"
        else "Time random reads from a warm page cache (each batch read once untimed first)."
    )
    return command


_command("bench-cold", "Time random reads with the page cache evicted.")(_bench_command("cold"))
_command("bench-warm", "Time random reads from a warm page cache.")(_bench_command("warm"))


@_command("dump-header", "Show a pack's header, trailer and index metadata.")
def dump_header(
    pack: PackArg,
    frame: Annotated[
        Optional[str], typer.Option("--frame", metavar="FRAME", help="Hex-dump this frame (id, or name) instead.")
    ] = None,
    nbytes: Annotated[
        int, typer.Option("--bytes", metavar="N", help="How many leading bytes of --frame to show.", min=0)
    ] = 16,
    by_name: Annotated[
        bool, typer.Option("--by-name", "--name", help="Treat --frame as a name even if it is all digits.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Show the header, trailer and index metadata of PACK (exit 1 if incomplete or mismatched)."""
    from ..read.dataset import open_pack
    from ..read.describe import describe_pack, frame_head

    if frame is not None:
        with open_pack(pack) as reader:
            render.frame_head(frame_head(reader, _frame_key(frame, by_name), nbytes), json_out)
        return
    doc = describe_pack(pack)
    render.dump_header(doc, json_out)
    if not doc["ok"]:
        raise typer.Exit(EXIT_DATA)


@_command("index", "Print a pack's index rows, or rebuild or merge indexes.")
def index(
    pack: PackArg,
    fmt: Annotated[
        Optional[RowFormat],
        typer.Option(
            "--format",
            "-f",
            metavar="table|tsv|csv|jsonl|json",
            help="Row format (default: table on a terminal, tsv on a pipe).",
        ),
    ] = None,
    columns: Annotated[
        Optional[str], typer.Option("--columns", "-c", metavar="COL,...", help="Comma-separated columns to print.")
    ] = None,
    name: MatchOpt = None,
    old_name: Annotated[
        Optional[str], typer.Option("--name", metavar="GLOB", hidden=True, help="Older spelling of --match.")
    ] = None,
    label: LabelOpt = None,
    split: SplitOpt = None,
    kind: KindOpt = None,
    no_header: Annotated[bool, typer.Option("--no-header", help="No header row in tsv/csv.")] = False,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Recreate PACK.index.parquet from the pack alone.")
    ] = False,
    merge: Annotated[
        Optional[list[str]],
        typer.Option(
            "--merge",
            metavar="GLOB",
            help="Write the dataset manifest PACK.dataset.json from these shard packs (globs; repeatable).",
        ),
    ] = None,
    quiet: QuietOpt = False,
) -> None:
    """Print the index rows of PACK, or rebuild its index from the pack alone."""
    from ..format.index import get_index_path, select_rows
    from ..read.dataset import open_pack
    from ..write.rebuild import rebuild_index

    if merge:
        from ..write.manifest import write_manifest

        manifest = write_manifest(pack, merge)
        if not quiet:
            render.note(
                f"wrote {pack}.dataset.json: {count(len(manifest.shards), 'shard')}, "
                f"{count(manifest.frame_count, 'frame')}"
            )
        return
    if rebuild:
        meta = rebuild_index(pack, get_index_path(pack))
        if not quiet:
            render.note(f"rebuilt {get_index_path(pack)}: {count(meta.frame_count, 'frame')}")
        return
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    with open_pack(pack) as reader:
        table = select_rows(
            reader.table,
            cols,
            name or old_name,
            {"label": label, "split": split, "kind": kind},
            must_match=os.fspath(pack),
        )
    render.index_rows(table, fmt.value if fmt else None, header=not no_header, columns_given=cols is not None)


@_command("prefetch", "Fetch a remote pack's frames into the node-local cache.")
def prefetch(
    pack: PackArg,
    frames: Annotated[
        Optional[str], typer.Option("--frames", metavar="A:B", help="Only frames A to B-1 (or one id).")
    ] = None,
    sample: Annotated[
        Optional[int], typer.Option("--sample", metavar="N", help="A seeded random sample of N frames.", min=0)
    ] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="SEED", help="Seed of --sample.")] = 0,
    part: Annotated[
        Optional[str],
        typer.Option("--part", metavar="K/N", help="The K-th of N equal parts (K from 0): one node's share."),
    ] = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Fetch the frames of a remote PACK (or dataset) that the cache (--cache-dir or
    HFRAME_CACHE_DIR) does not hold, each checked against the index's md5, so training reads
    them from local disk."""
    from ..read.warm import prefetch as prefetch_frames

    with render.progress(0, 0, quiet or json_out, label="prefetching") as progress:
        doc = prefetch_frames(pack, frames=frames, sample=sample, seed=seed, part=part, progress=progress)
    render.prefetched(doc, json_out, quiet)


@_command("cache", "Show, prune or clear the node-local cache of remote packs.")
def cache(
    prune: Annotated[
        bool, typer.Option("--prune", help="Evict least recently used data down to --cache-limit.")
    ] = False,
    clear: Annotated[bool, typer.Option("--clear", help="Remove everything the cache holds.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Show what the cache (--cache-dir or HFRAME_CACHE_DIR) holds: each pack generation's
    URL, frames, bytes, last use, hits and misses."""
    from ..read.warm import cache_report

    render.cache_report(cache_report(None, prune=prune, clear=clear), json_out)


class GetFormat(str, Enum):
    raw = "raw"
    tar = "tar"


@_command("get", "Write frames to files, stdout or a tar stream.")
def get(
    pack: PackArg,
    frames: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="FRAME...",
            help="Frame ids, or names as stored in the index (omit to select by filters or -T).",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output",
            "-o",
            metavar="FILE|DIR|-",
            help="One frame: this file (- for stdout). Several, or filters: this folder (or, with --format tar, this tar file).",
        ),
    ] = None,
    files_from: Annotated[
        Optional[str],
        typer.Option(
            "--files-from",
            "-T",
            metavar="FILE|-",
            help="Read frame ids or names from FILE, one a line (- for stdin), as tar -T.",
        ),
    ] = None,
    null: Annotated[bool, typer.Option("--null", "-0", help="-T lists are NUL-separated (find -print0).")] = False,
    fmt: Annotated[
        GetFormat,
        typer.Option(
            "--format",
            metavar="raw|tar",
            help="raw: the frame's bytes (one frame); tar: every frame as one tar stream.",
        ),
    ] = GetFormat.raw,
    no_clobber: Annotated[
        bool, typer.Option("--no-clobber", help="Refuse to replace an existing file (default: replace it).")
    ] = False,
    by_name: Annotated[
        bool, typer.Option("--by-name", "--name", help="Treat FRAME as a name even if it is all digits.")
    ] = False,
    match: MatchOpt = None,
    label: LabelOpt = None,
    split: SplitOpt = None,
    kind: KindOpt = None,
    stored: Annotated[
        bool, typer.Option("--stored", help="The bytes as stored in the pack (compressed frames stay compressed).")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Write frames: one to stdout or -o FILE; several into the folder -o DIR or as a tar stream.

    Frames are chosen by id or name, by -T list and by filters. Binary data never goes to a
    terminal.
    """
    from ..read.extract import get_frames
    from ..sources.inputs import read_list

    listed = read_list(files_from, null, sys.stdin.buffer) if files_from is not None else []
    keys = [_frame_key(f, by_name) for f in [*(frames or ()), *listed]]
    written = get_frames(
        pack,
        keys,
        output,
        match=match,
        equal={"label": label, "split": split, "kind": kind},
        stored=stored,
        stdout=None if render.interactive(sys.stdout) else sys.stdout.buffer,
        no_clobber=no_clobber,
        as_tar=fmt == GetFormat.tar,
    )
    if written is not None and not quiet and (output is not None and os.fspath(output) != "-"):
        render.note(f"wrote {count(written, 'frame')} {'into' if fmt == GetFormat.tar else 'under'} {output}")


@_command("sheet", "Draw a contact sheet: a grid of frames, each with a caption.")
def sheet(
    pack: PackArg,
    frames: Annotated[
        Optional[list[str]],
        typer.Argument(
            metavar="FRAME...",
            help="Frame ids or names (omit: filters, or a sample of 64).",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        str,
        typer.Option("--output", "-o", metavar="FILE|-", help="The sheet: .jpg, .png or .webp (- : PNG on stdout)."),
    ] = "sheet.jpg",
    match: MatchOpt = None,
    label: LabelOpt = None,
    split: SplitOpt = None,
    kind: KindOpt = None,
    sample: Annotated[
        Optional[int], typer.Option("--sample", metavar="N", help="A seeded random sample of N of the chosen frames.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="SEED", help="Seed of --sample.")] = 0,
    columns: Annotated[int, typer.Option("--columns", metavar="N", help="Tiles to a row.")] = 8,
    tile: Annotated[int, typer.Option("--tile", metavar="PX", help="Thumbnail size (a square), in pixels.")] = 192,
    by_name: Annotated[bool, typer.Option("--by-name", help="Treat FRAME as a name even if it is all digits.")] = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Draw chosen frames as thumbnails in a grid, in frame id order (a clip's frames in time
    order), with each frame's id, label, name and size (or time in its video) under it. A frame
    that cannot be decoded is a red, crossed tile saying why; one that is not an image, a grey
    tile saying what it is."""
    from ..view.sheet import contact_sheet, image_format, save

    image_format(output)  # (a wrong extension is said before any frame is read)
    stdout = None if render.interactive(sys.stdout) else sys.stdout.buffer
    if output == "-" and stdout is None:
        raise InputError("refusing to write an image to a terminal; redirect stdout or use -o FILE")
    drawn = contact_sheet(
        pack,
        [_frame_key(f, by_name) for f in frames or ()],
        match=match,
        equal={"label": label, "split": split, "kind": kind},
        sample=sample,
        seed=seed,
        columns=columns,
        tile_size=tile,
    )
    save(drawn, output, stdout)
    render.sheet_drawn(drawn.describe(), output, json_out and output != "-", quiet)


@_command("mount", "Mount a pack, dataset or remote pack as a read-only folder (FUSE).")
def mount(
    source: PackArg,
    mountpoint: Annotated[str, typer.Argument(metavar="MOUNTPOINT", help="An empty folder to mount it on.")],
    stored: Annotated[
        bool, typer.Option("--stored", help="Files as stored (compressed frames stay compressed).")
    ] = False,
    background: Annotated[
        bool, typer.Option("--background", "-b", help="Return once mounted; unmount with 'hframe umount'.")
    ] = False,
) -> None:
    """Show the frames of SOURCE as files under MOUNTPOINT (their names, sizes and mtimes from
    the index), read through hframe's reader, read-only, until Ctrl-C, SIGTERM or 'hframe umount'."""
    from ..read.mount import mount as mount_pack

    mount_pack(os.fspath(source), mountpoint, stored=stored, background=background, argv=sys.argv[1:])


@_command("umount", "Unmount a folder that 'hframe mount' mounted.")
def umount(
    mountpoint: Annotated[str, typer.Argument(metavar="MOUNTPOINT", help="Where it is mounted.")],
) -> None:
    """Unmount MOUNTPOINT (fusermount3 -u)."""
    from ..read.mount import unmount

    unmount(mountpoint)


_VALUED_GLOBALS = ("--io-timeout", "--cache-dir", "--cache-limit")


def _hoist_global_options(args: list[str]) -> tuple[list[str], list[str]]:
    """``--debug``, ``--io-timeout S``, ``--cache-dir DIR`` and ``--cache-limit SIZE`` are
    accepted after the command too (errors tell users to add them there): moved in front of it,
    unless they come after ``--`` (operands there). Returns the arguments and the global options
    found."""
    head = args[: args.index("--")] if "--" in args else args
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(head):
        a = head[i]
        if a == "--debug" or a.split("=", 1)[0] in _VALUED_GLOBALS and "=" in a:
            front.append(a)
        elif a in _VALUED_GLOBALS:  # with its value (or without: then it says so)
            front += head[i : i + 2]
            i += 1
        else:
            rest.append(a)
        i += 1
    return ([*front, *rest, *args[len(head) :]] if front else args), front


def _usage_line(e: Exception, args: list[str]) -> str:
    """A usage error as one line that names the command and where its help is, like
    ``pack: missing argument 'SOURCE...' (see 'hframe pack -h')``; click's "did you mean" stays."""
    message = " ".join(str(getattr(e, "format_message", lambda: e)()).split()).rstrip(".")
    message = message[:1].lower() + message[1:]
    ctx = getattr(e, "ctx", None)
    command = ctx.command_path.partition(" ")[2] if ctx is not None else ""
    if not command:  # click names the root for some errors found while parsing a command's options
        names = typer.main.get_command(app).commands  # type: ignore[attr-defined]
        at, found = next(((i, a) for i, a in enumerate(args) if not a.startswith("-")), (len(args), ""))
        option = getattr(e, "option_name", None)
        known = {o for p in names[found].params for o in p.opts} if found in names else set()
        if option in known and option in args[:at]:  # `hframe --json verify x`
            return (
                f"{option} is an option of '{found}', not of hframe: put it after the command (see 'hframe {found} -h')"
            )
        command = found if found in names else ""
    return f"{command}: {message} (see 'hframe {command} -h')" if command else f"{message} (see 'hframe -h')"


_INTERRUPTED_WRITING = "interrupted; nothing was published (a partial pack, if any, keeps its .partial name)"


def _interrupted_message(args: list[str]) -> str:
    """What an interrupted command says: the packing note only where something was being written."""
    writing = any(a in ("pack", "resume") for a in args[:3]) or any(a in ("--rebuild", "--merge") for a in args)
    return _INTERRUPTED_WRITING if writing else "interrupted"


def _wants_json(args: list[str]) -> bool:
    """Whether the command line asks for a ``--json`` document (before a ``--``)."""
    return "--json" in (args[: args.index("--")] if "--" in args else args)


_python_showwarning = warnings.showwarning


def _one_line_warning(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
    """hframe's own warnings (the cache's) as one ``hframe: warning:`` line; others as Python shows them."""
    if issubclass(category, CacheWarning):
        render.warning(str(message))
    else:
        _python_showwarning(message, category, *args, **kw)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every error into one stderr line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("HFRAME_DEBUG") == "1"
    # a descriptor closed at start (`>&-`) leaves Python a None stream: write nowhere, not crash
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    code = EXIT_OK
    stdout = sys.stdout
    failures: list[str] = []
    render.json_printed = False  # (main runs more than once in one process: tests, embedding)

    def fail(message: str) -> None:
        message = redact(message)  # (a library's exception may quote a URL with its password)
        render.error(message)
        failures.append(message)

    try:  # (from here on a SIGINT/SIGTERM, still a KeyboardInterrupt, ends in one line)
        args, front = _hoist_global_options(args)
        debug = debug or "--debug" in front
        # Pillow's warnings (corrupt EXIF, odd palettes) are not ours to print: an image that
        # does not decode is a verify finding or a pack warning line, one that decodes is fine
        warnings.filterwarnings("ignore", module="PIL")
        warnings.showwarning = _one_line_warning
        rv = app(args=args, prog_name="hframe", standalone_mode=False)
        code = rv if isinstance(rv, int) else EXIT_OK
        if code == EXIT_INTERRUPTED:  # typer turns KeyboardInterrupt into Exit(130)
            fail(_interrupted_message(args))
    except HframeError as e:
        if debug:
            raise
        fail(str(e))
        code = e.exit_code
    except typer.Exit as e:
        code = e.exit_code
    except typer.TyperException as e:  # usage errors: bad flags, missing arguments
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `hframe`: the help is the message
            e.show()  # type: ignore[attr-defined]
        else:
            fail(_usage_line(e, args))
        code = EXIT_USAGE
    except (KeyboardInterrupt, typer.Abort):
        fail(_interrupted_message(args))
        code = EXIT_INTERRUPTED
    except SystemExit:
        if sys.stdout is stdout:
            raise
        # typer met a closed pipe (`| head`): it swapped the streams for ones that ignore it and
        # exits 1, which would read as "problems in the data"; stopping early is not an error
        code = EXIT_OK
    except MemoryError:
        if debug:
            raise
        fail("not enough memory (the process may not take what this needs; see MEMORY in hframe(1))")
        code = EXIT_ENV
    except Exception as e:  # noqa: BLE001 - the last line of defence
        if debug:
            raise
        fail(f"internal error: {type(e).__name__}: {e} (rerun with --debug for a traceback)")
        code = EXIT_INTERNAL
    if code != EXIT_INTERRUPTED and pending_signal() is not None:
        fail(_interrupted_message(args))  # a signal whose exception was lost where it was raised
        code = EXIT_INTERRUPTED
    if failures and code != EXIT_OK and _wants_json(args):
        with contextlib.suppress(OSError, ValueError):  # (a standard output gone: the stderr line stays)
            render.json_failure(failures[-1], code)
    sys.exit(code)


def run() -> None:
    """The ``hframe`` console script (and ``python -m hframe_cli``): ``main``, then a quick exit.

    When ``main`` returns, every file it wrote is closed (all of them by ``with`` blocks) and
    hframe registers no exit handlers, so after flushing stdout and stderr the process leaves with
    ``os._exit`` instead of tearing the interpreter down: freeing every module and pyarrow's
    pools costs 50-100 ms, on every command. With ``--debug`` an error's traceback still
    propagates normally. ``main`` itself (tests, embedding) exits as usual.
    """
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # --debug: the traceback, as Python prints it, with URLs' passwords hidden
        import traceback

        sys.stderr.write(redact("".join(traceback.format_exception(e))))
        code = 1
    else:
        code = EXIT_OK
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: the descriptor was closed at start (`>&-`)
                stream.flush()
        except (OSError, ValueError):  # a reader that went away (| head), a closed stream
            pass
    os._exit(code)
