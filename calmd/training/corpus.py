"""Training corpora for the default model, built from the public data in shared/data.

The shared data folder (`DEFAULT_DATA`, `../shared/data` beside the repository) holds the tldr
pages and the public histories, one user per file; `held_out()` fixes which users no shipped
artifact (the default model, the ranker, the calibration, the vocabulary) is built from, so that
`calm replay --held-out` measures users none of them has seen.

Two sources (calmd/data/DEFAULT_MODEL.md):
- tldr pages (CC-BY 4.0, the tldr-pages project): each example command becomes one training
  example. `{{placeholders}}` are filled with realistic values (`{{path/to/file}}` -> a file
  name, `{{port}}` -> 8080, ...), and `{{[-x|--long]}}` alternatives are resolved to one
  spelling, chosen at random but reproducibly (seeded).
- public shell histories (one command per line, oldest first): each command becomes an example
  whose context is the user's preceding commands (HIST frames; these files have no exit codes,
  cwd or git, so those frames are absent).
Both carry COMP and ENV frames built as the daemon builds them (calmd/suggest/frames.py, at the cut
`comp_cut` picks; one example in `COMP_DROPPED` goes without COMP, as some keystrokes are served):
the files and directories come from what the user's earlier commands created or
named (calmd/suggest/reconstruct.py) plus what the command itself names as existing (the real disk
has those too); for a tldr example, what it names plus a few unrelated names of `FILES` and `DIRS`.
Commands ("PATH") are the tldr page names and the vocabulary's commands; subcommands and options
come from the packaged vocabulary (calmd/data/vocabulary.json). ENV follows `source .../activate`
and `conda activate` in the histories.
Personal names, hosts, e-mail and IP addresses are scrubbed from history commands before they
are used (`scrub`), so the shipped model cannot reproduce them verbatim.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from calmd import paths
from calmd.errors import CalmError
from calmd.formats.tokenizer import Example, HistoryEntry
from calmd.history.formats import detect_format, parse_history
from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.frames import VocabularyFollowers, comp_cut, completions, context_frames
from calmd.suggest.reconstruct import Reconstruction, named_paths

DEFAULT_DATA = paths.PACKAGE_DATA.parent.parent.parent / "shared" / "data"


def held_out(user_id: str) -> bool:
    """One user in five, fixed by the id alone: never in the default model's corpus, nor in the
    fits of the ranker, the calibration and the vocabulary."""
    return hashlib.sha256(user_id.encode()).digest()[0] % 5 == 0


def check_data(data: Path) -> None:
    """CalmError unless `data` is the shared data folder: tldr pages and public histories (a fresh
    clone has no ../shared beside it)."""
    users = data / "histories" / "users"
    if not data.is_dir() or not (data / "tldr").is_dir() or not any(users.glob("*.txt")):
        raise CalmError(
            f"{data}: not the shared data folder (it needs tldr/ and histories/users/*.txt): the "
            "corpus is built from it; give its folder with --data"
        )


def history_users(data: Path) -> list[Path]:
    """The public histories' files, one user each, in a fixed order."""
    return sorted((data / "histories" / "users").glob("*.txt"))


def read_history(path: Path) -> list[str]:
    """The commands of a history file, oldest first: one per line for the public .txt files, else
    as `calm import` reads a bash or zsh history."""
    raw = path.read_bytes()
    fmt = detect_format(raw)
    if fmt == "bash" and path.suffix == ".txt":
        return [line for line in raw.decode("utf-8", "replace").split("\n") if line.strip()]
    return [cmd for _, cmd in parse_history(raw, fmt) if cmd.strip()]


# --------------------------------------------------------------------------- tldr

_EXAMPLE_RE = re.compile(r"^`(.+)`\s*$")
_PLACEHOLDER_RE = re.compile(r"\{\{(.*?)\}\}(?!\})")
_ALTERNATIVES_RE = re.compile(r"^\[([^\[\]]*\|[^\[\]]*)\]$")  # {{[-x|--long]}}
_INLINE_ALT_RE = re.compile(r"\[((?:\.?[\w-]+\|)+\.?[\w-]+)\]")  # source.tar[.gz|.bz2|.xz]

