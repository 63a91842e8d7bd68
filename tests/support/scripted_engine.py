"""A scripted completion engine for daemon-mechanics tests (like nanochat's MockModel).

It validates the weight file with the real CWGT reader (so hot-reload tests see real
rejections) and answers `input + suffix` candidates, sleeping CALMD_TEST_DELAY seconds per
candidate so that cancellation and interleaving can be observed. An input equal to
CALMD_TEST_HANG_INPUT wedges the worker thread for good (it says so on stderr first), ignoring
cancellation, as a model stuck in native code would. The real model engine is tested end to end
in test_daemon_model.py.

Confidence and early proposals, for the shells' tests (by default every candidate has
confidence 1.0, so it is shown as before confidences existed):
- CALMD_TEST_CONFIDENCE: comma-separated confidences by rank, the last one repeating
  (`0.9,0.2`: the first candidate 0.9, every other 0.2);
- an input holding "no-calm" gets no candidates at all (nor an early proposal);
- a request with `"early": true` gets its early proposal at once, before the first delay: the
  first candidate (a recorded command that extends the input, else `input + "mmit"`) with the
  first confidence. CALMD_TEST_EARLY=none sends none; any other value is a suffix: the early
  proposal is then `input + CALMD_TEST_EARLY` (so that a test can tell it from the candidates);
  CALMD_TEST_EARLY_CONFIDENCE overrides its confidence.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from calmd.formats.cwgt import read_cwgt
from calmd.history.store import HistoryStore
from calmd.protocol import DEFAULT_MIN_CONFIDENCE
from calmd.suggest.ghost import GhostRule

SUFFIXES = ["mmit", "mmand", "nfig", "py", "unt"]
NOTHING = "no-calm"  # an input holding this gets no candidates


class ScriptedEngine:
    def __init__(self, path: Path) -> None:
        f = read_cwgt(path)
        f.check_finite()
        self.path = path
        self.param_count = f.header.param_count
        self.domain = f.metadata.domain if f.metadata else "?"
        self.delay = float(os.environ.get("CALMD_TEST_DELAY", "0"))
        self.history: HistoryStore | None = None

    def attach_history(self, store: HistoryStore) -> None:
        self.history = store

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "size": "scripted",
            "parameters": self.param_count,
            "domain": self.domain,
        }

    def complete(
        self,
        ctx: dict[str, Any],
        n: int,
        session: str,
        cancelled: threading.Event,
        early: Callable[[str, float, bool], None] | None = None,
        *,
        min_confidence: float | None = None,
        drawn: str | None = None,
    ) -> Iterator[tuple[str, float, float, bool]]:
        typed = ctx["input"]
        if typed and typed == os.environ.get("CALMD_TEST_HANG_INPUT"):
            print("scripted engine: hanging for good", file=sys.stderr, flush=True)
            threading.Event().wait()  # never set: the thread stays here
        seen: list[str] = []  # the history's commands that extend the input, newest first
        if self.history and typed:
            rows = reversed(list(self.history.all_rows()))
            seen = list(dict.fromkeys(r.cmd for r in rows if r.cmd.startswith(typed)))
        history_cmds = [h["cmd"] for h in ctx.get("history", [])]
        results = seen + [typed + s for s in SUFFIXES]
        if NOTHING in typed:  # a line calm has nothing for (the other plugins' turn)
            results = []
        if not typed and history_cmds:
            results = [f"after {history_cmds[-1]}", *results]
        confidences = [float(c) for c in os.environ.get("CALMD_TEST_CONFIDENCE", "1.0").split(",")]

        def confidence(rank: int) -> float:
            return confidences[min(rank, len(confidences) - 1)]

        # The daemon's ghost rule at the calibration's 0.5 (the shell's threshold in its place).
        rule = GhostRule.uniform(DEFAULT_MIN_CONFIDENCE).overridden(min_confidence)
        incumbent = drawn if drawn and len(drawn) > len(typed) and drawn.startswith(typed) else None
        mode = os.environ.get("CALMD_TEST_EARLY", "")
        if early is not None and mode != "none" and (mode or results):
            proposal = typed + mode if mode else results[0]
            early_confidence = float(os.environ.get("CALMD_TEST_EARLY_CONFIDENCE", confidence(0)))
            shown = rule.draws_early(typed, early_confidence) and incumbent in (None, proposal)
            early(proposal, early_confidence, shown)
            incumbent = incumbent or (proposal if shown else None)
        ranked = [(cand, confidence(i), -float(i)) for i, cand in enumerate(results[:n])]
        # the rule picks among the lines that extend the input (a recorded line equal to it does not)
        extending = [i for i, (c, _, _) in enumerate(ranked) if len(c) > len(typed) and c.startswith(typed)]
        choice = rule.choose(typed, [ranked[i] for i in extending], incumbent)
        pick = None if choice is None else extending[choice]
        if pick:  # the drawn line comes first, as the real engine sends it
            ranked.insert(0, ranked.pop(pick))
        for i, (cand, conf, score) in enumerate(ranked):
            deadline = time.monotonic() + self.delay
            while time.monotonic() < deadline:
                if cancelled.is_set():
                    return
                time.sleep(0.005)
            yield cand, score, conf, i == 0 and pick is not None


def load(path: Path) -> ScriptedEngine:
    if os.environ.get("CALMD_TEST_LOAD_FAILS"):  # a bug's exception while the daemon starts (no input's)
        raise ArithmeticError("the scripted engine was told to fail")
    time.sleep(float(os.environ.get("CALMD_TEST_LOAD_DELAY", "0")))  # a model that loads slowly
    return ScriptedEngine(path)
