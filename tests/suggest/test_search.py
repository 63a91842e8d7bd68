"""The history search's index (calmd/suggest/search.py): matching, filter modes, ranking, secrets,
following the store; and its replay (`calm replay --search`). The daemon's `search` op is tested
over a real socket in test_daemon_search.py, the terminal UI in the shells' tests."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmd import paths
from calmd.cli import calm_main
from calmd.errors import FormatError
from calmd.history import query
from calmd.history.store import HistoryStore
from calmd.quality.search_replay import follow_cd, search_query
from calmd.suggest.search import FAILED_PENALTY, Context, SearchIndex
from calmd.suggest.search_match import parse_query
from calmd.suggest.search_ranker import SEARCH_FEATURES, SearchRanker, packaged_search_ranker


def index_of(*rows: str | tuple[str, dict[str, object]]) -> SearchIndex:
    index = SearchIndex()
    for i, row in enumerate(rows):
        cmd, extra = (row, {}) if isinstance(row, str) else row
        index.add(cmd, **{"session": "s1", "exit": 0, "ts": 1000.0 + i, "cwd": "/home/u", **extra})  # type: ignore[arg-type]
    return index


def found(index: SearchIndex, text: str, mode: str = "global", ctx: Context | None = None) -> set[str]:
    matches, _ = index.matches(text, mode, ctx or Context())
    return {index.texts[i] for i in matches.ids}


def test_terms_match_in_any_order_ignoring_case_as_typed_or_scattered() -> None:
    index = index_of("git checkout main", "git commit -m 'Fix parser'", "docker compose up", "make test")
    assert found(index, "git") == {"git checkout main", "git commit -m 'Fix parser'"}
    assert found(index, "main checkout") == {"git checkout main"}  # any order
    assert found(index, "FIX") == {"git commit -m 'Fix parser'"}  # any case
    assert found(index, "gco") == {"git checkout main", "git commit -m 'Fix parser'"}  # scattered
    assert found(index, "dcu") == {"docker compose up"}
    assert found(index, "gco main") == {"git checkout main"}
    assert found(index, "zzz") == set()
    assert found(index, "") == set(index.texts)
    assert found(index, "make  ") == {"make test"}  # spaces separate terms, nothing more


def test_how_a_command_matched() -> None:
    index = index_of("git push origin main", "echo git-push", "legit pusher", "gxixt")
    matches, _ = index.matches("git pu")
    by_text = {index.texts[i]: k for k, i in enumerate(matches.ids)}
    push, echo, legit = by_text["git push origin main"], by_text["echo git-push"], by_text["legit pusher"]
    assert matches.prefix[push] and matches.first_word[push]
    assert not matches.prefix[echo] and not matches.prefix[legit]
    # `git` after the start or a space, `pu` after a space or `-`
    assert matches.word_starts[push] == 1.0 and matches.word_starts[echo] == 1.0
    assert matches.word_starts[legit] == 0.5  # `git` inside `legit`
    assert list(matches.substrings[[push, echo, legit]]) == [1.0, 1.0, 1.0]
    assert "gxixt" not in by_text  # `git` scattered, but no `pu`
    scattered, _ = index.matches("gxt")
    assert {index.texts[i] for i in scattered.ids} == {"gxixt"}
    assert scattered.substrings[0] == 0.0 and scattered.gap[0] == 2.0  # `x` then `i` skipped... two letters


# A reference matcher: every term, lowercased, is a substring or a subsequence of the command.
def reference(commands: list[str], text: str) -> set[str]:
    def subsequence(term: bytes, line: bytes) -> bool:
        it = iter(line)
        return all(b in it for b in term)

    terms = parse_query(text)
    return {c for c in commands
            if all(subsequence(t, c.lower().encode().replace(b"\n", b" ")) for t in terms)}  # fmt: skip


words = st.sampled_from(["git", "push", "gp", "Make", "te", "st", "ls", "-la", "Ü", "x/y", "a", "status"])


@settings(max_examples=150, deadline=None)
@given(commands=st.lists(st.lists(words, min_size=1, max_size=4).map(" ".join), min_size=1, max_size=25),
       typed=st.lists(st.sampled_from(list("gitpusa m-/") + ["ü"]), max_size=7))  # fmt: skip
def test_matching_agrees_with_a_plain_matcher_while_typing(commands: list[str], typed: list[str]) -> None:
    """Typed one character at a time (each search narrowing the last), the index finds what a
    plain loop over the commands finds."""
    index = index_of(*commands)
    for k in range(len(typed) + 1):
        text = "".join(typed[:k])
        assert found(index, text) == reference(commands, text), text


def test_filter_modes_and_the_latest_run_in_scope() -> None:
    index = index_of(
        ("make build", {"cwd": "/src/a", "session": "s1", "exit": 2, "ts": 10.0}),
        ("make test", {"cwd": "/src/a", "session": "s2", "exit": 0, "ts": 20.0}),
        ("make build", {"cwd": "/src/b", "session": "s2", "exit": 0, "ts": 30.0}),
        ("make lint", {"cwd": "/src/b", "session": "s1", "exit": 1, "ts": 40.0}),
        ("make lint", {"cwd": "/src/b", "session": "s1", "exit": 1, "ts": 50.0}),
    )
    here = Context(cwd="/src/a", session="s1")
    assert found(index, "make", "global", here) == {"make build", "make test", "make lint"}
    assert found(index, "make", "folder", here) == {"make build", "make test"}
    assert found(index, "make", "session", here) == {"make build", "make lint"}
    assert found(index, "make", "success", here) == {"make build", "make test"}  # lint never succeeded
    build = index.search("make build", "folder", here).results[0]
    assert (build.cmd, build.ts, build.cwd, build.exit) == ("make build", 10.0, "/src/a", 2)
    results = {r.cmd: r for r in index.search("make", "global", here).results}
    assert (results["make build"].ts, results["make build"].exit, results["make build"].runs) == (30.0, 0, 2)
    assert results["make lint"].failing and not results["make build"].failing
    assert index.search("make", "folder", Context(cwd="/nowhere")).results == []


def test_context_ranks_what_follows_above_what_was_just_run() -> None:
    """The user commits after adding, every time; having just added, "git" finds the commit
    first, where recency would offer the `git add .` just run (atuin's order)."""
    rows = []
    for i in range(12):
        rows += ["vim notes.txt", "git add .", f"git commit -m 'notes {i}'" if i < 6 else "git commit -m wip",
                 "git push", "git status"]  # fmt: skip
    index = index_of(*rows, "vim notes.txt", "git add .")
    ctx = Context("/home/u", "s1", ("vim notes.txt", "git add ."))
    matches, scope = index.matches("git", "global", ctx)
    assert index.texts[index.recency_order(matches, scope)[0]] == "git add ."
    assert index.search("git", "global", ctx).results[0].cmd == "git commit -m wip"


def test_a_command_that_never_succeeded_goes_down() -> None:
    typo: tuple[str, dict[str, object]] = ("cargo biuld", {"exit": 101})
    rows = [typo, ("cargo build", {"exit": 0})] * 3 + [typo]
    index = index_of(*rows)
    matches, scope = index.matches("cargo")
    assert index.texts[index.recency_order(matches, scope)[0]] == "cargo biuld"  # the latest
    ranked = [r.cmd for r in index.search("cargo").results]
    assert ranked == ["cargo build", "cargo biuld"]
    assert FAILED_PENALTY > 0


def test_forgotten_commands_are_never_shown_and_come_back_when_run_again() -> None:
    index = index_of("ls -la", "rm -rf build", "ls")
    assert index.forget("rm -rf build") and not index.forget("rm -rf build")
    assert found(index, "rm") == set() and found(index, "") == {"ls -la", "ls"}
    assert [r.cmd for r in index.search("").results if r.cmd.startswith("rm")] == []
    index.add("rm -rf build", "s1", 0, 2000.0, "/home/u")
    assert found(index, "rm") == {"rm -rf build"}


def test_the_index_follows_the_store_and_starts_over_after_a_deletion(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / paths.HISTORY)
    store.record("ls", exit=0, cwd="/a", session="s")
    store.record("git status", exit=1, cwd="/a", session="s")
    db = query.open_read_only(store.path)
    index = SearchIndex()
    assert index.sync(db) == 2 and index.sync(db) == 0
    store.record("git push", exit=0, cwd="/b", session="s")
    assert index.sync(db) == 1 and found(index, "git") == {"git status", "git push"}
    result = index.search("status").results[0]
    assert (result.cwd, result.exit) == ("/a", 1)
    store.forget(lambda cmd: "status" in cmd)  # `calm forget`, in another process as far as the index knows
    index.sync(db)
    assert found(index, "git") == {"git push"} and len(index) == 2
    assert store.forget_command("git push") == (1, 1) and store.count() == 1  # the row left: the first
    db.close()
    store.close()


def test_a_sync_never_chases_an_import_and_starts_over_after_a_big_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search during the first-start import read on while the import added rows (issue 30): a
    sync reads what there is when it starts; more than SEARCH_LIMIT new rows, and it reads the
    newest SEARCH_LIMIT rather than all of them."""
    from calmd.suggest import search as search_module

    store = HistoryStore(tmp_path / paths.HISTORY)
    for i in range(30):
        store.record(f"typed {i}", exit=0, session="s")
    db = query.open_read_only(store.path)
    rows_after = query.rows_after
    imported = [0]

    def importing(conn: sqlite3.Connection, after: int, limit: int = query.BATCH) -> list[tuple[object, ...]]:
        rows = rows_after(conn, after, limit)
        if imported[0] < 2000:  # the import goes on while the index reads
            for _ in range(50):
                imported[0] += 1
                store.record(f"imported {imported[0]}", session="import")
        return rows

    monkeypatch.setattr(query, "rows_after", importing)
    index = SearchIndex()
    for _ in range(3):
        there = store.count()
        index.sync(db)
        assert len(index) == there < store.count()
    monkeypatch.setattr(query, "rows_after", rows_after)
    monkeypatch.setattr(search_module, "SEARCH_LIMIT", 100)
    for i in range(150):
        store.record(f"bulk {i}", session="import")
    index.sync(db)
    assert len(index) == 100 and found(index, "bulk 149") and not found(index, "typed 5")
    db.close()
    store.close()


def test_a_sync_reads_every_batch_up_to_the_newest_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index reads the store a batch at a time (query.BATCH rows) up to the newest row there
    was when it began, and each row keeps its host (`host` mode: this machine's). The merge of
    issue 33 into issue 30's bounded sync once let a loop variable shadow that newest row: the
    index stopped after its first batch (20,000 rows) and never saw the rest."""
    store = HistoryStore(tmp_path / paths.HISTORY)
    for i in range(30):
        store.record(f"typed {i}", exit=0, session="s")
    with store.writing() as conn:  # one record synced from another machine (calmd/sync/)
        conn.execute("INSERT INTO commands (ts, session, cmd, host, origin, origin_id) "
                     "VALUES (2000, 'x:s', 'typed far', 'desktop', '0123456789abcdef', 1)")  # fmt: skip
    rows_after = query.rows_after
    monkeypatch.setattr(query, "rows_after", lambda conn, after, limit=7: rows_after(conn, after, 7))
    db = query.open_read_only(store.path)
    index = SearchIndex()
    assert index.sync(db) == 31 and len(index) == 31
    assert found(index, "typed 29") and found(index, "typed far")
    assert "typed far" not in found(index, "typed", "host") and "typed 29" in found(index, "typed", "host")
    db.close()
    store.close()


def test_a_line_the_detector_flags_is_never_shown(tmp_path: Path) -> None:
    """A row stored before the credential detector knew its rule (the daemon re-scans at its
    next start) stays out of the search's answers meanwhile."""
    store = HistoryStore(tmp_path / paths.HISTORY)
    store.record("curl -s https://example.com", exit=0, session="s")
    with sqlite3.connect(store.path) as raw:  # as an older calmd stored it
        raw.execute(
            "INSERT INTO commands (ts, cmd, exit) VALUES (1, ?, 0)",
            ("curl -u admin:hunter2x9 https://example.com",),
        )
    db = query.open_read_only(store.path)
    index = SearchIndex()
    index.sync(db)
    assert len(found(index, "curl")) == 2
    shown = [r.cmd for r in index.search("curl").results]
    assert shown == ["curl -s https://example.com"]
    db.close()
    store.close()


def test_a_line_that_would_drive_the_terminal_is_never_answered() -> None:
    """As for every candidate (docs/protocol.md): an escape sequence recorded in a command stays in
    the store (`calm forget` removes it) and never reaches a terminal through the search."""
    index = index_of("printf '\x1b]0;PWNED\x07'", "printf 'hello'", "for f in *\ndo echo $f\ndone")
    assert len(found(index, "printf")) == 2
    assert [r.cmd for r in index.search("printf").results] == ["printf 'hello'"]
    loop = "for f in *\ndo echo $f\ndone"
    assert [r.cmd for r in index.search("done").results] == [loop]  # a multi-line command's newlines: fine


def test_the_packaged_search_ranker_loads_and_bad_files_are_refused(tmp_path: Path) -> None:
    ranker = packaged_search_ranker()
    assert ranker.mean.shape == (len(SEARCH_FEATURES),) and ranker.info["training_users"] > 0
    data = ranker.to_json()
    assert SearchRanker.from_json(json.loads(json.dumps(data))).b2 == pytest.approx(ranker.b2)
    for broken, message in (
        ({**data, "format": "x"}, "not a calm-search-ranker"),
        ({**data, "version": 99}, "version 99"),
        ({**data, "features": ["ranker"]}, "features differ"),
        ({**data, "w2": [1.0]}, "shape"),
        ({**data, "b2": float("nan")}, "not finite"),
        ({**data, "scale": [0.0] * len(SEARCH_FEATURES)}, "positive"),
        ({k: v for k, v in data.items() if k != "mean"}, "missing field .mean."),
    ):
        with pytest.raises(FormatError, match=message):
            SearchRanker.from_json(broken, "r.json")
    assert np.all(SearchRanker.neutral().scores(np.ones((3, len(SEARCH_FEATURES)))) == 0)


# --------------------------------------------------------------------------- the replay


def test_follow_cd_tracks_the_folder_of_the_next_line() -> None:
    assert follow_cd("/home/user", "cd src/app") == "/home/user/src/app"
    assert follow_cd("/home/user/src", "cd ..") == "/home/user"
    assert follow_cd("/tmp", "cd") == "/home/user" and follow_cd("/tmp", "cd ~/x") == "/home/user/x"
    assert follow_cd("/tmp", "mkdir build && cd build && cmake ..") == "/tmp/build"
    assert follow_cd("/a", "cd -", previous="/b") == "/b"
    assert follow_cd("/a", "cd $HOME/x") == "/a" and follow_cd("/a", "ls src") == "/a"
    assert follow_cd("/a", "cd '/srv/www'") == "/srv/www"


def test_the_simulated_user_types_the_first_word_or_the_rarest_fragment() -> None:
    past = ["kubectl get pods", "kubectl apply -f deploy.yaml", "kubectl logs web"]
    cmd = "kubectl --context production apply -f deploy.yaml"
    assert search_query(cmd, "first_word", past) == "kubectl"
    assert search_query(cmd, "fragment", past) == "produc"  # in none of the past lines, the longest such
    assert search_query("ls -l", "fragment", past) is None  # no word of 3 characters after the first


def test_calm_replay_search_ranks_the_right_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A user with a fixed routine: calmd's order finds the next line first more often than
    recency; the table and the JSON say so."""
    lines = []
    for i in range(40):
        lines += ["cd ~/src/api", "git pull", f"vim handlers/h{i % 3}.go", "go test ./...", "git add -A",
                  "git commit -m wip", "git push", "cd ~"]  # fmt: skip
    (tmp_path / "routine.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "search.json"
    assert calm_main(["replay", str(tmp_path / "routine.txt"), "--search", "--positions", "60", "-q",
                      "--json", str(out)]) == 0  # fmt: skip
    table = capsys.readouterr().out
    assert re.search(r"first_word\s+calmd - recency\s+\+\d", table)
    totals = json.loads(out.read_text())["totals"]["first_word"]
    assert totals["queries"] > 40 and totals["unseen"] == 0
    assert totals["calmd"]["top1"] > totals["recency"]["top1"] + 0.2
    assert totals["calmd"]["mrr"] >= totals["frequency"]["mrr"]
