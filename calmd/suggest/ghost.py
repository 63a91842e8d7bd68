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


def bucket(typed: str) -> str:
    """The context a keystroke's ghost is judged in (module docstring)."""
    k = len(typed)
    return "empty" if k == 0 else "k1" if k == 1 else "k2" if k < 4 else "k4" if k < 8 else "k8"


@dataclass(frozen=True)
class GhostRule:
    final: Mapping[str, float]  # bucket -> the top line's least confidence to be drawn
    early: Mapping[str, float]  # bucket -> the early proposal's least confidence to be drawn
    margin: float = 0.0  # nats the top line must beat the drawn incumbent by to replace it
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)  # provenance of the fit

    def __post_init__(self) -> None:
        for name in ("final", "early"):
            table = getattr(self, name)
            missing = [b for b in BUCKETS if b not in table]
            assert not missing, f"ghost rule: {name} lacks {missing}"

    @classmethod
    def uniform(cls, threshold: float, margin: float = 0.0) -> GhostRule:
        """One threshold everywhere (CALM_MIN_CONFIDENCE, or a checkout without a fitted rule)."""
        table = dict.fromkeys(BUCKETS, threshold)
        return cls(table, table, margin)

    def overridden(self, min_confidence: float | None) -> GhostRule:
        """The rule with every threshold set to the shell's CALM_MIN_CONFIDENCE (None: as fitted)."""
        if min_confidence is None:
            return self
        table = dict.fromkeys(BUCKETS, min_confidence)
        return replace(self, final=table, early=table)

    def draws_early(self, typed: str, confidence: float) -> bool:
        return confidence >= self.early[bucket(typed)]

    def choose(
        self, typed: str, candidates: Sequence[tuple[str, float, float]], incumbent: str | None = None
    ) -> int | None:
        """The index of the line to draw among `candidates` ((text, confidence, score), best score
        first, all extending `typed`), or None. `incumbent`: the line drawn already (the early
        one, or the one the user typed along), kept unless the top line beats it by more than
        `margin` nats. Which lines may never be drawn at all is the engine's to leave out
        (calmd/suggest/engine.py)."""
        if not candidates:
            return None
        if incumbent is not None:
            for i, (text, _, score) in enumerate(candidates):
                if text == incumbent:
                    if candidates[0][2] - score <= self.margin:
                        return i
                    break
        if candidates[0][1] >= self.final[bucket(typed)]:
            return 0
        return None

    def to_json(self) -> dict[str, Any]:
        return {"final": dict(self.final), "early": dict(self.early), "margin": self.margin,
                "info": dict(self.info)}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, source: str = "ghost rule") -> GhostRule:
        try:
            final = {b: float(data["final"][b]) for b in BUCKETS}
            early = {b: float(data["early"][b]) for b in BUCKETS}
            margin = float(data.get("margin", 0.0))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"{source}: not a ghost rule ({exc!r})") from None
        return cls(final, early, margin, dict(data.get("info") or {}))


def packaged_rule_path() -> Path:
    return paths.PACKAGE_DATA / "ghost.json"


@cache
def packaged_rule() -> GhostRule:
    """The fitted rule shipped in the package; a checkout that has not fitted one yet draws at
    the calibration's 0.5 (DEFAULT_MIN_CONFIDENCE), as before the rule existed."""
    path = packaged_rule_path()
    if not path.exists():
        from calmd.protocol import DEFAULT_MIN_CONFIDENCE

        return GhostRule.uniform(DEFAULT_MIN_CONFIDENCE)
    return GhostRule.from_json(json.loads(path.read_text()), str(path))
