"""Arguments checked by kind: what may stand where a command expects a path, a module, a host,
a signal or pid, a variable, an operation or a subcommand (issue 31, "no absurd ghost").

A line only the model wrote (or a carry-over: another user's habit) is dropped when a word the
user did not type stands where it cannot belong:
- a path where the command takes an existing one (`rm`, `ls`, `mv` and `cp`'s source, `chmod`
  after its mode, `git add` ...) naming nothing relative to the cwd nor in the COMP frame
  (`mv Downloads` with no Downloads); `cd`, `vim`, `cat` and the script of `python` are the disk
  check's (calmd/suggest/disk.py `check_arguments`), not judged twice;
- after `python -m`: a word that is no module: a file name (`README.md`, `x.py`), or a name
  neither the standard library, the common runnable tools, the disk (`x.py`, `x/`, `src/x/`),
  the COMP frame nor the user's own `python -m` lines know (`python3 -m photos`); and a script
  that is no Python file (`python3 README.md`);
- after `tar`: no operation (`tar docker`): its first word is a flag or an old-style bundle
  with one operation letter (`xzf`, `cvf`);
- after `kill`: no signal, pid or job (`kill docker`, `kill -9 Documents`);
- after `export` / `unset`: no variable: a lowercase name without a value (`export docker`,
  `export Downloads`; `export PATH`, `export http_proxy=...` pass);
- where a host belongs (`ssh`, `ping`, `mosh`, `traceroute`, `scp`'s `host:`): a word that is no
  host: no dot, no IP, not `localhost` and never typed as a host by the user (`ping docker`),
  or a file name (`ping docker-compose.yml`);
- a file name where a subcommand or resource belongs (`kubectl get index.html`): the corpus
  vocabulary judges that position (calmd/suggest/filters.py) and the word has a file's extension;
- a bare `-` or `--` that ends the line (`find . -`): cut off mid-flag.
What the user typed is theirs and never judged; what cannot be known in time (a folder not
listed within the disk's budget) passes. Every check is a few dictionary and set lookups per
word, and the path checks use the disk's cached listings (microseconds per candidate).

`UserArguments` holds the hosts, modules and variables the user's own successful commands named,
so that `ssh build01` or `python -m myapp` pass once the user typed them.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from calmd.suggest.filters import _typed_in_full, flag_name, segments, split_words

if TYPE_CHECKING:
    from calmd.suggest.filters import UserVocabulary, Vocabulary

# Whether a path relative to the cwd (or absolute) exists: True, False, or None when that cannot
# be known in time (calmd/suggest/disk.py `Disk.exists` bound to the request's cwd).
Exists = Callable[[str], "bool | None"]

# Extensions that make a word a file's name (`README.md`, `index.html`), not a module, a host or
# a subcommand. Not `.com`, `.org`, `.io`, `.sh`-like top-level domains that are also hosts' ends:
# `.sh` and `.py` are kept (a host named x.py is rarer than a script).
FILE_EXTENSIONS = frozenset({
    "md", "rst", "txt", "csv", "tsv", "json", "jsonl", "yaml", "yml", "toml", "ini", "cfg", "conf", "lock",
    "py", "pyc", "pyi", "ipynb", "js", "mjs", "ts", "tsx", "jsx", "css", "scss", "html", "htm", "xml",
    "c", "h", "cc", "cpp", "hpp", "rs", "go", "java", "rb", "php", "pl", "lua", "sh", "bash", "zsh",
    "log", "out", "tmp", "bak", "swp", "pdf", "png", "jpg", "jpeg", "gif", "svg", "mp3", "mp4", "zip",
    "gz", "tgz", "bz2", "xz", "tar", "whl", "deb", "rpm", "iso", "img", "sql", "db", "sqlite", "sqlite3",
    "env", "pem", "key", "crt", "patch", "diff",
})  # fmt: skip
PYTHON_SCRIPTS = frozenset({"py", "pyw", "pyz"})
PYTHONS = re.compile(r"(python|python[23](\.\d+)?|pypy3?|py)\Z")
# Modules people run with `python -m` beyond the standard library (`sys.stdlib_module_names`)
RUNNABLE_MODULES = frozenset({
    "pip", "pytest", "venv", "virtualenv", "black", "isort", "mypy", "ruff", "flake8", "pylint", "pyflakes",
    "coverage", "build", "twine", "pipx", "poetry", "uv", "tox", "nox", "jupyter", "notebook", "jupyterlab",
    "ipykernel", "IPython", "uvicorn", "gunicorn", "flask", "django", "streamlit", "celery", "mkdocs",
    "sphinx", "pre_commit", "setuptools", "wheel", "nuitka", "PyInstaller", "cProfile", "pdb", "ensurepip",
    "spacy", "nltk", "torch", "tensorboard", "transformers", "grpc_tools", "pyright", "bandit", "pydoc",
    "rich", "textual", "locust", "alembic", "scrapy", "httpie", "http", "json", "unittest", "doctest",
})  # fmt: skip
STANDARD_MODULES = frozenset(getattr(sys, "stdlib_module_names", ()))
HOST_COMMANDS = frozenset(
    {"ssh", "mosh", "ping", "ping6", "telnet", "traceroute", "tracepath", "mtr", "sftp"}
)
# Flags that take the next word as their value (that word is not judged as the argument)
VALUE_FLAGS: dict[str, frozenset[str]] = {
    key: frozenset(flags.split())
    for key, flags in {
        "ssh": "-i -p -l -o -F -J -L -R -D -b -c -E -e -I -m -O -Q -S -W -w -B",
        "mosh": "-p --ssh --port",
        "sftp": "-i -P -o -F -J -b -c -l -S -R -B -D -s",
        "scp": "-i -P -o -F -J -l -c -S",
        "ping": "-c -i -W -w -s -t -I -l -M -p -Q -S -m",
        "ping6": "-c -i -W -w -s -t -I -l -M -p -Q -S -m",
        "traceroute": "-f -m -p -q -w -i -s -z",
        "kill": "-s -n",
        "mv": "-t -S --target-directory --suffix",
        "cp": "-t -S --target-directory --suffix",
        "ln": "-t -S --target-directory --suffix",
        "ls": "-I -T -w --hide --ignore",
        "du": "-d -B -t --exclude",
        "chmod": "--reference",
        "chown": "--reference",
        "git add": "--chmod --pathspec-from-file",
        "docker build": "-t -f --tag --file --build-arg --target --platform --network --label -o --output "
        "--progress --secret --ssh --cache-from --cache-to",
        "curl": "-o -X -H -d -u -A -e -F -T -w -m -b -c -K -x -r -E --data --data-raw --data-binary --header "
        "--request --output --user --user-agent --max-time --connect-timeout --cookie --form --cacert "
        "--cert --key --proxy --retry --resolve",
        "wget": "-O -o -P -U -t -T -e -i -a -l -Q --header --user --password --output-document "
        "--directory-prefix --user-agent --tries --timeout --input-file",
    }.items()
}
# Commands whose every word that is no flag names an existing path; `chmod` and `chown` after
# their first (the mode, the owner); `mv`, `cp`, `scp`, `rsync`: only the first (the source)
ALL_PATHS = frozenset({"rm", "rmdir", "ls", "du", "stat", "file", "git add"})
AFTER_FIRST = frozenset({"chmod", "chown", "chgrp"})
FIRST_PATH = frozenset({"mv", "cp", "rsync", "scp", "ln", "docker build"})
URL_COMMANDS = frozenset({"curl", "wget"})
VARIABLE_COMMANDS = frozenset({"export", "unset"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TAR_OPS = "ctxruAd"
_TAR_MODIFIERS = "vzjJfpkmOSWPhaZ"
_TAR_BUNDLE = re.compile(rf"[{_TAR_MODIFIERS}]*[{_TAR_OPS}][{_TAR_MODIFIERS}]*\Z")
_MODE = re.compile(r"([ugoa]*[-+=][rwxXstugo]*)(,[ugoa]*[-+=][rwxXstugo]*)*\Z|[0-7]{3,4}\Z")
_SIGNAL = re.compile(r"-(\d{1,2}|(SIG)?[A-Z][A-Z0-9+-]*)\Z")
_PID = re.compile(r"(\d+|%\S*|\$\S+|-1)\Z")
_UNCHECKABLE = set("$`*?[]{}~'\"\\<>=()!")
# Where a trailing bare `-` is a whole argument (the previous folder, branch, stdin)
_DASH_ARGUMENT = frozenset({"cd", "su", "git checkout", "git switch", "cat", "pushd"})


def file_like(word: str) -> bool:
    """Whether `word` reads as a file's name: a known extension after a dot (`index.html`), not a
    URL (`https://x.io/a.html` is judged as a URL elsewhere)."""
    if "://" in word:
        return False
    stem, dot, ext = word.rstrip("/").rpartition(".")
    return bool(dot) and bool(stem) and ext.lower() in FILE_EXTENSIONS


def host_like(host: str) -> bool:
    """Whether `host` has a host's shape without the user's help: an IP address, `localhost`, or a
    dotted name that is not a file's (`build01.example.net`, not `notes.txt`)."""
    if host == "localhost" or host.endswith(".local"):
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        pass
    return (
        "." in host.strip(".") and not file_like(host) and re.fullmatch(r"[A-Za-z0-9.-]+", host) is not None
    )


