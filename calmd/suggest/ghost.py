"""The ghost rule: which candidate the shells draw as ghost text, and when none.

The daemon owns this decision (docs/protocol.md: each candidate says `ghost`), so zsh, bash,
`calmd complete` and `calm replay` apply one rule. It is fitted on replays of the training users
(calmd/quality/fit_ghost.py) to save the most keystrokes for the noise it shows, and travels in
calmd/data/ghost.json with the provenance of its fit.

For one keystroke:
- the early proposal (the history's best line, sent before the model runs) is drawn when its
  calibrated confidence reaches `early[bucket]`;
- the final answer's top line is drawn when its confidence reaches `final[bucket]`;
- a line already drawn for this keystroke (the early one: the incumbent) stays unless the top
  line beats it by `margin` nats of the mixture score: a ghost is drawn once, and replaced
  within the keystroke only by a clearly better one;
- a request's `min_confidence` (the shells' CALM_MIN_CONFIDENCE) replaces every threshold.
With `heads`, what is drawn is the longest head of the line (its next words) whose confidence
reaches the threshold: the summed confidence of the candidates that start with it, or, with a
fitted `head` calibration, the calibrated probability that the user's next words are the head's,
from the model's own probability of those words (calmd/suggest/next_words.py) and the summed
confidence (`head_row`): a new user's model lines are guesses as whole lines, their first words
often are not.
Buckets are contexts where a wrong ghost costs differently and the confidence means
differently: the empty prompt, and 1, 2-3, 4-7 and 8 or more typed characters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.errors import FormatError
from calmd.suggest.calibration import LOG_P_FLOOR, Head

BUCKETS = ("empty", "k1", "k2", "k4", "k8")
OLD = 1 << 30  # a history size past any young rule's: the grown-up rule


def bucket(typed: str) -> str:
    """The context a keystroke's ghost is judged in (module docstring)."""
    k = len(typed)
    return "empty" if k == 0 else "k1" if k == 1 else "k2" if k < 4 else "k4" if k < 8 else "k8"


def next_word(rest: str) -> str:
    """What forward-word accepts of the ghost text `rest` (the suggestion past the cursor): any
    spaces, the word, and the space that follows it; all of `rest` when no space follows."""
    start = len(rest) - len(rest.lstrip(" "))
    end = rest.find(" ", start)
    return rest if end < 0 else rest[: end + 1]


def heads(line: str, typed: str) -> list[str]:
    """The heads of `line` past the cursor a word-by-word user takes in turn (`next_word` after
    `next_word`), the last being the whole line: `heads("docker run --rm -it alpine", "docker r")`
    -> `["docker run ", "docker run --rm ", "docker run --rm -it ", "docker run --rm -it alpine"]`."""
    out: list[str] = []
    head = line[: len(typed)]
    while len(head) < len(line):
        head += next_word(line[len(head) :])
        out.append(head)
    return out


# (line, confidence, score[, known]): known, the user ran the line before (None: unknown)
Candidate = tuple[Any, ...]
# a line -> the model's log P(each of its heads' words | context, input), aligned with `heads`
# (calmd/suggest/next_words.py), or None where the model cannot say (no model ran)
HeadLogprobs = Callable[[str], "Sequence[float] | None"]

HEAD_FEATURES = (
    "log_p_words",  # the model's log P(the head's words past the input, then a word end), >= LOG_P_FLOOR
    "p_words",  # the same as a probability
    "summed",  # the summed confidence of the candidates that start with the head (the rule without)
    "log_words",  # log(1 + the words past the input)
    "whole",  # the head is the whole line
    "known",  # the line is one the user ran
    "log_history",  # log(1 + the commands in the history)
    "log_k",  # log(1 + the characters typed)
    "empty",  # nothing typed
    "mid_word",  # the input ends inside a word: the head completes it
    "line_confidence",  # the line's own (whole-line) confidence
    "young_x_log_p",  # a history under 100 commands: the model's word is all there is
)


