"""The learned history ranker: the index it reads, its weight file, fitting, and the packaged weights."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmd import paths
from calmd.errors import FormatError
from calmd.history.store import HistoryStore
from calmd.quality.fit_ranker import Query, fit, replay_queries, top1
from calmd.suggest.carry import CarryPrior, carry_line, split_carry
from calmd.suggest.ranker import Ranker, packaged_ranker, serving_ranker
from calmd.suggest.ranking import FEATURES, POOL_FOLLOWERS, POOL_RECENT, HistoryIndex


def feature(rows: np.ndarray, j: int, name: str) -> float:
    return float(rows[j, FEATURES.index(name)])


def test_transitions_are_per_session_and_distances_global() -> None:
    index = HistoryIndex()
    # two shells interleaved: A runs make -> ./run, B runs ls -> cd
    for cmd, session in [("make", "A"), ("ls", "B"), ("./run", "A"), ("cd src", "B"), ("make", "A")]:
        index.add(cmd, session)
    assert index.follows["make"] == {"./run": 1}
    assert index.follows["ls"] == {"cd src": 1}
    assert "ls" not in index.follows.get("make", {})
    pool = index.pool("", "make")
    assert pool[:4] == ["make", "cd src", "./run", "ls"]  # most recent distinct first
    rows = index.features("", pool, ["./run", "make"])
    run = pool.index("./run")
    assert feature(rows, run, "followed_prev_last_time") == 1.0
    assert feature(rows, run, "p_follows_prev") == 1.0
    assert feature(rows, run, "distance_is_2") == 1.0  # ./run, cd src, make: two commands since
    assert feature(rows, pool.index("make"), "is_last") == 1.0
    assert feature(rows, pool.index("ls"), "p_follows_prev") == 0.0


def test_pool_extends_the_input_and_adds_the_previous_commands_followers() -> None:
    index = HistoryIndex()
    for i in range(60):
        index.add(f"git commit -m {i}")
    index.add("git status")
    index.add("make")
    index.add("git push")  # followed make once, long ago in pool terms
    for i in range(60, 100):
        index.add(f"git commit -m {i}")
    pool = index.pool("git ", "make", size=10)
    assert len(pool) == 11 and pool[-1] == "git push"  # 10 recent + the follower of make
    assert all(c.startswith("git ") for c in pool)
    assert index.pool("git push", "make") == []  # the input itself is not a completion


def test_pool_keeps_only_the_most_frequent_followers_of_the_previous_command() -> None:
    index = HistoryIndex()
    for i in range(300):  # "ls" was followed by 300 different commands, "make" by the same one 3 times
        index.add("ls")
        index.add(f"cat file{i}" if i % 100 else "make")
    for _ in range(60):
        index.add("pwd")  # pushes every follower out of the 40 most recent
    index.add("ls")
    pool = index.pool("", "ls", carry=False)
    assert len(pool) <= POOL_RECENT + POOL_FOLLOWERS  # not 300: features for thousands cost tens of ms
    assert "make" in pool  # the most frequent follower is kept


def test_split_carry_finds_the_words_reused_from_the_previous_command() -> None:
    assert split_carry("mkdir foo", "cd foo") == ("mkdir", "cd", 1)
    assert split_carry("sudo pacman -Ss vim", "sudo pacman -S vim") == (
        "sudo pacman -Ss",
        "sudo pacman -S",
        1,
    )
    assert split_carry("cp a.txt b.txt", "vim a.txt b.txt") == ("cp", "vim", 2)  # the longest tail
    assert split_carry("mkdir foo", "mkdir foo") is None  # a repeat is not a carry-over
    assert split_carry("git add x", "x") is None  # nothing left of a head
    assert split_carry("ls", "cd src") is None


def _mkdir_cd_habit() -> tuple[HistoryIndex, list[str]]:
    index = HistoryIndex()
    history: list[str] = []
    for name in ["alpha", "beta", "gamma", "delta"]:
        history += [f"mkdir {name}", f"cd {name}", "git init", "vim README.md", "cd .."]
    history += ["ls", "mkdir newproj"]
    for cmd in history:
        index.add(cmd)
    return index, history


def test_carryovers_are_new_lines_with_the_users_habits_first() -> None:
    index, history = _mkdir_cd_habit()
    assert index.carry_patterns["mkdir"] == {"cd": 4}
    new = index.carryovers("", "mkdir newproj")
    assert new[0] == "cd newproj"  # the habit, before heads that are merely frequent
    assert all(c.endswith(" newproj") and c not in history for c in new)
    assert index.carryovers("g", "mkdir newproj") == ["git newproj"]  # only lines extending the input
    assert index.carryovers("", "ls") == []  # nothing to carry from a one-word command
    pool = index.pool("cd ", "mkdir newproj")
    assert "cd newproj" in pool and "cd alpha" in pool
    rows = index.features("cd ", pool, history[-5:])
    new_row, old_row = pool.index("cd newproj"), pool.index("cd alpha")
    assert feature(rows, new_row, "is_carryover") == 1.0 and feature(rows, old_row, "is_carryover") == 0.0
    assert feature(rows, new_row, "log_carry_pattern") == pytest.approx(np.log1p(4))
    assert feature(rows, old_row, "log_carry_pattern") == 0.0  # "cd alpha" carries nothing of "mkdir newproj"


def test_a_carry_over_may_go_on_as_a_path() -> None:
    assert split_carry("python3 -m venv .venv", "source .venv/bin/activate") == (
        "python3 -m venv", "source {}/bin/activate", 1,
    )  # fmt: skip
    assert carry_line("source {}/bin/activate", "env/") == "source env/bin/activate"
    assert carry_line("cd", "newproj") == "cd newproj"
    assert split_carry("ls x", "ls x") is None


def test_a_carry_over_never_says_a_word_twice() -> None:
    index = HistoryIndex()
    for cmd in ["git status", "git status -s", "git add x", "git status -s"]:
        index.add(cmd)
    new = index.carryovers("git ", "git status -s")
    assert "git status status -s" not in new and "git add -s" in new


def test_other_users_habits_propose_and_rank_carry_overs_a_new_user_never_made() -> None:
    history = ["mkdir a", "cd a", "python3 -m venv env", "source env/bin/activate", "mkdir b", "cd b",
               "python3 -m venv e2", "source e2/bin/activate"]  # fmt: skip
    users = [(name, CarryPrior.count(history)) for name in ("u1", "u2")]
    prior = CarryPrior.total(users)
    assert prior.carries["mkdir"] == {"cd": 4} and prior.share("mkdir", "cd") == 1.0
    assert prior.carries["python3 -m venv"] == {"source {}/bin/activate": 4}
    assert CarryPrior.total(users[:1]).carries == {}  # one user's habit is no prior
    index = HistoryIndex(prior)
    for cmd in ["source .venv/bin/activate", *[f"ls {i}" for i in range(60)], "cd src", "git status"]:
        index.add(cmd)  # this user never went from mkdir to cd
    index.add("mkdir newproj")
    pool = index.pool("", "mkdir newproj")
    assert index.carryovers("", "mkdir newproj")[0] == "cd newproj"
    rows = index.features("", pool, ["git status", "mkdir newproj"])
    assert feature(rows, pool.index("cd newproj"), "corpus_carry_share") == 1.0
    assert feature(rows, pool.index("git status"), "corpus_carry_share") == 0.0
    # a line run long ago, out of the recent commands, comes back through the habit
    assert "source .venv/bin/activate" in index.pool("", "python3 -m venv .venv")


def test_packaged_ranker_knows_common_carry_over_habits() -> None:
    prior = packaged_ranker().prior
    assert prior.share("mkdir", "cd") > 0.2  # a third of the time, in the training users' histories
    assert prior.heads_after("python3 -m venv")[0][0] == "source {}/bin/activate"


def test_packaged_ranker_follows_a_carry_over_habit() -> None:
    index, history = _mkdir_cd_habit()
    ranker = packaged_ranker()
    for typed in ("", "c", "cd "):
        pool = index.pool(typed, history[-1])
        best = pool[int(np.argmax(ranker.scores(index.features(typed, pool, history[-5:]))))]
        assert best == "cd newproj", typed  # a line never run before, from the user's mkdir -> cd habit


def test_context_match_finds_the_longest_matching_run() -> None:
    index = HistoryIndex()
    for cmd in ["a", "b", "c", "x", "b", "d", "a", "b"]:
        index.add(cmd)
    matches = index.context_match(["a", "b"])
    assert matches == {"c": 2, "d": 1}  # "a b" was followed by c; "x b" by d


def test_sync_follows_the_store_incrementally(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    index = HistoryIndex()
    store.record("ls", session="s")
    store.record("make", session="s")
    assert index.sync(store) == 2
    store.record("./run", session="s")
    store.record(" secret", session="s")  # leading space: never stored, never indexed
    assert index.sync(store) == 1
    assert index.sync(store) == 0
    assert index.commands == ["ls", "make", "./run"]
    assert index.follows["make"] == {"./run": 1}
    store.close()


def test_the_index_keeps_exit_codes_and_times_from_the_store(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    index = HistoryIndex()
    store.record("git status", exit=0, session="s", ts=1000.0)
    store.record("gti status", exit=127, session="s", ts=1060.0)
    store.record("(exit 3)", exit=3, session="s", ts=1120.0)
    store.record("grep x f", exit=1, session="s", ts=1180.0)
    store.record("grep x f", exit=0, session="s", ts=1240.0)
    store.record("old import", exit=None, session="i", ts=10.0)  # imported files carry no status
    store.record("bash setup.sh", exit=0, session="s", ts=20.0)
    index.sync(store)
    assert not index.failing("git status") and not index.failing("old import")
    assert index.failing("gti status") and index.failing("(exit 3)")  # never succeeded
    assert not index.failing("grep x f")  # failed once, then succeeded
    assert index.failing("gti log")  # a command name that was not found, whatever follows it
    assert index.last_ts["grep x f"] == 1240.0 and index.newest_ts == 1240.0
    store.record("gti status", exit=0, session="s", ts=1300.0)  # installed an alias since
    index.sync(store)
    assert not index.failing("gti log") and not index.failing("gti status")
    store.record("git status", exit=127, session="s", ts=1360.0)  # git was uninstalled
    store.record("bash broken.sh", exit=127, session="s", ts=1420.0)  # a script's own "not found"
    index.sync(store)
    assert index.failing("git status")  # its latest run was "not found", although it once worked
    assert not index.failing("git log")  # git did work before: only that line is demoted
    assert index.failing("bash broken.sh") and not index.failing("bash other.sh")
    store.close()


def test_reusing_the_previous_commands_arguments_is_a_feature() -> None:
    index = HistoryIndex()
    for cmd in ["source .venv/bin/activate", "ls", "cd src", "python3 -m venv .venv", "vim x"]:
        index.add(cmd)
    pool = index.pool("", "python3 -m venv .venv")
    rows = index.features("", pool, ["python3 -m venv .venv"])
    assert feature(rows, pool.index("source .venv/bin/activate"), "reuses_prev_argument") == 1.0
    assert feature(rows, pool.index("cd src"), "reuses_prev_argument") == 0.0
    assert feature(rows, pool.index("ls"), "reuses_prev_argument") == 0.0


def _cyclic_history(cycles: int) -> list[str]:
    """A user who edits, builds and runs in a loop, with unrelated commands in between."""
    commands: list[str] = []
    for i in range(cycles):
        commands += ["vim main.c", "make", "./main", f"echo note {i % 7}", "ls"]
    return commands


def test_fit_learns_what_follows_what() -> None:
    queries = replay_queries(_cyclic_history(60), positions=150, seed="fit")
    ranker, loss = fit(queries, hidden=8, steps=200)
    assert np.isfinite(loss)
    scores = top1(ranker, queries)
    assert scores[0] > 0.9  # the next command of a fixed loop is predictable from its predecessor
    untrained = Ranker(ranker.mean, ranker.scale, np.zeros_like(ranker.w1), ranker.b1, ranker.w2, 0.0, {})
    assert top1(untrained, queries)[0] < 0.5  # and a ranker that ignores the features is not


def test_packaged_ranker_predicts_the_loop_and_beats_recency() -> None:
    ranker = packaged_ranker()
    index = HistoryIndex()
    history = _cyclic_history(20)
    for cmd in history:
        index.add(cmd)
    context = history[-5:]  # ... "./main", "echo note 5", "ls"
    pool = index.pool("", context[-1])
    best = pool[int(np.argmax(ranker.scores(index.features("", pool, context))))]
    assert best == "vim main.c"  # not the most recent command ("ls") nor the most frequent
    probs = ranker.probabilities(index.features("", pool, context))
    assert probs.sum() == pytest.approx(1.0) and (probs > 0).all()
    assert ranker.info["training_users"] > 0  # provenance travels with the weights


def test_ranker_json_round_trip_and_errors(tmp_path: Path) -> None:
    ranker = packaged_ranker()
    data = ranker.to_json()
    again = Ranker.from_json(json.loads(json.dumps(data)))
    rows = np.random.default_rng(0).normal(size=(5, len(FEATURES)))
    assert np.allclose(again.scores(rows), ranker.scores(rows))

    def broken(**change: object) -> dict[str, object]:
        return {**data, **change}

    with pytest.raises(FormatError, match="missing field 'w1'"):
        Ranker.from_json({k: v for k, v in data.items() if k != "w1"})
    with pytest.raises(FormatError, match="field 'w2' has shape"):
        Ranker.from_json(broken(w2=[1.0, 2.0]))
    with pytest.raises(FormatError, match="features differ"):
        Ranker.from_json(broken(features=list(FEATURES)[:-1]))
    with pytest.raises(FormatError, match="version"):
        Ranker.from_json(broken(version=99))
    with pytest.raises(FormatError, match="not finite"):
        Ranker.from_json(broken(b2=float("nan")))
    path = tmp_path / paths.RANKER
    path.write_text("{not json")
    with pytest.raises(FormatError, match=str(path)):
        Ranker.load(path)


def test_query_targets_are_found_in_the_pool() -> None:
    queries = replay_queries(_cyclic_history(30), positions=40, seed="q")
    assert queries and all(isinstance(q, Query) for q in queries)
    assert {q.k for q in queries} == {0, 1, 2, 4, 8}
    assert all(q.target >= 0 for q in queries)  # every command of the loop was seen in warm-up


def test_fitting_command_writes_a_loadable_ranker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from calmd.quality.fit_ranker import main

    users = tmp_path / "data" / "histories" / "users"
    users.mkdir(parents=True)
    for name in ("alice", "bob", "carol", "dave", "erin", "frank"):
        (users / f"{name}.txt").write_text("\n".join(_cyclic_history(25)) + "\n")
    out = tmp_path / paths.RANKER
    args = ["--data", str(tmp_path / "data"), "--output", str(out), "--positions", "30", "--steps", "50"]
    assert main(args) == 0
    ranker = Ranker.load(out)
    assert ranker.info["training_queries"] > 0
    assert ranker.info["command"].startswith("python -m calmd.quality.fit_ranker --data")
    assert "wrote" in capsys.readouterr().out
    assert not list(tmp_path.glob(".ranker.json.*"))  # the atomic write left no temp file


def test_first_sync_indexes_only_the_newest_commands(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    for i in range(30):
        store.record(f"echo {i}", session="s")
    index = HistoryIndex()
    assert index.sync(store, limit=10) == 10
    assert index.commands == [f"echo {i}" for i in range(20, 30)]
    store.record("echo new", session="s")
    assert index.sync(store, limit=10) == 1  # later syncs take everything new
    assert index.commands[-1] == "echo new"
    store.close()


def test_no_carry_over_from_a_multi_line_entry() -> None:
    """The words of a multi-line entry (a `for` loop written over three lines) joined by spaces
    after another command's head are no command: `git commit f in *.log; do gzip "$f" done`
    was offered for `git co` after such a loop."""
    index = HistoryIndex()
    for cmd in ("git commit -m fix", "git checkout main", "mkdir build", "cd build", "kubectl logs web"):
        index.add(cmd)
    loop = 'for f in *.log; do\n  gzip "$f"\ndone'
    index.add(loop)
    for typed in ("git co", "kubectl lo", "cd ", ""):
        pool = index.pool(typed, loop)
        assert not [c for c in pool if "gzip" in c and c != loop], (typed, pool)
    assert index.carryovers("cd ", "mkdir out") == ["cd out"]  # a one-line command still carries


def test_what_a_failed_run_typed_is_no_word_of_the_users_nor_a_head_to_carry() -> None:
    index = HistoryIndex()
    index.add("git comit log --oneline", exit=1)  # `git: 'comit' is not a git command`
    index.add("git log --oneline -10", exit=0)
    assert not index.vocabulary.has("git", "comit")  # the model's `git comit ...` stays invented
    assert index.vocabulary.has("git", "log")
    assert index.head_count("git comit") == 0 and index.head_count("git log") == 1
    assert "git comit --oneline -10" not in index.carryovers("git ", "git log --oneline -10")
    index.add("git comit log --oneline", exit=0)  # an alias made it work since
    assert index.vocabulary.has("git", "comit")


def test_the_index_knows_where_each_line_ran() -> None:
    index = HistoryIndex()
    index.add("git push origin feature/login", exit=0, cwd="/src/app", git="feature/login")
    index.add("git push origin main", exit=0, cwd="/src/app", git="feature/login")  # names another
    index.add("git status", exit=0, cwd="/src/app", git="main")
    index.add("git clone https://x/y.git", exit=0, cwd="/src", git="")
    index.add("ls", exit=0)  # an imported line: where is not known
    assert index.bound_branch == {"git push origin feature/login": "feature/login"}
    assert index.repo_only("git status") and index.repo_only("git push origin main")
    assert not index.repo_only("git clone https://x/y.git") and not index.repo_only("ls")
    index.add("git status", exit=0, cwd="/tmp", git="")  # run outside a repository once
    assert not index.repo_only("git status")


def test_the_users_ranker_serves_when_it_loads_and_the_packaged_one_otherwise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / paths.RANKER
    assert serving_ranker(path) == (packaged_ranker(), None)  # no file yet: nothing to say
    base = packaged_ranker()
    mine = Ranker(base.mean, base.scale, base.w1 * 0.5, base.b1, base.w2, base.b2,
                  {**base.info, "refit": {"examples": 123}}, base.prior)  # fmt: skip
    path.write_text(json.dumps(mine.to_json()))
    served, error = serving_ranker(path)
    assert error is None and served.info["refit"] == {"examples": 123}
    assert np.array_equal(served.w1, base.w1 * 0.5)
    foreign = {**mine.to_json(), "w1": [[1.0]]}  # another shape: not a ranker this calmd reads
    too_big = b" " * (5 << 20)
    for content in (b"{not json", b"\xff\xfe", json.dumps(foreign).encode(), b"[" * 100_000, too_big):
        path.write_bytes(content)
        caplog.clear()
        served, error = serving_ranker(path)
        assert served is packaged_ranker() and error is not None and str(path) in error
        assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1  # one line in the log
    path.unlink()
    os.mkfifo(path)  # read without blocking: refused, not waited on
    served, error = serving_ranker(path)
    assert served is packaged_ranker() and error is not None and "not a regular file" in error


def test_a_users_ranker_that_makes_no_sense_is_refused_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30: a `scale` of 5e-324 (subnormal) with a layer of zeros loaded, and every confidence
    became 0.0: no ghost was ever drawn. Weights are checked for sense now, not only for shape."""
    path = tmp_path / paths.RANKER
    base = packaged_ranker().to_json()
    features = len(base["scale"])
    zeros = [[0.0] * len(base["b1"]) for _ in range(features)]
    cases = {
        "the probe's file": ({"scale": [5e-324] * features, "w1": zeros}, "'scale'"),
        "a subnormal weight": ({"w1": [[5e-324, *row[1:]] for row in base["w1"]]}, "'w1'"),
        "a scale of about 0": ({"scale": [1e-9] * features}, "'scale' is below"),
        "a huge weight": ({"w2": [1e9] * len(base["w2"])}, "'w2'"),
        "a layer of zeros": ({"w2": [0.0] * len(base["w2"])}, "'w2' is all zeros"),
    }
    for name, (fields, why) in cases.items():
        path.write_text(json.dumps({**base, **fields}))
        caplog.clear()
        served, error = serving_ranker(path)
        assert served is packaged_ranker() and error is not None, name
        assert str(path) in error and why in error, (name, error)
        assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1, name  # one line in the log
    near = {**base, "w1": [[w * 0.9 for w in row] for row in base["w1"]], "b2": 0.0}  # a refit's kind
    path.write_text(json.dumps(near))
    served, error = serving_ranker(path)
    assert error is None and served is not packaged_ranker()


def test_a_sync_reads_what_is_there_and_never_chases_an_import(tmp_path: Path) -> None:
    """A keystroke during the first-start import synced the index with the store, which read on
    while the import added rows: 1.6 million, 27 s for one completion (issue 30). A sync reads up
    to the newest row there is when it starts, and a keystroke's sync at most `budget` rows."""
    from calmd.history.store import HistoryStore

    class Importing(HistoryStore):
        """A store an import writes to while it is read: each batch read, 50 more rows come."""

        importing = False
        imported = 0

        def _rows(self, sql: str, args: tuple[object, ...]) -> list[Any]:
            rows = super()._rows(sql, args)
            if self.importing and self.imported < 2000:  # an end: a sync that chases it still stops
                for _ in range(50):
                    self.imported += 1
                    self.record(f"imported {self.imported}", session="import")
            return rows

    store = Importing(tmp_path / "h.sqlite3")
    for i in range(120):
        store.record(f"typed {i}", session="s")
    store.importing = True
    index = HistoryIndex()
    assert index.sync(store, budget=7) == 7  # a keystroke's share; the import adds rows meanwhile
    for _ in range(3):
        there = store.count()
        index.sync(store)
        assert len(index) == there < store.count()  # what there was when it started, not what came
    store.close()
