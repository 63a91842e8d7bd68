"""The daemon's completion engine: model candidates merged with the user's history, ranked.

For one keystroke (`ctx` with the typed `input`):
1. the history proposes commands that extend the input (for an empty input: the recent commands
   and those that followed the previous command), each with a probability P_hist from the
   learned ranker of calmd/suggest/ranking.py (transitions, counts, distances; fitted on public
   histories, docs/learning.md), raised for commands run in the same cwd before and for
   commands run lately (by the clock, where the store has timestamps); junk is dropped
   (calmd/suggest/filters.py: unbalanced quotes or brackets) and commands that never succeeded are
   demoted below every other. The best of them is the `early` proposal, sent before the model
   runs when the client asks for it;
2. the model proposes `n` completions by beam search from the cached context state
   (calmd/model/generate.py), each with its log-probability; a line only the model proposes is
   dropped when it is junk, holds a secret or a placeholder (`example.com`), pastes the cwd in,
   invents a subcommand or flag (calmd/suggest/filters.py), puts an argument of the wrong kind
   where a path, module, host, signal or variable belongs (calmd/suggest/kinds.py), or extends
   an input that is a complete command already (the user ran exactly it, or the model's
   likeliest next token is the end of the line);
3. the likeliest history proposals are scored by the model too (log P(command | context), one
   batched pass);
4. both are ranked as a mixture of the two predictors, the history "cache model" and the
   language model:  P(cmd) = lam * P_hist(cmd) + (1 - lam) * P_model(cmd) ** (1 / T).
   A command the user ran before thus needs no luck from the model, and the model still orders
   close calls and proposes what the history has never seen. With a fitted reranker
   (calmd/suggest/rerank.py: none is packaged, as it measured no better; `calm replay
   --reranker`), its learned order over the mixture's lines and the likeliest history proposals
   replaces the mixture's;
5. duplicates are merged and the best `n` are streamed, each as soon as its rank is final, with
   its calibrated confidence (calmd/suggest/calibration.py).
The disk (issue 15, calmd/suggest/disk.py): the COMP frame's items that complete the word being
typed (files and directories of the shell's cwd) are proposed as whole lines too, scored by the
model like the history's; and a line whose `cd` target or file argument does not exist relative
to the shell's cwd is demoted below every line whose paths exist (confidence 0: never shown
unasked), or dropped when only the model proposes a `cd` into nothing.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from calmd import paths
from calmd.errors import CalmError
from calmd.history.store import HistoryStore
from calmd.model.checkpoint import load_model
from calmd.model.generate import Candidate
from calmd.suggest.calibration import Calibrator, candidate_row, early_row, packaged_calibrator
from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.disk import Disk
from calmd.suggest.filters import Vocabulary, packaged_vocabulary
from calmd.suggest.frames import VocabularyFollowers
from calmd.suggest.ghost import GhostRule, packaged_rule
from calmd.suggest.index_catch_up import warm_sync
from calmd.suggest.judge import ELSEWHERE_PENALTY, HistorySide, LineJudge
from calmd.suggest.next_words import NextWords
from calmd.suggest.ranker import Ranker, packaged_ranker, packaged_ranker_path, serving_ranker
from calmd.suggest.ranking import POOL_RECENT, HistoryIndex
from calmd.suggest.rerank import Keystroke, Reranker, features, packaged_reranker, union
from calmd.suggest.through import MAX_SPARE, KeptAnswer, Mixture, context_key, history_index, history_version
from calmd.visible import quoted

# Junk lines (calmd/suggest/filters.py) the beams may finish before the search stops with what it has: as
# many as candidates asked for, at least 8. Without a bound a model that keeps finishing junk
# searched to max_tokens (45 ms; done p99 58 ms instead of 19 in bench/latency.py); with 2 the
# tiny test model's `git sta`, `git stas`, ... on the way ended the search before `git stash
# pop`, and with 5 before it too. In-process p50 / p99 with 5, 8, 10: 8.3 / 18.4, 9.2 / 18.5,
# 9.4 / 19.2 ms (interleaved, bench/latency.py's keystrokes).
DROP_BUDGET = 8
# Which predictors rank (`ModelEngine(parts=...)`, `calm replay --ranker`): the daemon serves the
# mixture; the other two are its ablations (docs/quality.md, "The mixture's parts"): the history
# ranker alone (no model runs: its proposals in the order of P_hist) and the model alone (its beams
# only: no line is proposed or scored from the history's counts; the history still filters lines
# that failed, as the judge does for the mixture's)
PARTS = ("mixture", "history", "model")


@dataclass(frozen=True)
class RankWeights:
    """The mixture's knobs (measured with `calm replay --weight name=value`, docs/quality.md)."""

    history_mix: float = 0.6  # lam: the history predictor's share of the mixture
    same_cwd: float = 1.0  # P_hist x (1 + same_cwd) for commands run in this cwd before (hand-set:
    # the public histories carry no cwd, so replay cannot fit it)
    pool: float = POOL_RECENT  # the most recent distinct history commands that extend the input
    model_temperature: float = 1.0  # P_model ** (1 / T) in the mixture: T > 1 gives the model more say
    recent_boost: float = 2.0  # P_hist x (1 + recent_boost * 0.5 ** (age / recent_half_life_h))
    recent_half_life_h: float = 168.0  # age: hours between the command's last run and the newest one
    complete_rule: float = 3.0  # when the input counts as complete: 0 never, 1 the user ran exactly
    # it, 2 the model's likeliest next token ends the line, 3 either
    vocabulary: float = 1.0  # 1: drop model-only lines with invented subcommands/flags or the cwd
    typing_through: float = 1.0  # 1: typing along the top line continues the previous answer; 0:
    # never (a search at every key); 2: typing along any of its lines does
    scored: float = 8  # history proposals scored by the model per request (a latency bound)
    beam: float = 6  # the beam search's width (at least the candidates asked for)
    drop_budget: float = DROP_BUDGET  # junk lines the beams may finish before the search stops
    tail_steps: float = 8  # steps the search goes on once its best line is final (0: until n are).
    # Measured (calm replay, 22 held-out users): 8 leaves top-1 and keystrokes saved as they were
    # and costs 0.2 point of top-5 at k = 1, 2, 4 (2 queries each); 11.8 beam steps a search in
    # place of 16.5 (bench/where_time_goes.py's new user), the keystroke's biggest cost

    @classmethod
    def overrides(cls, items: list[str]) -> dict[str, float]:
        """`NAME=VALUE` strings (`calm replay --weight`) -> {field: value}; CalmError names a bad one."""
        known = {f.name for f in fields(cls)}
        weights: dict[str, float] = {}
        for item in items:
            name, _, value = item.partition("=")
            name = name.replace("-", "_")
            if name not in known:
                raise CalmError(
                    f"--weight {item}: unknown weight {quoted(name)}; known: {', '.join(sorted(known))}"
                )
            try:
                weights[name] = float(value)
            except ValueError:
                raise CalmError(f"--weight {item}: {value!r} is not a number") from None
        return weights


