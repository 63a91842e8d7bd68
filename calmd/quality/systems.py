"""The systems `calm replay` compares (calmd/quality/replay.py), each answering the same queries
from the same past:
- calmd (`Ours`): the daemon's engine on the replay's store, asked as calm's zsh client asks
  (the early line, then the candidates, the drawn one first), with the context the server
  builds; `calmd+comp` adds the COMP and ENV frames of the reconstructed disk (`comp_frames`);
- the anchor (`PastOnly` with an `Anchor`, calmd/quality/anchor.py): a LightGBM ranker over the
  user's own earlier lines, no model: what calmd's model has to beat to earn its place;
- the baselines (`PastOnly`): zsh-autosuggestions' `history` (the most recent command that
  starts with the input) and `match_prev_cmd` (the most recent such command whose predecessor
  equals the previous command, else the most recent match), and `fish` (the most frequent
  command that starts with the input; ties: the most recent). Their top-5 continue in the same
  order.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from calmd.history.store import HistoryStore
from calmd.quality.anchor import ANCHOR_SYSTEM, Anchor, AnchorPast
from calmd.quality.tally import Tally
from calmd.quality.typist import Suggest, ghost_replaced
from calmd.suggest.context import HISTORY_FRAMES, recent_context
from calmd.suggest.frames import served_completions, word_start
from calmd.suggest.reconstruct import Reconstruction

BASELINES = ("zsh-autosuggestions:history", "zsh-autosuggestions:match_prev_cmd", "fish")
SYSTEMS = ("calmd", *BASELINES)  # with one model; with several, "calmd:<name>" for each
COMP_SYSTEM = "calmd+comp"  # calmd with COMP/ENV from the reconstructed disk (`--comp`)
# with training: calmd as packaged, never trained, answering the same queries as the calmd that learns
PACKAGED_SYSTEM = "calmd:packaged"
SESSION = "replay"  # the replay's one shell session


class PastOnly:
    """The baselines' view of the history, and the anchor's when there is one: what was run
    before the current position."""

    def __init__(self, anchor: Anchor | None = None) -> None:
        self.commands: list[str] = []
        self.counts: Counter[str] = Counter()
        self.last_index: dict[str, int] = {}
        self.after: dict[str, dict[str, int]] = defaultdict(dict)  # prev -> cmd -> last index
        self.anchor = anchor
        self.anchor_past = AnchorPast()

    @property
    def systems(self) -> tuple[str, ...]:
        """The systems it answers for: the anchor (when it has one), then the baselines."""
        return (ANCHOR_SYSTEM, *BASELINES) if self.anchor is not None else BASELINES

    def add(self, cmd: str) -> None:
        if self.anchor is not None:
            self.anchor_past.add(cmd)
        if self.commands:
            self.after[self.commands[-1]][cmd] = len(self.commands)
        self.commands.append(cmd)
        self.counts[cmd] += 1
        self.last_index[cmd] = len(self.commands) - 1

    def matches(self, prefix: str) -> list[str]:
        """Distinct commands starting with prefix, most recent first."""
        found = [c for c in self.last_index if c.startswith(prefix) and c != prefix]
        return sorted(found, key=self.last_index.__getitem__, reverse=True)

    def suggest(self, system: str, prefix: str, n: int = 5) -> list[str]:
        if system == ANCHOR_SYSTEM:
            assert self.anchor is not None
            return self.anchor.suggest(self.anchor_past, prefix, n)
        recent = self.matches(prefix)
        if system == "zsh-autosuggestions:history":
            return recent[:n]
        if system == "fish":
            return sorted(recent, key=lambda c: (self.counts[c], self.last_index[c]), reverse=True)[:n]
        assert system == "zsh-autosuggestions:match_prev_cmd"
        prev = self.commands[-1] if self.commands else None
        followers = self.after.get(prev, {}) if prev is not None else {}
        first = sorted((c for c in followers if c.startswith(prefix) and c != prefix),
                       key=followers.__getitem__, reverse=True)  # fmt: skip
        ordered = first + [c for c in recent if c not in first]
        return ordered[:n]

    def top1(self, system: str) -> Suggest:
        """The system's top suggestion for a typed prefix, as the simulated users see it."""

        def suggest(prefix: str) -> str | None:
            got = self.suggest(system, prefix, 1)
            return got[0] if got else None

        return suggest


