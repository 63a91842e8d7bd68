"""A secret fed to a command that reads one on standard input: through a pipe from `echo`/
`printf`/`yes` (and filters that pass it on), a here-string, a here-document, `< <(echo x)`, or
a process substitution given where a secret file goes (`--password-file <(echo x)`).

The reader is known by its shape (an option that says secret and stdin: `--password-stdin`,
`--passphrase-fd 0`, `--key-file -`) or is one of the tools that read a secret there
(`passwd`, `chpasswd`, `sudo -S`, `kinit`, `cryptsetup`, ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from calmd.secrets.names import NAME_SPLIT, name_kind, secret_option
from calmd.secrets.shellwords import (
    EXPANSION,
    GROUP,
    command_starts,
    fed_text,
    printf_output,
    shell_tokens,
    unquote,
)
from calmd.secrets.values import is_placeholder

_REDIRECTIONS = frozenset({">", ">>", ">|", "<>", "<&", ">&"})
_LIST_OPERATORS = frozenset({"&&", "||", ";", ";;", "&", "\n"})


# A secret fed to a command that reads one from standard input (`--password-stdin`, `passwd
# --stdin`, `openssl passwd -stdin`, `--from-file=k=/dev/stdin`, `sudo -S`, `cryptsetup`), or from
# a file argument that is a process substitution (`--password-file <(echo x)`): the literal comes
# from `echo`/`printf`/`yes` on the pipe's left, a here-string (`<<< 'x'`), a here-document, or
# `< <(echo x)`. A pipe from `cat ~/.token`, `pass show x` or `"$TOKEN"` names where the secret
# lives, and is not one.


def _fed_literal(raw: str) -> str | None:
    """The literal a word feeds, when it could be a secret: not a path, an expansion or a
    placeholder, not empty."""
    text = fed_text(raw).strip()
    if not text or text in ("-", "''", '""') or is_placeholder(text) or raw.startswith("~"):
        return None  # (a password may well start with `/` or `@`: fed, it is not a file's name)
    return text


@dataclass
class _Stage:
    """One command of a pipeline: its words, and what is fed to its standard input."""

    words: list[str]
    here: list[str]  # here-strings' literals, here-documents' literal bodies
    stdin_procsub: list[str]  # `< <(...)`: the inner command line
    stdin_file: bool  # `< file`: its input is a file


def _stages(tokens: list[tuple[str, str]]) -> list[list[_Stage]]:
    """The pipelines of a command line (split at `;`, `&&`, `||`, `&`, newlines), each a list
    of stages (split at `|`). A group `( ... )` or `{ ...; }` stays one stage: its commands'
    words are all its words."""
    pipelines: list[list[_Stage]] = []
    stage = _Stage([], [], [], False)
    pipeline: list[_Stage] = [stage]
    depth = 0
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if (kind == "op" and text == "(") or (kind == "word" and text == "{"):
            depth += 1
            stage.words.append(GROUP)
        elif (kind == "op" and text == ")") or (kind == "word" and text == "}"):
            depth = max(0, depth - 1)
            stage.words.append(GROUP)
        elif kind == "op" and text in _LIST_OPERATORS and depth > 0:
            stage.words.append(GROUP)
        elif kind == "op" and text in ("|", "|&") and depth == 0:
            stage = _Stage([], [], [], False)
            pipeline.append(stage)
        elif kind == "op" and text in _LIST_OPERATORS and depth == 0:
            pipelines.append(pipeline)
            stage = _Stage([], [], [], False)
            pipeline = [stage]
        elif kind == "op" and text == "<<<" and i + 1 < len(tokens) and tokens[i + 1][0] == "word":
            literal = _fed_literal(tokens[i + 1][1])
            if literal:
                stage.here.append(literal)
            i += 1
        elif kind in ("heredoc", "heredoc-literal"):
            body = text if kind == "heredoc-literal" else EXPANSION.sub("", text)
            if body.strip() and not is_placeholder(body.strip()):
                stage.here.append(body.strip())
        elif kind == "op" and text == "<" and i + 1 < len(tokens) and tokens[i + 1][0] == "word":
            target = tokens[i + 1][1]
            if target.startswith("<("):
                stage.stdin_procsub.append(target[2:-1] if target.endswith(")") else target[2:])
            else:
                stage.stdin_file = True
            i += 1
        elif kind == "op" and text in _REDIRECTIONS:
            i += 1  # its target is no argument
        elif kind == "word":
            stage.words.append(text)
        i += 1
    pipelines.append(pipeline)
    return pipelines


# Filters that pass what they read on, changed (`base64 -d`, `tr -d '\\n'`): a literal goes through.
_PASS_THROUGH = {"cat": 0, "tee": 99, "tr": 2, "base64": 0, "head": 0, "tail": 0, "sed": 1, "rev": 0}


def _writes(stage: _Stage, fed: list[str]) -> list[str]:
    """The literals a stage writes on its standard output: `echo`/`printf`/`yes` arguments
    (each command of a group), or what a filter like `cat` passes on from its input."""
    written: list[str] = []
    for start in command_starts(stage.words):
        name = unquote(stage.words[start]).rsplit("/", 1)[-1]
        args = stage.words[start + 1 :]
        args = args[: next((k for k, w in enumerate(args) if w == GROUP), len(args))]
        if name == "echo":
            while args and re.fullmatch(r"-[neE]+", args[0]):
                args = args[1:]
            written += [v for v in map(_fed_literal, args) if v]
        elif name == "printf" and args and args[0] != "-v":
            printed = printf_output(args[0], args[1:])
            if printed and not is_placeholder(printed):
                written.append(printed)
        elif name == "yes":
            written += [v for v in map(_fed_literal, args) if v]
        elif name in _PASS_THROUGH and fed:
            operands = [a for a in args if not a.startswith("-")]
            if len(operands) <= _PASS_THROUGH[name]:  # no file of its own to read
                written += fed
    return written


_STDIN_VALUES = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "stdin", "fd:0",
                           "file:/dev/stdin", "file:///dev/stdin", "pass:stdin"})  # fmt: skip


def _stdin_option(args: Sequence[str]) -> bool:
    """An option that says the secret comes from standard input: its name says so
    (`--password-stdin`, `--token-stdin`, `--with-token`), or it names a secret and its value is
    stdin (`--password-file=/dev/stdin`, `--passphrase-fd 0`, `--key-file -`, `-passin stdin`),
    or it is kubectl's `--from-file=[KEY=]/dev/stdin` of a secret."""
    for k, arg in enumerate(args):
        if not arg.startswith("-") or arg in ("-", "--"):
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        parts = {p.lower() for p in NAME_SPLIT.split(name) if p}
        if ("stdin" in parts and secret_option(name)) or name == "with-token":
            return True
        if not eq and k + 1 < len(args):
            value = args[k + 1]
        if name in ("from-file", "from-env-file"):
            key, _, path = value.rpartition("=")
            if path in _STDIN_VALUES and ("secret" in args or name_kind(key) is not None):
                return True
        elif secret_option(name) and (value in _STDIN_VALUES or (value == "0" and "fd" in parts)):
            return True
    return False


