"""Refit the history ranker on the user's own commands, anchored to the packaged weights.

The order of the suggestions is decided mostly by the history ranker (calmd/suggest/ranking.py:
P_hist over the pool of past commands; docs/quality.md, "The mixture's parts"), whose weights were
fitted once on other people's histories. A user who always runs the command that followed the
previous one, or never repeats the last one, weighs the same features differently. This refit
adapts the ranker's network to the user, cheaply (numbers of features, not bytes: seconds on one
core, no model):

    examples  the queries `calm replay` asks, at every position of the user's history, for each
              typed length k in KS: the pool the daemon would rank and where the command the user
              ran is in it (`RankerExamples`, fed the history oldest first; features see the past only)
    loss      the ranker's own: mean negative log-likelihood of the user's command within its pool,
              plus anchor * sum((w - w_packaged)^2) / 2 over every weight of the network, which keeps
              the refit near the weights fitted on 89 users (the ranker's EWC, with a uniform Fisher:
              the packaged file carries no Fisher information of its corpus)
    keeps     the standardisation (mean, scale) and the carry-over prior of the base ranker

The background run (calmd/training/background.py) gathers the examples from the history store
(`examples_from_store`: the newest commands only, the older ones fill the history the features
see), refits, and writes the user's ranker beside the weights (`ranker.json`), which the daemon
serves with; `calm replay --with-training --refit ranker` measures the same refit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from calmd.history.store import HistoryStore
from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.ranking import INDEX_LIMIT, HistoryIndex, Ranker

KS = (0, 1, 2, 4, 8)  # the typed lengths of the replay's queries (calmd/quality/replay.py)
LEARN_COMMANDS = 2000  # the newest commands the background run asks the queries of (>= max_examples
# at about 3 kept examples per command); older ones only fill the history the features see


@dataclass(frozen=True)
class RefitOptions:
    """How a refit runs (measured: docs/quality.md, "Learning")."""

    steps: int = 60  # full-batch Adam steps
    lr: float = 0.01
    anchor: float = 0.5  # pull toward the base weights (per weight, against the mean loss per query)
    max_examples: int = 6000  # the newest examples the fit uses (about 1,200 commands at 5 queries each)
    min_examples: int = 100  # fewer usable examples: nothing to learn yet, the base ranker stays


@dataclass
class Example:
    rows: np.ndarray  # (pool, F) features
    target: int  # the user's command's position in the pool


@dataclass
class RankerExamples:
    """The user's ranking examples, gathered as the history grows (fed oldest first with `add`).
    Only the pools that hold the user's command and something else teach anything, so only they
    are kept, the newest `limit`."""

    base: Ranker
    ks: Sequence[int] = KS
    limit: int = 20_000
    index: HistoryIndex = field(init=False)
    examples: deque[Example] = field(init=False)
    _recent: dict[str, deque[str]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.index = HistoryIndex(self.base.prior)
        self.examples = deque(maxlen=self.limit)

    def add(self, cmd: str, session: str = "") -> None:
        """The queries for `cmd` given what came before it, then `cmd` itself into the history."""
        context = list(self._recent.get(session, ()))
        prev = context[-1] if context else None
        for k in self.ks:
            if k > 0 and len(cmd) <= k:
                continue
            pool = self.index.pool(cmd[:k], prev)
            if len(pool) > 1 and cmd in pool:
                self.examples.append(Example(self.index.features(cmd[:k], pool, context), pool.index(cmd)))
        self.remember(cmd, session)

    def remember(self, cmd: str, session: str = "") -> None:
        """`cmd` into the history the features see, without asking its queries (an older command
        than the ones the fit learns from: the features still count it)."""
        self.index.add(cmd, session)
        self._recent.setdefault(session, deque(maxlen=HISTORY_FRAMES)).append(cmd)

    def extend(self, commands: Iterable[str], session: str = "") -> None:
        for cmd in commands:
            self.add(cmd, session)


def examples_from_store(
    store: HistoryStore, base: Ranker, *, learn: int = LEARN_COMMANDS, history: int = INDEX_LIMIT,
    check: Callable[[], None] | None = None,
) -> RankerExamples:  # fmt: skip
    """The user's ranking examples from the store: the newest `history` commands (what the
    daemon's index holds) fill the history, oldest first, and the newest `learn` of them ask
    their queries. Only the store's rows: what it refused (secrets) never reaches a ranker.
    `check` is called every few hundred commands (the background run's "is the daemon still
    there"; it raises to stop)."""
    gathered = RankerExamples(base)
    after = store.newest_after(history)
    total = min(store.count(), history)
    for i, row in enumerate(store.all_rows(after=after)):
        if check is not None and i % 500 == 0:
            check()
        if i >= total - learn:
            gathered.add(row.cmd, row.session)
        else:
            gathered.remember(row.cmd, row.session)
    return gathered


def refit_ranker(examples: Sequence[Example], base: Ranker, options: RefitOptions = RefitOptions()) -> Ranker:
    """The base ranker's network refitted on `examples` (the newest `options.max_examples`),
    regularised toward the base weights; the base itself when there are too few examples."""
    import torch

    from calmd.training import optim

    usable = list(examples)[-options.max_examples :]
    if len(usable) < options.min_examples:
        return base
    torch.manual_seed(0)
    x = torch.from_numpy(
        ((np.concatenate([e.rows for e in usable]) - base.mean) / base.scale).astype(np.float32)
    )
    sizes = [len(e.rows) for e in usable]
    segment = torch.repeat_interleave(torch.arange(len(usable)), torch.tensor(sizes))
    offsets = np.cumsum([0, *sizes[:-1]])
    targets = torch.tensor([int(o) + e.target for o, e in zip(offsets, usable, strict=True)])
    anchors = [torch.tensor(a, dtype=torch.float32) for a in (base.w1, base.b1, base.w2, np.array([base.b2]))]
    params = [a.clone().requires_grad_(True) for a in anchors]
    opt = optim.Adam(params, lr=options.lr)  # torch.optim's, without the import of torch._dynamo
    n = len(usable)
    for _ in range(options.steps):
        w1, b1, w2, b2 = params
        s = torch.tanh(x @ w1 + b1) @ w2 + b2
        peak = torch.full((n,), -1e9).scatter_reduce(0, segment, s.detach(), "amax")
        lse = torch.zeros(n).index_add(0, segment, torch.exp(s - peak[segment])).log() + peak
        nll = (lse - s[targets]).mean()
        pull = sum(((p - a) ** 2).sum() for p, a in zip(params, anchors, strict=True))
        loss = nll + options.anchor / 2 * pull
        opt.zero_grad()
        loss.backward()
        opt.step()
    fitted = [p.detach().double().numpy().copy() for p in params]
    info = {**base.info, "refit": {"examples": n, "steps": options.steps, "anchor": options.anchor,
                                   "train_nll": round(float(nll.item()), 4)}}  # fmt: skip
    return Ranker(
        base.mean, base.scale, fitted[0], fitted[1], fitted[2], float(fitted[3][0]), info, base.prior
    )
