"""Every view that prints stored text, read in a real terminal (tmux), on a history holding each
hostile form (tests/support/builders.py HOSTILE_FORMS) in a command and in a folder (issue 30): the screen
shows the escapes, the pane's title stays, no paste buffer is made (tmux takes OSC 52 with
`set-clipboard on`), the screen is not cleared, and no byte of a form reaches the terminal.

The first test runs the forms raw (printf) under the same checks: they would see an attack. The
last reads the views of a synced history: a host's name and the sync folder's hold the forms too."""

from __future__ import annotations

import contextlib
import shlex
import sqlite3
import time
from pathlib import Path

import pytest

from calmd import paths
from calmd.history import query
from calmd.sync.config import SyncConfig, write_config
from calmd.sync.seal import new_key, write_key
from calmd.visible import json_text, visible
from tests.support.builders import HOSTILE_FORMS, HOSTILE_GROUPS, hostile_folder, hostile_rows, write_rows
from tests.support.daemon import BIN, running_daemon
from tests.support.tmux import PROMPT, Terminal, shell_env
from tests.support.waiting import HANG_S, wait_until

pytestmark = [pytest.mark.needs("bash", "tmux"), pytest.mark.slow]  # real terminals

NOW = time.time() - 3600
# What a form puts on the wire, as bytes, that no view may write (the terminal's own line ends
# aside: CR is checked on the screen, where `OVER` would be drawn over the line's start).
RAW = [b"\x1b]", b"\x1b[2J", b"\x1b[8m", b"\x07", b"\x08", b"\x7f", "\x85".encode(), "\x9b".encode(),
       "\x9c".encode(), "\x9d".encode(), "\u202e".encode(), "\u200b".encode()]  # fmt: skip


class View:
    """A bash in a fresh tmux server (clipboard escapes taken, as a user's tmux may be set), every
    byte written to the pane recorded."""

    def __init__(self, home: Path, name: str) -> None:
        self.record = home / f"{name}.out"
        self.runs = 0
        env = shell_env(home, PS1=PROMPT, COLUMNS="300")
        env["PATH"] = f"{BIN}:{env['PATH']}"  # `calm` and `calmd` as installed
        self.term = Terminal(["bash", "--norc", "--noprofile", "-i"], env, cwd=home, width=300, height=60)
        try:
            self.term.tmux("set-option", "-g", "set-clipboard", "on")
            self.term.wait_for("^PROMPT>")
            self.title = self.title_now()
            self.term.record_output(self.record)
        except BaseException:
            self.term.close()  # no tmux server left behind
            raise

    def title_now(self) -> str:
        return self.term.tmux("display-message", "-p", "-t", "t", "#{pane_title}").strip()

    def run(self, command: str, *, timeout: float = HANG_S) -> str:
        """`command` typed after a marker line; the screen once it has finished."""
        self.runs += 1
        self.term.type(f"echo MARK-BEFORE; {command}; echo MARK-AFTER")
        self.term.send("Enter")
        return self.term.wait_for(r"^MARK-AFTER\s*$", timeout=timeout)

    def assert_untouched(self, screen: str, *, own_clears: int = 0) -> None:
        """`own_clears`: the clears the program draws itself (`calm search` opens a cleared
        alternate screen)."""
        assert "MARK-BEFORE" in screen.split("MARK-AFTER")[0], f"the screen was cleared:\n{screen}"
        assert self.title_now() == self.title, "the pane's title changed"
        assert self.term.tmux("list-buffers") == "", "a paste buffer was made (OSC 52)"

        # pipe-pane's cat has written what the terminal got, up to the last run's marker line
        def copied() -> bytes | None:
            got = self.record.read_bytes()
            return got if got.count(b"\nMARK-AFTER") >= self.runs else None

        written = wait_until(copied, "pipe-pane's copy of the terminal up to MARK-AFTER")
        assert written.count(b"\x1b[2J") == own_clears, written
        assert not [raw for raw in RAW if raw in written.replace(b"\x1b[2J", b"")], written

    def close(self) -> None:
        self.term.close()


