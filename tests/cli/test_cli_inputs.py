"""No traceback from any command-line input (issue 23): every subcommand of `calm` and `calmd` is
walked with bad values (negative and huge counts, words for numbers, NaN and infinities, long
input, missing files, folders where files are meant, files that cannot be read, garbage), and
each answers with one line that says what to give instead, and a non-zero exit; nothing runs.

The walk runs in-process (`calm_main`, `calmd_main`): an exception escaping a command fails the
test as it would print a traceback. `calmd serve`, the recipe and `install-systemd` run as
processes, as users start them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from calmd import paths
from calmd.cli import calm_main, calmd_main
from tests.support.daemon import BIN, daemon_env
from tests.support.waiting import HANG_S

REPO = Path(__file__).resolve().parents[2]
UNREADABLE = Path("/proc/self/clear_refs")  # a regular file whose read fails, even for root
HUGE = str(2**70)
LONG = "x" * 100_000
TRAIN_TXT = "<CMD>git status\n\n<CMD>ls -la\n\n<CMD>make test\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inputs")
    (root / "folder").mkdir()
    (root / "garbage").write_bytes(b"\0garbage" * 100)
    (root / "train.txt").write_text(TRAIN_TXT)
    unreadable = root / "unreadable"
    unreadable.write_text("ls\n")
    unreadable.chmod(0)  # unreadable for a user; root reads it, so UNREADABLE is walked too
    assert (
        calm_main(["dataset", "--from", str(root / "train.txt"), "--output", str(root / "train.ctds"), "-q"])
        == 0
    )
    assert calm_main(["init", "-o", str(root / "m.cwgt")]) == 0
    return {"root": root, "folder": root / "folder", "garbage": root / "garbage", "missing": root / "missing",
            "text": root / "train.txt", "ctds": root / "train.ctds", "model": root / "m.cwgt",
            "unreadable": unreadable}  # fmt: skip


def bad_paths(files: dict[str, Path]) -> list[str]:
    names = ("missing", "folder", "garbage") + (("unreadable",) if os.geteuid() != 0 else ())  # root reads it
    return [str(files[k]) for k in names] + [str(UNREADABLE)]


def cases(f: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(program, argv) of every bad input walked."""
    m, ds, text, out = str(f["model"]), str(f["ctds"]), str(f["text"]), str(f["root"] / "out")
    calm: list[list[str]] = []
    for bad in bad_paths(f):
        calm += [
            ["inspect", bad], ["import", bad], ["dataset", "--from", bad, "-o", out + ".ctds"],
            ["dataset", "--view", "--ds", bad], ["generate", "-m", bad], ["evaluate", "-m", bad, "-d", ds],
            ["evaluate", "-m", m, "-d", bad], ["train", "-m", bad, "-d", ds, "-o", out + ".cwgt", "-q"],
            ["train", "-m", "new", "-d", bad, "-o", out + "2.cwgt", "-q"], ["replay", bad],
            ["replay", text, "-m", bad],
            ["forget", "x", "--db", bad], ["dataset", "--db", bad, "-o", out + "3.ctds"],
        ]  # fmt: skip
    calm += [  # where 0 is no value (elsewhere it means "none" or "the default")
        ["generate", "-m", m, "-n", "0"], ["generate", "-m", m, "--max-tokens", "0"],
        ["dataset", "--view", "--ds", ds, "--count", "0"], ["dataset", "--view", "--ds", ds, "--index", "0"],
        ["evaluate", "-m", m, "-d", ds, "--batch-size", "0"], ["replay", text, "--positions", "0"],
        ["import", text, "--max-mib", "0"],
        ["train", "-m", "new", "-d", ds, "-o", out + "z.cwgt", "--epochs", "0"],
    ]  # fmt: skip
    calm += [  # counts too large for what they count
        ["generate", "-m", m, "-n", "100000"], ["generate", "-m", m, "--max-tokens", "100000"],
        ["generate", "-m", m, "--sample", "--top-k", "100000"],
        ["dataset", "--view", "--ds", ds, "--index", "99"],
        ["dataset", "--from", text, "-o", out, "--l-max", "100000"], ["detokenize", "100000"],
        ["dataset", "--db", out + ".sqlite3", "-o", out, "--hist-frames", "16"],
        ["evaluate", "-m", m, "-d", ds, "--batch-size", "100000"],
        ["evaluate", "-m", m, "-d", ds, "--threads", "5000"],
        ["train", "-m", "new", "-d", ds, "-o", out + "e.cwgt", "--batch-size", "100000", "-q"],
    ]  # fmt: skip
    for n in ("-1", "-3", HUGE, "abc", "1.5"):
        calm += [
            ["generate", "-m", m, "-n", n], ["generate", "-m", m, "--max-tokens", n],
            ["generate", "-m", m, "--sample", "--top-k", n], ["dataset", "--view", "--ds", ds, "--count", n],
            ["dataset", "--view", "--ds", ds, "--index", n],
            ["dataset", "--from", text, "-o", out, "--l-max", n],
            ["evaluate", "-m", m, "-d", ds, "--batch-size", n],
            ["evaluate", "-m", m, "-d", ds, "--threads", n],
            ["replay", text, "--positions", n], ["replay", text, "--train-every", n, "--with-training"],
            ["detokenize", n], *([["import", text, "--max-mib", n]] if n != "1.5" else []),
            ["dataset", "--db", out + ".sqlite3", "-o", out, "--hist-frames", n],
            ["train", "-m", "new", "-d", ds, "-o", out + "e.cwgt", "--batch-size", n, "-q"],
            ["init", "-o", out + "s.cwgt", "--seed", n],
        ]  # fmt: skip
        if n.startswith("-") or n in (HUGE, "abc", "1.5"):
            calm += [["replay", text, "--typing", n], ["replay", text, "--warmup", n],
                     ["evaluate", "-m", m, "-d", ds, "--limit", n],
                     ["train", "-m", "new", "-d", ds, "-o", out + "e.cwgt", "--epochs", n, "-q"]]  # fmt: skip
    for x in ("-1", "nan", "inf", "-inf", "2", "abc"):
        calm += [["generate", "-m", m, "--sample", "--temperature", x if x != "2" else "101"],
                 ["generate", "-m", m, "--sample", "--top-p", x],
                 ["generate", "-m", m, "--sample", "--min-p", x],
                 ["train", "-m", "new", "-d", ds, "-o", out + "f.cwgt", "--lr", x if x != "2" else "0",
                  "-q"]]  # fmt: skip
    calm += [
        ["init"], ["init", "-o", str(f["folder"])], ["init", "-o", m],  # no -o; a folder; an existing file
        ["tokenize", "--frame", "BOGUS", "x"], ["forget", ""], ["forget", "[", "--regex"],
        ["replay", text, "--weight", "bogus=1"], ["replay", text, "--weight", "history_mix=x"],
        ["dataset", "--from", text, "-o", str(f["folder"])], ["rollback", "--weights", str(f["folder"])],
        ["rollback", "--weights", str(f["missing"])], ["train", "-m", "new", "-d", ds, "-o", m, "-q"],
        ["generate", "-m", m, "--history", *["ls"] * 300, "--input", LONG, "-n", "33"],
    ]  # fmt: skip
    calmd: list[list[str]] = [
        ["complete", "-n", "100", "git"], ["complete", "-n", "-1", "git"], ["complete", "x" * 5000],
        ["complete", LONG], ["--timeout", "-1", "status"], ["--timeout", "nan", "stop"],
        ["install-systemd", "--dir", str(f["garbage"])],
        ["serve", "--max-connections", "-1"], ["serve", "--reply-timeout", "0"],
        ["serve", "--train-threshold", HUGE + "x"],
        ["serve", "--graceful-timeout", "inf"], ["serve", "--train-max-load", "-2"],
    ]  # fmt: skip
    return [("calm", argv) for argv in calm] + [("calmd", argv) for argv in calmd]


