"""Carry-overs: the next command that reuses the previous one's last words after another head.

`mkdir foo` -> `cd foo`, `pacman -Ss vim` -> `sudo pacman -S vim`, `python3 -m venv .venv` ->
`source .venv/bin/activate`: lines the user may never have run, made from a head they (or, through
`CarryPrior`, the training users) ran after the previous command's head. The history index
(calmd/suggest/ranking.py `HistoryIndex`) counts the user's own habits and pools the lines these
make; the ranker's features say how often each habit held.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from calmd.errors import FormatError

CARRY_MAX = 10  # carry-over candidates added to the pool (most frequent heads first)
CARRY_WORDS = 12  # first words whose heads are tried, likeliest after the previous command's first
CARRY_PRIOR_HEADS = 5  # heads other users most often carried the previous command's head's words to
CARRY_HEADS_PER_WORD = 20  # of each first word, its most frequent heads are tried
CARRY_HEAD_WORDS = 4  # heads (a command's first words) of at most this many words are indexed


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
