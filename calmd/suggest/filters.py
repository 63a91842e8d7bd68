"""What is never suggested: lines that drive the terminal, junk lines, and lines the model made up
where it should not have.

- `terminal_safe`: no C0 or C1 control character (ESC, BEL, CR, NUL, U+009B ...): a candidate is
  drawn by the shell as ghost text and inserted into the line, and a control character there
  drives the terminal instead of being drawn (an OSC sets its title or clipboard, a CSI clears
  it, CR hides what comes before) or runs a second command (a newline). A multi-line entry the
  user wrote (a `for` loop over several lines) keeps its newlines only for a shell that draws
  it as lines (zsh, `multiline` in the request): docs/protocol.md. The daemon checks it where
  history proposals are pooled, in the judge of the model's lines, and on every candidate it
  sends (calmd/daemon/server.py), whatever the engine did; the model cannot write one at all
  (calmd/model/generate.py masks those bytes).

Three more checks, cheap enough to run on every candidate of every keystroke (microseconds each):

- `balanced`: quotes and brackets close. A line with an open quote or bracket (`git commit -m
  "fix main`, `awk '{print $1}`) is half a command: Enter would leave the shell waiting for more.
- `Vocabulary`: which subcommands and flags follow a command. A candidate that only the model
  proposes is dropped when it puts after a known command a subcommand or flag that neither the
  packaged corpus vocabulary nor the user's own history ever put there (`git stash status`,
  `systemctl restics`, `ls --colour-me`), or a bare `.` right after a flag or subcommand that
  never took one (`tar -xzf .`). Commands the corpus does not know are never judged: there is
  nothing to judge them by.
- `placeholder`: a documentation page's stand-in (`example.com`, `user@host`, `<file>`,
  `path/to/`, `your_token`, `{{name}}`): never sent unless the line is the user's own (the
  engine's judge) or the user typed the stand-in themselves. The same list judges the panel
  (calmd/quality/panel.py).
- `cwd_argument`: the model copies the cwd from its context into an argument
  (`kubectl ~/src/api-server` while in ~/src/api-server): a model-only candidate that does so is
  dropped (naming the folder one is in is never needed: `.` says it).

The corpus vocabulary (calmd/data/vocabulary.json) is built from the same sources as the default
model's corpus (tldr pages, the training users' histories; never the held-out users) by

    python -m calmd.quality.fit_vocabulary [--data ../shared/data] [--output calmd/data/vocabulary.json]

A token is "known" after a command when a tldr page shows it there or at least two training users
typed it there; a command is "subcommand-taking" when at least 90% of the plain words that
follow it in the corpus are known ones (git, docker, systemctl: yes; cd, vim, ssh: no, their
next word is a file or a host, anything goes).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.atomic import check_format, read_json
from calmd.errors import FormatError

VOCABULARY_VERSION = 1
PREFIX_COMMANDS = frozenset({"sudo", "doas", "time", "nohup", "command", "exec", "nice", "builtin"})
SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "|&"})
_PLAIN_WORD = re.compile(r"[a-z][a-z0-9_-]*\Z")  # a subcommand-like word (not a path, host, file)
_FLAG = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*\Z")  # `-x`, `-xzf`, `--long` (value cut off)
_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}


# --------------------------------------------------------------------------- the terminal

# C0 (U+0000-U+001F), DEL and C1 (U+0080-U+009F): what a terminal acts on instead of drawing; and
# lone surrogates (bytes that were not UTF-8), which no terminal draws either.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


# What a suggestion may hold at most: what a shell can send back as its input (the protocol's
# limit). A 64 KiB command is stored as it was run, but never drawn as ghost text.
MAX_SUGGESTION_BYTES = 4096


def sendable(text: str, *, multiline: bool = False) -> bool:
    """Whether `text` may leave the daemon as a candidate: `terminal_safe`, and no longer than
    MAX_SUGGESTION_BYTES."""
    return (
        len(text) <= MAX_SUGGESTION_BYTES
        and (len(text.encode("utf-8", "surrogatepass")) <= MAX_SUGGESTION_BYTES)
        and terminal_safe(text, multiline=multiline)
    )


def terminal_safe(text: str, *, multiline: bool = False) -> bool:
    """Whether `text` holds no control character. With `multiline`, a multi-line entry's newlines
    are allowed (`continued_lines`: a `for` loop written over three lines, for a shell that draws
    it as such); no other control character is, nor a newline that starts a second command."""
    if multiline and "\n" in text:
        return _CONTROL_BUT_NEWLINE.search(text) is None and continued_lines(text)
    return _CONTROL.search(text) is None


# Compound commands: while one is open, a newline continues it (the shell asks for more, PS2).
_OPENS = frozenset({"for", "while", "until", "select", "if", "case", "{"})
_CLOSES = frozenset({"done", "fi", "esac", "}"})
_SEGMENT = re.compile(r"[;&|()]+")  # what starts a new command within a line
_RESERVED = frozenset({"do", "then", "else", "elif", "!", "time"})  # before the command a segment runs
_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")


@functools.lru_cache(maxsize=4096)
def continued_lines(text: str) -> bool:
    """Whether every newline of `text` continues one command, as a shell reads it: inside an
    open quote or bracket, a `for`/`while`/`if`/`case`/`{` not yet closed or a here-document, or
    after a line that ends with `\\`, `|`, `&&` or `||`. `touch a<newline>rm -rf x` is two
    commands, the second hidden below the first: no. Lines are not blank."""
    lines = text.split("\n")
    if not all(line.strip() for line in lines):
        return False
    depth = 0
    heredocs: list[str] = []
    for i, line in enumerate(lines[:-1]):
        if heredocs:
            if line.strip() == heredocs[0]:
                heredocs.pop(0)
            if heredocs:
                continue
        else:
            heredocs += _HEREDOC.findall(line)
            depth += _compound_depth(line.split(" #", 1)[0])
        end = line.rstrip()
        if heredocs or depth > 0 or end.endswith(("\\", "|", "&&", "||")):
            continue
        if not balanced("\n".join(lines[: i + 1])):
            continue  # an open quote or bracket: the string or the group goes on
        return False
    return True


def _compound_depth(line: str) -> int:
    """Compound commands `line` opens less those it closes: reserved words where a command starts
    (`for` in `echo for` is an argument)."""
    depth = 0
    for segment in _SEGMENT.split(line):
        for word in segment.split():
            if word in _OPENS:
                depth += 1
            elif word in _CLOSES:
                depth -= 1
            elif word not in _RESERVED:
                break
    return depth


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


# --------------------------------------------------------------------------- placeholders

# The stand-ins of documentation pages (tldr, man pages' examples) the model learned to write
# where a value of the user's belongs: (name, pattern). Shared with the panel's judge.
PLACEHOLDERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("example domain", r"(?<![\w-])(?:[\w-]+\.)*example\.(?:com|org|net|edu)\b"),
        ("reserved domain", r"(?<![\w-])[\w-]+\.(?:example|invalid)\b"),
        ("user@", r"(?<![\w.-])(?:user|username|your_?user(?:name)?)@"),
        ("<placeholder>", r"(?<![<\w])<[A-Za-z_][\w.-]*(?:[ _-][\w.-]+)*>(?![>\w])"),
        # (not a Go template: `docker ps --format '{{.Names}}'` is typed as it is)
        ("{{placeholder}}", r"\{\{(?![.\s$]|json\b|range\b|if\b|index\b|printf?\b|with\b|end\b)[^{}]*\}\}"),
        ("path/to/", r"\bpath/to\b"),
        ("your_", r"\byour[_-][a-z]"),
        ("foo.bar", r"\bfoo[.@/]bar\b"),
        ("github user", r"github\.com[/:](?:user|username|your_?name)/"),
        ("your domain", r"\b(?:yourdomain|mydomain|domain)\.(?:com|org|net)\b"),
    )
)


def placeholder(cmd: str, typed: str = "") -> str | None:
    """The name of the first placeholder of `cmd` that reaches past the input `typed` (what the
    user typed is theirs: `curl https://example.com/` typed out is not judged), or None."""
    for name, pattern in PLACEHOLDERS:
        for match in pattern.finditer(cmd):
            if match.end() > len(typed) or not cmd.startswith(typed):
                return name
    return None


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
        data = check_format(data, "calm-vocabulary", VOCABULARY_VERSION, source)
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
        return cls.from_json(read_json(path, "vocabulary"), str(path))


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


def repeats_word(cmd: str) -> bool:
    """A word written twice in a row (`make test test`): how a model stutters, not how people
    type. Judged on lines only the model wrote."""
    words = split_words(cmd)
    return any(a == b for a, b in itertools.pairwise(words))


def cut_off(cmd: str, vocab: Vocabulary, user: UserVocabulary | None = None) -> bool:
    """The line ends in the middle of a word: its last token is unknown where it stands (for the
    corpus and the user alike) but begins a token known there (`make to` where `make tools` was
    typed). Judged on lines only the model wrote; a line that stops after a complete word the user
    never ended a line with is the engine's check (`HistoryIndex.head_count`)."""
    words = split_words(cmd)
    at_end = [(key, token) for offset, segment in segments(words) for key, token, pos in entries(segment)
              if offset + pos == len(words) - 1 and key and token and not key.endswith(" .")]  # fmt: skip
    cut = False
    for key, token in at_end:
        corpus = vocab.known.get(key, frozenset())
        mine = user.known.get(key, set()) if user is not None else set()
        if token in corpus or token in mine:
            return False
        cut = cut or any(k.startswith(token) for k in itertools.chain(corpus, mine))
    return cut


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


def packaged_vocabulary_path() -> Path:
    return paths.PACKAGE_DATA / paths.PACKAGED_VOCABULARY


@functools.cache
def packaged_vocabulary() -> Vocabulary:
    """The vocabulary shipped in the package, read once per process."""
    return Vocabulary.load(packaged_vocabulary_path())
