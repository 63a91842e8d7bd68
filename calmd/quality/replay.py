"""`calm replay`: replay shell histories through the daemon's pipeline and score the suggestions.

For each history file (one user), in order: a fresh history store; every command is recorded
after it has been predicted, so a prediction only sees the past. At sampled positions (after a
warm-up) the next command is asked for given its first k characters (k = 0, 1, 2, 4, 8; k = 0
means "predict the next command" on an empty prompt, k only when the command is longer than k):
top-1 and top-5 exact matches of the whole command line, and the share of queries whose command
line had been run before (`seen_before`, the most a pure history lookup can score). Keystrokes
saved, two simulated users typing the same commands with the same policy for every system:
- whole-line acceptance: the user types the command one character at a time and accepts the top
  suggestion (one key) as soon as it is the whole command; `keystrokes_saved` is the mean over
  commands of (length - typed - 1) / length (0 when it never is), `keystrokes_saved_lines` the
  same keys micro-averaged (1 - all keys / all characters);
- word acceptance (`keystrokes_saved_words`, micro-averaged), as zsh-autosuggestions' and fish's
  forward-word: at each state, one key accepts the top suggestion when it is the whole command;
  else one key accepts the suggestion's next word (up to and including the following space) when
  the command continues with it; else the user types one character. Enter is not counted.
Every state either user visits is a prefix of the command, and the replay asks the engine once
per prefix (cached per command typed out), so the word-accepting user costs only the few
prefixes past the point where the whole-line user accepted.

The candidates come from the same code the daemon runs: the context is built as the server
builds it (the store's latest commands of the session), ranked by `ModelEngine.complete` with
its history proposals. The baselines answer the same queries from the same past:
- `zsh-autosuggestions:history`: the most recent command that starts with the input;
- `zsh-autosuggestions:match_prev_cmd`: the most recent such command whose predecessor equals
  the previous command, else the most recent match;
- `fish`: the most frequent command that starts with the input (ties: the most recent).
Their top-5 continue in the same order. With training (`--with-training`), every
`--train-every` replayed commands the background run of calmd/training/background.py fine-tunes the
user's weights on the store so far and swaps them in when not worse, as the daemon does (this
costs about half a minute per run on one core); `--refit ranker` refits the history ranker on the
user's commands so far instead (calmd/training/ranker_refit.py, seconds), `--refit both` does
both. With training, `calmd:packaged` (the model and ranker as packaged, never trained) answers
the same queries on the same store, and the figures are kept per stretch of commands between two
runs: the learning curve (`format_curve`). Histories carry no timestamps: command i is replayed at
`ts = start + 60 i` (one command a minute), which is what the recency signal sees.

`--ranker history|model` replays one part of the mixture alone (calmd.suggest.engine.PARTS: the
history ranker without the model, the model without the history's proposals), for the ablation
of docs/quality.md. `--jobs N` replays N users at once, each in a spawned process (the figures
are the same as one after the other).

With `--comp`, a second calmd system, `calmd+comp`, answers the same queries with the COMP and ENV
frames filled as the daemon fills them (calmd/suggest/frames.py), from a reconstruction of the
user's disk (calmd/suggest/reconstruct.py: the files and folders the earlier commands created or
named, never those of the command being predicted) and, for the first word, the packaged
vocabulary's commands in place of the shell's PATH. What the reconstruction cannot know is in its
docstring and in docs/quality.md; the disk check (demoting missing paths) is not replayed, as the
reconstruction cannot tell a missing file from one no command named.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.suggest.context import HISTORY_FRAMES, recent_context
from calmd.suggest.frames import served_completions, word_start
from calmd.suggest.ghost import next_word
from calmd.suggest.reconstruct import Reconstruction
from calmd.training.corpus import read_history

KS = (0, 1, 2, 4, 8)
THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # confidence thresholds the JSON reports
BASELINES = ("zsh-autosuggestions:history", "zsh-autosuggestions:match_prev_cmd", "fish")
SYSTEMS = ("calmd", *BASELINES)  # with one model; with several, "calmd:<name>" for each
COMP_SYSTEM = "calmd+comp"  # calmd with COMP/ENV from the reconstructed disk (`--comp`)
# with training: calmd as packaged, never trained, answering the same queries as the calmd that learns
PACKAGED_SYSTEM = "calmd:packaged"
REFITS = ("model", "ranker", "both")  # what a training run of the replay refits (`--refit`)


@dataclass
class Screen:
    """What the word-by-word user of the drawn ghosts saw (`keys_with_ghosts`): each state is a
    buffer the user passed through while typing a command out (after the answer to its request);
    a ghost is drawn there when the shell shows text past the cursor, and it is wrong when its
    next word is not what the user types next (they read past it)."""

    states: int = 0
    drawn: int = 0
    wrong: int = 0

    def add(self, other: Screen) -> None:
        self.states += other.states
        self.drawn += other.drawn
        self.wrong += other.wrong

    def see(self, cmd: str, typed: str, ghost: str | None) -> None:
        self.states += 1
        if not extends(ghost, typed):
            return
        self.drawn += 1
        self.wrong += not right_next_word(cmd, typed, ghost)

    def to_json(self) -> dict[str, Any]:
        return {
            "states": self.states, "drawn": self.drawn, "wrong": self.wrong,
            "drawn_share": self.drawn / self.states if self.states else None,
            "wrong_of_drawn": self.wrong / self.drawn if self.drawn else None,
            "wrong_share": self.wrong / self.states if self.states else None,
        }  # fmt: skip


def ghost_replaced(before: str | None, after: str | None) -> bool:
    """Whether drawing `after` where `before` was drawn replaces it: the ghost goes, or says
    something else (a ghost that grows or shrinks along its own text is the same ghost)."""
    if before is None:
        return False
    return after is None or not (after.startswith(before) or before.startswith(after))


def right_next_word(cmd: str, typed: str, ghost: str) -> bool:
    """Whether the ghost's next word (`next_word`, without the space after it) is what the user
    types next: `cmd` goes on with it, then with a space or its end."""
    word = next_word(ghost[len(typed) :]).rstrip(" ")
    end = len(typed) + len(word)
    return bool(word) and cmd.startswith(word, len(typed)) and (end == len(cmd) or cmd[end] == " ")


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


class PastOnly:
    """The baselines' view of the history: what was run before the current position."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.counts: Counter[str] = Counter()
        self.last_index: dict[str, int] = {}
        self.after: dict[str, dict[str, int]] = defaultdict(dict)  # prev -> cmd -> last index

    def add(self, cmd: str) -> None:
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


