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
Buckets are contexts where a wrong ghost costs differently and the confidence means
differently: the empty prompt, and 1, 2-3, 4-7 and 8 or more typed characters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.errors import FormatError

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
    # confidence means differently with little history, and a new user's trust is cheaper lost).
    young: int = 0
    young_rule: GhostRule | None = None
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)  # provenance of the fit

    def __post_init__(self) -> None:
        for name in ("final", "early", "known"):
            table = getattr(self, name)
            missing = [b for b in BUCKETS if table is not None and b not in table]
            assert not missing, f"ghost rule: {name} lacks {missing}"
        assert not self.young or self.young_rule is not None, "ghost rule: young without its rule"

    @classmethod
    def uniform(cls, threshold: float, margin: float = 0.0, heads: bool = False) -> GhostRule:
        """One threshold everywhere (CALM_MIN_CONFIDENCE, or a checkout without a fitted rule)."""
        table = dict.fromkeys(BUCKETS, threshold)
        return cls(table, table, margin, heads)

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
            return self.young_rule
        return self

    def draws_early(self, typed: str, confidence: float, history: int = OLD) -> bool:
        return confidence >= self.at(history).early[bucket(typed)]

    def draw(
        self, typed: str, candidates: Sequence[Candidate], incumbent: str | None = None, history: int = OLD
    ) -> tuple[int, str] | None:
        """What the shell draws after the answer: (the index of its line among `candidates`, the
        text drawn), or None. `candidates`: (line, confidence, score[, known]), best score first,
        all extending `typed`; `history`: the commands the user's history holds.

        The line: the top one, unless `incumbent` (what is drawn already: the early line, or the
        ghost the user typed along, a whole line or a head of one) is the head of a candidate
        whose score is within `margin` nats of the top's: then that candidate, so a ghost is
        drawn once and replaced within the keystroke only by a clearly better one.
        What of it is drawn: with `heads`, the longest head (`heads`) whose confidence, the
        summed confidence of the candidates that start with it, reaches the threshold: a sure
        `docker run --rm -it ` is drawn even when the image name after it is a guess; without,
        the whole line when its own confidence does."""
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
        line, confidence = candidates[pick][0], candidates[pick][1]
        known = len(candidates[pick]) > 3 and bool(candidates[pick][3])
        table = rule.known if known and rule.known is not None else rule.final
        threshold = table[bucket(typed)]
        if not rule.heads:
            return (pick, line) if confidence >= threshold or kept is not None else None
        drawn = kept
        for head in heads(line, typed):
            if sum(c[1] for c in candidates if c[0].startswith(head)) < threshold:
                break
            if drawn is None or len(head) > len(drawn):
                drawn = head
        return (pick, drawn) if drawn is not None else None

    def choose(
        self, typed: str, candidates: Sequence[Candidate], incumbent: str | None = None, history: int = OLD
    ) -> int | None:
        """The index of the line `draw` draws (or a head of), or None."""
        got = self.draw(typed, candidates, incumbent, history)
        return got[0] if got is not None else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"final": dict(self.final), "early": dict(self.early), "margin": self.margin,
                               "heads": self.heads}  # fmt: skip
        if self.known is not None:
            out["known"] = dict(self.known)
        if self.young:
            assert self.young_rule is not None
            young = self.young_rule.to_json()
            young.pop("info", None)
            out["young"] = {"below": self.young, **young}
        return {**out, "info": dict(self.info)} if self.info else out

    @classmethod
    def from_json(cls, data: Any, source: str = "ghost rule") -> GhostRule:
        try:
            final = {b: float(data["final"][b]) for b in BUCKETS}
            early = {b: float(data["early"][b]) for b in BUCKETS}
            known = {b: float(data["known"][b]) for b in BUCKETS} if data.get("known") is not None else None
            margin = float(data.get("margin", 0.0))
            heads = data.get("heads", False)
            if not isinstance(heads, bool):
                raise TypeError(f"heads: {heads!r} is not true or false")
            young_data = data.get("young")
            young = int(young_data["below"]) if young_data is not None else 0
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"{source}: not a ghost rule ({exc!r})") from None
        if young < 0:
            raise FormatError(f"{source}: young.below: {young} is negative")
        young_rule = None
        if young_data is not None:
            if young_data.get("young") is not None:
                raise FormatError(f"{source}: young: a young rule has no young rule of its own")
            young_rule = cls.from_json(young_data, f"{source}: young")
        return cls(final, early, margin, heads, known, young, young_rule, dict(data.get("info") or {}))


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
