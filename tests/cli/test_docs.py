"""The docs cannot drift: every command, option and exit code is in man/hframe.1 and README."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from hframe_cli import errors
from hframe_cli.cli.app import app
from hframe_cli.format.index import COLUMNS, IndexMeta

ROOT = Path(__file__).resolve().parents[2]
MAN1 = (ROOT / "man" / "hframe.1").read_text()
MAN5 = (ROOT / "man" / "hframe.5").read_text()
README = (ROOT / "README.md").read_text()


def plain(roff: str) -> str:
    return roff.replace("\\-", "-")


def commands():
    group = typer.main.get_command(app)
    return group.commands.items()


def test_every_command_and_option_is_in_the_man_page_and_has_help():
    man = plain(MAN1)
    for name, cmd in commands():
        assert f".SS {name}" in man, name
        assert f"hframe {name}" in README, name
        assert cmd.help, name
        for param in cmd.params:
            if param.param_type_name != "option":
                continue
            assert param.help, f"{name} {param.opts}"
            for opt in param.opts:
                assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", man), (
                    f"{name} {opt} missing from man/hframe.1"
                )


def test_every_exit_code_is_documented():
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    section = MAN1.split(".SH EXIT STATUS", 1)[1].split(".SH", 1)[0]
    for code in codes:
        assert f".B {code}\n" in section, code
        assert f"**{code}**" in README, code


def test_index_schema_and_metadata_are_in_the_format_page():
    for col in COLUMNS:
        assert re.search(rf"^{col}\t", MAN5, re.M), col
    for key in IndexMeta.__dataclass_fields__:
        assert f"hframe.{key}\t" in MAN5, key


def test_readme_opens_with_the_demo_and_test_commands_and_ci_runs_the_latter():
    first_block = README.split("```sh", 1)[1].split("```", 1)[0]
    lines = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert lines == ["./scripts/demo.sh", "./scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\n./scripts/test.sh\n" in ci


def test_every_fault_point_is_documented():
    from hframe_cli.faults import POINTS

    section = plain(MAN1).split(".B HFRAME_FAULT", 1)[1].split(".TP", 1)[0]
    for point in POINTS:
        assert point in section, point


def test_the_readmes_install_line_for_users_installs_the_man_pages():
    """``--help`` ends with "See 'man hframe'": the line users copy must be a regular install
    (test_cli_help checks that a wheel puts the pages where man finds them); pip leaves data
    files, and so the pages, out of an editable install."""
    block = README.split("## Install", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    first = block.strip().splitlines()[0]
    assert first.startswith("pip install . ") and "man hframe" in first, first


def test_the_readmes_layout_names_every_room_and_module():
    """A module added to a room without a word in the README's layout is a newcomer's riddle."""
    section = README.split("## Layout of this repository", 1)[1].split("\n## ", 1)[0]
    package = ROOT / "hframe_cli"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if path.name in ("__init__.py", "__main__.py") and len(rel.parts) > 1:
            continue
        room = f"`{rel.parts[0]}/`" if len(rel.parts) > 1 else "`hframe_cli/` (root)"
        row = next((line for line in section.splitlines() if line.startswith(f"| {room} ")), "")
        if f"`{path.name}`" not in row and path.stem not in ("torchdata", "sampler", "__main__"):
            missing.append(str(rel))
    assert missing == []
