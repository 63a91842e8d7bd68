"""The learned history ranker: which past command comes next, given what was just run and typed.

The daemon's history predictor (P_hist in calmd/suggest/engine.py) ranks the user's past commands that
extend the typed input. Hand-weighted signals (frequency x recency x "followed the previous
command") were measured against a learned ranker in `calm replay` and lost by 4-6 points of
top-1 (docs/quality.md), so the history side is learned:

    pool      the 40 most recent distinct commands that extend the input, plus the 40 commands
              that most often followed the previous command and extend it, plus up to 10
              carry-overs (the previous command's last words after another command's head)
    features  FEATURES below, one row per pooled command (counts, distances, transitions from
              the previous one or two commands, how long a run of recent commands matched an
              earlier run that this command continued, ...)
    score     a one-hidden-layer network, s = w2 . tanh(W1 (x - mu) / sd + b1) + b2
    P_hist    softmax(s) over the pool (a conditional logit, trained by maximum likelihood of
              the command the user actually ran)

The weights (calmd/data/ranker.json, a few kB) are fitted by

    python -m calmd.quality.fit_ranker [--data ../shared/data] [--output calmd/data/ranker.json]

on the public histories of the *training* users only (`calmd.training.corpus.held_out()` keeps the same
users out as for the default model, so `calm replay --held-out` measures users neither has
seen). Inference is numpy only: the daemon never needs torch for ranking.

`HistoryIndex` is the in-memory view the features are computed from. It follows the SQLite
store incrementally (`sync`: rows with a larger id than the last seen), so commands recorded by
any shell or imported by `calm import` are seen on the next keystroke.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.atomic import parse_json, read_json, read_regular_file
from calmd.errors import FormatError, one_line
from calmd.history.store import HistoryStore
from calmd.suggest.filters import UserVocabulary, terminal_safe
from calmd.suggest.kinds import UserArguments

log = logging.getLogger("calmd")

RANKER_VERSION = 1
# What a fitted scorer's weights may be (check_sense): the packaged ones lie from 5e-12 to 6.
WEIGHT_FLOOR, WEIGHT_LIMIT = 1e-30, 1e4  # below the floor, only 0 (and no subnormal number)
SCALE_FLOOR = 1e-4  # a feature's standard deviation: the packaged ones are 0.001 or more
MAX_RANKER_BYTES = 4 << 20  # the user's ranker file is read whole: 26 kB written, anything larger is not ours
POOL_RECENT = 40  # the most recent distinct commands extending the input that enter the pool
CONTEXT_MATCH = 4  # longest run of recent commands compared with earlier runs
CONTEXT_LOOKBACK = 200  # earlier occurrences of the previous command examined for a run match
POOL_FOLLOWERS = 40  # of the previous command's followers, the most frequent that enter the pool
CARRY_MAX = 10  # carry-over candidates added to the pool (most frequent heads first)
CARRY_WORDS = 12  # first words whose heads are tried, likeliest after the previous command's first
CARRY_PRIOR_HEADS = 5  # heads other users most often carried the previous command's head's words to
CARRY_HEADS_PER_WORD = 20  # of each first word, its most frequent heads are tried
CARRY_HEAD_WORDS = 4  # heads (a command's first words) of at most this many words are indexed
NOT_FOUND = 127  # the shells' exit status for a command that does not exist
INDEX_LIMIT = 50_000  # the newest commands the index holds (about 28 MB; older ones stay in the store)
FEATURES = (
    "log_count",  # log(1 + times run)
    "log_distance",  # log(1 + commands run since its last use)
    "is_last",  # it is the command just run
    "log_follows_prev",  # log(1 + times it followed the previous command)
    "p_follows_prev",  # share of the previous command's followers that were this one
    "followed_prev_last_time",  # it is what followed the previous command the last time
    "log_follows_prev2",  # log(1 + times it followed the previous two commands)
    "log_count_recent20",  # log(1 + times among the last 20 commands)
    "log_recency_rank",  # log(1 + rank in the pool by last use)
    "log_frequency_rank",  # log(1 + rank in the pool by count)
    "log_remaining",  # log(1 + characters left to type)
    "same_first_word_as_prev",
    "p_follows_prev_word",  # share of followers of the previous command's first word
    "log_share",  # log(1 + count) - log(1 + history length)
    "empty_input",
    "empty_input_x_log_follows_prev",
    "distance_is_1",
    "distance_is_2",
    "distance_is_3",
    "log_follows_prev2_skip",  # log(1 + times it came two commands after the one before last)
    "context_match",  # longest matched run of recent commands it continued, / CONTEXT_MATCH
    "context_match_ge2",
    "is_carryover",  # not a past command: a past command's head with the previous command's tail
    "carry_log_head_count",  # log(1 + times that head was run), carry-overs only
    "carry_tail_tokens",  # how many of the previous command's last words it ends with
    "log_carry_pattern",  # log(1 + times this head followed the previous one's, carrying its tail)
    "log_word_transition",  # log(1 + times a command of its first word followed the previous one's)
    "reuses_prev_argument",  # it holds one of the previous command's arguments (`mkdir x` -> `cd x`,
    # `python3 -m venv .venv` -> `source .venv/bin/activate`)
    "corpus_carry_share",  # how often, in other users' histories, the previous command's head was
    # followed by this one's head with its last words carried over (`mkdir` -> `cd`: 0.32)
)


def first_word(cmd: str) -> str:
    return cmd.split(" ", 1)[0]


# git subcommands that need no repository: a line with one of them is no git line "outside a
# repository" (calmd/suggest/engine.py `_elsewhere`)
GIT_ANYWHERE = frozenset(
    {"clone", "init", "config", "help", "version", "--version", "--help", "-h", "ls-remote"}
)


def outside_git(cmd: str) -> bool:
    """A git line that works outside a repository (`git clone ...`, `git config --global ...`)."""
    words = cmd.split()
    return len(words) > 1 and words[0] == "git" and words[1] in GIT_ANYWHERE


def names_branch(cmd: str, branch: str) -> bool:
    """Whether `cmd` names `branch` as a word of its own, or as `remote/branch`, `HEAD:branch`."""
    if not branch:
        return False
    return any(w == branch or w.endswith(("/" + branch, ":" + branch)) for w in cmd.split()[1:])


def carry_splits(words: Sequence[str]) -> Iterator[tuple[str, str, int]]:
    """(head, tail, words in the tail) for each way of cutting a command's words after its first
    1..CARRY_HEAD_WORDS words, longest tail first: what a next command could carry over."""
    for split in range(1, min(len(words), CARRY_HEAD_WORDS + 1)):
        yield " ".join(words[:split]), " ".join(words[split:]), len(words) - split


def prev_arguments(prev: str) -> list[str]:
    """The previous command's arguments worth recognising in the next one: not its command name,
    not flags, at least two characters, without a trailing slash."""
    return [w.rstrip("/") for w in prev.split()[1:] if len(w.rstrip("/")) >= 2 and not w.startswith("-")]


def reuses(cmd: str, arguments: Sequence[str]) -> bool:
    """Whether `cmd`'s arguments hold one of `arguments` (as a word or a path component)."""
    _, _, rest = cmd.partition(" ")
    return any(arg in rest for arg in arguments)


