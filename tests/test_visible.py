"""The one rule for text that leaves for a terminal (calmd/visible.py, issue 30): what every view
prints of the store, of a reply, of a file name, with nothing in it that drives the terminal.

Here: the function over every class of code point (and any string, by hypothesis), and the views
read in process: `calm history` in every form, `calm stats`, `calmd status`'s table, on a store
holding each hostile form in a command and in a folder, and on a store with timestamps that are
not times. The same views in a real terminal: test_visible_terminal.py."""

from __future__ import annotations

import io
import json
import math
import sqlite3
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from calmd import paths
from calmd.cli import calm_main
from calmd.cli.status_view import status_table
from calmd.history import query
from calmd.visible import HIDDEN, finite, hidden, json_text, visible
from tests.support.builders import HOSTILE_GROUPS, hostile_folder, hostile_rows, write_rows

NOW = 1_764_000_000.0  # 2025-11-24


# --------------------------------------------------------------------------- the function


def read_back(shown: str) -> str:
    """The text `visible` was given, from what it printed (for a text that held a HIDDEN char)."""
    named = {"e": "\x1b", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
    out, i = [], 0
    while i < len(shown):
        if shown[i] != "\\":
            out.append(shown[i])
            i += 1
            continue
        kind = shown[i + 1]
        if kind in named:
            out.append(named[kind])
            i += 2
        elif kind == "x":
            byte = int(shown[i + 2 : i + 4], 16)
            out.append(chr(byte) if byte < 0x80 else chr(0xDC00 + byte))  # surrogateescape's byte
            i += 4
        else:
            digits = {"u": 4, "U": 8}[kind]
            out.append(chr(int(shown[i + 2 : i + 2 + digits], 16)))
            i += 2 + digits
    return "".join(out)


def test_each_class_has_its_escape() -> None:
    cases = {
        "\x1b]0;t\x07": "\\e]0;t\\x07",  # C0: ESC named, the others \xHH
        "a\nb\tc\rd": "a\\nb\\tc\\rd",
        "\x00\x08\x7f": "\\x00\\x08\\x7f",  # NUL, BS, DEL
        "\x85\x9b\x9c\x9d": "\\u0085\\u009b\\u009c\\u009d",  # C1: code points
        "\u202e\u2066\u200e\u061c": "\\u202e\\u2066\\u200e\\u061c",  # bidi overrides, isolates, marks
        "\u200b\u200d\u2060\ufeff\u00ad": "\\u200b\\u200d\\u2060\\ufeff\\u00ad",  # zero-width, soft hyphen
        "\U000e0041\U000e007f": "\\U000e0041\\U000e007f",  # tags: invisible ASCII
        "\u2028\u2029\u3164": "\\u2028\\u2029\\u3164",  # line, paragraph separators; a Hangul filler
        "\udcff\udc80": "\\xff\\x80",  # bytes that were not UTF-8 (surrogateescape)
        "\ud800": "\\ud800",  # any other lone surrogate
    }
    for text, shown in cases.items():
        assert visible(text) == shown, (text, visible(text))
        assert read_back(shown) == text


def test_backslashes_are_doubled_only_in_a_text_that_holds_an_escape() -> None:
    assert visible("printf '%s\\n' a\\ b") == "printf '%s\\n' a\\ b"  # stored as typed, copyable
    assert visible("printf '%s\\n'\x07") == "printf '%s\\\\n'\\x07"  # one escape: every \ starts one
    assert visible("tr -d '\\r' \r") == "tr -d '\\\\r' \\r"  # the typed \r and the CR differ
    assert visible("ü ✓ 漢字 👍 é") == "ü ✓ 漢字 👍 é"  # what is printable stays as it is
    # a part drawn on its own (the query up to the cursor) escapes as the whole does
    whole = "a\\b\x1bc"
    assert visible(whole[:3], doubled=hidden(whole)) + visible(whole[3:], doubled=True) == visible(whole)


def test_every_format_and_control_code_point_of_this_python_is_hidden() -> None:
    """The list in calmd/visible.py against this Python's Unicode tables: a newer Unicode that adds
    a format character fails here until the list has it."""
    categories = {"Cc", "Cf", "Cs", "Zl", "Zp"}
    missing = [f"U+{c:04X}" for c in range(0x110000)
               if unicodedata.category(chr(c)) in categories and not hidden(chr(c))]  # fmt: skip
    assert not missing
    # and nothing that draws: letters, marks, symbols, spaces (a variation selector stays: emoji)
    for ch in "a Zé\u0301漢\u00a0\u3000\ufe0f€\ufffd":
        assert not hidden(ch), ch


# Any text, with the characters that matter drawn often: every class above, backslashes, escapes
# typed as text (`\e`, `\x07`), printable Unicode.
INTERESTING = st.sampled_from(["\\", "\\e", "\\x07", "\\u202e", "\x1b", "\x07", "\r", "\n", "\x7f",
                               "\x9b", "\u202e", "\u200b", "\ufeff", "\U000e0041", "\udcff", "\ud800", "é",
                               "漢"])  # fmt: skip
TEXTS = st.lists(st.one_of(st.characters(exclude_categories=[]), INTERESTING), max_size=40).map("".join)


@settings(max_examples=500, deadline=None)
@given(TEXTS)
@example("git\u200b")
@example("\\")
def test_any_text_prints_nothing_hidden_and_reads_back(text: str) -> None:
    """The property: the output never holds a HIDDEN character; a text without one is printed as
    it is; a text with one reads back exactly (so two such texts never print alike)."""
    shown = visible(text)
    assert HIDDEN.search(shown) is None
    if hidden(text):
        assert read_back(shown) == text
        assert shown != text
    else:
        assert shown == text


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_json_text_is_valid_json_that_reads_back_and_prints_nothing_hidden(text: str) -> None:
    """Exact, but for what JSON's UTF-16 escapes cannot tell apart: two lone surrogates that make a
    pair read back as the character they encode (a store never holds a surrogate: store.py)."""
    doc = {"cmd": text, "cwd": text[::-1], "n": [1.5, math.nan, -math.inf]}
    out = json_text(doc, compact=True)
    assert HIDDEN.search(out) is None
    as_utf16 = {"cmd": utf16(text), "cwd": utf16(text[::-1]), "n": [1.5, None, None]}
    assert json.loads(out, parse_constant=_no_constant) == as_utf16
    indented = json_text(doc, indent=2)  # its newlines are the document's, never inside a string
    assert HIDDEN.search(indented.replace("\n", "")) is None
    assert json.loads(indented) == as_utf16


def utf16(text: str) -> str:
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


def test_finite_replaces_only_what_json_cannot_hold() -> None:
    assert finite({"a": [math.inf, 1.0, (math.nan, 2)], "b": "x", "c": 3}) == {
        "a": [None, 1.0, [None, 2]],
        "b": "x",
        "c": 3,
    }


# --------------------------------------------------------------------------- the views, in process


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))  # no folder written `~`
    monkeypatch.setenv("COLUMNS", "300")  # rich's width off a terminal: no cell folded
    return write_rows(tmp_path / "data" / paths.HISTORY, hostile_rows(NOW))


