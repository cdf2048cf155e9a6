"""Discoverability (issue 14): one-line usage errors, help with real examples, shell completion,
and man pages installed with the package (checked in a fresh venv from a built wheel)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import typer
from conftest import run_bin

from hframe_cli.cli.app import _VALUED_GLOBALS, EXAMPLES, app

ROOT = Path(__file__).resolve().parents[2]


def commands() -> dict:
    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["pakc", "x"], "no such command 'pakc'. Did you mean 'pack'? (see 'hframe -h')"),
        (["pack"], "pack: missing argument 'SOURCE...' (see 'hframe pack -h')"),
        (["get", "p.hframe", "--bogus"], "get: no such option: --bogus (see 'hframe get -h')"),
        (
            ["get", "p.hframe", "1", "--format", "zip"],
            "get: invalid value for '--format': 'zip' is not one of 'raw', 'tar' (see 'hframe get -h')",
        ),
        (["verify", "x", "--sample"], "verify: option '--sample' requires an argument (see 'hframe verify -h')"),
        (["--bogus"], "no such option: --bogus (see 'hframe -h')"),
    ],
)
def test_usage_errors_are_one_line_exit_2(cli, args, line):
    r = cli(args)
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", f"hframe: error: {line}\n")


def test_usage_errors_from_the_installed_command_too():
    r = run_bin(["pakc"])
    assert (r.returncode, r.stderr.decode()) == (
        2,
        "hframe: error: no such command 'pakc'. Did you mean 'pack'? (see 'hframe -h')\n",
    )
    r = run_bin([])  # bare `hframe`: the help, on stderr, exit 2
    assert r.returncode == 2 and r.stderr.decode().startswith("Usage: hframe [OPTIONS] COMMAND")


def test_every_command_has_one_to_three_examples_that_use_only_its_own_flags(cli):
    assert set(EXAMPLES) == set(commands())
    for name, command in commands().items():
        examples = EXAMPLES[name]
        assert 1 <= len(examples) <= 3, name
        flags = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        for example in examples:
            for stage in example.split("#")[0].split("|"):
                words = shlex.split(stage)
                if words[:1] != ["hframe"]:
                    continue  # tar x, > redirects
                assert words[1] in commands(), example
                own = {opt for p in commands()[words[1]].params for opt in (*p.opts, *p.secondary_opts)}
                own |= set(_VALUED_GLOBALS) | {"--debug"}  # (global options are taken after the command too)
                used = [w for w in words[2:] if w.startswith("-") and w != "-"]
                assert set(used) <= own, (example, set(used) - own)
        r = cli([name, "--help"])
        assert r.exit_code == 0, name
        tail = r.stdout.split("\nExamples:\n", 1)[1]
        assert tail.splitlines() == [f"  {e}" for e in examples], name
        assert flags  # the command has options at all


def test_help_has_no_odd_placeholders(cli):
    for name in commands():
        text = cli([name, "--help"]).stdout
        usage = text.splitlines()[0]
        assert re.fullmatch(rf"Usage: hframe {name} \[OPTIONS\]( \[?[A-Z.]+\]?)*", usage), usage  # (cache: none)
        assert not re.search(r"\{\w+\}|<(str|int|path|float|text)>|\bTEXT\b|\bINTEGER\b|\bPATH\b", text), (name, text)


def test_completion_scripts_and_answers(tmp_path):
    # the shell is the one hframe runs in (shellingham looks at the parent process), as documented
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-c", "hframe --show-completion"], capture_output=True, env=env, timeout=60)
    assert r.returncode == 0 and b"_HFRAME_COMPLETE=complete_bash" in r.stdout, r.stderr
    script = tmp_path / "hframe.sh"
    script.write_bytes(r.stdout)
    # the script, sourced by a real bash, completes commands, options and choices
    cmd = f"""
        source {shlex.quote(str(script))}
        for words in 'hframe pa' 'hframe get p --fo' 'hframe index p --format ' 'hframe verify --sam'; do
            COMP_WORDS=($words); [[ "$words" == *' ' ]] && COMP_WORDS+=('')
            COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
            _hframe_completion hframe
            echo "${{COMPREPLY[*]}}"
        done
    """
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.splitlines() == ["pack", "--format", "table tsv csv jsonl json", "--sample"], out.stderr
    # --install-completion writes the script and sources it from ~/.bashrc
    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run(
        ["bash", "-c", "hframe --install-completion"], capture_output=True, env={**env, "HOME": str(home)}, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert (home / ".bash_completions" / "hframe.sh").read_bytes().strip() == script.read_bytes().strip()
    assert "source '" + str(home / ".bash_completions" / "hframe.sh") in (home / ".bashrc").read_text()


@pytest.mark.parametrize("command", ["get", "index", "dump-header", "bench-warm", "bench-cold", "verify"])
def test_a_reading_commands_help_names_every_kind_of_remote_location(command):
    r = run_bin([command, "-h"], env={"COLUMNS": "200"})
    text = " ".join(r.stdout.decode().split())
    assert r.returncode == 0 and all(s in text for s in ("http(s)://", "s3://", "gs://", "hdfs://")), text


def test_the_test_extra_brings_what_the_offline_wheel_build_needs():
    """The wheel test below builds with --no-build-isolation, i.e. with this venv's own build
    backend: the ``test`` extra must ask for everything ``[build-system] requires`` does, or the
    suite passes or fails by whatever else pulled a setuptools in (a fresh ``python3 -m venv`` on
    Python 3.11 has 65.5, which rejects ``license = "MIT"``)."""
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    test_extra = set(meta["project"]["optional-dependencies"]["test"])
    assert set(meta["build-system"]["requires"]) <= test_extra


def _installed_from_a_wheel(
    tmp_path: Path, build_env: dict[str, str] | None = None
) -> tuple[Path, Path, dict[str, str]]:
    """A fresh venv with hframe from a wheel built from this tree (no network: the build uses
    this venv's setuptools, the dependencies come from this venv through a .pth file). Returns
    the venv, its site-packages and the environment to run it in."""
    src = tmp_path / "src"
    src.mkdir()
    for item in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / item, src / item)
    for folder in ("hframe_cli", "man"):  # (not what this tree built in place: the wheel builds its own)
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "w"), str(src)],
        check=True,
        env={**os.environ, **(build_env or {})},
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (wheel,) = (tmp_path / "w").glob("hframe-*.whl")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", str(wheel)], check=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MANPATH", "PYTHONPATH", "HFRAME_NATIVE")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return venv, site, env


@pytest.mark.slow
def test_without_a_c_compiler_pip_installs_hframe_without_its_compiled_parts(tmp_path):
    """The compiled loops are optional: a build whose compiler fails still gives a working
    hframe, packing and verifying in Python, and says so (``hframe --version``)."""
    venv, site, env = _installed_from_a_wheel(tmp_path, {"CC": "/bin/false", "LDSHARED": "/bin/false"})
    assert not list(site.glob("hframe_cli/**/*.so"))
    r = subprocess.run([venv / "bin" / "hframe", "-V"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.endswith("(compiled: none (not built at install))\n"), (r.stdout, r.stderr)
    (tmp_path / "in").mkdir()
    for i in range(30):
        (tmp_path / "in" / f"{i}.bin").write_bytes(os.urandom(100 + i))
    out = tmp_path / "p.hframe"
    for args in (["pack", str(tmp_path / "in"), "-o", str(out), "-q", "--workers", "2"], ["verify", str(out), "-q"]):
        r = subprocess.run([venv / "bin" / "hframe", *args], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_pip_install_puts_the_man_pages_where_man_finds_them(tmp_path):
    """A fresh venv gets hframe from a wheel built from this tree: the man pages, the command,
    its completion, and (where a compiler is) its compiled parts."""
    venv, site, env = _installed_from_a_wheel(tmp_path)
    assert (venv / "share/man/man1/hframe.1").read_bytes() == (ROOT / "man/hframe.1").read_bytes()
    assert (venv / "share/man/man5/hframe.5").read_bytes() == (ROOT / "man/hframe.5").read_bytes()
    r = subprocess.run([venv / "bin" / "hframe", "-V"], capture_output=True, text=True, env=env)
    assert r.stdout.startswith("hframe ") and r.returncode == 0, r.stderr
    if shutil.which("cc") and Path(sysconfig.get_paths()["include"], "Python.h").exists():
        assert re.search(r"\(compiled: list, pack, verify, md5 x16 (avx512f|avx2|baseline)\)\n$", r.stdout), r.stdout
    r = subprocess.run(
        [venv / "bin" / "python", "-c", "import hframe_cli; print(hframe_cli.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert r.stdout.startswith(str(site)), r.stdout  # the installed copy, not this tree
    r = subprocess.run(["bash", "-c", f"{venv / 'bin' / 'hframe'} --show-completion"], capture_output=True, env=env)
    assert b"complete -o default -F _hframe_completion hframe" in r.stdout
    if shutil.which("man") is None:
        pytest.skip("no man(1) here; the pages are installed under share/man")
    for section, page in (("1", "man1/hframe.1"), ("5", "man5/hframe.5")):
        r = subprocess.run(["man", "-w", section, "hframe"], capture_output=True, text=True, env=env)
        assert r.stdout.strip() == str(venv / "share/man" / page), (r.stdout, r.stderr)


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    from conftest import make_photos

    root = tmp_path_factory.mktemp("surface")
    photos = make_photos(root / "photos", 6)
    out = root / "p.hframe"
    r = run_bin(["pack", str(photos), "-o", str(out), "-q", "--created", "1700000000"])
    assert r.returncode == 0, r.stderr
    return root


SURFACE = [
    # (args, stdin, exit code): issue 14's points, each run through the installed command and the runner
    (["-V"], None, 0),
    (["pakc"], None, 2),
    (["get", "{p}", "0", "-o", "-"], None, 0),
    (["get", "{p}", "--label", "typo", "-o", "{root}/d"], None, 2),
    (["get", "{p}", "0", "1", "--format", "tar"], None, 0),
    (["get", "{p}", "-T", "-", "--format", "tar"], b"cats/000.png\n1\n", 0),
    (["index", "{p}", "--split", "train"], None, 2),
    (["index", "{p}", "-f", "table"], None, 0),
    (["verify", "{root}/zz-*.hframe"], None, 2),
    (["pack", "{root}/photos", "-o", "{p}", "--update", "--dry-run"], None, 0),
    (["pack", "{root}/photos", "-o", "{p}", "-n"], None, 2),
    (["resume", "{p}"], None, 0),
]


@pytest.mark.parametrize(("args", "stdin", "code"), SURFACE, ids=[" ".join(a[:3]) for a, _, _ in SURFACE])
def test_the_installed_command_and_the_runner_agree_exactly(cli, small_pack, args, stdin, code):
    argv = [a.format(p=small_pack / "p.hframe", root=small_pack) for a in args]
    r = run_bin(argv, input=stdin)
    assert r.returncode == code, r.stderr
    inproc = cli(argv, input=stdin)
    assert (inproc.exit_code, inproc.stdout_bytes, inproc.stderr) == (code, r.stdout, r.stderr.decode())
    assert b"Traceback" not in r.stderr and (code == 0 or r.stderr.count(b"\n") == 1)


def test_every_example_runs(tmp_path):
    """Each command's help examples, run as written in a folder holding photos/ (260 images: a
    bench batch is 256)."""
    from conftest import make_photos

    make_photos(tmp_path / "photos", 260)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HFRAME_TTY": "0"}
    order = [
        *("pack", "resume", "verify", "index", "get", "sheet", "dump-header", "bench-warm", "bench-cold"),
        *("cache", "prefetch", "mount", "umount"),
    ]
    fuse = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
    assert sorted(order) == sorted(EXAMPLES)
    for name in order:
        for example in EXAMPLES[name]:
            if "://" in example:  # a remote pack (prefetch's): no server here; test_cache.py runs it
                continue
            if "hframe mount" in example and not fuse:  # (tests/read/test_mount.py says why it is skipped)
                continue
            if "--rebuild" in example:
                (tmp_path / "photos.hframe.index.parquet").unlink()
            r = subprocess.run(
                ["bash", "-c", f"set -o pipefail; {example}"], cwd=tmp_path, env=env, capture_output=True, timeout=120
            )
            assert r.returncode == 0, (example, r.stderr.decode())


def test_usage_errors_for_options_put_before_the_command_and_debug_after_a_double_dash(cli, tmp_path):
    r = cli(["--json", "verify", "x"])
    assert (
        r.stderr
        == "hframe: error: --json is an option of 'verify', not of hframe: put it after the command (see 'hframe verify -h')\n"
    )
    r = cli(["get", str(tmp_path / "p.hframe"), "-o", str(tmp_path / "d"), "--", "--debug"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1  # "--debug" is a frame name there, not the flag


def test_an_interrupted_reading_command_does_not_talk_about_publishing():
    from hframe_cli.cli.app import _interrupted_message

    assert _interrupted_message(["get", "p.hframe", "1"]) == "interrupted"
    assert _interrupted_message(["verify", "p.hframe"]) == "interrupted"
    assert _interrupted_message(["pack", "d", "-o", "p.hframe"]).startswith("interrupted; nothing was published")
    assert _interrupted_message(["index", "p.hframe", "--rebuild"]).startswith("interrupted; nothing was published")


_HEAP_AFTER_COMMAND = """
import ctypes
import hframe_cli.cli.app as app
from hframe_cli.cli import entry
app.run = lambda: None  # the command's start, without a command (its end leaves by os._exit)
entry.run()
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
blobs = [bytearray(1 << 20) for _ in range(40)]  # a remote read's answers, then let go
del blobs
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
print(mallinfo2().keepcost)
"""


def test_the_hframe_commands_process_keeps_its_freed_heap_unless_told_not_to():
    """A remote read's answers are megabytes freed right after: the command's own process (it is
    ours, unlike a library caller's) keeps freed heap, so the next answers land in pages faulted
    in already; HFRAME_MALLOC=0 or a MALLOC_* threshold of the user's leaves glibc as it is."""
    import ctypes

    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc 2.33 or later")
    env = {k: v for k, v in os.environ.items() if k != "HFRAME_MALLOC" and not k.startswith("MALLOC_")}

    def kept(**extra: str) -> int:
        r = subprocess.run(
            [sys.executable, "-c", _HEAP_AFTER_COMMAND],
            capture_output=True,
            text=True,
            env={**env, **extra},
            check=True,
        )
        return int(r.stdout.split()[-1])

    assert kept() >= 32 << 20
    assert kept(HFRAME_MALLOC="0") < 8 << 20
    assert kept(MALLOC_TOP_PAD_="0") < 8 << 20
