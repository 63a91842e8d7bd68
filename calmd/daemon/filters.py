"""What is never suggested: junk lines and lines the model made up where it should not have.

Three checks, cheap enough to run on every candidate of every keystroke (microseconds each):

- `balanced`: quotes and brackets close. A line with an open quote or bracket (`git commit -m
  "fix main`, `awk '{print $1}`) is half a command: Enter would leave the shell waiting for more.
- `Vocabulary`: which subcommands and flags follow a command. A candidate that only the model
  proposes is dropped when it puts after a known command a subcommand or flag that neither the
  packaged corpus vocabulary nor the user's own history ever put there (`git stash status`,
  `systemctl restics`, `ls --colour-me`), or a bare `.` right after a flag or subcommand that
  never took one (`tar -xzf .`). Commands the corpus does not know are never judged: there is
  nothing to judge them by.
- `cwd_argument`: the model copies the cwd from its context into an argument
  (`kubectl ~/src/api-server` while in ~/src/api-server): a model-only candidate that does so is
  dropped (naming the folder one is in is never needed: `.` says it).

The corpus vocabulary (calmd/data/vocabulary.json) is built from the same sources as the default
model's corpus (tldr pages, the training users' histories; never the held-out users) by

    python -m calmd.daemon.filters [--data ../shared/data] [--output calmd/data/vocabulary.json]

A token is "known" after a command when a tldr page shows it there or at least two training users
typed it there; a command is "subcommand-taking" when at least 90% of the plain words that
follow it in the corpus are known ones (git, docker, systemctl: yes; cd, vim, ssh: no, their
next word is a file or a host, anything goes).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.atomic import atomic_write
from calmd.errors import FormatError

VOCABULARY_VERSION = 1
MIN_USES = 20  # a command (or command + subcommand) judged needs this many uses in the corpus
MIN_SOURCES = 2  # users (tldr counts as one) that must have typed a token for it to be known
SUBCOMMAND_COVER = 0.9  # share of the next plain words that must be known to judge subcommands
TYPO_EDITS = 2  # a long token this many edits from a far more common one is a slip, not a word
TYPO_RATIO = 10  # ... far more common: used this many times as often
PREFIX_COMMANDS = frozenset({"sudo", "doas", "time", "nohup", "command", "exec", "nice", "builtin"})
SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "|&"})
_PLAIN_WORD = re.compile(r"[a-z][a-z0-9_-]*\Z")  # a subcommand-like word (not a path, host, file)
_FLAG = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*\Z")  # `-x`, `-xzf`, `--long` (value cut off)
_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}


# --------------------------------------------------------------------------- quotes and brackets


def balanced(cmd: str) -> bool:
    """Whether every quote and bracket in `cmd` is closed, as a shell reads them: nothing is
    special inside single quotes, a backslash escapes the next character outside them, and inside
    double quotes only `$(`, `${`, backquotes and the closing quote count."""
    stack: list[str] = []  # closers still due, innermost last; quotes push their own character
    i, n = 0, len(cmd)
    while i < n:
        c = cmd[i]
        top = stack[-1] if stack else ""
        if top == "'":
            if c == "'":
                stack.pop()
        elif c == "\\":
            i += 1  # the next character is literal (a trailing backslash escapes the newline)
        elif top == '"':
            if c == '"':
                stack.pop()
            elif c == "`":
                stack.append("`")
            elif c == "$" and i + 1 < n and cmd[i + 1] in "({":
                stack.append(_OPEN[cmd[i + 1]])
                i += 1
        elif c in "'\"`":
            if c == "`" and top == "`":
                stack.pop()
            else:
                stack.append(c)
        elif c in _OPEN:
            stack.append(_OPEN[c])
        elif c in _CLOSE:
            if top != c:
                return False
            stack.pop()
        elif c == "#" and (i == 0 or cmd[i - 1] in " \t;|&("):
            break  # a comment: the rest of the line is not shell syntax
        i += 1
    return not stack


# --------------------------------------------------------------------------- vocabulary


def split_words(cmd: str) -> list[str]:
    return cmd.split()


def segments(words: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(offset, words) of each simple command of a line (split at pipes and `&&`, `;`), with
    leading prefix commands and VAR=value assignments skipped: `sudo -E make` is judged as make."""
    start = 0
    for i in range(len(words) + 1):
        if i == len(words) or words[i] in SEPARATORS:
            j = start
            while j < i and (words[j] in PREFIX_COMMANDS or _assignment(words[j]) or _prefix_flag(words, j)):
                j += 1
            if j < i:
                yield j, words[j:i]
            start = i + 1


