"""The files and directories a user's earlier commands created or named, replayed from a history.

A history file records commands, not the disk. To give the corpus and `calm replay --comp` a COMP
frame built the way the daemon builds it (calmd/suggest/frames.py), `Reconstruction` keeps what
the commands so far tell about the file system: `mkdir`, `touch`, `git clone`, `python -m venv`,
the target of `cp`/`mv` and of `>`/`>>` redirections create; `cd`, editors, pagers, interpreters
and the other arguments of `cp`/`mv` name something that exists; `rm`/`rmdir` remove. It also
follows the active virtualenv or conda env (`source X/bin/activate`, `conda activate X`) for ENV.

What it cannot know (docs/quality.md): every path is taken relative to one directory (a history
has no cwd, so `cd src` and then `vim main.py` puts main.py beside src/, not in it); absolute paths,
`~`, globs and variables are ignored; files that programs create (`make`, `tar x`, `unzip`,
downloads) and everything on the disk that no command named are missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from calmd.suggest.frames import SEPARATORS, short_env

CREATE_DIRS = frozenset({"mkdir"})
CREATE_FILES = frozenset({"touch"})
NAME_DIRS = frozenset({"cd", "pushd", "ls", "tree"})
NAME_FILES = frozenset({
    "vim", "vi", "nvim", "nano", "emacs", "code", "less", "more", "cat", "bat", "head", "tail", "source",
    ".", "python", "python3", "bash", "sh", "zsh", "node", "chmod", "wc", "diff", "open", "xdg-open",
})  # fmt: skip
REMOVE = frozenset({"rm", "rmdir", "unlink"})
COPY = frozenset({"cp", "mv", "rsync"})
MAX_PATHS = 20_000  # per user: the oldest names are forgotten past this
_SAFE = re.compile(r"[\w.+@%,:=-][\w.+@%,:=/-]*\Z")  # a plain relative path: no glob, variable, quote


def _plain(path: str) -> str | None:
    """A relative path this reconstruction can place, normalised (`./a//b/` -> `a/b`), else None."""
    if not path or path.startswith(("/", "~", "-")) or not _SAFE.match(path):
        return None
    parts = [p for p in path.split("/") if p and p != "."]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def named_paths(cmd: str) -> Iterator[tuple[str, bool, str]]:
    """(path, is a directory, what happens: `create` | `name` | `remove`) for each path a command
    names, in order."""
    words = cmd.split()
    start = 0
    for i in range(len(words) + 1):
        if i == len(words) or words[i] in SEPARATORS:
            yield from _segment(words[start:i])
            start = i + 1


def _segment(words: Sequence[str]) -> Iterator[tuple[str, bool, str]]:
    args: list[str] = []
    redirect_next = False
    for word in words:  # redirections first: `echo x > notes.md` creates notes.md
        if redirect_next:
            redirect_next = False
            path = _plain(word)
            if path:
                yield path, False, "create"
            continue
        match = re.match(r"\d?>>?(.*)\Z", word)
        if match:
            if match.group(1) and not match.group(1).startswith("&"):
                path = _plain(match.group(1))
                if path:
                    yield path, False, "create"
            elif not match.group(1):
                redirect_next = True
            continue
        args.append(word)
    while args and args[0] in ("sudo", "doas", "time", "nohup", "command", "exec"):
        args = args[1:]
    if not args:
        return
    head, rest = args[0], [a for a in args[1:] if not a.startswith("-")]
    if head in CREATE_DIRS:
        for a in rest:
            if (p := _plain(a)) is not None:
                yield p, True, "create"
    elif head in CREATE_FILES:
        for a in rest:
            if (p := _plain(a)) is not None:
                yield p, False, "create"
    elif head in NAME_DIRS:
        for a in rest[:1] if head in ("cd", "pushd") else rest:
            if (p := _plain(a)) is not None:
                yield p, True, "name"
    elif head in NAME_FILES:
        for a in rest[:4]:
            if (p := _plain(a)) is not None:
                yield p, a.endswith("/"), "name"
    elif head in REMOVE:
        for a in rest:
            if (p := _plain(a)) is not None:
                yield p, head == "rmdir", "remove"
    elif head in COPY and len(rest) >= 2:
        for a in rest[:-1]:
            if (p := _plain(a)) is not None:
                yield p, a.endswith("/"), "name"
        if (p := _plain(rest[-1])) is not None:
            yield p, rest[-1].endswith("/") or len(rest) > 2, "create"
    elif head == "git" and len(rest) >= 2 and rest[0] == "clone":
        target = rest[2] if len(rest) > 2 else rest[1].rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        target = target.removesuffix(".git")
        if (p := _plain(target)) is not None:
            yield p, True, "create"
    elif (
        head.startswith("python") and len(args) >= 4 and args[1:3] == ["-m", "venv"]
        and (p := _plain(args[3])) is not None
    ):  # fmt: skip
        yield p, True, "create"


class Reconstruction:
    """The directory tree the commands so far created or named (module docstring), and the env."""

    def __init__(self, max_paths: int = MAX_PATHS) -> None:
        self.max_paths = max_paths
        self._children: dict[str, dict[str, bool]] = {"": {}}  # dir -> {name: is_dir}, insertion order
        self._sorted: dict[str, tuple[str, ...]] = {}
        self._count = 0
        self.env = ""

    def has(self, path: str) -> bool:
        plain = _plain(path)
        if plain is None:
            return False
        parent, _, name = plain.rpartition("/")
        return name in self._children.get(parent, {})

    def listing(self, directory: str) -> tuple[str, ...] | None:
        """The entries of `directory` (relative, "" for the top), sorted, directories with `/`:
        the `Lister` that `calmd.suggest.frames.completions` reads."""
        key = _plain(directory) if directory else ""
        if key is None or key not in self._children:
            return None
        cached = self._sorted.get(key)
        if cached is None:
            children = self._children[key]
            cached = self._sorted[key] = tuple(sorted(n + "/" if d else n for n, d in children.items()))
        return cached

    def add_path(self, path: str, is_dir: bool) -> None:
        parts = path.split("/")
        parent = ""
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            children = self._children.setdefault(parent, {})
            directory = is_dir or not last
            if children.get(name) is None or (directory and not children[name]):
                if name not in children:
                    self._count += 1
                children[name] = directory
                self._sorted.pop(parent, None)
            here = f"{parent}/{name}" if parent else name
            if directory:
                self._children.setdefault(here, {})
            parent = here
        if self._count > self.max_paths:  # forget the top's oldest names (and what is under them)
            top = self._children[""]
            for name in list(top)[: len(top) // 2]:
                self._remove(name)

    def _remove(self, path: str) -> None:
        parent, _, name = path.rpartition("/")
        children = self._children.get(parent)
        if children is None or name not in children:
            return
        del children[name]
        self._count -= 1
        self._sorted.pop(parent, None)
        prefix = path + "/"
        for key in [k for k in self._children if k == path or k.startswith(prefix)]:
            self._count -= len(self._children.pop(key))
            self._sorted.pop(key, None)

    def add(self, cmd: str) -> None:
        """Take in one executed command (after it ran)."""
        for path, is_dir, what in named_paths(cmd):
            if what == "remove":
                self._remove(path)
            else:
                self.add_path(path, is_dir)
        words = cmd.split()
        if len(words) >= 2 and words[0] in ("source", ".") and words[1].endswith("/bin/activate"):
            self.env = short_env(words[1][: -len("/bin/activate")])
        elif words[:1] == ["deactivate"] or words[:2] == ["conda", "deactivate"]:
            self.env = ""
        elif len(words) >= 3 and words[:2] in (["conda", "activate"], ["mamba", "activate"]):
            self.env = short_env(conda_env=words[2])
