"""The installed `calm` and `calmd` commands, run as a user runs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calmd import paths
from calmd.formats.ctds import CtdsReader
from calmd.formats.cwgt import CwgtHeader, Metadata, write_cwgt
from calmd.formats.tokenizer import DEFAULT_SHELL_TEMPLATE, build_sequence
from calmd.shell.client import CalmClient
from tests.support.daemon import daemon_env, running_daemon

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def run(
    *argv: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    proc = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, env=full_env)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_tokenize_and_detokenize() -> None:
    assert run("calm", "tokenize", "git commit -m fix").stdout.split()[:6] == [
        "103",
        "105",
        "116",
        "32",
        "99",
        "111",
    ]
    assert run("calm", "tokenize", "--frame", "CWD", "/home/user").stdout.split() == [
        "260",
        *map(str, b"/home/user"),
        "269",
    ]
    assert run("calm", "tokenize", "--json", "hi").stdout.strip() == "[104, 105]"
    assert run("calm", "detokenize", "257", "104", "105", "269").stdout == "hi"


def test_detokenize_bad_ids_say_why() -> None:
    proc = run("calm", "detokenize", "104", "300", check=False)
    assert proc.returncode == 1
    assert "token id 300 at position 1 is reserved" in proc.stderr
    proc = run("calm", "detokenize", "abc", check=False)
    assert proc.returncode == 1 and "'abc' is not a token id" in proc.stderr


SOURCE = """\
<CWD>/home/user/lilush
<GIT>main
<HIST>git diff --stat<EXIT>0
<CMD>git commit -m "fix tokenizer"

