"""The SQLite history store: filters, queries, and importing real bash and zsh history files."""

from __future__ import annotations

import csv
import json
import random
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from calmd import paths
from calmd.formats.ctds import CtdsReader
from calmd.formats.tokenizer import decode
from calmd.history.store import HistoryStore
from calmd.shell.client import CalmClient
from calmd.suggest.context import HISTORY_FRAMES, ContextTracker, recent_context
from calmd.suggest.ranking import HistoryIndex
from calmd.training.datasets import DatasetOptions, write_history_dataset
from tests.support.daemon import BIN, daemon_env, running_daemon, wait_imported
from tests.support.tools import shared_data
from tests.support.waiting import HANG_S


def test_record_and_filters(store: HistoryStore) -> None:
    assert store.record("git status", exit=0, cwd="/p", git="main", session="s1").stored
    assert store.record(" secret-ish thing", session="s1").reason == "leading-space"
    assert store.record("   ", session="s1").reason == "empty"
    verdict = store.record("mysql -u root -phunter2", session="s1")
    assert not verdict.stored and verdict.reason == "secret:password-option"
    assert store.count() == 1
    assert store.counter("dropped_secrets") == 1
    (row,) = store.recent(limit=5)
    assert (row.cmd, row.exit, row.cwd, row.git, row.session) == ("git status", 0, "/p", "main", "s1")
    assert row.source == "shell"
    # nothing of the dropped commands reached the file
    raw = store.path.read_bytes() + Path(str(store.path) + "-wal").read_bytes()
    assert b"hunter2" not in raw and b"secret-ish" not in raw


def test_file_mode_and_wal(store: HistoryStore) -> None:
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    con = sqlite3.connect(store.path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


def test_a_version_1_history_is_migrated_without_losing_a_row(tmp_path: Path) -> None:
    path = tmp_path / paths.HISTORY
    con = sqlite3.connect(path)  # as calmd with schema 1 left it: a prev_cmd column nothing reads
    con.executescript(
        "CREATE TABLE commands (id INTEGER PRIMARY KEY, ts REAL NOT NULL, session TEXT NOT NULL DEFAULT '',"
        " cwd TEXT NOT NULL DEFAULT '', git TEXT NOT NULL DEFAULT '', cmd TEXT NOT NULL, exit INTEGER,"
        " prev_cmd TEXT NOT NULL DEFAULT '', source TEXT NOT NULL DEFAULT 'shell');"
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "INSERT INTO commands (ts, session, cwd, cmd, exit, prev_cmd) VALUES"
        " (1, 'a', '/src', 'make', 2, '');"
        "INSERT INTO commands (ts, session, cwd, cmd, exit, prev_cmd) VALUES"
        " (2, 'a', '/src', 'ls', 0, 'make');"
    )
    con.close()
    store = HistoryStore(path)
    assert [(r.cmd, r.exit, r.cwd) for r in store.all_rows()] == [("make", 2, "/src"), ("ls", 0, "/src")]
    store.record("git status", session="a")
    store.close()
    con = sqlite3.connect(path)
    assert "prev_cmd" not in {row[1] for row in con.execute("PRAGMA table_info(commands)")}
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("5",)
    con.close()


def test_a_version_2_history_gains_comp_and_env_in_place(tmp_path: Path) -> None:
    path = tmp_path / paths.HISTORY
    con = sqlite3.connect(path)  # as calmd with schema 2 left it: no comp, no env
    con.executescript(
        "CREATE TABLE commands (id INTEGER PRIMARY KEY, ts REAL NOT NULL, session TEXT NOT NULL DEFAULT '',"
        " cwd TEXT NOT NULL DEFAULT '', git TEXT NOT NULL DEFAULT '', cmd TEXT NOT NULL, exit INTEGER,"
        " source TEXT NOT NULL DEFAULT 'shell');"
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '2');"
        "INSERT INTO commands (ts, session, cwd, cmd, exit) VALUES (1, 'a', '/src', 'make', 0);"
    )
    con.close()
    store = HistoryStore(path)
    store.record("vim notes.md", session="a", comp=["notes.md", "ghp_abcdefghijklmnopqrstuvwxyz0123456789AB",
                                                    "a\nb"], env="venv:proj")  # fmt: skip
    rows = list(store.all_rows())
    assert [(r.cmd, r.comp, r.env) for r in rows] == [
        ("make", (), ""),
        ("vim notes.md", ("notes.md",), "venv:proj"),
    ]
    store.close()
    con = sqlite3.connect(path)
    assert {"comp", "env"} <= {row[1] for row in con.execute("PRAGMA table_info(commands)")}
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("5",)
    con.close()
    assert [r.comp for r in HistoryStore(path).all_rows()] == [(), ("notes.md",)]  # opened again: as it was