def assert_all_shown(out: str, texts: list[str]) -> None:
    """`out` holds nothing HIDDEN (but its own line ends) and each of `texts` as `visible` prints it."""
    assert HIDDEN.search(out.replace("\n", "")) is None, repr(out)
    for text in texts:
        assert visible(text) in out, (visible(text), out)


def test_calm_history_in_every_form_shows_each_form_escaped(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = hostile_rows(NOW)
    tools = [r["cmd"] for r in rows if r["cmd"].startswith("tool")]
    for args in ([], ["--exit", "0"], ["--regex", "^tool"]):
        assert calm_main(["history", "--db", str(hostile), *args]) == 0
        out = capsys.readouterr().out
        # a line is one text: its folder and command escaped together
        for row in rows:
            if row["cmd"].startswith("tool"):
                assert visible(f"{row['cwd']}  {row['cmd']}") in out
        assert_all_shown(out, [])
    assert calm_main(["history", "--db", str(hostile), "--commands"]) == 0
    out = capsys.readouterr().out
    assert_all_shown(out, tools)
    assert "git status\ngit\\u200b status\n" in out  # distinct
    assert calm_main(["history", "--db", str(hostile), "--json"]) == 0
    out = capsys.readouterr().out
    assert HIDDEN.search(out.replace("\n", "")) is None
    docs = [json.loads(line, parse_constant=_no_constant) for line in out.splitlines()]
    assert [(d["cmd"], d["cwd"]) for d in docs] == [(r["cmd"], r["cwd"]) for r in rows]  # exact


def test_calm_stats_shows_each_form_escaped_distinct_and_aligned(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert calm_main(["--no-color", "stats", "--db", str(hostile), "--top", "40"]) == 0
    out = capsys.readouterr().out
    names = [query.command_and_next(r["cmd"])[0] for r in hostile_rows(NOW) if r["cmd"].startswith("tool")]
    folders = [hostile_folder(g) for g in range(HOSTILE_GROUPS)]
    assert_all_shown(out, names + folders)
    table = out[out.index("top commands") : out.index("top subcommands")]
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert any("│ git " in row for row in rows) and any("│ git\\u200b " in row for row in rows)  # two rows
    # the columns line up: every row of the table is as wide as its header, the bars at one place
    assert len({len(row) for row in rows}) == 1 and len({tuple(_bars(row)) for row in rows}) == 1
    assert calm_main(["stats", "--db", str(hostile), "--json", "--top", "40"]) == 0
    out = capsys.readouterr().out
    assert HIDDEN.search(out.replace("\n", "")) is None
    doc = json.loads(out)
    assert {"git", "git\u200b"} <= {c["command"] for c in doc["top_commands"]}
    assert {f["folder"] for f in doc["folders"]} == set(folders)


def _bars(row: str) -> list[int]:
    return [i for i, ch in enumerate(row) if ch == "│"]


def test_calmd_status_table_shows_what_the_reply_quotes_escaped() -> None:
    """`calmd status` draws fields read from files (ranker.json's info, a refused file's name)."""
    from rich.console import Console

    status: dict[str, Any] = {
        "model": {"path": "/m/shell\x1b]0;T\x07.cwgt", "size": "tiny", "parameters": 1, "domain": "shell",
                  "ranker": "learned, fitted on \x1b]52;c;ZWNobyBwd25lZA==\x07[link=http://x]users[/link]"},
        "latency_ms": {"first_p50": None, "first_p99": None, "done_p50": None, "done_p99": None},
        "history": {"commands": 1, "dropped_secrets": 0, "since_last_training": 0,
                    "import": {"refused": 1, "last_refused": "/h/\u202eevil\x9b2J: binary data"}},
        "requests": 0, "errors": 0, "uptime_s": 1.0, "version": "x", "protocol": 1, "socket": "/s\x07",
    }  # fmt: skip
    buffer = io.StringIO()
    Console(file=buffer, width=300, force_terminal=True, color_system="standard").print(status_table(status))
    out = buffer.getvalue()
    for text in ("/m/shell\x1b]0;T\x07.cwgt", "/h/\u202eevil\x9b2J: binary data", "/s\x07"):
        assert visible(text) in out
    assert "[link=http://x]users[/link]" in out  # rich markup in a field is text, never a hyperlink
    assert "\x1b]" not in out and "\x07" not in out and "\x9b" not in out and "\u202e" not in out


# --------------------------------------------------------------------------- times that are not times


ODD_TIMES: list[Any] = [None, math.inf, -math.inf, 1e300, -5.0, 253_402_300_800.0 * 10, "soon", 1.5, 0]


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    """A store whose `ts` holds what no calmd writes but an old or hand-made store may: NULL (the
    table made without NOT NULL, as a hand-made store), an infinity, 1e300, a negative or a text."""
    db = tmp_path / "odd.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.executescript(
            "CREATE TABLE commands (id INTEGER PRIMARY KEY, ts REAL, session TEXT, cwd TEXT, git TEXT, "
            "cmd TEXT, exit INTEGER, source TEXT, comp TEXT, env TEXT, duration REAL);"
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "INSERT INTO meta VALUES ('schema_version', '4'), ('detector_version', '999');"
        )
        for i, ts in enumerate(ODD_TIMES):
            conn.execute("INSERT INTO commands (ts, session, cwd, git, cmd, exit, source, duration) "
                         "VALUES (?, 's', ?, '', ?, ?, 'shell', ?)",
                         (ts, None if i == 0 else "/w", f"odd {i}", 0 if i % 2 else None,
                          math.inf if i == 1 else 2.0))  # fmt: skip
        conn.execute("INSERT INTO commands (ts, cmd, cwd) VALUES (?, 'fine', '/w')", (NOW,))
    return db


@pytest.mark.parametrize("scanned", [True, False], ids=["sqlite-lines", "python-lines"])
def test_times_that_are_not_times_are_unknown_never_a_crash(
    odd: Path, scanned: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    if not scanned:  # an older detector's store: every row read by Python, checked one by one
        with sqlite3.connect(odd) as conn:
            conn.execute("UPDATE meta SET value = '1' WHERE key = 'detector_version'")
    assert calm_main(["history", "--db", str(odd)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(ODD_TIMES) + 1
    known = {"odd 7": 1.5, "odd 8": 0, "fine": NOW}
    for line in lines:
        cmd = line.split("  ")[-1]
        if cmd in known:
            assert line.startswith(query.local_time(known[cmd])), line
        else:
            assert line.startswith(f"{query.UNKNOWN_TIME:<19}  "), line
    assert calm_main(["history", "--db", str(odd), "--json"]) == 0
    docs = [json.loads(line, parse_constant=_no_constant) for line in capsys.readouterr().out.splitlines()]
    by_cmd = {d["cmd"]: d for d in docs}
    assert (
        by_cmd["odd 1"]["ts"] is None
        and by_cmd["odd 1"]["time"] is None
        and by_cmd["odd 1"]["duration"] is None
    )
    assert by_cmd["odd 7"]["ts"] == 1.5 and by_cmd["fine"]["time"].startswith("2025-11-")
    assert by_cmd["odd 0"]["cwd"] == "" and by_cmd["odd 2"]["duration"] == 2.0
    assert calm_main(["history", "--db", str(odd), "--commands", "--since", "2025-01-01"]) == 0
    assert capsys.readouterr().out == "fine\n"
    assert calm_main(["--no-color", "stats", "--db", str(odd)]) == 0
    out = capsys.readouterr().out
    assert f"10 commands, 10 distinct, {query.local_time(0)[:10]} to 2025-11-" in out
    assert calm_main(["stats", "--db", str(odd), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=_no_constant)
    assert doc["commands"] == 10 and sum(doc["hours"]) == 3  # the three known times, in their hours


def test_a_store_with_no_known_time_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = write_rows(tmp_path / "h.sqlite3", [{"cmd": "ls", "ts": 1e300}, {"cmd": "pwd", "ts": -1.0}])
    assert calm_main(["--no-color", "stats", "--db", str(db)]) == 0
    assert "2 commands, 2 distinct, unknown time to unknown time" in capsys.readouterr().out
