"""The reranker: one learned order over everything a keystroke proposes, the history's lines and
the model's together (issue 41).

Before it, the answer's order was the mixture's, `lam P_hist + (1 - lam) P_model` (engine.py),
and at k = 0-2 that was the history ranker's order: the model's score moved no past line, and a
LightGBM ranker of the history alone (calmd/quality/anchor.py) was level with all of calmd. The
reranker orders the union of

    the RERANK_POOL likeliest history proposals (recent lines, followers, carry-overs, by P_hist),
    the model's lines (the beams' finished lines), COMP's lines, and the line drawn already,

by a LightGBM lambdarank forest (calmd/suggest/forest.py, evaluated with numpy) over
RERANK_FEATURES: the history ranker's own features (ranking.FEATURES) and its P_hist, counts
over the last 50 and 200 commands, how many training users ran the line, its length, and the
model's view of it: its log-probability given the context and the input (total, per byte, its
gap to the best and its rank), whether the model scored it at all, P(end of line) after the
input, whether only the model proposed it, and the mixture's score and rank. The model thus
reorders past lines where it knows better, and the history orders the model's lines.

It is fitted by

    python -m calmd.quality.fit_reranker [--data ../shared/data] [--output calmd/data/reranker.json]

on the engine's own candidates at replay positions of the 89 training users (never the held-out
ones); without a fitted file the engine keeps the mixture's order.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.atomic import read_json
from calmd.suggest.forest import Forest, ForestFile
from calmd.suggest.ranking import FEATURES as HISTORY_FEATURES
from calmd.suggest.ranking import HistoryIndex

RERANK_VERSION = 1
RERANK_POOL = 40  # the likeliest history proposals (by P_hist) the reranker orders with the model's lines
MIN_USERS = 2  # a line counts as other users' when at least this many training users ran it
LP_MISSING = -99.0  # the log-probability feature of a line the model did not score
RERANK_FEATURES = (
    *HISTORY_FEATURES,  # the history ranker's, for every line (a model-only line: never run)
    "p_hist",  # P_hist (0: not a history proposal)
    "p_hist_rank",  # its rank among the history proposals by P_hist (RERANK_POOL: none)
    "log_count_50",  # log(1 + times among the last 50 commands)
    "log_count_200",  # ... the last 200
    "log_users",  # log(1 + training users who ran it, when MIN_USERS or more did)
    "length",  # characters
    "lp",  # log P_model(the rest of the line and its end | context, input); LP_MISSING: not scored
    "scored",  # the model scored it (a beam's line, or one of the history's likeliest)
    "lp_per_byte",  # lp over the bytes it adds (and the end)
    "lp_gap",  # lp less the best lp of the keystroke
    "lp_rank",  # its rank by lp among the scored lines
    "p_end",  # the model's P(end of line) right after the input (the keystroke's)
    "typed",  # characters typed (the keystroke's)
    "log_history",  # log(1 + commands in the history) (the keystroke's)
    "model_only",  # only the model proposed it: not run before, not a carry-over
    "carry",  # a carry-over (a past line's head with the previous line's last words)
    "beam",  # a beam finished it
    "mixture",  # the mixture's log-probability (LP_MISSING when neither side scored it)
    "mixture_rank",  # its rank by the mixture's score
)


@dataclass(frozen=True)
class Keystroke:
    """What one keystroke knows of its candidates, for `features`."""

    typed: str
    context: Sequence[str]  # the session's latest commands, oldest first
    p_hist: Mapping[str, float]  # the history's proposals
    carry: Collection[str]  # which of them are carry-overs
    pool_rows: Mapping[str, np.ndarray]  # the history ranker's features of the pool's lines
    lp: Mapping[str, float]  # the model's log-probabilities of the lines it scored
    beams: Collection[str]  # the lines the beams finished
    mixture: Mapping[str, float]  # the mixture's scores
    p_end: float
    users: Mapping[str, int]  # training users per popular line


def union(p_hist: Mapping[str, float], others: Sequence[str], pool: int = RERANK_POOL) -> list[str]:
    """The lines the reranker orders: the `pool` likeliest history proposals, then `others` (the
    model's, COMP's, the drawn line) not among them."""
    ordered = sorted(p_hist, key=p_hist.__getitem__, reverse=True)[:pool]
    have = set(ordered)
    return ordered + [t for t in dict.fromkeys(others) if t not in have]


def features(index: HistoryIndex, lines: Sequence[str], ks: Keystroke) -> np.ndarray:
    """RERANK_FEATURES of `lines`   (len(lines), F) float64"""
    n_hist = len(HISTORY_FEATURES)
    rows = np.zeros((len(lines), len(RERANK_FEATURES)))
    fresh = [t for t in lines if t not in ks.pool_rows]
    fresh_rows = index.features(ks.typed, fresh, ks.context) if fresh else np.zeros((0, n_hist))
    by_text = dict(zip(fresh, fresh_rows, strict=True))
    hist_rank = {t: r for r, t in enumerate(sorted(ks.p_hist, key=ks.p_hist.__getitem__, reverse=True))}
    scored = [t for t in lines if t in ks.lp]
    lp_rank = {t: r for r, t in enumerate(sorted(scored, key=ks.lp.__getitem__, reverse=True))}
    best_lp = max((ks.lp[t] for t in scored), default=0.0)
    mix_rank = {t: r for r, t in enumerate(sorted(lines, key=lambda t: ks.mixture.get(t, -math.inf),
                                                  reverse=True))}  # fmt: skip
    total = len(index.commands)
    k = len(ks.typed)
    log_history = math.log1p(total)
    for j, text in enumerate(lines):
        pool_row = ks.pool_rows.get(text)
        rows[j, :n_hist] = pool_row if pool_row is not None else by_text[text]
        at = index.positions.get(text, ())
        lp = ks.lp.get(text)
        many = ks.users.get(text, 0)
        known = index.count.get(text, 0) > 0
        mixture = ks.mixture.get(text, -math.inf)
        rows[j, n_hist:] = (
            ks.p_hist.get(text, 0.0),
            hist_rank.get(text, RERANK_POOL),
            math.log1p(len(at) - bisect.bisect_left(at, total - 50)),
            math.log1p(len(at) - bisect.bisect_left(at, total - 200)),
            math.log1p(many) if many >= MIN_USERS else 0.0,
            len(text),
            lp if lp is not None else LP_MISSING,
            lp is not None,
            lp / (len(text) - k + 1) if lp is not None else LP_MISSING,
            lp - best_lp if lp is not None else LP_MISSING,
            lp_rank.get(text, len(lines)),
            ks.p_end,
            k,
            log_history,
            text not in ks.p_hist and not known,
            text in ks.carry,
            text in ks.beams,
            max(mixture, LP_MISSING),
            mix_rank[text],
        )
    return rows


@dataclass(frozen=True)
class Reranker:
    """The fitted reranker: its forest, and how many training users ran each popular line."""

    forest: Forest
    users: Mapping[str, int]
    info: Mapping[str, Any]

    def log_probabilities(self, rows: np.ndarray) -> np.ndarray:
        """The forest's scores as log-probabilities over the lines (a log-softmax): the ranking
        key of the answer, on a scale the calibration and the ghost rule's margin read."""
        if len(rows) == 0:
            return np.zeros(0)
        s = self.forest.scores(rows)
        top = s.max()
        return s - top - math.log(np.exp(s - top).sum())

    def to_json(self) -> dict[str, Any]:
        found = ForestFile(self.forest, dict(self.users), dict(self.info))
        return found.to_json("calm-reranker", RERANK_VERSION)

    @classmethod
    def from_json(cls, data: Any, source: str = "reranker") -> Reranker:
        found = ForestFile.from_json(data, "calm-reranker", RERANK_VERSION, RERANK_FEATURES, source)
        return cls(found.forest, found.users, found.info)

    @classmethod
    def load(cls, path: Path) -> Reranker:
        return cls.from_json(read_json(path, "reranker"), str(path))


def packaged_reranker_path() -> Path:
    return paths.PACKAGE_DATA / paths.PACKAGED_RERANKER


@functools.cache
def packaged_reranker() -> Reranker | None:
    """The reranker shipped in the package, read once per process; None before its first fit
    (the engine keeps the mixture's order)."""
    path = packaged_reranker_path()
    return Reranker.load(path) if path.exists() else None
