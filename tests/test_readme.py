"""The README's tools run as written (issue 23: `calm init -o my.cwgt` then `calm train --model new
-o my.cwgt` was refused): every line of its "The tools" block, top to bottom, in a folder with a
train.txt and a ~/.zsh_history, against a real `calmd serve`, in a real bash (so `~` and the
quotes are the shell's). A line with `[--opt]` runs without and with each option; a comment
that shows output (`# 103 105 ...`) is checked against what the line prints."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from tests.daemon import BIN, daemon_env
from tests.tools import need

REPO = Path(__file__).resolve().parent.parent
TRAIN_TXT = "".join(
    f"<CWD>/home/user/proj\n<HIST>{prev}<EXIT>0\n<CMD>{cmd}\n\n"
    for prev, cmd in [("git add .", "git commit -m fix"), ("git status", "git add ."), ("ls", "git status"),
                      ("make", "make test"), ("cd proj", "ls -la"), ("git commit -m fix", "git push")] * 4
)  # fmt: skip


def tools_block() -> list[tuple[str, str]]:
    """(command, comment) of each line of the README's "The tools" sh block."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## The tools", 1)[1]
    block = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert block, "README: no sh block under 'The tools'"
    lines = []
    for line in block.group(1).splitlines():
        command, _, comment = line.partition("  #")
        lines.append((command.strip(), comment.strip()))
    return lines


def variants(command: str) -> list[str]:
    """`calm inspect my.cwgt [--json] [--check]` -> without the options, then with each."""
    options = re.findall(r"\s*\[([^\]]+)\]", command)
    bare = re.sub(r"\s*\[[^\]]+\]", "", command)
    return [bare] + [f"{bare} {option}" for option in options]


def expected(comment: str) -> tuple[str, str] | None:
    """What a comment says the output starts and ends with: `103 105 ... 269`, `/home (...)`."""
    shown = re.match(r"((?:\d+ )+\d+|/\S+)(?: \.\.\.( \d+)?)?", comment)
    if not shown:
        return None
    return shown.group(1), (shown.group(2) or "").strip()


@pytest.mark.slow
def test_the_readme_tools_run_as_written(tmp_path: Path) -> None:
    need("bash")
    lines = tools_block()
    assert lines[0][0] == "calmd serve" and lines[-1][0] == "calmd stop"
    (tmp_path / "train.txt").write_text(TRAIN_TXT)
    history = ["git status", "mysql -u me -phunter2 shop", "git commit -m x"]
    (tmp_path / ".zsh_history").write_text("".join(f": 170000000{i}:0;{c}\n" for i, c in enumerate(history)))
    fish = tmp_path / ".local" / "share" / "fish"
    fish.mkdir(parents=True)
    entries = (f"- cmd: {c}\n  when: 170000001{i}\n" for i, c in enumerate(history))
    (fish / "fish_history").write_text("".join(entries))
    env = {**daemon_env(tmp_path), "PATH": f"{BIN}:/usr/bin:/bin", "NO_COLOR": "1"}
    serve = subprocess.Popen(shlex.split(lines[0][0]), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert serve.stdout is not None
        for out in serve.stdout:
            if "calmd ready on" in out:
                break
        else:
            raise AssertionError("calmd serve did not start")
        for command, comment in lines[1:]:
            for variant in variants(command):
                run = subprocess.run(["bash", "-c", variant], cwd=tmp_path, env=env, capture_output=True,
                                     text=True, timeout=600)  # fmt: skip
                assert run.returncode == 0, (variant, run.stdout[-500:], run.stderr[-500:])
                assert "Traceback" not in run.stderr and "error" not in run.stderr, (variant, run.stderr)
                shown = expected(comment)
                if shown is not None and variant == command:
                    start, end = shown
                    assert run.stdout.strip().startswith(start), (variant, run.stdout)
                    assert run.stdout.strip().endswith(end), (variant, run.stdout)
        assert serve.wait(timeout=30) == 0  # `calmd stop`, the block's last line, stopped it
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=30)
        if serve.stdout is not None:
            serve.stdout.close()
    assert (tmp_path / "my.cwgt").is_file() and (tmp_path / "loss.png").is_file()
    assert not (tmp_path / "data" / "shell.cwgt").exists()  # `calm init` never wrote the served weights
