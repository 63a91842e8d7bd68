"""The model's context frames (CWD, GIT, HIST, COMP, ENV): one builder for every path.

The daemon (serving each keystroke), the datasets built from the history store (the background
run, `calm dataset`), the corpus of the packaged model and `calm replay --comp` all call
`context_frames`, and all compute COMP with `completions`, so that training sees what serving sees.
Only where the candidates come from differs: the daemon lists the shell's real directory
(calmd/suggest/disk.py) and PATH; the corpus and the replay use the files earlier commands named
(calmd/suggest/reconstruct.py).

COMP (calmd.md, issue 15): candidates for the word being typed, each a whole word, items in this
order, at most `COMP_ITEMS`:
- the first word of a simple command: commands (PATH) that extend it; nothing for an empty word
  (a list of arbitrary commands tells the model nothing);
- a word after it: options (when the word starts with `-`) and subcommands seen after the words
  before it (the user's history first, then the corpus), then the entries of the directory the
  word points into (the cwd, or `src/` for `src/ma`) that extend it, directories with a trailing
  `/` as shells mark them; only directories after `cd`, `pushd`, `rmdir`. Hidden entries only
  when the word starts with `.`.
Items that look like a credential (calmd/secrets/) are left out: a file name can hold one.

The frames are stored with each record (calmd/history/store.py, schema 3) at the cut
`comp_cut(cmd)` gives, and the corpus uses the same cut, so a stored record, a corpus example and a
keystroke that reached that point of the line carry the same COMP.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from calmd.history.recorded import COMP_ITEMS, ENV_MAX_BYTES, clean_env, short_env
from calmd.secrets import find_secret

__all__ = ["COMP_ITEMS", "ENV_MAX_BYTES", "clean_env", "short_env"]  # with the frames they are part of

MAX_SCAN = 2048  # entries of a listing looked at per keystroke, at most
SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "|&"})
PREFIX_COMMANDS = frozenset({"sudo", "doas", "time", "nohup", "command", "exec", "nice", "builtin"})
DIR_COMMANDS = frozenset({"cd", "pushd", "rmdir"})

# `(directory relative to the cwd, "" for the cwd) -> its sorted entries, directories ending in "/"`,
# or None when it cannot be listed in time (no file candidates then).
Lister = Callable[[str], "Sequence[str] | None"]
# `(the words before the one typed) -> subcommands and options seen after them, best first`
Followers = Callable[[Sequence[str]], Iterable[str]]


def word_start(text: str) -> int:
    """Where the word being typed begins in `text` (its length when a blank ends it)."""
    return max(text.rfind(" "), text.rfind("\t")) + 1


def still_extends(items: Sequence[str], word: str) -> bool:
    """Whether a COMP frame made earlier in `word` is still served: one of its items extends it."""
    return any(item.startswith(word) for item in items)


def current_word(text: str) -> tuple[list[str], str]:
    """(the words of the simple command before the word being typed, that word) for an input."""
    cut = word_start(text)
    before = text[:cut].split()
    start = 0
    for i, word in enumerate(before):
        if word in SEPARATORS:
            start = i + 1
    words = before[start:]
    while words and words[0] in PREFIX_COMMANDS:  # `sudo apt` completes like `apt`
        words = words[1:]
    return words, text[cut:]


def _extending(entries: Sequence[str], prefix: str, *, dirs_only: bool, limit: int) -> list[str]:
    """Entries of a sorted listing that start with `prefix` (binary search: a 10,000-entry directory
    costs microseconds)."""
    found: list[str] = []
    i = bisect.bisect_left(entries, prefix)
    hidden = prefix.startswith(".")
    end = min(len(entries), i + MAX_SCAN)  # skipping files for `cd ` in a folder of files is bounded too
    while i < end and len(found) < limit:
        name = entries[i]
        if not name.startswith(prefix):
            break
        i += 1
        if (dirs_only and not name.endswith("/")) or (name.startswith(".") and not hidden):
            continue
        found.append(name)
    return found


def completions(
    text: str,
    *,
    lister: Lister | None = None,
    commands: Sequence[str] = (),
    followers: Followers | None = None,
    limit: int = COMP_ITEMS,
) -> list[str]:
    """The COMP frame's items for the input `text` (module docstring); `commands` sorted."""
    words, word = current_word(text)
    items: list[str] = []
    if not words:
        if word and "/" not in word:
            items = _extending(commands, word, dirs_only=False, limit=limit)
        elif word and lister is not None:
            items = _paths(word, lister, dirs_only=False, limit=limit)
    else:
        if followers is not None:
            flags = word.startswith("-")
            for token in followers(words):
                if token.startswith(word) and token != word and token.startswith("-") == flags:
                    if token not in items:
                        items.append(token)
                    if len(items) >= (limit if flags else (limit + 1) // 2):
                        break
        if not word.startswith("-") and lister is not None:
            room = limit - len(items)
            paths = _paths(word, lister, dirs_only=words[0] in DIR_COMMANDS, limit=room) if room else []
            items += [p for p in paths if p not in items]
    return [item for item in items[:limit] if find_secret(item) is None]


def served_completions(
    text: str,
    *,
    lister: Lister | None = None,
    commands: Sequence[str] = (),
    followers: Followers | None = None,
    limit: int = COMP_ITEMS,
) -> list[str]:
    """The COMP items the daemon serves for `text` typed byte by byte: computed when its last word
    was begun and kept while one of them still extends the word, recomputed when none does
    (calmd/daemon/comp_state.py keeps them per session; this is the same rule without the session,
    for the replay and the probes)."""
    start = word_start(text)
    if start == len(text):  # no word begun (or one just ended): nothing was kept
        return completions(text, lister=lister, commands=commands, followers=followers, limit=limit)
    items: list[str] = []
    for end in range(start + 1, len(text) + 1):
        if not still_extends(items, text[start:end]):
            items = completions(text[:end], lister=lister, commands=commands, followers=followers,
                                limit=limit)  # fmt: skip
    return items


def _paths(word: str, lister: Lister, *, dirs_only: bool, limit: int) -> list[str]:
    if word.startswith(("~", "$")) or "\x00" in word:
        return []  # the daemon does not expand them (they may name another user's files)
    directory, _, prefix = word.rpartition("/")
    if word.startswith("/"):
        directory = directory or "/"
    entries = lister(directory if "/" in word else "")
    if not entries:
        return []
    head = word[: len(word) - len(prefix)]
    return [head + name for name in _extending(entries, prefix, dirs_only=dirs_only, limit=limit)]


def comp_cut(cmd: str) -> str:
    """Where a recorded (or corpus) command's stored COMP frame is computed: the input typed up to
    one or two bytes into one of its words (the first word only for a one-word command), chosen by
    a hash of the command so that the same command always gets the same cut."""
    spans: list[tuple[int, int]] = []
    i, n = 0, len(cmd)
    while i < n:
        while i < n and cmd[i] in " \t":
            i += 1
        start = i
        while i < n and cmd[i] not in " \t":
            i += 1
        if i > start:
            spans.append((start, i))
    if not spans:
        return ""
    digest = hashlib.blake2b(cmd.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    later = spans[1:] or spans
    start, end = later[digest[0] % len(later)]
    return cmd[: min(end, start + 1 + digest[1] % 2)]


def context_frames(
    *,
    cwd: str = "",
    git: str = "",
    history: Iterable[tuple[str, int | None]] = (),
    completions: Sequence[str] = (),
    env: str = "",
    comp_items: int = COMP_ITEMS,
) -> dict[str, Any]:
    """The context mapping the template reads (calmd/formats/tokenizer.py), empty frames left out:
    `history` as (command, exit code or None), oldest first."""
    ctx: dict[str, Any] = {}
    if cwd:
        ctx["cwd"] = cwd
    if git:
        ctx["git"] = git
    hist = [{"cmd": cmd, "exit": code} for cmd, code in history]
    if hist:
        ctx["history"] = hist
    comp = [c for c in completions if c][:comp_items] if comp_items > 0 else []
    if comp:
        ctx["completions"] = comp
    if env:
        ctx["env"] = env
    return ctx


def _plain_word(word: str) -> bool:
    return bool(word) and word[0].isalpha() and word.islower() and all(c.isalnum() or c in "_-" for c in word)


class VocabularyFollowers:
    """`Followers` from vocabularies keyed as calmd/suggest/filters.py's `entries` records them (`cmd`
    -> subcommands, `cmd sub` -> their subcommands, `cmd -`, `cmd sub -` -> options): the first
    vocabulary's tokens first (the user's own), each sorted. Static vocabularies are sorted once."""

    def __init__(self, *known: Any, static: int = 0) -> None:
        self.known = known  # Mapping[str, Iterable[str]] each
        self._sorted: list[dict[str, tuple[str, ...]]] = [{} for _ in known]
        self.static = static  # how many of the last vocabularies never change (their sort is cached)

    def _tokens(self, i: int, key: str) -> tuple[str, ...]:
        if i >= len(self.known) - self.static:
            cached = self._sorted[i].get(key)
            if cached is None:
                cached = self._sorted[i][key] = tuple(sorted(self.known[i].get(key, ())))
            return cached
        return tuple(sorted(self.known[i].get(key, ())))

    def __call__(self, words: Sequence[str]) -> Iterable[str]:
        head = words[0]
        sub = len(words) > 1 and _plain_word(words[1])
        if len(words) == 1:
            keys = [head, f"{head} -"]
        elif len(words) == 2 and sub:
            keys = [f"{head} {words[1]}", f"{head} {words[1]} -", f"{head} -"]
        else:
            keys = [f"{head} {words[1]} -", f"{head} -"] if sub else [f"{head} -"]
        for i in range(len(self.known)):
            for key in keys:
                yield from self._tokens(i, key)