def _url_like(word: str) -> bool:
    """A URL or a host with a path (`https://x.io/a`, `localhost:8000/api`, `x.io`), or what the
    shell fills in (`$URL`): not a bare word (`wget update`)."""
    if "://" in word or "$" in word or word.startswith(("'", '"')):
        return True
    host = word.split("/", 1)[0].split(":", 1)[0].rsplit("@", 1)[-1]
    return host_like(host)


def _host_of(word: str, scp: bool = False) -> str | None:
    """The host in `user@host`, `host:path` (scp), or `word` itself; None for an scp word without a
    `:` (a local path)."""
    if scp:
        if ":" not in word or word.startswith(("/", ".")):
            return None
        word = word.split(":", 1)[0]
    return word.rsplit("@", 1)[-1]


class UserArguments:
    """The hosts, modules and variables the user's own successful commands named (see the module
    docstring), fed by the history index with each command that succeeded."""

    def __init__(self) -> None:
        self.hosts: set[str] = set()
        self.modules: set[str] = set()
        self.variables: set[str] = set()

    def add(self, cmd: str) -> None:
        for _, segment in segments(split_words(cmd)):
            for kind, word in _arguments(segment):
                {"host": self.hosts, "module": self.modules, "variable": self.variables}[kind].add(word)

    def knows(self, kind: str, word: str) -> bool:
        found = {"host": self.hosts, "module": self.modules, "variable": self.variables}.get(kind)
        return found is not None and word in found


