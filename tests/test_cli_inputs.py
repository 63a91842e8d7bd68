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
from tests.daemon import BIN, daemon_env

REPO = Path(__file__).resolve().parent.parent
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
                         env=daemon_env(tmp_path), capture_output=True, text=True, timeout=120)  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode == 3 and "Traceback" not in log, log
    assert f"{folder} is a folder: refusing to replace it; give the socket's own path with --socket" in log
    assert folder.is_dir()


def test_the_recipe_in_a_fresh_clone_without_shared_data(tmp_path: Path) -> None:
    clone = tmp_path / "calmd"  # the package as this checkout has it, with no ../shared beside it
    shutil.copytree(REPO / "calmd", clone / "calmd", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (clone.parent / "shared").exists()
    env = {**os.environ, "PYTHONPATH": str(clone)}
    out = subprocess.run([sys.executable, "-m", "calmd.training.recipe", "--work", str(tmp_path / "w")],
                         cwd=clone, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
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
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "enable with" not in out.stdout  # no success reported
    (line,) = out.stderr.splitlines()
    assert f"no systemd user manager answers at {run / 'bus'}" in line and "calmd serve" in line
    assert (units / "calmd.service").is_file()  # written all the same, for when there is one
    bus = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a user manager's bus appears
    bus.bind(str(run / "bus"))
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    finally:
        bus.close()
    assert out.returncode == 0 and "systemctl --user enable --now calmd.socket" in out.stdout, out.stderr
    no_systemd = subprocess.run(argv, env={**env, "PATH": f"{BIN}:/nonexistent"}, capture_output=True,
                                text=True, timeout=60)  # fmt: skip
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
