"""A truncated or still-being-written pack is recognised as such, never read as a good one."""

from __future__ import annotations

import os
import random

import pytest

import hframe_cli as h
from hframe_cli.format.layout import HEADER_SIZE


def test_truncation_at_random_points_is_reported(packed, tmp_path, cli):
    data = packed.read_bytes()
    rng = random.Random(3)
    cuts = sorted(
        {
            0,
            5,
            HEADER_SIZE - 1,
            HEADER_SIZE,
            len(data) - 1,
            len(data) - 64,
            *(rng.randrange(1, len(data)) for _ in range(20)),
        }
    )
    t = tmp_path / "t.hframe"
    os.replace(f"{packed}.index.parquet", f"{t}.index.parquet")
    for cut in cuts:
        t.write_bytes(data[:cut])
        with pytest.raises((h.IncompletePack, h.NotAPack)):
            h.open_pack(t)
        r = cli(["dump-header", str(t)])
        assert r.exit_code == 1, (cut, r.stderr)
        if cut >= HEADER_SIZE:
            assert "incomplete" in r.stdout, cut
        else:
            assert "not a frame pack" in r.stderr or "header truncated" in r.stderr


def test_appended_garbage_means_no_trailer(packed, cli):
    with open(packed, "ab") as f:
        f.write(b"garbage")
    with pytest.raises(h.IncompletePack, match="no trailer"):
        h.open_pack(packed)
    r = cli(["get", str(packed), "0"])
    assert r.exit_code == 1
    assert r.stderr.startswith(f"hframe: error: {packed}: incomplete pack: no trailer")