def _after(args: Sequence[str], *verbs: str) -> bool:
    """Whether the words hold these verbs in this order (`gh auth login`, `docker secret create`)."""
    at = 0
    for verb in verbs:
        try:
            at = args.index(verb, at) + 1
        except ValueError:
            return False
    return True


# Tools that read a password (or key) from standard input, in the form they do it.
_NOT_READING = frozenset(
    {"-l", "-u", "-d", "-e", "-S", "--lock", "--unlock", "--delete", "--expire", "--status"}
)
_STDIN_READERS: dict[str, Callable[[Sequence[str]], bool]] = {
    "passwd": lambda a: not _NOT_READING & set(a),
    "chpasswd": lambda a: True,
    "chgpasswd": lambda a: True,
    "smbpasswd": lambda a: "-s" in a,
    "vncpasswd": lambda a: "-f" in a,
    "tightvncpasswd": lambda a: "-f" in a,
    "kinit": lambda a: True,
    "mkpasswd": lambda a: "-s" in a or "--stdin" in a,
    "htpasswd": lambda a: any(w.startswith("-") and not w.startswith("--") and "i" in w for w in a),
    "openssl": lambda a: "passwd" in a and "-stdin" in a,
    "sudo": lambda a: "--stdin" in a or any(re.fullmatch(r"-[A-Za-z]*S[A-Za-z]*", w) for w in a[:4]),
    "cryptsetup": lambda a: bool({"open", "luksOpen", "luksFormat", "luksAddKey", "luksResume"} & set(a)),
    "zfs": lambda a: "load-key" in a,
    "ssh-add": lambda a: "-" in a,
    "secret-tool": lambda a: "store" in a,
    "keyring": lambda a: "set" in a,
    "pass": lambda a: "insert" in a or "add" in a,
    "gh": lambda a: _after(a, "auth", "login") or _after(a, "secret", "set"),
    "glab": lambda a: "--stdin" in a,
    "vault": lambda a: _after(a, "login", "-") or any(w.endswith("=-") for w in a),
    "docker": lambda a: _after(a, "secret", "create") and a[-1] == "-",
    "podman": lambda a: _after(a, "secret", "create") and a[-1] == "-",
    "wrangler": lambda a: _after(a, "secret", "put"),
    "vercel": lambda a: _after(a, "env", "add"),
    "ansible-vault": lambda a: "encrypt_string" in a,
    "sshpass": lambda a: not {"-p", "-f", "-e"} & {w[:2] for w in a},
    "wpa_passphrase": lambda a: len([w for w in a[1:] if not w.startswith("-")]) == 1,
    "argon2": lambda a: True,
    "systemd-creds": lambda a: "encrypt" in a and "-" in a,
}
_PAIR_READERS = frozenset({"chpasswd", "chgpasswd"})  # they read `user:password` lines