@pytest.fixture
def store(home: Path) -> Path:
    return write_rows(home / "data" / paths.HISTORY, hostile_rows(NOW))


def test_the_checks_see_the_forms_when_they_reach_the_terminal(home: Path) -> None:
    view = View(home, "raw")
    try:
        payload = "".join(HOSTILE_FORMS.values()).encode().decode("latin-1")  # printf's \ooo bytes
        octal = "".join(f"\\{ord(c):03o}" for c in payload)
        screen = view.run(f"printf {shlex.quote(octal)}; printf '\\033[0m\\n'")  # the conceal ended
        assert view.title_now() == "PWNED-TITLE"
        assert "echo pwned" in view.term.tmux("show-buffer")
        assert "MARK-BEFORE" not in screen.split("MARK-AFTER")[0]  # cleared
    finally:
        view.close()


def expected_history(home: Path) -> list[str]:
    """Each hostile row as `calm history` prints it: folder and command, escaped as one line."""
    rows = hostile_rows(NOW)
    return [
        visible(f"{query.short_path(r['cwd'], str(home))}  {r['cmd']}")
        for r in rows
        if r["cmd"][:4] == "tool"
    ]


@pytest.mark.parametrize(
    "args",
    [[], ["--commands"], ["--regex", "^tool"], ["--exit", "0"], ["--json"]],
    ids=["plain", "commands", "regex", "exit", "json"],
)
def test_calm_history_in_a_terminal(home: Path, store: Path, args: list[str]) -> None:
    view = View(home, "history")
    try:
        screen = view.run(shlex.join(["calm", "history", *args]))
        view.assert_untouched(screen)
        rows = [r for r in hostile_rows(NOW) if r["cmd"][:4] == "tool"]
        if args == ["--json"]:
            for row in rows:  # JSON's own escapes, as json.dumps writes them
                assert f'"cmd":{json_text(row["cmd"])}' in screen, json_text(row["cmd"])
        elif args == ["--commands"]:
            for row in rows:
                assert visible(row["cmd"]) in screen, visible(row["cmd"])
        else:
            for line in expected_history(home):
                assert line in screen, line
        assert "tool5\\rOVER cr" in screen  # CR drew nothing over the line's start
    finally:
        view.close()


@pytest.mark.parametrize("color", [True, False], ids=["color", "no-color"])
def test_calm_stats_in_a_terminal(home: Path, store: Path, color: bool) -> None:
    view = View(home, "stats")
    try:
        screen = view.run(("calm stats" if color else "calm --no-color stats") + " --top 40")
        view.assert_untouched(screen)
        rows = [r for r in hostile_rows(NOW) if r["cmd"][:4] == "tool"]
        for name in {query.command_and_next(r["cmd"])[0] for r in rows}:
            assert f"│ {visible(name)} " in screen, visible(name)
        for group in range(HOSTILE_GROUPS):
            assert f"│ {visible(hostile_folder(group))} " in screen
        assert "│ git " in screen and "│ git\\u200b " in screen  # two rows, told apart
        assert "HIDDEN" in screen  # after `\e[8m`, drawn
    finally:
        view.close()