def split_carry(prev: str, cmd: str) -> tuple[str, str, int] | None:
    """(head of prev, head of cmd, words carried) when cmd ends with the longest run of prev's
    last words that leaves both a head, e.g. ("mkdir", "cd", 1) for "mkdir foo" -> "cd foo";
    None when it carries nothing over or is prev itself. The carried words may also go on as a
    path: the head is then a template, ("python3 -m venv", "source {}/bin/activate", 1) for
    "python3 -m venv .venv" -> "source .venv/bin/activate" (`carry_line` fills it)."""
    if cmd == prev:
        return None
    for own_head, tail, carried in carry_splits(prev.split()):
        if cmd.endswith(" " + tail) and len(cmd) > len(tail) + 1:
            head = cmd[: -len(tail) - 1].rstrip()
            if head:
                return own_head, head, carried
        at = cmd.find(" " + tail.rstrip("/") + "/")
        if at > 0 and "{" not in cmd:
            rest = cmd[at + 1 + len(tail.rstrip("/")) :]
            if " " not in rest and len(rest) > 1:
                return own_head, f"{cmd[:at]} {{}}{rest}", carried
    return None


def carry_line(head: str, tail: str) -> str:
    """The line a carry-over head makes with the carried words: `cd` + `foo` -> `cd foo`, and a
    template `source {}/bin/activate` + `.venv` -> `source .venv/bin/activate`."""
    if "{}" in head:
        return head.replace("{}", tail.rstrip("/"), 1)
    return f"{head} {tail}"