class Suggestion(NamedTuple):
    """One streamed candidate."""

    text: str  # the whole command line
    score: float  # the ranking key: the mixture's log-probability (or the reranker's); demotions lower it
    confidence: float  # calibrated P(this is the whole line the user runs), calmd/suggest/calibration.py
    ghost: bool = False  # the shells draw it as ghost text (calmd/suggest/ghost.py); at most one per answer
    features: np.ndarray | None = None  # the calibration's inputs, with `explain=True`
    draw: str | None = None  # with `ghost`: what is drawn, the line or its likely head (GhostRule.draw)


EarlyCallback = Callable[[str, float, bool], None]  # (line, confidence, drawn as the ghost)


@dataclass(frozen=True)
class _Query:
    """What every step of one keystroke's answer reads (ModelEngine.complete)."""

    ctx: dict[str, Any]
    typed: str
    session: str
    explain: bool
    side: HistorySide  # the history's proposals, after the filters
    index: HistoryIndex | None
    history_size: int
    input_run_before: bool  # the user ran exactly the input before
    missing: Callable[[str], bool]  # names a path that is not there
    elsewhere: Callable[[str], bool]  # belongs to another branch or outside a repository


@dataclass(frozen=True)
class _Ranked:
    """What ranking found (ModelEngine.complete's third step)."""

    ranked: Iterator[Candidate]  # best first
    spare: list[Candidate]  # found beyond the n best, kept for typing through
    model_lp: dict[str, float]  # each candidate's log P_model(line | context, input)
    line_scores: dict[str, float]  # the scored lines' scores (the incumbent's among them)
    mixture_scores: dict[str, float]  # the lines' mixture scores (the calibration reads them)
    p_end: float  # the model's probability that the input is a whole line
    complete: bool  # the input is a whole command already
    start: Any = None  # the model's state after the context (typing through goes on from it)
    key: str = ""  # the context over the store this answer holds for
    heads_start: Any = None  # the state after the whole input, for the model's word on a head (ghost.py)