Suggest = Callable[[str], "str | None"]  # typed prefix -> the top suggestion (a whole line) or None


def keys_whole_line(cmd: str, suggest: Suggest) -> int:
    """Keys to enter `cmd` typing it character by character and accepting (one key) the top
    suggestion as soon as it is the whole command. Enter is not counted."""
    for typed in range(len(cmd)):
        if suggest(cmd[:typed]) == cmd:
            return typed + 1
    return len(cmd)


def extends(line: str | None, typed: str) -> TypeGuard[str]:
    """Whether `line` shows something past the cursor: it starts with `typed` and goes on."""
    return line is not None and len(line) > len(typed) and line.startswith(typed)


Request = Callable[[str, "str | None"], "str | None"]  # (buffer, line drawn now) -> line drawn after


def keys_with_ghosts(cmd: str, request: Request, words: bool, screen: Screen | None = None) -> int:
    """Keys to enter `cmd` with the ghosts a zsh client draws: `request(typed, drawn)` is the line
    drawn after the request every change of the buffer sends (None: nothing), `drawn` the line
    shown until then when it still extends the buffer (the user typed along it, or took a word
    of it: the daemon keeps it unless it is clearly beaten). The user accepts the ghost when it
    is the whole command (one key), else (`words`) its next word when the command continues with
    it, else types one character. Enter is not counted. `screen` counts what was drawn at each
    state."""
    typed, keys = "", 0
    ghost: str | None = None
    while len(typed) < len(cmd):
        keys += 1
        still = ghost if extends(ghost, typed) else None
        ghost = request(typed, still)
        if screen is not None:
            screen.see(cmd, typed, ghost)
        if ghost == cmd:
            return keys
        if words and extends(ghost, typed):
            word = next_word(ghost[len(typed) :])
            if cmd.startswith(word, len(typed)):
                typed += word
                continue
        typed = cmd[: len(typed) + 1]
    return keys


def keys_word_by_word(cmd: str, suggest: Suggest) -> int:
    """Keys to enter `cmd` (Enter not counted) for a user who, at each state, accepts the top
    suggestion when it is the whole command (one key), else accepts its next word when the
    command continues with that word (one key), else types the next character (one key): the
    ghosts' user, with the suggestion for each buffer whatever was drawn before."""
    return keys_with_ghosts(cmd, lambda typed, _drawn: suggest(typed), words=True)


@dataclass
class Rows:
    """The engine's suggestions at replay positions, as calibration rows (calmd/suggest/calibration.py)."""

    candidate: list[Any] = field(default_factory=list)
    candidate_right: list[bool] = field(default_factory=list)
    early: list[Any] = field(default_factory=list)
    early_right: list[bool] = field(default_factory=list)

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