@dataclass(frozen=True)
class CarryPrior:
    """Carry-over habits of many users (the training users' histories): how often a command
    with head h was followed by a command with head h2 that carried its last words over."""

    carries: dict[str, Counter[str]]  # h -> h2 -> times
    follows: Counter[str]  # h -> times a command with head h was followed by anything

    def share(self, head: str, next_head: str) -> float:
        total = self.follows.get(head, 0)
        return self.carries[head][next_head] / total if total and head in self.carries else 0.0

    def heads_after(self, head: str, limit: int = CARRY_PRIOR_HEADS) -> list[tuple[str, int]]:
        found = self.carries.get(head)
        return found.most_common(limit) if found else []

    @staticmethod
    def count(commands: Sequence[str]) -> CarryPrior:
        """The habits of one history (one session, in order)."""
        carries: defaultdict[str, Counter[str]] = defaultdict(Counter)
        follows: Counter[str] = Counter()
        for prev, cmd in itertools.pairwise(commands):
            for head, _, _ in carry_splits(prev.split()):
                follows[head] += 1
            carry = split_carry(prev, cmd)
            if carry is not None:
                carries[carry[0]][carry[1]] += 1
        return CarryPrior(dict(carries), follows)

    @staticmethod
    def total(priors: Sequence[tuple[str, CarryPrior]], min_users: int = 2, min_count: int = 3) -> CarryPrior:
        """Every user's habits summed, keeping those of at least `min_users` users and
        `min_count` times (a habit of one person is theirs, not a prior)."""
        carries: defaultdict[str, Counter[str]] = defaultdict(Counter)
        users: Counter[tuple[str, str]] = Counter()
        follows: Counter[str] = Counter()
        for _, prior in priors:
            follows.update(prior.follows)
            for h, c in prior.carries.items():
                carries[h].update(c)
                users.update((h, h2) for h2 in c)
        kept = {h: Counter({h2: n for h2, n in c.items() if n >= min_count and users[(h, h2)] >= min_users})
                for h, c in carries.items()}  # fmt: skip
        kept = {h: c for h, c in kept.items() if c}
        return CarryPrior(kept, Counter({h: follows[h] for h in kept}))

    def to_json(self) -> dict[str, Any]:
        return {"carries": {h: dict(c) for h, c in sorted(self.carries.items())},
                "follows": dict(sorted(self.follows.items()))}  # fmt: skip

    @staticmethod
    def from_json(data: Any, source: str) -> CarryPrior:
        try:
            carries = {
                str(h): Counter({str(h2): int(n) for h2, n in c.items()}) for h, c in data["carries"].items()
            }
            follows = Counter({str(h): int(n) for h, n in data["follows"].items()})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"{source}: bad field 'carry_prior': {exc}") from exc
        return CarryPrior(carries, follows)


NO_PRIOR = CarryPrior({}, Counter())


