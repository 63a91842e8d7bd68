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
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from calmd.history.store import (  # the checks and bounds bash's and zsh's imports are held to
    MAX_IMPORT_BYTES,
    HistoryStore,
    ImportResult,
    NotAHistory,
    open_regular,
    refusal,
)

log = logging.getLogger("calmd.history.fish")

CMD, WHEN = b"- cmd: ", b"  when: "


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
    """(newest `when` imported, entries with that `when` imported), from the store's mark
    (`fish:<when>:<count>`, and `:done` after the last entry of an import that was not stopped)."""
    if text and text.startswith("fish:"):
        try:
            when, count = text[len("fish:") :].split(":")[:2]
            return float(when), int(count)
        except ValueError:
            pass
    return float("-inf"), 0


def import_fish_history(
    store: HistoryStore, path: str | os.PathLike[str], *, max_bytes: int = MAX_IMPORT_BYTES,
    stop: threading.Event | None = None,
) -> ImportResult:  # fmt: skip
    """Import the entries of a fish history file that the previous import of it did not read.

    Held to what bash's and zsh's imports are (calmd/history/store.py `import_file`): a regular
    file only; refused whole (NotAHistory) when it is not a history (NUL runs, binary data); at
    most its newest `max_bytes` read (fish keeps 256,000 entries at most: a few MB); committed in
    batches, the new entries in time order so that each batch's mark is where the next import
    (or this one, stopped by `stop`) goes on."""
    p = Path(path).expanduser()
    with open_regular(p) as f:
        fd = f.fileno()
        st = os.fstat(fd)
        region = max(0, st.st_size - max_bytes)
        reason = refusal(fd, region, st.st_size)
        raw = os.pread(fd, st.st_size - region, region) if reason is None else b""
    if reason is not None:
        raise NotAHistory(f"{p}: not a shell history ({reason}); nothing was imported from it")
    if region:  # cut inside an entry: the first whole one starts at a `- cmd:` line
        at = raw.find(b"\n" + CMD)
        raw = raw[at + 1 :] if at >= 0 else b""
    if raw.strip() and not is_fish_history(raw):
        raise NotAHistory(f"{p}: not a fish history (no `- cmd:` entry first); give fish's fish_history")
    last, seen = _position(store.import_position(p))
    entries = list(parse_fish_history(raw))
    new: list[tuple[float, float | None, str]] = []
    at_last = 0
    for when, cmd in entries:
        stamp = float("-inf") if when is None else when  # an entry without a time: the oldest
        if stamp < last:
            continue
        if stamp == last:
            at_last += 1
            if at_last <= seen:
                continue
        new.append((stamp, when, cmd))
    new.sort(key=lambda entry: entry[0])  # stable: file order within a second
    marked: list[tuple[float | None, str, str]] = []
    count = 0
    for i, (stamp, when, cmd) in enumerate(new):
        count = count + 1 if i and stamp == new[i - 1][0] else (seen + 1 if stamp == last else 1)
        marked.append((when, cmd, f"fish:{stamp}:{count}" + (":done" if i == len(new) - 1 else "")))
    return replace(store.import_entries(p, "fish", marked, st.st_mtime, stop), skipped_bytes=region)


def import_first_start(
    store: HistoryStore, path: Path | None = None, stop: threading.Event | None = None
) -> ImportResult | None:
    """What the daemon does at start for a fish user, as it imports ~/.bash_history and
    ~/.zsh_history at its first start: import fish's history file while it was never read
    whole (an import stopped by `stop` goes on at the next start). A file that cannot be read or
    is not a history is logged (its path and why, never its text); this never fails."""
    p = path or default_path()
    try:
        mark = store.import_position(p)
        if not p.is_file() or (mark is not None and mark.endswith(":done")):
            return None
        result = import_fish_history(store, p, stop=stop)
    except NotAHistory as exc:
        log.warning("did not import %s", exc)
        return None
    except Exception as exc:  # the daemon starts whatever the file holds
        log.warning("could not import %s: %s", p, type(exc).__name__)
        return None
    log.info("imported %d commands from %s (%d dropped as credentials)", result.imported, p,
             result.dropped_secrets)  # fmt: skip
    return result
