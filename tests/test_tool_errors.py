"""One error format for every tool (issue 35): `calm`, `calmd`, the `python -m calmd....` tools and
the bench scripts, each started as a user starts it, with a missing file, a folder where a file is
meant (the machine runs as root, which reads a chmod 000 file: a folder is the unreadable file
here), a corrupt file or JSON, and a bad flag. Each answers with one line on stderr,
`PROG: error: FILE: what` (`PROG: error: what` when no file is involved), no traceback, no
`[Errno N]`, and exits 1 for a failure, 2 for a usage error (calmd/arguments.py's `run_tool`,
calmd/errors.py's `one_line`). The whole walk (tests/cli/test_cli_inputs.py) is in-process; this file
checks the entry points themselves."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from calmd import paths
from calmd.arguments import run_tool
from calmd.errors import FormatError, one_line
from tests.support.daemon import BIN, daemon_env
from tests.support.waiting import HANG_S

ROOT = Path(__file__).resolve().parent.parent
PY = [sys.executable, "-m"]


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tool-errors")
    (root / "folder").mkdir()
    (root / "a-file").write_text("not a folder\n")
    (root / "garbage.cwgt").write_bytes(b"\0garbage" * 4)
    (root / "bad.json").write_text('{"format": ')
    # a data folder whose one history is a folder: every fit reads the histories first
    (root / "data" / "histories" / "users" / "u1.txt").mkdir(parents=True)
    (root / "data" / "tldr" / "common").mkdir(parents=True)
    # a data folder with one readable training user (fit_calibration reads --model after it)
    (root / "small" / "histories" / "users").mkdir(parents=True)
    (root / "small" / "histories" / "users" / "u1.txt").write_text("ls\ngit status\n" * 20)
    (root / "corpus.ctds").write_bytes(b"x")
    (root / "corpus.json").write_text('{"examples": ')  # the recipe's stamp beside it, cut short
    (root / "home").mkdir()
    return root


def env_for(root: Path) -> dict[str, str]:
    env = daemon_env(root / "home")  # its own CALM_HOME and runtime dir; no CALM_DEBUG
    env["PYTHONPATH"] = str(ROOT)  # bench/ imports tests/ and bench/ as packages
    return env


def one_error(f: Path, prog: str, argv: list[str], status: int, **extra_env: str) -> str:
    """Run `argv` as a user would; the one line it prints, after checking the format and status."""
    out = subprocess.run(argv, cwd=ROOT, env={**env_for(f), **extra_env}, capture_output=True, text=True,
                         timeout=HANG_S)  # fmt: skip
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    what = (argv[-4:], out.returncode, out.stderr[-800:])
    assert out.returncode == status, what
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), what
    assert "Traceback" not in out.stderr and "[Errno" not in lines[0] and "unexpected" not in lines[0], what
    return lines[0].removeprefix(f"{prog}: error: ")


# --------------------------------------------------------------------------- calm and calmd


def test_calm(f: Path) -> None:
    calm = str(BIN / "calm")
    assert (
        one_error(f, "calm", [calm, "inspect", "/x/y.cwgt"], 1)
        == "/x/y.cwgt: cannot read: No such file or directory"
    )
    assert one_error(f, "calm", [calm, "inspect", str(f / "folder")], 1).startswith(f"{f / 'folder'}: ")
    assert one_error(f, "calm", [calm, "inspect", str(f / "garbage.cwgt")], 1).startswith(
        f"{f}/garbage.cwgt: "
    )
    sync = f / "home" / "data" / paths.SYNC_CONFIG
    sync.parent.mkdir(mode=0o700, exist_ok=True)  # as calm makes it (a wider one: a note first)
    sync.write_text('{"format": ')
    line = one_error(f, "calm", [calm, "sync", "now"], 1)
    assert line.startswith(f"{sync}: cannot read the sync config: Expecting value"), line
    sync.unlink()
    assert "unrecognized arguments: --bogus" in one_error(f, "calm", [calm, "inspect", "x", "--bogus"], 2)


def test_calmd(f: Path) -> None:
    calmd = str(BIN / "calmd")
    line = one_error(f, "calmd", [calmd, "install-systemd", "--dir", str(f / "a-file")], 1)
    assert line == f"--dir {f / 'a-file'}: not a folder; give the folder for the unit files"
    assert "unrecognized arguments: --bogus" in one_error(f, "calmd", [calmd, "status", "--bogus"], 2)


def test_calmd_serve_keeps_its_exit_code_and_says_the_one_line_on_stdout_too(f: Path) -> None:
    """`calmd serve` exits 3 when it cannot start (systemd's unit reads it): the same line, on its
    log (stdout) as before."""
    argv = [str(BIN / "calmd"), "serve", "--socket", str(f / "folder"), "--no-import"]
    out = subprocess.run(argv, env=env_for(f), capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 3 and "Traceback" not in out.stdout + out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("calmd: ")]
    assert line.startswith(f"calmd: error: {f / 'folder'} is a folder: refusing to replace it")


# --------------------------------------------------------------------------- python -m calmd....


@pytest.mark.slow  # three processes each, importing torch (2 CPU-seconds each): the quick loop has the rest
@pytest.mark.parametrize("tool", ["fit_ranker", "fit_search", "fit_vocabulary", "fit_anchor"])
def test_the_fits(f: Path, tool: str) -> None:
    prog = f"python -m calmd.quality.{tool}"
    argv = [*PY, f"calmd.quality.{tool}", "--output", str(f / f"{tool}.json")]
    history = f / "data" / "histories" / "users" / "u1.txt"
    assert one_error(f, prog, [*argv, "--data", str(f / "data")], 1) == f"{history}: Is a directory"
    line = one_error(f, prog, [*argv, "--data", "/x/data"], 2)  # no histories there: give another --data
    assert line == f"no histories under /x/data/histories/users; see `{prog} --help`"
    assert "unrecognized arguments: --bogus" in one_error(f, prog, [*argv, "--bogus"], 2)
    assert not (f / f"{tool}.json").exists()


def test_fit_calibration(f: Path) -> None:
    prog = "python -m calmd.quality.fit_calibration"
    argv = [*PY, "calmd.quality.fit_calibration", "--data", str(f / "small"), "--positions", "2",
            "--output", str(f / "calibration.json")]  # fmt: skip
    # the file given, not the copy the replay reads in a temporary folder
    assert (
        one_error(f, prog, [*argv, "--model", "/x/m.cwgt"], 1)
        == "/x/m.cwgt: cannot read: No such file or directory"
    )
    line = one_error(f, prog, [*argv, "--model", str(f / "garbage.cwgt")], 1)
    assert line.startswith(f"{f / 'garbage.cwgt'}: header: ")
    assert one_error(f, prog, [*argv, "--model", str(f / "folder")], 1).startswith(f"{f / 'folder'}: ")
    assert "invalid int value: 'many'" in one_error(f, prog, [*argv, "--positions", "many"], 2)


@pytest.mark.slow  # four processes importing torch
def test_the_recipe(f: Path) -> None:
    prog = "python -m calmd.training.recipe"
    argv = [*PY, "calmd.training.recipe", "--work", str(f / "work"), "--output", str(f / "r.cwgt")]
    line = one_error(f, prog, [*argv, "--corpus", str(f / "corpus.ctds")], 1)
    assert line.startswith(f"{f / 'corpus.json'}: not JSON (")
    assert one_error(f, prog, [*argv, "--corpus", "/x/c.ctds"], 1).startswith(
        "--corpus /x/c.ctds: needs the corpus"
    )
    assert one_error(f, prog, [*argv, "--data", str(f / "a-file")], 1).startswith(
        f"{f / 'a-file'}: not the shared"
    )
    assert "-3 is out of range" in one_error(f, prog, [*argv, "--steps", "-3"], 2)


def test_the_background_run(f: Path) -> None:
    prog = "python -m calmd.training.background"
    argv = [*PY, "calmd.training.background"]
    assert (
        one_error(f, prog, [*argv, "--data-dir", str(f / "a-file")], 1) == f"{f / 'a-file'} is not a folder"
    )
    assert "unrecognized arguments: --bogus" in one_error(f, prog, [*argv, "--bogus"], 2)


def test_the_search_ui(f: Path) -> None:
    """Ctrl-R's `python -m calmd.shell.search_ui`: its usage errors are calm search's."""
    line = one_error(f, "calm search", [*PY, "calmd.shell.search_ui", "--mode", "bogus"], 2)
    assert line.startswith("argument --mode: invalid choice: 'bogus'")


def test_fit_ghost_usage(f: Path) -> None:
    one_error(f, "python -m calmd.quality.fit_ghost", [*PY, "calmd.quality.fit_ghost", "--bogus"], 2)


def test_fit_ghost_corrupt_states(f: Path) -> None:
    prog = "python -m calmd.quality.fit_ghost"
    line = one_error(f, prog, [*PY, "calmd.quality.fit_ghost", "--states", str(f / "bad.json")], 1)
    assert line.startswith(f"{f / 'bad.json'}: not JSON (")
    (f / "old.json").write_text("[]")  # JSON, but not what this version collects
    line = one_error(f, prog, [*PY, "calmd.quality.fit_ghost", "--states", str(f / "old.json")], 1)
    assert line.startswith(f"{f / 'old.json'}: not states collected")


def test_ghost_curve_usage_and_a_corrupt_cache(f: Path) -> None:
    prog = "python -m calmd.quality.ghost_curve"
    one_error(f, prog, [*PY, "calmd.quality.ghost_curve", "--bogus"], 2)
    line = one_error(f, prog, [*PY, "calmd.quality.ghost_curve", "--states", str(f / "bad.json")], 1)
    assert line.startswith(f"{f / 'bad.json'}: not JSON (")


# --------------------------------------------------------------------------- bench/


BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")


def test_every_bench_with_a_main_goes_through_run_tool() -> None:
    """A bench added later keeps the format: its `__main__` calls run_tool with its PROG, and its
    flags are arguments.Parser's (one-line usage errors). run_all.py, stdlib only, prints its own."""
    for path in BENCHES:
        tree = ast.parse(path.read_text())
        mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        if not mains or path.name == "run_all.py":
            continue
        text = ast.unparse(mains[0])
        assert "run_tool(PROG" in text, path.name
        assert f'PROG = "bench/{path.name}"' in path.read_text(), path.name
        assert "argparse.ArgumentParser(" not in path.read_text(), path.name


@pytest.mark.slow  # a process each, most of them importing torch
@pytest.mark.parametrize(
    ("argv", "status", "expected"),
    [
        (["comp_latency.py", "--model", "/x/m.cwgt"], 1, "/x/m.cwgt: cannot read: No such file or directory"),
        (["comp_probe.py", "{f}/garbage.cwgt"], 1, "{f}/garbage.cwgt: header: "),
        (["ctds_open.py", "--dir", "{f}/a-file", "--sizes-mb", "1"], 1, "{f}/a-file/"),
        (["prefetch.py", "--user", "{f}/folder", "--lines", "1"], 1, "{f}/folder: Is a directory"),
        (["gpu.py", "collect", "{f}/bad.json"], 1, "{f}/bad.json/summary.json: Not a directory"),
        (["gpu.py", "export", "/x/ck.pt", "{f}/o.cwgt", "--size", "nano"], 1, "/x/ck.pt: No such file"),
        (["gpu.py", "collect", "d", "--bogus"], 2, "unrecognized arguments: --bogus"),
        (["model_latency.py", "--model", "a=/x/m.cwgt"], 2, "argument --model: --model a=/x/m.cwgt: give"),
        (["history_query.py", "--runs", "x"], 2, "argument --runs: invalid int value: 'x'"),
        (["run_all.py", "nope"], 2, "unknown benchmark(s): nope; known: "),
    ],
)
def test_the_benches(f: Path, argv: list[str], status: int, expected: str) -> None:
    script, *rest = [a.replace("{f}", str(f)) for a in argv]
    line = one_error(f, f"bench/{script}", [sys.executable, f"bench/{script}", *rest], status)
    assert line.startswith(expected.replace("{f}", str(f))), line


# --------------------------------------------------------------------------- the one function


def test_one_line_names_the_file_and_never_the_errno() -> None:
    missing = FileNotFoundError(2, "No such file or directory", "/x/y.json")
    assert one_line(missing) == "/x/y.json: No such file or directory"
    assert one_line(missing, named=False) == "No such file or directory"
    # a folder in the way of a rename: the folder is named, not the temporary file
    moved = IsADirectoryError(21, "Is a directory", "/t/.tmp123", None, "/t/out.json")
    assert one_line(moved) == "/t/out.json: Is a directory"
    assert one_line(PermissionError(13, "Permission denied", b"/x/\xffz")) == "/x/\\xffz: Permission denied"
    assert one_line(OSError(28, "No space left on device")) == "No space left on device"
    assert (
        one_line(FormatError("not JSON", path="/x/a.json", field="ranker")) == "/x/a.json: ranker: not JSON"
    )
    assert (
        one_line(ValueError("two\n  lines\x1b[2J")) == "two lines\\e[2J"
    )  # one line, nothing for the terminal


def test_run_tool_statuses(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> int:
        open("/x/y.json")  # noqa: SIM115
        return 0

    def bench_check() -> None:
        raise SystemExit("calmd did not start:\nits log")

    assert run_tool("tool", missing) == 1
    assert capsys.readouterr().err == "tool: error: /x/y.json: No such file or directory\n"
    assert run_tool("bench/x.py", bench_check) == 1
    assert capsys.readouterr().err == "bench/x.py: error: calmd did not start: its log\n"
    assert run_tool("bench/x.py", lambda: {"figure": 1.0}) == 0  # a bench's figures: success
    assert run_tool("tool", lambda: 3) == 3
    with pytest.raises(SystemExit) as usage:
        run_tool("tool", lambda: sys.exit(2))  # argparse's usage error goes on as it is
    assert usage.value.code == 2
    monkeypatch.delenv("CALM_DEBUG", raising=False)
    assert run_tool("tool", lambda: [][1]) == 1
    assert capsys.readouterr().err.startswith("tool: error: unexpected IndexError: list index out of range")
