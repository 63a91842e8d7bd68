"""How well the model orders the user's past lines, against the history ranker (issue 41):

    python -m calmd.quality.past_order [--model M] [--history-frames N] [--rows held.npz] [--jobs 2]

The held-out users' replay positions (`calm replay --held-out`'s: 40 per user, seed 0) are
replayed with the engine's reranker rows kept (calmd/quality/fit_reranker.py `collect`). At each
query, among the history lines the model scored (a history proposal, P_hist > 0, with the
model's log-probability given the context and the input), when the line the user ran is among
them: does the model's log-probability put it first? And P_hist? And the mixture's score? The
share per k is what says whether the model knows which past line comes next, whatever the rest
of the engine does with it. `--history-frames` is how many past commands the model sees (the
template caps HIST frames at 15); the history ranker's features read the last four either way.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calmd import paths
from calmd.arguments import Parser, run_tool, whole
from calmd.formats.cwgt import read_cwgt
from calmd.formats.tokenizer import MAX_FRAME_ITEMS
from calmd.quality.fit_anchor import popular, user_counts
from calmd.quality.fit_reranker import Collected, collect
from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.rerank import RERANK_FEATURES
from calmd.training.corpus import DEFAULT_DATA, held_out, history_users, read_history

PROG = "python -m calmd.quality.past_order"
ORDERS = ("model", "p_hist", "mixture")  # what puts a line first: the model's lp, P_hist, the mixture
_COLUMN = {"model": RERANK_FEATURES.index("lp"), "p_hist": RERANK_FEATURES.index("p_hist"),
           "mixture": RERANK_FEATURES.index("mixture")}  # fmt: skip
_SCORED = RERANK_FEATURES.index("scored")
_P_HIST = RERANK_FEATURES.index("p_hist")


@dataclass(frozen=True)
class PastOrder:
    """Per k: the queries whose scored history lines hold the user's, and how many of them each
    order (ORDERS) puts first."""

    queries: dict[int, int]
    first: dict[str, dict[int, int]]

    def share(self, order: str, k: int) -> float:
        return self.first[order][k] / self.queries[k] if self.queries[k] else 0.0


def past_order(rows: Collected) -> PastOrder:
    """The module docstring's measure over collected rows."""
    queries: Counter[int] = Counter()
    first: dict[str, Counter[int]] = {o: Counter() for o in ORDERS}
    for x, target, k in rows.queries():
        queries[k] += 0
        if target < 0:
            continue
        past = np.flatnonzero((x[:, _SCORED] > 0) & (x[:, _P_HIST] > 0))
        if target not in past:
            continue
        queries[k] += 1
        for order in ORDERS:
            # the first of equal scores is the likelier history line (the rows come in P_hist's order)
            best = past[int(np.argmax(x[past, _COLUMN[order]]))]
            first[order][k] += int(best == target)
    return PastOrder(dict(sorted(queries.items())), {o: dict(c) for o, c in first.items()})


def format_order(found: PastOrder) -> str:
    ks = list(found.queries)
    lines = ["right line first, among the scored history lines that hold it (%)",
             "| order | " + " | ".join(f"k={k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|",
             "| queries | " + " | ".join(str(found.queries[k]) for k in ks) + " |"]  # fmt: skip
    for order in ORDERS:
        lines.append(f"| {order} | " + " | ".join(f"{100 * found.share(order, k):.1f}" for k in ks) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--model", type=Path, default=None, help="weights (default: the packaged model)")
    parser.add_argument("--history-frames", type=whole(0, MAX_FRAME_ITEMS), default=HISTORY_FRAMES,
                        help=f"past commands the model sees (default {HISTORY_FRAMES})")  # fmt: skip
    parser.add_argument(
        "--rows", type=Path, help="cache of the collected rows (read if present, else written)"
    )
    parser.add_argument("--jobs", type=whole(1, 64), default=1, help="users replayed at once")
    args = parser.parse_args(argv)
    model = args.model or paths.packaged_weights()
    read_cwgt(model)  # a bad file named as given: the replay reads a copy
    started = time.monotonic()
    if args.rows is not None and args.rows.exists():
        rows = Collected.load(args.rows)
    else:
        files = history_users(args.data)
        if not files:
            parser.error(f"no histories under {args.data / 'histories' / 'users'}")
        train = [p for p in files if not held_out(p.stem)]
        table = popular(user_counts({p.stem: read_history(p) for p in train}))
        test = [p for p in files if held_out(p.stem)]
        rows = collect(test, model, positions=40, seed=0, jobs=args.jobs, tables=[table] * len(test),
                       history_frames=args.history_frames)  # fmt: skip
        if args.rows is not None:
            rows.save(args.rows)
    print(format_order(past_order(rows)))
    print(
        f"({len(rows.sizes)} queries of {len(rows.users)} held-out users, {time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
