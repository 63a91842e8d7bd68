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
   close calls and proposes what the history has never seen;
5. duplicates are merged and the best `n` are streamed, each as soon as its rank is final, with
   its calibrated confidence (calmd/suggest/calibration.py).
The disk (issue 15, calmd/suggest/disk.py): the COMP frame's items that complete the word being
typed (files and directories of the shell's cwd) are proposed as whole lines too, scored by the
model like the history's; and a line whose `cd` target or file argument does not exist relative
to the shell's cwd is demoted below every line whose paths exist (confidence 0: never shown
unasked), or dropped when only the model proposes a `cd` into nothing.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from calmd import paths
from calmd.errors import CalmError
from calmd.history.store import HistoryStore
from calmd.model.checkpoint import load_model
from calmd.model.generate import BeamSearch, Candidate
from calmd.secrets import find_secret
from calmd.suggest.calibration import Calibrator, candidate_row, early_row, packaged_calibrator
from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.disk import Disk, check_arguments
from calmd.suggest.filters import (
    Vocabulary,
    balanced,
    cut_off,
    cwd_argument,
    flag_name,
    invented,
    packaged_vocabulary,
    placeholder,
    repeats_word,
    sendable,
)
from calmd.suggest.frames import VocabularyFollowers, current_word
from calmd.suggest.ghost import GhostRule, packaged_rule
from calmd.suggest.index_catch_up import keystroke_sync, warm_sync
from calmd.suggest.kinds import wrong_kind
from calmd.suggest.ranking import (
    POOL_RECENT,
    HistoryIndex,
    Ranker,
    first_word,
    outside_git,
    packaged_ranker,
    packaged_ranker_path,
    serving_ranker,
)
from calmd.visible import quoted

# nats off the score of a line that belongs elsewhere (another branch, inside a repository: `_elsewhere`):
# below every line that belongs here, and never drawn (confidence 0)
ELSEWHERE_PENALTY = 25.0
DISK_PROPOSALS = 4  # COMP items proposed as whole lines (scored in the history's batch)
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
    score: float  # the mixture's log-probability (the ranking key; demotions lower it)
    confidence: float  # calibrated P(this is the whole line the user runs), calmd/suggest/calibration.py
    ghost: bool = False  # the shells draw it as ghost text (calmd/suggest/ghost.py); at most one per answer
    features: np.ndarray | None = None  # the calibration's inputs, with `explain=True`
    draw: str | None = None  # with `ghost`: what is drawn, the line or its likely head (GhostRule.draw)


EarlyCallback = Callable[[str, float, bool], None]  # (line, confidence, drawn as the ghost)


@dataclass
class HistorySide:
    """The history's proposals for one keystroke, after the junk filters."""

    proposals: dict[str, float]  # command -> P_hist (normalised before the failing ones went)
    carry: set[str]  # which of them are carry-overs (new lines, not past commands)
    failing: set[str]  # the pool's commands that never succeeded or name a missing path (not proposed)

    def ordered(self) -> list[str]:
        """Best first."""
        return sorted(self.proposals, key=self.proposals.__getitem__, reverse=True)


MAX_ANSWERS = 64  # sessions whose last answers are kept for typing through (as the prefix cache's)
MAX_SPARE = 10  # lines a search found beyond the n best that an answer keeps for typing through
ANSWERS_PER_SESSION = 8  # a session's answers kept: the newest, and earlier inputs a backspace returns to


@dataclass
class _Answer:
    """A session's last whole answer: what typing through it continues."""

    key: str  # its context_key and history_version: typing through needs the very same ones
    typed: str  # the input it answered
    n: int  # how many lines were asked for
    start: Any  # the model's state after the context and `typed` (calmd.model.generate._Prefix);
    # None for the earlier answers, which only a repeat of their input continues
    lines: list[tuple[str, float]]  # its lines, best first, with log P_model(line | context, typed)
    comp: tuple[str, ...] = ()  # the COMP items the context held (typing through rescores on a change)


def context_key(ctx: dict[str, Any]) -> str:
    """Everything of a request's context but the typed input and the COMP items, as one string:
    two requests with the same key differ only by what was typed and what COMP offered for it
    (the context is opaque here: frames, cwd, git and whatever else it carries)."""
    return json.dumps({k: v for k, v in ctx.items() if k not in ("input", "completions")}, sort_keys=True,
                      default=str)  # fmt: skip


