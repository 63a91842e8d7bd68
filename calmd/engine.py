"""The daemon's completion engine: model candidates merged with the user's history, ranked.

For one keystroke (`ctx` with the typed `input`):
1. the model proposes `n` completions by beam search from the cached context state
   (calmd/generate.py), each with its log-probability;
2. the history proposes commands that extend the input (for an empty input: the recent commands
   and those that followed the previous command), each with a probability P_hist from the
   learned ranker of calmd/ranking.py (transitions, counts, distances; fitted on public
   histories, docs/learning.md), raised for commands run in the same cwd before;
3. the likeliest history proposals are scored by the model too (log P(command | context), one
   batched pass);
4. both are ranked as a mixture of the two predictors, the history "cache model" and the
   language model:  P(cmd) = lam * P_hist(cmd) + (1 - lam) * P_model(cmd) ** (1 / T).
   A command the user ran before thus needs no luck from the model, and the model still orders
   close calls and proposes what the history has never seen;
5. duplicates are merged and the best `n` are streamed, each as soon as its rank is final.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.checkpoint import load_model
from calmd.history import HistoryStore
from calmd.ranking import POOL_RECENT, HistoryIndex, Ranker, packaged_ranker


@dataclass(frozen=True)
class RankWeights:
    """The mixture's knobs (measured with `calm replay --weight name=value`, docs/quality.md)."""

    history_mix: float = 0.6  # lam: the history predictor's share of the mixture
    same_cwd: float = 1.0  # P_hist x (1 + same_cwd) for commands run in this cwd before (hand-set:
    # the public histories carry no cwd, so replay cannot fit it)
    pool: float = POOL_RECENT  # the most recent distinct history commands that extend the input
    model_temperature: float = 1.0  # P_model ** (1 / T) in the mixture: T > 1 gives the model more say


_INDEXES: weakref.WeakKeyDictionary[HistoryStore, HistoryIndex] = weakref.WeakKeyDictionary()


def history_index(store: HistoryStore) -> HistoryIndex:
    """One in-memory index per store, shared by the engines a hot reload replaces (so a reload
    does not re-read the whole history). Used from the daemon's single inference thread."""
    index = _INDEXES.get(store)
    if index is None:
        index = _INDEXES[store] = HistoryIndex()
    return index


class ModelEngine:
    """Wraps a loaded model and its generator; thread-confined to the daemon's worker thread."""

    def __init__(self, path: Path, weights: RankWeights | None = None, ranker: Ranker | None = None) -> None:
        import torch

        from calmd.generate import Generator

        torch.set_num_threads(1)  # one and two threads measured equal for batch-1 steps
        self.path = path
        self.loaded = load_model(path)
        # No traced step: measured, it saves nothing at beam widths of 5-8 (18.1 vs 18.4 ms for
        # five candidates) and costs 60 MB of resident memory (performance.md).
        self.generator = Generator(self.loaded, trace=False)
        self.weights = weights or RankWeights()
        self.history: HistoryStore | None = None
        self.index: HistoryIndex | None = None
        self.ranker = ranker or packaged_ranker()
        self.max_scored = 8  # history proposals scored by the model per request (latency bound)

    def attach_history(self, store: HistoryStore) -> None:
        self.history = store
        self.index = history_index(store)

    def describe(self) -> dict[str, Any]:
        h = self.loaded.header
        return {
            "path": str(self.path),
            "size": f"d_model {h.d_model} x {h.n_layers} layers",
            "parameters": h.param_count,
            "domain": self.loaded.metadata.domain,
            "file_bytes": self.path.stat().st_size if self.path.exists() else None,
            "ranker": f"learned, {len(self.ranker.mean)} features, fitted on "
            f"{self.ranker.info.get('training_users', '?')} users' histories",
            "indexed_commands": len(self.index) if self.index is not None else 0,
        }

    def complete(
        self, ctx: dict[str, Any], n: int, session: str, cancelled: threading.Event
    ) -> Iterator[tuple[str, float]]:
        """Stream the best `n` candidates, each as soon as its rank is final."""
        if n <= 0:
            return
        typed = ctx.get("input", "")
        proposals = self._history_proposals(typed, ctx, session)
        lam = self.weights.history_mix if proposals else 0.0
        total = sum(proposals.values())
        # Score the likeliest history proposals with the model: one batched pass.
        best = sorted(proposals, key=proposals.__getitem__, reverse=True)[: self.max_scored]
        extra: list[tuple[str, float]] = []
        if best and not cancelled.is_set():
            scores = self.generator.score_many(ctx, best, session=session)
            for cmd, lp in zip(best, scores, strict=True):
                p = lam * proposals[cmd] / total + (1 - lam) * math.exp(lp / self.weights.model_temperature)
                extra.append((cmd, math.log(p)))
        offset = math.log(1 - lam)  # the model's share, for candidates only the model proposes
        temperature = self.weights.model_temperature
        if temperature != 1.0:  # beams rank by lp; on the mixture's scale they are lp / T
            extra = [(cmd, offset + (score - offset) * temperature) for cmd, score in extra]
        for cand in self.generator.candidates(
            ctx, n, session=session, cancelled=cancelled, extra=extra, beam_offset=offset
        ):
            if cancelled.is_set():
                return
            score = cand.logprob if temperature == 1.0 else offset + (cand.logprob - offset) / temperature
            yield cand.text, score

    def _history_proposals(self, typed: str, ctx: dict[str, Any], session: str) -> dict[str, float]:
        """History commands that extend the input, each with its history probability P_hist."""
        store, index = self.history, self.index
        if store is None or index is None:
            return {}
        index.sync(store)  # what any shell recorded since the last keystroke
        context = [str(h.get("cmd", "")) for h in ctx.get("history") or [] if isinstance(h, dict)]
        pool = index.pool(typed, context[-1] if context else None, size=int(self.weights.pool))
        if not pool:
            return {}
        probs = self.ranker.probabilities(index.features(typed, pool, context))
        proposals = {cmd: float(p) for cmd, p in zip(pool, probs, strict=True)}
        cwd = ctx.get("cwd")
        if cwd and self.weights.same_cwd:
            for cmd in store.in_cwd(cwd, prefix=typed, limit=20):
                if cmd in proposals:
                    proposals[cmd] *= 1 + self.weights.same_cwd
        return proposals


def packaged_model() -> Path:
    """The default model shipped inside the package (built by `python -m calmd.recipe`)."""
    return paths.packaged_weights()


def load_engine(path: Path) -> ModelEngine:
    """The server's engine loader: the weight file, else the default model shipped in the package."""
    return ModelEngine(path if path.exists() else packaged_model())
