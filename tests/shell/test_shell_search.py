"""Ctrl-R in real zsh and bash sessions inside tmux: `calm search` opens over the whole history,
ranked by the daemon; Enter runs the line, Tab puts it on the prompt, Esc gives the prompt back,
Ctrl-R switches the filter, Ctrl-D deletes; without a daemon the key is the shell's own search.
(fish's Ctrl-R: test_shell_fish.py.)"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from calmd.shell.client import CalmClient
from tests.support.daemon import Daemon
from tests.support.tmux import (
    ELSEWHERE,
    Terminal,
    assert_quiet,
    bash_terminal,
    history_rows,
    wait_recorded,
    zsh_terminal,
)

pytestmark = [pytest.mark.needs("zsh", "bash", "tmux"), pytest.mark.slow]  # real shells in tmux

# No suggestions while these tests type: the screen holds the search and the prompt only.
QUIET = {"CALM_MIN_LENGTH": "999", "CALM_PREDICT": "0"}
SHELLS: dict[str, Callable[..., Terminal]] = {"zsh": zsh_terminal, "bash": bash_terminal}
OWN_SEARCH = {"zsh": r"bck-i-search", "bash": r"\(reverse-i-search\)"}


def fill(daemon: Daemon, home: Path) -> None:
    """A history: lines run here and elsewhere, in two sessions, one failing."""
    with CalmClient(daemon.socket) as c:
        for cmd, cwd, code, session in (
            ("git status", str(home), 0, ELSEWHERE),
            ("make deploy-staging", str(home), 2, ELSEWHERE),
            ("git push origin main", "/srv/elsewhere", 0, ELSEWHERE),
            ("echo searched-and-run", str(home), 0, ELSEWHERE),
            ("vim notes.txt", "/srv/elsewhere", 0, ELSEWHERE),
        ):
            assert c.record(cmd, exit=code, cwd=cwd, session=session, ts=time.time() - 600)["stored"]


def open_search(term: Terminal, query: str = "") -> str:
    term.send("C-r")
    return term.wait_for(r"^ calm search · all.*\n>" + (" " + re.escape(query) if query else ""))


@pytest.mark.parametrize("shell", SHELLS)
def test_enter_runs_the_chosen_line_and_the_hook_records_it(shell: str, home: Path, daemon: Daemon) -> None:
    fill(daemon, home)
    with SHELLS[shell](home, **QUIET) as term:
        term.wait_for("^PROMPT>")
        term.type("echo sea")
        screen = open_search(term, "echo sea")
        assert "echo searched-and-run" in screen and "1 match" in screen
        assert_quiet(screen.replace("calm search", ""))
        term.send("Enter")
        term.wait_for(r"^PROMPT> echo searched-and-run\nsearched-and-run\nPROMPT>")
        row = wait_recorded(home, "echo searched-and-run")
        assert row.exit == 0 and row.cwd == str(home) and row.session.startswith(f"{shell}-")


@pytest.mark.parametrize("shell", SHELLS)
def test_tab_edits_esc_restores(shell: str, home: Path, daemon: Daemon) -> None:
    fill(daemon, home)
    with SHELLS[shell](home, **QUIET) as term:
        term.wait_for("^PROMPT>")
        term.type("gpom")  # scattered letters of `git push origin main`
        screen = open_search(term, "gpom")
        assert screen.split("\n")[2].lstrip("▶ ").split()[-4:] == ["git", "push", "origin", "main"]
        term.send("Tab")
        term.wait_line(r"^PROMPT> git push origin main\s*$")
        term.type(" --dry-run")  # on the prompt, to edit: nothing ran
        term.wait_line(r"^PROMPT> git push origin main --dry-run\s*$")
        assert not [r for r in history_rows(home) if r.cmd.endswith("--dry-run")]
        term.send("C-u")
        term.type("mak")
        open_search(term, "mak")
        term.type("e")
        term.wait_for(r"^> make")
        term.send("Escape")
        term.wait_line(r"^PROMPT> mak\s*$")  # as it was, the query typed in the search forgotten
        term.type("e -v")
        term.wait_line(r"^PROMPT> make -v\s*$")  # the cursor where it was


@pytest.mark.parametrize("shell", SHELLS)
def test_each_line_says_when_where_and_whether_it_failed_and_modes_filter(
    shell: str, home: Path, daemon: Daemon
) -> None:
    fill(daemon, home)
    with SHELLS[shell](home, **QUIET) as term:
        term.wait_for("^PROMPT>")
        screen = open_search(term)
        lines = {line.split()[-1]: line for line in screen.split("\n")[2:] if "m " in line or "✗" in line}
        make = next(line for line in screen.split("\n") if "make deploy-staging" in line)
        assert "10m" in make and "~" in make and "✗2" in make
        vim = next(line for line in screen.split("\n") if "vim notes.txt" in line)
        assert "/srv/elsewhere" in vim and "✗" not in vim
        assert lines
        term.send("C-r")  # this machine: every line here was recorded on this host
        term.wait_for(r"^ calm search · this machine.*5 matches")
        term.send("C-r")  # this folder: what ran in the shell's folder only
        screen = term.wait_for(r"^ calm search · this folder")
        term.wait(lambda s: "vim notes.txt" not in s and "git status" in s, what="the folder's lines")
        term.send("C-r")  # this session: nothing ran in this new shell yet
        term.wait_for(r"^ calm search · this session.*0 matches")
        term.send("C-r")  # succeeded
        screen = term.wait_for(r"^ calm search · succeeded")
        term.wait(lambda s: "make deploy-staging" not in s and "git status" in s, what="what succeeded")
        term.send("Escape")
        term.wait_line(r"^PROMPT>\s*$")


@pytest.mark.parametrize("shell", SHELLS)
def test_ctrl_d_deletes_the_line_from_the_history(shell: str, home: Path, daemon: Daemon) -> None:
    fill(daemon, home)
    with SHELLS[shell](home, **QUIET) as term:
        term.wait_for("^PROMPT>")
        term.type("deploy")
        open_search(term, "deploy")
        term.send("C-d")
        term.wait_for(r"delete every run of `make deploy-staging` from the history for good\? y/n")
        term.type("n")  # no: nothing happens
        term.wait_for("Enter run · Tab edit")
        term.send("C-d")
        term.wait_for(r"for good\? y/n")
        term.type("y")
        term.wait_for(r"deleted 1 run from the history")
        term.wait_for(r"0 matches")
        term.send("Escape")
        term.wait_line(r"^PROMPT> deploy\s*$")
        assert "make deploy-staging" not in [r.cmd for r in history_rows(home)]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_query_too_long_clears_the_lines_and_enter_runs_nothing(
    shell: str, home: Path, daemon: Daemon
) -> None:
    """Typing past 1,024 bytes showed the daemon's error above the previous query's lines, and
    Enter ran one of them (issue 30)."""
    fill(daemon, home)
    with SHELLS[shell](home, **QUIET) as term:
        term.wait_for("^PROMPT>")
        screen = open_search(term)
        assert "echo searched-and-run" in screen
        term.type("echo sea" + "x" * 1100)
        term.wait_for(r"the query is longer than 1,024 bytes: shorten it")
        screen = term.wait_for(r"0 matches")
        assert "searched-and-run" not in screen.split("\n", 2)[2].split("the query is")[0]  # no line left
        term.send("Enter")  # nothing to run: the search stays
        time.sleep(0.5)
        assert "calm search" in term.screen() and "the query is longer" in term.screen()
        term.send("Escape")
        term.wait_line(r"^PROMPT>\s*$")
        assert not [r for r in history_rows(home) if r.session != ELSEWHERE]  # nothing ran


@pytest.mark.parametrize("shell", SHELLS)
def test_enter_on_a_line_cut_for_the_reply_runs_the_whole_line(
    shell: str, home: Path, daemon: Daemon
) -> None:
    """A line over 2 KiB comes cut in the search's reply: Enter runs it whole (issue 30)."""
    long = "echo long-line " + "y" * 3000
    with CalmClient(daemon.socket) as c:
        assert c.record(long, exit=0, cwd=str(home), session=ELSEWHERE, ts=time.time() - 60)["stored"]
        assert c.search("long-line")["results"][0]["cut"] == len(long)
    with SHELLS[shell](home, **QUIET) as term:
        term.wait_for("^PROMPT>")
        term.type("long-line")
        open_search(term, "long-line")
        term.send("Enter")
        row = wait_recorded(home, long)  # run, and recorded by the hook: the whole line
        assert row.exit == 0 and row.session.startswith(f"{shell}-")


