"""calm search's terminal UI (calmd/shell/search_ui.py) without a terminal: keys, editing, what a
line looks like, and never blocking when no daemon answers. In a real terminal, through the
shells' Ctrl-R: test_shell_search.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calmd.shell import search_ui
from calmd.shell.search_screen import ago, clip, clip_left, highlight_spans
from calmd.shell.search_ui import State, parse_keys, visible
from tests.support.tmux import shell_env
from tests.support.waiting import HANG_S


def test_keys_from_the_terminal() -> None:
    keys = [("insert", "g"), ("insert", "i"), ("up", ""), ("down", ""), ("run", "")]
    assert list(parse_keys("gi\x1b[A\x1bOB\r")) == keys
    assert list(parse_keys("\t\x7f\x17\x15\x12\x04\x03\x07")) == [
        ("edit", ""), ("backspace", ""), ("kill-word", ""), ("kill-line", ""), ("mode", ""), ("forget", ""),
        ("cancel", ""), ("cancel", "")]  # fmt: skip
    assert list(parse_keys("\x1b[5~\x1b[6~\x1b[3~\x1b[H\x1bOF")) == [
        ("pageup", ""), ("pagedown", ""), ("delete-char", ""), ("home", ""), ("end", "")]  # fmt: skip
    # unknown sequences (F5, Ctrl-Right, Alt-x) are skipped whole: nothing of them is typed
    assert list(parse_keys("\x1b[15~\x1b[1;5Cx\x1bxé")) == [("insert", "x"), ("insert", "é")]
    assert list(parse_keys("\x1b")) == [("cancel", "")]  # a lone Esc
    assert search_ui._incomplete("ab\x1b[1;") and not search_ui._incomplete("ab\x1b[A")


def test_editing_the_query() -> None:
    state = State("git pu")
    assert state.cursor == 6
    assert state.edit("insert", "s") and state.query == "git pus"
    assert not state.edit("home") and state.cursor == 0
    assert state.edit("delete-char") and state.query == "it pus"
    assert not state.edit("end") and state.edit("kill-word") and state.query == "it " and state.cursor == 3
    assert state.edit("backspace") and state.query == "it"
    assert not state.edit("left") and state.edit("kill-line") and state.query == "t" and state.cursor == 0
    assert not state.edit("backspace") and not state.edit("up")
    state.results = [{"cmd": f"c{i}"} for i in range(10)]
    state.move(3, rows=4)
    state.move(3, rows=4)
    assert (state.selected, state.top) == (6, 3) and state.chosen() == "c6"
    state.move(-100, rows=4)
    assert (state.selected, state.top) == (0, 0)
    modes = []
    for _ in range(5):
        state.next_mode()
        modes.append(state.mode)
    assert modes == ["host", "folder", "session", "success", "global"]


def test_what_a_line_shows() -> None:
    now = 1_000_000_000.0
    seconds = (0.2, 42, 300, 3 * 3600, 2 * 86400, 20 * 86400, 90 * 86400, 800 * 86400)
    assert [ago(now - s, now) for s in seconds] == ["now", "42s", "5m", "3h", "2d", "2w", "3mo", "2y"]
    # nothing from the history reaches the terminal as a control character
    assert visible("echo one\necho\ttwo\x1b[31m\x9b") == "echo one\\necho\\ttwo\\e[31m\\u009b"
    assert clip("git push origin main", 10) == "git push …" and clip("short", 10) == "short"
    assert clip("漢字漢字漢字", 7) == "漢字漢…"  # wide characters take two cells
    assert clip_left("/home/u/src/some/deep/folder", 12) == "…deep/folder"
    assert highlight_spans("git push Origin", "origin PU zz") == [(9, 15), (4, 6)]


def test_without_a_daemon_it_gives_the_key_back_at_once(tmp_path: Path) -> None:
    """Exit 3 before touching the terminal: the hook opens the shell's own search. With no
    socket at all, and with a socket whose daemon never answers."""
    argv = [sys.executable, "-m", "calmd.shell.search_ui", "--socket", str(tmp_path / "none.sock"), "git"]
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S, env=shell_env(tmp_path))
    assert (out.returncode, out.stdout) == (3, "")
    assert time.monotonic() - started < 5  # a Python start, nothing more
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(tmp_path / "mute.sock"))
    mute.listen(1)  # accepts, never answers
    try:
        argv[4] = str(tmp_path / "mute.sock")
        started = time.monotonic()
        out = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S, env=shell_env(tmp_path))
        assert (out.returncode, out.stdout) == (3, "")
        assert time.monotonic() - started < search_ui.FIRST_ANSWER_S + 4
    finally:
        mute.close()


def test_it_starts_lean(tmp_path: Path) -> None:
    """The shell waits for it: no numpy, no rich, no torch, no calmd.cli."""
    code = ("import sys, calmd.shell.search_ui; "
            "print(sorted(m for m in ('numpy', 'rich', 'torch', 'calmd.cli', 'calmd.history.store') "
            "if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("mode", ["", "nonsense"])
def test_a_bad_calm_search_mode_falls_back_to_global(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALM_SEARCH_MODE", mode)
    args = search_ui.parser().parse_args([])
    args.socket = os.devnull  # no daemon there
    assert search_ui.cmd_search(args) == search_ui.UNAVAILABLE and args.mode == "global"


class _Daemon:
    """What the UI's Search talks to: `send` gives request ids, `read_available` the replies queued."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, str, dict[str, object]]] = []
        self.replies: list[dict[str, object]] = []

    def send(self, op: str, **fields: object) -> int:
        self.sent.append((len(self.sent) + 1, op, fields))
        return len(self.sent)

    def read_available(self) -> list[dict[str, object]]:
        replies, self.replies = self.replies, []
        return replies


