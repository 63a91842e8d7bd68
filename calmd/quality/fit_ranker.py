"""Fit the daemon's history ranker (calmd/suggest/ranking.py) on the public histories:

    python -m calmd.quality.fit_ranker [--data ../shared/data] [--output calmd/data/ranker.json]

on the *training* users only (the held-out users of `calmd.training.corpus.held_out` are the ones
`calm replay --held-out` measures). Each training user's queries are the replay's (`calm replay`
samples positions the same way), with the pool features the daemon computes; the network is
fitted by maximum likelihood of the command the user ran, within each pool that holds it.
Deterministic for a seed: rebuilding gives the same file but for its timing fields.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calmd.arguments import Parser, run_tool
from calmd.atomic import atomic_write
from calmd.suggest.carry import NO_PRIOR, CarryPrior
from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.ranker import Ranker, packaged_ranker_path
from calmd.suggest.ranking import HistoryIndex
from calmd.training import optim
from calmd.training.corpus import DEFAULT_DATA, held_out, history_users, read_history

PROG = "python -m calmd.quality.fit_ranker"

# --------------------------------------------------------------------------- fitting


@dataclass
class Query:
    rows: np.ndarray  # (pool, F)
    target: int  # index of the command the user ran in the pool, -1 when it is not there
    k: int


def replay_queries(commands: Sequence[str], positions: int, seed: str, warmup: int = 50,
                   ks: Sequence[int] = (0, 1, 2, 4, 8),
                   prior: CarryPrior = NO_PRIOR) -> list[Query]:  # fmt: skip
    """The replay's queries for one user (as `calm replay` samples them), with pool features.
    `prior`: other users' carry-over habits (never this user's own)."""
    queries: list[Query] = []
    if len(commands) <= warmup:
        return queries
    rng = random.Random(seed)
    sampled = set(rng.sample(range(warmup, len(commands)), min(positions, len(commands) - warmup)))
    index = HistoryIndex(prior)
    for i, cmd in enumerate(commands):
        if i in sampled:
            context = commands[max(0, i - HISTORY_FRAMES) : i]
            for k in ks:
                if k > 0 and len(cmd) <= k:
                    continue
                pool = index.pool(cmd[:k], context[-1] if context else None)
                target = pool.index(cmd) if cmd in pool else -1
                queries.append(Query(index.features(cmd[:k], pool, context), target, k))
        index.add(cmd)
    return queries


def fit(
    queries: Sequence[Query], *, hidden: int = 16, steps: int = 400, seed: int = 0
) -> tuple[Ranker, float]:
    """Maximum likelihood of the user's command within each pool that holds it (full batch Adam)."""
    import torch

    torch.manual_seed(seed)
    usable = [q for q in queries if q.target >= 0 and len(q.rows) > 1]
    assert usable, "no query whose pool holds its command"
    x = torch.from_numpy(np.concatenate([q.rows for q in usable]).astype(np.float32))
    mean, scale = x.mean(0), x.std(0) + 1e-3
    x = (x - mean) / scale
    segment = torch.cat([torch.full((len(q.rows),), i) for i, q in enumerate(usable)])
    offsets = np.cumsum([0] + [len(q.rows) for q in usable])[:-1]
    targets = torch.tensor([int(o) + q.target for o, q in zip(offsets, usable, strict=True)])
    lin1, lin2 = torch.nn.Linear(x.shape[1], hidden), torch.nn.Linear(hidden, 1)
    net = torch.nn.Sequential(lin1, torch.nn.Tanh(), lin2)
    opt = optim.Adam(net.parameters(), lr=0.01, weight_decay=1e-4)  # torch.optim's, without torch._dynamo
    loss = torch.tensor(0.0)
    for _ in range(steps):
        s = net(x).squeeze(-1)
        peak = torch.full((len(usable),), -1e9).scatter_reduce(0, segment, s.detach(), "amax")
        lse = torch.zeros(len(usable)).index_add(0, segment, torch.exp(s - peak[segment])).log() + peak
        loss = (lse - s[targets]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def array(t: torch.Tensor) -> np.ndarray:
        return t.detach().double().numpy().copy()

    ranker = Ranker(array(mean), array(scale), array(lin1.weight).T.copy(), array(lin1.bias),
                    array(lin2.weight)[0], float(lin2.bias.item()), {})  # fmt: skip
    return ranker, float(loss.item())


def top1(ranker: Ranker, queries: Sequence[Query]) -> dict[int, float]:
    """Share of queries (per k) whose top-ranked pool command is the user's."""
    hits: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for q in queries:
        total[q.k] += 1
        if q.target >= 0 and len(q.rows):
            hits[q.k] += int(np.argmax(ranker.scores(q.rows))) == q.target
    return {k: hits[k] / total[k] for k in sorted(total)}


@dataclass(frozen=True)
class FitCorpus:
    """The public histories a fit reads, split as the default model's corpus is
    (`calmd.training.corpus.held_out`): the training users with their carry-over habits, and the
    held-out users. A training user's features see the other users' habits only, as a new
    user's will (`prior_without`); the held-out users are scored with all of them (`prior`)."""

    histories: dict[str, list[str]]
    train: list[str]  # user names
    test: list[str]
    habits: list[tuple[str, CarryPrior]]
    prior: CarryPrior

    @classmethod
    def read(cls, data: Path) -> FitCorpus | None:
        """None when `data` holds no histories."""
        users = history_users(data)
        if not users:
            return None
        histories = {p.stem: read_history(p) for p in users}
        train = [p.stem for p in users if not held_out(p.stem)]
        habits = [(name, CarryPrior.count(histories[name])) for name in train]
        test = [p.stem for p in users if held_out(p.stem)]
        return cls(histories, train, test, habits, CarryPrior.total(habits))

    def prior_without(self, name: str) -> CarryPrior:
        return CarryPrior.total([h for h in self.habits if h[0] != name])


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--output", type=Path, default=packaged_ranker_path())
    parser.add_argument("--positions", type=int, default=100, help="sampled positions per training user")
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.monotonic()
    corpus = FitCorpus.read(args.data)
    if corpus is None:
        parser.error(f"no histories under {args.data / 'histories' / 'users'}")
    train, test, prior = corpus.train, corpus.test, corpus.prior
    train_q = [q for name in train
               for q in replay_queries(corpus.histories[name], args.positions, f"{args.seed}:{name}",
                                       prior=corpus.prior_without(name))]  # fmt: skip
    test_q = [
        q for name in test for q in replay_queries(corpus.histories[name], 40, f"0:{name}", prior=prior)
    ]
    ranker, loss = fit(train_q, hidden=args.hidden, steps=args.steps, seed=args.seed)
    held = top1(ranker, test_q)
    info = {
        "command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
        "training_users": len(train),
        "training_queries": len(train_q),
        "train_loss": round(loss, 4),
        "held_out_users": len(test),
        "held_out_top1": {str(k): round(v, 4) for k, v in held.items()},
        "seed": args.seed,
        "hidden": args.hidden,
        "steps": args.steps,
        "positions": args.positions,
    }
    info["carry_prior_heads"] = len(prior.carries)
    ranker = Ranker(ranker.mean, ranker.scale, ranker.w1, ranker.b1, ranker.w2, ranker.b2, info, prior)
    with atomic_write(args.output) as out:
        out.write((json.dumps(ranker.to_json(), indent=1) + "\n").encode())
    print(f"fitted on {len(train_q)} queries of {len(train)} users in {time.monotonic() - started:.0f} s, "
          f"loss {loss:.3f}; held-out top-1 (history only) by k: "
          + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in held.items()))  # fmt: skip
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
