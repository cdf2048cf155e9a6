"""What ``verify`` reports, and how its selection flags are parsed.

``Problem`` is one finding (check, frame, where, expected vs found); ``PackReport`` is one
pack's outcome; ``VerifyReport`` several packs'. Their ``to_dict`` forms are the ``--json``
document (``man/hframe.1``, VERIFY REPORT). The walk that fills them lives in ``check.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import EXIT_DATA, EXIT_ENV, EXIT_OK, EXIT_USAGE, InputError
from ..format.index import current_format_version

__all__ = ["PackReport", "Problem", "VerifyReport", "parse_frames", "parse_sample"]


@dataclass
class Problem:
    """One thing wrong with a pack. ``frame_id`` is None for pack-level problems."""

    check: str  # header | trailer | index | layout | record | md5 | magic | codec | decode | missing | manifest
    message: str
    frame_id: int | None = None
    name: str | None = None
    offset: int | None = None
    length: int | None = None
    expected: str | None = None
    found: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PackReport:
    """The outcome of verifying one pack."""

    pack: str
    index: str | None
    mode: str  # "index" | "no-index"
    selection: str  # "full" | "sample ..." | "frames A:B"
    frames_total: int = 0
    frames_checked: int = 0
    bytes_checked: int = 0
    elapsed_s: float = 0.0
    problems: list[Problem] = field(default_factory=list)
    error: str | None = None  # set when the pack could not be verified at all
    error_is_storage: bool = False  # ... because storage failed (I/O, permission, replaced): exit 3
    stopped_early: bool = False
    remote: dict[str, int] | None = None  # a remote pack's request counters (remote.Counters)

    @property
    def status(self) -> str:
        return "error" if self.error else ("problems" if self.problems else "ok")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def problems_after(self, frame_id: int) -> bool:
        """True if frame ``frame_id`` or a later one is already reported missing."""
        return any(p.check == "missing" and p.frame_id is not None and p.frame_id >= frame_id for p in self.problems)

    @property
    def bad_frames(self) -> list[int]:
        return sorted({p.frame_id for p in self.problems if p.frame_id is not None})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PackReport:
        """A pack's report read back from its ``to_dict`` (``VerifyReport.merged``)."""
        problems = [Problem(**p) for p in d["problems"]]
        error = d.get("error")
        return cls(
            d["pack"],
            d.get("index"),
            d["mode"],
            d["selection"],
            int(d["frames_total"]),
            int(d["frames_checked"]),
            int(d["bytes_checked"]),
            float(d["elapsed_s"]),
            problems,
            error,
            # a storage error is the one a report cannot say but by its exit code (see merged)
            bool(d.get("error_is_storage", False)),
            bool(d.get("stopped_early", False)),
            d.get("remote"),
        )

    def to_dict(self) -> dict[str, Any]:
        rate = self.bytes_checked / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {
            "pack": self.pack,
            "index": self.index,
            "status": self.status,
            "ok": self.ok,
            "mode": self.mode,
            "selection": self.selection,
            "frames_total": self.frames_total,
            "frames_checked": self.frames_checked,
            "bytes_checked": self.bytes_checked,
            "elapsed_s": round(self.elapsed_s, 6),
            "bytes_per_s": round(rate),
            "bad_frames": self.bad_frames,
            "error": self.error,
            "error_is_storage": self.error_is_storage,
            "stopped_early": self.stopped_early,
            "problems": [p.to_dict() for p in self.problems],
            **({"remote": self.remote} if self.remote is not None else {}),
        }