def test_every_bad_input_is_one_line_that_says_what_to_do(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALM_HOME", str(files["root"] / "home"))
    monkeypatch.delenv("CALM_DEBUG", raising=False)
    walked = cases(files)
    assert len(walked) > 200
    for program, argv in walked:
        main = calm_main if program == "calm" else calmd_main
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a usage error
            code = exc.code
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        what = (program, [a[:40] for a in argv][:8], captured.err[:300])
        assert code not in (0, None), what
        assert len(lines) == 1 and lines[0].startswith(program) and ": error: " in lines[0], what
        assert "unexpected" not in lines[0] and "Traceback" not in captured.err, what
        assert "[Errno" not in lines[0], what  # an OSError is named by its file, not its number


def test_the_issues_inputs_say_what_to_give(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The probe's list, each with the line it gets now."""
    text = str(files["text"])
    expected = {
        ("calmd", "complete", "-n", "100", "git"): "argument -n: 100 is out of range: give 0 to 32",
        ("calmd", "complete", "x" * 5000): "TEXT is longer than 4096 bytes",
        (
            "calm",
            "replay",
            "--positions",
            "-3",
            text,
        ): "argument --positions: -3 is out of range: give 1 to 100000",
        ("calm", "replay", "--typing", "-1", text): "argument --typing: -1 is out of range: give 0 to 100000",
        ("calm", "dataset", "--view", "--count", "-1"): "argument --count/-c: -1 is out of range",
        ("calm", "init"): "give the new file with -o FILE",
    }
    for (program, *argv), message in expected.items():
        with pytest.raises(SystemExit) if "argument" in message else _no_raise():
            (calm_main if program == "calm" else calmd_main)(argv)
        assert message in capsys.readouterr().err


class _no_raise:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_enable_twice_says_it_was_on_and_evaluate_falls_back_to_the_packaged_model(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALM_HOME", str(files["root"] / "fresh"))
    assert calm_main(["disable"]) == 0
    assert calm_main(["enable"]) == 0
    assert "removed" in capsys.readouterr().out
    assert calm_main(["enable"]) == 0
    second = capsys.readouterr().out
    assert "on already" in second and "removed" not in second
    # no weights of the user's: `calm evaluate` uses the packaged model, as `calm generate` does
    assert calm_main(["evaluate", "-d", str(files["ctds"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(paths.packaged_weights())


def test_serve_on_a_folder_as_socket_is_one_line_in_the_log(tmp_path: Path) -> None:
    folder = tmp_path / "sockdir"
    folder.mkdir(mode=0o700)
    out = subprocess.run([str(BIN / "calmd"), "serve", "--socket", str(folder), "--no-import"],
                         env=daemon_env(tmp_path), capture_output=True, text=True,
                         timeout=HANG_S)  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode == 3 and "Traceback" not in log, log
    assert f"{folder} is a folder: refusing to replace it; give the socket's own path with --socket" in log
    assert folder.is_dir()


@pytest.mark.slow  # seconds of CPU: the whole suite runs it, not the quick loop
def test_the_recipe_in_a_fresh_clone_without_shared_data(tmp_path: Path) -> None:
    clone = tmp_path / "calmd"  # the package as this checkout has it, with no ../shared beside it
    shutil.copytree(REPO / "calmd", clone / "calmd", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (clone.parent / "shared").exists()
    env = {**os.environ, "PYTHONPATH": str(clone)}
    out = subprocess.run([sys.executable, "-m", "calmd.training.recipe", "--work", str(tmp_path / "w")],
                         cwd=clone, env=env, capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("python -m calmd.training.recipe: error: ")
    assert "not the shared data folder" in line and "--data" in line


def _fake_systemctl(folder: Path) -> Path:
    folder.mkdir()
    tool = folder / "systemctl"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return folder


def test_install_systemd_says_what_to_do_without_a_user_bus(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    tools = _fake_systemctl(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    env |= {"XDG_RUNTIME_DIR": str(run), "PATH": f"{tools}:{BIN}:/usr/bin:/bin"}
    units = tmp_path / "units"
    argv = [str(BIN / "calmd"), "install-systemd", "--dir", str(units)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 1 and "enable with" not in out.stdout  # no success reported
    (line,) = out.stderr.splitlines()
    assert f"no systemd user manager answers at {run / 'bus'}" in line and "calmd serve" in line
    assert (units / paths.SYSTEMD_SERVICE_UNIT).is_file()  # written all the same, for when there is one
    bus = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a user manager's bus appears
    bus.bind(str(run / "bus"))
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=HANG_S)
    finally:
        bus.close()
    assert (
        out.returncode == 0 and f"systemctl --user enable --now {paths.SYSTEMD_SOCKET_UNIT}" in out.stdout
    ), out.stderr
    no_systemd = subprocess.run(argv, env={**env, "PATH": f"{BIN}:/nonexistent"}, capture_output=True,
                                text=True, timeout=HANG_S)  # fmt: skip
    assert no_systemd.returncode == 1 and "systemctl is not installed" in no_systemd.stderr
    assert shutil.which("calmd", path=str(BIN))


def test_config_flags_are_the_dataclass_fields_with_their_defaults() -> None:
    """One flag per field: `calmd serve` and `calm dataset` read their defaults from the frozen
    dataclass that travels with what they configure, so `--help` and the code cannot disagree."""
    import dataclasses

    from calmd.arguments import config_from
    from calmd.cli import DATASET_FLAGS, SERVE_FLAGS, calm_parser, calmd_parser
    from calmd.daemon.config import ServerConfig
    from calmd.training.options import DatasetOptions

    serve = calmd_parser().parse_args(["serve"])
    given = {"socket_path": Path("s"), "data_dir": Path("d"), "weights_path": Path("w")}
    assert config_from(ServerConfig, serve, SERVE_FLAGS, **given) == ServerConfig(**given)
    serve = calmd_parser().parse_args(["serve", "--train-threshold", "7", "--graceful-timeout", "2.5"])
    config = config_from(ServerConfig, serve, SERVE_FLAGS, **given)
    assert (config.train_threshold, config.graceful_timeout) == (7, 2.5)
    dataset = calm_parser().parse_args(["dataset", "--max-dup", "9", "--include-failed"])
    options = config_from(DatasetOptions, dataset, DATASET_FLAGS)
    assert options == dataclasses.replace(DatasetOptions(), max_dup=9, include_failed=True)
    assert set(DATASET_FLAGS) == {f.name for f in dataclasses.fields(DatasetOptions)}
    help_text = calm_parser()._subparsers._group_actions[0].choices["dataset"].format_help()  # type: ignore[union-attr]
    assert f"(default {DatasetOptions().max_dup})" in help_text


# --------------------------------------------------------------------------- issue 30


def _number_flags() -> list[tuple[str, list[str], str]]:
    """(program, the subcommand and the positionals it needs, flag) of every whole-number flag of
    every subcommand: found in the parsers, so that a flag added later is walked too."""
    import argparse

    from calmd.cli import calm_parser, calmd_parser

    positionals = {"tokenize": ["x"], "detokenize": ["1"], "inspect": ["f"], "import": ["f"], "replay": ["f"],
                   "forget": ["x"], "complete": ["x"], "init": [], "search": []}  # fmt: skip
    found = []
    for program, parser in (("calm", calm_parser()), ("calmd", calmd_parser())):
        for action in parser._actions:
            if action.option_strings and action.type is not None and getattr(action.type, "__name__", "") in (
                "whole number", "int"
            ):  # fmt: skip
                found.append((program, [], action.option_strings[0]))
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    for option in sub._actions:
                        kind = getattr(option.type, "__name__", "")
                        if option.option_strings and (option.type is int or kind == "whole number"):
                            found.append(
                                (program, [name, *positionals.get(name, [])], option.option_strings[0])
                            )
    return found


def test_every_whole_number_flag_refuses_a_number_past_64_bits(capsys: pytest.CaptureFixture[str]) -> None:
    """`calm history --limit 2**70` (and --exit, calm stats) ended in "unexpected OverflowError":
    every whole-number flag of every command is walked with a number past 64 bits."""
    walked = _number_flags()
    assert {("calm", "--limit"), ("calm", "--exit"), ("calm", "--top"), ("calmd", "-n")} <= {
        (program, flag) for program, _, flag in walked
    }
    for program, argv, flag in walked:
        main = calm_main if program == "calm" else calmd_main
        with pytest.raises(SystemExit) as stopped:
            main([*argv, flag, HUGE])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and len(err.strip().splitlines()) == 1, (program, argv, flag, err)
        assert f"argument {flag}" in err and "unexpected" not in err, err


def test_a_store_of_a_newer_schema_is_one_line_for_every_command_that_takes_db(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`calm import F --db` of a store a newer calmd wrote said "unexpected RuntimeError"."""
    import sqlite3

    from calmd.history.store import HistoryStore

    monkeypatch.setenv("CALM_HOME", str(files["root"] / "newer-home"))
    db = files["root"] / "newer.sqlite3"
    HistoryStore(db).close()
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    for argv in (["import", str(files["text"])], ["forget", "x"], ["forget", "x", "--dry-run"],
                 ["dataset", "-o", str(files["root"] / "n.ctds")], ["history"], ["stats"]):  # fmt: skip
        assert calm_main([*argv, "--db", str(db)]) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert (
            line.startswith("calm: error: ") and f"{db}: history schema 99 is newer than this calmd" in line
        )
        assert "unexpected" not in line


# What another program (or a hand) may leave under calm's names: a view in a table's place, a table
# lacking a column calm writes, an index of calm's name on another table.
NOT_CALMS = {
    "meta-a-view": (
        "ALTER TABLE meta RENAME TO kept; CREATE VIEW meta AS SELECT * FROM kept",
        "meta is a view",
    ),
    "commands-a-view": (
        "ALTER TABLE commands RENAME TO kept; CREATE VIEW commands AS SELECT * FROM kept",
        "views may not be indexed",
    ),
    "meta-lacks-value": (
        "DROP TABLE meta; CREATE TABLE meta (key TEXT PRIMARY KEY)",
        "no such column: value",
    ),
    "index-elsewhere": (
        "DROP INDEX commands_ts; CREATE TABLE other (ts REAL); CREATE INDEX commands_ts ON other (ts)",
        "commands_ts is an index of other, not of commands",
    ),
}


@pytest.mark.parametrize("form", NOT_CALMS)
def test_a_store_whose_tables_are_not_calms_is_one_line_for_every_command_that_takes_db(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """`calm import F --db` of a store whose `meta` is a view said "unexpected OperationalError:
    cannot modify meta because it is a view" (issue 39); each command that writes the store now says
    in one line that the file is not a calmd store, and changes nothing; `calm history` and `calm
    stats` read it as it is, or say so in one line."""
    import sqlite3

    from calmd.history.store import HistoryStore

    monkeypatch.setenv("CALM_HOME", str(files["root"] / f"{form}-home"))
    db = files["root"] / f"{form}.sqlite3"
    HistoryStore(db).close()
    script, why = NOT_CALMS[form]
    with sqlite3.connect(db) as raw:
        raw.executescript(script)
    before = db.read_bytes()
    for argv in (["import", str(files["text"])], ["forget", "x"], ["forget", "x", "--dry-run"],
                 ["dataset", "-o", str(files["root"] / "n.ctds")]):  # fmt: skip
        assert calm_main([*argv, "--db", str(db)]) == 1, argv
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"calm: error: {db}: not a calmd history store (") and why in line, line
        assert "unexpected" not in line
    assert db.read_bytes() == before
    for argv in (["history"], ["stats"]):
        code = calm_main([*argv, "--db", str(db)])
        err = capsys.readouterr().err.strip().splitlines()
        assert (code, err) == (0, []) or (code == 1 and len(err) == 1 and str(db) in err[0]), (
            argv,
            code,
            err,
        )
        assert "unexpected" not in "".join(err)


def _nested(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_json_in_the_users_files_is_one_line(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`calm rollback` with a deeply nested ranker.prev.json said "unexpected RecursionError"."""
    from calmd import paths as calm_paths
    from calmd.suggest.ranker import read_user_ranker, serving_ranker
    from calmd.training.background import read_status

    home = files["root"] / "nested"
    home.mkdir()
    weights = home / calm_paths.WEIGHTS
    ranker = calm_paths.ranker_path(weights)
    calm_paths.prev_ranker_path(ranker).write_text(_nested())
    assert calm_main(["rollback", "--weights", str(weights)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert calm_paths.PREV_RANKER in line and "nested" in line and "unexpected" not in line
    ranker.write_text(_nested())
    with pytest.raises(Exception, match="nested") as refused:
        read_user_ranker(ranker)
    assert not isinstance(refused.value, RecursionError)
    assert serving_ranker(ranker)[1] is not None  # the daemon: the packaged ranker serves, and says why
    (home / paths.TRAINING_STATUS).write_text(_nested())
    assert read_status(home) == {}  # `calmd status`: no run known


BAD_UTF8 = b"caf\xe9 \xff\xfe"  # Latin-1 and bytes no encoding has: as a shell passes them


def _bytes_cases(f: dict[str, Path], db: Path) -> list[list[bytes]]:
    """argv (bytes, as execve passes them) with undecodable bytes in every text argument."""
    b = BAD_UTF8
    root = bytes(f["root"])
    text, ds, m, out = bytes(f["text"]), bytes(f["ctds"]), bytes(f["model"]), root + b"/bytes-out"
    bad_path = root + b"/" + b
    d = bytes(db)
    calm = [
        [b"tokenize", b],
        [b"tokenize", b"--frame", b, b"x"],
        [b"detokenize", b],
        [b"inspect", bad_path],
        [b"import", bad_path],
        [b"import", text, b"--db", bad_path + b".sqlite3"],
        [b"import", text, b"--format", b],
        [b"dataset", b"--from", bad_path, b"-o", out + b".ctds"],
        [b"dataset", b"--from", text, b"-o", bad_path],
        [b"dataset", b"--from", text, b"-o", out + b"2.ctds", b"--template", b],
        [b"dataset", b"--view", b"--ds", b],
        [b"dataset", b"--db", bad_path, b"-o", out + b"3.ctds"],
        [b"init", b"-o", bad_path + b".cwgt"],
        [b"init", b"--size", b, b"-o", out + b".cwgt"],
        [b"evaluate", b"-m", bad_path, b"-d", ds],
        [b"train", b"-m", bad_path, b"-d", ds, b"-o", out + b"t.cwgt", b"-q"],
        [b"train", b"-m", b"new", b"-d", ds, b"-o", out + b"u.cwgt", b"--device", b, b"-q"],
        [b"generate", b"-m", m, b"--input", b, b"-n", b"1", b"--max-tokens", b"4"],
        [
            b"generate",
            b"-m",
            m,
            b"--input",
            b"ls",
            b"--cwd",
            b,
            b"--git",
            b,
            b"--env",
            b,
            b"--history",
            b,
            b"-n",
            b"1",
            b"--max-tokens",
            b"4",
        ],
        [b"rollback", b"--weights", bad_path],
        [b"search", b],
        [b"search", b"--session", b, b"--cwd", b, b"x"],
        [b"replay", bad_path],
        [b"replay", text, b"--weight", b],
        [b"replay", text, b"-m", bad_path],
        [b"forget", b, b"--db", d, b"--dry-run"],
        [b"forget", b"-E", b, b"--db", d + b".forget"],
        [b"forget", b, b"--db", bad_path],
    ]
    for command in (b"history", b"stats"):
        calm += [
            [command, b, b"--db", d],
            [command, b"-E", b, b"--db", d],
            [command, b"--session", b, b"--db", d],
            [command, b"--cwd", b, b"--db", d],
            [command, b"--since", b, b"--db", d],
            [command, b"--until", b, b"--db", d],
            [command, b"--db", bad_path],
        ]
    calmd = [
        [b"complete", b],
        [b"complete", b"x", b"--cwd", b, b"--git", b, b"--session", b, b"--history", b],
        [b"--socket", bad_path, b"status"],
        [b"--socket", bad_path, b"stop"],
        [b"init", b],
        [b"install-systemd", b"--dir", bad_path],
        [b"shell-helper", b"--session", b, b"--shell", b],
    ]
    return [[bytes(BIN / "calm"), *argv] for argv in calm] + [[bytes(BIN / "calmd"), *argv] for argv in calmd]


@pytest.mark.slow  # ~70 processes
def test_undecodable_bytes_in_every_text_argument(files: dict[str, Path]) -> None:
    """A query or --session holding bytes that are not UTF-8 ended in "unexpected ...": every text
    argument of every command gets such bytes, through execve as a shell passes them. Each command
    either does its work (a path of Latin-1 bytes is a path) or says what is wrong in one line."""
    from concurrent.futures import ThreadPoolExecutor

    from calmd.history.store import HistoryStore

    db = files["root"] / "bytes.sqlite3"
    store = HistoryStore(db)
    store.record("caf\udce9 \udcff\udcfe", exit=1, cwd="/tmp", session="s")  # kept with U+FFFD
    store.record("ls", exit=0, cwd="/tmp", session="s")
    store.close()
    shutil.copy(db, str(db) + ".forget")  # what `calm forget` deletes from
    (files["root"] / "bytes-home").mkdir()
    env = {k: v for k, v in daemon_env(files["root"] / "bytes-home").items() if k != "CALM_DEBUG"}

    def run(argv: list[bytes]) -> tuple[list[bytes], subprocess.CompletedProcess[bytes]]:
        return argv, subprocess.run(argv, env=env, capture_output=True, stdin=subprocess.DEVNULL, timeout=300)

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(run, _bytes_cases(files, db)))
    wrong = []
    for argv, out in outcomes:
        err = out.stderr.decode("utf-8", "backslashreplace")
        lines = [line for line in err.splitlines() if line.strip()]
        # 3: no daemon (calmd complete, calm search without a terminal)
        one_line = out.returncode in (0, 3) or (len(lines) == 1 and ": error: " in lines[0])
        if "Traceback" in err or "unexpected" in err or not one_line:
            wrong.append(([a[:40] for a in argv[1:]], out.returncode, err[-300:]))
    assert not wrong, "\n".join(map(str, wrong))
    by_argv = {tuple(argv[1:]): out for argv, out in outcomes}
    found = by_argv[(b"history", BAD_UTF8, b"--db", bytes(db))]
    assert found.returncode == 0 and "caf\ufffd" in found.stdout.decode(), found  # as the store keeps it
    forgot = by_argv[(b"forget", b"-E", BAD_UTF8, b"--db", bytes(db) + b".forget")]
    assert forgot.returncode == 0 and b"forgot 1 command" in forgot.stdout, forgot
