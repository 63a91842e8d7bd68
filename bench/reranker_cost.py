"""What the reranker (calmd/suggest/rerank.py) costs a keystroke: its forest's scores for ~100 lines,
by LightGBM's own `predict` and by the trees exported to arrays and walked with numpy
(calmd/suggest/forest.py), alternated in one run; and the rows' features.

    python bench/reranker_cost.py [--rows 100] [--repeats 300]

LightGBM's booster is fitted here on random rows shaped as the packaged reranker's (its trees,
leaves and features), so both paths score the same trees; the packaged forest is timed too. The
features are timed on a 5,000-command index of the public histories (or a synthetic one) for a
union of --rows lines.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from calmd.arguments import Parser, run_tool
from calmd.suggest.forest import Forest
from calmd.suggest.ranking import HistoryIndex
from calmd.suggest.rerank import RERANK_FEATURES, Keystroke, features, packaged_reranker

PROG = "bench/reranker_cost.py"


def timed(fn: Any, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100, help="lines scored per keystroke")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    packaged = packaged_reranker()
    info = packaged.info if packaged is not None else {}
    rounds, leaves = int(info.get("rounds", 200)), int(info.get("leaves", 15))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20_000, len(RERANK_FEATURES)))
    y = (x[:, 0] + x[:, 1] * x[:, 2] + rng.normal(size=len(x)) > 0).astype(float)
    rows = rng.normal(size=(args.rows, len(RERANK_FEATURES)))
    results: dict[str, list[float]] = {}
    try:
        import lightgbm
    except ImportError:
        lightgbm = None
    if lightgbm is not None:
        params = {"objective": "lambdarank", "num_leaves": leaves, "min_data_in_leaf": 20, "verbosity": -1,
                  "num_threads": 1}  # fmt: skip
        booster = lightgbm.train(params, lightgbm.Dataset(x, y, group=[100] * 200), num_boost_round=rounds)
        forest = Forest.from_lightgbm(booster.dump_model(), RERANK_FEATURES)
        assert np.abs(forest.scores(rows) - booster.predict(rows, num_threads=1)).max() < 1e-9
        assert np.abs(forest.scores(rows, cpp=False) - forest.scores(rows)).max() < 1e-9
        runs = {"lightgbm predict": lambda: booster.predict(rows, num_threads=1),
                "C++ walk (same trees, csrc/forest.cpp)": lambda: forest.scores(rows),
                "numpy walk (same trees)": lambda: forest.scores(rows, cpp=False)}  # fmt: skip
        results = {name: [] for name in runs}
        for _ in range(3):  # alternated
            for name, run in runs.items():
                results[name] += timed(run, args.repeats)
    if packaged is not None:
        walk = packaged.forest.scores
        results["C++ walk (the packaged reranker)"] = timed(lambda: walk(rows), 3 * args.repeats)
    index = HistoryIndex()
    for i in range(5_000):
        index.add(f"cmd{i % 700} --flag {i % 13}")
    lines = [f"cmd{i} --flag {i % 13}" for i in range(args.rows)]
    context = ["cmd1 --flag 1", "cmd2 --flag 2"]
    pooled = lines[: args.rows // 2]
    pool_rows = dict(zip(pooled, index.features("", pooled, context), strict=True))
    scored = {t: -3.0 for t in lines[::3]}
    ks = Keystroke("", context, {t: 1 / len(pooled) for t in pooled}, set(), pool_rows, scored,
                   set(lines[-10:]), scored, 0.1, {})  # fmt: skip
    rows_of = lambda: features(index, lines, ks)  # noqa: E731
    results["features of the lines (half of them new)"] = timed(rows_of, args.repeats)
    print(f"{args.rows} lines, {rounds} trees of {leaves} leaves, {len(RERANK_FEATURES)} features: ms")
    print(f"{'':<46}{'p50':>8}{'p90':>8}{'p99':>8}")
    for name, times in results.items():
        q = statistics.quantiles(times, n=100)
        print(f"{name:<46}{statistics.median(times):>8.3f}{q[89]:>8.3f}{q[98]:>8.3f}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