@dataclass
class VerifyReport:
    """The outcome of verifying several packs; ``part`` = (I, N, packs in all parts) for one
    part of a job array (``verify --shard-of``)."""

    packs: list[PackReport]
    part: tuple[int, int, int] | None = None

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.packs)

    @property
    def exit_code(self) -> int:
        """0 all clean; 1 problems found in the data; 3 some pack could not be read (storage:
        I/O, permission, replaced while open); 2 some pack could not be verified otherwise.
        Problems win over errors, and storage errors over the others."""
        if any(p.problems for p in self.packs):
            return EXIT_DATA
        if any(p.error and p.error_is_storage for p in self.packs):
            return EXIT_ENV
        return EXIT_USAGE if any(p.error for p in self.packs) else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        elapsed = sum(p.elapsed_s for p in self.packs)
        checked = sum(p.bytes_checked for p in self.packs)
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "format_version": current_format_version(),
            "packs_total": len(self.packs),
            "packs_ok": sum(p.ok for p in self.packs),
            "packs_with_problems": sum(p.status == "problems" for p in self.packs),
            "packs_not_verified": sum(p.status == "error" for p in self.packs),
            "frames_total": sum(p.frames_total for p in self.packs),
            "frames_checked": sum(p.frames_checked for p in self.packs),
            "bytes_checked": checked,
            "elapsed_s": round(elapsed, 6),
            "bytes_per_s": round(checked / elapsed) if elapsed > 0 else 0,
            "problems": sum(len(p.problems) for p in self.packs),
            **(
                {"part": {"index": self.part[0], "count": self.part[1], "packs_in_all_parts": self.part[2]}}
                if self.part is not None
                else {}
            ),
            "packs": [p.to_dict() for p in self.packs],
        }

    @classmethod
    def merged(cls, docs: list[tuple[str, dict[str, Any]]]) -> VerifyReport:
        """One verdict from several ``verify --json`` documents (``(file, document)``): the packs
        of all of them. The parts of a job array (``verify --shard-of``) must all be there, each
        once, from one split; a part missing is refused, never a clean verdict."""
        parts = [(where, d.get("part")) for where, d in docs]
        with_part = [(w, p) for w, p in parts if p is not None]
        if with_part:
            if len(with_part) != len(parts):
                raise InputError(
                    f"{parts[[p for _, p in parts].index(None)][0]}: not a part of a verify --shard-of run"
                )
            try:
                counts = {(int(p["count"]), int(p["packs_in_all_parts"])) for _, p in with_part}
                indices = [int(p["index"]) for _, p in with_part]
            except (KeyError, TypeError, ValueError) as e:
                raise InputError(f'a report\'s "part" is not one verify --shard-of writes ({e!r})') from None
            if len(counts) > 1:
                raise InputError(f"reports from different splits ({sorted(counts)}): merge the parts of one run")
            (count, total), seen = counts.pop(), sorted(indices)
            if seen != list(range(count)):
                missing = sorted(set(range(count)) - set(seen))
                twice = sorted({i for i in seen if seen.count(i) > 1})
                raise InputError(
                    f"parts of {count}: "
                    + "; ".join(
                        x
                        for x in (
                            f"part{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} missing"
                            if missing
                            else "",
                            f"part{'s' if len(twice) > 1 else ''} {', '.join(map(str, twice))} given twice"
                            if twice
                            else "",
                        )
                        if x
                    )
                )
        packs: list[PackReport] = []
        for where, d in docs:
            try:
                packs += [PackReport.from_dict(p) for p in d["packs"]]
            except (KeyError, TypeError, ValueError) as e:
                raise InputError(f"{where}: not a verify --json report ({e.__class__.__name__}: {e})") from None
        merged = cls(packs)
        if with_part and len(packs) != total:
            raise InputError(f"the parts hold {len(packs)} packs; the split had {total}")
        return merged


def parse_sample(text: str) -> tuple[str, float]:
    """``"5%"`` → ("percent", 5.0); ``"200"`` → ("count", 200)."""
    t = text.strip()
    try:
        if t.endswith("%"):
            value = float(t[:-1])
            if not 0 < value <= 100:
                raise ValueError
            return "percent", value
        count = int(t)
        if count < 1:
            raise ValueError
        return "count", float(count)
    except ValueError:
        raise InputError(f"--sample: {text!r} is not a percentage (0-100%) or a frame count (>= 1)") from None


def parse_frames(text: str) -> tuple[int, int | None]:
    """``"A:B"`` → (A, B) with B exclusive; ``"A:"`` → (A, None); ``"A"`` → (A, A + 1)."""
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            start, stop = int(a or 0), (int(b) if b else None)
        else:
            start = int(text)
            stop = start + 1
    except ValueError:
        raise InputError(f"--frames: {text!r} is not a range like 100:200") from None
    if start < 0 or (stop is not None and stop <= start):
        raise InputError(f"--frames: {text!r} is an empty or negative range")
    return start, stop
