"""History search: what `calm search` (Ctrl-R) shows, answered by the daemon's `search` op
(calmd/daemon/search.py runs it on a thread of its own; this module is the index and its ranking).

Matching (calmd/suggest/search_match.py): a command matches when every term of the query is found
in it, in any order, ignoring case, as typed or as its letters in order (`gco` in `git checkout`).

Ranking, in two stages:
1. the pool: of the matching commands, the most recent (POOL_RECENT), the most frequent
   (POOL_FREQUENT), the latest run in the current folder (POOL_FOLDER), and those that followed the
   previous command or the run of commands before it (the history ranker's transitions);
2. each pooled command is scored by the fitted search ranker (calmd/suggest/search_ranker.py:
   calmd/data/search_ranker.json, `python -m calmd.quality.fit_search`): a one-hidden-layer
   network over SEARCH_FEATURES, whose first feature is the score calmd's history ranker
   (calmd/suggest/ranking.py) gives it as the next command in this context (what followed the
   previous one or two commands, runs of commands that repeat, recency, frequency), then how the
   query matched it (at the start, at word starts, as typed or scattered) and how often it ran in
   the current folder. Commands that never succeeded are moved down by FAILED_PENALTY (the public
   histories the ranker is fitted on carry no exit statuses, so this is a rule, as in the
   suggestions).
The list is the pool in score order, then the other matches, most recent first.

Filter modes (`MODES`): every command (`global`), those recorded on this machine (`host`: the
history may hold other machines', calmd/sync/), run in the current folder (`folder`), in
this shell session (`session`), or that succeeded at least once (`success`: exit 0, or no status
known, as for imported history). Each result carries its latest run in that scope: when, where,
with which status.

The index follows the store like the suggestions' index does (rows with a larger id), through a
read-only connection of its own (calmd/history/query/), holding at most SEARCH_LIMIT commands
(the newest). Rows deleted from the store (`calm forget`, a re-scan) rebuild it; a command the
search itself deletes (`forget` op) is dropped in place and the transitions rebuilt from what
remains.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmd.history import query
from calmd.protocol import SEARCH_MODES as MODES
from calmd.suggest.filters import terminal_safe
from calmd.suggest.ranking import INDEX_LIMIT, HistoryIndex, Ranker, packaged_ranker
from calmd.suggest.search_match import Column, CommandText, Matches, parse_query
from calmd.suggest.search_ranker import SearchRanker, packaged_search_ranker

SEARCH_LIMIT = 500_000  # the newest commands searched (memory: about 60 bytes each, plus the text)
PAUSED_BATCH = 100  # rows read between two pauses when the daemon's keystrokes go first (1-5 ms)
POOL_RECENT = 60
POOL_FREQUENT = 40
POOL_FOLDER = 40
POOL_FOLLOWERS = 40
FAILED_PENALTY = 3.0  # subtracted from the score of a command that never succeeded
NO_EXIT = np.iinfo(np.int64).min  # a run without a known status (imported history)


# --------------------------------------------------------------------------- the index


@dataclass(frozen=True)
class Context:
    """Where the search was opened: the folder, the shell session, its latest commands (oldest
    first: the last one is the previous command)."""

    cwd: str = ""
    session: str = ""
    history: tuple[str, ...] = ()


@dataclass(frozen=True)
class Result:
    """One line of the search: the command and its latest run in the mode's scope."""

    cmd: str
    ts: float
    cwd: str
    exit: int | None
    runs: int  # in the scope
    failing: bool  # it never succeeded (every run with a known status failed)

    def to_json(self) -> dict[str, Any]:
        return {"cmd": self.cmd, "ts": self.ts, "cwd": self.cwd, "exit": self.exit, "runs": self.runs,
                "failing": self.failing}  # fmt: skip


@dataclass
class Answer:
    results: list[Result]
    matches: int  # commands the query matched in the mode


