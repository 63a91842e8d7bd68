"""Fit the history search's ranker (calmd/suggest/search_ranker.py) on the public histories:

    python -m calmd.quality.fit_search [--data ../shared/data] [--output calmd/data/search_ranker.json]

on the *training* users only (`calmd.training.corpus.held_out` keeps the same users out as for the
default model and the history ranker, so `calm replay --search --held-out` measures users none of
them has seen). Each training user's queries are those of the search replay
(calmd/quality/search_replay.py, `search_examples`: the first word, and a distinctive fragment, of
a command run before), with the pool's SEARCH_FEATURES; the network is fitted by maximum
likelihood of the right line within each pool that holds it, by the history ranker's fit
(calmd/quality/fit_ranker.py `fit`). The history ranker's carry-over prior seen by each user's
features is the other users' (as a new user's is).
Deterministic for a seed: rebuilding gives the same file but for its timing fields.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calmd.arguments import Parser, run_tool
from calmd.atomic import atomic_write
from calmd.quality.fit_ranker import FitCorpus, Query, fit
from calmd.quality.search_replay import QUERY_KINDS, SearchExample, search_examples
from calmd.suggest.ranking import CarryPrior, packaged_ranker
from calmd.suggest.search import SearchIndex
from calmd.suggest.search_ranker import SearchRanker, packaged_search_ranker_path
from calmd.training.corpus import DEFAULT_DATA

PROG = "python -m calmd.quality.fit_search"


def examples(commands: Sequence[str], positions: int, seed: str, prior: CarryPrior,
             ranker: SearchRanker | None = None) -> list[SearchExample]:  # fmt: skip
    """One user's search queries with their pool features."""
    history_ranker = dataclasses.replace(packaged_ranker(), prior=prior)
    index = SearchIndex(ranker or SearchRanker.neutral(), history_ranker)
    return [e for e in search_examples(commands, positions, seed, index=index, features=True) if e.ranks]


def top1(ranker: SearchRanker, queries: Sequence[SearchExample]) -> float:
    """Share of queries whose best-scored pool line is the right one."""
    hits = sum(e.target >= 0 and len(e.rows) > 0 and int(np.argmax(ranker.scores(e.rows))) == e.target
               for e in queries)  # fmt: skip
    return hits / len(queries) if queries else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--output", type=Path, default=packaged_search_ranker_path())
    parser.add_argument("--positions", type=int, default=100, help="sampled positions per training user")
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.monotonic()
    corpus = FitCorpus.read(args.data)
    if corpus is None:
        parser.error(f"no histories under {args.data / 'histories' / 'users'}")
    train, test = corpus.train, corpus.test
    train_q = [e for name in train
               for e in examples(corpus.histories[name], args.positions, f"{args.seed}:{name}",
                                 corpus.prior_without(name))]  # fmt: skip
    test_q = [e for name in test for e in examples(corpus.histories[name], 40, f"0:{name}", corpus.prior)]
    kinds = {kind: i for i, kind in enumerate(QUERY_KINDS)}
    fitted, loss = fit([Query(e.rows, e.target, kinds[e.kind]) for e in train_q],
                       hidden=args.hidden, steps=args.steps, seed=args.seed)  # fmt: skip
    info = {
        "command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
        "training_users": len(train),
        "training_queries": len(train_q),
        "pooled": round(sum(e.target >= 0 for e in train_q) / max(len(train_q), 1), 4),
        "train_loss": round(loss, 4),
        "held_out_users": len(test),
        "seed": args.seed,
        "hidden": args.hidden,
        "steps": args.steps,
        "positions": args.positions,
    }
    ranker = SearchRanker.from_ranker(fitted, info)
    held = top1(ranker, test_q)
    info["held_out_pool_top1"] = round(held, 4)
    with atomic_write(args.output) as out:
        out.write((json.dumps(ranker.to_json(), indent=1) + "\n").encode())
    print(f"fitted on {len(train_q)} queries of {len(train)} users in {time.monotonic() - started:.0f} s, "
          f"loss {loss:.3f}; held-out: the pool's best-scored line is right for {100 * held:.1f}% of "
          f"{len(test_q)} queries")  # fmt: skip
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
