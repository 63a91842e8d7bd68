"""The reranker (calmd/suggest/rerank.py): one learned order over the history's and the model's
lines. The engine answers in its order, its rows say what the model and the history know of each
line, and the packaged one is the fitted one."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from calmd import paths
from calmd.errors import FormatError
from calmd.history.store import HistoryStore
from calmd.suggest.context import recent_context
from calmd.suggest.engine import ModelEngine, Suggestion
from calmd.suggest.forest import Forest
from calmd.suggest.ranking import HistoryIndex
from calmd.suggest.rerank import (
    LP_MISSING,
    RERANK_FEATURES,
    RERANK_POOL,
    Keystroke,
    Reranker,
    features,
    packaged_reranker,
    packaged_reranker_path,
    union,
)

COL = {name: i for i, name in enumerate(RERANK_FEATURES)}


def preferring(feature: str, above: float = 0.5) -> Reranker:
    """A reranker of one tree: 5 for a line whose `feature` is above `above`, else 0."""
    split, leaf = np.array([COL[feature], -1, -1]), np.array([above, 0.0, 0.0])
    children = np.array([1, -1, -1]), np.array([2, -1, -1])
    forest = Forest(RERANK_FEATURES, split, leaf, *children, np.array([0.0, 0.0, 5.0]), np.array([0]), 1)
    return Reranker(forest, {}, {})


def ask(engine: ModelEngine, store: HistoryStore, typed: str, n: int = 5) -> list[Suggestion]:
    engine.attach_history(store)
    history = [{"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, "s")]
    return list(engine.complete({"input": typed, "history": history}, n, "s", threading.Event()))


@pytest.fixture(scope="module")
def weights() -> Path:
    return paths.packaged_weights()


def loop(store: HistoryStore, cycles: int = 6) -> None:
    for _ in range(cycles):
        for cmd in ("vim main.c", "make", "./main", "git status"):
            store.record(cmd, exit=0, session="s")
    store.record("vim main.c", exit=0, session="s")
    store.record("make", exit=0, session="s")


def test_the_answer_is_in_the_rerankers_order(weights: Path, store: HistoryStore) -> None:
    loop(store)
    mixture = ModelEngine(weights, reranker=None)
    assert ask(mixture, store, "")[0].text == "./main"  # what always followed `make`
    # a reranker that puts the line just run first: `make` again, whatever the mixture says
    last = ModelEngine(weights, reranker=preferring("is_last"))
    got = ask(last, store, "")
    assert got[0].text == "make"
    assert [s.score for s in got] == sorted((s.score for s in got), reverse=True)
    assert all(s.score <= 0 for s in got)  # log-probabilities over the lines it ordered
    # one that puts the model's own lines first: a line never run and proposed by no history side
    model = ModelEngine(weights, reranker=preferring("model_only"))
    got = ask(model, store, "git ")
    history = HistoryIndex()
    for row in store.all_rows():
        history.add(row.cmd)
    assert got and got[0].text.startswith("git ") and history.count[got[0].text] == 0


def test_without_a_fitted_reranker_the_order_is_the_mixtures(weights: Path, store: HistoryStore) -> None:
    """The package ships no reranker (docs/quality.md: the fitted one measured no better than the
    mixture): the default engine answers as one told to keep the mixture's order."""
    assert not packaged_reranker_path().exists() and packaged_reranker() is None
    loop(store)
    default, mixture = ModelEngine(weights), ModelEngine(weights, reranker=None)
    assert default.reranker is None
    for typed in ("", "m", "git "):
        assert [(s.text, s.score) for s in ask(default, store, typed)] == [
            (s.text, s.score) for s in ask(mixture, store, typed)
        ]


