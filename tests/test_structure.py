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

#: The rooms, bottom first: a module may import from its own layer and the layers below, never
#: from above. The root's base modules are what every room shares; the front doors come last.
LAYERS: list[set[str]] = [
    {
        "errors",
        "faults",
        "processes",
        "signals",
        "units",
        "parts",
        "locations",
        "names",
        "durable",
        "version",
        "native",
    },
    {"format"},
    {"storage"},
    {"sources"},
    {"read"},
    {"verify"},
    {"view"},
    {"write"},
    {"training", "torchdata", "sampler"},  # the last two: the README's old import paths, re-exported
    {"api", "__init__"},
    {"cli"},
    {"__main__"},
]


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name under it (a package by its folder's name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports() -> dict[str, list[tuple[str, str]]]:
    """module -> [(imported module, imported name)] for every relative import, in functions too."""
    mods = modules()
    found: dict[str, list[tuple[str, str]]] = {}
    for m, path in mods.items():
        package = m.split(".") if path.name == "__init__.py" and m != "__init__" else m.split(".")[:-1]
        edges = []
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level >= 1):
                continue
            base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            for alias in node.names:
                target = ".".join(base)
                if ".".join([*base, alias.name]) in mods:  # from . import render: the module
                    target = ".".join([*base, alias.name])
                edges.append((target or "__init__", alias.name))
        found[m] = edges
    return found


def layer(module: str) -> int:
    room = module.split(".")[0]
    return next(i for i, rooms in enumerate(LAYERS) if room in rooms)


def test_every_module_is_in_a_room_and_no_room_is_a_heap():
    """``ls hframe_cli/`` shows the architecture: a handful of rooms, none over 15 modules, and a
    small root."""
    rooms: dict[str, int] = {}
    for m in modules():
        layer(m)  # StopIteration: a module outside every room
        if "." in m:
            rooms[m.split(".")[0]] = rooms.get(m.split(".")[0], 0) + 1
    assert max(rooms.values()) <= 15, rooms
    root = [m for m in modules() if "." not in m and m not in rooms]
    assert len(root) <= 16, root


def test_rooms_import_only_downwards():
    upwards = [
        f"{m} imports {target} ({name})"
        for m, deps in imports().items()
        for target, name in deps
        if layer(target) > layer(m)
    ]
    assert upwards == []


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


#: Compiled modules (C sources beside the Python ones), each private to the one module that
#: loads it and says what to do without it.
COMPILED = {
    "sources._scan": "sources.compiled",
    "write._blobs": "write.compiled",
    "verify._walk": "verify.compiled",
    "format._md5x": "format.hashing",
}


def test_no_module_imports_another_modules_private_names():
    private = [
        f"{m} imports {name} from {target}"
        for m, deps in imports().items()
        for target, name in deps
        if name.startswith("_") and not name.startswith("__") and COMPILED.get(f"{target}.{name}") != m
    ]
    assert private == []
    for compiled, loader in COMPILED.items():
        assert (PACKAGE / compiled.replace(".", "/")).with_suffix(".c").exists()
        assert any(t == compiled.rpartition(".")[0] and n == compiled.rpartition(".")[2] for t, n in imports()[loader])


def function_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [
        sub
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for sub in ast.walk(node)
        if isinstance(sub, (ast.Import, ast.ImportFrom))
    ]


def test_an_import_inside_a_function_is_never_a_repeat_and_its_module_says_why():
    """A module that imports inside functions states its rule once, in its docstring; none
    imports there a module it already imports at the top."""
    unstated, repeated = [], []
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        inside = function_level_imports(tree)
        if not inside:
            continue
        if "Imports inside functions:" not in (ast.get_docstring(tree) or ""):
            unstated.append(name)
        top = {ast.unparse(n).split(" import ")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
        repeated += [
            f"{name}:{n.lineno}"
            for n in inside
            if isinstance(n, ast.ImportFrom) and ast.unparse(n).split(" import ")[0] in top
        ]
    assert unstated == [] and repeated == []


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
    from hframe_cli.read.extract import get_frames

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


def test_url_schemes_and_names_beside_a_pack_are_spelled_in_one_module_each():
    """One table of schemes (``locations.SCHEMES``), one owner of the suffixes beside a pack
    (``names.py``): no other module spells a scheme list or builds such a name by hand."""
    from hframe_cli.locations import SCHEMES
    from hframe_cli.storage import access

    assert {s for s in access.REMOTE_SCHEMES} | {"file"} == set(SCHEMES)
    spelled = []
    suffixes = ('".partial"', '".index.parquet"', '".dataset.json"', '".lock"', '".ckpt', '".sources.parquet"')
    for m, path in modules().items():
        if m in ("locations", "names"):
            continue
        code = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#") and "``" not in line
        )
        if '"gcs"' in code or '"abfs"' in code:  # a second table of schemes would spell its aliases
            spelled.append(f"{m}: a scheme table")
        spelled += [f"{m}: {s}" for s in suffixes if s in code]
    assert spelled == []
