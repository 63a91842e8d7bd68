"""Fit the anchor of `calm replay` (calmd/quality/anchor.py), the learned ranker over the history
alone, on the public histories:

    python -m calmd.quality.fit_anchor [--data ../shared/data] [--output calmd/data/anchor.json]

on the *training* users only (`calmd.training.corpus.held_out` keeps the held-out users out, as
for the packaged model and every other fit). Each training user's queries are the replay's (the
same sampling as `calm replay`, with another seed), the anchor's pool and features at each; a
LightGBM lambdarank forest learns to put the line the user ran first. A training user's
`log_users` counts the other training users only, as a new user's will. The held-out users'
top-1 at the replay's own positions is printed, and written in `info`, with the forest's feature
importances (gain). Needs LightGBM (`pip install lightgbm`, in the `dev` and `fit` extras);
deterministic for a seed and a thread count.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calmd.arguments import Parser, run_tool, whole
from calmd.atomic import atomic_write
from calmd.errors import CalmError
from calmd.quality.anchor import ANCHOR_FEATURES, MIN_USERS, Anchor, AnchorPast, packaged_anchor_path
from calmd.quality.tally import KS
from calmd.secrets import find_secret
from calmd.suggest.forest import Forest
from calmd.training.corpus import DEFAULT_DATA, held_out, history_users, read_history

PROG = "python -m calmd.quality.fit_anchor"
WARMUP = 50  # the replay's


@dataclass
class Query:
    rows: np.ndarray  # (pool, F)
    target: int  # the line the user ran in the pool, -1 when it is not there
    k: int


def anchor_queries(commands: Sequence[str], positions: int, seed: str, users: Mapping[str, int],
                   warmup: int = WARMUP) -> list[Query]:  # fmt: skip
    """The replay's queries of one history (`calm replay`'s sampling for `seed`), with the
    anchor's pool features at each."""
    out: list[Query] = []
    if len(commands) <= warmup:
        return out
    rng = random.Random(seed)
    sampled = set(rng.sample(range(warmup, len(commands)), min(positions, len(commands) - warmup)))
    past = AnchorPast()
    for i, cmd in enumerate(commands):
        if i in sampled:
            for k in KS:
                if k > 0 and len(cmd) <= k:
                    continue
                pool = past.pool(cmd[:k])
                target = pool.index(cmd) if cmd in pool else -1
                out.append(Query(past.features(cmd[:k], pool, users).astype(np.float32), target, k))
        past.add(cmd)
    return out


def user_counts(histories: Mapping[str, Sequence[str]]) -> Counter[str]:
    """For each line: how many of these users ran it (lines a credential detector flags left out)."""
    users: Counter[str] = Counter()
    for commands in histories.values():
        users.update(c for c in set(commands) if find_secret(c) is None)
    return users


def popular(users: Mapping[str, int], without: Sequence[str] = ()) -> dict[str, int]:
    """The lines `MIN_USERS` or more users ran, less one user's own lines (`without`)."""
    own = set(without)
    counts = {c: n - (c in own) for c, n in users.items()}
    return {c: n for c, n in counts.items() if n >= MIN_USERS}


def fit_forest(queries: Sequence[Query], *, rounds: int, leaves: int, rate: float, threads: int,
               seed: int) -> tuple[Forest, dict[str, float]]:  # fmt: skip
    """A LightGBM lambdarank forest over the queries whose pool holds the line and something
    else, and its features' importances (share of the total gain)."""
    import lightgbm

    usable = [q for q in queries if q.target >= 0 and len(q.rows) > 1]
    if not usable:
        raise CalmError("no query whose pool holds the line the user ran: nothing to fit")
    x = np.concatenate([q.rows for q in usable])
    y = np.zeros(len(x))
    at = 0
    for q in usable:
        y[at + q.target] = 1
        at += len(q.rows)
    params = {"objective": "lambdarank", "num_leaves": leaves, "learning_rate": rate,
              "min_data_in_leaf": 50, "lambdarank_truncation_level": 20, "eval_at": [1],
              "num_threads": threads, "seed": seed, "deterministic": True, "force_row_wise": True,
              "verbosity": -1}  # fmt: skip
    data = lightgbm.Dataset(x, y, group=[len(q.rows) for q in usable], feature_name=list(ANCHOR_FEATURES))
    booster = lightgbm.train(params, data, num_boost_round=rounds)
    gain = booster.feature_importance("gain")
    importance = {f: round(float(g / gain.sum()), 4) for f, g in zip(ANCHOR_FEATURES, gain, strict=True)}
    return Forest.from_lightgbm(booster.dump_model(), ANCHOR_FEATURES), importance


