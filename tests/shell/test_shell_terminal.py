"""Hostile candidates against real zsh and bash in tmux (issue 23): nothing that drives the
terminal is drawn or inserted, whether an older or broken daemon sends it (tests/support/fake_daemon.py:
the helper's check) or a real daemon holds it in its history (the server's check). A multi-line
entry is drawn as lines by zsh, and never reaches bash's line."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon
from tests.support.fake_daemon import SURE, FakeDaemon, candidates
from tests.support.tmux import Terminal, bash_terminal, record, zsh_terminal
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow]

GHOST = re.escape("\x1b[90m")  # how tmux shows the default highlight, fg=8
# What each escape would do to the terminal were it drawn raw after `echo `.
PAYLOADS = [
    "\x1b]0;PWNED\x07",  # OSC: the window title
    "\x1b]52;c;cm0gLXJmIH4K\x07",  # OSC 52: the clipboard
    "\x1b[2J\x1b[H",  # CSI: clear the screen
    "\r rm -rf ~",  # CR: drawn over the line
    "\u009b2J",  # the one-character CSI
    "a\x00b",  # NUL
    "ding\x07",  # BEL
    "a\nrm -rf /tmp/victim",  # a second command
]


def _hostile_then_safe(request: dict[str, Any]) -> Iterator[Any]:
    typed = request["ctx"]["input"]
    if typed.startswith("echo "):
        yield {"early": "echo " + PAYLOADS[0], "confidence": SURE}
        yield from candidates(*[("echo " + p, SURE) for p in PAYLOADS], ("echo safe-line", SURE))


def _title(term: Terminal) -> str:
    return term.tmux("display-message", "-p", "-t", "t", "#{pane_title}").strip()


@pytest.mark.needs("zsh", "tmux")
def test_zsh_draws_no_escape_a_daemon_sends(home: Path) -> None:
    output = home / "terminal.out"
    with FakeDaemon.at_home(home, _hostile_then_safe) as fake, zsh_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.record_output(output)
        title = _title(term)
        term.type("echo ")
        term.wait_line(rf"^PROMPT> echo {GHOST}safe-line", escapes=True)  # the first safe one
        term.send("BTab")  # cycling reaches nothing else: every other one was dropped
        term.wait_line(rf"^PROMPT> echo {GHOST}safe-line", escapes=True)
        term.send("End", "Enter")
        term.wait_for("^safe-line$")
        assert fake.wait_requests(1)[0].get("multiline") is True  # zsh draws multi-line entries
        screen = term.screen()
        assert "^[" not in screen and "PWNED" not in screen and "rm -rf" not in screen, screen
        assert _title(term) == title
    written = output.read_bytes()  # every byte zsh wrote to the terminal, drawn or overwritten
    for sent in (b"\x1b]0;PWNED", b"\x1b]52;", "\u009b".encode(), b"rm -rf", b"ding"):
        assert sent not in written, sent


@pytest.mark.needs("zsh", "tmux")
def test_zsh_shows_a_multi_line_entry_as_lines_and_runs_it_as_typed(home: Path) -> None:
    loop = "for f in a b; do\n  echo got-$f\ndone"

    def script(request: dict[str, Any]) -> Iterator[Any]:
        if request["ctx"]["input"].startswith("for"):
            yield from candidates((loop, SURE))

    with FakeDaemon.at_home(home, script) as fake, zsh_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("for")
        term.wait_for(r"^PROMPT> for f in a b; do\n  echo got-\$f\ndone", escapes=False)
        term.send("End", "Enter")
        term.wait_for("^got-a\ngot-b\nPROMPT>")
        wait_until(lambda: loop in fake.records, "the loop recorded as run, newlines and all")


@pytest.mark.needs("bash", "tmux")
def test_bash_inserts_no_escape_and_no_second_line(home: Path) -> None:
    victim = home / "victim"
    victim.mkdir()
    two_lines = f"touch {home}/a\nrm -rf {victim}"

    def script(request: dict[str, Any]) -> Iterator[Any]:
        typed = request["ctx"]["input"]
        if typed.startswith("touch"):
            yield from candidates((two_lines, SURE), (f"touch {home}/a\x1b[2J", SURE))
        else:
            yield from _hostile_then_safe(request)

    with FakeDaemon.at_home(home, script) as fake, bash_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("touch")
        term.send("BTab", "BTab")
        term.wait_line(r"^PROMPT> touch\s*$")  # nothing to insert: both were dropped
        term.send("Enter")
        term.wait_for(r"^PROMPT> touch\s*\n.*touch: missing file operand")
        term.type("echo ")
        term.send("BTab")
        term.wait_line(r"^PROMPT> echo safe-line\s*$")
        assert all("multiline" not in r for r in fake.wait_requests(2))
    assert victim.is_dir()


@pytest.mark.needs("bash", "tmux")
def test_bash_never_gets_the_multi_line_entry_a_daemon_holds(home: Path, daemon: Daemon) -> None:
    """The real daemon (scripted engine: the history's matches first): the user's two-line entry
    is the first match for `touch `, and the server holds it back from a bash client."""
    victim = home / "victim"
    victim.mkdir()
    record(daemon, f"touch {home}/a\nrm -rf {victim}", "echo \x1b]0;PWNED\x07")
    with bash_terminal(home) as term:
        term.wait_for("^PROMPT>")
        term.type("touch ")
        # The entry was the engine's first line, to be drawn: held back, so nothing is sure enough
        # for the first press; the second brings the engine's next line. Never the entry.
        term.send("BTab", "BTab")
        term.wait_line(r"^PROMPT> touch mmit\s*$")
        term.send("C-u")
        term.type("echo ")
        term.send("BTab", "BTab")
        term.wait_line(r"^PROMPT> echo mmit\s*$")
        term.send("Enter")
        term.wait_for("^mmit$")
        assert "PWNED" not in _title(term)
    assert victim.is_dir()