@dataclass
class ReplayConfig:
    model: Path
    positions: int = 40  # sampled prediction positions per user
    warmup: int = 50  # commands replayed before the first sampled position
    seed: int = 0
    typing_positions: int = 15  # of the sampled positions, how many are typed out for keystrokes
    weights: dict[str, float] = field(default_factory=dict)  # RankWeights overrides, to measure ideas
    train_every: int = 0  # with training: a background run after every N replayed commands (0: never)
    min_confidence: float | None = None  # one threshold in place of the ghost rule's (CALM_MIN_CONFIDENCE)
    models: dict[str, Path] = field(default_factory=dict)  # several models: system name -> weights
    comp: bool = False  # also replay each model with COMP and ENV from the reconstructed disk
    ranker: str = "mixture"  # which predictors rank (calmd.suggest.engine.PARTS): the ablations
    refit: str = "model"  # what a training run refits (REFITS): the model, the history ranker, both
    jobs: int = 1  # users replayed at once, each in a process of its own
    first: int = 0  # only each user's first N commands, from an empty history (no warm-up): a new user

    def systems(self) -> dict[str, Path]:
        """The calmd systems replayed: "calmd" for the one model, else one per model."""
        return dict(self.models) if self.models else {"calmd": self.model}

    def comp_systems(self) -> dict[str, str]:
        """With `comp`: each calmd system's twin that sees COMP (`calmd+comp`, `calmd:<name>+comp`)
        -> the system whose engine it shares."""
        if not self.comp:
            return {}
        return {(COMP_SYSTEM if s == "calmd" else f"{s}+comp"): s for s in self.systems()}

    def all_systems(self) -> list[str]:
        packaged = [PACKAGED_SYSTEM] if self.train_every else []
        return [*self.systems(), *packaged, *self.comp_systems(), *BASELINES]


def _completes(prefix: str, target: str, items: Sequence[str]) -> bool:
    """Whether one of the COMP items is the word of `target` that the input `prefix` is in."""
    rest = target[word_start(prefix) :]
    word = rest.split(maxsplit=1)[0] if rest.strip() else ""
    return bool(word) and any(item == word or item.rstrip("/") == word.rstrip("/") for item in items)


def _stand_in_path() -> tuple[str, ...]:
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


class _Ours:
    """One calmd system of the replay: an engine on the shared store, timed per query. Its engine
    session is the system's name, so that systems sharing an engine keep their own caches (the
    prefix cache, the answer typing through continues); `frames` adds context fields per query.
    Every request is the zsh client's (`"early": true`, the ghost rule as fitted unless
    `min_conf` replaces its thresholds, as CALM_MIN_CONFIDENCE does)."""

    def __init__(
        self, system: str, engine: Any, store: HistoryStore, tally: Tally, rows: Rows | None,
        min_conf: float | None, frames: Frames | None = None,
    ) -> None:  # fmt: skip
        self.session, self.engine, self.store, self.tally = system, engine, store, tally
        self.rows, self.min_conf, self.frames = rows, min_conf, frames
        self.cache: dict[str, Answer] = {}  # prefix -> answer, for the command typed out
        self.never = threading.Event()

    def context(self, prefix: str) -> dict[str, Any]:
        """What the server builds: the store's latest commands of the session (and `frames`)."""
        recent = recent_context(self.store, SESSION, HISTORY_FRAMES)
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
        return {"cmd": cmd, "history": len(index) if index is not None else 0, "states": out}


SESSION = "replay"