def top1(forest: Forest, queries: Sequence[Query]) -> dict[int, float]:
    """Share of queries (per k) whose best-scored pool line is the user's (ties: the more recent)."""
    hits: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for q in queries:
        total[q.k] += 1
        if q.target >= 0:
            hits[q.k] += int(np.argmax(forest.scores(q.rows))) == q.target
    return {k: hits[k] / total[k] for k in sorted(total)}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--output", type=Path, default=packaged_anchor_path())
    parser.add_argument("--positions", type=whole(1, 100_000), default=200,
                        help="sampled positions per training user (default 200)")  # fmt: skip
    # measured on a quarter of the training users held apart: 300 trees of 31 leaves at 0.05, 600 of
    # 31 at 0.03, 300 of 63 at 0.05 and these gave the same top-1 within 0.6 point at every k
    parser.add_argument("--rounds", type=whole(1, 10_000), default=200, help="trees (default 200)")
    parser.add_argument("--leaves", type=whole(2, 1024), default=15, help="leaves per tree (default 15)")
    parser.add_argument("--rate", type=float, default=0.1, help="learning rate (default 0.1)")
    parser.add_argument("--threads", type=whole(1, 64), default=1)
    parser.add_argument("--seed", type=whole(0, 2**31 - 1), default=1,
                        help="positions differ from the replay's (seed 0)")  # fmt: skip
    args = parser.parse_args(argv)
    started = time.monotonic()
    files = history_users(args.data)
    if not files:
        parser.error(f"no histories under {args.data / 'histories' / 'users'}")
    histories = {p.stem: read_history(p) for p in files}
    train = [name for name in histories if not held_out(name)]
    test = [name for name in histories if held_out(name)]
    users = user_counts({name: histories[name] for name in train})
    train_q = [q for name in train
               for q in anchor_queries(histories[name], args.positions, f"{args.seed}:{name}",
                                       popular(users, histories[name]))]  # fmt: skip
    table = popular(users)
    test_q = [q for name in test for q in anchor_queries(histories[name], 40, f"0:{name}", table)]
    gathered = time.monotonic() - started
    forest, importance = fit_forest(train_q, rounds=args.rounds, leaves=args.leaves, rate=args.rate,
                                    threads=args.threads, seed=args.seed)  # fmt: skip
    held = top1(forest, test_q)
    info: dict[str, Any] = {
        "command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
        "training_users": len(train),
        "training_queries": len(train_q),
        "positions": args.positions,
        "rounds": args.rounds,
        "leaves": args.leaves,
        "rate": args.rate,
        "seed": args.seed,
        "held_out_users": len(test),
        "held_out_top1": {str(k): round(v, 4) for k, v in held.items()},
        "importance_gain": importance,
        "popular_lines": len(table),
    }
    with atomic_write(args.output, mode=0o644) as out:
        out.write((json.dumps(Anchor(forest, table, info).to_json()) + "\n").encode())
    print(f"fitted on {len(train_q)} queries of {len(train)} users in {time.monotonic() - started:.0f} s "
          f"({gathered:.0f} s gathering); held-out top-1 by k: "
          + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in held.items()))  # fmt: skip
    print("importance (gain): " + ", ".join(f"{f} {v:.3f}" for f, v in
                                             sorted(importance.items(), key=lambda kv: -kv[1])))  # fmt: skip
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
