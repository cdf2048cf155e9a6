"""Listing's compiled part (``hframe_cli/sources/_scan.c``): the folders it lists come out as the
Python walk lists them, and it declines every folder the careful path must see (issue 35)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hframe_cli.sources.inputs as inputs
from hframe_cli.errors import InputError
from hframe_cli.sources import compiled
from hframe_cli.sources.inputs import collect_sources

pytestmark = pytest.mark.skipif(
    compiled.scan is None, reason="the compiled part is not built here (or HFRAME_NATIVE=0)"
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=12), st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_its_utf8_check_is_pythons(data):
    try:
        data.decode("utf-8")
        strict = True
    except UnicodeDecodeError:
        strict = False
    assert compiled.scan.utf8_ok(data) == strict


def _tree(root):
    """Folders it takes (names in every UTF-8 length, sorted by code point) and folders it must
    decline: a subfolder, a symlink, an empty file, an oversized one, a non-UTF-8 name, a name
    like the output's."""
    names = [
        "Z.bin",
        "a.bin",
        "é.bin",
        "ÿ.bin",
        "日本.bin",
        "\U0001d11e.bin",
        "\ue000.bin",
        "a b.bin",
        "A.bin",
        "0.bin",
    ]
    for d in ("plain1", "plain2/deeper", "plain3", "plain4"):  # (enough folders to be walked whole)
        for i, n in enumerate(names):
            p = root / d / n
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"x" * (i + 1))
    (root / "sub" / "inner").mkdir(parents=True)
    (root / "sub" / "f.bin").write_bytes(b"f")
    (root / "sub" / "inner" / "g.bin").write_bytes(b"g")
    (root / "link").mkdir()
    (root / "link" / "t.bin").write_bytes(b"t")
    os.symlink(root / "link" / "t.bin", root / "link" / "u.bin")
    (root / "empty").mkdir()
    (root / "empty" / "e.bin").write_bytes(b"")
    (root / "empty" / "f.bin").write_bytes(b"f")
    (root / "big").mkdir()
    (root / "big" / "b.bin").write_bytes(b"b" * 5000)
    (root / "latin").mkdir()
    with open(os.path.join(os.fsencode(root / "latin"), b"caf\xe9.bin"), "wb") as f:
        f.write(b"latin-1 name")
    (root.parent / "out").mkdir()
    (root.parent / "out" / "p.hframe").write_bytes(b"an older pack")
    (root.parent / "out" / "q.bin").write_bytes(b"q")
    return root


@pytest.mark.parametrize("options", [{}, {"skip_bad": True, "allow_empty": True, "max_frame_bytes": 1000}])
def test_a_tree_lists_as_the_python_walk_lists_it(tmp_path, monkeypatch, options):
    root = _tree(tmp_path / "src")
    taken = []
    scan_files = compiled.scan.scan_files

    def spied(folder, *args):
        got = scan_files(folder, *args)
        taken.append((os.path.relpath(folder, root), got))
        return got

    monkeypatch.setattr(compiled.scan, "scan_files", spied)
    kw = {"skip_bad": True, "output": str(root.parent / "out" / "p.hframe"), **options}
    listed = []
    for native in (True, False):
        monkeypatch.setattr(inputs, "scan", compiled.scan if native else None)
        s = collect_sources([str(root)], **kw)
        listed.append((s.columns(), sorted((r.path, r.reason) for r in s.rejected)))
    assert listed[0] == listed[1]
    names = listed[0][0][1]
    assert [n for n in names if n.startswith(b"plain1/")] == sorted(n for n in names if n.startswith(b"plain1/"))
    took = {d for d, got in taken if got}
    assert {"plain1", "plain2/deeper", "plain3", "plain4"} <= took  # the compiled part listed those
    declined = {"sub", "link", "latin", "empty"} | ({"big"} if options else set())
    assert not took & declined, took  # and left these to the careful path


def test_the_output_met_through_a_link_is_refused_as_the_python_walk_refuses_it(tmp_path, monkeypatch):
    root = _tree(tmp_path / "src")
    os.symlink(root.parent / "out", root / "out")  # the output's folder, inside the tree through a link
    errors = []
    for native in (True, False):
        monkeypatch.setattr(inputs, "scan", compiled.scan if native else None)
        with pytest.raises(InputError) as e:
            collect_sources([str(root)], skip_bad=True, output=str(root.parent / "out" / "p.hframe"))
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "is the output being written" in errors[0]
