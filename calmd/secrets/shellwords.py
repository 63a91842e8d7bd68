"""A command line as the shell reads it: words, quotes, operators, here-documents, substitutions.

Everything here is linear in the length of the line (no regular expression backtracks): the
detector runs on every record, up to the 64 KiB record limit.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

# One shell word: unquoted runs, quoted parts (closed or not), backslash escapes.
WORD = re.compile(r"""(?:[^\s'"\\]+|'[^']*'?|"(?:[^"\\]|\\.)*"?|\\.?)+""")
SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "|&"})
GROUP = "\0"  # between two commands of a group `( a; b )`, `{ a; b; }` in a stage's words

_ANSI_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
                   "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip
_ANSI_C_NUMBER = re.compile(r"x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}")


def ansi_c(word: str, start: int) -> tuple[str, int]:
    """The text of an ANSI-C quoted string (`$'...'`) whose body starts at `start`, and the index
    after its closing quote: `\\n`, `\\x21`, `\\041`, `\\u00e9`, `\\'` as bash and zsh read them."""
    out: list[str] = []
    i, n = start, len(word)
    while i < n and word[i] != "'":
        if word[i] == "\\" and i + 1 < n:
            number = _ANSI_C_NUMBER.match(word, i + 1)
            if number:
                digits = number.group(0)
                base = 8 if digits[0].isdigit() else 16
                code = int(digits if base == 8 else digits[1:], base)
                out.append(chr(code) if code < 0x110000 else "?")
                i = number.end()
                continue
            out.append(_ANSI_C_ESCAPES.get(word[i + 1], "\\" + word[i + 1]))
            i += 2
            continue
        out.append(word[i])
        i += 1
    return "".join(out), i + 1


_DOUBLE_QUOTE_ESCAPES = frozenset('$`"\\\n')


