"""`calm history` and `calm stats` (calmd/history/query/, calmd/shell/history_view.py): the store
read-only, its filters, the tables, run from the command line as a user would."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import time
from pathlib import Path

import pytest

from calmd import paths
from calmd.cli import calm_main
from calmd.errors import CalmError
from calmd.history import query
from calmd.history.recorded import valid_time
from calmd.history.store import HistoryStore
from calmd.protocol import TS_MAX

NOW = dt.datetime(2025, 11, 24, 15, 0).timestamp()
HOUR = 3600.0


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A store as the shells leave it: folders, sessions, statuses, times."""
    store = HistoryStore(tmp_path / "data" / paths.HISTORY)
    rows = [
        ("git status", "/src/app", "s1", 0, NOW - 50 * HOUR),
        ("git commit -m 'first draft'", "/src/app", "s1", 0, NOW - 49 * HOUR),
        ("make test", "/src/app", "s1", 2, NOW - 26 * HOUR),
        ("make test", "/src/app/sub", "s2", 0, NOW - 3 * HOUR),
        ("git push origin main", "/src/app", "s2", 0, NOW - 2 * HOUR),
        ("docker compose up -d", "/srv/web", "s2", 1, NOW - 1 * HOUR),
        ("echo one\ntwo", "/srv/web", "s2", 0, NOW - 0.5 * HOUR),
    ]
    for cmd, cwd, session, code, ts in rows:
        assert store.record(cmd, exit=code, cwd=cwd, session=session, ts=ts).stored
    store.record("ls", ts=NOW - 100 * HOUR, session="import:.bash_history")  # imported: no status, folder
    store.close()
    return tmp_path / "data" / paths.HISTORY


def commands(db: Path, **fields: object) -> list[str]:
    conn = query.open_read_only(db)
    try:
        return [e.cmd for e in query.select(conn, query.HistoryFilter(**fields))]  # type: ignore[arg-type]
    finally:
        conn.close()


def test_filters_select_what_they_say(filled: Path) -> None:
    assert commands(filled)[0] == "ls" and len(commands(filled)) == 8  # oldest first
    assert commands(filled, cwd="/src/app") == ["git status", "git commit -m 'first draft'", "make test",
                                                "git push origin main"]  # fmt: skip
    assert commands(filled, cwd="/src/app/", below=True)[-2:] == ["make test", "git push origin main"]
    assert "make test" in commands(filled, cwd="/src", below=True)
    assert commands(filled, cwd="/src/ap", below=True) == []  # a folder, not a prefix of its name
    assert commands(filled, session="s1") == ["git status", "git commit -m 'first draft'", "make test"]
    assert commands(filled, exit=2) == ["make test"]
    assert commands(filled, failed=True) == ["make test", "docker compose up -d"]
    succeeded = commands(filled, failed=False)
    assert "ls" in succeeded and "docker compose up -d" not in succeeded
    assert commands(filled, since=NOW - 2.5 * HOUR) == ["git push origin main", "docker compose up -d",
                                                        "echo one\ntwo"]  # fmt: skip
    window = commands(filled, since=NOW - 3.5 * HOUR, until=NOW - 1.5 * HOUR)
    assert window == ["make test", "git push origin main"]
    gits = ["git status", "git commit -m 'first draft'", "git push origin main"]
    assert commands(filled, pattern="git ") == gits
    assert commands(filled, pattern="GIT") == []  # case-sensitive, like calm forget
    assert commands(filled, pattern=r"^git (status|push)", regex=True) == [gits[0], gits[2]]
    assert commands(filled, limit=2) == ["docker compose up -d", "echo one\ntwo"]  # the newest two
    assert commands(filled, pattern="git", limit=1) == ["git push origin main"]
    with pytest.raises(CalmError, match="not a valid regular expression"):
        commands(filled, pattern="(", regex=True)


def test_times_are_read_as_a_user_writes_them() -> None:
    assert query.parse_when("30m", NOW) == NOW - 1800
    assert query.parse_when("2h ago", NOW) == NOW - 7200
    assert query.parse_when("1w", NOW) == NOW - 7 * 86400
    assert query.parse_when("today", NOW) == dt.datetime(2025, 11, 24).timestamp()
    assert query.parse_when("yesterday", NOW) == dt.datetime(2025, 11, 23).timestamp()
    assert query.parse_when("2025-11-20", NOW) == dt.datetime(2025, 11, 20).timestamp()
    assert query.parse_when("2025-11-20 13:30", NOW) == dt.datetime(2025, 11, 20, 13, 30).timestamp()
    assert query.parse_when("1763798400", NOW) == 1763798400.0
    for bad in ("soon", "3 fortnights", "2025-13-01", ""):
        with pytest.raises(CalmError, match="is not a time"):
            query.parse_when(bad, NOW)