def _arguments(segment: list[str]) -> list[tuple[str, str]]:
    """(kind, word) of the hosts, modules and variables a simple command names."""
    head, found = segment[0], []
    if head in HOST_COMMANDS or head == "scp":
        for word in _plain_arguments(segment, head)[: 1 if head != "scp" else None]:
            host = _host_of(word, scp=head == "scp")
            if host:
                found.append(("host", host))
    elif PYTHONS.match(head) and "-m" in segment[1:-1]:
        module = segment[segment.index("-m") + 1]
        found.append(("module", module.split(".", 1)[0]))
    elif head in VARIABLE_COMMANDS:
        found += [("variable", w.split("=", 1)[0]) for w in segment[1:] if not w.startswith("-")]
    return found


def _plain_arguments(segment: list[str], key: str) -> list[str]:
    """The words after the command (or `cmd sub` for a `key` of two words) that are neither a flag
    nor a flag's value."""
    values = VALUE_FLAGS.get(key, frozenset())
    words, skip = [], False
    for word in segment[len(key.split()) :]:
        if skip:
            skip = False
            continue
        if word.startswith("-") and len(word) > 1:
            skip = word in values
            continue
        words.append(word)
    return words


def wrong_kind(
    cmd: str, typed: str, *, exists: Exists | None = None, comp: Collection[str] = (),
    vocab: Vocabulary | None = None, user: UserVocabulary | None = None, mine: UserArguments | None = None,
) -> str | None:  # fmt: skip
    """Why a word of `cmd` (a model-only line for the input `typed`) stands where it cannot belong
    (the module docstring), or None. `exists`: the disk for the request's cwd (no path judged
    without it); `comp`: the COMP frame's items (a path COMP offered exists)."""
    words = split_words(cmd)
    if not words:
        return None
    typed_words = _typed_in_full(words, typed)
    last = words[-1]
    if last in ("-", "--") and len(words) > typed_words:
        head = " ".join(words[:2]) if len(words) > 2 else words[0]
        if last == "--" or (words[0] not in _DASH_ARGUMENT and head not in _DASH_ARGUMENT
                            and flag_name(words[-2]) is None):  # fmt: skip
            return f"cut off at {last!r}"
    for offset, segment in segments(words):
        if offset + len(segment) <= typed_words:
            continue  # all of it typed by the user
        reason = _segment(segment, max(0, typed_words - offset), exists, comp, vocab, user, mine)
        if reason is not None:
            return reason
    return None


