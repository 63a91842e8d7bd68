"""What happens to a line before it is ranked: the history's proposals after the junk filters
(`HistorySide`, made by `LineJudge._history_side`), and the checks of the lines the model writes
(`LineJudge`, a part of calmd/suggest/engine.py's ModelEngine): half a command, a failed or
missing one, a secret, an invented subcommand or flag, an argument of the wrong kind, a path that
is not there, a line that belongs to another branch or repository."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from calmd.secrets import find_secret
from calmd.suggest.disk import Disk, check_arguments
from calmd.suggest.filters import (
    Vocabulary,
    balanced,
    cut_off,
    cwd_argument,
    flag_name,
    invented,
    placeholder,
    repeats_word,
    sendable,
)
from calmd.suggest.frames import current_word
from calmd.suggest.index_catch_up import keystroke_sync
from calmd.suggest.kinds import wrong_kind
from calmd.suggest.ranking import HistoryIndex, first_word, outside_git

if TYPE_CHECKING:
    from calmd.history.store import HistoryStore
    from calmd.suggest.engine import RankWeights
    from calmd.suggest.ranker import Ranker

# nats off the score of a line that belongs elsewhere (another branch, inside a repository: `_elsewhere`):
# below every line that belongs here, and never drawn (confidence 0)
ELSEWHERE_PENALTY = 25.0
DISK_PROPOSALS = 4  # COMP items proposed as whole lines (scored in the history's batch)


@dataclass
class HistorySide:
    """The history's proposals for one keystroke, after the junk filters."""

    proposals: dict[str, float]  # command -> P_hist (normalised before the failing ones went)
    carry: set[str]  # which of them are carry-overs (new lines, not past commands)
    failing: set[str]  # the pool's commands that never succeeded or name a missing path (not proposed)
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # the pool's ranking features (the reranker's)
    context: list[str] = field(default_factory=list)  # the session's latest commands, oldest first

    def ordered(self) -> list[str]:
        """Best first."""
        return sorted(self.proposals, key=self.proposals.__getitem__, reverse=True)