def test_a_version_3_history_gains_duration_in_place(tmp_path: Path) -> None:
    path = tmp_path / paths.HISTORY
    store = HistoryStore(path)
    store.record("make", session="a", exit=0)
    store.close()
    con = sqlite3.connect(path)  # as calmd with schema 3 left it: no duration column, no ts index
    con.executescript("ALTER TABLE commands DROP COLUMN duration; DROP INDEX commands_ts;"
                      "UPDATE meta SET value = '3' WHERE key = 'schema_version';")  # fmt: skip
    con.close()
    store = HistoryStore(path)
    store.record("sleep 2", session="a", exit=0, duration=2.004)
    assert [(r.cmd, r.duration) for r in store.all_rows()] == [("make", None), ("sleep 2", 2.004)]
    store.close()
    con = sqlite3.connect(path)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("5",)
    assert "commands_ts" in {row[1] for row in con.execute("PRAGMA index_list(commands)")}
    con.close()


@pytest.mark.parametrize("version", [3, 4])
def test_an_older_store_with_impossible_times_is_read_then_migrated_and_repaired(
    tmp_path: Path, version: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store of schema 3 (no duration) or 4 (issue 30's main: no host, origin, origin_id, no sync
    tables) holding times an older import kept (the year 33658, before 1970): the views read it
    as it is (this machine's records, unknown times), and the first open for writing takes it
    through the one chain to schema 5 and gives those rows the time of the row before them."""
    from calmd.cli import calm_main

    path = tmp_path / paths.HISTORY
    store = HistoryStore(path)
    store.record("make", session="a", exit=0, ts=1000.0, duration=1.5)
    store.close()
    con = sqlite3.connect(path)
    con.executescript(
        "DROP INDEX commands_origin; DROP INDEX commands_unshared; DROP TABLE sync_forgotten;"
        "DROP TABLE sync_hosts; DROP TABLE sync_files; DROP TABLE sync_refused; DROP TABLE sync_own;"
        "ALTER TABLE commands DROP COLUMN host; ALTER TABLE commands DROP COLUMN origin;"
        "ALTER TABLE commands DROP COLUMN origin_id;"
        + ("ALTER TABLE commands DROP COLUMN duration;" if version < 4 else "")
        + f"UPDATE meta SET value = '{version}' WHERE key = 'schema_version';"
        "INSERT INTO commands (ts, cmd, source) VALUES (999999999999, 'year 33658', 'import:zsh');"
        "INSERT INTO commands (ts, cmd, source) VALUES (-5, 'before 1970', 'import:fish');"
    )
    con.close()
    assert calm_main(["history", "--db", str(path), "--json", "--host"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {d["cmd"]: (d["time"] is None, d["host"] != "") for d in docs} == {
        "make": (False, True), "year 33658": (True, True), "before 1970": (True, True)}  # fmt: skip
    store = HistoryStore(path)
    assert [(r.cmd, r.ts, r.host) for r in store.all_rows()] == [
        ("make", 1000.0, ""), ("year 33658", 1000.0, ""), ("before 1970", 1000.0, "")]  # fmt: skip
    assert store.counter("import_bad_times") == 2
    store.close()
    store = HistoryStore(path)  # opened again: nothing more to migrate or repair
    assert store.counter("import_bad_times") == 2
    with store.reading() as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("5",)
        columns = {row[1] for row in db.execute("PRAGMA table_info(commands)")}
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    store.close()
    assert {"duration", "host", "origin", "origin_id"} <= columns
    assert {"sync_forgotten", "sync_hosts", "sync_files", "sync_own", "sync_refused"} <= tables


def test_recent_prefers_session_then_tops_up(store: HistoryStore) -> None:
    for i in range(5):
        store.record(f"a{i}", session="A", ts=100 + i)
        store.record(f"b{i}", session="B", ts=200 + i)
    assert [r.cmd for r in recent_context(store, "A", 3)] == ["a2", "a3", "a4"]
    # all five of A last (nearest the prediction), after the newest two of the others
    assert [r.cmd for r in recent_context(store, "A", 7)] == ["b3", "b4", "a0", "a1", "a2", "a3", "a4"]
    assert [r.cmd for r in store.recent(limit=2)] == ["a4", "b4"]


def test_import_is_incremental(store: HistoryStore, tmp_path: Path) -> None:
    hist = tmp_path / ".bash_history"
    hist.write_text("ls\ngit status\n sneaky\nexport TOKEN=Zx8Qw2Lm9Rt4Vb7Np3\n")
    result = store.import_file(hist)
    assert (result.format, result.imported, result.dropped_secrets, result.skipped) == ("bash", 2, 1, 1)
    assert store.import_file(hist).imported == 0  # nothing new
    with open(hist, "a") as f:
        f.write("make\n")
    again = store.import_file(hist)
    assert again.imported == 1
    assert [r.cmd for r in store.recent(limit=10)] == ["ls", "git status", "make"]
    assert all(r.source == "import:bash" for r in store.recent(limit=10))
    hist.write_text("fresh\n")  # rewritten (e.g. HISTSIZE trimmed it): read again from the start
    assert store.import_file(hist).imported == 1


def test_import_zsh_file(store: HistoryStore, tmp_path: Path) -> None:
    hist = tmp_path / ".zsh_history"
    hist.write_bytes(b": 1700000000:0;cd src\n: 1700000001:0;make\\\n  install\n")
    result = store.import_file(hist)
    assert result.format == "zsh" and result.imported == 2
    rows = store.recent(limit=5)
    assert [(r.ts, r.cmd) for r in rows] == [(1700000000.0, "cd src"), (1700000001.0, "make\n  install")]


@pytest.mark.slow  # seconds of CPU: the whole suite runs it, not the quick loop
def test_import_public_histories(tmp_path: Path) -> None:
    """Every command of ten real users' files arrives, in order; the counts add up per file."""
    HISTORIES = shared_data("histories")
    with open(HISTORIES / "manifest.tsv") as f:
        manifest = {row["id"]: row for row in csv.DictReader(f, delimiter="\t")}
    for user in sorted(manifest)[:10]:
        store = HistoryStore(tmp_path / f"{user}.sqlite3")
        path = HISTORIES / "users" / f"{user}.txt"
        lines = path.read_text(errors="surrogateescape").splitlines()
        result = store.import_file(path)
        assert (
            result.imported + result.dropped_secrets + result.skipped
            == len(lines)
            == int(manifest[user]["n_after_scrub"])
        )
        kept = [line for line in lines if line.strip() and not line.startswith(" ")]
        stored = [r.cmd for r in store.all_rows()]
        assert len(stored) == result.imported
        assert stored == [c for c in kept if c in set(stored)]  # order preserved
        store.close()


def test_cwd_query(store: HistoryStore) -> None:
    for session in ("a", "b", "c"):
        store.record("git add -A", session=session, cwd="/repo")
        store.record("git commit -m wip" if session != "c" else "git status", session=session, cwd="/repo")
    store.record("git commit -m other", session="d", cwd="/tmp")
    assert store.in_cwd("/repo", prefix="git c") == ["git commit -m wip"]
    assert store.in_cwd("/tmp") == ["git commit -m other"]


# --------------------------------------------------------------------------- hostile bytes


def raw_files(store: HistoryStore) -> bytes:
    """Every byte SQLite keeps for the store: the database file, its WAL and shared memory."""
    return b"".join(p.read_bytes() for p in store.path.parent.glob(store.path.name + "*") if p.is_file())


def test_record_keeps_undecodable_text_as_replacement_characters(store: HistoryStore) -> None:
    assert store.record("echo caf\udcc3 done", cwd="/tmp/\udcff", session="s").stored
    assert store.record("printf 'a\x00b'", session="s").stored
    assert store.record("echo \ud800 lone", session="s").stored
    assert store.record("echo fine", session="s").stored
    rows = [r.cmd for r in store.recent(limit=10)]
    assert rows == ["echo caf\ufffd done", "printf 'a\ufffdb'", "echo \ufffd\ufffd\ufffd lone", "echo fine"]
    assert store.recent(limit=10)[0].cwd == "/tmp/\ufffd"
    assert store.counter("undecodable") == 3


def hostile_bash() -> bytes:
    return (
        b"ls\n"
        b"echo \xff\xfe broken\n"  # not UTF-8
        b"cat caf\xc3\n"  # a truncated sequence
        b"printf 'nul\x00here'\n"
        b"git status\r\n"  # CRLF
        b" secret-by-habit\n"  # leading space: never stored
        + b"x" * 100_000
        + b"\n"  # over the 64 KiB command limit
        + b"mysql -u root -pS3cretQQ db\n"
        + b"\x80\x81\x82\n"
        + b"make\n"
    )


def hostile_zsh() -> bytes:
    return (
        b": 1700000000:0;cd src\n"
        b": 1700000001:0;echo caf\x83\xe3\n"  # metafied, decodes to a lone 0xC3
        b": 1700000002:0;echo \xe2\x82\xac euro\n"
        b": 1700000003:0;echo bad \xff\r\n"
        b": 1700000004:0;for f in *; do\\\n  echo $f\\\ndone\n"
        b": 1700000005:0;ends with meta \x83"  # a dangling metafy byte and no final newline
    )


def test_import_never_fails_on_hostile_bytes(store: HistoryStore, tmp_path: Path) -> None:
    bash = tmp_path / ".bash_history"
    bash.write_bytes(hostile_bash())
    result = store.import_file(bash)
    assert (result.imported, result.dropped_secrets, result.skipped, result.undecodable) == (6, 1, 1, 3)
    assert (result.too_long, result.damaged) == (1, 1)  # the NUL: damage, never a shell's (issue 39)
    cmds = [r.cmd for r in store.all_rows()]
    assert cmds == ["ls", "echo \ufffd\ufffd broken", "cat caf\ufffd", "git status", "\ufffd\ufffd\ufffd",
                    "make"]  # fmt: skip
    zsh = tmp_path / ".zsh_history"
    zsh.write_bytes(hostile_zsh())
    result = store.import_file(zsh)
    assert (result.format, result.imported, result.undecodable) == ("zsh", 6, 2)
    cmds = [r.cmd for r in store.all_rows()][6:]
    assert cmds == ["cd src", "echo caf\ufffd", "echo \u20ac euro", "echo bad \ufffd",
                    "for f in *; do\n  echo $f\ndone", "ends with meta "]  # fmt: skip
    assert store.counter("undecodable") == 5
    assert b"S3cretQQ" not in raw_files(store) and b"secret-by-habit" not in raw_files(store)


def test_first_start_import_survives_a_file_it_cannot_read(store: HistoryStore, tmp_path: Path) -> None:
    unreadable = Path("/proc/self/clear_refs")  # a regular file whose read fails (EINVAL)
    if not unreadable.exists():
        pytest.skip("needs Linux /proc")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bash_history").symlink_to(unreadable)
    (home / ".zsh_history").write_bytes(hostile_zsh())
    outcome = store.import_shell_histories(home)
    assert [(Path(p).name, why.split(" ")[0]) for p, why in outcome.failures] == [
        (".bash_history", "OSError")
    ]
    assert [r.imported for r in outcome.results] == [6]
    assert store.counter("import_failures") == 1 and store.counter("first_start_done") == 1
    assert store.import_shell_histories(home) == type(outcome)()  # once only


# --------------------------------------------------------------------------- forgetting


def test_deleting_commands_takes_them_out_of_the_count_since_the_last_training(store: HistoryStore) -> None:
    """After one Ctrl-D in `calm search`, `calmd status` said 19 commands but 20 since the last
    training: a deleted command the count held leaves it."""
    for i in range(10):
        store.record(f"old {i}", session="s")
    store.reset_counter("recorded_since_train")  # a training run started here
    for i in range(5):
        store.record(f"new {i}", session="s")
    assert store.counter("recorded_since_train") == 5
    assert store.forget(lambda cmd: cmd == "old 3") == 1  # from before the run: not counted
    assert store.counter("recorded_since_train") == 5
    assert store.forget_command("new 2") == (1, 15)  # one run; the newest row left: new 4's
    assert store.counter("recorded_since_train") == 4
    assert store.forget(lambda cmd: cmd.startswith(("new", "old"))) == 13
    assert store.counter("recorded_since_train") == 0 == store.count()


def test_commands_starting_with_a_space_or_calm_forget_are_not_recorded(store: HistoryStore) -> None:
    assert store.record(" export TOKEN=whatever").reason == "leading-space"
    assert store.record("calm forget hunter2").reason == "forget-command"
    assert store.record("/home/u/.local/bin/calm forget -E 'hunt.r2'").reason == "forget-command"
    assert store.record("calm import ~/.bash_history").stored
    assert store.count() == 1


def test_forget_deletes_for_good(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / paths.HISTORY)
    for i in range(200):  # enough rows that the secret's page is not the only one
        store.record(f"echo filler number {i} with some padding text", session="a")
    store.record("deploy --target prod-XYZZY", session="a")
    store.record("deploy --target prod-XYZZY", session="b")
    store.record("make after", session="a")
    store.record("make other", session="c")
    derived = tmp_path / paths.TRAINING_SUBDIR / paths.TRAINING_SET
    derived.parent.mkdir()
    derived.write_bytes(b"built from the old rows")
    assert b"XYZZY" in raw_files(store)
    assert store.count_matching(lambda c: "XYZZY" in c) == 2
    before = store.generation()
    assert store.forget(lambda c: "XYZZY" in c) == 2
    assert store.generation() == before + 1
    assert store.count_matching(lambda c: "XYZZY" in c) == 0
    assert b"XYZZY" not in raw_files(store)
    assert Path(f"{store.path}-wal").stat().st_size == 0
    assert not derived.exists()
    out = tmp_path / "ds.ctds"
    write_history_dataset(store, out, DatasetOptions(include_trivial=True))
    reader = CtdsReader(out)
    text = b"".join(decode(reader.sequence(i)) for i in range(len(reader)))
    assert b"make after" in text and b"XYZZY" not in text
    assert store.forget(lambda c: "XYZZY" in c) == 0 and store.generation() == before + 1


def test_a_store_scanned_by_an_older_detector_is_rescanned(tmp_path: Path) -> None:
    path = tmp_path / paths.HISTORY
    store = HistoryStore(path)
    store.record("git status", session="s")
    store.close()
    # As an older calmd would have left it: a credential it did not recognise, stored.
    con = sqlite3.connect(path)
    con.execute(
        "INSERT INTO commands (ts, session, cmd) VALUES (1, 's', 'smbclient //nas/x -U bob%Sm8Pw0rdQ')"
    )
    con.execute("INSERT INTO commands (ts, session, cmd) VALUES (2, 's', 'ls')")
    con.execute("UPDATE meta SET value = '1' WHERE key = 'detector_version'")
    con.commit()
    con.close()
    (tmp_path / "training").mkdir()
    (tmp_path / paths.TRAINING_SUBDIR / paths.HELDOUT_SET).write_bytes(b"old")
    store = HistoryStore(path)
    assert store.rescanned == 1
    assert [r.cmd for r in store.all_rows()] == ["git status", "ls"]
    assert store.counter("dropped_secrets") == 1 and store.generation() == 1
    assert b"Sm8Pw0rdQ" not in raw_files(store)
    assert not (tmp_path / paths.TRAINING_SUBDIR / paths.HELDOUT_SET).exists()
    store.close()
    assert HistoryStore(path).rescanned == 0  # scanned by this version already


def test_the_ranking_index_rebuilds_when_rows_are_deleted(store: HistoryStore) -> None:
    index = HistoryIndex()
    for cmd in ["git status", "deploy --token-ish XYZZY", "git status"]:
        store.record(cmd, session="s")
    index.sync(store)
    assert index.count["deploy --token-ish XYZZY"] == 1
    store.forget(lambda c: "XYZZY" in c)
    store.record("make", session="s")
    index.sync(store)
    assert "deploy --token-ish XYZZY" not in index.count and "deploy --token-ish XYZZY" not in index.commands
    assert index.count["git status"] == 2 and index.commands[-1] == "make"


# --------------------------------------------------------------------------- with a real daemon


def candidates(c: CalmClient, text: str, session: str) -> list[str]:
    return [m["candidate"] for m in c.complete(text, n=8, session=session) if "candidate" in m]


def test_the_daemon_starts_with_hostile_history_files(tmp_path: Path) -> None:
    """Bad bytes, metafied zsh bytes, NULs, CRs and a 100 KB line in the user's history files:
    `calmd serve` imports what it can at its first start and serves."""
    (tmp_path / ".bash_history").write_bytes(hostile_bash())
    (tmp_path / ".zsh_history").write_bytes(hostile_zsh())
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        assert wait_imported(c)["history"]["commands"] == 6 + 6  # bash's NUL line: damaged, skipped
        assert "echo caf\ufffd" in candidates(c, "echo caf", session="s")
    assert "S3cretQQ" not in d.read_output() and "broken" not in d.read_output()


def test_the_daemon_starts_when_a_history_file_cannot_be_read(tmp_path: Path) -> None:
    unreadable = Path("/proc/self/clear_refs")
    if not unreadable.exists():
        pytest.skip("needs Linux /proc")
    (tmp_path / ".bash_history").symlink_to(unreadable)
    (tmp_path / ".zsh_history").write_bytes(b": 1700000000:0;make secretive-target\n")
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        assert wait_imported(c)["history"]["commands"] == 1
    output = d.read_output()
    assert "could not import" in output and ".bash_history: OSError" in output
    assert "secretive-target" not in output  # never command text in the log


def calm(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "calm"), *args],
        env=daemon_env(home),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_calm_forget_with_a_running_daemon(tmp_path: Path) -> None:
    """As a user would: commands recorded by the shell, then `calm forget` from another
    terminal; the daemon stops offering them (its caches notice the new generation)."""
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        c.record("git status", session="s")
        c.record("deploy --password-is hunter2-XYZZY", session="s")
        c.record("deploy --dry-run", session="s")
        c.record("deploy --password-is hunter2-XYZZY", session="s")
        assert "deploy --password-is hunter2-XYZZY" in candidates(c, "deploy", session="s")
        # an empty prompt: the daemon's cached recent history of the session
        assert candidates(c, "", session="s")[0] == "after deploy --password-is hunter2-XYZZY"

        dry = calm(tmp_path, "forget", "--dry-run", "XYZZY")
        assert dry.returncode == 0 and "2 commands" in dry.stdout and "dry run" in dry.stdout
        assert "deploy --password-is hunter2-XYZZY" in candidates(c, "deploy", session="s")

        done = calm(tmp_path, "forget", "-", stdin="hunter2-XYZZY\n")
        assert done.returncode == 0, done.stderr
        assert "forgot 2 commands" in done.stdout
        assert candidates(c, "deploy", session="s")[0] == "deploy --dry-run"
        assert not any("XYZZY" in cand for cand in candidates(c, "deploy", session="s"))
        assert candidates(c, "", session="s")[0] == "after deploy --dry-run"
        assert c.status()["status"]["history"]["commands"] == 2
        db = tmp_path / "data" / paths.HISTORY
        assert b"XYZZY" not in b"".join(p.read_bytes() for p in db.parent.glob(paths.HISTORY + "*"))

        regex = calm(tmp_path, "forget", "--regex", "^git st")
        assert regex.returncode == 0 and "forgot 1 command " in regex.stdout
        assert calm(tmp_path, "forget", "--regex", "(").returncode == 1
        assert calm(tmp_path, "forget", "").returncode == 1


def test_calm_forget_all_deletes_everything_calm_holds(tmp_path: Path) -> None:
    """`calm forget --all`, with a daemon running: every command (no byte of them left in the
    store or its WAL), the user's model and ranker and the ones they replaced, the datasets, the
    training run's files, the helpers' log and the cache; the hook files and `calm disable`'s flag
    stay. It asks first: with no terminal to ask on it wants --yes; a training run holds it off.
    The daemon serves the packaged model at once, and its next start imports nothing again."""
    from calmd.training.background import TrainingLock

    data, cache = tmp_path / "data", tmp_path / "cache"
    (tmp_path / ".zsh_history").write_text(": 1700000000:0;make XYZZY-ALL\n")
    env = {"CALM_CACHE": str(cache)}
    work = paths.TRAINING_SUBDIR
    learned = [
        paths.PREV_WEIGHTS,
        paths.RANKER,
        paths.PREV_RANKER,
        paths.DATASET,
        paths.TRAINING_STATUS,
        paths.TRAINING_LOG,
        paths.HELPER_LOG,
        f"{work}/{paths.TRAINING_SET}",
        f"{work}/{paths.HELDOUT_SET}",
    ]
    kept = [paths.HOOK_FILE.format(shell="zsh"), paths.HOOK_FILE.format(shell="fish"), paths.DISABLED_FLAG]
    data.mkdir()
    shutil.copy(paths.packaged_weights(), data / paths.WEIGHTS)  # "your" model: a real one, to load
    with running_daemon(tmp_path, engine="model", env=env, weights=False) as d, CalmClient(d.socket) as c:
        assert wait_imported(c)["history"]["commands"] == 1
        assert c.status()["status"]["model"]["path"] == str(data / paths.WEIGHTS)
        for cmd in ("git status", "deploy --tag XYZZY-ALL", "ls"):
            assert c.record(cmd, session="s")["stored"]
        for name in learned + kept:
            (data / name).parent.mkdir(parents=True, exist_ok=True)
            (data / name).write_text(f"XYZZY-ALL {name}\n")
        (cache / "kernels").mkdir(parents=True)
        (cache / "kernels" / "scan.so").write_bytes(b"\0")

        def forget(*args: str) -> subprocess.CompletedProcess[str]:
            argv = [str(BIN / "calm"), "forget", "--all", *args]
            return subprocess.run(argv, env=daemon_env(tmp_path, **env), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=HANG_S)  # fmt: skip

        asked = forget()  # no terminal to ask on
        assert asked.returncode == 1 and "--yes" in asked.stderr and "Traceback" not in asked.stderr
        dry = forget("--dry-run")
        assert dry.returncode == 0 and "4 stored commands" in dry.stdout and paths.WEIGHTS in dry.stdout
        with TrainingLock(data) as lock:
            assert lock.acquire()
            held = forget("--yes")
            assert held.returncode == 1 and "training run" in held.stderr
        assert c.status()["status"]["history"]["commands"] == 4 and (data / paths.WEIGHTS).exists()

        done = forget("--yes")
        assert done.returncode == 0, done.stderr
        assert "forgot 4 commands" in done.stdout and "packaged model" in done.stdout
        status = c.status()["status"]
        assert status["history"]["commands"] == 0 and status["model"]["path"] == str(paths.packaged_weights())
        assert not (data / paths.WEIGHTS).exists() and not cache.exists()
        assert [name for name in learned if (data / name).exists()] == []
        assert [name for name in kept if (data / name).exists()] == kept
        raw = b"".join(p.read_bytes() for p in data.glob(paths.HISTORY + "*"))
        assert b"XYZZY" not in raw and b"git status" not in raw
        assert "XYZZY" not in "".join(candidates(c, "", session="s") + candidates(c, "deploy", session="s"))
    with running_daemon(tmp_path, env=env) as d, CalmClient(d.socket) as c:  # nothing imported again
        assert wait_imported(c)["history"]["commands"] == 0


@pytest.mark.needs("tmux")
def test_calm_forget_all_asks_on_a_terminal(tmp_path: Path) -> None:
    from tests.support.tmux import Terminal

    store = HistoryStore(tmp_path / "data" / paths.HISTORY)
    store.record("git status", session="s")
    store.close()
    env = daemon_env(tmp_path, CALM_CACHE=str(tmp_path / "cache"))
    with Terminal(["bash", "--norc", "--noprofile"], env, cwd=tmp_path) as term:
        term.type(f"PS1='$ '; {BIN / 'calm'} forget --all; echo status=$?")
        term.send("Enter")
        term.wait_for(r"delete all of it\? \[y/N\]\s*$")
        term.type("n")
        term.send("Enter")
        term.wait_for(r"nothing deleted\nstatus=1")
        term.type(f"{BIN / 'calm'} forget --all; echo status=$?")
        term.send("Enter")
        term.wait_for(r"delete all of it\? \[y/N\]\s*$")
        term.type("y")
        term.send("Enter")
        term.wait_for(r"forgot 1 command[\s\S]*status=0")
    store = HistoryStore(tmp_path / "data" / paths.HISTORY)
    assert store.count() == 0
    store.close()


@pytest.mark.parametrize("frames", [1, 3, HISTORY_FRAMES])
def test_datasets_see_the_context_the_daemon_reads_from_the_store(tmp_path: Path, frames: int) -> None:
    """Training sees what serving sees: replaying the history in order (the datasets) gives, before
    each command, the rows the store's query gives the daemon at that moment."""
    rng = random.Random(frames)
    store = HistoryStore(tmp_path / "h.sqlite3")
    tracker = ContextTracker(frames)
    sessions = ["a", "b", "c", "import"]
    for i in range(300):
        session = rng.choice(sessions[: 1 + i // 40])  # sessions appear one after another
        served = [r.id for r in recent_context(store, session, frames)]
        trained = [r.id for r in tracker.before(session)]  # type: ignore[attr-defined]
        assert trained == served, (i, session)
        store.record(f"cmd {i}", session=session, exit=0)
        tracker.add(store.recent(limit=1)[0])
    store.close()


def test_a_record_waits_for_another_process_writing_the_store(store: HistoryStore) -> None:
    """The daemon records while its worker process imports into the same file: a record begun
    while the other writer holds the store waits for it and is stored (it failed with "database is
    locked" when its transaction read a snapshot the other's commit outdated)."""
    import threading
    import time

    other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO meta (key, value) VALUES ('other-writer', '1')")

    def commit_later() -> None:
        time.sleep(0.3)
        other.execute("COMMIT")

    committer = threading.Thread(target=commit_later)
    committer.start()
    try:
        assert store.record("make test", exit=0, session="s").stored
    finally:
        committer.join()
        other.close()
    assert [e.cmd for e in store.recent(limit=5)] == ["make test"]