def test_typing_along_the_rerankers_top_line_continues_its_answer(weights: Path, store: HistoryStore) -> None:
    loop(store)
    engine = ModelEngine(weights, reranker=preferring("is_last"))
    engine.attach_history(store)
    history = [{"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, "s")]

    def complete(typed: str) -> list[Suggestion]:
        return list(engine.complete({"input": typed, "history": history}, 5, "s", threading.Event()))

    # on the empty prompt the mixture would put `./main` first (the test above); the reranker, `make`
    assert complete("")[0].text == "make"
    searches, reused = engine.searches, engine.reused
    assert complete("m")[0].text == "make"  # typed along the reranker's top line, which still leads
    assert complete("ma")[0].text == "make"
    assert (engine.searches, engine.reused) == (searches, reused + 2)  # both continued, no search


def test_rows_say_what_the_model_and_the_history_know_of_each_line() -> None:
    index = HistoryIndex()
    for i in range(300):
        index.add("make" if i % 3 == 0 else f"echo {i}")
    index.add("ls -la")
    p_hist = {"make": 0.7, "ls -la": 0.3}
    lines = union(p_hist, ["git status", "make"])
    assert lines == ["make", "ls -la", "git status"]  # the history's by P_hist, then the others once
    pool_rows = dict(zip(["make", "ls -la"], index.features("", ["make", "ls -la"], ["ls -la"]), strict=True))
    ks = Keystroke("", ["ls -la"], p_hist, set(), pool_rows, {"make": -1.0, "git status": -3.0},
                   {"git status"}, {"make": -0.3, "git status": -4.0}, 0.1, {"make": 40})  # fmt: skip
    rows = features(index, lines, ks)
    make, ls, git = rows
    assert make[COL["log_count_50"]] == pytest.approx(np.log1p(16))  # one `make` in three of the last 50
    assert make[COL["log_count_200"]] == pytest.approx(np.log1p(66))
    assert make[COL["log_users"]] == pytest.approx(np.log1p(40)) and ls[COL["log_users"]] == 0
    assert (make[COL["p_hist"]], make[COL["p_hist_rank"]]) == (0.7, 0)
    assert (git[COL["p_hist"]], git[COL["p_hist_rank"]]) == (0.0, RERANK_POOL)
    assert make[COL["lp"]] == -1.0 and make[COL["lp_gap"]] == 0.0 and make[COL["lp_rank"]] == 0
    assert git[COL["lp_gap"]] == -2.0 and git[COL["lp_per_byte"]] == pytest.approx(-3.0 / 11)
    assert ls[COL["scored"]] == 0 and ls[COL["lp"]] == LP_MISSING  # the model did not score it
    assert git[COL["model_only"]] == 1 and git[COL["beam"]] == 1 and make[COL["model_only"]] == 0
    assert git[COL["log_count"]] == 0 and make[COL["is_last"]] == 0 and ls[COL["is_last"]] == 1
    assert make[COL["mixture_rank"]] == 0 and git[COL["mixture_rank"]] == 1
    assert set(rows[:, COL["p_end"]]) == {0.1}


def test_a_reranker_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    good = preferring("is_last").to_json()
    again = Reranker.from_json(good, "r.json")
    assert again.forest.scores(np.eye(len(RERANK_FEATURES))[[COL["is_last"], 0]]).tolist() == [5.0, 0.0]
    with pytest.raises(FormatError, match=r"r\.json: field 'users' must map lines to counts"):
        Reranker.from_json({**good, "users": {"ls": -1}}, "r.json")
    with pytest.raises(FormatError, match="version"):
        Reranker.from_json({**good, "version": 99}, "r.json")
    path = tmp_path / "reranker.json"
    path.write_text("{not json")
    with pytest.raises(FormatError, match=str(path)):
        Reranker.load(path)


def test_the_fit_writes_a_reranker_the_replay_measures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("lightgbm")
    from calmd.cli import calm_main
    from calmd.quality.fit_reranker import main

    users = tmp_path / "data" / "histories" / "users"
    users.mkdir(parents=True)
    week = ["vim main.c", "make", "./main", "git status", "git add main.c", "git commit -m wip", "ls"]
    for name in ("alice", "bob", "carol"):  # training users (`heidi` would be held out)
        (users / f"{name}.txt").write_text("\n".join(week * 12) + "\n")
    out, rows = tmp_path / "reranker.json", tmp_path / "rows.npz"
    args = ["--data", str(tmp_path / "data"), "--output", str(out), "--positions", "6", "--rounds", "10",
            "--rows", str(rows)]  # fmt: skip
    assert main(args) == 0
    first = Reranker.load(out)
    assert first.info["training_users"] == 3 and first.info["training_queries"] > 0
    assert set(first.info["importance_gain"]) == set(RERANK_FEATURES)
    assert main(args) == 0  # the second fit reads the rows it cached: the same forest
    assert np.array_equal(Reranker.load(out).forest.value, first.forest.value)
    assert "gathering" in capsys.readouterr().out
    history = users / "alice.txt"
    result = tmp_path / "replay.json"
    code = calm_main(["replay", str(history), "--reranker", str(out), "--positions", "6", "--typing", "0",
                      "--json", str(result), "--quiet"])  # fmt: skip
    assert code == 0
    calmd = json.loads(result.read_text())["totals"]["calmd"]
    assert calmd["queries"]["0"] == 6 and calmd["top1"]["0"] is not None
