"""The model's own probability of the next words of a line: what a drawn head is worth.

A head (calmd/suggest/ghost.py `heads`: `docker run `, `docker run --rm `, ...) is right when the
user's next words are its words, whatever follows. The candidates' whole-line confidences say
little of that for a new user: every line the model writes is a guess as a whole line, while the
model may be sure of its first word (`git ` -> `status`, `docker ` -> `run`). So the head rule
also asks the model: log P(the head's words, then a word end | the context, the typed input),
the product of the probabilities of its bytes and of a space or the end of the line after them
(`Generator.word_end_logprobs`), calibrated on the training users by the rule's fit
(calmd/quality/fit_ghost.py).

One batched prefill of the answer's lines, `MAX_BYTES` past the input each, when the rule asks
(the ghost rule may weigh the next word of every candidate: `GhostRule.by_word`), kept per
session: typing along the same lines costs no model run (the log-probability of the bytes past
the longer input is the old one less what the typed bytes took, as for typing through).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from calmd.suggest.ghost import heads

MAX_SESSIONS = 64  # sessions whose last line is kept (as the prefix cache's)
# Bytes past the input scored (the keystroke's cost): heads that end further are not drawn on the
# model's word. Measured on the training users' states (`fit_ghost`): 16, 24, 32 or 64 bytes give
# the same keys saved and wrong ghosts within 0.1 point (a word-by-word user takes one word at a time).
MAX_BYTES = 24
LINES_PER_SESSION = 12  # lines kept per session: an answer's and the lines typing through brings back


@dataclass
class _Scored:
    key: str  # the model's whole context but the input (its frames, COMP included)
    typed: str  # the input the bytes were scored after
    line: str
    taken: npt.NDArray[np.float64]  # log P(byte i of line past `typed` | before)
    ends: npt.NDArray[np.float64]  # log P(a word end after i of those bytes)


def model_key(ctx: Mapping[str, Any]) -> str:
    """Everything of the request the model reads but the typed input (the COMP items included: a
    new COMP frame is another context)."""
    return json.dumps({k: v for k, v in ctx.items() if k != "input"}, sort_keys=True, default=str)


class NextWords:
    """log P(each head's words | context, input) of a line, per session (module docstring). Used
    from the daemon's single inference thread."""

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self._kept: OrderedDict[str, list[_Scored]] = OrderedDict()
        self.prefills = 0  # batched model runs (the rest came from a session's earlier keystroke)

    def head_logprobs(
        self, session: str, ctx: Mapping[str, Any], start: Any, line: str, key: str | None = None
    ) -> list[float]:
        """For each head of `line` past the input (`heads(line, typed)`, in order), log P(its words
        past the input, then a word end); -inf past the bytes scored. `start`: the model's state
        after the context and the input (`Generator.prepare`)."""
        found = self.answer(session, ctx, start, [line], key)
        return (found(line) if found is not None else None) or []

    def answer(
        self, session: str, ctx: Mapping[str, Any], start: Any, lines: Sequence[str], key: str | None = None,
        *, every: bool = True,
    ) -> Callable[[str], list[float] | None] | None:  # fmt: skip
        """`head_logprobs` for the lines of one answer: with `every` (the rule weighs the next word
        of each line), the first line asked for scores all of `lines` not kept yet in one batched
        pass; else each line when asked for (nothing runs until the rule asks: a grown user's never
        does). A line not among them gets None; no `start` (the input was truncated, or no model
        ran), no answer: the rule weighs heads without the model's word."""
        if start is None:
            return None
        typed = str(ctx.get("input") or "")
        wanted = [line for line in dict.fromkeys(lines) if line.startswith(typed) and len(line) > len(typed)]
        found: dict[str, _Scored] = {}
        # the context key, made when first asked (a grown user's rule never asks)
        context: list[str] = [] if key is None else [key]

        def logprobs(line: str) -> list[float] | None:
            if line not in wanted:
                return None
            if line not in found:
                if not context:
                    context.append(model_key(ctx))
                batch = [w for w in wanted if w not in found] if every else [line]
                found.update(self._scored(session, context[0], typed, batch, start))
            return self._heads(found[line], typed)

        return logprobs

    @staticmethod
    def _heads(scored: _Scored, typed: str) -> list[float]:
        def at(text: str) -> int:  # bytes past the input the line was scored after
            return len(text.encode("utf-8", "surrogateescape")) - len(
                scored.typed.encode("utf-8", "surrogateescape")
            )

        base = at(typed)
        cum = np.concatenate([[0.0], np.cumsum(scored.taken)])
        out: list[float] = []
        for head in heads(scored.line, typed):
            end = at(head[:-1] if head.endswith(" ") and head != scored.line else head)
            out.append(
                -math.inf if end >= len(scored.ends) else float(cum[end] - cum[base] + scored.ends[end])
            )
        return out

    def _scored(self, session: str, key: str, typed: str, lines: list[str], start: Any) -> dict[str, _Scored]:
        """Each line's bytes scored after `typed`, or after an earlier input along it in the same
        context (kept from an earlier keystroke); the others in one batched pass."""
        kept = self._kept.get(session, [])
        found: dict[str, _Scored] = {}
        typed_bytes = len(typed.encode("utf-8", "surrogateescape"))
        for s in kept:
            if s.key == key and s.line in lines and s.line not in found and typed.startswith(s.typed):
                # still scored far enough past the cursor (else scored afresh from here)
                covered = len(s.taken) - (typed_bytes - len(s.typed.encode("utf-8", "surrogateescape")))
                rest = len(s.line.encode("utf-8", "surrogateescape")) - typed_bytes
                if covered >= min(rest, MAX_BYTES // 2):
                    found[s.line] = s
        missing = [line for line in lines if line not in found]
        if missing:
            self.prefills += 1
            rests = [line[len(typed) :] for line in missing]
            scored = self.generator.word_end_logprobs(start, rests, max_bytes=MAX_BYTES)
            for line, (taken, ends) in zip(missing, scored, strict=True):
                found[line] = _Scored(key, typed, line, taken, ends)
        fresh = [found[line] for line in lines]
        self._kept[session] = [*fresh, *[s for s in kept if s.key == key and s.line not in found]][
            :LINES_PER_SESSION
        ]
        self._kept.move_to_end(session)
        while len(self._kept) > MAX_SESSIONS:
            self._kept.popitem(last=False)
        return found

    def forget(self, session: str) -> None:
        self._kept.pop(session, None)