@dataclass
class Rows:
    """The engine's suggestions at replay positions, as calibration rows (calmd/suggest/calibration.py),
    and the lines its reranker orders with their rows (calmd/suggest/rerank.py)."""

    candidate: list[Any] = field(default_factory=list)
    candidate_right: list[bool] = field(default_factory=list)
    early: list[Any] = field(default_factory=list)
    early_right: list[bool] = field(default_factory=list)
    # per query: the reranker's lines, their RERANK_FEATURES (len(lines), F), the line the user ran,
    # and the characters typed
    rerank: list[tuple[list[str], Any, str, int]] = field(default_factory=list)
    collect_rerank: bool = False  # keep `rerank` (calmd/quality/fit_reranker.py): 20 kB a query

    @property
    def candidate_x(self) -> Any:
        import numpy as np

        return np.array(self.candidate)

    @property
    def candidate_y(self) -> Any:
        import numpy as np

        return np.array(self.candidate_right, dtype=np.float64)

    @property
    def early_x(self) -> Any:
        import numpy as np

        return np.array(self.early)

    @property
    def early_y(self) -> Any:
        import numpy as np

        return np.array(self.early_right, dtype=np.float64)


def _completes(prefix: str, target: str, items: Sequence[str]) -> bool:
    """Whether one of the COMP items is the word of `target` that the input `prefix` is in."""
    rest = target[word_start(prefix) :]
    word = rest.split(maxsplit=1)[0] if rest.strip() else ""
    return bool(word) and any(item == word or item.rstrip("/") == word.rstrip("/") for item in items)


def stand_in_path() -> tuple[str, ...]:
    """What `calmd+comp` offers for a first word in place of the shell's PATH: the commands the
    packaged vocabulary knows (a replayed history comes without its machine)."""
    from calmd.training.corpus import comp_sources

    return comp_sources().commands


def comp_frames(prefix: str, disk: Reconstruction, commands: Sequence[str], engine: Any) -> dict[str, Any]:
    """The COMP and ENV frames `calmd+comp` adds to a replayed query, as the daemon serves them to a
    user who typed the prefix byte by byte (a word's frame kept while an item extends it)."""
    items = served_completions(
        prefix, lister=disk.listing, commands=commands, followers=getattr(engine, "followers", None)
    )
    return {**({"completions": items} if items else {}), **({"env": disk.env} if disk.env else {})}


Frames = Callable[[str], dict[str, Any]]  # typed prefix -> more context fields for the query


class Answer(NamedTuple):
    """What a zsh client gets for one keystroke: the early line (text, confidence, drawn) and the
    candidates (text, confidence, drawn), the drawn one first."""

    early: tuple[str, float, bool] | None
    candidates: list[tuple[str, float, bool]]
    draw: str | None = None  # what of the drawn candidate is drawn (its likely head), when not all of it

    @property
    def top(self) -> str | None:
        return self.candidates[0][0] if self.candidates else None

    @property
    def drawn(self) -> str | None:
        if not self.candidates or not self.candidates[0][2]:
            return None
        return self.draw or self.candidates[0][0]

    @property
    def early_drawn(self) -> str | None:
        return self.early[0] if self.early is not None and self.early[2] else None