def test_stats_count_commands_subcommands_folders_failures_hours(filled: Path) -> None:
    conn = query.open_read_only(filled)
    takes = {"git", "docker"}.__contains__
    stats = query.compute_stats(query.rows(conn, query.HistoryFilter(), query.STATS_COLUMNS), takes)
    assert stats.top_commands[-1][0] == "ls"  # ties: in name order
    conn.close()
    assert (stats.commands, stats.distinct) == (8, 7)
    assert stats.top_commands[0] == ("git", 3, 0, 3)
    assert ("make", 2, 1, 2) in stats.top_commands and ("ls", 1, 0, 0) in stats.top_commands
    subs = [("docker compose", 1), ("git commit", 1), ("git push", 1), ("git status", 1)]  # ties by name
    assert stats.top_subcommands == subs
    assert (stats.with_status, stats.failed) == (7, 2) and stats.failure_rate == pytest.approx(2 / 7)
    folder, runs, top = stats.folders[0]
    assert (folder, runs, top[0]) == ("/src/app", 4, ("git", 3))
    assert sum(stats.hours) == 8 and sum(stats.weekdays) == 8
    hour = dt.datetime.fromtimestamp(NOW - 0.5 * HOUR).hour
    assert stats.hours[hour] >= 1 and len(stats.busiest_hours()) == 3
    assert query.command_and_next("FOO=1 BAR=2 make -j4") == ("make", "-j4")
    assert query.command_and_next("git") == ("git", None) and query.command_and_next("A=1") == ("", None)


def test_the_store_is_read_only_and_never_shows_what_the_store_refuses(filled: Path) -> None:
    with sqlite3.connect(filled) as raw:  # as an older calmd stored it, before its detector knew
        raw.execute("UPDATE meta SET value = '1' WHERE key = 'detector_version'")
        secret = "mysql -u root -phunter2xyz"
        raw.execute("INSERT INTO commands (ts, cmd, exit) VALUES (?, ?, 0)", (NOW, secret))
    assert not any("hunter2" in c for c in commands(filled))
    conn = query.open_read_only(filled)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM commands")
    # a reader in the middle of its rows holds no lock: a writer, even one that deletes (the
    # re-scan by this calmd's detector, with its WAL checkpoint), never waits for it
    rows = query.select(conn, query.HistoryFilter())
    first = next(rows)
    started = time.monotonic()
    store = HistoryStore(filled)
    assert store.rescanned == 1
    assert store.record("echo written meanwhile", exit=0, session="s3", ts=NOW).stored
    store.close()
    assert time.monotonic() - started < 4.5  # a writer that waited would wait the busy timeout, 5 s
    assert first.cmd == "ls" and "echo written meanwhile" not in [e.cmd for e in rows]
    assert "echo written meanwhile" in commands(filled)
    conn.close()


def test_a_missing_or_newer_store_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(query.NoHistory, match="no history yet"):
        query.open_read_only(tmp_path / "none.sqlite3")
    (tmp_path / "junk.sqlite3").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(CalmError, match="not a calmd history store"):
        query.open_read_only(tmp_path / "junk.sqlite3")
    store = HistoryStore(tmp_path / "new.sqlite3")
    store.close()
    with sqlite3.connect(tmp_path / "new.sqlite3") as raw:
        raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(CalmError, match="schema 99 is newer"):
        query.open_read_only(tmp_path / "new.sqlite3")


# --------------------------------------------------------------------------- the commands


