"""The fish hook (client/calm.fish) in a real interactive fish inside tmux, against a real daemon
(the scripted engine of tests/support/scripted_engine.py: history prefix matches first, then `input +
suffix` candidates: mmit, mmand, nfig, py, unt).

fish records through its events (fish_preexec, fish_postexec), inserts and cycles candidates with
Shift-Tab (tmux `BTab`) as bash does, opens `calm search` on Ctrl-R, and keeps its own
autosuggestion. Its helper reads request files and answers through a FIFO (calmd/shell/spool.py)."""

from __future__ import annotations

import re
import stat
import subprocess
import time
from pathlib import Path

import pytest

from calmd.shell.client import CalmClient
from tests.support.daemon import BIN, Daemon, daemon_env, running_daemon, wait_imported
from tests.support.tmux import (
    ELSEWHERE,
    Terminal,
    assert_quiet,
    calm_cli,
    fish_terminal,
    history_rows,
    record,
    wait_recorded,
)
from tests.support.tools import need
from tests.support.waiting import HANG_S, wait_until

pytestmark = [pytest.mark.needs("fish", "tmux", "timeout"), pytest.mark.slow]  # a real fish in tmux


def test_commands_are_recorded_with_status_folder_branch_and_duration(home: Path, daemon: Daemon) -> None:
    need("git")
    sub = home / "proj"
    sub.mkdir()
    subprocess.run(["git", "-c", "init.defaultBranch=feature", "init", "-q", str(sub)], check=True)
    with fish_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("sleep 0.3")
        term.send("Enter")
        term.type("false")
        term.send("Enter")
        term.type("cd proj")
        term.send("Enter")
        term.type("echo in-proj")
        term.send("Enter")
        term.type("echo one")
        term.send("M-Enter")  # a second line of the same command
        term.type("echo two")
        term.send("Enter")
        term.wait_for("^one\ntwo")
        term.type(" echo not-kept")
        term.send("Enter")
        term.type("echo last")
        term.send("Enter")
        wait_recorded(home, "echo last")
        rows = {r.cmd: r for r in history_rows(home)}
        assert rows["sleep 0.3"].exit == 0 and 0.3 <= rows["sleep 0.3"].duration < 5  # type: ignore[operator]
        assert rows["false"].exit == 1
        assert (rows["cd proj"].cwd, rows["cd proj"].git) == (str(home), "")  # typed in home
        assert (rows["echo in-proj"].cwd, rows["echo in-proj"].git) == (str(sub), "feature")
        assert "echo one\necho two" in rows and not any("not-kept" in cmd for cmd in rows)
        assert rows["echo last"].session.startswith("fish-") and abs(rows["echo last"].ts - time.time()) < 30
        assert_quiet(term.screen())


def test_shift_tab_inserts_then_cycles_and_comes_back(home: Path, daemon: Daemon) -> None:
    record(daemon, "git status")
    with fish_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("true")  # the helper runs once this is recorded
        term.send("Enter")
        wait_recorded(home, "true")
        term.type("git st")
        term.send("BTab")
        term.wait_line(r"^PROMPT> git status\s*$")
        term.send("C-u")
        term.type("xyz")
        for text in ["xyzmmit", "xyzmmand", "xyznfig", "xyzpy", "xyzunt", "xyz", "xyzmmit"]:
            term.send("BTab")
            term.wait_line(rf"^PROMPT> {text}\s*$")
        term.send("Enter")
        wait_recorded(home, "xyzmmit")


def test_shift_tab_on_an_empty_line_offers_the_next_command(home: Path, daemon: Daemon) -> None:
    with fish_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("true")
        term.send("Enter")
        wait_recorded(home, "true")
        term.send("BTab")
        term.wait_line(r"^PROMPT> after true\s*$")


def test_ctrl_r_opens_calm_search(home: Path, daemon: Daemon) -> None:
    with CalmClient(daemon.socket) as c:
        c.record("echo found-by-calm", exit=0, cwd=str(home), session=ELSEWHERE)
        c.record("make check", exit=0, cwd=str(home), session=ELSEWHERE)
    with fish_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("found")
        term.send("C-r")
        term.wait_for(r"^ calm search · all.*\n> found")
        term.send("Enter")  # runs it
        term.wait_for(r"^found-by-calm\nPROMPT>")
        assert wait_recorded(home, "echo found-by-calm").session.startswith("fish-")
        term.type("che")
        term.send("C-r")
        term.wait_for(r"^> che")
        term.send("Tab")  # to edit
        term.wait_line(r"^PROMPT> make check")
        term.send("C-u")
        term.type("ma")
        term.send("C-r")
        term.wait_for(r"^> ma")
        term.send("Escape")  # the prompt as it was (fish may draw its own suggestion after it)
        term.wait_line(r"^PROMPT> ma")
        term.type("n ls")
        term.wait_line(r"^PROMPT> man ls")


def test_without_a_daemon_nothing_blocks_and_ctrl_r_is_fishs_own(home: Path, daemon: Daemon) -> None:
    with fish_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("echo from-fish-history")
        term.send("Enter")
        wait_recorded(home, "echo from-fish-history")
        daemon.proc.terminate()
        daemon.wait()
        term.type("git st")
        started = time.monotonic()
        term.send("BTab")  # asks the helper, which has no daemon: the line stays, at once
        term.type("atus")
        term.wait_line(r"^PROMPT> git status")
        assert time.monotonic() - started < 3
        term.send("C-u")
        term.send("C-r")
        term.wait_for(r"^search:")  # fish's history pager
        term.type("from")
        term.wait_for(r"► echo from-fish-history")
        term.send("Enter")
        term.wait_line(r"^PROMPT> echo from-fish-history")
        assert "calm search" not in term.screen()