_INDEXES: weakref.WeakKeyDictionary[HistoryStore, HistoryIndex] = weakref.WeakKeyDictionary()
_INDEX_IDS: weakref.WeakKeyDictionary[HistoryIndex, int] = weakref.WeakKeyDictionary()
_NEXT_INDEX_ID = itertools.count(1)


def history_index(store: HistoryStore) -> HistoryIndex:
    """One in-memory index per store, shared by the engines a hot reload replaces (so a reload
    does not re-read the whole history). Used from the daemon's single inference thread."""
    index = _INDEXES.get(store)
    if index is None:
        index = _INDEXES[store] = HistoryIndex()
        _INDEX_IDS[index] = next(_NEXT_INDEX_ID)
    return index


def history_version(index: HistoryIndex | None) -> str:
    """Which store and which of its states the index holds: any command recorded (by any session)
    or deleted since makes another version, and an answer of another version is not continued."""
    if index is None:
        return "-"
    return f"{_INDEX_IDS.get(index, 0)}:{index.last_id}:{getattr(index, '_generation', None)}"


class ModelEngine:
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
        self.home = os.environ.get("HOME")
        self.max_scored = int(self.weights.scored)
        self.drop_budget = int(self.weights.drop_budget)
        self.explained_early: tuple[str, np.ndarray] | None = None  # the last early row (explain=True)
        self.disk: Disk | None = None
        # COMP's subcommands and options: the user's own first, then the corpus's
        self.followers = VocabularyFollowers(self.vocabulary.known, static=1)
        self.answers: OrderedDict[str, list[_Answer]] = OrderedDict()  # per session: its last whole
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
        typed = ctx.get("input", "")
        shown_line = drawn if drawn and len(drawn) > len(typed) and drawn.startswith(typed) else None
        rule = self.ghost.overridden(min_confidence)
        missing = self._missing(ctx)
        elsewhere = self._elsewhere(ctx)
        side = self._history_side(typed, ctx, session, missing)
        index = self.index
        history_size = len(index) if index is not None else 0
        ordered = side.ordered()
        input_run_before = index is not None and bool(typed) and index.count.get(typed, 0) > 0
        incumbent: str | None = None  # the line drawn before the final answer
        if early is not None and ordered:
            best = ordered[0]
            second = side.proposals[ordered[1]] if len(ordered) > 1 else 0.0
            count = index.count.get(best, 0) if index is not None else 0
            row = early_row(p_hist=side.proposals[best], second_p_hist=second, carry=best in side.carry,
                            k=len(typed), input_run_before=input_run_before, count=count,
                            history=history_size)  # fmt: skip
            if explain:
                self.explained_early = (best, row)
            confidence = 0.0 if elsewhere(best) else round(self.calibrator.early.probability(row), 3)
            # the line on the screen stays there until the final answer: an early line is drawn
            # only where nothing is, or when it is that line
            shown = (
                rule.draws_early(typed, confidence, history_size)
                and shown_line in (None, best)
                and not elsewhere(best)
            )
            incumbent = best if shown else None
            early(best, confidence, shown)
        incumbent = shown_line or incumbent
        if n <= 0 or cancelled.is_set():
            return
        proposals = side.proposals
        top_p_hist = side.proposals[ordered[0]] if ordered else 0.0
        model_lp: dict[str, float] = {}  # each candidate's log P_model(line | context, input)
        line_scores: dict[str, float] = {}  # the scored lines' mixture scores (the incumbent's)
        spare: list[Candidate] = []  # lines the search found beyond the n best, kept for typing through
        if self.parts == "history":  # the ablation without the model: P_hist's order, nothing else
            p_end = 0.0
            complete = self._is_complete(typed, input_run_before, p_end)
            kept = [c for c in ordered if side.proposals[c] > 0 and not (complete and c in side.carry)]
            line_scores = {
                c: math.log(side.proposals[c]) - (ELSEWHERE_PENALTY if elsewhere(c) else 0.0) for c in kept
            }
            by_score = sorted(line_scores, key=line_scores.__getitem__, reverse=True)
            ranked: Iterator[Candidate] = iter([Candidate(c, line_scores[c], 0) for c in by_score])
        else:
            lam = self.weights.history_mix if proposals else 0.0
            # once: building the sequence costs 0.3 ms
            start, model_typed = self.generator.prepare(ctx, session)
            p_end = self.generator.end_probability(ctx, session=session, start=start)
            # the model alone decides from the model whether the input is complete
            complete = self._is_complete(typed, input_run_before and self.parts != "model", p_end)
            judge = self._judge(typed, ctx, side, complete, missing)
            key = f"{context_key(ctx)}|{history_version(index)}"  # the same context over the same store
            # The history proposals the model scores (latency bound), and the lines COMP completes.
            disk = [c for c in self._disk_proposals(typed, ctx) if c not in proposals]
            scored = ordered[: self.max_scored] + disk
            lines = set(scored)  # what a complete input may go on to: the history's and COMP's lines
            if incumbent is not None and incumbent not in lines and judge(incumbent) is not None:
                scored.append(incumbent)  # its score decides whether it stays
            through = None
            if not complete and model_typed == typed:
                through = self._typed_through(
                    session, key, ctx, n, start, side, scored, judge, lam, elsewhere
                )
            if through is not None:
                self.reused += 1
                ranked = iter([c for c, _ in through[:n]])
                spare = [c for c, _ in through[n:]]
                model_lp = {c.text: lp for c, lp in through}
                line_scores = {c.text: c.logprob for c, _ in through}
            else:
                self.searches += 1
                # Score the likeliest history proposals and COMP's lines with the model: one batched pass.
                extra: list[tuple[str, float]] = []
                if scored:
                    scores = self.generator.score_many(ctx, scored, session=session, start=start)
                    for cmd, lp in zip(scored, scores, strict=True):
                        extra.append((cmd, self._mixture_score(cmd, lp, proposals, lam, elsewhere)))
                        model_lp[cmd] = lp
                line_scores = dict(extra)
                if complete:  # only lines the user ran may continue it: no beams, no carry-overs
                    own = [Candidate(c, s, 0) for c, s in extra if c in lines and c not in side.carry]
                    ranked = iter(sorted(own, key=lambda c: c.logprob, reverse=True)[:n])
                else:
                    search = self.generator.beam_search(
                        ctx, width=max(int(self.weights.beam), n), start=start
                    )
                    ranked = self.ranked(search, extra, judge, n, lam, cancelled, model_lp, spare)

        def suggestion(text: str, score: float, rank: int) -> Suggestion:
            count = index.count.get(text, 0) if index is not None else 0
            row = candidate_row(
                log_p=score, p_hist=proposals.get(text, 0.0), top_p_hist=top_p_hist,
                model_only=text not in proposals and count == 0, carry=text in side.carry, rank=rank,
                k=len(typed), p_end=p_end, input_run_before=input_run_before, count=count,
                history=history_size,
            )  # fmt: skip
            confidence = 0.0 if elsewhere(text) else round(self.calibrator.candidate.probability(row), 3)
            return Suggestion(text, score, confidence, False, row if explain else None)

        # The ghost is decided over the whole answer (a head's confidence sums the candidates that
        # share it), then sent first: the incumbent's line stays unless it is beaten by the margin.
        answer: list[Suggestion] = []
        seen: set[str] = set()
        for rank, cand in enumerate(ranked):
            if cancelled.is_set():
                return
            if cand.text in seen or len(seen) >= n or missing(cand.text):
                continue  # (a path found missing since it was ranked: its folder was listed meanwhile)
            seen.add(cand.text)
            answer.append(suggestion(cand.text, cand.logprob, rank))
        if incumbent is not None and incumbent not in seen and incumbent in line_scores:
            answer.append(suggestion(incumbent, line_scores[incumbent], len(answer)))
        # a line that belongs elsewhere (another branch, a repository) is never drawn
        drawable = [s for s in answer if not elsewhere(s.text)]
        runs = index.count if index is not None else {}
        choices = [(s.text, s.confidence, s.score, runs.get(s.text, 0) > 0) for s in drawable]
        got = rule.draw(typed, choices, incumbent, history_size)
        if got is not None:
            ghost_line = drawable[got[0]].text
            at = next(i for i, s in enumerate(answer) if s.text == ghost_line)
            answer.insert(0, answer.pop(at)._replace(ghost=True, draw=got[1]))
        answer = answer[: max(n, 1)]
        answered: list[tuple[str, float]] = []
        for found in answer:
            if cancelled.is_set():
                return
            if found.text in model_lp:
                answered.append((found.text, model_lp[found.text]))
            yield found
        sent = {s.text for s in answer}
        if self.parts == "history":
            return  # nothing for typing through to continue: it continues the model's lines
        if not complete:
            more = [(c.text, model_lp[c.text]) for c in spare if c.text in model_lp and c.text not in sent]
            comp = tuple(ctx.get("completions") or ())
            self._remember(session, _Answer(key, typed, n, start, answered + more[:MAX_SPARE], comp))
        else:
            self._remember(session, None)

    # -- typing through a suggestion --------------------------------------------------------------

    def _remember(self, session: str, answer: _Answer | None) -> None:
        """Keep the session's whole answer (only a whole one: a cancelled request's is not), and
        its earlier answers in the same context for the inputs a backspace goes back to (those
        without their model state: a repeat needs none)."""
        if answer is None or not answer.lines:  # nothing to continue: the earlier ones stay
            return
        earlier = self.answers.pop(session, [])
        kept = [e for e in earlier if e.key == answer.key and e.typed != answer.typed][
            : ANSWERS_PER_SESSION - 1
        ]
        for e in kept:
            e.start = None
        self.answers[session] = [answer, *kept]
        while len(self.answers) > MAX_ANSWERS:
            self.answers.popitem(last=False)

    def _typed_through(
        self, session: str, key: str, ctx: dict[str, Any], n: int, start: Any, side: HistorySide,
        scored: list[str], judge: Callable[[str], float | None], lam: float, elsewhere: Callable[[str], bool],
    ) -> list[tuple[Candidate, float]] | None:  # fmt: skip
        """The answer to `typed` from the session's previous answer, when the user typed on along
        its top line, or from an earlier one for the same input (a repeat, a backspace back to
        it): its lines that still extend the input, rescored exactly as a search scores them (the
        model's log-probability given the longer input is the old one minus that of the typed
        bytes; P_hist and the judge are the new keystroke's). None when there is nothing to
        continue, the context or the history changed, or the top line no longer leads (then a
        search runs). The COMP items may have changed since (a new word begun). What it cannot
        do: propose a line the previous answer did not hold, but the history's and COMP's lines
        for the new input (docs/performance.md, "Typing through a suggestion")."""
        typed = str(ctx.get("input", ""))
        answers = [a for a in self.answers.get(session, []) if a.key == key]
        if not self.weights.typing_through or not answers:
            return None
        last = next((a for a in answers if a.typed == typed and n <= a.n), answers[0])
        if not typed.startswith(last.typed) or (typed == last.typed and n > last.n):
            return None
        if last.start is None and typed != last.typed:
            return None
        top = last.lines[0][0]
        any_line = self.weights.typing_through >= 2  # measured: any line of it, not only the top
        if not any_line and (not top.startswith(typed) or top.rstrip() == typed.rstrip()):
            return None
        kept = [(t, lp) for t, lp in last.lines if t.startswith(typed) and t.rstrip() != typed.rstrip()]
        # Their scores given the longer input: the old ones less what the typed bytes cost. When the
        # COMP items changed since (a word begun) this keeps the old frame's scores: scoring the
        # lines afresh in the new context was one batched prefill per line, 10-24 ms for 5-15
        # lines, more than the search it saves (a COMP frame moves the model's scores little:
        # docs/quality.md, "COMP").
        drop = self.generator.continuation_logprob(last.start, typed[len(last.typed) :])
        rescored = [(t, old_lp - drop) for t, old_lp in kept]
        # the history's and COMP's lines for this input that the answer did not hold, scored as a
        # search scores them (a new word's files, a line the pool has only now)
        have = {t for t, _ in kept}
        fresh = [t for t in scored if t not in have]
        if fresh:
            scores = self.generator.score_many(ctx, fresh, session=session, start=start)
            rescored += list(zip(fresh, scores, strict=True))
        offset, temperature = math.log(1 - lam), self.weights.model_temperature
        found: list[tuple[Candidate, float]] = []
        for text, lp in rescored:
            if text in scored:  # as `extra` is scored by a search
                score = self._mixture_score(text, lp, side.proposals, lam, elsewhere)
            else:
                adjust = judge(text)
                if adjust is None:
                    continue
                score = offset + lp / temperature + adjust
            found.append((Candidate(text, score, 0), lp))
        found.sort(key=lambda c: c[0].logprob, reverse=True)
        if not found or (not any_line and found[0][0].text != top):
            return None
        return found

    def _mixture_score(
        self, cmd: str, lp: float, proposals: dict[str, float], lam: float, elsewhere: Callable[[str], bool],
    ) -> float:  # fmt: skip
        """A scored line on the mixture's scale: log(lam P_hist + (1 - lam) P_model^(1/T)), less
        the penalty of a line that belongs to another branch or to a repository (`_elsewhere`)."""
        p = lam * proposals.get(cmd, 0.0) + (1 - lam) * math.exp(lp / self.weights.model_temperature)
        score = math.log(p) if p > 0 else -math.inf
        return score - (ELSEWHERE_PENALTY if elsewhere(cmd) else 0.0)

    def ranked(
        self, search: BeamSearch, extra: list[tuple[str, float]], judge: Callable[[str], float | None],
        n: int, lam: float, cancelled: threading.Event, model_lp: dict[str, float] | None = None,
        spare: list[Candidate] | None = None,
    ) -> Iterator[Candidate]:  # fmt: skip
        """The mixture's ranking: the history's scored proposals (`extra`, on the mixture's
        log-probability scale) and the lines the beams finish, best first, each yielded as soon as
        no live beam can beat it. A beam's score lp becomes log(1 - lam) + lp / T on the mixture's
        scale (its history share is 0); `judge` keeps (+0), demotes (a negative number added) or
        drops (None) each line a beam finishes; after max(n, drop_budget) drops the search stops
        and what it has is final (a model that keeps finishing junk would search to max_tokens).
        `model_lp` receives each kept line's log-probability under the model alone, `spare` the
        lines found but not yielded, best first (what typing through may continue besides)."""
        offset, temperature = math.log(1 - lam), self.weights.model_temperature

        def mixture(lp: float) -> float:
            return offset + lp / temperature

        pending = sorted((Candidate(t, s, 0) for t, s in extra if s > -math.inf), key=lambda c: c.logprob,
                         reverse=True)  # fmt: skip
        seen = {c.text for c in pending}
        yielded = dropped = 0
        budget = max(n, self.drop_budget)
        tail = int(self.weights.tail_steps)  # steps the search goes on after its first line is final
        first_at = 0
        while not search.exhausted:
            if cancelled.is_set():
                return
            if tail and yielded and search.steps - first_at >= tail:
                break  # the drawn line is final; the others are what the search has by now
            for cand in search.step():
                if cand.text in seen:
                    continue  # a history proposal: ranked with its own score
                seen.add(cand.text)
                adjust = judge(cand.text)
                if adjust is None:
                    dropped += 1
                else:
                    pending.append(Candidate(cand.text, mixture(cand.logprob) + adjust, cand.tokens))
                    if model_lp is not None:
                        model_lp[cand.text] = cand.logprob
            pending.sort(key=lambda c: c.logprob, reverse=True)
            bound = mixture(search.bound)
            while pending and pending[0].logprob >= bound and yielded < n:
                yield pending.pop(0)
                yielded += 1
                first_at = first_at or search.steps
            if yielded >= n:
                if spare is not None:
                    spare.extend(pending)
                return
            if len(pending) + yielded >= n:  # beams that cannot reach the top n any more
                search.prune((pending[n - yielded - 1].logprob - offset) * temperature)
            if dropped >= budget:
                break
        yield from pending[: n - yielded]  # beams ran out (or max_tokens, or junk): the rest is final
        if spare is not None:
            spare.extend(pending[n - yielded :])

    def _is_complete(self, typed: str, run_before: bool, p_end: float) -> bool:
        """Whether the input is a whole command already: then only the user's own history may
        continue it (`git status` is not followed by an invented ` -a`)."""
        if not typed or typed != typed.rstrip():  # a trailing space asks for more
            return False
        rule = int(self.weights.complete_rule)
        by_history = bool(rule & 1) and run_before
        by_model = bool(rule & 2) and p_end >= 0.5  # the end of the line is the likeliest next token
        return by_history or by_model

    def _judge(
        self, typed: str, ctx: dict[str, Any], side: HistorySide, complete: bool,
        missing: Callable[[str], bool] | None = None,
    ) -> Callable[[str], float | None]:  # fmt: skip
        """What happens to a line a beam finished (or COMP completed): kept (0), demoted (a
        negative number added to its score) or dropped (None). Dropped: half a command, a line
        that failed every time it ran (`gti log` when `gti` was not found too), one naming a path
        that is not there (`missing`: the disk check), and of the lines only the model wrote,
        those continuing a complete input, holding a secret, with an invented word
        (calmd/suggest/filters.py), cut off, or repeating a word."""
        index = self.index
        missing = missing or self._missing(ctx)
        cwd = str(ctx.get("cwd") or "")
        multiline = bool(ctx.get("multiline"))  # the client draws multi-line entries (the server's flag)
        kinds = self._kinds(ctx)

        def judge(text: str) -> float | None:
            if not sendable(text, multiline=multiline):
                return None  # drives the terminal (a newline only from a multi-line input typed)
            if text in side.proposals:
                return 0.0  # judged with the history's (`_history_side`)
            if not balanced(text) or missing(text):
                return None  # half a command, whoever wrote it (a past line out of the pool too)
            if index is not None and index.count.get(text, 0) > 0:  # the user's own line
                return None if index.failing(text) else 0.0
            if index is not None and index.missing(text):
                return None  # `gti log` when `gti` was not found
            if complete or find_secret(text) is not None or placeholder(text, typed) or repeats_word(text):
                return None
            if self.weights.vocabulary and (self._made_up(text, typed, cwd, kinds) or self._cut_off(text)):
                return None
            return 0.0

        return judge

    def _missing(self, ctx: dict[str, Any]) -> Callable[[str], bool]:
        """Whether a line's `cd` target or file argument is missing from the shell's cwd (always
        False without a disk or a cwd). Memoised for the request once known: a folder not listed
        in time is asked about again, as its listing comes while the keystroke is worked on."""
        disk, cwd = self.disk, str(ctx.get("cwd") or "")
        seen: dict[str, bool] = {}

        def missing(text: str) -> bool:
            if disk is None or not cwd:
                return False
            found = seen.get(text)
            if found is None:
                path, known = check_arguments(text, cwd, disk)
                found = path is not None
                if known:
                    seen[text] = found
            return found

        return missing

    @staticmethod
    def _disk_proposals(typed: str, ctx: dict[str, Any]) -> list[str]:
        """The input with the word being typed completed by each COMP item that is a path (the
        daemon's COMP: files and directories of the cwd), for a word after the command's first."""
        words, word = current_word(typed)
        if not words or not word or word.startswith("-"):
            return []
        stem = typed[: len(typed) - len(word)]
        items = [i for i in ctx.get("completions") or () if isinstance(i, str) and i.startswith(word)]
        paths = [i for i in items if i != word and (i.endswith("/") or "." in i or "/" in i)]
        return [stem + i for i in paths][:DISK_PROPOSALS]

    def _cut_off(self, text: str) -> bool:
        """A line only the model wrote that stops short: mid-word (`make to`), or after a flag
        the user always gave more words to and never ended a line with (`git push -u`)."""
        user = self.index.vocabulary if self.index is not None else None
        if cut_off(text, self.vocabulary, user):
            return True
        last = text.rsplit(None, 1)[-1] if text.strip() else ""
        return self.index is not None and flag_name(last) is not None and self.index.head_count(text) > 0

    def _elsewhere(self, ctx: dict[str, Any]) -> Callable[[str], bool]:
        """Whether a line belongs to another place than the shell's: a line the user only ever
        ran inside a git repository, or a git line only the model wrote, while the shell is in
        none; a line naming the branch it ran on, on another branch (`git push origin
        feature/login` on master). Such a line is demoted and never drawn. Only judged when the
        shell tells its cwd (the replay's histories do not: always False there)."""
        index = self.index
        cwd, branch = str(ctx.get("cwd") or ""), str(ctx.get("git") or "")
        if index is None or not cwd.startswith("/"):
            return lambda text: False

        def elsewhere(text: str) -> bool:
            if not branch:
                if text in index.count:
                    return index.repo_only(text)
                return first_word(text) == "git" and not outside_git(text)
            bound = index.bound_branch.get(text)
            return bound is not None and bound != branch

        return elsewhere

    def _made_up(self, text: str, typed: str, cwd: str, kinds: Callable[[str, str], str | None]) -> bool:
        """A line the user never ran with an invented subcommand or flag, the cwd pasted in, or an
        argument of the wrong kind (`kinds`: calmd/suggest/kinds.py)."""
        user = self.index.vocabulary if self.index is not None else None
        if invented(text, typed, self.vocabulary, user) is not None:
            return True
        return (bool(cwd) and cwd_argument(text, typed, cwd, self.home)) or kinds(text, typed) is not None

    def _kinds(self, ctx: dict[str, Any]) -> Callable[[str, str], str | None]:
        """`wrong_kind` for one request: paths judged on the disk's listings of the shell's cwd
        (none without a disk or a cwd), the COMP items as offered, the user's own words."""
        disk, cwd = self.disk, str(ctx.get("cwd") or "")
        comp = frozenset(str(c) for c in ctx.get("completions") or ())
        exists = (lambda path: disk.exists(cwd, path)) if disk is not None and cwd.startswith("/") else None
        index = self.index
        user, mine = (index.vocabulary, index.arguments) if index is not None else (None, None)

        def kinds(text: str, typed: str) -> str | None:
            return wrong_kind(
                text, typed, exists=exists, comp=comp, vocab=self.vocabulary, user=user, mine=mine
            )

        return kinds

    def early(self, ctx: dict[str, Any], session: str) -> tuple[str, float, bool] | None:
        """The history's best proposal, its confidence and whether it is drawn, without the model
        (what `complete` passes to its `early` callback)."""
        found: list[tuple[str, float, bool]] = []
        for _ in self.complete(ctx, 0, session, threading.Event(), lambda t, c, g: found.append((t, c, g))):
            pass
        return found[0] if found else None

    def _history_side(
        self, typed: str, ctx: dict[str, Any], session: str, missing: Callable[[str], bool] | None = None
    ) -> HistorySide:
        """History commands that extend the input, each with its history probability P_hist;
        those that never succeeded or name a missing path (`missing`) are not among them."""
        store, index = self.history, self.index
        if store is None or index is None:
            return HistorySide({}, set(), set())
        # what any shell recorded since the last keystroke; what an import or a sync added is read
        # between keystrokes (calmd/suggest/index_catch_up.py)
        keystroke_sync(index, store)
        if self.parts == "model":
            return HistorySide({}, set(), set())  # the ablation without the history's proposals
        context = [str(h.get("cmd", "")) for h in ctx.get("history") or [] if isinstance(h, dict)]
        prev = context[-1] if context else None
        pool = index.pool(typed, prev, size=int(self.weights.pool))
        if not pool:
            return HistorySide({}, set(), set())
        probs = self.ranker.probabilities(index.features(typed, pool, context))
        proposals: dict[str, float] = {}
        carry: set[str] = set()
        cwd = str(ctx.get("cwd") or "")
        kinds = self._kinds(ctx)
        for cmd, p in zip(pool, probs, strict=True):
            if not balanced(cmd) or not sendable(cmd, multiline=bool(ctx.get("multiline"))):
                continue  # half a command (an open quote or bracket), or one that drives the terminal
            if cmd not in index.count:  # a carry-over: a new line, judged as the model's are
                if (
                    find_secret(cmd) is not None
                    or placeholder(cmd, typed)
                    or (self.weights.vocabulary and self._made_up(cmd, typed, cwd, kinds))
                ):
                    continue
                carry.add(cmd)
            proposals[cmd] = float(p)
        if cwd and self.weights.same_cwd:
            for cmd in store.in_cwd(cwd, prefix=typed, limit=20):
                if cmd in proposals:
                    proposals[cmd] *= 1 + self.weights.same_cwd
        boost, half_life = self.weights.recent_boost, self.weights.recent_half_life_h * 3600
        if boost and index.newest_ts:
            for cmd in proposals:
                ts = index.last_ts.get(cmd)
                if ts is not None:
                    proposals[cmd] *= 1 + boost * 0.5 ** (max(0.0, index.newest_ts - ts) / half_life)
        total = sum(proposals.values())
        if total > 0:
            proposals = {cmd: p / total for cmd, p in proposals.items()}
        failing = {cmd for cmd in proposals if index.failing(cmd) or (missing is not None and missing(cmd))}
        for cmd in failing:
            del proposals[cmd]
        return HistorySide(proposals, carry, failing)


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
