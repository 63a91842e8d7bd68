"""The README's tools run as written (issue 23: `calm init -o my.cwgt` then `calm train --model new
-o my.cwgt` was refused): every line of its "The tools" block, top to bottom, in a folder with a
train.txt and a ~/.zsh_history, against a real `calmd serve`, in a real bash (so `~` and the
quotes are the shell's). A line with `[--opt]` runs without and with each option; a comment
that shows output (`# 103 105 ...`) is checked against what the line prints."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from calmd import paths
from tests.support.daemon import BIN, daemon_env
from tests.support.tools import need
from tests.support.waiting import HANG_S

REPO = Path(__file__).resolve().parent.parent
TRAIN_TXT = "".join(
    f"<CWD>/home/user/proj\n<HIST>{prev}<EXIT>0\n<CMD>{cmd}\n\n"
    for prev, cmd in [("git add .", "git commit -m fix"), ("git status", "git add ."), ("ls", "git status"),
                      ("make", "make test"), ("cd proj", "ls -la"), ("git commit -m fix", "git push")] * 4
)  # fmt: skip


def sh_block(heading: str, language: str = "sh", *, under: str = "") -> list[tuple[str, str]]:
    """(command, comment) of each line of the first code block under the README's `heading` (and
    its sub-heading `under`, a `### ` line, when given)."""
    readme = (REPO / "README.md").read_text()
    section = readme.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    if under:
        assert f"\n### {under}\n" in section, f"README: no {under!r} under {heading!r}"
        section = section.split(f"\n### {under}\n", 1)[1].split("\n### ", 1)[0]
    block = re.search(rf"```{language}\n(.*?)\n```", section, re.S)
    assert block, f"README: no {language} block under {heading!r} {under!r}"
    lines = []
    for line in block.group(1).splitlines():
        command, _, comment = line.partition("  #")
        lines.append((command.strip(), comment.strip()))
    return lines


def tools_block() -> list[tuple[str, str]]:
    """(command, comment) of each line of the README's "The tools" sh block."""
    return sh_block("The tools")


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
        assert serve.wait(timeout=HANG_S) == 0  # `calmd stop`, the block's last line, stopped it
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=HANG_S)
        if serve.stdout is not None:
            serve.stdout.close()
    assert (tmp_path / "my.cwgt").is_file() and (tmp_path / "loss.png").is_file()
    assert not (tmp_path / "data" / paths.WEIGHTS).exists()  # `calm init` never wrote the served weights


# --------------------------------------------------------------------------- figures


def test_the_readmes_figures_are_the_files(tmp_path: Path) -> None:
    """Sizes and feature counts the README gives for the packaged files are what the files hold
    (issue 30: a "27-feature" ranker had 29, "a few kB" were 25.9 kB): each size to the precision
    the README writes it in."""
    readme = " ".join((REPO / "README.md").read_text().split())
    data = paths.PACKAGE_DATA

    def stated(pattern: str) -> str:
        found = re.search(pattern, readme)
        assert found, f"README no longer says {pattern!r}: say it again, or change this test"
        return found.group(1)

    def same_size(figure: str, size: float) -> None:
        decimals = len(figure.partition(".")[2])
        assert float(figure) == round(size, decimals), (figure, size)

    ranker = json.loads((data / paths.PACKAGED_RANKER).read_text())
    search = json.loads((data / paths.PACKAGED_SEARCH_RANKER).read_text())
    same_size(
        stated(r"`calmd/data/ranker\.json`, ([\d.]+) kB"),
        (data / paths.PACKAGED_RANKER).stat().st_size / 1000,
    )
    assert int(stated(r"the weights of a (\d+)-feature scorer")) == len(ranker["features"])
    same_size(
        stated(r"`calmd/data/search_ranker\.json`, ([\d.]+) kB"),
        (data / paths.PACKAGED_SEARCH_RANKER).stat().st_size / 1000,
    )
    assert int(stated(r"search_ranker\.json`, [\d.]+ kB, (\d+) features")) == len(search["features"])
    same_size(
        stated(r"`calmd/data/default\.cwgt`, nano, about ([\d.]+) MB"),
        (data / paths.PACKAGED_MODEL).stat().st_size / 1e6,
    )
    model_card = (data / "DEFAULT_MODEL.md").read_text()
    steps = stated(r"one epoch of its corpus, (\d+) steps")
    assert f"Training: {steps} steps" in model_card
    minutes = re.search(r"in ([\d.]+) minutes", model_card)
    assert minutes and int(stated(r"steps: about (\d+) minutes")) == round(float(minutes.group(1)))