def test_fishs_own_autosuggestion_is_left_alone(home: Path, daemon: Daemon) -> None:
    with fish_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("echo fish-suggests-this")
        term.send("Enter")
        term.wait_for("^fish-suggests-this")
        term.type("echo fish-su")
        term.wait_line(r"^PROMPT> echo fish-suggests-this")  # fish's grey text, drawn by fish
        term.send("C-e")  # fish's accept
        term.send("Enter")
        term.wait_for("fish-suggests-this\n.*\n.*fish-suggests-this\nPROMPT>")


def test_the_helper_goes_with_fish_and_calm_disable_is_honoured(home: Path, daemon: Daemon) -> None:
    record(daemon, "git status")
    with fish_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("true")
        term.send("Enter")
        wait_recorded(home, "true")
        folder = spool_of(term)
        assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700
        calm_cli(home, "disable")
        term.type("git st")
        term.send("BTab")
        term.keys_handled()
        assert term.line().rstrip() == "PROMPT> git st"  # off: nothing inserted
        calm_cli(home, "enable")
        term.send("BTab")
        term.wait_line(r"^PROMPT> git status\s*$")
        term.send("C-u")
        term.type("exit")
        term.send("Enter")
        wait_until(lambda: not folder.exists(), "the helper to go with fish")


def spool_of(term: Terminal) -> Path:
    """The folder of the helper that serves the fish in `term` (its `--spool`)."""
    pid = term.tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip()
    ps = ["ps", "-ww", "-o", "args=", "--ppid", pid]
    out = subprocess.run(ps, capture_output=True, text=True, timeout=HANG_S).stdout
    found = re.search(r"--spool (\S+)", out)
    assert found, out
    return Path(found.group(1))


def test_fish_history_is_imported_once_and_never_what_was_paused(home: Path) -> None:
    """Issue 39, as it was found: on a fresh home, the daemon started, then in fish `echo one; set
    CALM_RECORD 0; echo paused; set CALM_RECORD 1; echo two` (a command a prompt), and the daemon
    restarted: its first import of fish's own history (which holds every line) stored each command
    a second time and brought `echo paused` back. Now each is there once, and nothing of the paused
    lines; nor after more commands and a `calm import` of the same file."""
    fish_data = home / "fish-data"
    env = {"XDG_DATA_HOME": str(fish_data)}  # the daemon finds fish's history where fish writes it
    fish_history = fish_data / "fish" / "fish_history"
    typed = ["echo one", "set CALM_RECORD 0", "echo paused", "set CALM_RECORD 1", "echo two"]
    with fish_terminal(home, fish_history="fish") as term:  # fish's own default history file
        with running_daemon(home, env=env) as first, CalmClient(first.socket) as client:
            # its first start's check for files to import over (fish has written none yet), before
            # anything is typed: on a busy machine it ran after fish wrote `echo one`, read the
            # file whole, and the restart below had nothing left to import (nor to say so)
            wait_imported(client)
            term.wait_for("^PROMPT>")
            for line in typed:
                term.type(line)
                term.send("Enter")
                term.wait_for(rf"^PROMPT> {re.escape(line)}\n(.*\n)?PROMPT>\s*$")
            wait_recorded(home, "echo two")  # the pauses were sent before it, in order
        assert fish_history.is_file() and b"echo paused" in fish_history.read_bytes()
        with running_daemon(home, env=env) as daemon, CalmClient(daemon.socket) as client:
            wait_imported(client)
            logged = daemon.wait_for("recorded already by the shell's hook")  # its log, piped
            assert "3 recorded already by the shell's hook" in logged
            assert "2 typed while recording was paused" in logged
            assert _commands(home) == ["echo one", "set CALM_RECORD 1", "echo two"]
            # more commands, one of them paused, then `calm import` of fish's history by hand
            for line in ["echo three", "set CALM_RECORD 0", "echo paused-again", "set CALM_RECORD 1"]:
                term.type(line)
                term.send("Enter")
                term.wait_for(rf"^PROMPT> {re.escape(line)}\n(.*\n)?PROMPT>\s*$")
            expected = ["echo one", "set CALM_RECORD 1", "echo two", "echo three", "set CALM_RECORD 1"]
            wait_until(lambda: _commands(home) == expected, "the second `set CALM_RECORD 1` recorded",
                       report=lambda: str(_commands(home)))  # fmt: skip
            assert wait_recorded(home, "echo three").source == "shell"
            calm_import = [str(BIN / "calm"), "import", str(fish_history)]
            out = subprocess.run(calm_import, env=daemon_env(home, **env), capture_output=True, text=True,
                                 timeout=HANG_S)  # fmt: skip
            assert out.returncode == 0 and "0 commands imported (fish format)" in out.stdout, out
    assert _commands(home) == expected
    raw = b"".join(p.read_bytes() for p in (home / "data").glob("history.sqlite3*"))
    assert b"paused" not in raw and b"CALM_RECORD 0" not in raw


def _commands(home: Path) -> list[str]:
    """`calm history --commands`, as the user reads it."""
    out = subprocess.run([str(BIN / "calm"), "history", "--commands"], env=daemon_env(home),
                         capture_output=True, text=True, check=True, timeout=HANG_S)  # fmt: skip
    return out.stdout.splitlines()
