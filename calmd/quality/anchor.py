"""The anchor of `calm replay`: a learned ranker over the user's own history, and no model.

Every figure of calmd is read against the best a ranker of history alone does (issue 41): if
calmd, with its model, is not clearly above it, the model has not earned its place. The anchor
knows the user's earlier lines and what other users ran, nothing of the model:

    pool      the ANCHOR_POOL most recent distinct lines that extend the input
    features  ANCHOR_FEATURES: recency (commands since the line's last use, its rank in the pool),
              what followed the previous line (times, share, rank among its followers, whether
              it came last time), counts (overall, in the last 50 and 200 commands, rank by
              count), how many training users ran it, its length and what is left to type
    score     a LightGBM lambdarank forest (calmd/suggest/forest.py), fitted on the 89 training
              users' replay positions (never the held-out ones) by

    python -m calmd.quality.fit_anchor [--data ../shared/data] [--output calmd/data/anchor.json]

`calm replay` replays it as a system beside calmd and the baselines (ANCHOR_SYSTEM), drawing its
top line at every state as the baselines do.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.atomic import read_json
from calmd.suggest.forest import Forest, ForestFile

ANCHOR_SYSTEM = "history-lightgbm (no model)"
ANCHOR_VERSION = 1
ANCHOR_POOL = 200  # the most recent distinct lines extending the input that the anchor ranks
MIN_USERS = 2  # a line counts as popular when at least this many training users ran it
WINDOWS = (50, 200)  # the recent stretches whose counts are features
ANCHOR_FEATURES = (
    "log_distance",  # log(1 + commands run since its last use)
    "log_recency_rank",  # log(1 + its rank in the pool, most recent first)
    "log_count",  # log(1 + times run)
    "log_count_50",  # log(1 + times among the last 50 commands)
    "log_count_200",  # ... the last 200
    "log_frequency_rank",  # log(1 + its rank in the pool by count)
    "log_follows_prev",  # log(1 + times it followed the previous line)
    "share_follows_prev",  # its share of what followed the previous line
    "follower_rank",  # its rank among the previous line's followers by times (1: first; 0: none)
    "followed_prev_last_time",  # it is what followed the previous line the last time
    "log_users",  # log(1 + training users who ran it, when MIN_USERS or more did)
    "length",  # characters
    "remaining",  # characters left to type
    "typed",  # characters typed (the query's)
    "is_prev",  # it is the previous line
    "log_history",  # log(1 + commands in the history) (the query's)
    "log_follows_prev2",  # log(1 + times it followed the previous two lines, in that order)
    "log_skip_prev2",  # log(1 + times it came two lines after the line before the previous one)
    "share_follows_prev_word",  # its share of what followed a line of the previous line's first word
)


class AnchorPast:
    """What the anchor knows of the history at the current position: the past only."""

    def __init__(self) -> None:
        self.n = 0
        self.prev: str | None = None
        self.prev2: str | None = None
        self.last: dict[str, int] = {}  # line -> its last position, in order of last use
        self.count: Counter[str] = Counter()
        self.follows: defaultdict[str, Counter[str]] = defaultdict(Counter)  # prev -> line -> times
        self.follows_last: dict[str, str] = {}  # prev -> what followed it the last time
        self.follows2: defaultdict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self.skip: defaultdict[str, Counter[str]] = defaultdict(Counter)  # line two back -> line -> times
        self.follows_word: defaultdict[str, Counter[str]] = defaultdict(Counter)  # first word -> line
        self.windows = {w: deque[str](maxlen=w) for w in WINDOWS}
        self.in_window = {w: Counter[str]() for w in WINDOWS}

    def add(self, cmd: str) -> None:
        if self.prev is not None:
            self.follows[self.prev][cmd] += 1
            self.follows_last[self.prev] = cmd
            self.follows_word[self.prev.split(" ", 1)[0]][cmd] += 1
            if self.prev2 is not None:
                self.follows2[(self.prev2, self.prev)][cmd] += 1
                self.skip[self.prev2][cmd] += 1
        for w, window in self.windows.items():
            if len(window) == w:
                self.in_window[w][window[0]] -= 1
            window.append(cmd)
            self.in_window[w][cmd] += 1
        self.last.pop(cmd, None)
        self.last[cmd] = self.n
        self.count[cmd] += 1
        self.n += 1
        self.prev, self.prev2 = cmd, self.prev

    def pool(self, prefix: str, size: int = ANCHOR_POOL) -> list[str]:
        """The `size` most recent distinct lines that extend `prefix`, most recent first."""
        found: list[str] = []
        for cmd in reversed(self.last):
            if cmd.startswith(prefix) and cmd != prefix:
                found.append(cmd)
                if len(found) >= size:
                    break
        return found

    def features(self, prefix: str, pool: Sequence[str], users: Mapping[str, int]) -> np.ndarray:
        """ANCHOR_FEATURES for each line of `pool` (most recent first)   (len(pool), F)"""
        prev = self.prev
        follows = self.follows.get(prev, Counter()) if prev is not None else Counter()
        total = sum(follows.values())
        follower_rank = {c: r for r, (c, _) in enumerate(follows.most_common(), 1)}
        by_count = {c: r for r, c in enumerate(sorted(pool, key=lambda c: (-self.count[c], -self.last[c])))}
        last_follower = self.follows_last.get(prev) if prev is not None else None
        short, long = (self.in_window[w] for w in WINDOWS)
        k, log_history = len(prefix), math.log1p(self.n)
        empty: Counter[str] = Counter()
        prev2 = self.prev2
        follows2 = (
            self.follows2.get((prev2, prev), empty) if prev is not None and prev2 is not None else empty
        )
        skip = self.skip.get(prev2, empty) if prev2 is not None else empty
        word = self.follows_word.get(prev.split(" ", 1)[0], empty) if prev is not None else empty
        word_total = sum(word.values())
        rows = np.zeros((len(pool), len(ANCHOR_FEATURES)))
        for j, cmd in enumerate(pool):
            many = users.get(cmd, 0)
            rows[j] = (
                math.log1p(self.n - 1 - self.last[cmd]),
                math.log1p(j),
                math.log1p(self.count[cmd]),
                math.log1p(short[cmd]),
                math.log1p(long[cmd]),
                math.log1p(by_count[cmd]),
                math.log1p(follows[cmd]),
                follows[cmd] / total if total else 0.0,
                follower_rank.get(cmd, 0),
                cmd == last_follower,
                math.log1p(many) if many >= MIN_USERS else 0.0,
                len(cmd),
                len(cmd) - k,
                k,
                cmd == prev,
                log_history,
                math.log1p(follows2[cmd]),
                math.log1p(skip[cmd]),
                word[cmd] / word_total if word_total else 0.0,
            )
        return rows


@dataclass(frozen=True)
class Anchor:
    """The fitted anchor: its forest, and how many training users ran each popular line."""

    forest: Forest
    users: Mapping[str, int]
    info: Mapping[str, Any]

    def suggest(self, past: AnchorPast, prefix: str, n: int = 5) -> list[str]:
        """Its best `n` lines for `prefix`, best first."""
        pool = past.pool(prefix)
        if not pool:
            return []
        scores = self.forest.scores(past.features(prefix, pool, self.users))
        order = np.argsort(-scores, kind="stable")[:n]  # ties: the more recent
        return [pool[i] for i in order]

    def to_json(self) -> dict[str, Any]:
        found = ForestFile(self.forest, dict(self.users), dict(self.info))
        return found.to_json("calm-anchor", ANCHOR_VERSION)

    @classmethod
    def from_json(cls, data: Any, source: str = "anchor") -> Anchor:
        found = ForestFile.from_json(data, "calm-anchor", ANCHOR_VERSION, ANCHOR_FEATURES, source)
        return cls(found.forest, found.users, found.info)

    @classmethod
    def load(cls, path: Path) -> Anchor:
        return cls.from_json(read_json(path, "anchor"), str(path))


def packaged_anchor_path() -> Path:
    return paths.PACKAGE_DATA / paths.PACKAGED_ANCHOR


@functools.cache
def packaged_anchor() -> Anchor | None:
    """The anchor shipped in the package, read once per process; None before its first fit."""
    path = packaged_anchor_path()
    return Anchor.load(path) if path.exists() else None