def replay_user(
    path: Path, cfg: ReplayConfig, engine_factory: Any, rows: Rows | None = None,
    states: list[dict[str, Any]] | None = None,
) -> dict[str, Tally]:  # fmt: skip
    """Replay one user's history; with `rows`, also collect the engine's suggestions and early
    proposals with their calibration features; with `states`, every prefix of each typed-out
    command as the first calmd system answers it (`_Ours.states`). With several models
    (`cfg.models`), each answers every query in turn, on the same store (its own engine and
    caches). With training, `PACKAGED_SYSTEM` (the model and ranker as packaged, never trained)
    answers the same queries, and each tally's `curve` holds the stretches between runs."""
    commands = read_history(path)
    warmup = cfg.warmup
    if cfg.first:  # a new user: the replay starts from an empty history
        commands, warmup = commands[: cfg.first], 0
    models = cfg.systems()
    systems = cfg.all_systems()
    stretches: list[dict[str, Tally]] = [{s: Tally() for s in systems}]
    if len(commands) <= warmup:
        return stretches[0]
    rng = random.Random(f"{cfg.seed}:{path.stem}")
    candidates_pos = list(range(warmup, len(commands)))
    sampled = sorted(rng.sample(candidates_pos, min(cfg.positions, len(candidates_pos))))
    typed_out = set(rng.sample(sampled, min(cfg.typing_positions, len(sampled))))
    with tempfile.TemporaryDirectory(prefix="calm-replay-") as tmp:
        store = HistoryStore(paths.history_path(Path(tmp)))
        ours: dict[str, _Ours] = {}
        weights = paths.weights_path(Path(tmp))
        tallies = stretches[0]
        engines = dict(models)
        if cfg.train_every:  # its own copy: the learner's runs replace `weights`
            engines[PACKAGED_SYSTEM] = next(iter(models.values()))
        for n, (system, model) in enumerate(engines.items()):
            copy = weights if n == 0 else Path(tmp) / f"model{n}.cwgt"
            shutil.copyfile(model, copy)
            engine = engine_factory(copy)
            engine.attach_history(store)
            ours[system] = _Ours(
                system, engine, store, tallies[system], rows if n == 0 else None, cfg.min_confidence
            )
        disk = Reconstruction() if cfg.comp else None
        if disk is not None:
            path_commands = _stand_in_path()
            for twin, system in cfg.comp_systems().items():
                engine = ours[system].engine

                def frames(prefix: str, engine: Any = engine, disk: Reconstruction = disk) -> dict[str, Any]:
                    return comp_frames(prefix, disk, path_commands, engine)

                ours[twin] = _Ours(twin, engine, store, tallies[twin], None, cfg.min_confidence, frames)
        learner = next(iter(models))  # with training there is one model: the calmd that learns
        examples = None
        if cfg.train_every and cfg.refit in ("ranker", "both"):
            from calmd.training.ranker_refit import RankerExamples, refit_ranker

            base_ranker = ours[learner].engine.ranker
            examples = RankerExamples(base_ranker)
        past = PastOnly()
        start_ts = time.time() - 60 * len(commands)
        sampled_set = set(sampled)
        for i, cmd in enumerate(commands):
            if i in sampled_set:
                seen_before = cmd in past.counts
                for k in KS:
                    if k > 0 and len(cmd) <= k:
                        continue
                    prefix = cmd[:k]
                    answers: dict[str, list[str]] = {}
                    for system, one in ours.items():
                        got = one.timed(prefix, 5, cmd)
                        answers[system] = [text for text, _, _ in got.candidates]
                        first = got.candidates[0] if got.candidates else ("", 0.0, False)
                        tallies[system].tops[k].append((first[1], first[0] == cmd, first[2]))
                    for system in BASELINES:
                        answers[system] = past.suggest(system, prefix)
                    for system, texts in answers.items():
                        t = tallies[system]
                        t.queries[k] += 1
                        t.seen[k] += seen_before
                        t.top1[k] += bool(texts) and texts[0] == cmd
                        t.top5[k] += cmd in texts[:5]
                if i in typed_out:
                    if states is not None:
                        collector = next(iter(ours.values()))
                        collector.cache.clear()
                        states.append({"user": path.stem, **collector.states(cmd)})
                    for system, one in ours.items():
                        one.cache.clear()  # the store is the same while one command is typed out
                        one.target = cmd
                        type_out(tallies[system], cmd, one.accepted, one.drawn)
                    for system in BASELINES:
                        type_out(tallies[system], cmd, past.top1(system))
            store.record(cmd, exit=0, session=SESSION, ts=start_ts + 60 * i)  # no exit codes in the files
            past.add(cmd)
            if examples is not None:
                examples.add(cmd, SESSION)
            if disk is not None:
                disk.add(cmd)
            if cfg.train_every and (i + 1) % cfg.train_every == 0 and sampled and i < sampled[-1]:
                # what the daemon does in real use: fine-tune on the history so far, swap if not worse
                learning = engine = ours[learner].engine
                if cfg.refit in ("model", "both"):
                    from calmd.training.background import RunOptions, run

                    # the model alone: the ranker's refit is the replay's own (`--refit ranker`)
                    result = run(RunOptions(Path(tmp), weights, threads=1, max_minutes=5, refit_ranker=False))
                    if result.get("swapped"):
                        engine = engine_factory(weights)
                        engine.attach_history(store)
                        tallies[learner].swaps += 1
                if examples is not None:  # the history ranker refitted on the user's commands so far
                    engine.ranker = refit_ranker(examples.examples, base_ranker)
                for one in ours.values():  # the learner and its COMP twin
                    if one.engine is learning:
                        one.engine = engine
                tallies[learner].runs += 1
                tallies = {s: Tally() for s in systems}  # the next stretch of the learning curve
                stretches.append(tallies)
                for system, one in ours.items():
                    one.tally = tallies[system]
        store.close()
    totals = {s: Tally() for s in systems}
    for stretch in stretches:
        for system, t in stretch.items():
            totals[system].add(t)
    if cfg.train_every:
        for system in systems:
            totals[system].curve = [stretch[system] for stretch in stretches]
    return totals


def type_out(tally: Tally, cmd: str, suggest: Suggest, drawn: Request | None = None) -> None:
    """The simulated users type `cmd` out with `suggest`'s top suggestions, and again with only
    the ghosts a shell draws: `drawn` answers a request as calmd's zsh client sends them
    (`keys_with_ghosts`); without it the system draws its top suggestion at every key (the
    baselines)."""
    if not cmd:
        return
    tally.typed += 1
    tally.chars += len(cmd)
    keys = keys_whole_line(cmd, suggest)
    tally.keys_lines += keys
    tally.saved += 1 - keys / len(cmd)
    if drawn is None:  # the baselines draw their top suggestion at every state: one user
        words = words_drawn = keys_with_ghosts(cmd, lambda typed, _shown: suggest(typed), True, tally.screen)
        keys_drawn = keys
    else:
        words = keys_word_by_word(cmd, suggest)
        keys_drawn = keys_with_ghosts(cmd, drawn, False)
        words_drawn = keys_with_ghosts(cmd, drawn, True, tally.screen)
    tally.keys_words += words
    tally.keys_lines_drawn += keys_drawn
    tally.saved_drawn += 1 - keys_drawn / len(cmd)
    tally.keys_words_drawn += words_drawn


