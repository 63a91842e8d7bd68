"""The daemon's completion engine: model candidates merged with the user's history, ranked.

For one keystroke (`ctx` with the typed `input`):
1. the history proposes commands that extend the input (for an empty input: the recent commands
   and those that followed the previous command), each with a probability P_hist from the
   learned ranker of calmd/daemon/ranking.py (transitions, counts, distances; fitted on public
   histories, docs/learning.md), raised for commands run in the same cwd before and for
   commands run lately (by the clock, where the store has timestamps); junk is dropped
   (calmd/daemon/filters.py: unbalanced quotes or brackets) and commands that never succeeded are
   demoted below every other. The best of them is the `early` proposal, sent before the model
   runs when the client asks for it;
2. the model proposes `n` completions by beam search from the cached context state
   (calmd/model/generate.py), each with its log-probability; a line only the model proposes is
   dropped when it is junk, holds a secret, pastes the cwd in, invents a subcommand or flag
   (calmd/daemon/filters.py), or extends an input that is a complete command already (the user ran
   exactly it, or the model's likeliest next token is the end of the line);
3. the likeliest history proposals are scored by the model too (log P(command | context), one
   batched pass);
4. both are ranked as a mixture of the two predictors, the history "cache model" and the
   language model:  P(cmd) = lam * P_hist(cmd) + (1 - lam) * P_model(cmd) ** (1 / T).
   A command the user ran before thus needs no luck from the model, and the model still orders
   close calls and proposes what the history has never seen;
5. duplicates are merged and the best `n` are streamed, each as soon as its rank is final, with
   its calibrated confidence (calmd/daemon/calibration.py).
The disk (issue 15, calmd/daemon/disk.py): the COMP frame's items that complete the word being
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
from calmd.daemon.calibration import Calibrator, candidate_row, early_row, packaged_calibrator
from calmd.daemon.disk import DIR_ARGUMENT, Disk, missing_argument
from calmd.daemon.filters import (
    Vocabulary,
    balanced,
    cwd_argument,
    invented,
    packaged_vocabulary,
    sendable,
)
from calmd.daemon.ranking import POOL_RECENT, HistoryIndex, Ranker, packaged_ranker
from calmd.errors import CalmError
from calmd.history.frames import VocabularyFollowers, current_word
from calmd.history.secrets import find_secret
from calmd.history.store import HistoryStore
from calmd.model.checkpoint import load_model
from calmd.model.generate import BeamSearch, Candidate

FAILING_PENALTY = 50.0  # nats off a never-successful command's score: below every other candidate
MISSING_PENALTY = 25.0  # nats off a line naming a path that is not there: below the lines that exist
DISK_PROPOSALS = 4  # COMP items proposed as whole lines (scored in the history's batch)
# Junk lines (calmd/daemon/filters.py) the beams may finish before the search stops with what it has: as
# many as candidates asked for, at least 8. Without a bound a model that keeps finishing junk
# searched to max_tokens (45 ms; done p99 58 ms instead of 19 in bench/latency.py); with 2 the
# tiny test model's `git sta`, `git stas`, ... on the way ended the search before `git stash
# pop`, and with 5 before it too. In-process p50 / p99 with 5, 8, 10: 8.3 / 18.4, 9.2 / 18.5,
# 9.4 / 19.2 ms (interleaved, bench/latency.py's keystrokes).
DROP_BUDGET = 8


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
                    f"--weight {item}: unknown weight {name!r}; known: {', '.join(sorted(known))}"
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
    confidence: float  # calibrated P(this is the whole line the user runs), calmd/daemon/calibration.py
    features: np.ndarray | None = None  # the calibration's inputs, with `explain=True`


EarlyCallback = Callable[[str, float], None]


@dataclass
class HistorySide:
    """The history's proposals for one keystroke, after the junk filters."""

    proposals: dict[str, float]  # command -> P_hist (normalised over what is left)
    carry: set[str]  # which of them are carry-overs (new lines, not past commands)
    failing: set[str]  # which of them never succeeded (demoted, confidence 0)

    def ordered(self) -> list[str]:
        """Best first; a failing command after every other."""
        return sorted(self.proposals, key=lambda c: (c not in self.failing, self.proposals[c]), reverse=True)


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