FILES = [
    "notes.txt",
    "report.pdf",
    "main.py",
    "data.csv",
    "config.yaml",
    "index.html",
    "README.md",
    "app.log",
]
DIRS = ["src", "build", "docs", "project", "backup", "logs", "photos", "tmp/work"]
WORDS = {
    "username": ["alice", "bob", "deploy", "admin"],
    "user": ["alice", "bob", "deploy", "admin"],
    "password": ["$PASSWORD"],  # never teach a literal password
    "host": ["server.example.com", "localhost", "db.example.com"],
    "hostname": ["server.example.com", "localhost", "web01"],
    "domain": ["example.com", "example.org"],
    "url": ["https://example.com", "https://example.com/file.tar.gz"],
    "ip": ["192.168.1.10", "10.0.0.5", "127.0.0.1"],
    "port": ["8080", "22", "443", "5432"],
    "package": ["curl", "htop", "ripgrep", "requests", "nodejs"],
    "version": ["1.2.3", "2.0.0", "3.11"],
    "branch": ["main", "develop", "feature/login"],
    "commit": ["HEAD~1", "a1b2c3d", "HEAD"],
    "tag": ["v1.0.0", "latest", "v2.1"],
    "remote": ["origin", "upstream"],
    "image": ["ubuntu:22.04", "nginx", "python:3.11"],
    "container": ["web", "db", "app"],
    "pattern": ["TODO", "error", "'^import'"],
    "regex": ["'[0-9]+'", "'^foo'"],
    "message": ['"fix typo"', '"update docs"'],
    "command": ["ls -la", "make", "echo hello"],
    "name": ["myapp", "test", "backup"],
    "key": ["color", "name"],
    "value": ["true", "42", "blue"],
    "pid": ["1234", "4321"],
    "unit": ["nginx.service", "sshd", "docker"],
    "number": ["10", "5", "3"],
    "string": ['"hello"', "foo"],
    "keyword": ["network", "disk"],
    "variable": ["PATH", "HOME"],
    "database": ["mydb", "app_production"],
    "project": ["myproject", "webapp"],
    "email": ["user@example.com"],
    "device": ["/dev/sdb", "/dev/sda1"],
}


@dataclass(frozen=True)
class TldrExample:
    page: str
    description: str
    command: str  # with placeholders


def iter_tldr_pages(root: Path, platforms: Iterable[str] = ("common", "linux")) -> Iterator[TldrExample]:
    for platform in platforms:
        for page in sorted((root / platform).glob("*.md")):
            description = ""
            for line in page.read_text(errors="replace").splitlines():
                if line.startswith("- "):
                    description = line[2:].rstrip(":")
                match = _EXAMPLE_RE.match(line)
                if match:
                    yield TldrExample(page.stem, description, match.group(1))


def _value_for(inner: str, rng: random.Random) -> str:
    """A realistic value for the placeholder text `inner`."""
    alt = _ALTERNATIVES_RE.match(inner)
    if alt:
        options = [o for o in alt.group(1).split("|") if o]
        longs = [o for o in options if o.startswith("--")]
        # Prefer the long spelling 1 time in 3: histories mostly show short options.
        return rng.choice(longs) if longs and rng.random() < 0.34 else rng.choice(options)
    inner = _INLINE_ALT_RE.sub(lambda m: rng.choice(m.group(1).split("|")), inner)
    if "|" in inner and " " not in inner:  # {{amd64|arm64|386}}: one of the listed values
        return rng.choice([o for o in inner.split("|") if o] or [inner])
    if "..." in inner:  # {{path/to/file1 path/to/file2 ...}}: two items
        items = [w for w in inner.replace("...", "").split() if w]
        return " ".join(_value_for(w, rng) for w in items[:2])
    low = inner.lower()
    if low.startswith(("path/to/", "/path/to/")) or low.startswith("path/"):
        tail = low.split("/")[-1]
        if tail.startswith(("dir", "folder", "repo")) or "directory" in tail:
            return rng.choice(DIRS)
        stem, dot, ext = tail.partition(".")
        if dot and ext and ext.replace(".", "").isalnum():
            base = rng.choice(["archive", "photo", "output", "input", "document", "backup"])
            if stem in ("file", "target", "source", "output", "input", "image"):
                return f"{base}.{ext}"
            return f"{stem}.{ext}"
        return rng.choice(FILES)
    if re.fullmatch(r"-?\d+(\.\d+)?", inner) or re.fullmatch(r"/dev/\w+", inner):
        return inner
    if re.fullmatch(r"https?://\S+|\S+\.(com|org|net)\S*", inner):
        return inner
    for word, pool in WORDS.items():
        if word in low.replace("-", "_").split("_") or low.startswith(word):
            return rng.choice(pool)
    if low in ("n", "count", "seconds", "size", "width", "height", "lines", "depth"):
        return rng.choice(["10", "5", "100"])
    return inner.strip() or "x"  # a literal example value ({{ls -la}}) or a descriptive name


