"""Labels and splits: which class each frame belongs to and which split it is in.

``--label-from parent`` (the default) labels a frame by its parent folder, as torchvision's
ImageFolder does; ``none`` leaves labels empty; a CSV file maps names to labels. ``--split
train=0.9,val=0.1`` assigns each frame to a split from a hash of its name (not of its position),
so adding or removing other files never moves a frame to another split, and the same name is
always in the same split, on every machine and in every release (``man/hframe.5``).
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from dataclasses import dataclass

from ..errors import InputError

__all__ = ["LabelPolicy", "is_member_label", "parse_split", "split_of"]


def parent_label(name: bytes) -> bytes | None:
    """The ImageFolder-style label: the name of the parent folder, if any."""
    cut = name.rfind(b"/")
    if cut <= 0:
        return None
    return name[name.rfind(b"/", 0, cut) + 1 : cut]


def parse_split(text: str | None) -> list[tuple[str, float]]:
    """``train=0.9,val=0.1`` → [("train", 0.9), ("val", 0.1)]; fractions must sum to 1."""
    if not text:
        return []
    out: list[tuple[str, float]] = []
    for part in text.split(","):
        name, eq, frac = part.strip().partition("=")
        if not eq or not name:
            raise InputError(f"--split {text!r}: expected NAME=FRACTION,... (e.g. train=0.9,val=0.1)")
        try:
            value = float(frac)
        except ValueError:
            raise InputError(f"--split {text!r}: {frac!r} is not a number") from None
        if not 0 <= value <= 1:
            raise InputError(f"--split {text!r}: fractions must be between 0 and 1")
        if any(n == name for n, _ in out):
            raise InputError(f"--split {text!r}: split {name!r} named twice")
        out.append((name, value))
    if abs(sum(v for _, v in out) - 1) > 1e-6:
        raise InputError(f"--split {text!r}: fractions sum to {sum(v for _, v in out):g}, not 1")
    return out


def split_of(name: bytes, splits: list[tuple[str, float]]) -> str | None:
    """The split of the frame named ``name``: the first 8 bytes of its SHA-256 as a number in
    [0, 1), placed on the cumulative fractions in the order given."""
    if not splits:
        return None
    x = int.from_bytes(hashlib.sha256(name).digest()[:8], "big") / 2**64
    acc = 0.0
    for split, frac in splits:
        acc += frac
        if x < acc:
            return split
    return splits[-1][0]


@dataclass
class LabelPolicy:
    """How frames get labels: ``parent``, ``none`` or a CSV mapping name → label."""

    kind: str = "parent"
    mapping: dict[bytes, str] | None = None
    path: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> LabelPolicy:
        if text is None or text == "parent":
            return cls("parent")
        if text == "none":
            return cls("none")
        if is_member_label(text):  # the label comes with each source (an archive's sample member)
            return cls("member", path=text)
        return cls("csv", read_label_csv(text), os.path.abspath(text))

    def label(self, name: bytes) -> str | None:
        if self.kind == "parent":
            p = parent_label(name)
            return None if p is None else p.decode("utf-8", "backslashreplace")
        if self.kind == "none" or self.mapping is None:
            return None
        return self.mapping.get(name)

    def spec(self) -> str:
        return self.path if self.kind in ("csv", "member") and self.path else self.kind


def is_member_label(text: str) -> bool:
    """``--label-from .EXT``: each archive sample's ``.EXT`` member holds its label (WebDataset's
    ``.cls``), not a CSV file."""
    return re.fullmatch(r"\.[A-Za-z0-9_][A-Za-z0-9_.-]*", text) is not None


def read_label_csv(path: str) -> dict[bytes, str]:
    """A CSV of ``name,label`` rows (a header row ``name,label`` is allowed); names as in the pack."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise InputError(f"--label-from {path}: no such file (expected parent, none or a CSV file)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--label-from {path}: cannot read: {e}") from None
    out: dict[bytes, str] = {}
    for n, row in enumerate(rows, 1):
        if not row or (n == 1 and [c.strip().lower() for c in row[:2]] == ["name", "label"]):
            continue
        if len(row) < 2:
            raise InputError(f"{path}: line {n}: expected name,label")
        name = os.fsencode(row[0])
        if name in out and out[name] != row[1]:
            raise InputError(f"{path}: line {n}: {row[0]!r} labelled twice ({out[name]!r} and {row[1]!r})")
        out[name] = row[1]
    return out