def test_calm_search_calmd_status_and_errors_in_a_terminal(home: Path, store: Path) -> None:
    """The search draws each result's folder and command escaped; an import refuses a file whose
    name holds the forms and says so escaped, and `calmd status` shows that name escaped too."""
    forms = [
        HOSTILE_FORMS[name] for name in ("osc0-title", "osc52-clipboard", "csi-clear", "bidi-rlo", "c1-csi")
    ]
    refused = home / "refused" / ("evil" + "".join(forms) + "\u200b.hist")
    refused.parent.mkdir()
    refused.write_bytes(bytes(range(1, 32)) * 4)  # control bytes: not a history, refused whole
    with running_daemon(home):
        view = View(home, "search")
        try:
            view.term.type("calm search echo")
            view.term.send("Enter")
            screen = view.term.wait_for(r"^ calm search · all .*\d+ match")
            for group in range(HOSTILE_GROUPS):  # the end of each folder that fits its column
                assert visible(hostile_folder(group))[-12:] in screen, visible(hostile_folder(group))
            view.term.send("C-u")
            view.term.type("tool1")
            screen = view.term.wait_for(r"tool12\\u202eevil bidi-rlo")
            assert "tool13\\u200b zero-width" in screen
            assert screen.startswith(" calm search · all"), screen  # the header is there, not erased
            view.term.send("Escape")
            view.term.wait_for(r"^PROMPT>\s*$")
            glob = shlex.quote(str(home / "refused")) + "/*"
            screen = view.run(f"calm import {glob}; calm history --db {glob}; calmd status")
            view.assert_untouched(screen, own_clears=1)  # the search's, and none else
            shown = visible(str(refused))
            assert f"calm: error: {shown}: not a shell history" in screen
            assert f"calm: error: {shown}: not a calmd history store" in screen
            assert f"(last: {shown}: " in screen  # calmd status's import row
        finally:
            view.close()


# A synced record's host is the name another machine's segments gave (calmd/sync/), and
# the sync folder any name: both as hostile as a command. Written here as an import leaves them.
SYNC_ID = "0123456789abcdef"
REFUSED, REASON = "00000002.calm", "tampered: a chunk does not open"
HOSTILE_HOST = "".join(
    HOSTILE_FORMS[name] for name in ("osc0-title", "osc52-clipboard", "csi-clear", "bidi-rlo", "c1-csi")
)


@pytest.fixture
def synced(home: Path) -> Path:
    """A history with a record of the machine HOSTILE_HOST, sync set up on a folder whose name
    holds an OSC 0, that host seen and one of its files refused."""
    data = home / "data"
    db = write_rows(data / paths.HISTORY, [
        {"cmd": "make deploy", "cwd": "/src", "exit": 0, "ts": NOW, "host": HOSTILE_HOST, "origin": SYNC_ID,
         "origin_id": 1},
        {"cmd": "htop", "cwd": "/srv", "exit": 0, "ts": NOW + 1},
    ])  # fmt: skip
    folder = home / ("shared" + HOSTILE_FORMS["osc0-title"])
    (folder / SYNC_ID).mkdir(parents=True)
    write_config(paths.sync_config_path(data), SyncConfig(str(folder)))
    write_key(paths.sync_key_path(data), new_key())
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("INSERT INTO sync_hosts (id, name, last_seq, last_sealed, records) "
                     "VALUES (?, ?, 1, ?, 1)", (SYNC_ID, HOSTILE_HOST, NOW))  # fmt: skip
        conn.execute("INSERT INTO sync_refused (path, reason, size, mtime_ns, at) VALUES (?, ?, 0, 0, ?)",
                     (str(folder / SYNC_ID / REFUSED), REASON, NOW))  # fmt: skip
    return folder


@pytest.mark.parametrize("command", ["calm history", "calm stats", "calm sync"])
def test_a_synced_hosts_name_and_folder_in_a_terminal(home: Path, synced: Path, command: str) -> None:
    view = View(home, command.split()[1])
    try:
        screen = view.run(command)
        view.assert_untouched(screen)
        if command == "calm history":  # the host column: one text with the folder and the command
            assert visible(f"{HOSTILE_HOST}  /src  make deploy") in screen
        elif command == "calm stats":  # the machines table
            assert f"│ {visible(HOSTILE_HOST)} " in screen
        else:
            assert visible(f"folder: {synced} (both, every 30 s)") in screen
            assert visible(f"  {HOSTILE_HOST} ({SYNC_ID}): segment 1, sealed ") in screen
            assert visible(f"  {synced / SYNC_ID / REFUSED}: {REASON}") in screen
    finally:
        view.close()
