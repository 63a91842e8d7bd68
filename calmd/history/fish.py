"""fish's history file (`~/.local/share/fish/fish_history`, `$XDG_DATA_HOME/fish/fish_history`):
`calm import` reads it, and the daemon's first start does when it is there.

The format fish 2 and 3 write, one entry per command, a YAML subset that fish reads itself:

    - cmd: echo one\\necho two
      when: 1732262400
      paths:
        - src/main.rs

`cmd` escapes a backslash as `\\\\` and a newline as `\\n` (a multi-line command is one entry);
`when` is seconds since the epoch; `paths` lists the arguments that were files (not kept:
the store keeps commands). Lines of any other shape (fish 1's `# <when>` format, a line cut short
by a crash) are passed over, never an error. Bytes that are not UTF-8 are kept as U+FFFD, as for
bash and zsh (calmd/history/store.py).

fish rewrites its file (merging shells, dropping older duplicates of a command), so a byte offset
does not say what was read before. The import remembers instead the newest `when` it read and how
many entries had that time: the next import takes the entries after them (a command run again
comes back with a new `when`, and is imported as a new run).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from calmd.errors import CalmError
from calmd.history.store import HistoryStore, ImportResult

log = logging.getLogger("calmd.history.fish")

CMD, WHEN = b"- cmd: ", b"  when: "
MAX_FILE_BYTES = 1 << 30  # a history file is megabytes; a gigabyte is not one


def default_path(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    data = environ.get("XDG_DATA_HOME") or os.path.join(environ.get("HOME", "~"), ".local", "share")
    return Path(data).expanduser() / "fish" / "fish_history"


def is_fish_history(raw: bytes) -> bool:
    """Whether `raw` starts like a fish history (its first non-blank line is a `- cmd:`)."""
    for line in raw[:4096].split(b"\n"):
        if line.strip():
            return line.startswith(CMD)
    return False


def unescape(raw: bytes) -> bytes:
    """fish's escapes in `cmd`: `\\\\` is a backslash, `\\n` a newline; any other backslash stays."""
    if b"\\" not in raw:
        return raw
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 0x5C and i + 1 < len(raw) and raw[i + 1] in b"\\n":
            out += b"\\" if raw[i + 1] == 0x5C else b"\n"
            i += 2
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def parse_fish_history(raw: bytes) -> Iterator[tuple[float | None, str]]:
    """(when or None, command) per entry, in file order."""
    cmd: bytes | None = None
    when: float | None = None
    for line in raw.split(b"\n"):
        line = line[:-1] if line.endswith(b"\r") else line
        if line.startswith(CMD):
            if cmd is not None:
                yield when, cmd.decode("utf-8", "surrogateescape")
            cmd, when = unescape(line[len(CMD) :]), None
        elif line.startswith(WHEN) and cmd is not None:
            try:
                when = float(int(line[len(WHEN) :].strip()))
            except ValueError:
                when = None
    if cmd is not None:
        yield when, cmd.decode("utf-8", "surrogateescape")


def _position(text: str | None) -> tuple[float, int]:
    """(newest `when` imported, entries with that `when` imported), from the store's mark."""
    if text and text.startswith("fish:"):
        try:
            when, count = text[len("fish:") :].split(":")
            return float(when), int(count)
        except ValueError:
            pass
    return float("-inf"), 0


def import_fish_history(store: HistoryStore, path: str | os.PathLike[str]) -> ImportResult:
    """Import the entries of a fish history file that the previous import of it did not read."""
    p = Path(path).expanduser()
    if p.stat().st_size > MAX_FILE_BYTES:
        raise CalmError(f"{p}: {p.stat().st_size} bytes is too large for a fish history")
    raw = p.read_bytes()
    if raw.strip() and not is_fish_history(raw):
        raise CalmError(f"{p}: not a fish history (no `- cmd:` entry first)")
    last, seen = _position(store.import_position(p))
    entries = list(parse_fish_history(raw))
    stamps = [when if when is not None else float("-inf") for when, _ in entries]  # no time: oldest
    new: list[tuple[float | None, str]] = []
    at_last = 0
    for stamp, entry in zip(stamps, entries, strict=True):
        if stamp < last:
            continue
        if stamp == last:
            at_last += 1
            if at_last <= seen:
                continue
        new.append(entry)
    newest = max(stamps, default=last)
    newest = max(newest, last)
    mark = f"fish:{newest}:{sum(1 for s in stamps if s == newest) if newest != last else max(seen, at_last)}"
    return store.import_entries(p, "fish", new, position=mark)


def import_first_start(store: HistoryStore, path: Path | None = None) -> ImportResult | None:
    """What the daemon does at start for a fish user, as it imports ~/.bash_history and
    ~/.zsh_history at its first start: import fish's history file once (a file it never read).
    A file that cannot be read is logged (its path and the error's type, never its text); this
    never fails."""
    p = path or default_path()
    try:
        if not p.is_file() or store.import_position(p) is not None:
            return None
        result = import_fish_history(store, p)
    except Exception as exc:  # the daemon starts whatever the file holds
        log.warning("could not import %s: %s", p, type(exc).__name__)
        return None
    log.info("imported %d commands from %s (%d dropped as credentials)", result.imported, p,
             result.dropped_secrets)  # fmt: skip
    return result