def fill_placeholders(command: str, rng: random.Random) -> str:
    """Replace every `{{...}}` in a tldr command with a concrete value."""
    return _PLACEHOLDER_RE.sub(lambda m: _value_for(m.group(1), rng), command)


@dataclass(frozen=True)
class CompSources:
    """Where corpus examples take COMP's commands and followers from (module docstring)."""

    commands: tuple[str, ...]  # sorted
    followers: VocabularyFollowers


def comp_sources(root: Path | None = None) -> CompSources:
    """The tldr page names under `root` (if given) and the packaged vocabulary's commands."""
    from calmd.suggest.filters import packaged_vocabulary

    vocab = packaged_vocabulary()
    names = {k for k in vocab.known if " " not in k}
    if root is not None:
        names |= {page.stem for platform in ("common", "linux") for page in (root / platform).glob("*.md")}
    return CompSources(tuple(sorted(names)), VocabularyFollowers(vocab.known, static=1))


# One example in COMP_DROPPED goes without its COMP frame, as the daemon serves some keystrokes: a
# shell that sent no PATH, an alias or function no PATH lists, a directory too slow to list. A
# model that only ever saw one-word commands with a COMP frame learned that a missing frame means
# more words follow (its end-of-line probability after a one-word command: 0.10 without the frame,
# 0.59 with it; `python bench/comp_probe.py`, docs/quality.md).
COMP_DROPPED = 5


def comp_dropped(cmd: str, index: int) -> bool:
    """Whether the corpus example `index` (its position in its source) goes without COMP: a hash,
    so the corpus stays deterministic and a command repeated in a history keeps it elsewhere."""
    digest = hashlib.blake2b(f"{index}\0{cmd}".encode("utf-8", "surrogatepass"), digest_size=2).digest()
    return int.from_bytes(digest, "little") % COMP_DROPPED == 0


def example_completions(cmd: str, disk: Reconstruction, sources: CompSources, index: int) -> list[str]:
    """COMP for corpus example `index`: at `comp_cut(cmd)`, from `disk` (none if `comp_dropped`)."""
    if comp_dropped(cmd, index):
        return []
    return completions(comp_cut(cmd), lister=disk.listing, commands=sources.commands,
                       followers=sources.followers)  # fmt: skip


def tldr_examples(
    root: Path, *, seed: int = 0, variants: int = 1, sources: CompSources | None = None
) -> Iterator[Example]:
    """One Example per tldr command (and per variant): a plausible cwd, and COMP from a disk that
    holds what the command names (not what it creates) and a few unrelated names."""
    rng = random.Random(seed)
    disk_rng = random.Random(seed + 1)  # its own stream: the placeholders stay as they were
    sources = sources or comp_sources(root)
    for index, ex in enumerate(iter_tldr_pages(root)):
        for variant in range(variants):
            cmd = fill_placeholders(ex.command, rng)
            if "\n" in cmd or not cmd.strip():
                continue
            cwd = rng.choice(["/home/user", "/home/user/project", "/tmp", "/var/log", "/etc"])
            disk = Reconstruction()
            for name in disk_rng.sample(FILES, 3) + disk_rng.sample(DIRS, 2):
                disk.add_path(name.split("/")[0], name in DIRS)
            for path, is_dir, what in named_paths(cmd):
                if what != "create":
                    disk.add_path(path, is_dir)
            comp = example_completions(cmd, disk, sources, index * variants + variant)
            fields = context_frames(cwd=cwd, completions=comp)
            yield Example(fields, cmd)