def context_key(ctx: dict[str, Any]) -> str:
    """Everything of a request's context but the typed input, as one string: two requests with
    the same key differ only by what was typed (the context is opaque here: frames, cwd, git and
    whatever else it carries)."""
    return json.dumps({k: v for k, v in ctx.items() if k != "input"}, sort_keys=True, default=str)


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
    ) -> None:
        import torch

        from calmd.model.generate import Generator

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
        self.calibrator = calibrator or packaged_calibrator()
        self.vocabulary = vocabulary or packaged_vocabulary()
        self.home = os.environ.get("HOME")
        self.max_scored = 8  # history proposals scored by the model per request (latency bound)
        self.drop_budget = DROP_BUDGET
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
            "answers": {"searched": self.searches, "typed_through": self.reused},
        }

    def complete(
        self,
        ctx: dict[str, Any],
        n: int,
        session: str,
        cancelled: threading.Event,
        early: EarlyCallback | None = None,
        *,
        explain: bool = False,
    ) -> Iterator[Suggestion]:
        """Stream the best `n` candidates, each as soon as its rank is final. `early` is called
        once, before the model runs, with the history's best proposal and its confidence (not
        at all when the history has none)."""
        typed = ctx.get("input", "")
        side = self._history_side(typed, ctx, session)
        index = self.index
        history_size = len(index) if index is not None else 0
        ordered = side.ordered()
        input_run_before = index is not None and bool(typed) and index.count.get(typed, 0) > 0
        if early is not None and ordered and ordered[0] not in side.failing:
            best = ordered[0]
            second = side.proposals[ordered[1]] if len(ordered) > 1 else 0.0
            count = index.count.get(best, 0) if index is not None else 0
            row = early_row(p_hist=side.proposals[best], second_p_hist=second, carry=best in side.carry,
                            k=len(typed), input_run_before=input_run_before, count=count,
                            history=history_size)  # fmt: skip
            if explain:
                self.explained_early = (best, row)
            early(best, round(self.calibrator.early.probability(row), 3))
        if n <= 0 or cancelled.is_set():
            return
        proposals = side.proposals
        lam = self.weights.history_mix if proposals else 0.0
        start, model_typed = self.generator.prepare(ctx, session)  # once: building the sequence costs 0.3 ms
        missing = self._missing(ctx)
        p_end = self.generator.end_probability(ctx, session=session, start=start)
        complete = self._is_complete(typed, input_run_before, p_end)
        judge = self._judge(typed, ctx, side, complete, missing)
        top_p_hist = side.proposals[ordered[0]] if ordered else 0.0
        key = f"{context_key(ctx)}|{history_version(index)}"  # the same context over the same store
        # The history proposals the model scores (latency bound), and the lines COMP completes.
        scored = ordered[: self.max_scored] + [
            c for c in self._disk_proposals(typed, ctx) if c not in proposals
        ]
        model_lp: dict[str, float] = {}  # each candidate's log P_model(line | context, input)
        spare: list[Candidate] = []  # lines the search found beyond the n best, kept for typing through
        through = None
        if not complete and model_typed == typed:
            through = self._typed_through(session, key, typed, n, start, side, scored, judge, lam, missing)
        if through is not None:
            self.reused += 1
            ranked: Iterator[Candidate] = iter([c for c, _ in through[:n]])
            spare = [c for c, _ in through[n:]]
            model_lp = {c.text: lp for c, lp in through}
        else:
            self.searches += 1
            # Score the likeliest history proposals and COMP's lines with the model: one batched pass.
            extra: list[tuple[str, float]] = []
            if scored:
                scores = self.generator.score_many(ctx, scored, session=session, start=start)
                for cmd, lp in zip(scored, scores, strict=True):
                    extra.append((cmd, self._mixture_score(cmd, lp, proposals, side, lam, missing)))
                    model_lp[cmd] = lp
            if complete:  # only lines the user ran may continue it: no beams, no carry-overs
                own = [Candidate(c, s, 0) for c, s in extra if c not in side.carry]
                ranked = iter(sorted(own, key=lambda c: c.logprob, reverse=True)[:n])
            else:
                search = self.generator.beam_search(ctx, width=max(self.generator.beam_width, n), start=start)
                ranked = self.ranked(search, extra, judge, n, lam, cancelled, model_lp, spare)
        answered: list[tuple[str, float]] = []
        for rank, cand in enumerate(ranked):
            if cancelled.is_set():
                return
            score, text = cand.logprob, cand.text
            count = index.count.get(text, 0) if index is not None else 0
            row = candidate_row(
                log_p=score, p_hist=proposals.get(text, 0.0), top_p_hist=top_p_hist,
                model_only=text not in proposals and count == 0, carry=text in side.carry, rank=rank,
                k=len(typed), p_end=p_end, input_run_before=input_run_before, count=count,
                history=history_size,
            )  # fmt: skip
            failing = text in side.failing or (index is not None and index.failing(text))  # `gti log` too
            failing = failing or missing(text)  # never shown unasked either
            confidence = 0.0 if failing else round(self.calibrator.candidate.probability(row), 3)
            if text in model_lp:
                answered.append((text, model_lp[text]))
            yield Suggestion(text, score, confidence, row if explain else None)
        if not complete:
            sent = {text for text, _ in answered}
            more = [(c.text, model_lp[c.text]) for c in spare if c.text in model_lp and c.text not in sent]
            self._remember(session, _Answer(key, typed, n, start, answered + more[:MAX_SPARE]))
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
        self, session: str, key: str, typed: str, n: int, start: Any, side: HistorySide,
        scored: list[str], judge: Callable[[str], float | None], lam: float, missing: Callable[[str], bool],
    ) -> list[tuple[Candidate, float]] | None:  # fmt: skip
        """The answer to `typed` from the session's previous answer, when the user typed on along
        its top line, or from an earlier one for the same input (a repeat, a backspace back to
        it): its lines that still extend the input, rescored exactly as a search scores them (the
        model's log-probability given the longer input is the old one minus that of the typed
        bytes; P_hist and the judge are the new keystroke's). None when there is nothing to
        continue, the context or the history changed, or the top line no longer leads (then a
        search runs). What it cannot do: propose a line the previous answer did not hold
        (docs/performance.md, "Typing through a suggestion")."""
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
        drop = self.generator.continuation_logprob(last.start, typed[len(last.typed) :])
        offset, temperature = math.log(1 - lam), self.weights.model_temperature
        found: list[tuple[Candidate, float]] = []
        for text, old_lp in last.lines:
            if not text.startswith(typed) or text.rstrip() == typed.rstrip():
                continue
            lp = old_lp - drop
            if text in scored:  # as `extra` is scored by a search
                score = self._mixture_score(text, lp, side.proposals, side, lam, missing)
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
        self, cmd: str, lp: float, proposals: dict[str, float], side: HistorySide, lam: float,
        missing: Callable[[str], bool],
    ) -> float:  # fmt: skip
        """A scored line on the mixture's scale: log(lam P_hist + (1 - lam) P_model^(1/T)), less
        the penalty of a failed command or of a path that is not on the disk."""
        p = lam * proposals.get(cmd, 0.0) + (1 - lam) * math.exp(lp / self.weights.model_temperature)
        score = math.log(p) if p > 0 else -math.inf
        return score - (FAILING_PENALTY if cmd in side.failing else MISSING_PENALTY if missing(cmd) else 0.0)

    def ranked(
        self, search: BeamSearch, extra: list[tuple[str, float]], judge: Callable[[str], float | None],
        n: int, lam: float, cancelled: threading.Event, model_lp: dict[str, float] | None = None,
        spare: list[Candidate] | None = None,
    ) -> Iterator[Candidate]:  # fmt: skip
        """The mixture's ranking: the history's scored proposals (`extra`, on the mixture's
        log-probability scale) and the lines the beams finish, best first, each yielded as soon as
        no live beam can beat it. A beam's score lp becomes log(1 - lam) + lp / T on the mixture's
        scale (its history share is 0); `judge` keeps (+0), demotes (a negative number added) or
        drops (None) each line a beam finishes; after max(n, drop_budget) drops (lines demoted for
        a missing path count too) the search stops and what it has is final (a model that keeps
        finishing junk would search to max_tokens). `model_lp` receives each kept line's
        log-probability under the model alone, `spare` the lines found but not yielded, best first
        (what typing through may continue besides)."""
        offset, temperature = math.log(1 - lam), self.weights.model_temperature

        def mixture(lp: float) -> float:
            return offset + lp / temperature

        pending = sorted((Candidate(t, s, 0) for t, s in extra if s > -math.inf), key=lambda c: c.logprob,
                         reverse=True)  # fmt: skip
        seen = {c.text for c in pending}
        yielded = dropped = 0
        budget = max(n, self.drop_budget)
        while not search.exhausted:
            if cancelled.is_set():
                return
            for cand in search.step():
                if cand.text in seen:
                    continue  # a history proposal: ranked with its own score
                seen.add(cand.text)
                adjust = judge(cand.text)
                if adjust is None:
                    dropped += 1
                else:
                    pending.append(Candidate(cand.text, mixture(cand.logprob) + adjust, cand.tokens))
                    # A line naming a missing path is kept, demoted, but counts toward the budget
                    # as a dropped one: beams that keep finishing `tail -f /var/log/sys...` where
                    # there is no such file searched on (done p50 +10% in bench/ab_latency.py).
                    dropped += adjust == -MISSING_PENALTY
                    if model_lp is not None:
                        model_lp[cand.text] = cand.logprob
            pending.sort(key=lambda c: c.logprob, reverse=True)
            bound = mixture(search.bound)
            while pending and pending[0].logprob >= bound and yielded < n:
                yield pending.pop(0)
                yielded += 1
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
        """What happens to a line a beam finished: kept (0), demoted (a negative number added to
        its score) or dropped (None). `missing`: the disk check (`_missing`)."""
        index = self.index
        missing = missing or self._missing(ctx)
        cwd = str(ctx.get("cwd") or "")

        def judge(text: str) -> float | None:
            if not sendable(text, multiline=True):
                return None  # drives the terminal (a newline only from a multi-line input typed)
            if text in side.proposals:
                return -FAILING_PENALTY if text in side.failing else 0.0  # judged with the history's
            if not balanced(text):
                return None  # half a command, whoever wrote it (a past line out of the pool too)
            if index is not None and index.count.get(text, 0) > 0:  # the user's own line
                return -FAILING_PENALTY if index.failing(text) else -MISSING_PENALTY if missing(text) else 0.0
            if index is not None and index.missing(text):
                return -FAILING_PENALTY  # `gti log` when `gti` was not found
            if complete or find_secret(text) is not None:
                return None
            if self.weights.vocabulary and self._made_up(text, typed, cwd):
                return None
            if missing(text):  # a made-up `cd` into nothing goes; a new file may be meant
                return None if text.split(maxsplit=1)[0] in DIR_ARGUMENT else -MISSING_PENALTY
            return 0.0

        return judge

    def _missing(self, ctx: dict[str, Any]) -> Callable[[str], bool]:
        """Whether a line's `cd` target or file argument is missing from the shell's cwd (memoised
        for the request; always False without a disk or a cwd)."""
        disk, cwd = self.disk, str(ctx.get("cwd") or "")
        seen: dict[str, bool] = {}

        def missing(text: str) -> bool:
            if disk is None or not cwd:
                return False
            found = seen.get(text)
            if found is None:
                found = seen[text] = missing_argument(text, cwd, disk) is not None
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

    def _made_up(self, text: str, typed: str, cwd: str) -> bool:
        user = self.index.vocabulary if self.index is not None else None
        if invented(text, typed, self.vocabulary, user) is not None:
            return True
        return bool(cwd) and cwd_argument(text, typed, cwd, self.home)

    def early(self, ctx: dict[str, Any], session: str) -> tuple[str, float] | None:
        """The history's best proposal and its confidence, without the model (what `complete`
        passes to its `early` callback)."""
        found: list[tuple[str, float]] = []
        for _ in self.complete(ctx, 0, session, threading.Event(), lambda t, c: found.append((t, c))):
            pass
        return found[0] if found else None

    def _history_side(self, typed: str, ctx: dict[str, Any], session: str) -> HistorySide:
        """History commands that extend the input, each with its history probability P_hist."""
        store, index = self.history, self.index
        if store is None or index is None:
            return HistorySide({}, set(), set())
        index.sync(store)  # what any shell recorded since the last keystroke
        context = [str(h.get("cmd", "")) for h in ctx.get("history") or [] if isinstance(h, dict)]
        prev = context[-1] if context else None
        pool = index.pool(typed, prev, size=int(self.weights.pool))
        if not pool:
            return HistorySide({}, set(), set())
        probs = self.ranker.probabilities(index.features(typed, pool, context))
        proposals: dict[str, float] = {}
        carry: set[str] = set()
        cwd = str(ctx.get("cwd") or "")
        for cmd, p in zip(pool, probs, strict=True):
            if not balanced(cmd) or not sendable(cmd, multiline=True):
                continue  # half a command (an open quote or bracket), or one that drives the terminal
            if cmd not in index.count:  # a carry-over: a new line, judged as the model's are
                if find_secret(cmd) is not None or (
                    self.weights.vocabulary and self._made_up(cmd, typed, cwd)
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
        failing = {cmd for cmd in proposals if index.failing(cmd)}
        return HistorySide(proposals, carry, failing)


def load_engine(path: Path) -> ModelEngine:
    """The server's engine loader: the weight file, else the default model shipped in the package."""
    return ModelEngine(paths.serving_weights(path))
