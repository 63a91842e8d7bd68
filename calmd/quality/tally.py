"""What `calm replay` counts per system (calmd/quality/replay.py): top-1 and top-5 per k,
keystrokes saved by the simulated users (calmd/quality/typist.py), what calmd's ghosts did, its
latency, and with training the same per stretch of commands between two runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from calmd.quality.typist import Screen

KS = (0, 1, 2, 4, 8)
THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # confidence thresholds the JSON reports


@dataclass
class Tally:
    queries: dict[int, int] = field(default_factory=lambda: dict.fromkeys(KS, 0))
    top1: dict[int, int] = field(default_factory=lambda: dict.fromkeys(KS, 0))
    top5: dict[int, int] = field(default_factory=lambda: dict.fromkeys(KS, 0))
    # queries whose command line the user had run before: what a perfect history ranker scores
    seen: dict[int, int] = field(default_factory=lambda: dict.fromkeys(KS, 0))
    saved: float = 0.0  # sum over typed commands of the fraction of keystrokes saved
    saved_drawn: float = 0.0  # the same with the ghosts the shell draws (calmd's rule; baselines: always)
    typed: int = 0
    chars: int = 0  # characters of the commands typed out
    keys_lines: int = 0  # keys pressed by the whole-line-accepting user (Enter not counted)
    keys_words: int = 0  # keys pressed by the word-accepting user
    keys_lines_drawn: int = 0  # the same two users with only the ghosts drawn
    keys_words_drawn: int = 0
    # what the shell did at the keystrokes the drawn-ghost users pressed (calmd): requests sent
    # (typing along a ghost sends none), early lines drawn, and drawn lines replaced within the
    # keystroke by the final answer, of which the new line was the command / the old one was
    requests: int = 0
    early_drawn: int = 0
    replaced: int = 0
    replaced_better: int = 0
    replaced_worse: int = 0
    # what the screen showed the word-by-word user of the drawn ghosts (`Screen`)
    screen: Screen = field(default_factory=lambda: Screen())
    # calmd's top candidate per query: (confidence, right, drawn), for coverage and precision
    tops: dict[int, list[tuple[float, bool, bool]]] = field(default_factory=lambda: {k: [] for k in KS})
    ms_first: list[float] = field(default_factory=list)  # per query (calmd): to the first candidate
    ms_done: list[float] = field(default_factory=list)  # ... and to the last
    runs: int = 0  # background training runs (with training)
    swaps: int = 0  # of which swapped a new model in
    # calmd+comp only: queries whose COMP frame had items, and of those, whose items held the word
    # the user went on to type (what the reconstruction knew; the model still has to pick it)
    comp_filled: int = 0
    comp_right: int = 0
    # with training: the same tallies per stretch of commands between two runs (`curve[j]`: the
    # commands replayed after j runs), for the learning curve
    curve: list[Tally] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for k in KS:
            self.queries[k] += other.queries[k]
            self.top1[k] += other.top1[k]
            self.top5[k] += other.top5[k]
            self.seen[k] += other.seen[k]
            self.tops[k] += other.tops[k]
        self.saved += other.saved
        self.saved_drawn += other.saved_drawn
        self.typed += other.typed
        self.chars += other.chars
        self.keys_lines += other.keys_lines
        self.keys_words += other.keys_words
        self.keys_lines_drawn += other.keys_lines_drawn
        self.keys_words_drawn += other.keys_words_drawn
        self.requests += other.requests
        self.early_drawn += other.early_drawn
        self.replaced += other.replaced
        self.replaced_better += other.replaced_better
        self.replaced_worse += other.replaced_worse
        self.screen.add(other.screen)
        self.ms_first += other.ms_first
        self.ms_done += other.ms_done
        self.runs += other.runs
        self.swaps += other.swaps
        self.comp_filled += other.comp_filled
        self.comp_right += other.comp_right
        for j, stretch in enumerate(other.curve):
            if j == len(self.curve):
                self.curve.append(Tally())
            self.curve[j].add(stretch)

    def to_json(self) -> dict[str, Any]:
        return {
            "queries": self.queries,
            "top1": {k: self.top1[k] / self.queries[k] if self.queries[k] else None for k in KS},
            "top5": {k: self.top5[k] / self.queries[k] if self.queries[k] else None for k in KS},
            "top1_all": sum(self.top1.values()) / queries
            if (queries := sum(self.queries.values()))
            else None,
            "seen_before": {k: self.seen[k] / self.queries[k] if self.queries[k] else None for k in KS},
            "keystrokes_saved": self.saved / self.typed if self.typed else None,
            "keystrokes_saved_lines": 1 - self.keys_lines / self.chars if self.chars else None,
            "keystrokes_saved_words": 1 - self.keys_words / self.chars if self.chars else None,
            "keystrokes_saved_drawn": self.saved_drawn / self.typed if self.typed else None,
            "keystrokes_saved_lines_drawn": 1 - self.keys_lines_drawn / self.chars if self.chars else None,
            "keystrokes_saved_words_drawn": 1 - self.keys_words_drawn / self.chars if self.chars else None,
            "typed_characters": self.chars,
            "screen": self.screen.to_json(),
            **self._shown_json(),
            "typed_commands": self.typed,
            **self._latency_json(),
            "training_runs": self.runs,
            "models_swapped_in": self.swaps,
            **self._comp_json(),
            **({"curve": [t.curve_point() for t in self.curve]} if self.curve else {}),
        }

    def curve_point(self) -> dict[str, Any]:
        """What the learning curve shows of one stretch between two training runs."""
        full = self.to_json()
        keep = ("queries", "top1", "top1_all", "typed_commands", "keystrokes_saved_words_drawn", "screen")
        return {key: full[key] for key in keep}

    def _comp_json(self) -> dict[str, Any]:
        if not self.comp_filled:
            return {}
        queries = sum(self.queries.values())
        return {"comp_filled": self.comp_filled / queries if queries else None,
                "comp_held_the_word": self.comp_right / self.comp_filled}  # fmt: skip

    def coverage_precision(self, threshold: float | None) -> dict[int, tuple[float | None, float | None]]:
        """Per k: the share of queries whose top candidate would be shown at `threshold`
        (confidence >= it; None: the ghost the rule draws) and the share of those that are right."""
        out: dict[int, tuple[float | None, float | None]] = {}
        for k in KS:
            tops = self.tops[k]
            shown = [right for conf, right, drawn in tops
                     if (drawn if threshold is None else conf >= threshold)]  # fmt: skip
            out[k] = (len(shown) / len(tops) if tops else None, sum(shown) / len(shown) if shown else None)
        return out

    def _latency_json(self) -> dict[str, Any]:
        if not self.ms_done:
            return {}

        def pct(values: list[float], q: float) -> float:
            ordered = sorted(values)
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

        first, done = self.ms_first, self.ms_done
        return {"latency_ms": {"first_p50": pct(first, 0.5), "done_p50": pct(done, 0.5),
                               "done_p99": pct(done, 0.99), "queries": len(done)}}  # fmt: skip

    def _shown_json(self) -> dict[str, Any]:
        if not any(self.tops.values()):
            return {}
        at = self.coverage_precision(None)
        keys = self.requests or 1
        return {
            "coverage": {k: at[k][0] for k in KS},  # of the drawn ghosts: the rule's
            "precision": {k: at[k][1] for k in KS},
            "sweep": {  # a single confidence threshold in place of the rule, for comparison
                str(t): {k: list(v) for k, v in self.coverage_precision(t).items()} for t in THRESHOLDS
            },
            "ghosts": {
                "requests": self.requests, "early_drawn": self.early_drawn, "replaced": self.replaced,
                "replaced_share": self.replaced / keys, "replaced_by_the_command": self.replaced_better,
                "replaced_the_command": self.replaced_worse,
            },
        }  # fmt: skip