class HistoryIndex:
    """Counts, last uses and transitions of the history, in memory, in recording order.

    Transitions are per session (what a shell ran after what the same shell ran before);
    distances and counts are over the whole history."""

    def __init__(self, prior: CarryPrior = NO_PRIOR) -> None:
        self.prior = prior  # other users' carry-over habits (the ranker's, calmd/data/ranker.json)
        self.commands: list[str] = []
        self.session_next: list[int] = []  # index of the same session's next command, or -1
        self.session_prev: list[int] = []  # index of the same session's previous command, or -1
        self.count: Counter[str] = Counter()
        # this machine's commands, kept in order of last use (reversed() is most recent first), each
        # with its number among this machine's commands: recency is this machine's (a history
        # synced from other machines, calmd/history/sync.py, adds their commands as older ones)
        self.last: dict[str, int] = {}
        self.local_n = 0  # this machine's commands seen
        self.recent: deque[str] = deque(maxlen=20)  # ... the latest 20 of them
        self.remote_last: dict[str, int] = {}  # commands only other machines ran, in order of last use
        self.follows: defaultdict[str, Counter[str]] = defaultdict(Counter)  # prev -> cmd -> n
        self.follows_last: dict[str, str] = {}  # prev -> what followed it the last time
        self.follows2: defaultdict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self.skip: defaultdict[str, Counter[str]] = defaultdict(Counter)  # cmd two back -> cmd
        self.follows_word: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.positions: defaultdict[str, list[int]] = defaultdict(list)
        # a command's heads (its first 1..CARRY_HEAD_WORDS words, when more words follow), by
        # first word: first word -> head -> times run
        self.heads_by_word: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.word_count: Counter[str] = Counter()  # commands per first word
        self._top_heads: dict[str, list[tuple[str, int]]] = {}  # first word -> most frequent heads
        # the user's carry-over habits: head of a command -> heads of the next command that
        # reused its last words ("mkdir" -> {"cd": 3})
        self.carry_patterns: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.word_transitions: defaultdict[str, Counter[str]] = defaultdict(Counter)  # word -> word
        self._session_tail: dict[str, int] = {}
        self.last_id = 0  # the store's row id of the newest command seen
        # exit codes: runs that failed (a known non-zero status) and runs that did not (0, or
        # unknown: imported history files carry none); a command with failures and no other run
        # never succeeded (a typo that exited 127, `(exit 3)`) and is demoted (calmd/suggest/engine.py)
        self.failed: Counter[str] = Counter()
        self.not_found: set[str] = set()  # commands whose latest run exited 127
        self.missing_names: set[str] = set()  # first words "not found" that never worked (`gti`)
        self.working_names: set[str] = set()  # first words of commands that succeeded
        self.last_ts: dict[str, float] = {}  # when each command was run last (seconds since the epoch)
        self.newest_ts = 0.0
        self.vocabulary = UserVocabulary()  # subcommands and flags of the commands that succeeded
        self.arguments = UserArguments()  # hosts, modules, variables they named (calmd/suggest/kinds.py)
        self.succeeded: set[str] = set()  # commands with a run that did not fail (exit 0 or unknown)
        # the branch a command names and ran on (`git push origin feature/login` on feature/login):
        # on another branch it is not drawn (calmd/suggest/engine.py `_elsewhere`)
        self.bound_branch: dict[str, str] = {}
        self.in_repo: set[str] = set()  # commands run inside a git repository (the shell said a branch)
        self.out_of_repo: set[str] = set()  # ... and outside one (the shell said a cwd and no branch)

    def __len__(self) -> int:
        return len(self.commands)

    def add(
        self, cmd: str, session: str = "", exit: int | None = None, ts: float | None = None,
        cwd: str = "", git: str = "", *, remote: bool = False,
    ) -> None:  # fmt: skip
        """One command, in recording order. `remote`: recorded on another machine (synced): it
        counts (runs, transitions in its own sessions, words) but leaves this machine's recency
        as it was: the current machine's own ranking features come first."""
        index = len(self.commands)
        prev_index = self._session_tail.get(session, -1)
        plain = terminal_safe(cmd)  # no carry-over heads from a multi-line entry (its words span lines)
        self.commands.append(cmd)
        self.session_prev.append(prev_index)
        self.session_next.append(-1)
        if prev_index >= 0:
            prev = self.commands[prev_index]
            self.session_next[prev_index] = index
            self.follows[prev][cmd] += 1
            self.follows_last[prev] = cmd
            self.follows_word[first_word(prev)][cmd] += 1
            self.word_transitions[first_word(prev)][first_word(cmd)] += 1
            carry = split_carry(prev, cmd) if plain and terminal_safe(prev) else None
            if carry is not None:
                self.carry_patterns[carry[0]][carry[1]] += 1
            prev2_index = self.session_prev[prev_index]
            if prev2_index >= 0:
                prev2 = self.commands[prev2_index]
                self.follows2[(prev2, prev)][cmd] += 1
                self.skip[prev2][cmd] += 1
        self._session_tail[session] = index
        self.count[cmd] += 1
        if remote:
            if cmd not in self.last:
                self.remote_last.pop(cmd, None)
                self.remote_last[cmd] = index
        else:
            self.last.pop(cmd, None)
            self.last[cmd] = self.local_n
            self.local_n += 1
            self.recent.append(cmd)
            self.remote_last.pop(cmd, None)
        self.positions[cmd].append(index)
        name = first_word(cmd)
        if exit is not None and exit != 0:
            self.failed[cmd] += 1
        if exit == NOT_FOUND:
            self.not_found.add(cmd)
            if name not in self.working_names:  # `bash x.sh` exiting 127 does not make bash missing
                self.missing_names.add(name)
        else:
            self.not_found.discard(cmd)
            if exit == 0 or exit is None:
                self.working_names.add(name)
                self.missing_names.discard(name)
        if ts is not None:
            self.last_ts[cmd] = ts
            self.newest_ts = max(self.newest_ts, ts)
        if git:
            self.in_repo.add(cmd)
            if names_branch(cmd, git):
                self.bound_branch[cmd] = git
            else:
                self.bound_branch.pop(cmd, None)
        elif cwd.startswith("/"):
            self.out_of_repo.add(cmd)
            self.bound_branch.pop(cmd, None)
        if exit is not None and exit != 0:
            return  # what a failed run typed (`git comit`) is no word of the user's, nor a head to carry over
        if cmd not in self.succeeded:
            self.succeeded.add(cmd)
            self.vocabulary.add(cmd)
            self.arguments.add(cmd)
        words = cmd.split() if plain else []
        if words:
            self.word_count[words[0]] += 1
            self._top_heads.pop(words[0], None)
        for j in range(1, min(len(words), CARRY_HEAD_WORDS + 1)):
            self.heads_by_word[words[0]][" ".join(words[:j])] += 1

    def failing(self, cmd: str) -> bool:
        """`cmd` never succeeded (every run failed: none exited 0 or had an unknown status), or
        its latest run, or its command name's, was "command not found"."""
        failed = self.failed.get(cmd, 0)
        return (failed > 0 and failed >= self.count[cmd]) or cmd in self.not_found or self.missing(cmd)

    def repo_only(self, cmd: str) -> bool:
        """`cmd` ran inside git repositories only (as far as the shells told)."""
        return cmd in self.in_repo and cmd not in self.out_of_repo

    def missing(self, cmd: str) -> bool:
        """`cmd` starts with a command name that was "not found" and never worked (`gti log`
        after `gti status` exited 127), whatever the rest of the line."""
        return bool(self.missing_names) and first_word(cmd) in self.missing_names

    def head_count(self, head: str) -> int:
        """Times a command starting with the words of `head` (and more) was run."""
        heads = self.heads_by_word.get(first_word(head))
        return heads[head] if heads is not None else 0

    def sync(self, store: HistoryStore, limit: int = INDEX_LIMIT, budget: int | None = None) -> int:
        """Add the store's commands recorded since the last sync; returns how many. The first
        sync starts at the newest `limit` commands: memory stays bounded for huge histories; so
        does a sync after an import added more than `limit` (it starts again from the newest).
        Rows deleted from the store (a new generation: calm forget, a re-scan) rebuild it. It reads
        up to the newest row there is when it starts: a keystroke during the first-start import
        read on while the import added rows, 1.6 million of them, and waited 27 s (issue 30).
        `budget`: at most that many rows this time (a keystroke's sync, while an import adds
        thousands a second: the index catches up over the next keystrokes)."""
        generation = store.generation()
        if generation != getattr(self, "_generation", generation):
            self.__init__(self.prior)  # type: ignore[misc]  # forget everything, then re-read what remains
        self._generation = generation
        if self.last_id and store.more_after(self.last_id, limit):
            self.__init__(self.prior)  # type: ignore[misc]  # an import added more than it holds
        if self.last_id == 0:
            self.last_id = store.newest_after(limit)
        newest = store.newest_after(0)  # what is there now: an import adding rows meanwhile is not chased
        added = 0
        for row in store.all_rows(after=self.last_id, until=newest, batch=min(budget or 10_000, 10_000)):
            self.add(row.cmd, row.session, row.exit, row.ts, row.cwd, row.git, remote=bool(row.host))
            self.last_id = row.id
            added += 1
            if added == budget:  # a keystroke's share: the next one goes on, in order
                break
        return added

    def pool(self, prefix: str, prev: str | None, size: int = POOL_RECENT, carry: bool = True) -> list[str]:
        """The candidates: recent distinct commands extending `prefix`, then the previous
        command's followers that extend it, then (`carry`) carry-overs of the previous command."""
        found: list[str] = []
        for cmd in itertools.chain(reversed(self.last), reversed(self.remote_last)):  # this machine's first
            if cmd.startswith(prefix) and cmd != prefix:
                found.append(cmd)
                if len(found) >= size:
                    break
        if prev is not None and prev in self.follows:
            have = set(found)
            follows = self.follows[prev]
            followers = [c for c in follows if c not in have and c.startswith(prefix) and c != prefix]
            if len(followers) > POOL_FOLLOWERS:  # `ls` may have been followed by thousands
                followers = heapq.nlargest(POOL_FOLLOWERS, followers, key=follows.__getitem__)
            found.extend(followers)
        if carry and prev is not None:
            found.extend(self.carryovers(prefix, prev, set(found)))
        return found

    def carryovers(
        self, prefix: str, prev: str, have: set[str] | None = None, limit: int = CARRY_MAX
    ) -> list[str]:
        """Lines that reuse the previous command's last words after another command's head
        (`mkdir foo` -> `cd foo`, `pacman -Ss vim` -> `sudo pacman -S vim`): new lines, and past
        lines a template makes that are not in `have` (a `source .venv/bin/activate` run long
        ago, out of the recent pool).
        Heads whose first word most often followed the previous command's come first; only the
        CARRY_WORDS likeliest first words and their CARRY_HEADS_PER_WORD most frequent heads are
        looked at, so a keystroke stays cheap (under a millisecond on a 50,000-command index)."""
        words = prev.split()
        if len(words) < 2 or not terminal_safe(prev):
            return []  # a multi-line entry's words joined by spaces make no command
        transitions = self.word_transitions.get(words[0], Counter())
        typed_word, _, _ = prefix.partition(" ")
        if " " in prefix:  # the first word is typed out
            first_words = [typed_word] if typed_word in self.heads_by_word else []
        else:
            first_words = [w for w in self.heads_by_word if w.startswith(typed_word)]
            first_words.sort(key=lambda w: (transitions[w], self.word_count[w]), reverse=True)
            first_words = first_words[:CARRY_WORDS]
        out: dict[str, tuple[int, float, int, int]] = {}
        for own_head, tail, _ in carry_splits(words):
            habits = self.carry_patterns.get(own_head, Counter())
            heads = list(habits.items())  # the user's own habits first, whatever their first word
            heads += self.prior.heads_after(own_head)  # then other users'
            for word in first_words:
                top = self._top_heads.get(word)
                if top is None:
                    top = self._top_heads[word] = self.heads_by_word[word].most_common(CARRY_HEADS_PER_WORD)
                heads += top
            for head, _ in heads:
                cmd = carry_line(head, tail)
                if head == own_head or not cmd.startswith(prefix) or cmd == prefix:
                    continue
                if head.rsplit(" ", 1)[-1] == tail.split(" ", 1)[0]:
                    continue  # `git status` + `status -s`: a word twice is no command
                # a past line comes back only through a template (one too old for the recent pool)
                taken: set[str] | Counter[str] = have if have is not None and "{}" in head else self.count
                if cmd not in out and cmd not in taken:
                    out[cmd] = (habits[head], self.prior.share(own_head, head), transitions[first_word(head)],
                                self.head_count(head))  # fmt: skip
        return sorted(out, key=out.__getitem__, reverse=True)[:limit]

    def context_match(self, context: Sequence[str]) -> dict[str, int]:
        """For each command that followed an earlier occurrence of the latest context command:
        the longest run of context commands that matched the commands before that occurrence."""
        best: dict[str, int] = {}
        if not context:
            return best
        for i in self.positions.get(context[-1], [])[-CONTEXT_LOOKBACK:]:
            follower = self.session_next[i]
            if follower < 0:
                continue
            matched, j = 1, self.session_prev[i]
            while matched < CONTEXT_MATCH and j >= 0 and matched < len(context):
                if self.commands[j] != context[-1 - matched]:
                    break
                matched += 1
                j = self.session_prev[j]
            cmd = self.commands[follower]
            if matched > best.get(cmd, 0):
                best[cmd] = matched
        return best

    def features(self, prefix: str, candidates: Sequence[str], context: Sequence[str]) -> np.ndarray:
        """One row of FEATURES per candidate   (len(candidates), len(FEATURES)) float32.

        `context`: the session's latest commands, oldest first (the last one is "previous")."""
        n = len(self.commands)
        prev = context[-1] if context else None
        prev2 = context[-2] if len(context) > 1 else None
        empty: Counter[str] = Counter()
        follows = self.follows.get(prev, empty) if prev is not None else empty
        follows_total = sum(follows.values())
        pair = (prev2, prev) if prev is not None and prev2 is not None else None
        follows2 = self.follows2.get(pair, empty) if pair is not None else empty
        skip = self.skip.get(prev2, empty) if prev2 is not None else empty
        word = self.follows_word.get(first_word(prev), empty) if prev is not None else empty
        word_total = sum(word.values())
        recent20 = Counter(self.recent)
        local_n = self.local_n
        last_use = {c: self.last.get(c, -1) for c in candidates}
        by_recency = {c: r for r, c in enumerate(sorted(candidates, key=lambda c: -last_use[c]))}
        by_frequency = sorted(candidates, key=lambda c: (-self.count[c], -last_use[c]))
        by_count = {c: r for r, c in enumerate(by_frequency)}
        followed_last = self.follows_last.get(prev) if prev is not None else None
        matches = self.context_match(context)
        transitions = self.word_transitions.get(first_word(prev), empty) if prev is not None else empty
        k = len(prefix)
        log_n = math.log1p(n)
        arguments = prev_arguments(prev) if prev is not None else []
        rows = np.zeros((len(candidates), len(FEATURES)), dtype=np.float32)
        for j, cmd in enumerate(candidates):
            count = self.count[cmd]
            distance = local_n - 1 - self.last[cmd] if cmd in self.last else local_n
            match = matches.get(cmd, 0)
            carry = split_carry(prev, cmd) if prev is not None else None
            carried, head_count, pattern, prior_share = 0, 0, 0, 0.0
            if carry is not None:
                carried, pattern = carry[2], self.carry_patterns.get(carry[0], empty)[carry[1]]
                head_count = self.head_count(carry[1]) if count == 0 else 0
                prior_share = self.prior.share(carry[0], carry[1])
            rows[j] = (
                math.log1p(count),
                math.log1p(distance),
                distance == 0,
                math.log1p(follows[cmd]),
                follows[cmd] / follows_total if follows_total else 0.0,
                cmd == followed_last,
                math.log1p(follows2[cmd]),
                math.log1p(recent20[cmd]),
                math.log1p(by_recency[cmd]),
                math.log1p(by_count[cmd]),
                math.log1p(max(len(cmd) - k, 0)),
                prev is not None and first_word(cmd) == first_word(prev),
                word[cmd] / word_total if word_total else 0.0,
                math.log1p(count) - log_n,
                k == 0,
                (k == 0) * math.log1p(follows[cmd]),
                distance == 1,
                distance == 2,
                distance == 3,
                math.log1p(skip[cmd]),
                match / CONTEXT_MATCH,
                match >= 2,
                carried > 0 and count == 0,
                math.log1p(head_count),
                carried,
                math.log1p(pattern),
                math.log1p(transitions[first_word(cmd)]),
                bool(arguments) and reuses(cmd, arguments),
                prior_share,
            )
        return rows