def _assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and name.isidentifier()


def _prefix_flag(words: list[str], j: int) -> bool:
    """A flag of a prefix command (`sudo -E`, `nice -n 10`): skipped with it."""
    return j > 0 and words[j].startswith("-") and words[j - 1] in PREFIX_COMMANDS


def flag_name(word: str) -> str | None:
    """`--color=auto` -> `--color`; `-xzf` -> `-xzf`; not a flag -> None."""
    name = word.split("=", 1)[0]
    return name if _FLAG.match(name) else None


def entries(words: list[str]) -> Iterator[tuple[str, str, int]]:
    """(key, token, position) of what a vocabulary records about one simple command `words`:
    `` (empty) -> the command; `cmd` -> its plain second word; `cmd sub` -> its plain third
    word when the second was plain; `cmd -` and `cmd sub -` -> each flag; `cmd .` -> the
    structural token a bare `.` came right after (empty for the command itself, a flag or its
    subcommand); position: the token's index in `words`."""
    if not words:
        return
    head = words[0]
    if "/" in head or "=" in head:
        return
    yield "", head, 0  # the command itself: how often it was seen decides whether it is judged
    sub = len(words) > 1 and _PLAIN_WORD.match(words[1])
    if sub:
        yield head, words[1], 1
        if len(words) > 2 and _PLAIN_WORD.match(words[2]):
            yield f"{head} {words[1]}", words[2], 2
    for pos in range(1, len(words)):
        word = words[pos]
        flag = flag_name(word)
        if flag is not None:
            yield f"{head} -", flag, pos
            if sub:  # `git status -s`: flags of the subcommand too, judged where it is common
                yield f"{head} {words[1]} -", flag, pos
        elif word in (".", "./"):
            before = words[pos - 1]
            if pos == 1:
                yield f"{head} .", "", pos
            elif flag_name(before) is not None or (pos == 2 and _PLAIN_WORD.match(before)):
                yield f"{head} .", flag_name(before) or before, pos


@dataclass
class Vocabulary:
    """Known tokens by key (see `entries`) and which keys are judged at all."""

    known: dict[str, frozenset[str]] = field(default_factory=dict)
    judged: frozenset[str] = frozenset()  # keys whose unknown tokens count as invented
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "calm-vocabulary",
            "version": VOCABULARY_VERSION,
            "judged": sorted(self.judged),
            "known": {k: sorted(v) for k, v in sorted(self.known.items())},
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "vocabulary") -> Vocabulary:
        if not isinstance(data, dict) or data.get("format") != "calm-vocabulary":
            raise FormatError(f"{source}: not a calm-vocabulary file")
        if data.get("version") != VOCABULARY_VERSION:
            raise FormatError(
                f"{source}: version {data.get('version')!r}, this calmd reads {VOCABULARY_VERSION}"
            )
        known, judged = data.get("known"), data.get("judged")
        if not isinstance(known, dict) or not isinstance(judged, list):
            raise FormatError(f"{source}: 'known' must be a map and 'judged' a list")
        try:
            parsed = {str(k): frozenset(str(t) for t in v) for k, v in known.items() if isinstance(v, list)}
        except TypeError as exc:
            raise FormatError(f"{source}: {exc}") from exc
        return cls(parsed, frozenset(str(k) for k in judged), dict(data.get("info") or {}))

    @classmethod
    def load(cls, path: Path) -> Vocabulary:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{path}: cannot read the vocabulary: {exc}") from exc
        return cls.from_json(data, str(path))


class UserVocabulary:
    """The same entries, from the user's own history (grows with the history index)."""

    def __init__(self) -> None:
        self.known: defaultdict[str, set[str]] = defaultdict(set)

    def add(self, cmd: str) -> None:
        words = split_words(cmd)
        for _, segment in segments(words):
            for key, token, _ in entries(segment):
                if key:
                    self.known[key].add(token)

    def has(self, key: str, token: str) -> bool:
        found = self.known.get(key)
        return found is not None and token in found