class LineJudge:
    """The history's proposals of a keystroke (`_history_side`) and the checks that judge one line
    of it: a part of ModelEngine (calmd/suggest/engine.py)."""

    history: HistoryStore | None
    index: HistoryIndex | None
    ranker: Ranker
    parts: str
    disk: Disk | None
    vocabulary: Vocabulary
    home: str | None
    weights: RankWeights

    def _judge(
        self, typed: str, ctx: dict[str, Any], side: HistorySide, complete: bool,
        missing: Callable[[str], bool] | None = None,
    ) -> Callable[[str], float | None]:  # fmt: skip
        """What happens to a line a beam finished (or COMP completed): kept (0), demoted (a
        negative number added to its score) or dropped (None). Dropped: half a command, a line
        that failed every time it ran (`gti log` when `gti` was not found too), one naming a path
        that is not there (`missing`: the disk check), and of the lines only the model wrote,
        those continuing a complete input, holding a secret, with an invented word
        (calmd/suggest/filters.py), cut off, or repeating a word."""
        index = self.index
        missing = missing or self._missing(ctx)
        cwd = str(ctx.get("cwd") or "")
        multiline = bool(ctx.get("multiline"))  # the client draws multi-line entries (the server's flag)
        kinds = self._kinds(ctx)

        def judge(text: str) -> float | None:
            if not sendable(text, multiline=multiline):
                return None  # drives the terminal (a newline only from a multi-line input typed)
            if text in side.proposals:
                return 0.0  # judged with the history's (`_history_side`)
            if not balanced(text) or missing(text):
                return None  # half a command, whoever wrote it (a past line out of the pool too)
            if index is not None and index.count.get(text, 0) > 0:  # the user's own line
                return None if index.failing(text) else 0.0
            if index is not None and index.missing(text):
                return None  # `gti log` when `gti` was not found
            if complete or find_secret(text) is not None or placeholder(text, typed) or repeats_word(text):
                return None
            if self.weights.vocabulary and (self._made_up(text, typed, cwd, kinds) or self._cut_off(text)):
                return None
            return 0.0

        return judge

    def _missing(self, ctx: dict[str, Any]) -> Callable[[str], bool]:
        """Whether a line's `cd` target or file argument is missing from the shell's cwd (always
        False without a disk or a cwd). Memoised for the request once known: a folder not listed
        in time is asked about again, as its listing comes while the keystroke is worked on."""
        disk, cwd = self.disk, str(ctx.get("cwd") or "")
        seen: dict[str, bool] = {}

        def missing(text: str) -> bool:
            if disk is None or not cwd:
                return False
            found = seen.get(text)
            if found is None:
                path, known = check_arguments(text, cwd, disk)
                found = path is not None
                if known:
                    seen[text] = found
            return found

        return missing

    @staticmethod
    def _disk_proposals(typed: str, ctx: dict[str, Any]) -> list[str]:
        """The input with the word being typed completed by each COMP item that is a path (the
        daemon's COMP: files and directories of the cwd), for a word after the command's first."""
        words, word = current_word(typed)
        if not words or not word or word.startswith("-"):
            return []
        stem = typed[: len(typed) - len(word)]
        items = [i for i in ctx.get("completions") or () if isinstance(i, str) and i.startswith(word)]
        paths = [i for i in items if i != word and (i.endswith("/") or "." in i or "/" in i)]
        return [stem + i for i in paths][:DISK_PROPOSALS]

    def _cut_off(self, text: str) -> bool:
        """A line only the model wrote that stops short: mid-word (`make to`), or after a flag
        the user always gave more words to and never ended a line with (`git push -u`)."""
        user = self.index.vocabulary if self.index is not None else None
        if cut_off(text, self.vocabulary, user):
            return True
        last = text.rsplit(None, 1)[-1] if text.strip() else ""
        return self.index is not None and flag_name(last) is not None and self.index.head_count(text) > 0

    def _elsewhere(self, ctx: dict[str, Any]) -> Callable[[str], bool]:
        """Whether a line belongs to another place than the shell's: a line the user only ever
        ran inside a git repository, or a git line only the model wrote, while the shell is in
        none; a line naming the branch it ran on, on another branch (`git push origin
        feature/login` on master). Such a line is demoted and never drawn. Only judged when the
        shell tells its cwd (the replay's histories do not: always False there)."""
        index = self.index
        cwd, branch = str(ctx.get("cwd") or ""), str(ctx.get("git") or "")
        if index is None or not cwd.startswith("/"):
            return lambda text: False

        def elsewhere(text: str) -> bool:
            if not branch:
                if text in index.count:
                    return index.repo_only(text)
                return first_word(text) == "git" and not outside_git(text)
            bound = index.bound_branch.get(text)
            return bound is not None and bound != branch

        return elsewhere

    def _made_up(self, text: str, typed: str, cwd: str, kinds: Callable[[str, str], str | None]) -> bool:
        """A line the user never ran with an invented subcommand or flag, the cwd pasted in, or an
        argument of the wrong kind (`kinds`: calmd/suggest/kinds.py)."""
        user = self.index.vocabulary if self.index is not None else None
        if invented(text, typed, self.vocabulary, user) is not None:
            return True
        return (bool(cwd) and cwd_argument(text, typed, cwd, self.home)) or kinds(text, typed) is not None

    def _kinds(self, ctx: dict[str, Any]) -> Callable[[str, str], str | None]:
        """`wrong_kind` for one request: paths judged on the disk's listings of the shell's cwd
        (none without a disk or a cwd), the COMP items as offered, the user's own words."""
        disk, cwd = self.disk, str(ctx.get("cwd") or "")
        comp = frozenset(str(c) for c in ctx.get("completions") or ())
        exists = (lambda path: disk.exists(cwd, path)) if disk is not None and cwd.startswith("/") else None
        index = self.index
        user, mine = (index.vocabulary, index.arguments) if index is not None else (None, None)

        def kinds(text: str, typed: str) -> str | None:
            return wrong_kind(
                text, typed, exists=exists, comp=comp, vocab=self.vocabulary, user=user, mine=mine
            )

        return kinds

    def _history_side(
        self, typed: str, ctx: dict[str, Any], session: str, missing: Callable[[str], bool] | None = None
    ) -> HistorySide:
        """History commands that extend the input, each with its history probability P_hist;
        those that never succeeded or name a missing path (`missing`) are not among them."""
        store, index = self.history, self.index
        if store is None or index is None:
            return HistorySide({}, set(), set())
        # what any shell recorded since the last keystroke; what an import or a sync added is read
        # between keystrokes (calmd/suggest/index_catch_up.py)
        keystroke_sync(index, store)
        if self.parts == "model":
            return HistorySide({}, set(), set())  # the ablation without the history's proposals
        context = [str(h.get("cmd", "")) for h in ctx.get("history") or [] if isinstance(h, dict)]
        prev = context[-1] if context else None
        pool = index.pool(typed, prev, size=int(self.weights.pool))
        if not pool:
            return HistorySide({}, set(), set(), {}, context)
        pool_rows = index.features(typed, pool, context)
        probs = self.ranker.probabilities(pool_rows)
        proposals: dict[str, float] = {}
        carry: set[str] = set()
        cwd = str(ctx.get("cwd") or "")
        kinds = self._kinds(ctx)
        for cmd, p in zip(pool, probs, strict=True):
            if not balanced(cmd) or not sendable(cmd, multiline=bool(ctx.get("multiline"))):
                continue  # half a command (an open quote or bracket), or one that drives the terminal
            if cmd not in index.count:  # a carry-over: a new line, judged as the model's are
                if (
                    find_secret(cmd) is not None
                    or placeholder(cmd, typed)
                    or (self.weights.vocabulary and self._made_up(cmd, typed, cwd, kinds))
                ):
                    continue
                carry.add(cmd)
            proposals[cmd] = float(p)
        if cwd and self.weights.same_cwd:
            for cmd in store.in_cwd(cwd, prefix=typed, limit=20):
                if cmd in proposals:
                    proposals[cmd] *= 1 + self.weights.same_cwd
        boost, half_life = self.weights.recent_boost, self.weights.recent_half_life_h * 3600
        if boost and index.newest_ts:
            for cmd in proposals:
                ts = index.last_ts.get(cmd)
                if ts is not None:
                    proposals[cmd] *= 1 + boost * 0.5 ** (max(0.0, index.newest_ts - ts) / half_life)
        total = sum(proposals.values())
        if total > 0:
            proposals = {cmd: p / total for cmd, p in proposals.items()}
        failing = {cmd for cmd in proposals if index.failing(cmd) or (missing is not None and missing(cmd))}
        for cmd in failing:
            del proposals[cmd]
        return HistorySide(proposals, carry, failing, dict(zip(pool, pool_rows, strict=True)), context)