def test_calm_history_prints_lines_json_or_commands(filled: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("HOME", "/src")
    assert calm_main(["history", "--db", str(filled), "--cwd", "/src/app", "--below", "make"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("  2  ~/app  make test") and lines[1].endswith("  0  ~/app/sub  make test")
    assert lines[0][:19] == dt.datetime.fromtimestamp(NOW - 26 * HOUR).strftime("%Y-%m-%d %H:%M:%S")
    assert calm_main(["history", "--db", str(filled), "--json", "--failed"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["cmd"] for d in docs] == ["make test", "docker compose up -d"]
    assert docs[1]["exit"] == 1 and docs[1]["cwd"] == "/srv/web" and docs[1]["session"] == "s2"
    since = dt.datetime.fromtimestamp(NOW - HOUR).isoformat(sep=" ")
    assert calm_main(["history", "--db", str(filled), "--commands", "--since", since]) == 0
    out = capsys.readouterr().out
    assert "echo one\\ntwo" in out.splitlines()  # one line per command
    monkeypatch.chdir(Path("/"))
    assert calm_main(["history", "--db", str(filled), "--cwd"]) == 0  # the current folder: none here
    assert capsys.readouterr().out == ""
    assert calm_main(["history", "--db", str(filled), "--since", "someday"]) == 1
    assert "is not a time" in capsys.readouterr().err
    assert calm_main(["history", "--db", str(filled), "--below"]) == 1
    assert calm_main(["history", "--db", str(filled.parent / "none.sqlite3")]) == 1
    assert "no history yet" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        calm_main(["history", "--db", str(filled), "--failed", "--succeeded"])


def test_calm_stats_prints_tables_and_json(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert calm_main(["--no-color", "stats", "--db", str(filled)]) == 0
    out = capsys.readouterr().out
    assert "8 commands, 7 distinct" in out and "28.6% failed (2 of the 7 runs with a known status)" in out
    for title in ("top commands", "top subcommands", "busiest folders", "busiest hours"):
        assert title in out
    assert "git commit" in out and "docker compose" in out  # git and docker take subcommands
    assert calm_main(["stats", "--db", str(filled), "--json", "--cwd", "/srv/web"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["commands"] == 2 and doc["failed"] == 1 and doc["top_commands"][0]["runs"] == 1
    assert calm_main(["--no-color", "stats", "--db", str(filled), "nothing-like-this"]) == 0
    assert "no commands match" in capsys.readouterr().out


def test_sqlite_writes_the_lines_python_writes(filled: Path) -> None:
    """`calm history` has SQLite make its lines (fast), and Python when rows must be checked one by
    one (a store not yet re-scanned by this calmd's detector): the same lines either way."""
    store = HistoryStore(filled)
    for cmd in ("printf 'a\\tb\\\\n'\nsecond line", 'echo "quoted" \\ é 漢', "echo \x01 control"):
        store.record(cmd, exit=-1, cwd="/src", session="s3", ts=NOW - 0.25, duration=1.23456)
    store.record("ls", exit=0, cwd="/src/application", session="s3", ts=NOW)  # not under /src/app
    store.close()
    filters = [query.HistoryFilter(), query.HistoryFilter(limit=3), query.HistoryFilter(pattern="echo"),
               query.HistoryFilter(cwd="/src/app", below=True, failed=False)]  # fmt: skip

    def lines() -> list[list[str]]:
        conn = query.open_read_only(filled)
        forms = ("plain", "json", "commands")
        out = [query.history_lines(conn, f, form, home) for f in filters for form in forms
               for home in ("/src/app", "/", "")]  # fmt: skip
        conn.close()
        return out

    by_sqlite = lines()
    with sqlite3.connect(filled) as raw:
        raw.execute("UPDATE meta SET value = '1' WHERE key = 'detector_version'")
    by_python = lines()
    assert by_sqlite == by_python
    plain = by_sqlite[0]
    # the command's own backslashes doubled, its newline written \n: one line, read back unambiguously
    assert any(line.endswith("  -1  /src  printf 'a\\\\tb\\\\\\\\n'\\nsecond line") for line in plain)
    assert any("  ~/sub  make test" in line for line in plain)
    assert any("  /src/application  ls" in line for line in plain)
    doc = json.loads(by_sqlite[3][-2])
    assert doc["duration"] == 1.235 and doc["exit"] == -1 and doc["cmd"] == "echo \x01 control"


# --------------------------------------------------------------------------- impossible times (issue 30)


def _strict_json(line: str) -> object:
    """json.loads that refuses what is not JSON (Python's reader takes Infinity and NaN)."""

    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_times_an_older_calmd_stored_are_shown_then_repaired(
    filled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before issue 30 an import stored `: 999999999999:0;ls` as the year 33658, a 400-digit fish
    `when:` as infinity, a negative one as 1969: `calm history` failed ("unexpected TypeError"),
    `calm stats` too ("year 33658 is out of range"), `--json` wrote Infinity. They are shown as
    unknown times now, and the store gives them the time of the command before when it opens."""
    with sqlite3.connect(filled) as raw:
        raw.execute(
            "INSERT INTO commands (ts, cmd, source) VALUES (999999999999, 'year 33658', 'import:zsh')"
        )
        raw.execute("INSERT INTO commands (ts, cmd, source) VALUES (9e999, 'infinite', 'import:fish')")
        raw.execute("INSERT INTO commands (ts, cmd, source) VALUES (-5, 'before 1970', 'import:fish')")
    for argv in (["history"], ["history", "--commands"], ["history", "--limit", "3"], ["stats"],
                 ["stats", "--json"]):  # fmt: skip
        assert calm_main([*argv, "--db", str(filled)]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "year 33658" in out or argv[0] == "stats"
    assert calm_main(["history", "--db", str(filled), "--json"]) == 0
    docs = [_strict_json(line) for line in capsys.readouterr().out.splitlines()]
    odd = {d["cmd"]: (d["ts"], d["time"]) for d in docs if isinstance(d, dict) and d["cmd"] in
           ("year 33658", "infinite", "before 1970")}  # fmt: skip
    assert odd == dict.fromkeys(("year 33658", "infinite", "before 1970"), (None, None))
    assert calm_main(["history", "--db", str(filled), "year"]) == 0
    assert capsys.readouterr().out.startswith(f"{query.UNKNOWN_TIME:<19}       -  year 33658")
    conn = query.open_read_only(filled)
    python_made = list(query.plain_lines(query.rows(conn, query.HistoryFilter(pattern="infinite"),
                                                    query.PLAIN_COLUMNS), ""))  # fmt: skip
    assert [_strict_json(line) for line in query.json_lines(query.rows(conn, query.HistoryFilter(),
                                                                       query.ENTRY_COLUMNS))]  # fmt: skip
    conn.close()
    assert python_made == [f"{query.UNKNOWN_TIME:<19}       -  infinite"]
    store = HistoryStore(filled)  # opened for writing (the daemon, an import): repaired
    rows = [(r.cmd, r.ts) for r in store.all_rows()]
    assert store.counter("import_bad_times") == 3
    store.close()
    assert rows[-4][0] == "ls"  # the last row before them: each takes its time
    assert [ts for _, ts in rows[-3:]] == [rows[-4][1]] * 3


def test_stats_say_how_many_runs_failed_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new user's 17 commands, none failed: not "0.0% failed (0 of the 17 runs ...)"."""
    store = HistoryStore(tmp_path / "h.sqlite3")
    for i in range(17):
        store.record(f"echo {i}", exit=0, ts=NOW - i)
    store.close()
    assert calm_main(["--no-color", "stats", "--db", str(tmp_path / "h.sqlite3")]) == 0
    summary = capsys.readouterr().out.splitlines()[0]
    assert "17 commands, 17 distinct" in summary
    assert "none of the 17 runs with a known status failed" in summary
    assert "0.0%" not in summary


def test_one_range_of_times_for_the_store_and_both_views(
    filled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A time is known from 1970 to 2100 (protocol.TS_MAX) everywhere: what `record` and the imports
    take (recorded.valid_time), what the views print (query.known_ts, and SQLite's lines the same),
    and what opening the store repairs. The year 2500 is past it: unknown in every view (not a date
    in one and unknown in the other), and repaired; TS_MAX itself is a time."""
    with sqlite3.connect(filled) as raw:
        raw.execute(f"INSERT INTO commands (ts, cmd, source) VALUES ({TS_MAX}, 'the last second', 'shell')")
        raw.execute("INSERT INTO commands (ts, cmd, source) VALUES (16725225600, 'year 2500', 'shell')")
    assert valid_time(TS_MAX) and not valid_time(16725225600)
    assert query.known_ts(TS_MAX) == TS_MAX and query.known_ts(16725225600) is None
    by_path = []
    for detector in (None, "1"):  # this calmd's detector: SQLite makes the lines; an older one: Python
        if detector:
            with sqlite3.connect(filled) as raw:
                raw.execute("UPDATE meta SET value = ? WHERE key = 'detector_version'", (detector,))
        assert calm_main(["history", "--db", str(filled), "--limit", "2"]) == 0
        plain = capsys.readouterr().out.splitlines()
        assert calm_main(["history", "--db", str(filled), "--limit", "2", "--json"]) == 0
        docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        by_path.append((plain, docs))
    assert by_path[0] == by_path[1]
    plain, docs = by_path[0]
    assert plain[0].startswith(query.local_time(TS_MAX)) and plain[0].endswith("the last second")
    assert plain[1] == f"{query.UNKNOWN_TIME:<19}       -  year 2500"
    assert docs[0]["ts"] == TS_MAX and docs[1]["ts"] is None and docs[1]["time"] is None
    assert calm_main(["history", "--db", str(filled), "--commands", "--since", "2099-01-01"]) == 0
    assert capsys.readouterr().out == "the last second\n"  # year 2500 is after no time
    assert calm_main(["stats", "--db", str(filled), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last"] == dt.datetime.fromtimestamp(TS_MAX).isoformat()
    store = HistoryStore(filled)  # opened for writing: the same one out of range is repaired
    times = {r.cmd: r.ts for r in store.all_rows()}
    store.close()
    assert times["the last second"] == TS_MAX and times["year 2500"] == TS_MAX
