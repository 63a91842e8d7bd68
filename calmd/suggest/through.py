"""The mixture's search and typing through it (a part of calmd/suggest/engine.py's ModelEngine):
the history's scored lines and the beams' merged on one log-probability scale (`ranked`), and a
keystroke that types along the previous answer's top line answered from that answer
(`_typed_through`) instead of a new search (docs/performance.md, "Typing through a suggestion")."""

from __future__ import annotations

import itertools
import json
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from calmd.history.store import HistoryStore
from calmd.model.generate import BeamSearch, Candidate, Generator
from calmd.suggest.judge import ELSEWHERE_PENALTY, HistorySide
from calmd.suggest.ranking import HistoryIndex

if TYPE_CHECKING:
    from calmd.suggest.engine import RankWeights

MAX_ANSWERS = 64  # sessions whose last answers are kept for typing through (as the prefix cache's)
MAX_SPARE = 10  # lines a search found beyond the n best that an answer keeps for typing through
ANSWERS_PER_SESSION = 8  # a session's answers kept: the newest, and earlier inputs a backspace returns to


@dataclass
class KeptAnswer:
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


class Mixture:
    """ModelEngine's mixture search and its answers kept for typing through."""

    weights: RankWeights
    generator: Generator
    answers: OrderedDict[str, list[KeptAnswer]]
    drop_budget: int

    def _remember(self, session: str, answer: KeptAnswer | None) -> None:
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
        check_top: bool = True,
    ) -> tuple[list[tuple[Candidate, float]], str] | None:  # fmt: skip
        """The answer to `typed` from the session's previous answer, when the user typed on along
        its top line, or from an earlier one for the same input (a repeat, a backspace back to
        it): its lines that still extend the input, rescored exactly as a search scores them (the
        model's log-probability given the longer input is the old one minus that of the typed
        bytes; P_hist and the judge are the new keystroke's). None when there is nothing to
        continue, the context or the history changed, or the top line no longer leads (then a
        search runs). The COMP items may have changed since (a new word begun). What it cannot
        do: propose a line the previous answer did not hold, but the history's and COMP's lines
        for the new input (docs/performance.md, "Typing through a suggestion"). Returns the lines
        with the previous answer's top line; `check_top=False` leaves whether it still leads to
        the caller (the reranker's order, engine.py)."""
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
        if not found or (check_top and not any_line and found[0][0].text != top):
            return None
        return found, top

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