class Ours:
    """One calmd system of the replay: an engine on the shared store, timed per query. Its engine
    session is the system's name, so that systems sharing an engine keep their own caches (the
    prefix cache, the answer typing through continues); `frames` adds context fields per query.
    Every request is the zsh client's (`"early": true`, the ghost rule as fitted unless
    `min_conf` replaces its thresholds, as CALM_MIN_CONFIDENCE does)."""

    def __init__(
        self, system: str, engine: Any, store: HistoryStore, tally: Tally, rows: Rows | None,
        min_conf: float | None, frames: Frames | None = None, *, history_frames: int = HISTORY_FRAMES,
    ) -> None:  # fmt: skip
        self.session, self.engine, self.store, self.tally = system, engine, store, tally
        self.rows, self.min_conf, self.frames = rows, min_conf, frames
        self.history_frames = history_frames
        self.cache: dict[str, Answer] = {}  # prefix -> answer, for the command typed out
        self.never = threading.Event()

    def context(self, prefix: str) -> dict[str, Any]:
        """What the server builds: the store's latest commands of the session (and `frames`)."""
        recent = recent_context(self.store, SESSION, self.history_frames)
        ctx: dict[str, Any] = {"input": prefix, "history": [{"cmd": r.cmd, "exit": r.exit} for r in recent]}
        return {**ctx, **self.frames(prefix)} if self.frames is not None else ctx

    def ask(self, prefix: str, n: int, target: str | None = None, drawn: str | None = None) -> Answer:
        ctx = self.context(prefix)
        engine, rows = self.engine, self.rows
        early: list[tuple[str, float, bool]] = []

        def on_early(text: str, confidence: float, drawn: bool) -> None:
            early.append((text, confidence, drawn))

        explain = rows is not None and target is not None
        if explain:
            engine.explained_early = None
            engine.explained_rerank = None
        got = list(engine.complete(ctx, n, self.session, self.never, on_early, explain=explain,
                                   min_confidence=self.min_conf, drawn=drawn))  # fmt: skip
        if explain:
            assert rows is not None
            for s in got:
                rows.candidate.append(s.features)
                rows.candidate_right.append(s.text == target)
            if engine.explained_early is not None:
                text, row = engine.explained_early
                rows.early.append(row)
                rows.early_right.append(text == target)
            if rows.collect_rerank and getattr(engine, "explained_rerank", None) is not None and target:
                lines, features = engine.explained_rerank
                rows.rerank.append((lines, features, target, len(prefix)))
        draw = got[0].draw if got and got[0].ghost else None
        return Answer(early[0] if early else None, [(s.text, s.confidence, s.ghost) for s in got], draw)

    def timed(self, prefix: str, n: int, target: str) -> Answer:
        """`ask`, with the time to the first candidate and to the last in the tally."""
        if self.rows is not None:  # explained requests cost more: not the daemon's latency
            return self.ask(prefix, n, target)
        ctx = self.context(prefix)
        if self.frames is not None and ctx.get("completions"):  # calmd+comp: what COMP knew
            self.tally.comp_filled += 1
            self.tally.comp_right += _completes(prefix, target, ctx["completions"])
        got: list[tuple[str, float, bool]] = []
        early: list[tuple[str, float, bool]] = []
        t0 = time.perf_counter()
        first = None
        draw = None
        for s in self.engine.complete(ctx, n, self.session, self.never, lambda *e: early.append(e),
                                      min_confidence=self.min_conf):  # fmt: skip
            if first is None:
                first = time.perf_counter() - t0
                draw = s.draw if s.ghost else None
            got.append((s.text, s.confidence, s.ghost))
        done = time.perf_counter() - t0
        self.tally.ms_first.append((first if first is not None else done) * 1e3)
        self.tally.ms_done.append(done * 1e3)
        return Answer(early[0] if early else None, got, draw)

    def answer(self, prefix: str, drawn: str | None = None) -> Answer:
        key = f"{prefix}\0{drawn or ''}"
        if key not in self.cache:
            self.cache[key] = self.ask(prefix, 5, drawn=drawn)
        return self.cache[key]

    def accepted(self, prefix: str) -> str | None:
        """The first candidate, drawn or not (calmd's top candidate whatever its confidence)."""
        return self.answer(prefix).top

    def drawn(self, prefix: str, shown: str | None) -> str | None:
        """What a request for `prefix` draws while `shown` is drawn (None: nothing); the tally
        counts the lines drawn before the answer (`shown`, else the early one) that it replaced."""
        answer = self.answer(prefix, shown)
        tally = self.tally
        tally.requests += 1
        before = shown
        early = answer.early_drawn
        if before is None and early is not None and early.startswith(prefix) and len(early) > len(prefix):
            tally.early_drawn += 1
            before = early
        if ghost_replaced(before, answer.drawn):
            tally.replaced += 1
            tally.replaced_better += answer.drawn == self.target
            tally.replaced_worse += before == self.target
        return answer.drawn

    target: str | None = None  # the command being typed out (for `drawn`'s tally)

    def head_logprobs(self, ctx: dict[str, Any], lines: list[str]) -> list[list[float] | None]:
        """The model's log P of each head of each of `lines` given `ctx` (calmd/suggest/next_words.py),
        as the engine asks it for the ghost rule; None where it asks nothing (no model runs)."""
        engine = self.engine
        if getattr(engine, "parts", "mixture") == "history":
            return [None] * len(lines)
        start, model_typed = engine.generator.prepare(ctx, self.session)
        if model_typed != ctx.get("input", ""):
            return [None] * len(lines)
        found = engine.next_words.answer(self.session, ctx, start, lines)
        if found is None:
            return [None] * len(lines)
        # (-inf past the bytes scored: JSON has none)
        return [None if (lps := found(line)) is None else [round(max(lp, -99.0), 4) for lp in lps]
                for line in lines]  # fmt: skip

    def states(self, cmd: str, n: int = 5) -> dict[str, Any]:
        """Every prefix of `cmd` asked in order, as a user typing it character by character: the
        early proposal and the `n` candidates of each (what calmd/quality/fit_ghost.py fits on)."""
        out: list[dict[str, Any]] = []
        for typed in range(len(cmd)):
            early: list[tuple[str, float, bool]] = []
            ctx = self.context(cmd[:typed])
            got = list(self.engine.complete(ctx, n, self.session, self.never,
                                            lambda *e, to=early: to.append(e)))  # fmt: skip
            ranked = sorted(got, key=lambda s: s.score, reverse=True)  # before the rule put a line first
            index = self.engine.index
            count = index.count if index is not None else {}
            out.append({"early": list(early[0][:2]) if early else None,
                        "cands": [[s.text, s.confidence, round(s.score, 4), count.get(s.text, 0) > 0]
                                  for s in ranked]})  # fmt: skip
            # the model's log P of each candidate's heads, as the engine gives the rule
            lines = [s.text for s in ranked]
            out[-1]["heads"] = [
                list(pair) for pair in zip(lines, self.head_logprobs(ctx, lines), strict=True)
            ]
        return {"cmd": cmd, "history": len(index) if index is not None else 0, "states": out}
