"""Nothing that drives a terminal leaves the daemon in a candidate (issue 23).

A recorded command is kept as the user ran it, escapes and all; what is sent back never holds a C0
or C1 control character: the model cannot write one (its bytes are masked), the engine drops the
history's and the beams' lines that hold one, and the server checks every candidate it sends,
whatever the engine proposed. A multi-line entry keeps its newlines only for a client that draws
it as lines (`multiline`, zsh). `calmd complete` prints candidates escaped."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from calmd.model.checkpoint import load_model
from calmd.model.generate import Generator, SamplingOptions
from calmd.shell.client import CalmClient
from calmd.suggest.filters import continued_lines, terminal_safe
from calmd.visible import visible
from tests.support.daemon import BIN, Daemon, daemon_env, running_daemon
from tests.support.tiny_model import CONTEXT, save_tiny, train_tiny
from tests.support.tmux import history_rows
from tests.support.waiting import HANG_S

# The escapes a hostile history (or a model that learned one) could send to a terminal.
HOSTILE = {
    "osc-title": "printf '\x1b]0;PWNED\x07'",  # sets the window title
    "osc-52-clipboard": "printf '\x1b]52;c;cm0gLXJmIH4K\x07'",  # writes the clipboard
    "csi-clear": "echo \x1b[2J\x1b[H",  # clears the screen
    "cr-overwrite": "ls\r rm -rf ~",  # CR: what is drawn after hides what came before
    "c1-csi": "echo \u009b2J",  # U+009B, a one-character CSI
    "bel": "echo ding\x07",
    "nul": "cat a\x00b",
    "newline": "touch a\nrm -rf /tmp/victim",
}
MULTILINE = 'for f in *.log; do\n  gzip "$f"\ndone'


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_hostile_escape_is_unsafe_and_printed_escaped(name: str) -> None:
    text = HOSTILE[name]
    assert not terminal_safe(text)
    shown = visible(text)
    assert terminal_safe(shown)  # nothing raw left
    assert shown != text


def test_what_is_safe_and_how_it_is_printed() -> None:
    assert terminal_safe("git commit -m 'fix: ü and ✓'")
    assert visible("printf 'a\\tb'") == "printf 'a\\tb'"  # no control: printed as it is
    assert visible("printf '\x1b]0;x\x07'") == "printf '\\e]0;x\\x07'"
    assert visible("a\\b\nc") == "a\\\\b\\nc"  # with an escape in it, backslashes are doubled
    assert visible("echo \u009b2J \ud800") == "echo \\u009b2J \\ud800"
    # a multi-line entry: newlines that continue one command, between lines that are not blank
    assert terminal_safe(MULTILINE, multiline=True)
    assert not terminal_safe(MULTILINE)
    assert not terminal_safe(HOSTILE["newline"], multiline=True)  # two commands, one hidden
    assert not terminal_safe("ls\n", multiline=True)
    assert not terminal_safe("ls\n\nrm x", multiline=True)
    assert not terminal_safe("ls\r\nrm x", multiline=True)
    assert not terminal_safe("echo \x1b[2J\nls", multiline=True)


@pytest.mark.parametrize(
    ("text", "one_command"),
    [
        (MULTILINE, True),
        ("if true\nthen echo x\nfi", True),
        ("while read l\ndo echo $l\ndone", True),
        ("case $x in\n  a) echo a;;\nesac", True),
        ("f() {\n  echo hi\n}", True),
        ('echo "first\nsecond"', True),  # inside quotes
        ("cat <<EOF\nhello\nEOF", True),  # a here-document
        ("ls |\n  grep x", True),
        ("make \\\n  -j4", True),
        ("touch a\nrm -rf /tmp/victim", False),  # two commands
        ("echo for\nrm -rf ~", False),  # `for` as an argument opens nothing
        ("for x in a; do echo; done\nrm -rf y", False),  # a second command after the loop
        ("cat <<EOF\nhi\nEOF\nrm -rf z", False),  # ... after the here-document
        ("ls\n\nrm x", False),  # a blank line
    ],
)
def test_which_multi_line_entries_are_one_command(text: str, one_command: bool) -> None:
    assert continued_lines(text) is one_command
    assert terminal_safe(text, multiline=True) is one_command


# --------------------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model that learned the hostile commands (and one harmless one) after CONTEXT."""
    commands = [HOSTILE["osc-title"], HOSTILE["c1-csi"], HOSTILE["newline"], "echo fine"]
    return save_tiny(tmp_path_factory.mktemp("hostile") / "hostile.cwgt", train_tiny(commands, steps=300))


def test_the_model_cannot_write_a_control_character(hostile_model: Path) -> None:
    gen = Generator(load_model(hostile_model))
    for command in (HOSTILE["osc-title"], HOSTILE["c1-csi"], HOSTILE["newline"]):
        # it learned them (one in four lines, P ~ 0.25): without the mask the beams would write them
        assert gen.score({**CONTEXT, "input": ""}, command) > -2.5, command
    for typed in ("", "printf ", "echo ", "touch ", "touch a"):
        found = [c.text for c in gen.candidates({**CONTEXT, "input": typed}, 8)]
        assert found, typed
        assert all(terminal_safe(text) for text in found), (typed, found)
        hot = SamplingOptions(temperature=1.5)
        sampled = gen.sample({**CONTEXT, "input": typed}, 16, seed=1, options=hot)
        sampled += gen.sample({**CONTEXT, "input": typed}, 16, seed=2, raw=True)
        assert all(terminal_safe(c.text) for c in sampled), (typed, [c.text for c in sampled])
    assert "echo fine" in [c.text for c in gen.candidates({**CONTEXT, "input": "echo "}, 8)]