class ModelEngine(LineJudge, Mixture):
    """Wraps a loaded model and its generator; thread-confined to the daemon's worker thread."""

    def __init__(
        self,
        path: Path,
        weights: RankWeights | None = None,
        ranker: Ranker | None = None,
        calibrator: Calibrator | None = None,
        vocabulary: Vocabulary | None = None,
        ghost: GhostRule | None = None,
        parts: str = "mixture",
        reranker: Reranker | bool | None = True,
    ) -> None:
        import torch

        assert parts in PARTS, parts

        from calmd.model.generate import Generator

        torch.set_num_threads(1)  # one and two threads measured equal for batch-1 steps
        self.path = path
        self.loaded = load_model(path)
        # No traced step: measured, it saves nothing at beam widths of 5-8 (18.1 vs 18.4 ms for
        # five candidates) and costs 60 MB of resident memory (performance.md).
        self.generator = Generator(self.loaded, trace=False)
        self.next_words = NextWords(self.generator)  # the model's word for a drawn head (ghost.py)
        self.weights = weights or RankWeights()
        self.parts = parts
        self.history: HistoryStore | None = None
        self.index: HistoryIndex | None = None
        self.ranker = ranker or packaged_ranker()
        self.ranker_path: Path | None = None  # the user's ranker file it was read from (load_engine)
        self.ranker_error: str | None = None  # why the user's ranker file did not load
        self.calibrator = calibrator or packaged_calibrator()
        self.vocabulary = vocabulary or packaged_vocabulary()
        self.ghost = ghost or packaged_rule()
        # the answer's order (rerank.py): True, the packaged reranker (None before its fit); None or
        # False, the mixture's order
        self.reranker = packaged_reranker() if reranker is True else reranker or None
        self.popular: Mapping[str, int] = self.reranker.users if self.reranker is not None else {}
        self.explained_rerank: tuple[list[str], np.ndarray] | None = None  # the last rows (explain=True)
        self.home = os.environ.get("HOME")
        self.max_scored = int(self.weights.scored)
        self.drop_budget = int(self.weights.drop_budget)
        self.explained_early: tuple[str, np.ndarray] | None = None  # the last early row (explain=True)
        self.disk: Disk | None = None
        # COMP's subcommands and options: the user's own first, then the corpus's
        self.followers = VocabularyFollowers(self.vocabulary.known, static=1)
        self.answers: OrderedDict[str, list[KeptAnswer]] = OrderedDict()  # per session: its last whole
        # answers in one context, the newest first
        self.reused = 0  # requests answered from the previous answer (typing through, a repeat)
        self.searches = 0  # requests that ran the model's search (or scored a complete input)

    def attach_history(self, store: HistoryStore) -> None:
        self.history = store
        self.index = history_index(store)
        self.index.prior = self.ranker.prior  # other users' carry-over habits, fitted with the ranker
        self.followers = VocabularyFollowers(self.index.vocabulary.known, self.vocabulary.known, static=1)

    def attach_disk(self, disk: Disk) -> None:
        """Where the disk check and the COMP proposals look (the server's, shared across reloads)."""
        self.disk = disk

    def warm_up(self, cwd: str = "", cancelled: threading.Event | None = None) -> bool:
        """Pay at load what the first keystroke would pay otherwise (1.3-1.8 s measured before):
        the history index read from the store, the model's first passes (kernels, the fused
        scan's library, allocator), the calibration and the filters. One request on the empty
        prompt and one after a typed character, in a session of its own that is then forgotten.
        `cancelled`: stop at the model's next step and say so (False): a hot reload's warm-up is a
        background job of the daemon, which the next keystroke stops (issue 42)."""
        if self.history is not None and self.index is not None:
            warm_sync(self.index, self.history)
        history = []
        if self.history is not None:
            history = [{"cmd": r.cmd, "exit": r.exit} for r in self.history.recent(limit=HISTORY_FRAMES)]
        session = "calmd-warm-up"
        counts = self.searches, self.reused  # the status counts the users' requests only
        stop = cancelled if cancelled is not None else threading.Event()
        for typed in ("", "g", "gi"):
            ctx = {"input": typed, "history": history, **({"cwd": cwd} if cwd else {})}
            for _ in self.complete(ctx, 5, session, stop, lambda *_: None):
                pass
            if stop.is_set():
                break
        self.answers.pop(session, None)
        self.generator.cache.forget(session)
        self.next_words.forget(session)
        self.searches, self.reused = counts
        return not stop.is_set()

    def describe(self) -> dict[str, Any]:
        h = self.loaded.header
        return {
            "path": str(self.path),
            "size": f"d_model {h.d_model} x {h.n_layers} layers",
            "parameters": h.param_count,
            "domain": self.loaded.metadata.domain,
            "file_bytes": self.path.stat().st_size if self.path.exists() else None,
            "ranker": self._ranker_words(),
            "ranker_path": str(self.ranker_path) if self.ranker_path is not None else None,
            "ranker_refit": self.ranker.info.get("refit"),  # None: the packaged ranker serves
            "ranker_error": self.ranker_error,
            "indexed_commands": len(self.index) if self.index is not None else 0,
            "answers": {"searched": self.searches, "typed_through": self.reused},
        }

    def _ranker_words(self) -> str:
        """Which ranker serves, named by its file: the user's `ranker.json` (refitted by a run, or
        put there by hand: a file without `info.refit` was called "packaged"), else the packaged
        one, with why the user's did not load."""
        fitted = f"learned, {len(self.ranker.mean)} features, fitted on " \
            f"{self.ranker.info.get('training_users', '?')} users' histories"  # fmt: skip
        if self.ranker_path is not None:
            refit = self.ranker.info.get("refit")
            examples = refit.get("examples", "?") if isinstance(refit, dict) else None
            yours = f", refitted on {examples} examples of yours" if examples is not None else ", yours"
            return f"{fitted}{yours} ({self.ranker_path})"
        if self.ranker_error:
            return f"{fitted} (packaged, {packaged_ranker_path()}: {self.ranker_error})"
        return f"{fitted} (packaged, {packaged_ranker_path()})"

    def complete(
        self,
        ctx: dict[str, Any],
        n: int,
        session: str,
        cancelled: threading.Event,
        early: EarlyCallback | None = None,
        *,
        explain: bool = False,
        min_confidence: float | None = None,
        drawn: str | None = None,
    ) -> Iterator[Suggestion]:
        """Stream the best `n` candidates, each as soon as its rank is final, the one the shells
        draw (the ghost rule, calmd/suggest/ghost.py) first and flagged. `early` is called once,
        before the model runs, with the history's best proposal, its confidence and whether it is
        drawn (not at all when the history has none). The incumbent the final answer must beat by
        the rule's margin to be drawn in its place: `drawn`, the line the shell shows already
        (the user typed along it), else the early line when it is drawn. `min_confidence`: the
        shell's threshold in place of the fitted ones. Lines that failed every time they ran, or
        name a path that is not there, are never sent: the ghost, Shift-Tab and bash's list pass
        the same checks."""
        rule = self.ghost.overridden(min_confidence)
        q = self._query(ctx, session, explain)  # 1. the history's proposals, the checks of a line
        incumbent = self._early_line(q, rule, early, drawn)  # 2. its best, before the model runs
        if n <= 0 or cancelled.is_set():
            return
        if self.parts == "history":  # 3. ranked: the history alone (an ablation), or with the model
            found: _Ranked | None = self._rank_history(q)
        else:
            found = self._rank_with_model(q, n, incumbent, cancelled)
        if found is None:  # cancelled meanwhile
            return
        answer = self._answer(q, found, n, incumbent, cancelled)  # 4. the n best, each with its confidence
        if answer is None:
            return
        answer = self._ghost_first(q, rule, answer, incumbent, found)[: max(n, 1)]  # 5. the ghost, first
        answered: list[tuple[str, float]] = []  # 6. streamed
        for suggestion in answer:
            if cancelled.is_set():
                return
            if suggestion.text in found.model_lp:
                answered.append((suggestion.text, found.model_lp[suggestion.text]))
            yield suggestion
        if self.parts != "history":  # 7. kept for typing through (it continues the model's lines)
            self._keep(q, found, n, answer, answered)

    def _query(self, ctx: dict[str, Any], session: str, explain: bool) -> _Query:
        typed = ctx.get("input", "")
        missing = self._missing(ctx)
        side = self._history_side(typed, ctx, session, missing)  # first: it reads what was recorded since
        index = self.index
        run_before = index is not None and bool(typed) and index.count.get(typed, 0) > 0
        size = len(index) if index is not None else 0
        return _Query(
            ctx, typed, session, explain, side, index, size, run_before, missing, self._elsewhere(ctx)
        )

    def _early_line(
        self, q: _Query, rule: GhostRule, early: EarlyCallback | None, drawn: str | None
    ) -> str | None:
        """The history's best proposal passed to `early` with its confidence and whether it is
        drawn; returns the incumbent: the line the shell shows (`drawn`, when the input still
        leads to it), else the early line when it is drawn."""
        typed, side, index = q.typed, q.side, q.index
        shown_line = drawn if drawn and len(drawn) > len(typed) and drawn.startswith(typed) else None
        ordered = side.ordered()
        incumbent: str | None = None
        if early is not None and ordered:
            best = ordered[0]
            second = side.proposals[ordered[1]] if len(ordered) > 1 else 0.0
            count = index.count.get(best, 0) if index is not None else 0
            row = early_row(p_hist=side.proposals[best], second_p_hist=second, carry=best in side.carry,
                            k=len(typed), input_run_before=q.input_run_before, count=count,
                            history=q.history_size)  # fmt: skip
            if q.explain:
                self.explained_early = (best, row)
            confidence = 0.0 if q.elsewhere(best) else round(self.calibrator.early.probability(row), 3)
            # the line on the screen stays there until the final answer: an early line is drawn
            # only where nothing is, or when it is that line
            shown = (
                rule.draws_early(typed, confidence, q.history_size)
                and shown_line in (None, best)
                and not q.elsewhere(best)
            )
            incumbent = best if shown else None
            early(best, confidence, shown)
        return shown_line or incumbent

    def _rank_history(self, q: _Query) -> _Ranked:
        """The ablation without the model: P_hist's order, nothing else."""
        side = q.side
        complete = self._is_complete(q.typed, q.input_run_before, 0.0)
        kept = [c for c in side.ordered() if side.proposals[c] > 0 and not (complete and c in side.carry)]
        scores = {
            c: math.log(side.proposals[c]) - (ELSEWHERE_PENALTY if q.elsewhere(c) else 0.0) for c in kept
        }
        by_score = sorted(scores, key=scores.__getitem__, reverse=True)
        return _Ranked(
            iter([Candidate(c, scores[c], 0) for c in by_score]), [], {}, scores, scores, 0.0, complete
        )

    def _rank_with_model(
        self, q: _Query, n: int, incumbent: str | None, cancelled: threading.Event
    ) -> _Ranked | None:
        """The mixture's answer: typing through the previous one while its top line still leads,
        else the model scores the likeliest history proposals and COMP's lines (one batched
        pass) and its beams search for more; then the reranker's order, when there is one.
        None when cancelled."""
        typed, ctx, side, index, proposals = q.typed, q.ctx, q.side, q.index, q.side.proposals
        ordered = side.ordered()
        model_lp: dict[str, float] = {}  # each candidate's log P_model(line | context, input)
        spare: list[Candidate] = []  # lines the search found beyond the n best, kept for typing through
        lam = self.weights.history_mix if proposals else 0.0
        start, model_typed = self.generator.prepare(ctx, q.session)  # once: building it costs 0.3 ms
        p_end = self.generator.end_probability(ctx, session=q.session, start=start)
        # the model alone decides from the model whether the input is complete
        complete = self._is_complete(typed, q.input_run_before and self.parts != "model", p_end)
        judge = self._judge(typed, ctx, side, complete, q.missing)
        key = f"{context_key(ctx)}|{history_version(index)}"  # the same context over the same store
        # The history proposals the model scores (latency bound), and the lines COMP completes.
        disk = [c for c in self._disk_proposals(typed, ctx) if c not in proposals]
        scored = ordered[: self.max_scored] + disk
        lines = set(scored)  # what a complete input may go on to: the history's and COMP's lines
        if incumbent is not None and incumbent not in lines and judge(incumbent) is not None:
            scored.append(incumbent)  # its score decides whether it stays
        # the reranker's order (or, to fit it, the mixture's order and the rows it would read)
        rerank = self.parts == "mixture" and index is not None and (self.reranker is not None or q.explain)
        continued = None
        if not complete and model_typed == typed:
            check_top = self.reranker is None or not rerank  # else checked in the reranker's order
            continued = self._typed_through(q.session, key, ctx, n, start, side, scored, judge, lam,
                                            q.elsewhere, check_top)  # fmt: skip
        through = continued[0] if continued is not None else None
        reranked = None  # the reranker's order of the continued answer
        if continued is not None and rerank and self.reranker is not None:
            # typing along the top line continues the answer while that line still leads
            lps = {c.text: lp for c, lp in continued[0]}
            reranked = self._rerank(typed, side, [c for c, _ in continued[0]], lps, lam, p_end, complete,
                                    q.elsewhere, q.explain)  # fmt: skip
            if not reranked[0] or reranked[0][0].text != continued[1]:
                through, reranked = None, None
        ranked: Iterator[Candidate]
        if through is not None:
            self.reused += 1
            ranked = iter([c for c, _ in through[:n]])
            spare = [c for c, _ in through[n:]]
            model_lp = {c.text: lp for c, lp in through}
            line_scores = {c.text: c.logprob for c, _ in through}
        else:
            self.searches += 1
            extra: list[tuple[str, float]] = []
            if scored:
                scores = self.generator.score_many(ctx, scored, session=q.session, start=start)
                for cmd, lp in zip(scored, scores, strict=True):
                    extra.append((cmd, self._mixture_score(cmd, lp, proposals, lam, q.elsewhere)))
                    model_lp[cmd] = lp
            line_scores = dict(extra)
            if complete:  # only lines the user ran may continue it: no beams, no carry-overs
                own = [Candidate(c, s, 0) for c, s in extra if c in lines and c not in side.carry]
                own.sort(key=lambda c: c.logprob, reverse=True)
                ranked, spare = iter(own[:n]), own[n:]
            else:
                search = self.generator.beam_search(ctx, width=max(int(self.weights.beam), n), start=start)
                ranked = self.ranked(search, extra, judge, n, lam, cancelled, model_lp, spare)
        mixture_scores = dict(line_scores)  # the lines' mixture scores (the calibration reads them)
        if rerank:
            mixed = [*ranked, *spare]  # the mixture's answer, then what it kept beyond it
            if cancelled.is_set():
                return None
            final, mixture_scores = reranked or self._rerank(typed, side, mixed, model_lp, lam, p_end,
                                                             complete, q.elsewhere, q.explain)  # fmt: skip
            ranked, spare = iter(final[:n]), final[n:]
            line_scores = {c.text: c.logprob for c in final}
        whole = start if model_typed == typed else None  # the model's word on heads (truncated: none)
        return _Ranked(
            ranked, spare, model_lp, line_scores, mixture_scores, p_end, complete, start, key, whole
        )

    def _answer(
        self, q: _Query, found: _Ranked, n: int, incumbent: str | None, cancelled: threading.Event
    ) -> list[Suggestion] | None:
        """The `n` best lines, each once, with its calibrated confidence, and the incumbent when it
        was scored (the ghost rule weighs it against them). None when cancelled."""
        proposals, index = q.side.proposals, q.index
        top_p_hist = max(proposals.values(), default=0.0)

        def suggestion(text: str, score: float, rank: int) -> Suggestion:
            count = index.count.get(text, 0) if index is not None else 0
            row = candidate_row(
                log_p=found.mixture_scores.get(text, score), p_hist=proposals.get(text, 0.0),
                top_p_hist=top_p_hist, model_only=text not in proposals and count == 0,
                carry=text in q.side.carry, rank=rank, k=len(q.typed), p_end=found.p_end,
                input_run_before=q.input_run_before, count=count, history=q.history_size,
            )  # fmt: skip
            confidence = 0.0 if q.elsewhere(text) else round(self.calibrator.candidate.probability(row), 3)
            return Suggestion(text, score, confidence, False, row if q.explain else None)

        answer: list[Suggestion] = []
        seen: set[str] = set()
        for rank, cand in enumerate(found.ranked):
            if cancelled.is_set():
                return None
            if cand.text in seen or len(seen) >= n or q.missing(cand.text):
                continue  # (a path found missing since it was ranked: its folder was listed meanwhile)
            seen.add(cand.text)
            answer.append(suggestion(cand.text, cand.logprob, rank))
        if incumbent is not None and incumbent not in seen and incumbent in found.line_scores:
            answer.append(suggestion(incumbent, found.line_scores[incumbent], len(answer)))
        return answer

    def _ghost_first(
        self, q: _Query, rule: GhostRule, answer: list[Suggestion], incumbent: str | None, found: _Ranked
    ) -> list[Suggestion]:
        """The ghost decided over the whole answer (a head's confidence sums the candidates that
        share it; a young history's rule asks the model's word too: next_words.py) and moved first,
        flagged: the incumbent's line stays unless it is beaten by the rule's margin. A line that
        belongs elsewhere (another branch, a repository) is never drawn."""
        drawable = [s for s in answer if not q.elsewhere(s.text)]
        runs = q.index.count if q.index is not None else {}
        choices = [(s.text, s.confidence, s.score, runs.get(s.text, 0) > 0) for s in drawable]
        lines, every = [c[0] for c in choices], rule.at(q.history_size).by_word  # by_word: every line's word
        words = self.next_words.answer(q.session, q.ctx, found.heads_start, lines, every=every)  # lazily
        got = rule.draw(q.typed, choices, incumbent, q.history_size, words)
        if got is not None:
            ghost_line = drawable[got[0]].text
            at = next(i for i, s in enumerate(answer) if s.text == ghost_line)
            answer.insert(0, answer.pop(at)._replace(ghost=True, draw=got[1]))
        return answer

    def _keep(
        self, q: _Query, found: _Ranked, n: int, answer: list[Suggestion], answered: list[tuple[str, float]]
    ) -> None:
        """What typing through continues at the next keystroke: the lines sent with their model
        scores, and some of those found beyond them (none after a complete input)."""
        if found.complete:
            self._remember(q.session, None)
            return
        sent = {s.text for s in answer}
        lps = found.model_lp
        more = [(c.text, lps[c.text]) for c in found.spare if c.text in lps and c.text not in sent][
            :MAX_SPARE
        ]
        comp = tuple(q.ctx.get("completions") or ())
        self._remember(q.session, KeptAnswer(found.key, q.typed, n, found.start, answered + more, comp))

    def _rerank(
        self, typed: str, side: HistorySide, mixed: list[Candidate], model_lp: dict[str, float], lam: float,
        p_end: float, complete: bool, elsewhere: Callable[[str], bool], explain: bool = False,
    ) -> tuple[list[Candidate], dict[str, float]]:  # fmt: skip
        """The reranker's order (calmd/suggest/rerank.py) of the mixture's lines (`mixed`, with
        their mixture scores) and the likeliest history proposals, each scored by its
        log-probability under the reranker less the penalty of a line that belongs elsewhere;
        with the mixture's scores of them all (a history line the model did not score:
        log(lam P_hist)). Without a reranker, `mixed` as it is; `explain` keeps the rows."""
        assert self.index is not None
        history = {t: p for t, p in side.proposals.items() if not (complete and t in side.carry)}
        lines = union(history, [c.text for c in mixed])
        mixture = {c.text: c.logprob for c in mixed}
        for text in lines:
            if text not in mixture and history.get(text, 0.0) > 0 and lam > 0:
                penalty = ELSEWHERE_PENALTY if elsewhere(text) else 0.0
                mixture[text] = math.log(lam * history[text]) - penalty
        beams = {t for t in model_lp if t not in side.proposals and t not in side.rows}
        keystroke = Keystroke(typed, side.context, side.proposals, side.carry, side.rows, model_lp, beams,
                              mixture, p_end, self.popular)  # fmt: skip
        rows = features(self.index, lines, keystroke)
        if explain:
            self.explained_rerank = (lines, rows)
        if self.reranker is None:
            return mixed, mixture
        logp = self.reranker.log_probabilities(rows)
        final = [Candidate(t, float(lp) - (ELSEWHERE_PENALTY if elsewhere(t) else 0.0), 0)
                 for t, lp in zip(lines, logp, strict=True)]  # fmt: skip
        final.sort(key=lambda c: c.logprob, reverse=True)
        return final, mixture

    def _is_complete(self, typed: str, run_before: bool, p_end: float) -> bool:
        """Whether the input is a whole command already: then only the user's own history may
        continue it (`git status` is not followed by an invented ` -a`)."""
        if not typed or typed != typed.rstrip():  # a trailing space asks for more
            return False
        rule = int(self.weights.complete_rule)
        by_history = bool(rule & 1) and run_before
        by_model = bool(rule & 2) and p_end >= 0.5  # the end of the line is the likeliest next token
        return by_history or by_model

    def early(self, ctx: dict[str, Any], session: str) -> tuple[str, float, bool] | None:
        """The history's best proposal, its confidence and whether it is drawn, without the model
        (what `complete` passes to its `early` callback)."""
        found: list[tuple[str, float, bool]] = []
        for _ in self.complete(ctx, 0, session, threading.Event(), lambda t, c, g: found.append((t, c, g))):
            pass
        return found[0] if found else None


def load_engine(path: Path) -> ModelEngine:
    """The server's engine loader: the weight file, else the default model shipped in the package,
    with the user's history ranker beside it (`ranker.json`), else the packaged one."""
    ranker_file = paths.ranker_path(path)
    ranker, error = serving_ranker(ranker_file)
    engine = ModelEngine(paths.serving_weights(path), ranker=ranker)
    if ranker is not packaged_ranker():
        engine.ranker_path = ranker_file
    engine.ranker_error = error
    return engine