# --------------------------------------------------------------------------- a new user's first hour


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment: their HOME, the default data and cache dirs (no CALM_*, no other
    XDG_*), and a runtime dir of their own (a daemon's socket there is this test's alone)."""
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TERM", "USER", "LOGNAME")}
    run = home / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    return {**keep, "HOME": str(home), "PATH": f"{home}/.local/bin:/usr/bin:/bin", "TERM": "xterm-256color",
            "XDG_RUNTIME_DIR": str(run), **extra}  # fmt: skip


def install(home: Path) -> Path:
    """The README's contributor install ("To work on it") in a clone at ~/calmd, as written, but its
    first line (the venv and pip: the venv is this one, linked in as the clone's .venv)."""
    lines = [command for command, _ in sh_block("Set up", under="To work on it")]
    assert lines[0].startswith("python3 -m venv .venv") and len(lines) == 2, lines
    clone = home / "calmd"
    clone.mkdir()
    (clone / ".venv").symlink_to(BIN.parent)
    for command in lines[1:]:
        run = subprocess.run(["bash", "-c", command], cwd=clone, env=user_env(home), capture_output=True,
                             text=True, timeout=HANG_S)  # fmt: skip
        assert run.returncode == 0, (command, run.stderr)
    return clone


def user_install(home: Path) -> Path:
    """The README's install "To use it", from a copy of this checkout at ~/calmd: the venv made by
    its line as written, with the user's python3; pip's `install -c constraints.txt .` done as the
    same non-editable install of this checkout's wheel, without downloading its dependencies (the
    new venv borrows them from this one through a .pth); the links as written. What it proves is
    what a non-editable install brings (the packaged model, hooks and units come with the wheel),
    not pip's resolution, which is the contributor's install's too. Returns the venv."""
    lines = [command for command, _ in sh_block("Set up", under="To use it")]
    assert len(lines) == 2, lines
    make_venv, pip_line = lines[0].split(" && ")
    assert pip_line == "~/.local/lib/calmd/bin/pip install -c constraints.txt .", "README changed: test it"
    clone = home / "calmd"
    skip = shutil.ignore_patterns(
        ".*", "__pycache__", "*.egg-info", "build", "dist", "bench", "docs", "tests"
    )
    shutil.copytree(REPO, clone, symlinks=True, ignore=skip)
    env = user_env(home)
    made = subprocess.run(["bash", "-c", make_venv], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert made.returncode == 0, (make_venv, made.stderr)
    venv = home / ".local" / "lib" / "calmd"
    theirs = subprocess.run([venv / "bin" / "python", "-c", "import sys; print(sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if theirs != str(sys.version_info[:2]):
        pytest.skip(
            f"python3 is {theirs}, this venv's {sys.version_info[:2]}: its packages cannot be borrowed"
        )
    wheels = clone / "dist"  # in the folder installed from, which the README's user deletes
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(clone)], check=True, capture_output=True, timeout=300)  # fmt: skip
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = wheels.glob("calmd-*.whl")
    subprocess.run([venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=env,
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    linked = subprocess.run(["bash", "-c", lines[1]], cwd=clone, env=env, capture_output=True, text=True)
    assert linked.returncode == 0, (lines[1], linked.stderr)
    return venv


@pytest.mark.slow
def test_the_users_install_serves_from_the_package(tmp_path: Path) -> None:
    """After the install "To use it", the commands on the PATH are the venv's, and what they need
    comes from the installed package, not from the folder it was installed from (deleted here):
    `calmd init zsh` writes the hook, `calmd install-systemd` the units running the venv's calmd,
    `calm inspect` reads the packaged model."""
    need("bash")
    venv = user_install(tmp_path)
    shutil.rmtree(tmp_path / "calmd")  # "The folder you installed from is not used afterwards."
    env = user_env(tmp_path)
    units = tmp_path / "units"

    def sh(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=HANG_S)  # fmt: skip

    where = sh("command -v calm calmd")
    assert where.stdout.split() == [str(tmp_path / ".local/bin/calm"), str(tmp_path / ".local/bin/calmd")]
    assert sh("calm --version").stdout.strip().startswith("calm ")
    hook = sh("calmd init zsh")
    assert hook.returncode == 0 and f"{venv}/bin/python" in hook.stdout, hook.stderr
    assert (
        tmp_path / ".local" / "share" / "calm" / paths.HOOK_FILE.format(shell="zsh")
    ).read_text() == hook.stdout
    sh(f"calmd install-systemd --dir {units}")  # exit 1 here (no user session): the units are written
    service = (units / paths.SYSTEMD_SERVICE_UNIT).read_text()
    assert (
        f"ExecStart={tmp_path}/.local/bin/calmd serve" in service
        or f"ExecStart={venv}/bin/calmd serve" in service
    )
    assert (units / paths.SYSTEMD_SOCKET_UNIT).is_file()
    inspect = sh(f"calm inspect --json {venv}/lib/python3*/site-packages/calmd/data/{paths.PACKAGED_MODEL}")
    assert inspect.returncode == 0 and json.loads(inspect.stdout), inspect.stderr


@pytest.mark.slow
def test_after_the_install_the_readmes_hook_line_finds_calmd(tmp_path: Path) -> None:
    """Issue 30: after the README's install (a venv), every new zsh said `command not found:
    calmd`. The install puts calm and calmd in ~/.local/bin; a new zsh with the README's hook
    line runs `calmd init` from there, loads the hook and leaves its file in the data dir."""
    need("zsh", "tmux")
    from tests.support.tmux import Terminal

    install(tmp_path)
    hook_line = next(command for command, _ in sh_block("In your shell") if "calmd init zsh" in command)
    zdot = tmp_path / "zdot"
    zdot.mkdir()
    (zdot / ".zshrc").write_text(f"PS1='PROMPT> '\n{hook_line}\n")
    env = user_env(tmp_path, ZDOTDIR=str(zdot))
    with Terminal(["zsh", "-d", "-i"], env, cwd=tmp_path, width=300) as term:
        term.wait_for("^PROMPT>")
        term.type(
            "print -r -- hook=$+functions[_calm_precmd] calmd=$(command -v calmd) calm=$(command -v calm)"
        )
        term.send("Enter")
        bin_dir = tmp_path / ".local" / "bin"
        term.wait_for(rf"^hook=1 calmd={re.escape(str(bin_dir))}/calmd calm={re.escape(str(bin_dir))}/calm$")
        assert "not found" not in term.screen() and "rror" not in term.screen(), term.screen()
    assert (tmp_path / ".local" / "share" / "calm" / "calm.zsh").is_file()


@pytest.mark.slow
def test_turn_it_off_as_the_readme_says(tmp_path: Path) -> None:
    """Each line of "Turn it off", typed in a real zsh with the hook and a daemon: this shell
    stops recording, suggestions go off in every shell, the daemon stops."""
    need("zsh", "tmux")
    from tests.support.daemon import running_daemon
    from tests.support.tmux import history_rows, wait_recorded, zsh_terminal

    lines = [command for command, _ in sh_block("Turn it off")]
    assert lines == ["CALM_RECORD=0", "calm disable", "calmd stop"], "README changed: test each new line"
    path = f"{BIN}:{os.environ['PATH']}"
    with running_daemon(tmp_path) as daemon, zsh_terminal(tmp_path, PATH=path) as term:
        term.wait_for("^PROMPT>")
        for line in ["echo recorded", lines[0], "echo not-recorded", "CALM_RECORD=1", "echo recorded-again"]:
            term.type(line)
            term.send("Enter")
        wait_recorded(tmp_path, "echo recorded-again")
        recorded = [row.cmd for row in history_rows(tmp_path)]
        assert "echo recorded" in recorded and "echo not-recorded" not in recorded, recorded
        term.type(lines[1])
        term.send("Enter")
        term.wait_for("suggestions disabled in every shell")
        assert (tmp_path / "data" / paths.DISABLED_FLAG).is_file()
        term.type(lines[2])
        term.send("Enter")
        assert daemon.proc.wait(timeout=HANG_S) == 0


@pytest.mark.slow
def test_remove_everything_as_the_readme_says(tmp_path: Path) -> None:
    """ "Remove everything", line by line in a real bash, answering `calm forget --all`'s question:
    after the install "To use it", a running daemon, the systemd units, a history, a model, a
    cache and `calm sync` to a folder, nothing of calm is left in the user's home but the folder
    it was installed from (which the README says to delete by hand) and the sync folder, which
    holds no share of this machine's any more; not the runtime folder, not the unit folders."""
    need("bash", "tmux")
    from tests.support.tmux import Terminal

    user_install(tmp_path)
    env = user_env(tmp_path)
    data, cache = tmp_path / ".local" / "share" / "calm", tmp_path / ".cache" / "calm"
    sync = tmp_path / "Sync" / "calm"
    (tmp_path / ".zsh_history").write_text(": 1700000000:0;git status\n")
    serve = subprocess.Popen(["bash", "-c", "exec calmd serve"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert serve.stdout is not None
        for out in serve.stdout:
            if "calmd ready on" in out:
                break
        else:
            raise AssertionError("calmd serve did not start")
        for line in ("calm import ~/.zsh_history", "calmd init zsh", "calmd install-systemd",
                     f"mkdir -p {sync} && calm sync --folder {sync} && calm sync now"):  # fmt: skip
            subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, timeout=HANG_S)
        units = tmp_path / ".config" / "systemd" / "user"
        assert (data / paths.HISTORY).is_file() and (data / paths.HOOK_FILE.format(shell="zsh")).is_file()
        assert (units / paths.SYSTEMD_SERVICE_UNIT).is_file() and (
            units / paths.SYSTEMD_SOCKET_UNIT
        ).is_file()
        assert (data / paths.SYNC_KEY).is_file() and any(sync.iterdir()), "calm sync wrote no share"
        assert (tmp_path / "run" / paths.APP / paths.SOCKET).exists()
        (data / paths.WEIGHTS).write_bytes(b"a model")
        (cache / "kernels").mkdir(parents=True)
        (cache / "kernels" / "scan.so").write_bytes(b"\0")
        lines = [command for command, _ in sh_block("Remove everything")]
        assert lines[:2] == ["calm forget --all", "calmd stop"], lines
        with Terminal(["bash", "--norc", "--noprofile", "-i"], env, cwd=tmp_path, width=300) as term:
            for n, line in enumerate(lines):
                term.type(f"{line}; echo done-{n}")
                term.send("Enter")
                if n == 0:
                    term.wait_for(r"delete all of it\? \[y/N\]\s*$")
                    term.type("y")
                    term.send("Enter")
                term.wait_for(rf"^done-{n}$")
        assert serve.wait(timeout=HANG_S) == 0  # `calmd stop` stopped it
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=HANG_S)
        if serve.stdout is not None:
            serve.stdout.close()
    assert list(sync.iterdir()) == [], "this machine's share is still in the sync folder"
    assert not (tmp_path / ".config" / "systemd").exists()
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if "calm" in p.name)
    assert [p for p in left if not p.startswith(("calmd", "Sync/calm"))] == [], left  # ~/calmd: the clone
