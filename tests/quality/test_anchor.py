"""The anchor of `calm replay` (calmd/quality/anchor.py): a LightGBM ranker over the history alone,
its trees evaluated with numpy (calmd/suggest/forest.py) exactly as LightGBM scores them, its
features computed from the past only, and its fit (`python -m calmd.quality.fit_anchor`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmd.errors import FormatError
from calmd.quality.anchor import ANCHOR_FEATURES, ANCHOR_POOL, Anchor, AnchorPast, packaged_anchor
from calmd.quality.fit_anchor import anchor_queries, main, popular, top1
from calmd.suggest.forest import Forest

lightgbm = pytest.importorskip("lightgbm")


def _booster(rows: int = 600, features: int = 5, seed: int = 3, leaves: int = 7) -> tuple[Any, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    x[:, 2] = rng.integers(0, 4, size=rows)  # ties at thresholds: a split on integers
    y = (x[:, 0] + 0.5 * x[:, 1] * x[:, 2] > 0.3).astype(float)
    data = lightgbm.Dataset(x, y, group=[20] * (rows // 20))
    params = {"objective": "lambdarank", "num_leaves": leaves, "min_data_in_leaf": 2, "verbosity": -1,
              "num_threads": 1, "deterministic": True, "force_row_wise": True}  # fmt: skip
    return lightgbm.train(params, data, num_boost_round=40), x


@pytest.mark.parametrize("leaves", [7, 90])  # 90: more than 64 leaves, walked level by level in numpy
def test_forest_scores_as_lightgbm_predicts(leaves: int) -> None:
    booster, x = _booster(rows=2000, leaves=leaves)
    names = tuple(f"f{i}" for i in range(x.shape[1]))
    forest = Forest.from_lightgbm(booster.dump_model(), names)
    expected = booster.predict(x)
    assert max(t["num_leaves"] for t in booster.dump_model()["tree_info"]) > (64 if leaves > 64 else 1)
    assert np.abs(forest.scores(x) - expected).max() < 1e-9  # the C++ walk (csrc/forest.cpp)
    assert np.abs(forest.scores(x, cpp=False) - expected).max() < 1e-9  # numpy's
    again = Forest.from_json(json.loads(json.dumps(forest.to_json())), names, "f.json")
    assert np.array_equal(again.scores(x), forest.scores(x))  # the file keeps every bit
    assert forest.scores(x[:0]).shape == (0,)


def test_a_forest_file_that_would_not_end_or_reads_another_feature_is_refused() -> None:
    booster, x = _booster()
    names = tuple(f"f{i}" for i in range(x.shape[1]))
    good = Forest.from_lightgbm(booster.dump_model(), names).to_json()
    loop = dict(good, left=[0] + good["left"][1:])  # the first split's left child is itself
    with pytest.raises(FormatError, match=r"f\.json: a split.s children must be later nodes"):
        Forest.from_json(loop, names, "f.json")
    far = dict(good, feature=[len(names)] + good["feature"][1:])
    with pytest.raises(FormatError, match="names a feature this forest does not have"):
        Forest.from_json(far, names, "f.json")
    with pytest.raises(FormatError, match="features differ"):
        Forest.from_json(good, (*names, "another"), "f.json")
    short = dict(good, value=good["value"][:-1])
    with pytest.raises(FormatError, match="field 'value' must be a list of"):
        Forest.from_json(short, names, "f.json")


def test_the_pool_is_the_most_recent_distinct_lines_that_extend_the_input() -> None:
    past = AnchorPast()
    for i in range(ANCHOR_POOL + 50):
        past.add(f"echo {i}")
    past.add("echo 3")  # run again: the most recent
    pool = past.pool("echo ")
    assert len(pool) == ANCHOR_POOL and pool[0] == "echo 3"
    assert pool[1:3] == [f"echo {ANCHOR_POOL + 49}", f"echo {ANCHOR_POOL + 48}"]
    assert "echo 3" not in pool[1:]
    assert "echo 3" not in past.pool("echo 3")  # the input itself is no suggestion


def test_features_see_the_past_only() -> None:
    past = AnchorPast()
    for cmd in ["make", "./main", "make", "./main", "vim a.c", "make"]:
        past.add(cmd)
    rows = past.features("", past.pool(""), {"./main": 5})
    col = {name: i for i, name in enumerate(ANCHOR_FEATURES)}
    pool = past.pool("")
    main_row = rows[pool.index("./main")]
    assert main_row[col["share_follows_prev"]] == 1.0  # `./main` followed `make` each time
    assert main_row[col["followed_prev_last_time"]] == 1.0
    assert main_row[col["log_users"]] == pytest.approx(np.log1p(5))
    assert rows[pool.index("make")][col["is_prev"]] == 1.0
    assert rows[pool.index("vim a.c")][col["log_count"]] == pytest.approx(np.log1p(1))


def _loop(cycles: int) -> list[str]:
    commands: list[str] = []
    for i in range(cycles):
        commands += ["vim main.c", "make", "./main", f"echo note {i % 7}", "ls"]
    return commands


def test_popular_lines_leave_the_user_out() -> None:
    counts = {"ls": 3, "make": 2, "rare": 1}
    assert popular(counts) == {"ls": 3, "make": 2}
    assert popular(counts, ["make", "ls"]) == {"ls": 2}  # without the user's own: one user left of make


def test_fit_writes_an_anchor_that_learns_what_follows_what(tmp_path: Path) -> None:
    users = tmp_path / "data" / "histories" / "users"
    users.mkdir(parents=True)
    for name in ("alice", "bob", "carol", "dave", "erin", "frank"):
        (users / f"{name}.txt").write_text("\n".join(_loop(30)) + "\n")
    out = tmp_path / "anchor.json"
    args = ["--data", str(tmp_path / "data"), "--output", str(out), "--positions", "40", "--rounds", "30"]
    assert main(args) == 0
    anchor = Anchor.load(out)
    assert anchor.info["training_queries"] > 0 and anchor.info["command"].startswith(
        "python -m calmd.quality.fit_anchor --data"
    )
    assert set(anchor.info["importance_gain"]) == set(ANCHOR_FEATURES)
    queries = anchor_queries(_loop(30), 60, "t", anchor.users)
    assert top1(anchor.forest, queries)[0] > 0.9  # the next line of a loop, from the empty prompt
    past = AnchorPast()
    for cmd in _loop(10):
        past.add(cmd)
    assert anchor.suggest(past, "", 1) == ["vim main.c"]  # after `ls`, the loop starts again
    assert not list(tmp_path.glob(".anchor.json.*"))  # the atomic write left no temp file


def test_the_packaged_anchor_loads_and_ranks() -> None:
    anchor = packaged_anchor()
    assert anchor is not None and anchor.info["training_users"] == 89
    past = AnchorPast()
    for cmd in _loop(10):
        past.add(cmd)
    assert anchor.suggest(past, "")[0] == "vim main.c"