def collect_rows(files: Sequence[Path], cfg: ReplayConfig, calibrator: Any) -> Rows:
    """Calibration rows from replaying `files` (calmd/suggest/calibration.py fits on them)."""
    from calmd.suggest.engine import ModelEngine, RankWeights

    rows = Rows()
    started = time.monotonic()
    for n, path in enumerate(files, 1):
        replay_user(
            path, cfg, lambda w: ModelEngine(w, RankWeights(**cfg.weights), calibrator=calibrator), rows
        )
        elapsed = time.monotonic() - started
        print(f"[{n}/{len(files)}] {path.stem}: {len(rows.candidate)} rows, {elapsed:.0f} s", flush=True)
    return rows


def replay_file(path: Path, cfg: ReplayConfig) -> dict[str, Tally]:
    """One user replayed with the daemon's engine (`cfg.ranker`'s parts, `cfg.weights`): what a
    worker of `replay` runs, in this process or another."""
    from calmd.suggest.calibration import packaged_calibration_path, packaged_calibrator, uncalibrated
    from calmd.suggest.engine import ModelEngine, RankWeights

    # a checkout that has not fitted its calibration yet still replays (every confidence 0.5)
    calibrator = packaged_calibrator() if packaged_calibration_path().exists() else uncalibrated()
    weights = RankWeights(**cfg.weights)
    return replay_user(path, cfg, lambda w: ModelEngine(w, weights, calibrator=calibrator, parts=cfg.ranker))


