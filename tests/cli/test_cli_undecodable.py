"""Bytes that are not UTF-8 in every argument and file name of every command (issue 39): each
command does its work (a name of Latin-1 bytes is a name; a query is searched as the store keeps
such bytes, U+FFFD) or says what is wrong in one line; never "unexpected ...", never a non-zero
exit in silence.

The arguments are found in the parsers, so that one added later is walked too. The walk runs
in-process with the strings Python makes of such bytes (os.fsdecode: a lone surrogate, U+DCFF for
0xff), what `calm` and `calmd` get from execve; tests/cli/test_cli_inputs.py passes real bytes through
execve for a sample. `calmd serve` and `calmd shell-helper` run as processes (they serve), `calmd
complete` and `calm search` also against a running daemon."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from calmd import paths
from calmd.cli import calm_main, calm_parser, calmd_main, calmd_parser
from calmd.history.store import HistoryStore
from tests.support.daemon import BIN, SCRIPTED_SERVE, daemon_env, running_daemon, write_test_weights
from tests.support.waiting import HANG_S

BAD = "\udcff"  # the byte 0xff of an argument, as Python hands it over (surrogateescape)
BAD_BYTES = b"caf\xe9 \xff"
REPO = Path(__file__).resolve().parents[2]
# Walked elsewhere: calm sync's arguments by the sync's tests; serve and shell-helper below.
ELSEWHERE = {("calm", "sync"), ("calmd", "serve"), ("calmd", "shell-helper")}


def bases(f: Path) -> dict[tuple[str, str], dict[str, list[str]]]:
    """The arguments each command is walked with besides the one made bad: what it needs to reach
    that one ({n}: the case's number, for a file no other case made)."""
    text, ds, model, db = str(f / "train.txt"), str(f / "train.ctds"), str(f / "m.cwgt"), str(f / "h.sqlite3")
    return {
        ("calm", "tokenize"): {"text": ["x"]},
        ("calm", "detokenize"): {"ids": ["1"]},
        ("calm", "inspect"): {"file": [model]},
        ("calm", "dataset"): {"--from": [text], "--output": [str(f / "d{n}.ctds")]},
        ("calm", "init"): {"-o": [str(f / "i{n}.cwgt")]},
        ("calm", "train"): {
            "-m": ["new"],
            "-d": [ds],
            "-o": [str(f / "t{n}.cwgt")],
            "--max-steps": ["1"],
            "-q": [],
        },
        ("calm", "evaluate"): {"-m": [model], "-d": [ds]},
        ("calm", "generate"): {"-m": [model], "--input": ["ls"], "-n": ["1"], "--max-tokens": ["4"]},
        ("calm", "rollback"): {"--weights": [str(f / "w{n}.cwgt")]},
        ("calm", "import"): {"files": [text], "--db": [str(f / "import{n}.sqlite3")]},
        ("calm", "search"): {"query": ["x"]},
        ("calm", "history"): {"--db": [db]},
        ("calm", "stats"): {"--db": [db]},
        ("calm", "forget"): {"pattern": ["x"], "--db": [db], "--dry-run": []},
        ("calm", "replay"): {"files": [text], "-m": [model], "--positions": ["2"]},
        ("calmd", "complete"): {"text": ["x"]},
        ("calmd", "install-systemd"): {"--dir": [str(f / "units{n}")]},
        ("calmd", "init"): {"shell": ["bash"]},
    }


def key(action: argparse.Action) -> str:
    return action.option_strings[0] if action.option_strings else action.dest


def valued(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The arguments of `parser` that take a value."""
    for action in parser._actions:
        if action.nargs != 0 and not isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            yield action


def argv_for(parser: argparse.ArgumentParser, args: dict[str, list[str]]) -> list[str]:
    """The command line of `args`: positionals first (an option taking any number of values, as
    `--history`, would take them in), then the options in the parser's order."""
    given = [a for a in parser._actions if key(a) in args]
    positionals = [value for a in given if not a.option_strings for value in args[key(a)]]
    options = [word for a in given if a.option_strings for word in [key(a), *args[key(a)]]]
    return positionals + options


def cases(f: Path) -> list[tuple[str, list[str]]]:
    """(program, argv): every argument of every command, given 0xff bare and as a file name."""
    found: list[tuple[str, list[str]]] = []
    table = bases(f)
    for program, parser in (("calm", calm_parser()), ("calmd", calmd_parser())):
        if program == "calmd":  # its own options, before the command
            found += [(program, [flag, BAD, "status"]) for flag in ("--socket", "--timeout")]
            found.append((program, ["--socket", str(f / BAD), "status"]))
        (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for name, sub in commands.choices.items():
            if (program, name) in ELSEWHERE:
                continue
            base = table.get((program, name), {})
            for action in valued(sub):
                plain = action.choices is not None or action.type not in (None, str, Path)  # a number
                for value in [BAD] if plain else [BAD, str(f / f"{BAD}.x")]:
                    args = {k: [w.replace("{n}", str(len(found))) for w in v] for k, v in base.items()}
                    args[key(action)] = [value]
                    found.append((program, [name, *argv_for(sub, args)]))
    return found


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("undecodable")
    (root / "train.txt").write_text("<CMD>git status\n\n<CMD>ls -la\n\n<CMD>make test\n")
    dataset = ["dataset", "--from", str(root / "train.txt"), "--output", str(root / "train.ctds"), "-q"]
    assert calm_main(dataset) == 0
    assert calm_main(["init", "-o", str(root / "m.cwgt")]) == 0
    store = HistoryStore(root / "h.sqlite3")
    store.record("caf\udce9 \udcff", exit=1, cwd="/tmp", session="s")  # kept as U+FFFD
    store.record("ls", exit=0, cwd="/tmp", session="s")
    store.close()
    return root


@pytest.mark.slow  # a few trainings, replays and generations of the tiny model
def test_undecodable_bytes_in_every_argument_of_every_command(
    files: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALM_HOME", str(files / "home"))
    monkeypatch.setenv("CALMD_SOCKET", str(files / "no-daemon.sock"))  # never a daemon of the machine
    monkeypatch.chdir(files)  # a bare 0xff given for a file is written here
    monkeypatch.delenv("CALM_DEBUG", raising=False)
    walked = cases(files)
    assert len(walked) > 150 and {("calmd", "complete"), ("calm", "import")} <= {(p, a[0]) for p, a in walked}
    wrong = []
    for program, argv in walked:
        main = calm_main if program == "calm" else calmd_main
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a usage error
            code = exc.code
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        said = len(lines) == 1 and lines[0].startswith(program)
        # a value quoted as Python's repr names 0xff `\udcff`: calmd/visible.py shows it `\xff`
        broken = any(word in captured.err for word in ("unexpected", "Traceback", "\\udc"))
        if broken or (code not in (0, None) and not said):
            shown = [a.encode("utf-8", "surrogateescape")[:60] for a in argv]
            wrong.append((program, shown, code, lines[:3]))
    assert not wrong, "\n".join(map(str, wrong))


def checked_by_argparse(parser: argparse.ArgumentParser, chain: list[str]) -> Iterator[list[str]]:
    """The argv of every value argparse itself refuses before a command runs (a choice, a number; a
    command's name), at every depth of commands (`calm sync key`), given 0xff."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield [*chain, BAD]
            for name, sub in action.choices.items():
                yield from checked_by_argparse(sub, [*chain, name])
        elif action in valued(parser) and (action.choices or action.type not in (None, str, Path)):
            yield [*chain, *action.option_strings[:1], BAD]


def test_a_usage_error_shows_the_byte_it_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse quoted the value it refused with Python's repr: `calm sync --mode $'\\xff'` said
    "invalid choice: '\\udcff'", `--interval` "'\\udcff' is not a number". Every such value of
    every command, `calm sync`'s and `calmd serve`'s included, is one line showing `'\\xff'`."""
    walked = [(program, argv) for program, parser in (("calm", calm_parser()), ("calmd", calmd_parser()))
              for argv in checked_by_argparse(parser, [])]  # fmt: skip
    assert len(walked) > 60 and ("calm", ["sync", "--mode", BAD]) in walked
    wrong = []
    for program, argv in walked:
        parser = calm_parser() if program == "calm" else calmd_parser()
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(argv)
        lines = capsys.readouterr().err.splitlines()
        if exited.value.code != 2 or len(lines) != 1 or "'\\xff'" not in lines[0] or "\\udc" in lines[0]:
            wrong.append((argv, exited.value.code, lines[:3]))
    assert not wrong, "\n".join(map(str, wrong))


def test_calm_import_of_a_file_named_in_bytes_that_are_not_utf8(files: Path) -> None:
    """`calm import` of such a file ended in "unexpected UnicodeEncodeError": it imports it now,
    and names it escaped; a second import reads nothing twice."""
    folder = files / "names"
    folder.mkdir()
    name = os.fsencode(folder) + b"/" + BAD_BYTES + b"_history"
    with open(name, "wb") as out:
        out.write(b"ls\ngit status\n")
    (files / "names-home").mkdir()
    env = daemon_env(files / "names-home")
    argv = [bytes(BIN / "calm"), b"import", b"--db", os.fsencode(folder / "h.sqlite3"), name]
    first = subprocess.run(argv, env=env, capture_output=True, timeout=HANG_S)
    assert first.returncode == 0 and first.stderr == b"", first
    assert b"caf\\xe9 \\xff_history: 2 commands imported (bash format)" in first.stdout, first.stdout
    again = subprocess.run(argv, env=env, capture_output=True, timeout=HANG_S)
    assert again.returncode == 0 and b"0 commands imported" in again.stdout, again


@pytest.mark.slow  # a daemon
def test_complete_and_search_with_a_daemon_up(files: Path) -> None:
    """`calmd complete $'\\xff'` (and its --session, --cwd, --history) ended in "unexpected
    UnicodeEncodeError"; `calm search` with a query too long or undecodable, or without a
    terminal, exited 3 ("no daemon") and said nothing, with the daemon up."""
    home = files / "daemon-home"
    home.mkdir()
    with running_daemon(home) as daemon:
        env = daemon_env(home)
        calmd, calm = bytes(BIN / "calmd"), bytes(BIN / "calm")
        subprocess.run([calmd, b"complete", b"ls"], env=env, check=True, capture_output=True, timeout=HANG_S)
        for extra in ([BAD_BYTES], [b"x", b"--session", BAD_BYTES], [b"x", b"--cwd", BAD_BYTES],
                      [b"x", b"--history", BAD_BYTES, b"ls"], [b"x", b"--git", BAD_BYTES]):  # fmt: skip
            out = subprocess.run([calmd, b"complete", *extra], env=env, capture_output=True, timeout=HANG_S)
            assert out.returncode == 0 and out.stderr == b"" and out.stdout, (extra, out)
        done = subprocess.run([calmd, b"complete", b"--scores", BAD_BYTES], env=env, capture_output=True,
                              timeout=HANG_S)  # fmt: skip
        assert b"done in" in done.stdout  # the daemon answered the request, U+FFFD for the bytes
        for query, why in ((b"x" * 2000, "the query is 2,000 bytes, longer than the 1,024 a search takes"),
                           (BAD_BYTES, "no terminal to draw the search on"),  # searched, then no terminal
                           (b"git", "no terminal to draw the search on")):  # fmt: skip
            # setsid: no controlling terminal (as from cron or a pipe), with the daemon up
            out = subprocess.run(["setsid", "-w", calm, b"search", query], env=env, capture_output=True,
                                 stdin=subprocess.DEVNULL, timeout=HANG_S)  # fmt: skip
            (line,) = out.stderr.decode().splitlines()
            assert line.startswith("calm: error: ") and why in line and "unexpected" not in line, out
            assert out.returncode == (2 if len(query) > 1024 else 1), out
        daemon.proc.terminate()
        daemon.wait()
    gone = subprocess.run([calm, b"search", b"git"], env=env, capture_output=True, timeout=HANG_S)
    (line,) = gone.stderr.decode().splitlines()
    assert gone.returncode == 3 and line.startswith("calm: error: calmd is not running (")


@pytest.mark.slow  # daemons and helpers
def test_serve_and_the_shell_helper_take_such_bytes(files: Path) -> None:
    """The two commands that serve, as processes: `calmd serve` with such a socket path, model
    path or training argument serves (or says why in one line), and stops on SIGTERM; the shell
    helper with such a session, socket or spool folder runs until its shell (stdin) ends."""
    home = files / "serve-home"
    home.mkdir()
    write_test_weights(home / "data" / paths.WEIGHTS)
    env = {**daemon_env(home), "PYTHONPATH": str(REPO)}
    bad = os.fsencode(home) + b"/" + BAD_BYTES
    for extra in ([b"--socket", bad + b".sock"], [b"--model", bad + b".cwgt"], [b"--train-arg", BAD_BYTES]):
        argv = [*map(os.fsencode, SCRIPTED_SERVE), b"--no-import", *extra]
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            if b"ready on" in line or b"error" in line:
                break
        proc.terminate()
        rest = proc.communicate(timeout=HANG_S)[0]
        output = line + rest
        assert b"Traceback" not in output and b"unexpected" not in output, output
        assert proc.returncode == 0 and b"ready on" in line, (extra, output)
    assert not Path(os.fsdecode(bad + b".sock")).exists()  # removed on its way out
    (home / "spool").mkdir(mode=0o700)
    helper = [sys.executable, "-m", "calmd", "shell-helper", "--format", "2"]
    for extra in (["--session", BAD], ["--socket", str(home / BAD)], ["--spool", str(home / BAD)],
                  ["--spool", str(home / "spool"), "--session", BAD]):  # fmt: skip
        shell = subprocess.Popen(["sleep", "2"])  # the shell it serves: it goes when that ends
        argv = [os.fsencode(a) for a in [*helper, *extra, "--shell-pid", str(shell.pid)]]
        out = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=HANG_S)
        shell.wait()
        assert out.returncode in (0, 1) and b"Traceback" not in out.stderr, (extra, out)  # its log says why
    assert not (home / "spool").exists()  # the folder's helper went with its shell and took it
    shutil.rmtree(home / "data", ignore_errors=True)
