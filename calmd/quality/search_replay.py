"""`calm replay --search` (issue 26): the history search's ranking replayed.

The user opens the history search (Ctrl-R) to run again a command they ran before, and types its
first word, or a distinctive fragment of it. At each sampled position whose command had been run
before (a search cannot find a new line), both queries are asked of calmd's search
(calmd/suggest/search.py: the fitted ranker over the pool, then the other matches by recency) and
of two orders of the same matches: recency (atuin's default) and frequency. The figure is the
rank of the command in each order (1: first). The histories carry no folders: the context's
folder is followed from the `cd` lines (`follow_cd`), as the shells record it (the folder a line
was typed in).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd.quality.replay import ReplayConfig
from calmd.quality.systems import SESSION
from calmd.suggest.context import HISTORY_FRAMES
from calmd.training.corpus import read_history

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