def replayed(files: Sequence[Path], cfg: ReplayConfig) -> Iterator[tuple[Path, dict[str, Tally]]]:
    """Each user's tallies as they come: one after the other, or with `cfg.jobs` > 1 that many
    users at once, each in a process of its own (spawned: a forked torch can deadlock), in the
    order they finish."""
    if cfg.jobs <= 1 or len(files) <= 1:
        for path in files:
            yield path, replay_file(path, cfg)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(cfg.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        running = {pool.submit(replay_file, path, cfg): path for path in files}
        for done in as_completed(running):
            yield running[done], done.result()


def replay(files: Sequence[Path], cfg: ReplayConfig, *, progress: bool = True) -> dict[str, Any]:
    systems = cfg.all_systems()
    per_user_tallies: dict[Path, dict[str, Tally]] = {}
    started = time.monotonic()
    for n, (path, tallies) in enumerate(replayed(files, cfg), 1):
        per_user_tallies[path] = tallies
        if progress:
            top1 = tallies[systems[0]].to_json()["top1"]
            user = " ".join(f"k{k}={v:.2f}" for k, v in top1.items() if v is not None)
            print(f"[{n}/{len(files)}] {path.stem}: {time.monotonic() - started:.0f} s, {systems[0]} top-1 "
                  f"{user}", flush=True)  # fmt: skip
    totals = {s: Tally() for s in systems}
    per_user: dict[str, Any] = {}
    for path in files:  # in the files' order, whichever finished first
        tallies = per_user_tallies[path]
        per_user[path.stem] = {s: t.to_json() for s, t in tallies.items()}
        for s, t in tallies.items():
            totals[s].add(t)
    return {
        "model": str(cfg.model),
        "models": {s: str(m) for s, m in cfg.systems().items()},
        "users": len(files),
        "positions_per_user": cfg.positions,
        **({"first": cfg.first} if cfg.first else {}),
        "seed": cfg.seed,
        "weights": cfg.weights,
        "ranker": cfg.ranker,
        **({"train_every": cfg.train_every, "refit": cfg.refit} if cfg.train_every else {}),
        "totals": {s: t.to_json() for s, t in totals.items()},
        "per_user": per_user,
    }


def format_table(result: dict[str, Any]) -> str:
    """Top-1 per k and top-5 at k = 0; keystrokes saved by the whole-line and the word-by-word
    user, first with every system's top suggestion whatever its confidence, then with only what
    the shell draws (calmd: its ghost rule; the baselines draw theirs always); then the ceiling,
    each calmd system's top-1 as a share of it, and what calmd's ghosts did."""
    head = f"{'system':<36}" + "".join(f"{'k=' + str(k):>7}" for k in KS)
    lines = [head + f"{'top5':>7}{'line':>7}{'word':>7}{'drawn:':>8}{'line':>6}{'word':>7}{'ms p50/p99':>14}"]

    def pct(v: float | None, width: int = 6) -> str:
        return f"{(v or 0) * 100:>{width}.1f}%"

    for system, t in result["totals"].items():
        top1 = "".join(pct(t["top1"][k]) for k in KS)
        saved = pct(t.get("keystrokes_saved_lines")) + pct(t.get("keystrokes_saved_words"))
        drawn = " " * 8 + pct(t.get("keystrokes_saved_lines_drawn"), 5)
        drawn += pct(t.get("keystrokes_saved_words_drawn"))
        ms = t.get("latency_ms")
        timing = f"{ms['done_p50']:>7.1f}/{ms['done_p99']:<6.1f}" if ms else ""
        lines.append(f"{system:<36}{top1}{pct(t['top5'][0])}{saved}{drawn}{timing}")
    lines.append("")
    lines.append(f"{'the screen, drawn ghosts word by word':<36}{'keys saved':>11}{'ghost drawn':>13}"
                 f"{'wrong of drawn':>16}{'states wrong':>14}")  # fmt: skip
    for system, t in result["totals"].items():
        sc = t.get("screen") or {}
        if not sc.get("states"):
            continue
        shares = pct(sc["drawn_share"], 12) + pct(sc["wrong_of_drawn"], 15) + pct(sc["wrong_share"], 13)
        lines.append(f"{system:<36}{pct(t.get('keystrokes_saved_words_drawn'), 10)}{shares}")
    lines.append("")
    # the same for every system: the share of queries whose command had been run before
    first = next(iter(result["totals"].values()))
    seen = first["seen_before"]
    lines.append(f"{'(ceiling) run before':<36}" + "".join(pct(seen[k]) for k in KS))
    for system, t in result["totals"].items():
        if system.startswith("calmd"):
            share = "".join(pct(t["top1"][k] / seen[k] if seen[k] else None) for k in KS)
            lines.append(f"{(system + ' top-1 / ceiling'):<36}{share}")
    ours = result["totals"].get("calmd") or next(
        (t for s, t in result["totals"].items() if s.startswith("calmd")), None
    )
    if ours is not None and "coverage" in ours:
        for name, key in (("calmd ghost drawn (coverage)", "coverage"),
                          ("calmd ghost right (precision)", "precision")):  # fmt: skip
            lines.append(f"{name:<36}" + "".join(pct(ours[key][k]) for k in KS))
        g = ours["ghosts"]
        lines.append(
            f"calmd ghosts while typing out: {g['requests']} requests, {g['early_drawn']} early lines drawn, "
            f"{g['replaced']} replaced within the keystroke ({g['replaced_share'] * 100:.1f}% of requests; "
            f"the new line was the command {g['replaced_by_the_command']} times, the old one "
            f"{g['replaced_the_command']})"
        )
    lines.append("line / word: keystrokes saved taking the top suggestion always; drawn: only what is drawn")
    lines += format_curve(result)
    if any("latency_ms" in t for t in result["totals"].values()):
        lines.append("ms p50/p99: in-process request -> last of 5 candidates at the sampled queries")
    return "\n".join(lines)


def _at_k(per_k: dict[Any, Any], k: int) -> Any:
    """A per-k figure of a result, in memory (int keys) or read back from JSON (str keys)."""
    return per_k[k] if k in per_k else per_k[str(k)]


def format_curve(result: dict[str, Any]) -> list[str]:
    """With training: per stretch of commands after j runs, the calmd that learns against the
    packaged one on the same queries (top-1 at k = 0, 1 and over every k; drawn-ghost keystrokes
    saved word by word), then the same over every stretch; nothing without training."""
    totals = result["totals"]
    learner = next((s for s in totals if s.startswith("calmd") and s != PACKAGED_SYSTEM), None)
    if learner is None or PACKAGED_SYSTEM not in totals or "curve" not in totals[learner]:
        return []
    metrics = (("top-1 k=0", lambda t: _at_k(t["top1"], 0)),
               ("top-1 k=1", lambda t: _at_k(t["top1"], 1)),
               ("top-1 all", lambda t: t["top1_all"]),
               ("drawn word", lambda t: t["keystrokes_saved_words_drawn"]))  # fmt: skip

    def row(name: str, learnt: dict[str, Any], packaged: dict[str, Any]) -> str:
        cells = []
        for _, value in metrics:
            a, b = value(learnt), value(packaged)
            cells.append(f"{(a or 0) * 100:>7.1f}{(b or 0) * 100:>7.1f}{((a or 0) - (b or 0)) * 100:>+7.1f}")
        return f"{name:<24}{learnt['typed_commands']:>7}" + "".join(cells)

    head = f"{'learning curve':<24}{'typed':>7}" + "".join(f"{name + ' (+/-)':>21}" for name, _ in metrics)
    every = f"{result.get('refit', '?')} refitted every {result.get('train_every', '?')} commands"
    lines = ["", f"{learner} ({every}) against {PACKAGED_SYSTEM}, the same queries: learnt, packaged, "
             "difference", head]  # fmt: skip
    for j, (learnt, packaged) in enumerate(zip(totals[learner]["curve"], totals[PACKAGED_SYSTEM]["curve"],
                                               strict=True)):  # fmt: skip
        if learnt["top1_all"] is not None:
            lines.append(row(f"after {j} runs", learnt, packaged))
    lines.append(row("every stretch", totals[learner], totals[PACKAGED_SYSTEM]))
    return lines


def write_json(result: dict[str, Any], path: Path) -> None:
    from calmd.atomic import atomic_write

    with atomic_write(path) as f:
        f.write(json.dumps(result, indent=1).encode())


def model_names(models: Sequence[Path]) -> dict[str, Path]:
    """System names for several models: "calmd:<name>", the name being the folder of a file
    named generically (`weights.cwgt`, `model.cwgt`, `shell.cwgt`: /work/models/<name>/model.cwgt)
    or else the file's stem, made unique."""
    out: dict[str, Path] = {}
    for model in models:
        generic = model.stem in ("weights", "model", "shell") and model.parent.name
        name = model.parent.name if generic else model.stem
        system, n = f"calmd:{name}", 2
        while system in out:
            system, n = f"calmd:{name}-{n}", n + 1
        out[system] = model
    return out


def expand(files: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for name in files:
        p = Path(name)
        out.extend(sorted(p.glob("*.txt")) if p.is_dir() else [p])
    return out


# --------------------------------------------------------------------------- search mode (issue 26)
#
# `calm replay --search`: the user opens the history search (Ctrl-R) to run again a command they
# ran before, and types its first word, or a distinctive fragment of it. At each sampled position
# whose command had been run before (a search cannot find a new line), both queries are asked of
# calmd's search (calmd/suggest/search.py: the fitted ranker over the pool, then the other matches
# by recency) and of two orders of the same matches: recency (atuin's default) and frequency. The
# figure is the rank of the command in each order (1: first). The histories carry no folders: the
# context's folder is followed from the `cd` lines (`follow_cd`), as the shells record it (the
# folder a line was typed in).

SEARCH_ORDERS = ("calmd", "recency", "frequency")
QUERY_KINDS = ("first_word", "fragment")
FRAGMENT_CHARS = 6  # a fragment is at most this many characters of the command's rarest word
SEARCH_HOME = "/home/user"


def follow_cd(cwd: str, cmd: str, previous: str = SEARCH_HOME) -> str:
    """The folder after `cmd` as far as its `cd`/`pushd` words tell (each `&&`/`;` part in turn):
    absolute, `~`-relative and relative paths, `..`, `-` (the previous folder, `previous`); a
    `cd` to a variable, a glob or a command substitution leaves the folder as it was."""
    for part in re.split(r"&&|\|\||;", cmd):
        words = part.split()
        if not words or words[0] not in ("cd", "pushd"):
            continue
        target = next((w for w in words[1:] if not w.startswith("-") or w == "-"), "~")
        if target == "-":
            cwd, previous = previous, cwd
            continue
        if any(c in target for c in "$*?`(){}"):
            continue
        target = target.strip("'\"")
        if target == "~" or target.startswith("~/"):
            target = SEARCH_HOME + target[1:]
        elif target.startswith("~"):
            continue  # another user's home
        base = [] if target.startswith("/") else [p for p in cwd.split("/") if p]
        for piece in target.split("/"):
            if piece == "..":
                base = base[:-1]
            elif piece and piece != ".":
                base.append(piece)
        cwd, previous = "/" + "/".join(base), cwd
    return cwd


def search_query(cmd: str, kind: str, texts: Sequence[str]) -> str | None:
    """What the simulated user types to find `cmd`: its first word (`first_word`), or the first
    FRAGMENT_CHARS characters of its rarest later word (`fragment`: the word of at least 3
    characters, quotes and leading dashes left out, that the fewest earlier distinct commands
    `texts` contain; ties: the longer, then the first). None when the command has no such word."""
    words = cmd.split()
    if kind == "first_word":
        return words[0] if words else None
    assert kind == "fragment", kind
    later = [w.strip("'\"").lstrip("-") for w in words[1:]]
    later = [w for w in later if len(w) >= 3]
    if not later:
        return None
    lowered = [t.lower() for t in texts]
    rarity = {w: sum(w.lower() in t for t in lowered) for w in dict.fromkeys(later)}
    word = min(rarity, key=lambda w: (rarity[w], -len(w), later.index(w)))
    return word[:FRAGMENT_CHARS]


@dataclass
class SearchTally:
    """Per query kind: the rank of the right line in each order (0: not among the matches)."""

    positions: int = 0  # sampled positions
    unseen: int = 0  # of which the command had never been run: no search can find it
    ranks: dict[str, list[int]] = field(default_factory=lambda: {o: [] for o in SEARCH_ORDERS})
    pooled: int = 0  # queries whose command reached calmd's scored pool

    def add(self, other: SearchTally) -> None:
        self.positions += other.positions
        self.unseen += other.unseen
        self.pooled += other.pooled
        for order in SEARCH_ORDERS:
            self.ranks[order] += other.ranks[order]

    def to_json(self) -> dict[str, Any]:
        queries = len(self.ranks[SEARCH_ORDERS[0]])
        out: dict[str, Any] = {"positions": self.positions, "unseen": self.unseen, "queries": queries,
                               "pooled": self.pooled / queries if queries else None}  # fmt: skip
        for order, ranks in self.ranks.items():
            found = [r for r in ranks if r > 0]
            out[order] = {
                "top1": sum(r == 1 for r in ranks) / queries if queries else None,
                "top3": sum(0 < r <= 3 for r in ranks) / queries if queries else None,
                "top10": sum(0 < r <= 10 for r in ranks) / queries if queries else None,
                "mrr": sum(1 / r for r in found) / queries if queries else None,
                "median_rank": sorted(found)[len(found) // 2] if found else None,
            }
        return out


@dataclass
class SearchExample:
    """One query with what the fit needs: the pool's features and where the right line is."""

    kind: str
    rows: Any  # (pool, F) float64
    target: int  # the right line's position in the pool, -1 when it is not pooled
    ranks: dict[str, int]


def search_examples(
    commands: Sequence[str], positions: int, seed: str, warmup: int = 50, *,
    index: Any = None, kinds: Sequence[str] = QUERY_KINDS, features: bool = False,
) -> Iterable[SearchExample]:  # fmt: skip
    """The search-mode queries of one history, replayed in order through `index` (a fresh
    SearchIndex by default): at each sampled position whose command was run before, one query
    per kind, answered from the past only, with the rank of the command in each order (and, with
    `features`, the pool's features for the fit)."""
    import numpy as np

    from calmd.suggest.search import Context, SearchIndex

    if len(commands) <= warmup:
        return
    index = index if index is not None else SearchIndex()
    rng = random.Random(seed)
    sampled = set(rng.sample(range(warmup, len(commands)), min(positions, len(commands) - warmup)))
    cwd, previous = SEARCH_HOME, SEARCH_HOME
    start_ts = 1.7e9
    for i, cmd in enumerate(commands):
        if i in sampled:
            ctx = Context(cwd, SESSION, tuple(commands[max(0, i - HISTORY_FRAMES) : i]))
            target = index.ids.get(cmd)
            for kind in kinds:
                if target is None:
                    yield SearchExample(kind, None, -1, {})  # never run before: unseen
                    continue
                query = search_query(cmd, kind, index.texts)
                if query is None:
                    continue
                found, scope = index.matches(query, "global", ctx)
                orders = {
                    "calmd": index.ranked(found, scope, ctx, len(found.ids), empty=False),
                    "recency": index.recency_order(found, scope),
                    "frequency": index.frequency_order(found, scope),
                }
                ranks = {o: _rank_of(target, ids) for o, ids in orders.items()}
                rows, at_target = None, -1
                at = index.pool(found, scope, ctx)
                pooled_ids = found.ids[at]
                hit = np.flatnonzero(pooled_ids == target)
                at_target = int(hit[0]) if len(hit) else -1
                if features:
                    rows = index.features(found, scope, ctx, at, empty=False)
                yield SearchExample(kind, rows, at_target, ranks)
        index.add(cmd, SESSION, 0, start_ts + 60 * i, cwd)  # with the folder it was typed in
        moved = follow_cd(cwd, cmd, previous)
        if moved != cwd:
            cwd, previous = moved, cwd


def _rank_of(target: int, ids: Any) -> int:
    import numpy as np

    hit = np.flatnonzero(ids == target)
    return int(hit[0]) + 1 if len(hit) else 0


def replay_search(files: Sequence[Path], cfg: ReplayConfig, *, progress: bool = True) -> dict[str, Any]:
    """`calm replay --search`: the ranks of the right line per query kind and order, over users."""
    totals = {kind: SearchTally() for kind in QUERY_KINDS}
    per_user: dict[str, Any] = {}
    started = time.monotonic()
    for n, path in enumerate(files, 1):
        tallies = {kind: SearchTally() for kind in QUERY_KINDS}
        seed = f"{cfg.seed}:{path.stem}"
        for example in search_examples(read_history(path), cfg.positions, seed, cfg.warmup):
            tally = tallies[example.kind]
            tally.positions += 1
            if not example.ranks:
                tally.unseen += 1
                continue
            tally.pooled += example.target >= 0
            for order, rank in example.ranks.items():
                tally.ranks[order].append(rank)
        per_user[path.stem] = {k: t.to_json() for k, t in tallies.items()}
        for kind, tally in tallies.items():
            totals[kind].add(tally)
        if progress:
            print(f"[{n}/{len(files)}] {path.stem}: {time.monotonic() - started:.0f} s", flush=True)
    return {"mode": "search", "users": len(files), "positions_per_user": cfg.positions, "seed": cfg.seed,
            "totals": {k: t.to_json() for k, t in totals.items()}, "per_user": per_user}  # fmt: skip


def format_search_table(result: dict[str, Any]) -> str:
    """Per query kind and order: top-1, top-3, top-10, mean reciprocal rank, median rank."""
    lines = [f"{'query':<12}{'order':<12}{'top-1':>8}{'top-3':>8}{'top-10':>8}{'MRR':>8}{'median':>8}"]
    for kind, t in result["totals"].items():
        for order in SEARCH_ORDERS:
            o = t[order]
            if o["top1"] is None:
                continue
            lines.append(f"{kind:<12}{order:<12}{o['top1'] * 100:>7.1f}%{o['top3'] * 100:>7.1f}%"
                         f"{o['top10'] * 100:>7.1f}%{o['mrr']:>8.3f}{o['median_rank'] or 0:>8}")  # fmt: skip
        calmd, recency = t["calmd"]["top1"], t["recency"]["top1"]
        if calmd is not None and recency is not None:
            lines.append(f"{kind:<12}{'calmd - recency':<24}{(calmd - recency) * 100:>+7.1f} points top-1 "
                         f"({t['queries']} queries; {t['unseen']} sampled lines were new)")  # fmt: skip
    return "\n".join(lines)