@pytest.mark.parametrize("shell", SHELLS)
def test_without_a_daemon_ctrl_r_is_the_shells_own_search(shell: str, home: Path, daemon: Daemon) -> None:
    with SHELLS[shell](home, **QUIET) as term:
        term.wait_for("^PROMPT>")
        term.type("echo from-the-shell-history")
        term.send("Enter")
        term.wait_for("^from-the-shell-history")
        daemon.proc.terminate()
        daemon.wait()
        started = time.monotonic()
        term.send("C-r")
        term.wait_for(OWN_SEARCH[shell])
        assert time.monotonic() - started < 3
        term.type("from-the")
        term.wait_for(r"from-the-shell-history")
        term.send("Enter")
        term.wait_for(r"from-the-shell-history\n.*from-the-shell-history\nPROMPT>")  # from its own history
        assert "calm search" not in term.screen()


@pytest.mark.parametrize("shell", SHELLS)
def test_calm_search_0_leaves_ctrl_r_alone(shell: str, home: Path, daemon: Daemon) -> None:
    fill(daemon, home)
    with SHELLS[shell](home, CALM_SEARCH="0", **QUIET) as term:
        term.wait_for("^PROMPT>")
        term.send("C-r")
        term.wait_for(OWN_SEARCH[shell])
        time.sleep(0.5)
        assert "calm search" not in term.screen()


def test_zsh_falls_back_to_the_widget_ctrl_r_had_before(home: Path, daemon: Daemon) -> None:
    """A user's own Ctrl-R (fzf's, say) is what runs when no daemon answers."""
    mine = "my-search() { BUFFER='from my own widget' }; zle -N my-search; bindkey '^R' my-search"
    with zsh_terminal(home, before=mine, **QUIET) as term:
        term.wait_for("^PROMPT>")
        daemon.proc.terminate()
        daemon.wait()
        term.send("C-r")
        term.wait_line(r"^PROMPT> from my own widget\s*$")


@pytest.mark.parametrize("shell", SHELLS)
def test_calm_search_typed_at_a_prompt_ends_its_line(shell: str, home: Path, daemon: Daemon) -> None:
    """Run by hand (not from Ctrl-R), `calm search` prints `run` or `edit` and the line chosen,
    and the next prompt starts on a line of its own (it came after the line: `git status$ `)."""
    from tests.support.daemon import BIN

    fill(daemon, home)
    with SHELLS[shell](home, **QUIET) as term:
        term.wait_for("^PROMPT>")
        term.type(f"{BIN / 'calm'} search git push")
        term.send("Enter")
        term.wait_for(r"^ calm search · all.*\n> git push")
        term.send("Tab")
        term.wait_for(r"^edit\ngit push origin main\nPROMPT>")
        term.type("echo next")
        term.wait_line(r"^PROMPT> echo next\s*$")