def _segment(
    segment: list[str], typed: int, exists: Exists | None, comp: Collection[str], vocab: Vocabulary | None,
    user: UserVocabulary | None, mine: UserArguments | None,
) -> str | None:  # fmt: skip
    head = segment[0]
    key = f"{head} {segment[1]}" if len(segment) > 1 else head

    def untyped(word: str, pos: int) -> bool:
        return pos >= typed

    def position(word: str, start: int = 1) -> int:
        return segment.index(word, start)

    # a file name where the corpus expects a subcommand or a resource (`kubectl get index.html`)
    if vocab is not None:
        for pos, k in ((1, head), (2, key)):
            if len(segment) > pos and untyped(segment[pos], pos) and k in vocab.judged:
                word = segment[pos]
                known = word in vocab.known.get(k, ()) or (user is not None and user.has(k, word))
                if not known and not word.startswith("-") and (file_like(word) or word.endswith("/")):
                    return f"file {word!r} where {k} takes a subcommand"
            if len(segment) <= pos or not segment[pos].isidentifier():
                break
    if head == "tar" and len(segment) > 1 and untyped(segment[1], 1):
        first = segment[1]
        if not first.startswith("-") and not _TAR_BUNDLE.match(first):
            return f"{first!r} is no tar operation"
    elif head == "kill":
        ended = False  # after `--` only pids
        args = segment[1:]
        i = 0
        while i < len(args):
            word = args[i]
            if untyped(word, i + 1):
                if not ended and word in ("-s", "-n") and i + 1 < len(args):
                    i += 2
                    continue
                if not ended and (word in ("-l", "-L", "--list", "--table") or _SIGNAL.match(word)):
                    pass
                elif word == "--":
                    ended = True
                elif not _PID.match(word):
                    return f"{word!r} is no signal, pid or job"
            i += 1
    elif head in VARIABLE_COMMANDS:
        for i, word in enumerate(segment[1:], 1):
            if not untyped(word, i) or word.startswith("-"):
                continue
            name, eq, _ = word.partition("=")
            if not _IDENTIFIER.match(name):
                return f"{word!r} is no variable"
            if not eq and name != name.upper() and not (mine is not None and mine.knows("variable", name)):
                return f"{word!r} is no variable the user set"
    elif head in HOST_COMMANDS or head == "scp":
        args = _plain_arguments(segment, head)
        for word in args[: 1 if head != "scp" else None]:
            pos = position(word)
            host = _host_of(word, scp=head == "scp")
            if host is None or not untyped(word, pos) or "$" in host:
                continue
            if host_like(host) or (mine is not None and mine.knows("host", host)):
                continue
            return f"{host!r} is no host"
    elif head in URL_COMMANDS:
        for word in _plain_arguments(segment, head)[:1]:
            if untyped(word, position(word)) and not _url_like(word):
                return f"{word!r} is no URL"
    elif PYTHONS.match(head):
        reason = _python(segment, untyped, exists, comp, mine)
        if reason is not None:
            return reason
    if exists is None:
        return None
    path_key = key if key in ALL_PATHS or key in FIRST_PATH or key in AFTER_FIRST else head
    if path_key in ALL_PATHS or path_key in AFTER_FIRST or path_key in FIRST_PATH:
        args = _plain_arguments(segment, path_key)
        if path_key in AFTER_FIRST:
            args = args[1:]
        elif path_key in FIRST_PATH:
            args = args[:1]
        for word in args[:4]:
            pos = position(word, len(path_key.split()))
            if not untyped(word, pos) or word in (".", "..", "/") or word in comp:
                continue
            if path_key == "scp" and ":" in word:
                continue
            if _UNCHECKABLE.intersection(word) or word.startswith("-"):
                continue
            if _missing(word, exists):
                return f"{word!r} names nothing in the cwd"
    return None


def _missing(word: str, exists: Exists) -> bool:
    """Whether the path `word` is known to be missing: itself, or (a folder that cannot be listed
    tells nothing of its entries) the first folder of a relative path (`Documents/` of
    `Documents/report.pdf`)."""
    found = exists(word)
    if found is None and "/" in word.strip("/") and not word.startswith("/"):
        found = exists(word.split("/", 1)[0] + "/")
    return found is False


def _python(
    segment: list[str], untyped: Callable[[str, int], bool], exists: Exists | None, comp: Collection[str],
    mine: UserArguments | None,
) -> str | None:  # fmt: skip
    """`python -m MODULE` names a module; `python SCRIPT` a Python file."""
    for i, word in enumerate(segment[1:], 1):
        if word == "-c":
            return None  # a program follows, not a module nor a script
        if word == "-m":
            if i + 1 >= len(segment) or not untyped(segment[i + 1], i + 1):
                return None
            module = segment[i + 1]
            return None if _module(module, exists, comp, mine) else f"{module!r} is no module"
        if word.startswith("-"):
            continue
        if untyped(word, i) and file_like(word) and word.rsplit(".", 1)[1].lower() not in PYTHON_SCRIPTS:
            return f"{word!r} is no Python script"
        return None
    return None


def _module(module: str, exists: Exists | None, comp: Collection[str], mine: UserArguments | None) -> bool:
    """Whether `module` can be a module `python -m` runs (the module docstring)."""
    if module.startswith("-") or "$" in module:
        return True
    if "/" in module or file_like(module) or not all(p.isidentifier() for p in module.split(".")):
        return False
    top = module.split(".", 1)[0]
    if top in STANDARD_MODULES or top in RUNNABLE_MODULES or (mine is not None and mine.knows("module", top)):
        return True
    if top in comp or f"{top}/" in comp or f"{top}.py" in comp:
        return True
    if exists is None:
        return True  # nothing to judge by
    found = [exists(p) for p in (f"{top}.py", f"{top}/", f"src/{top}/")]
    return any(f is not False for f in found)
