"""The SQLite history store: filters, queries, and importing real bash and zsh history files."""

from __future__ import annotations

import csv
import sqlite3
import stat
from pathlib import Path

import pytest

from calmd.history import HistoryStore, detect_format, parse_history, unmetafy


@pytest.fixture
def store(tmp_path: Path) -> HistoryStore:
    return HistoryStore(tmp_path / "data" / "history.sqlite3")


def test_record_and_filters(store: HistoryStore) -> None:
    assert store.record("git status", exit=0, cwd="/p", git="main", session="s1").stored
    assert store.record(" secret-ish thing", session="s1").reason == "leading-space"
    assert store.record("   ", session="s1").reason == "empty"
    verdict = store.record("mysql -u root -phunter2", session="s1")
    assert not verdict.stored and verdict.reason == "secret:mysql-password"
    assert store.count() == 1
    assert store.counter("dropped_secrets") == 1
    (row,) = store.recent()
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


def test_prev_cmd_is_per_session(store: HistoryStore) -> None:
    store.record("cd proj", session="a")
    store.record("vim x", session="b")
    store.record("make", session="a")
    rows = store.recent(limit=10)
    assert [(r.cmd, r.prev_cmd) for r in rows] == [("cd proj", ""), ("vim x", ""), ("make", "cd proj")]


def test_recent_prefers_session_then_tops_up(store: HistoryStore) -> None:
    for i in range(5):
        store.record(f"a{i}", session="A", ts=100 + i)
        store.record(f"b{i}", session="B", ts=200 + i)
    assert [r.cmd for r in store.recent(session="A", limit=3)] == ["a2", "a3", "a4"]
    # all five of A last (nearest the prediction), after the newest two of the others
    assert [r.cmd for r in store.recent(session="A", limit=7)] == ["b3", "b4", "a0", "a1", "a2", "a3", "a4"]
    assert [r.cmd for r in store.recent(limit=2)] == ["a4", "b4"]


def test_prefix_matches(store: HistoryStore) -> None:
    for cmd in ["git status", "git stash", "git status", "Git Status", "ls", "git_x%"]:
        store.record(cmd)
    matches = store.prefix_matches("git st")
    assert [(c, n) for c, n, _ in matches] == [("git status", 2), ("git stash", 1)]
    assert [c for c, _, _ in store.prefix_matches("git_")] == ["git_x%"]  # LIKE wildcards escaped
    assert store.prefix_matches("nothing") == []


def test_parse_bash_with_timestamps() -> None:
    raw = b"ls\n#1700000000\ngit status\n#1700000100\nmake -j2\n"
    assert list(parse_history(raw, "bash")) == [(None, "ls"), (1700000000.0, "git status"),
                                                 (1700000100.0, "make -j2")]  # fmt: skip
    assert detect_format(raw) == "bash"


def test_parse_zsh_extended_multiline_and_metafied() -> None:
    raw = (
        b": 1700000000:0;git status\n"
        b": 1700000005:3;for f in *; do\\\n  echo $f\\\ndone\n"
        b": 1700000009:0;echo caf\x83\xe3\n"  # metafied byte: 0x83 then 0xC3 ^ 0x20
        b": 1700000010:0;ls\n"
    )
    entries = list(parse_history(raw, "zsh"))
    assert detect_format(raw) == "zsh"
    assert entries[0] == (1700000000.0, "git status")
    assert entries[1] == (1700000005.0, "for f in *; do\n  echo $f\ndone")
    assert entries[2][1].encode("utf-8", "surrogateescape") == b"echo caf\xc3"
    assert entries[3] == (1700000010.0, "ls")
    assert unmetafy(b"a\x83\xa9b") == b"a\x89b"


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


HISTORIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "histories"


@pytest.mark.skipif(not HISTORIES.is_dir(), reason="shared/data not beside the repo")
def test_import_public_histories(tmp_path: Path) -> None:
    """Every command of ten real users' files arrives, in order; the counts add up per file."""
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


def test_followers_and_cwd_queries(store: HistoryStore) -> None:
    for session in ("a", "b", "c"):
        store.record("git add -A", session=session, cwd="/repo")
        store.record("git commit -m wip" if session != "c" else "git status", session=session, cwd="/repo")
    store.record("git commit -m other", session="d", cwd="/tmp")
    assert store.followers("git add -A") == [("git commit -m wip", 2), ("git status", 1)]
    assert store.followers("git add -A", prefix="git s") == [("git status", 1)]
    assert store.followers("nothing") == []
    assert store.in_cwd("/repo", prefix="git c") == ["git commit -m wip"]
    assert store.in_cwd("/tmp") == ["git commit -m other"]