@dataclass(frozen=True)
class Ranker:
    """The fitted scorer: standardisation, one tanh hidden layer, a linear output."""

    mean: np.ndarray  # (F,)
    scale: np.ndarray  # (F,)
    w1: np.ndarray  # (F, H)
    b1: np.ndarray  # (H,)
    w2: np.ndarray  # (H,)
    b2: float
    info: dict[str, Any]
    prior: CarryPrior = NO_PRIOR  # the corpus_carry_share feature's table

    def scores(self, rows: np.ndarray) -> np.ndarray:
        """(n, F) features -> (n,) scores; higher is likelier."""
        hidden = np.tanh(((rows - self.mean) / self.scale) @ self.w1 + self.b1)
        return hidden @ self.w2 + self.b2

    def probabilities(self, rows: np.ndarray) -> np.ndarray:
        """softmax of the scores over the pool   (n,)"""
        if len(rows) == 0:
            return np.zeros(0)
        s = self.scores(rows).astype(np.float64)
        e = np.exp(s - s.max())
        return e / e.sum()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "calm-ranker",
            "version": RANKER_VERSION,
            "features": list(FEATURES),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "w1": self.w1.tolist(),
            "b1": self.b1.tolist(),
            "w2": self.w2.tolist(),
            "b2": self.b2,
            "carry_prior": self.prior.to_json(),
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "ranker") -> Ranker:
        def need(key: str) -> Any:
            if not isinstance(data, dict) or key not in data:
                raise FormatError(f"{source}: missing field {key!r}")
            return data[key]

        if need("format") != "calm-ranker":
            raise FormatError(f"{source}: format is {data['format']!r}, expected 'calm-ranker'")
        if need("version") != RANKER_VERSION:
            raise FormatError(f"{source}: version {data['version']!r}, this calmd reads {RANKER_VERSION}")
        if need("features") != list(FEATURES):
            raise FormatError(
                f"{source}: features differ from this calmd's (python -m calmd.quality.fit_ranker refits)"
            )
        arrays, b2 = read_scorer_weights(data, len(FEATURES), source)
        prior = CarryPrior.from_json(need("carry_prior"), source)
        return cls(arrays["mean"], arrays["scale"], arrays["w1"], arrays["b1"], arrays["w2"], b2,
                   dict(data.get("info", {})), prior)  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> Ranker:
        return cls.from_json(read_json(path, "ranker"), str(path))