def unquote(word: str) -> str:
    """A shell word without its quotes (`'a b'`, `"x"`, `a'b'c`, ANSI-C `$'a\\x21'`), backslash
    escapes resolved."""
    if "'" not in word and '"' not in word and "\\" not in word:
        return word
    out: list[str] = []
    i, n = 0, len(word)
    while i < n:
        c = word[i]
        if c == "$" and i + 1 < n and word[i + 1] in "'\"":
            if word[i + 1] == "'":  # ANSI-C quoting: the escapes are the value's characters
                text, i = ansi_c(word, i + 2)
                out.append(text)
                continue
            i += 1  # `$"..."` (a translated string) is a double-quoted one
            continue
        if c == "'":
            j = word.find("'", i + 1)
            j = n if j < 0 else j
            out.append(word[i + 1 : j])
            i = j + 1
        elif c == '"':
            j = i + 1
            while j < n and word[j] != '"':
                if word[j] == "\\" and j + 1 < n and word[j + 1] in _DOUBLE_QUOTE_ESCAPES:
                    j += 1  # (elsewhere a backslash is itself: `"a\nb"` is printf's `\n`)
                out.append(word[j])
                j += 1
            i = j + 1
        elif c == "\\" and i + 1 < n:
            out.append(word[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_expansion(raw: str) -> bool:
    """A shell word that starts with an expansion (`$VAR`, `${X}`, `$(cmd)`, `"$X"`), not with
    ANSI-C or translated quoting (`$'...'`, `$"..."`), whose content is literal, nor in single
    quotes (`'$tL8'` is a password that starts with a dollar)."""
    if raw.startswith(("$'", '$"')):
        return False
    return raw.startswith(("$", '"$'))


# A quoted option (`"--password=x"`, `'-pX'`, `"--db-pass" x`) is the option its quotes hold: the
# quote moves after the name, as the shell reads it (`--password="x"`).
# (A quoted `-pVALUE` keeps its value quoted: `"-PSq1Pass!"` is `-P"Sq1Pass!"`.)
_QUOTED_OPTION = re.compile(
    r"""(?<![^\s=(|;&])(['"])(?:(--?[A-Za-z][A-Za-z0-9_.-]*)(?:(\1)|(=))|(-[A-Za-z])(?=[^'"\s][^'"]*\1))"""
)


def requote_options(cmd: str) -> str:
    if "'-" not in cmd and '"-' not in cmd:
        return cmd

    def moved(found: re.Match[str]) -> str:
        quote, flag, closed, eq, short = found.groups()
        if short:
            return short + quote
        return flag if closed else flag + eq + quote

    return _QUOTED_OPTION.sub(moved, cmd)


def as_option(word: str) -> str:
    """A word as an option: `"--password=x"` and `'-pX'` are `--password="x"` and `-pX` to the
    tool (the value keeps its quotes: `"--password=$PW"` gives `"$PW"`, an expansion)."""
    if word[:1] in ("'", '"') and word[1:2] == "-":
        return requote_options(word)
    return word


def closing(text: str, i: int, opening: str, close: str) -> int:
    """The index after the `close` that balances the `opening` before `i`, quotes respected."""
    depth, n = 1, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            end = text.find("'", i + 1)
            i = n if end < 0 else end + 1
            continue
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            continue
        if c == opening:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


_SHELL_OPERATORS = ("<<<", "<<-", "&&", "||", "|&", ";;", "<<", ">>", "<&", ">&", "<>", ">|", "|", "&", ";",
                    "<", ">", "(", ")", "\n")  # fmt: skip
_OPERATOR_CHARS = frozenset("|&;<>()\n")
TOKEN_LIMIT = 2048  # a command line longer than this in words is judged on its first ones
_HEREDOC_WORD = re.compile(r"[ \t]*((?:'[^'\n]*'|\"[^\"\n]*\"|\\\\.|[^\s|&;<>()])+)")


def shell_tokens(cmd: str) -> list[tuple[str, str]]:
    """The command line as ("word", raw word), ("op", operator) and ("heredoc", body) tokens (a
    here-document's body replaces its delimiter word; "heredoc-literal" when the delimiter was
    quoted: then nothing in it expands). Linear in the length of `cmd`."""
    tokens: list[tuple[str, str]] = []
    pending: list[tuple[int, str, bool, bool]] = []  # (token index, delimiter, quoted, strip tabs)
    i, n = 0, len(cmd)
    word_start = -1
    while i < n and len(tokens) < TOKEN_LIMIT:
        c = cmd[i]
        if c in " \t" or c in _OPERATOR_CHARS:
            if word_start >= 0 and c in "<>" and cmd[word_start:i].isdigit():
                word_start = -1  # `2>`: a file descriptor, not a word
            elif word_start >= 0:
                tokens.append(("word", cmd[word_start:i]))
                word_start = -1
            if c in " \t":
                i += 1
                continue
            if c in "<>" and i + 1 < n and cmd[i + 1] == "(":  # a process substitution: a word
                word_start = i
                i = closing(cmd, i + 2, "(", ")")
                continue
            op = next(o for o in _SHELL_OPERATORS if cmd.startswith(o, i))
            i += len(op)
            if op in ("<<", "<<-"):
                tokens.append(("op", op))
                match = _HEREDOC_WORD.match(cmd, i)
                if match:
                    raw = match.group(1)
                    pending.append((len(tokens), unquote(raw), raw != unquote(raw), op == "<<-"))
                    tokens.append(("heredoc", ""))
                    i = match.end()
                continue
            if op == "\n" and pending:
                for index, delimiter, quoted, strip_tabs in pending:
                    body: list[str] = []
                    while i < n:
                        end = cmd.find("\n", i)
                        end = n if end < 0 else end
                        line = cmd[i:end]
                        i = end + 1
                        if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                            break
                        body.append(line)
                    tokens[index] = ("heredoc-literal" if quoted else "heredoc", "\n".join(body))
                pending.clear()
            tokens.append(("op", op))
            continue
        if word_start < 0:
            word_start = i
        if c == "\\":
            i += 2
        elif c == "'":
            end = cmd.find("'", i + 1)
            i = n if end < 0 else end + 1
        elif c == '"':
            i += 1
            while i < n and cmd[i] != '"':
                if cmd[i] == "\\":
                    i += 1
                elif cmd.startswith("$(", i):
                    i = closing(cmd, i + 2, "(", ")") - 1
                i += 1
            i += 1
        elif c == "$" and i + 1 < n and cmd[i + 1] == "'":
            i += 2
            while i < n and cmd[i] != "'":
                i += 2 if cmd[i] == "\\" else 1
            i += 1
        elif c == "$" and i + 1 < n and cmd[i + 1] in "({":
            i = closing(cmd, i + 2, cmd[i + 1], ")" if cmd[i + 1] == "(" else "}")
        elif c == "`":
            end = cmd.find("`", i + 1)
            i = n if end < 0 else end + 1
        else:
            i += 1
    if word_start >= 0 and len(tokens) < TOKEN_LIMIT:
        tokens.append(("word", cmd[word_start:]))
    return tokens


EXPANSION = re.compile(r"\$(?:\{[^}]*\}?|\([^)]*\)?|[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])|`[^`]*`?")


def fed_text(raw: str) -> str:
    """What a shell word puts on a pipe, with its expansions taken out (`"$PW"` puts nothing of
    its own; `'user:pw'` all of it): the literal part a secret could be."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "'":
            end = raw.find("'", i + 1)
            end = n if end < 0 else end
            out.append(raw[i + 1 : end])
            i = end + 1
        elif c == "$" and i + 1 < n and raw[i + 1] == "'":
            text, i = ansi_c(raw, i + 2)
            out.append(text)
        elif c == '"':
            end = i + 1
            while end < n and raw[end] != '"':
                end += 2 if raw[end] == "\\" else 1
            out.append(EXPANSION.sub("", raw[i + 1 : end]).replace('\\"', '"'))
            i = end + 1
        else:
            found = EXPANSION.match(raw, i)
            if found:
                i = found.end()
                continue
            out.append(raw[i + 1] if c == "\\" and i + 1 < n else c)
            i += 2 if c == "\\" else 1
    return "".join(out)


_PRINTF_PARTS = re.compile(r"%%|%[-+ #0-9.*]*[a-zA-Z]|\\(?:[0-7]{1,3}|x[0-9A-Fa-f]{1,2}|.)")


def printf_output(fmt: str, args: Sequence[str]) -> str:
    """What `printf FORMAT ARGS...` prints, with the arguments' expansions left out (`printf
    'user:%s\\n' "$PW"` prints `user:` of its own): the literal text it writes, stripped."""
    values = iter([fed_text(a) for a in args])

    def part(found: re.Match[str]) -> str:
        piece = found.group(0)
        if piece == "%%":
            return "%"
        if piece.startswith("%"):
            return next(values, "")
        return "\n" if piece == "\\n" else ""

    printed = _PRINTF_PARTS.sub(part, fed_text(fmt))
    return (printed + "".join(values)).strip()


WRAPPERS = frozenset({"sudo", "doas", "env", "command", "builtin", "exec", "nice", "nohup", "time",
                      "timeout", "stdbuf", "ionice", "chrt", "taskset", "xargs", "run0", "npx", "bunx",
                      "watch", "{", "(", GROUP})  # fmt: skip
_WRAPPER_VALUES = frozenset({"-u", "-g", "-C", "-h", "-p", "-r", "-t", "-U", "-n", "-c", "-s", "-k", "-D"})
_ASSIGNMENT_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
_DURATION = re.compile(r"[\d.]+[smhd]?")


def command_name(word: str) -> str:
    """The program a word runs: `/usr/bin/openssl`, `"$(openssl`, `\\calm` are openssl and calm."""
    return unquote(word.lstrip("\"'$(<`")).rsplit("/", 1)[-1]


def command_starts(words: Sequence[str]) -> list[int]:
    """Where commands start among a stage's words: the first word, the word after a wrapper
    (`sudo -u root`, `env A=b`, `timeout 5`) and the first of each command of a group."""
    starts: list[int] = []
    k, n = 0, len(words)
    expect = True
    while k < n:
        word = words[k]
        if word == GROUP or word in ("{", "}"):
            expect = True
            k += 1
            continue
        if not expect:
            k += 1
            continue
        base = unquote(word).rsplit("/", 1)[-1]
        if _ASSIGNMENT_WORD.fullmatch(word):
            k += 1  # an assignment before the command
            continue
        starts.append(k)
        if base not in WRAPPERS:
            expect = False
            k += 1
            continue
        k += 1
        while k < n and (words[k].startswith("-") or "=" in words[k] or _DURATION.fullmatch(words[k])):
            k += 2 if words[k] in _WRAPPER_VALUES and base in ("sudo", "doas", "nice", "run0") else 1
    return starts


def simple_commands(words: Sequence[str]) -> Iterator[list[str]]:
    """Each command of a list of words: split at `|`, `&&`, `;` ..., and after a wrapper (`sudo
    -u postgres psql -p 5433`: sudo's `-u` is not psql's), each with its name first."""
    start = 0
    n = len(words)
    while start < n:
        end = start
        while end < n and words[end] not in SEPARATORS:
            end += 1
        segment = list(words[start:end])
        starts = command_starts(segment)
        for k, at in enumerate(starts):
            stop = starts[k + 1] if k + 1 < len(starts) else len(segment)
            if stop > at:
                yield segment[at:stop]
        start = end + 1


_SUBSTITUTION = re.compile(r"\$\(|<\(|>\(|`")
SUBSTITUTION_LIMIT = 32  # substitutions judged per line (a real one has a few)


def substitutions(cmd: str) -> list[str]:
    """The command lines inside `$(...)`, `<(...)`, `>(...)` and backquotes, outermost first (a
    nested one is found when its parent is judged)."""
    found: list[str] = []
    i = 0
    while len(found) < SUBSTITUTION_LIMIT:
        match = _SUBSTITUTION.search(cmd, i)
        if match is None:
            break
        if match.group(0) == "`":
            end = cmd.find("`", match.end())
            end = len(cmd) if end < 0 else end
            found.append(cmd[match.end() : end])
            i = end + 1
            continue
        end = closing(cmd, match.end(), "(", ")")
        found.append(cmd[match.end() : end - 1 if cmd[end - 1 : end] == ")" else end])
        i = end
    return found


class Line:
    """One command line and what the rules read of it, each computed once, on first use."""

    __slots__ = ("_commands", "_lower", "_requoted", "_words", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._lower: str | None = None
        self._words: list[str] | None = None
        self._commands: list[list[str]] | None = None
        self._requoted: str | None = None

    @property
    def lower(self) -> str:
        if self._lower is None:
            self._lower = self.text.lower()
        return self._lower

    @property
    def words(self) -> list[str]:
        if self._words is None:
            self._words = WORD.findall(self.text)
        return self._words

    @property
    def commands(self) -> list[list[str]]:
        if self._commands is None:
            self._commands = list(simple_commands(self.words[:TOKEN_LIMIT]))
        return self._commands

    @property
    def requoted(self) -> str:
        if self._requoted is None:
            self._requoted = requote_options(self.text)
        return self._requoted