def _flag_known(vocab: Vocabulary, user: UserVocabulary | None, key: str, flag: str) -> bool:
    known = vocab.known.get(key, frozenset())
    if flag in known or (user is not None and user.has(key, flag)):
        return True
    if flag.startswith("--") or len(flag) <= 2:
        return False
    # a bundle of short flags (`-xzvf`): known when each letter is a known short flag
    return all(f"-{c}" in known or (user is not None and user.has(key, f"-{c}")) for c in flag[1:])


def invented(cmd: str, typed: str, vocab: Vocabulary, user: UserVocabulary | None = None) -> str | None:
    """Why `cmd` (a model-only candidate for the input `typed`) looks made up, or None. Only
    tokens the user did not type in full are judged: what the user typed is theirs."""
    words = split_words(cmd)
    mine = _typed_in_full(words, typed)
    for offset, segment in segments(words):
        head = segment[0]
        sub_flags = f"{head} {segment[1]} -" if len(segment) > 1 else ""
        for key, token, pos in entries(segment):
            if offset + pos < mine or not key:
                continue
            if key.endswith(" -"):
                # the subcommand's own flags where the corpus has enough of them, else the command's
                if key == f"{head} -" and sub_flags not in vocab.judged:
                    if key in vocab.judged and not _flag_known(vocab, user, key, token):
                        return f"flag {token} never seen after {head}"
                elif key == sub_flags and key in vocab.judged and not _flag_known(vocab, user, key, token):
                    return f"flag {token} never seen after {key[:-2]}"
                continue
            unknown = key in vocab.judged and token not in vocab.known.get(key, frozenset())
            if unknown and (user is None or not user.has(key, token)):
                if key.endswith(" ."):
                    return f"'.' never seen after {head} {token}".rstrip()
                return f"{token!r} never seen after {key}"
    return None


def _typed_in_full(words: list[str], typed: str) -> int:
    """How many of the candidate's first words the user typed out (a word typed in part, `st`
    of `status`, is the model's choice)."""
    mine = 0
    for have, want in zip(split_words(typed), words, strict=False):
        if have != want:
            break
        mine += 1
    return mine


def cwd_forms(cwd: str, home: str | None = None) -> set[str]:
    """The spellings of the cwd the model copies from its context: the path, with a trailing
    slash, and with the home folder as `~`."""
    if not cwd or cwd == "/":
        return set()
    path = cwd.rstrip("/")
    forms = {path, path + "/"}
    home = home.rstrip("/") if home else None
    if home and (path == home or path.startswith(home + "/")):
        short = "~" + path[len(home) :]
        forms |= {short, short + "/"}
    return forms


def cwd_argument(cmd: str, typed: str, cwd: str, home: str | None) -> bool:
    """Whether `cmd` puts the cwd itself in an argument the user did not type."""
    forms = cwd_forms(cwd, home)
    if not forms:
        return False
    words = split_words(cmd)
    return any(words[pos] in forms for pos in range(max(1, _typed_in_full(words, typed)), len(words)))


# --------------------------------------------------------------------------- building


def build(sources: Iterable[tuple[str, Iterable[str]]]) -> Vocabulary:
    """The vocabulary from (source name, commands) pairs; the source "tldr" vouches alone."""
    token_uses: defaultdict[str, Counter[str]] = defaultdict(Counter)
    token_sources: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    for source, commands in sources:
        for cmd in commands:
            for _, segment in segments(split_words(cmd)):
                for key, token, _ in entries(segment):
                    token_uses[key][token] += 1
                    token_sources[(key, token)].add(source)

    def vouched(key: str, token: str) -> bool:
        who = token_sources[(key, token)]
        return "tldr" in who or len(who) >= MIN_SOURCES

    known: dict[str, frozenset[str]] = {}
    judged: set[str] = set()
    heads = token_uses.pop("", Counter())
    for head, count in heads.items():  # every common command is judged on dots and flags
        if count >= MIN_USES:
            token_uses[f"{head} ."].update()
            token_uses[f"{head} -"].update()
    for key, tokens_seen in token_uses.items():
        count = sum(tokens_seen.values())
        if key.endswith((" .", " -")) and " " not in key[:-2]:  # wherever the command is common
            count = max(count, heads[key[:-2]])
        if count < MIN_USES:
            continue
        slips: set[str] = set()
        if not key.endswith((" -", " .")):  # flags differ by one letter by design (-l, -t)
            slips = typos(tokens_seen, {t for t in tokens_seen if "tldr" in token_sources[(key, t)]})
        tokens = frozenset(t for t in tokens_seen if vouched(key, t) and t not in slips)
        covered = sum(n for t, n in tokens_seen.items() if t in tokens) / max(1, sum(tokens_seen.values()))
        # flags and dots: judged wherever the command is common; subcommands: where they cover
        if key.endswith((" -", " .")) or (tokens and covered >= SUBCOMMAND_COVER):
            judged.add(key)
            if tokens:
                known[key] = tokens
    return Vocabulary(known, frozenset(judged))