def read_scorer_weights(
    data: dict[str, Any], features: int, source: str
) -> tuple[dict[str, np.ndarray], float]:
    """The arrays of a fitted scorer file (the history ranker's, the search ranker's):
    standardisation (mean, scale), one tanh hidden layer (w1, b1), a linear output (w2, b2),
    checked for presence, shape, finiteness and a positive scale. FormatError names the field."""
    try:
        arrays = {k: np.asarray(data[k], dtype=np.float64) for k in ("mean", "scale", "w1", "b1", "w2")}
        b2 = float(data["b2"])
    except KeyError as exc:
        raise FormatError(f"{source}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise FormatError(f"{source}: a weight is not a number array: {exc}") from exc
    hidden = arrays["b1"].shape[0] if arrays["b1"].ndim == 1 else -1
    shapes = {"mean": (features,), "scale": (features,), "w1": (features, hidden), "b1": (hidden,),
              "w2": (hidden,)}  # fmt: skip
    for key, shape in shapes.items():
        if arrays[key].shape != shape:
            raise FormatError(f"{source}: field {key!r} has shape {arrays[key].shape}, expected {shape}")
    if not all(np.isfinite(a).all() for a in arrays.values()) or not math.isfinite(b2):
        raise FormatError(f"{source}: weights are not finite")
    if (arrays["scale"] <= 0).any():
        raise FormatError(f"{source}: field 'scale' must be positive")
    check_sense(arrays, b2, source)
    return arrays, b2


def check_sense(arrays: dict[str, np.ndarray], b2: float, source: str) -> None:
    """FormatError naming the field unless a scorer's weights make sense, not only their shape:
    each one 0 or of a magnitude from WEIGHT_FLOOR (no subnormal number: a subnormal `scale`
    divides the features into infinities) to WEIGHT_LIMIT, a `scale` of SCALE_FLOOR or more, no
    layer all zeros, and scores that are finite and tell the probe rows apart. A ranker file with
    a subnormal scale and a zero layer loaded, and every confidence became 0.0: no ghost was ever
    drawn (issue 30)."""
    for key, values in {**arrays, "b2": np.asarray([b2])}.items():
        magnitude = np.abs(values)
        if ((magnitude > 0) & (magnitude < WEIGHT_FLOOR)).any() or (magnitude > WEIGHT_LIMIT).any():
            raise FormatError(f"{source}: field {key!r} holds a weight outside {WEIGHT_FLOOR:g} to "
                              f"{WEIGHT_LIMIT:g} (nor 0): not weights a fit writes")  # fmt: skip
    if (arrays["scale"] < SCALE_FLOOR).any():
        raise FormatError(f"{source}: field 'scale' is below {SCALE_FLOOR:g}: it would blow the features up")
    for key in ("w1", "w2"):
        if not arrays[key].any():
            raise FormatError(f"{source}: field {key!r} is all zeros: every candidate would score the same")
    mean, scale = arrays["mean"], arrays["scale"]
    probes = np.vstack([mean, mean + np.diag(scale), mean - np.diag(scale)])  # each feature at +-1
    with np.errstate(all="ignore"):
        scores = np.tanh(((probes - mean) / scale) @ arrays["w1"] + arrays["b1"]) @ arrays["w2"] + b2
    if not np.isfinite(scores).all() or np.ptp(scores) == 0:
        raise FormatError(f"{source}: its scores are not finite or do not depend on the features")


def packaged_ranker_path() -> Path:
    return paths.PACKAGE_DATA / paths.PACKAGED_RANKER


@functools.cache
def packaged_ranker() -> Ranker:
    """The ranker shipped in the package, read once per process."""
    return Ranker.load(packaged_ranker_path())


def read_user_ranker(path: Path) -> Ranker:
    """A user's ranker file (`ranker.json`, `ranker.prev.json`), read safely: a regular file of at
    most MAX_RANKER_BYTES, then validated. OSError, or FormatError when it is not one (bad or too
    deeply nested JSON, the wrong fields)."""
    return Ranker.from_json(
        parse_json(bytes(read_regular_file(path, limit=MAX_RANKER_BYTES)), path), str(path)
    )


def serving_ranker(path: Path) -> tuple[Ranker, str | None]:
    """The ranker that serves with the weights beside `path`: the user's (`ranker.json`, refitted
    by the background run) when the file exists and loads, else the packaged one. Returns it and,
    when the user's file did not load (corrupt, foreign, of another calmd, not a regular file),
    why, in one line that is also logged: the daemon serves on with the packaged ranker."""
    if not path.exists():
        return packaged_ranker(), None
    try:
        return read_user_ranker(path), None
    except (OSError, ValueError, RecursionError, FormatError) as exc:  # JSON errors are ValueErrors
        why = (f"the ranker {path} did not load ({one_line(exc, named=False)}): the packaged ranker serves "
               "until a run rewrites it")  # fmt: skip
        log.error("%s", why)
        return packaged_ranker(), why