def head_row(
    *, log_p: float, summed: float, words: int, whole: bool, known: bool, history: int, typed: str,
    line_confidence: float,
) -> list[float]:  # fmt: skip
    """HEAD_FEATURES for one head   (len(HEAD_FEATURES),)"""
    log_p = max(log_p, LOG_P_FLOOR)
    return [log_p, math.exp(log_p), min(summed, 1.0), math.log1p(words), whole, known, math.log1p(history),
            math.log1p(len(typed)), not typed, bool(typed) and not typed.endswith(" "), line_confidence,
            log_p * (history < 100)]  # fmt: skip


@dataclass(frozen=True)
class GhostRule:
    final: Mapping[str, float]  # bucket -> the least confidence of what is drawn after the answer
    early: Mapping[str, float]  # bucket -> the early proposal's least confidence to be drawn
    margin: float = 0.0  # nats the top line must beat the drawn incumbent by to replace it
    # Draw the likely head of the line (`draw`), not only whole lines.
    heads: bool = False
    # bucket -> the least confidence for (a head of) a line the user ran before (None: `final`):
    # the confidence of their own lines and of the model's means differently.
    known: Mapping[str, float] | None = None
    # A new user: while the history holds fewer than `young` commands, `young_rule` applies (the
    # confidence means differently with little history); it may have a younger rule of its own (a
    # newborn history of a few commands, where nothing but the model can suggest).
    young: int = 0
    young_rule: GhostRule | None = None
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)  # provenance of the fit
    # The heads' calibration (HEAD_FEATURES; None: a head's confidence is the summed confidence of
    # the candidates that start with it), shared by the young rule.
    head: Head | None = field(default=None, compare=False)
    # With `heads`: draw the line whose next word is the likeliest (its first head's confidence),
    # not the top line, unless a line drawn already stays.
    by_word: bool = False

    def __post_init__(self) -> None:
        for name in ("final", "early", "known"):
            table = getattr(self, name)
            missing = [b for b in BUCKETS if table is not None and b not in table]
            assert not missing, f"ghost rule: {name} lacks {missing}"
        assert not self.young or self.young_rule is not None, "ghost rule: young without its rule"
        if self.young_rule is not None and self.young_rule.head is None and self.head is not None:
            object.__setattr__(self, "young_rule", replace(self.young_rule, head=self.head))  # shared

    @classmethod
    def uniform(cls, threshold: float, margin: float = 0.0, heads: bool = False) -> GhostRule:
        """One threshold everywhere (CALM_MIN_CONFIDENCE, or a checkout without a fitted rule)."""
        table = dict.fromkeys(BUCKETS, threshold)
        return cls(table, table, margin, heads)

    def head_confidences(
        self, typed: str, line: str, candidates: Sequence[Candidate], line_confidence: float, known: bool,
        history: int, logprobs: Sequence[float] | None,
    ) -> list[tuple[str, float]]:  # fmt: skip
        """Each head of `line` past `typed` (`heads`) with its confidence: the summed confidence
        of the `candidates` that start with it, or with `head` and the model's `logprobs` of the
        heads, the calibrated probability that the user's next words are the head's."""
        found = heads(line, typed)
        summed = [sum(c[1] for c in candidates if c[0].startswith(h)) for h in found]
        if self.head is None or logprobs is None or len(logprobs) != len(found):
            return list(zip(found, summed, strict=True))
        rows = np.array([
            head_row(log_p=lp, summed=s, words=i + 1, whole=h == line, known=known, history=history,
                     typed=typed, line_confidence=line_confidence)
            for i, (h, s, lp) in enumerate(zip(found, summed, logprobs, strict=True))
        ], dtype=np.float64)  # fmt: skip
        return list(zip(found, self.head.probabilities(rows).tolist(), strict=True))

    def next_word_confidences(
        self, typed: str, candidates: Sequence[Candidate], history: int, head_logprobs: HeadLogprobs | None
    ) -> list[float]:
        """The confidence of each candidate's first head (its next word, `head_confidences`), in
        one pass of the calibration (what `by_word` chooses by, at every keystroke)."""
        rows: list[list[float]] = []
        at: list[int] = []
        out = [0.0] * len(candidates)
        for i, (line, confidence, *rest) in enumerate(candidates):
            first = next_word(line[len(typed) :])
            head = line[: len(typed)] + first
            summed = sum(c[1] for c in candidates if c[0].startswith(head))
            logprobs = head_logprobs(line) if head_logprobs is not None and self.head is not None else None
            if self.head is None or not logprobs:
                out[i] = summed
                continue
            known = len(rest) > 1 and bool(rest[1])
            rows.append(head_row(log_p=logprobs[0], summed=summed, words=1, whole=head == line, known=known,
                                 history=history, typed=typed, line_confidence=confidence))  # fmt: skip
            at.append(i)
        if rows:
            assert self.head is not None
            for i, p in zip(
                at, self.head.probabilities(np.array(rows, dtype=np.float64)).tolist(), strict=True
            ):
                out[i] = p
        return out

    def overridden(self, min_confidence: float | None) -> GhostRule:
        """The rule with every threshold set to the shell's CALM_MIN_CONFIDENCE (None: as fitted);
        the heads stay as fitted: the threshold is what a drawn head must reach."""
        if min_confidence is None:
            return self
        table = dict.fromkeys(BUCKETS, min_confidence)
        return replace(self, final=table, early=table, known=None, young=0, young_rule=None)

    def at(self, history: int) -> GhostRule:
        """The rule for a history of `history` commands."""
        if self.young and history < self.young:
            assert self.young_rule is not None
            return self.young_rule.at(history)  # (a young rule may have a younger one: a newborn's)
        return self

    def draws_early(self, typed: str, confidence: float, history: int = OLD) -> bool:
        return confidence >= self.at(history).early[bucket(typed)]

    def draw(
        self,
        typed: str,
        candidates: Sequence[Candidate],
        incumbent: str | None = None,
        history: int = OLD,
        head_logprobs: HeadLogprobs | None = None,
        *,
        confidences: Callable[[str], Sequence[tuple[str, float]]] | None = None,
    ) -> tuple[int, str] | None:
        """What the shell draws after the answer: (the index of its line among `candidates`, the
        text drawn), or None. `candidates`: (line, confidence, score[, known]), best score first,
        all extending `typed`; `history`: the commands the user's history holds.

        The line: the top one, unless `incumbent` (what is drawn already: the early line, or the
        ghost the user typed along, a whole line or a head of one) is the head of a candidate
        whose score is within `margin` nats of the top's: then that candidate, so a ghost is
        drawn once and replaced within the keystroke only by a clearly better one.
        What of it is drawn: with `heads`, the longest head (`heads`) whose confidence
        (`head_confidences`: the summed confidence of the candidates that start with it, or the
        calibrated one from the model's `head_logprobs` of the line) reaches the threshold: a sure
        `docker run --rm -it ` is drawn even when the image name after it is a guess; without,
        the whole line when its own confidence does. `confidences`: a line -> its heads with their
        confidences, where the caller has them already (the fit simulates many rules over the
        same answers)."""
        if not candidates:
            return None
        rule = self.at(history)
        pick, kept = 0, None
        if incumbent is not None:
            for i, cand in enumerate(candidates):
                if cand[0].startswith(incumbent):
                    if candidates[0][2] - cand[2] <= rule.margin:
                        pick, kept = i, incumbent  # on the screen already: it stays
                    break

        def own(i: int) -> bool:
            return len(candidates[i]) > 3 and bool(candidates[i][3])

        def heads_of(i: int) -> Sequence[tuple[str, float]]:
            line = candidates[i][0]
            if confidences is not None:
                return confidences(line)
            logprobs = head_logprobs(line) if head_logprobs is not None and rule.head is not None else None
            return rule.head_confidences(typed, line, candidates, candidates[i][1], own(i), history, logprobs)

        if rule.heads and rule.by_word and kept is None and len(candidates) > 1:
            if confidences is not None:
                firsts = [found[0][1] if (found := confidences(c[0])) else 0.0 for c in candidates]
            else:
                firsts = rule.next_word_confidences(typed, candidates, history, head_logprobs)
            # the line whose next word is the likeliest (ties: the better score)
            pick = max(range(len(candidates)), key=lambda i: (firsts[i], -i))
        line, confidence = candidates[pick][0], candidates[pick][1]
        table = rule.known if own(pick) and rule.known is not None else rule.final
        threshold = table[bucket(typed)]
        if not rule.heads:
            return (pick, line) if confidence >= threshold or kept is not None else None
        drawn = kept
        for head, head_confidence in heads_of(pick):
            if head_confidence < threshold:
                break
            if drawn is None or len(head) > len(drawn):
                drawn = head
        return (pick, drawn) if drawn is not None else None

    def choose(
        self,
        typed: str,
        candidates: Sequence[Candidate],
        incumbent: str | None = None,
        history: int = OLD,
        head_logprobs: HeadLogprobs | None = None,
    ) -> int | None:
        """The index of the line `draw` draws (or a head of), or None."""
        got = self.draw(typed, candidates, incumbent, history, head_logprobs)
        return got[0] if got is not None else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"final": dict(self.final), "early": dict(self.early), "margin": self.margin,
                               "heads": self.heads}  # fmt: skip
        if self.by_word:
            out["by_word"] = True
        if self.known is not None:
            out["known"] = dict(self.known)
        if self.young:
            assert self.young_rule is not None
            young = self.young_rule.to_json()
            young.pop("info", None)
            if young.get("head") == (self.head.to_json() if self.head is not None else None):
                young.pop("head", None)  # shared: written once
            out["young"] = {"below": self.young, **young}
        if self.head is not None:
            out["head"] = self.head.to_json()
        return {**out, "info": dict(self.info)} if self.info else out

    @classmethod
    def from_json(cls, data: Any, source: str = "ghost rule") -> GhostRule:
        try:
            final = {b: float(data["final"][b]) for b in BUCKETS}
            early = {b: float(data["early"][b]) for b in BUCKETS}
            known = {b: float(data["known"][b]) for b in BUCKETS} if data.get("known") is not None else None
            margin = float(data.get("margin", 0.0))
            heads = data.get("heads", False)
            by_word = data.get("by_word", False)
            if not isinstance(heads, bool) or not isinstance(by_word, bool):
                raise TypeError(f"heads, by_word: {heads!r}, {by_word!r} are not true or false")
            young_data = data.get("young")
            young = int(young_data["below"]) if young_data is not None else 0
            head_data = data.get("head")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"{source}: not a ghost rule ({exc!r})") from None
        if young < 0:
            raise FormatError(f"{source}: young.below: {young} is negative")
        head = None
        if head_data is not None:
            if not isinstance(head_data, dict) or head_data.get("features") != list(HEAD_FEATURES):
                raise FormatError(f"{source}: head: features differ from this calmd's "
                                  "(python -m calmd.quality.fit_ghost refits)")  # fmt: skip
            head = Head.from_json(head_data, HEAD_FEATURES, f"{source}: head")
        young_rule = None
        if young_data is not None:
            young_rule = cls.from_json(young_data, f"{source}: young")
            if young_rule.young >= young:
                raise FormatError(f"{source}: young.young.below: {young_rule.young} is not below {young}")
            if young_rule.head is None:
                young_rule = replace(young_rule, head=head)
        info = dict(data.get("info") or {})
        return cls(final, early, margin, heads, known, young, young_rule, info, head, by_word)


def packaged_rule_path() -> Path:
    return paths.PACKAGE_DATA / paths.PACKAGED_GHOST


@cache
def packaged_rule() -> GhostRule:
    """The fitted rule shipped in the package; a checkout that has not fitted one yet draws at
    the calibration's 0.5 (DEFAULT_MIN_CONFIDENCE), as before the rule existed."""
    path = packaged_rule_path()
    if not path.exists():
        from calmd.protocol import DEFAULT_MIN_CONFIDENCE

        return GhostRule.uniform(DEFAULT_MIN_CONFIDENCE)
    return GhostRule.from_json(json.loads(path.read_text()), str(path))