# --------------------------------------------------------------------------- the daemon


def _answer(client: CalmClient, typed: str, *, multiline: bool = False) -> tuple[list[str], list[Any]]:
    """(candidates, early proposals) of one `complete`, sent as the shells send it."""
    rid = client.send("complete", n=8, session="s", ctx={"input": typed}, early=True,
                      **({"multiline": True} if multiline else {}))  # fmt: skip
    found, early = [], []
    for message in client.replies(rid):
        if "candidate" in message:
            found.append(message["candidate"])
        if "early" in message:
            early.append(message["early"])
    return found, early


def test_the_server_sends_no_control_character_whatever_the_engine_proposes(home: Path) -> None:
    """The scripted engine proposes every recorded command that extends the input, control
    characters and all (and as the early proposal): the server's last gate holds them back."""
    with running_daemon(home) as daemon, CalmClient(daemon.socket) as client:
        for cmd in [*HOSTILE.values(), MULTILINE]:
            assert client.record(cmd, exit=0, session="other")["stored"], cmd  # kept as typed
        for typed in ("printf '", "echo ", "ls", "cat a", "touch a", "for f"):
            found, early = _answer(client, typed)
            assert found and all(terminal_safe(c) for c in found + early), (typed, found, early)
            assert not (set(found) | set(early)) & set(HOSTILE.values())
        found, early = _answer(client, "for f", multiline=True)  # zsh: the loop, drawn as lines
        assert early == [MULTILINE] and found[0] == MULTILINE
        found, early = _answer(client, "touch a", multiline=True)
        assert HOSTILE["newline"] not in found + early  # a newline that starts a second command
        found, early = _answer(client, "ls", multiline=True)
        assert HOSTILE["cr-overwrite"] not in found + early  # a CR never
        withheld = client.status()["status"]["withheld_candidates"]
        assert withheld >= 14
    stored = {row.cmd for row in history_rows(home)}
    # recording keeps what the user ran (a NUL is the one byte SQLite cannot keep as text)
    assert {*HOSTILE.values(), MULTILINE} - {HOSTILE["nul"]} <= stored
    assert "cat a\ufffdb" in stored


def test_calmd_complete_prints_control_characters_escaped(home: Path) -> None:
    with running_daemon(home) as daemon, CalmClient(daemon.socket) as client:
        client.record(MULTILINE, exit=0, session="other")
        client.record(HOSTILE["osc-title"], exit=0, session="other")
        for typed in ("for f", "printf '"):
            out = subprocess.run(
                [str(BIN / "calmd"), "complete", typed], env=daemon_env(home),
                capture_output=True, timeout=HANG_S, check=True,
            )  # fmt: skip
            text = out.stdout.decode()
            assert terminal_safe(text.replace("\n", "")), text
            lines = text.splitlines()
            assert all(line.startswith(typed) for line in lines), lines
            if typed == "for f":
                assert lines[0] == 'for f in *.log; do\\n  gzip "$f"\\ndone'  # the loop, escaped


@pytest.mark.slow
def test_the_real_model_offers_back_no_control_character(home: Path) -> None:
    """The packaged model and the real engine: hostile records, then the prefixes the probe typed.
    The escapes are the user's commands in the history and the model may carry them over to
    another command (`echo ` got the title escape): no candidate holds one."""
    with running_daemon(home, engine="model", weights=False, args=("--no-import",)) as daemon:
        with CalmClient(daemon.socket) as client:
            for _ in range(3):
                for cmd in [*HOSTILE.values(), MULTILINE]:
                    client.record(cmd, exit=0, session="s")
            for typed in ("", "printf ", "echo ", "touch ", "ls", "cat "):
                found, early = _answer(client, typed)
                assert all(terminal_safe(c) for c in found + early), (typed, found, early)
            for typed in ("touch ", "for"):
                found, early = _answer(client, typed, multiline=True)
                assert all(terminal_safe(c, multiline=True) for c in found + early), (typed, found)
            assert MULTILINE in found  # the user's own loop, for zsh
            status: dict[str, Any] = client.status()["status"]
            # the real engine proposed none: its own checks (the model's masks, the pool, the
            # judge, a bash client's ranking without multi-line entries) left the gate nothing
            assert status["withheld_candidates"] == 0
        _assert_daemon_alive(daemon)


def _assert_daemon_alive(daemon: Daemon) -> None:
    assert daemon.proc.poll() is None, daemon.read_output()


def test_a_64_kib_command_is_stored_but_never_suggested(home: Path) -> None:
    """The record limit is 64 KiB: such a command is kept as it was run, but a suggestion holds at
    most what a shell can send back as its input (4 KiB): ghost text of 64 KiB would fill the
    terminal, and bash would insert it whole."""
    huge = "echo " + "y" * (60 << 10)
    with running_daemon(home) as daemon, CalmClient(daemon.socket) as client:
        assert client.record(huge, exit=0, session="other")["stored"]
        assert client.record("echo yes", exit=0, session="other")["stored"]
        found, early = _answer(client, "echo y", multiline=True)
        assert huge not in found + early and "echo yes" in found
        assert all(len(c.encode()) <= 4096 for c in found + early)
        assert client.status()["status"]["withheld_candidates"] >= 1
    assert huge in {row.cmd for row in history_rows(home)}