@dataclass
class _Scope:
    """Per mode, the latest run of each command in its scope (row index, -1: none) and the runs."""

    last_row: np.ndarray
    runs: np.ndarray
    key: tuple[Any, ...] = ()  # (mode, folder or session, the index's version)


class SearchIndex:
    """Every command of the history (the newest SEARCH_LIMIT), distinct, with its runs.

    Not thread-safe: the daemon confines it to its search thread."""

    def __init__(self, ranker: SearchRanker | None = None, history_ranker: Ranker | None = None) -> None:
        self.history_ranker = history_ranker or packaged_ranker()
        self.ranker = ranker or packaged_search_ranker()
        self.transitions = HistoryIndex(self.history_ranker.prior)  # the history ranker's view
        self.texts: list[str] = []
        self.ids: dict[str, int] = {}
        self.text = CommandText()
        # per distinct command
        self.runs = Column(np.int64)
        self.ok = Column(np.int64)  # runs that did not fail (exit 0 or unknown)
        self.failed = Column(np.int64)
        self.last_row = Column(np.int64, -1)
        self.dead = Column(np.bool_, False)  # deleted (the `forget` op): never shown again
        # per run, in recording order
        self.row_cmd = Column(np.int64)
        self.row_ts = Column(np.float64)
        self.row_cwd = Column(np.int64)
        self.row_session = Column(np.int64)
        self.row_exit = Column(np.int64, NO_EXIT)
        self.row_id = Column(np.int64)  # the store's row id (0 in the replay)
        self.row_remote = Column(np.bool_, False)  # recorded on another machine (calmd/sync/)
        self.cwds: dict[str, int] = {}
        self.cwd_names: list[str] = []
        self.sessions: dict[str, int] = {}
        self.last_id = 0  # the store's newest row id seen
        self.generation: int | None = None  # the store's deletion counter when it was read
        self.transitions_from = 0  # rows with a larger id feed the transitions (the newest INDEX_LIMIT)
        self.version = 0  # bumped by every change: cached scopes are keyed by it
        self._scopes: dict[tuple[Any, ...], _Scope] = {}
        self._linked_cache: tuple[tuple[str, ...], int, set[int]] | None = None
        self._shown: dict[int, bool] = {}  # the credential check of commands already shown
        self._last_match: tuple[tuple[Any, ...], str, np.ndarray] | None = None  # (scope key, text, ids)

    def __len__(self) -> int:
        return self.row_cmd.n

    # -- building ---------------------------------------------------------------------------------

    def add(self, cmd: str, session: str = "", exit: int | None = None, ts: float | None = None,
            cwd: str = "", git: str = "", row_id: int = 0, *, transitions: bool = True,
            host: str = "") -> None:  # fmt: skip
        """One run of `cmd` (in recording order). `transitions`: also feed the history ranker's
        index (the newest HistoryIndex-sized part of a large history only)."""
        i = self.ids.get(cmd)
        if i is None:
            i = self.ids[cmd] = len(self.texts)
            self.texts.append(cmd)
            self.text.add(cmd)
            for column in (self.runs, self.ok, self.failed, self.last_row, self.dead):
                column.append(column.fill)
        elif self.dead.data[i]:
            self.dead.data[i] = False
        row = self.row_cmd.n
        failed = exit is not None and exit != 0
        self.runs.data[i] += 1
        if failed:
            self.failed.data[i] += 1
        else:
            self.ok.data[i] += 1
        self.last_row.data[i] = row
        self.row_cmd.append(i)
        self.row_ts.append(ts if ts is not None else 0.0)
        self.row_cwd.append(self._intern(self.cwds, cwd, self.cwd_names))
        self.row_session.append(self._intern(self.sessions, session))
        self.row_exit.append(NO_EXIT if exit is None else exit)
        self.row_id.append(row_id)
        self.row_remote.append(bool(host))
        if transitions:
            self.transitions.add(cmd, session, exit, ts, cwd, git)
        self.version += 1

    def sync(self, db: sqlite3.Connection, pause: Callable[[], None] | None = None) -> int:
        """Read the rows the store gained since the last sync (a read-only connection,
        calmd/history/query/); returns how many. The first sync reads the newest SEARCH_LIMIT.
        Rows deleted meanwhile (the generation moved) start it over; so does growing past
        SEARCH_LIMIT by a quarter (the oldest are then left out), and more than SEARCH_LIMIT new
        rows (an import: it reads the newest then). It reads up to the newest row there is when it
        starts, never chasing an import that adds rows meanwhile (issue 30). `pause`: called
        between two slices of PAUSED_BATCH rows (the daemon's keystrokes go first, issue 42)."""
        generation = query.generation(db)
        deleted = self.generation is not None and generation != self.generation
        behind = len(self) and query.newest_after(db, SEARCH_LIMIT) > self.last_id  # an import added more
        if deleted or behind or len(self) > SEARCH_LIMIT * 5 // 4:
            self.__init__(self.ranker, self.history_ranker)  # type: ignore[misc]  # start over
        self.generation = generation
        if not len(self):
            self.last_id = query.newest_after(db, SEARCH_LIMIT)
            self.transitions_from = query.newest_after(db, INDEX_LIMIT)
        newest = query.newest_after(db, 0)  # what is there now: an import adding rows is not chased
        added = 0
        batch = query.BATCH if pause is None else PAUSED_BATCH
        while True:
            if pause is not None:
                pause()
            rows = [row for row in query.rows_after(db, self.last_id, batch) if row[0] <= newest]
            if not rows:
                return added
            for rid, ts, session, cwd, git, cmd, code, host in rows:
                fed = rid > self.transitions_from  # among the history ranker's newest
                self.add(cmd, session, code, ts, cwd, git, rid, transitions=fed, host=host)
            self.last_id = rows[-1][0]
            added += len(rows)

    def prepare(self) -> None:
        """Build what the first keystroke would otherwise wait for (the text's byte positions)."""
        self.text.arrays()

    def shown(self, i: int) -> bool:
        """Whether command `i` may be shown: what the store would store today (calmd/secrets/),
        and nothing that drives a terminal (no control character but a multi-line command's
        newlines: calmd/suggest/filters.py, the rule every candidate follows)."""
        found = self._shown.get(i)
        if found is None:
            text = self.texts[i]
            found = self._shown[i] = query.shown(text) and terminal_safe(text.replace("\n", " "))
        return found

    @staticmethod
    def _intern(table: dict[str, int], value: str, names: list[str] | None = None) -> int:
        found = table.get(value)
        if found is None:
            found = table[value] = len(table)
            if names is not None:
                names.append(value)
        return found

    def forget(self, cmd: str) -> bool:
        """Drop every run of `cmd` from what is shown (the store deleted them)."""
        i = self.ids.get(cmd)
        if i is None or self.dead.data[i]:
            return False
        self.dead.data[i] = True
        self.version += 1
        return True

    # -- searching --------------------------------------------------------------------------------

    def _scope(self, mode: str, ctx: Context) -> _Scope:
        """The latest run and the number of runs of each command within `mode`'s scope."""
        where = ctx.cwd if mode == "folder" else ctx.session if mode == "session" else ""
        key = (mode, where, self.version)
        found = self._scopes.get(key)
        if found is not None:
            return found
        n = len(self.texts)
        if mode in ("folder", "session", "host"):
            if mode == "host":
                rows = np.flatnonzero(~self.row_remote.view())
            else:
                table = self.cwds if mode == "folder" else self.sessions
                column = self.row_cwd if mode == "folder" else self.row_session
                code = table.get(where)
                inside = column.view() == code if code is not None else np.zeros(0, dtype=np.bool_)
                rows = np.flatnonzero(inside)
            cmds = self.row_cmd.view()[rows]
            last = np.full(n, -1, dtype=np.int64)
            last[cmds] = rows  # rows ascend: the last assignment to each command is its latest run
            scope = _Scope(last, np.bincount(cmds, minlength=n).astype(np.int64), key)
        else:
            last = self.last_row.view().copy()
            runs = self.runs.view().copy()
            if mode == "success":
                keep = self.ok.view() > 0
                last[~keep] = -1
                runs[~keep] = 0
            scope = _Scope(last, runs, key)
        scope.last_row[self.dead.view()] = -1
        if len(self._scopes) > 8:
            self._scopes.clear()
        self._scopes[key] = scope
        return scope

    def matches(self, text: str, mode: str = "global", ctx: Context = Context()) -> tuple[Matches, _Scope]:
        """The commands the query `text` matches within `mode`'s scope. Typing on narrows: a
        query that extends the previous one (same scope, same index) matches a subset of what
        that one matched, so only those are searched."""
        assert mode in MODES, mode
        scope = self._scope(mode, ctx)
        alive = scope.last_row >= 0
        last = self._last_match
        if last is not None and last[0] == scope.key and text.startswith(last[1]):
            narrowed = np.zeros(len(alive), dtype=bool)
            narrowed[last[2]] = True
            alive &= narrowed
        found = self.text.match(parse_query(text), alive)
        self._last_match = (scope.key, text, found.ids)
        return found, scope

    def search(self, text: str, mode: str = "global", ctx: Context = Context(), n: int = 20) -> Answer:
        """The best `n` commands for the query `text` in `mode`, best first; never one the
        credential detector flags (the store refuses those; one stored before a newer detector
        is left out until the daemon's next start re-scans the store)."""
        found, scope = self.matches(text, mode, ctx)
        order = self.ranked(found, scope, ctx, n, empty=not parse_query(text))
        shown = [int(i) for i in order if self.shown(int(i))]
        while len(shown) < n and len(order) < len(found.ids):  # flagged ones were left out: more
            order = self.ranked(found, scope, ctx, 2 * len(order) + n, empty=not parse_query(text))
            shown = [int(i) for i in order if self.shown(int(i))]
        return Answer([self._result(i, scope) for i in shown[:n]], len(found.ids))

    def _result(self, i: int, scope: _Scope) -> Result:
        row = int(scope.last_row[i])
        code = int(self.row_exit.data[row])
        return Result(self.texts[i], float(self.row_ts.data[row]), self.cwd_names[self.row_cwd.data[row]],
                      None if code == NO_EXIT else code, int(scope.runs[i]), self.failing(i))  # fmt: skip

    def failing(self, i: int) -> bool:
        return bool(self.ok.data[i] == 0 and self.failed.data[i] > 0)

    def recency_order(self, found: Matches, scope: _Scope) -> np.ndarray:
        """The matches, most recent first (atuin's order)."""
        return found.ids[np.argsort(-scope.last_row[found.ids], kind="stable")]

    def frequency_order(self, found: Matches, scope: _Scope) -> np.ndarray:
        """The matches, most run first, ties most recent first."""
        ids = found.ids
        return ids[np.lexsort((-scope.last_row[ids], -scope.runs[ids]))]

    def pool(self, found: Matches, scope: _Scope, ctx: Context) -> np.ndarray:
        """Stage 1: the matches worth scoring (positions into `found.ids`)."""
        ids = found.ids
        chosen: set[int] = set()
        for key, size in ((scope.last_row[ids], POOL_RECENT), (scope.runs[ids], POOL_FREQUENT)):
            chosen.update(_top(key, size).tolist())
        code = self.cwds.get(ctx.cwd) if ctx.cwd else None
        if code is not None:
            folder = self._scope("folder", ctx).last_row[ids]
            inside = np.flatnonzero(folder >= 0)
            chosen.update(inside[_top(folder[inside], POOL_FOLDER)].tolist())
        linked = self._linked(ctx)
        if linked:
            wanted = np.array(sorted(linked), dtype=np.int64)
            at = np.searchsorted(ids, wanted)
            ok = at < len(ids)
            at = at[ok]
            chosen.update(at[ids[at] == wanted[ok]].tolist())
        return np.array(sorted(chosen), dtype=np.int64)

    def _linked(self, ctx: Context) -> set[int]:
        """Commands that followed the previous command (the most frequent POOL_FOLLOWERS) or
        continued an earlier run of the context's commands."""
        if not ctx.history:
            return set()
        cached = self._linked_cache
        if cached is not None and cached[0] == ctx.history and cached[1] == self.version:
            return cached[2]
        prev = ctx.history[-1]
        follows = self.transitions.follows.get(prev)
        texts = set(heapq.nlargest(POOL_FOLLOWERS, follows, key=follows.__getitem__)) if follows else set()
        texts.update(self.transitions.context_match(ctx.history))
        linked = {self.ids[t] for t in texts if t in self.ids}
        self._linked_cache = (ctx.history, self.version, linked)
        return linked

    def features(
        self, found: Matches, scope: _Scope, ctx: Context, at: np.ndarray, *, empty: bool
    ) -> np.ndarray:
        """SEARCH_FEATURES for the matches at positions `at`   (len(at), F)."""
        ids = found.ids[at]
        texts = [self.texts[i] for i in ids]
        history = np.zeros(0)
        if texts:
            history = self.history_ranker.scores(self.transitions.features("", texts, list(ctx.history)))
        rows_total = max(len(self), 1)
        last = scope.last_row[ids]
        all_last = np.sort(scope.last_row[found.ids])
        all_runs = np.sort(scope.runs[found.ids])
        recency_rank = len(all_last) - np.searchsorted(all_last, last, side="right")
        frequency_rank = len(all_runs) - np.searchsorted(all_runs, scope.runs[ids], side="right")
        lengths = self.text.ends.view()[ids] - self.text.starts.view()[ids]
        folder = self._scope("folder", ctx) if ctx.cwd in self.cwds else None
        folder_runs = folder.runs[ids] if folder is not None else np.zeros(len(ids))
        folder_last = (folder.last_row[ids] >= 0) & (folder.last_row[ids] == self.last_row.view()[ids]) \
            if folder is not None else np.zeros(len(ids), dtype=bool)  # fmt: skip
        return np.column_stack([
            history,
            np.log1p(scope.runs[ids]),
            np.log1p(np.maximum(rows_total - 1 - last, 0)),
            np.log1p(recency_rank),
            np.log1p(frequency_rank),
            found.substrings[at],
            found.word_starts[at],
            found.prefix[at],
            found.first_word[at],
            np.log1p(found.gap[at]),
            np.log1p(lengths),
            np.log1p(folder_runs),
            folder_last,
            np.full(len(ids), float(empty)),
        ]).astype(np.float64)  # fmt: skip

    def ranked(self, found: Matches, scope: _Scope, ctx: Context, n: int, *, empty: bool) -> np.ndarray:
        """The distinct ids of the matches, best first: the pool by score, then the rest by
        recency (only as many as `n` needs)."""
        at = self.pool(found, scope, ctx)
        if len(at):
            scores = self.ranker.scores(self.features(found, scope, ctx, at, empty=empty))
            failing = self.ok.view()[found.ids[at]] == 0
            scores = scores - FAILED_PENALTY * failing
            best = found.ids[at[np.argsort(-scores, kind="stable")]]
        else:
            best = np.zeros(0, dtype=np.int64)
        if len(best) >= n:
            return best
        rest = np.setdiff1d(found.ids, best, assume_unique=True)
        rest = rest[_top(scope.last_row[rest], n - len(best))]
        return np.concatenate([best, rest])


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the `k` largest values, largest first."""
    if k <= 0 or len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(values) > k:
        part = np.argpartition(-values, k - 1)[:k]
        return part[np.argsort(-values[part], kind="stable")]
    return np.argsort(-values, kind="stable")
