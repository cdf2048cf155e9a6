"""The house as a whole: no import circle, no module using another's private names, and one
front door for packing that the library and the command share (issue 12)."""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path

import pytest

import hframe_cli as h

PACKAGE = Path(h.__file__).parent


def imports() -> dict[str, list[tuple[str, str]]]:
    """module -> [(imported module, imported name)] for every relative import, in functions too."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    found: dict[str, list[tuple[str, str]]] = {}
    for m in sorted(modules):
        tree = ast.parse((PACKAGE / f"{m}.py").read_text())
        found[m] = [
            (node.module.split(".")[0], alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
            for alias in node.names
            if node.module.split(".")[0] in modules
        ]
    return found


def test_the_modules_import_each_other_without_a_circle():
    graph = {m: {target for target, _ in deps} for m, deps in imports().items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, "import circle: " + " -> ".join([*path, m, n])
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_no_module_imports_another_modules_private_names():
    private = [
        f"{m} imports {name} from {target}"
        for m, deps in imports().items()
        for target, name in deps
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


def test_the_library_pack_does_what_the_command_does(photos, tmp_path, cli):
    """Sharding, updates and job-array parts from hframe_cli.pack, as from hframe pack."""
    lib, cmd = tmp_path / "lib.hframe", tmp_path / "cmd.hframe"
    outcome = h.pack([photos], lib, max_pack_bytes=40_000, created_us=1_700_000_000_000_000)
    r = cli(["pack", str(photos), "-o", str(cmd), "--max-pack-bytes", "40KB", "--created", "1700000000", "-q"])
    assert r.exit_code == 0
    assert outcome.mode == "sharded" and len(outcome.results) > 1
    lib_manifest = json.loads(Path(f"{lib}.dataset.json").read_text())
    cmd_manifest = json.loads(Path(f"{cmd}.dataset.json").read_text())
    assert [s["uuid"] for s in lib_manifest["shards"]] == [s["uuid"] for s in cmd_manifest["shards"]]
    one = tmp_path / "one.hframe"
    assert h.pack([photos], one).frame_count == 30  # a single pack: its result's fields directly
    again = h.pack([photos], one, update=True)
    assert again.mode == "update" and again.plan.status == "up_to_date" and again.results == []
    part = h.pack([photos], tmp_path / "job.hframe", shard_of="1/3")
    assert part.mode == "part" and part.result.path == str(tmp_path / "job-00001.hframe")


def test_the_library_get_does_what_the_command_does(packed, tmp_path, cli):
    """One frame to a stream or a file, filters into a folder, and the same refusals."""
    from hframe_cli.errors import InputError
    from hframe_cli.extract import get_frames

    sink = io.BytesIO()
    assert get_frames(packed, "cats/003.jpg", None, stdout=sink) is None
    assert sink.getvalue() == cli(["get", str(packed), "cats/003.jpg"]).stdout_bytes != b""
    assert get_frames(packed, 0, tmp_path / "f0") is None
    assert (tmp_path / "f0").read_bytes() == cli(["get", str(packed), "0"]).stdout_bytes
    assert get_frames(packed, None, tmp_path / "cats", match="cats/*") == len(list((tmp_path / "cats/cats").iterdir()))
    with pytest.raises(InputError, match="refusing to write binary frame data to a terminal"):
        get_frames(packed, 0, None, stdout=None)
    with pytest.raises(InputError, match="give them without a FRAME"):
        get_frames(packed, 0, tmp_path / "x", match="*")