<CWD>/var/log
<CMD>files_matching log kat -m
"""


def test_dataset_from_text_then_view(tmp_path: Path) -> None:
    src = tmp_path / "train.txt"
    src.write_text(SOURCE)
    out = tmp_path / "train.ctds"
    proc = run("calm", "dataset", "--from", str(src), "--output", str(out))
    assert f"wrote 2 sequences to {out}" in proc.stdout
    ds = CtdsReader(out)
    assert ds.count() == 2
    ctx = {"cwd": "/var/log", "input": "files_matching log kat -m"}
    expected = build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, training=True)
    assert ds.sequence(1).tolist() == expected.tolist()
    view = run("calm", "dataset", "--view", "--ds", str(out), "--index", "2", "--count", "1").stdout
    assert "#2" in view and "#1 " not in view
    assert "<CWD>/var/log<END>" in view and "<CMD>files_matching log kat -m<EOS>" in view
    assert "ATN at 11, 27 supervised" in view


def test_dataset_view_is_coloured_on_request(tmp_path: Path) -> None:
    src = tmp_path / "t.txt"
    src.write_text(SOURCE)
    out = tmp_path / "t.ctds"
    run("calm", "dataset", "-q", "--from", str(src), "-o", str(out))
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    proc = subprocess.run(
        [str(BIN / "calm"), "dataset", "--view", "--ds", str(out)],
        capture_output=True, text=True, env={**env, "FORCE_COLOR": "1", "TERM": "xterm-256color"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" in proc.stdout  # ANSI styles present
    assert re.search(r"\x1b\[[0-9;]*4[0-9;]*m", proc.stdout)  # underlined (supervised) tokens


def test_dataset_errors_name_file_and_line_and_keep_old_output(tmp_path: Path) -> None:
    src = tmp_path / "bad.txt"
    src.write_text("<CWD>/x\n<CMD>ok\n\n<CWD>/y\n<BOGUS>z\n<CMD>no\n")
    out = tmp_path / "old.ctds"
    out.write_bytes(b"previous contents")
    proc = run("calm", "dataset", "--from", str(src), "--output", str(out), check=False)
    assert proc.returncode == 1
    assert f"{src}: line 5: unknown frame <BOGUS>" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert out.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "old.ctds"]


def test_dataset_skips_and_counts_commands_longer_than_l_max(tmp_path: Path) -> None:
    src = tmp_path / "long.txt"
    src.write_text("<CMD>short\n\n<CMD>" + "x" * 100 + "\n")
    out = tmp_path / "o.ctds"
    proc = run("calm", "dataset", "--from", str(src), "-o", str(out), "--l-max", "50")
    assert "wrote 1 sequences" in proc.stdout and "skipped 1" in proc.stdout
    assert CtdsReader(out).count() == 1


def test_dataset_default_output_uses_calm_home(tmp_path: Path) -> None:
    src = tmp_path / "t.txt"
    src.write_text(SOURCE)
    home = tmp_path / "home"
    run("calm", "dataset", "-q", "--from", str(src), env={"CALM_HOME": str(home)})
    assert CtdsReader(home / "train.ctds").count() == 2


def test_dataset_without_from_needs_a_history_store(tmp_path: Path) -> None:
    proc = run("calm", "dataset", env={"CALM_HOME": str(tmp_path)}, check=False)
    assert proc.returncode == 1 and "no history store yet" in proc.stderr
    assert not (tmp_path / "train.ctds").exists()


def test_inspect(tmp_path: Path) -> None:
    header = CwgtHeader(d_model=64, n_layers=2, ffn_expand=0, expand=2, d_state=16, d_conv=4, dt_rank=4,
                        param_count=0, def_temperature=700, def_candidates=5)  # fmt: skip
    path = write_cwgt(tmp_path / "m.cwgt", header, np.zeros(1000, np.float32), Metadata())
    out = run("calm", "inspect", str(path), "--check").stdout
    for needle in ("d_model", "64", "1,000", "shell", "| ; && ||", "BOS;CWD:cwd", "0.7", "all values finite",
                   "4,000"):  # fmt: skip
        assert needle in out, needle
    doc = run("calm", "inspect", "--json", str(path)).stdout
    assert '"param_count": 1000' in doc and '"domain": "shell"' in doc


def test_inspect_rejects_corrupt_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cwgt"
    bad.write_bytes(b"CWGT\x04\x00" + bytes(42))
    proc = run("calm", "inspect", str(bad), check=False)
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == f"calm: error: {bad}: arch_version: arch_version 4 is older than 5 and not supported"
    )


def test_readme_calmd_serve_runs_the_packaged_default_model(tmp_path: Path) -> None:
    """A fresh user (no weights, no history): `calmd serve` loads the model shipped in the
    package and suggests from the first keystroke; `calmd stop` ends it."""
    assert paths.packaged_weights().exists(), "build it with: python -m calmd.training.recipe"
    env = daemon_env(tmp_path)
    with running_daemon(tmp_path, engine="model", weights=False) as daemon:
        with CalmClient(daemon.socket) as c:
            status = c.status()["status"]
            assert status["model"]["path"] == str(paths.packaged_weights())
            assert status["serving_fallback"] is True and status["last_reload_error"] is None  # no file yet
            got = [m["candidate"] for m in c.complete("git ", n=3, session="s") if "candidate" in m]
            assert len(got) == 3 and all(g.startswith("git ") and len(g) > 4 for g in got), got
        assert run("calmd", "stop", env=env).returncode == 0
        assert daemon.wait() == 0
    assert run("calmd", "status", env=env, check=False).returncode == 3


@pytest.mark.parametrize("script", ["calm", "calmd"])
def test_help_and_version(script: str) -> None:
    assert run(script, "--help").stdout.startswith(f"usage: {script}")
    assert run(script, "--version").stdout.strip() == f"{script} 0.1.0"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    test_cmd = re.search(r"```sh\n(.*pytest.*)\n```", readme)
    assert test_cmd, "README must show the test command in a sh block"
    assert test_cmd.group(1) in ci
    install = re.search(r"```sh\n(python3 -m venv \.venv .*?)\n", readme)  # "To work on it": CI's
    assert install, "README must show the contributor's install command"
    assert install.group(1) in ci


def test_import_history_files(tmp_path: Path) -> None:
    bash = tmp_path / ".bash_history"
    bash.write_text("ls\ngit status\nmysql -u root -phunter2\n")
    zsh = tmp_path / ".zsh_history"
    zsh.write_text(": 1700000000:0;make\n")
    home = tmp_path / "home"
    out = run("calm", "import", str(bash), str(zsh), env={"CALM_HOME": str(home)}).stdout
    assert f"{bash}: 2 commands imported (bash format), 1 dropped as credentials" in out
    assert f"{zsh}: 1 command imported (zsh format)" in out
    assert f"history: 3 commands in {home / paths.HISTORY}" in out
    missing = run("calm", "import", str(tmp_path / "nope"), env={"CALM_HOME": str(home)}, check=False)
    assert missing.returncode == 1 and "No such file" in missing.stderr


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """`calm tokenize ... | head`: no traceback, no error text, exit 141 as a shell tool would."""
    proc = subprocess.run(
        f"{BIN / 'calm'} tokenize {'a' * 100_000} | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", capture_output=True, text=True,
    )  # fmt: skip
    assert proc.stdout.strip() == "141"
    assert proc.stderr == ""