def _reads_secret(words: Sequence[str]) -> str | None:
    """How a stage reads a secret on its standard input: "plain", "pair" (`user:password` lines),
    or None when it does not."""
    args = [unquote(w) for w in words]
    if _stdin_option(args):
        return "plain"
    for k in command_starts(words):
        name = args[k].rsplit("/", 1)[-1]
        check = _STDIN_READERS.get(name)
        if check is not None and check(args[k:]):
            return "pair" if name in _PAIR_READERS else "plain"
    return None


def _secret_fed(literals: Sequence[str], how: str) -> bool:
    if how == "pair":
        return any(line.partition(":")[2].strip() for text in literals for line in text.splitlines())
    return any(literals)


def _procsub_literals(inner: str) -> list[str]:
    """What the command line inside a process substitution writes (`echo x`, `printf x`)."""
    written: list[str] = []
    for pipeline in _stages(shell_tokens(inner)):
        fed: list[str] = []
        for stage in pipeline:
            fed = _writes(stage, fed + stage.here)
        written += fed
    return written


def _secret_file_argument(words: Sequence[str]) -> bool:
    """A process substitution that prints a literal, given where a secret file goes:
    `--password-file <(echo x)`, `--from-file=password=<(echo x)`, `sshpass -f <(echo x)`."""
    for k, raw in enumerate(words):
        if "<(" not in raw:
            continue
        option, key, value = "", "", raw
        if raw.startswith("-"):
            option, _, value = raw.partition("=")
        elif k and words[k - 1].startswith("-"):
            option = words[k - 1]
        if not value.startswith("<("):
            key, _, value = value.partition("=")  # `--from-file=password=<(...)`
        if not value.startswith("<(") or not _procsub_literals(value[2:].removesuffix(")")):
            continue
        name = option.lstrip("-")
        if secret_option(name) or (key and name_kind(key) is not None):
            return True
        if option == "-f" and any(unquote(w).rsplit("/", 1)[-1] == "sshpass" for w in words[:k]):
            return True
        if name in ("from-file", "from-env-file") and "secret" in words:
            return True
    return False


_FED_SOURCES = re.compile(r"echo|printf|yes\b|<<|<\(")  # (and `base64` after one of them)


def fed_rule(cmd: str) -> str | None:
    if ("|" not in cmd and "<" not in cmd) or not _FED_SOURCES.search(cmd):
        return None
    for pipeline in _stages(shell_tokens(cmd)):
        piped: list[str] = []
        for stage in pipeline:
            fed = piped + stage.here
            for inner in stage.stdin_procsub:
                fed += _procsub_literals(inner)
            if stage.stdin_file and not stage.here and not stage.stdin_procsub:
                fed = []  # `< file` replaces the pipe
            how = _reads_secret(stage.words) if fed else None
            if how is not None and _secret_fed(fed, how):
                return "fed-secret"
            if "<(" in cmd and _secret_file_argument(stage.words):
                return "fed-secret"
            if (
                fed
                and _encodes(stage.words)
                and any(_PAIR.fullmatch(text) and "://" not in text for text in fed)
            ):
                return "basic-auth-built"  # `echo -n user:pass | base64`: a Basic credential made
            piped = _writes(stage, fed)
    return None


_PAIR = re.compile(r"[\w.@\\-]{1,64}:(?=[^:\s]*[\d\W])[^\s:]{4,}")  # `user:pass`, a digit or a symbol in it


def _encodes(words: Sequence[str]) -> bool:
    """Whether a stage encodes what it reads in base64 (`base64`, `openssl base64`, `basenc
    --base64`), not decodes it."""
    args = [unquote(w) for w in words]
    for k in command_starts(words):
        name = args[k].rsplit("/", 1)[-1]
        rest = args[k + 1 :]
        if name in ("base64", "basenc", "b64") or (name == "openssl" and rest[:1] in (["base64"], ["enc"])):
            return not {"-d", "--decode", "-D", "-di", "-id"} & set(rest)
    return False