def typos(uses: Counter[str], trusted: set[str]) -> set[str]:
    """Tokens that look like slips of a much more common one (`statu`, `barnch`, `cehckout` for
    git's `status`, `branch`, `checkout`): two users making the same slip is common enough, so
    a token within one edit (two from 7 characters on) of a token used TYPO_RATIO times as often
    is not vouched for. Short tokens (`am`, `co`, `rm`) and tldr's are never slips."""
    common = sorted(uses, key=uses.__getitem__, reverse=True)
    slips: set[str] = set()
    for token, n in uses.items():
        if token in trusted or len(token) <= 4:
            continue
        limit = 1 if len(token) <= 6 else TYPO_EDITS
        for other in common:
            if uses[other] < TYPO_RATIO * n:
                break
            if abs(len(other) - len(token)) <= limit and edits(token, other, limit) <= limit:
                slips.add(token)
                break
    return slips


def edits(a: str, b: str, limit: int) -> int:
    """Optimal string alignment distance (insertions, deletions, substitutions, adjacent swaps),
    or limit + 1 as soon as it must exceed `limit`."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        if min(row) > limit:
            return limit + 1
        prev2, prev = prev, row
    return prev[-1]


_PACKAGED: Vocabulary | None = None


def packaged_vocabulary_path() -> Path:
    return paths.PACKAGE_DATA / "vocabulary.json"


def packaged_vocabulary() -> Vocabulary:
    global _PACKAGED
    if _PACKAGED is None:
        _PACKAGED = Vocabulary.load(packaged_vocabulary_path())
    return _PACKAGED


def main(argv: list[str] | None = None) -> int:
    import random
    import sys

    from calmd.training.corpus import fill_placeholders, iter_tldr_pages
    from calmd.training.recipe import DEFAULT_DATA, held_out, history_users, read_history

    parser = argparse.ArgumentParser(
        prog="python -m calmd.daemon.filters", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--output", type=Path, default=packaged_vocabulary_path())
    args = parser.parse_args(argv)
    started = time.monotonic()
    rng = random.Random(0)
    tldr = [
        fill_placeholders(ex.command, rng) for ex in iter_tldr_pages(args.data / "tldr") for _ in range(2)
    ]
    users = [p for p in history_users(args.data) if not held_out(p.stem)]
    if not users:
        parser.error(f"no histories under {args.data / 'histories' / 'users'}")
    sources: list[tuple[str, Iterable[str]]] = [("tldr", tldr)]
    sources += [(p.stem, read_history(p)) for p in users]
    vocab = build(sources)
    vocab.info = {
        "command": " ".join(["python -m calmd.daemon.filters", *(sys.argv[1:] if argv is None else argv)]),
        "tldr_examples": len(tldr),
        "training_users": len(users),
        "keys": len(vocab.known),
        "tokens": sum(len(v) for v in vocab.known.values()),
    }
    with atomic_write(args.output, mode=0o644) as out:
        out.write((json.dumps(vocab.to_json(), separators=(",", ":")) + "\n").encode())
    print(f"{len(vocab.judged)} keys judged, {vocab.info['tokens']} known tokens, from {len(tldr)} tldr "
          f"examples and {len(users)} users in {time.monotonic() - started:.1f} s")  # fmt: skip
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