def test_a_query_too_long_for_the_daemon_clears_the_lines_so_enter_runs_nothing() -> None:
    """Typing past 1,024 bytes showed the daemon's error and kept the previous query's lines:
    Enter then ran one of them."""
    daemon = _Daemon()
    search = search_ui.Search(daemon, "s", "/tmp", 20)
    state = State("git")
    state.results, state.matches = [{"cmd": "git push --force"}], 1
    state.query = "g" * 1025
    search.ask(state)
    assert not daemon.sent and state.results == [] and state.matches == 0  # not even asked
    assert "longer than 1,024 bytes" in state.status
    assert search_ui.handle("run", "", state, search, 20) is None  # Enter: nothing to run
    # the daemon's own error (a query it refuses) clears them too
    state = State("git")
    state.results = [{"cmd": "git push --force"}]
    search.ask(state)
    rid = daemon.sent[-1][0]
    daemon.replies = [
        {"id": rid, "error": {"code": "bad_field", "message": "'query' is longer than 1024 bytes"}}
    ]
    assert search.take(state) and state.results == [] and "calmd: 'query'" in state.status
    assert search_ui.handle("run", "", state, search, 20) is None


def test_enter_on_a_line_the_reply_cut_runs_it_whole() -> None:
    whole = "printf '%s' " + "x" * 5000
    cut = {"cmd": whole[:2048], "cut": len(whole), "row": 42, "ts": 0, "cwd": "/tmp", "exit": 0}
    daemon = _Daemon()
    search = search_ui.Search(daemon, "s", "/tmp", 20)
    for key, expected in (("run", "run"), ("edit", "edit")):
        state = State("printf")
        state.results = [cut]
        assert search_ui.handle(key, "", state, search, 20) is None  # not the cut text: the whole first
        rid, op, fields = daemon.sent[-1]
        assert op == "search" and fields["row"] == 42 and "reading the whole line" in state.status
        daemon.replies = [{"id": rid, "results": [{"cmd": whole}], "matches": 1}]
        search.take(state)
        assert state.outcome == (search_ui.CHOSEN, f"{expected}\n{whole}")
    state = State("printf")  # Ctrl-D: the y/n is about the whole line, which `forget` deletes
    state.results = [cut]
    search_ui.handle("forget", "", state, search, 20)
    daemon.replies = [{"id": daemon.sent[-1][0], "results": [{"cmd": whole}], "matches": 1}]
    search.take(state)
    assert state.confirm == whole and state.outcome is None and "y/n" in state.status
    # an answer that is not that line (an older daemon ignores `row`; the line was deleted): refused
    state = State("printf")
    state.results = [cut]
    search_ui.handle("run", "", state, search, 20)
    daemon.replies = [{"id": daemon.sent[-1][0], "results": [{"cmd": "ls"}], "matches": 1}]
    search.take(state)
    assert state.outcome is None and "could not be read" in state.status