# --------------------------------------------------------------------------- histories

_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(\.[\w-]+)+\b")
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
_HOME = re.compile(r"(/home/|/Users/)([^/\s'\"]+)")
_SSH_TARGET = re.compile(r"\b([\w.-]+)@([\w.-]+)")
_URL_HOST = re.compile(r"(https?://)([^/\s'\"]+)")
_HOSTNAME = re.compile(r"\b(?:[a-z0-9-]+\.)+(?:com|net|org|io|dev|co|uk|de|fr|ru|cn|in|edu|gov|local|lan)\b")
_KEEP_HOSTS = {
    "github.com", "gitlab.com", "bitbucket.org", "pypi.org", "npmjs.com", "registry.npmjs.org", "docker.io",
    "example.com", "example.org", "localhost", "google.com", "archlinux.org", "ubuntu.com", "debian.org",
    "raw.githubusercontent.com", "brew.sh", "python.org", "nodejs.org", "rust-lang.org", "kernel.org",
}  # fmt: skip


def scrub(cmd: str, names: Iterable[str] = ()) -> str:
    """Replace what identifies a person or a machine: e-mail and IP addresses, user names in home
    paths and ssh targets, private host names (well-known public hosts stay), and `names`."""
    # git@github.com:owner/repo is an address of a public host, not a person's e-mail.
    out = _EMAIL.sub(lambda m: m.group(0) if m.group(0).startswith("git@") and _public(m.group(0)[4:])
                     else "user@example.com", cmd)  # fmt: skip
    out = _IPV4.sub(lambda m: "127.0.0.1" if m.group(0).startswith("127.") else "192.168.1.10", out)
    out = _HOME.sub(lambda m: m.group(1) + "user", out)
    out = _URL_HOST.sub(lambda m: m.group(1) + (m.group(2) if _public(m.group(2)) else "example.com"), out)
    out = _SSH_TARGET.sub(_scrub_ssh_target, out)
    out = _HOSTNAME.sub(lambda m: m.group(0) if _public(m.group(0)) else "example.com", out)
    for name in names:
        if len(name) >= 3:
            out = re.sub(re.escape(name), "user", out, flags=re.IGNORECASE)
    return out


def _scrub_ssh_target(m: re.Match[str]) -> str:
    user, host = m.group(1), m.group(2)
    if user == "git" and _public(host):  # git@github.com:owner/repo
        return m.group(0)
    return "user@" + (host if _public(host) else "server.example.com")


def _public(host: str) -> bool:
    host = host.lower().split(":")[0]
    return host in _KEEP_HOSTS or any(host.endswith("." + h) for h in _KEEP_HOSTS)


def history_examples(
    commands: list[str], *, context: int = HISTORY_FRAMES, names: Iterable[str] = (), max_dup: int = 3,
    sources: CompSources | None = None,
) -> Iterator[Example]:  # fmt: skip
    """One Example per command, with up to `context` preceding commands as HIST frames, and with
    COMP and ENV when `sources` is given (module docstring). A command is used at most `max_dup`
    times as a target, with different contexts (calm dataset --max-dup)."""
    names = list(names)
    clean = [scrub(c, names) for c in commands]
    seen: dict[str, int] = {}
    disk = Reconstruction()
    for i, cmd in enumerate(clean):
        env = disk.env
        usable = len(cmd.strip()) >= 2 and "\\n" not in cmd  # joined multi-line entries are no commands
        if usable:
            seen[cmd] = seen.get(cmd, 0) + 1
        if usable and seen[cmd] <= max_dup:
            comp: list[str] = []
            if sources is not None:
                for path, is_dir, what in named_paths(cmd):
                    if what == "name":  # it exists when the command is typed: the real disk has it
                        disk.add_path(path, is_dir)
                comp = example_completions(cmd, disk, sources, i)
            hist = [HistoryEntry(c) for c in clean[max(0, i - context) : i]]
            fields = context_frames(completions=comp, env=env if sources is not None else "")
            if hist:
                fields["history"] = hist
            yield Example(fields, cmd)
        if sources is not None:
            disk.add(cmd)
