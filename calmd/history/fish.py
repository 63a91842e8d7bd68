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

import contextlib
import itertools
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from calmd.history.formats import (
    MAX_IMPORT_BYTES,
    TIME_DIGITS,
    NotAHistory,
    file_lines,
    open_regular,
    refusal,
)
from calmd.history.imports import (  # the checks and bounds bash's and zsh's imports are held to
    FileEntry,
    ImportResult,
    count_refused,
    import_entries,
    import_log_line,
    import_position,
)
from calmd.history.recorded import valid_time
from calmd.history.store import HistoryStore

log = logging.getLogger("calmd.history.fish")

CMD, WHEN = b"- cmd: ", b"  when: "
SPILL_CACHE_KIB = 4096  # the page cache of the file that sorts entries out of time order


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


def parse_when(value: bytes) -> int | None:
    """A `when:` value as fish writes it (whole seconds since the epoch), or None when it is not
    a time a command ran at: not digits (`soon`, `-5`, `1.5`), more than 12 of them (a 400-digit
    one), before 1970 or after 2100 (recorded.valid_time)."""
    digits = value.strip()
    if not digits.isdigit() or len(digits) > TIME_DIGITS:
        return None
    when = int(digits)
    return when if valid_time(when) else None


class RawEntry(NamedTuple):
    """One entry of fish's history file, as the import reads it."""

    when: int | None  # its time: its own `when`, else its neighbour's (`borrowed`); None: none known
    bad: bool  # a `when:` was there but impossible
    at: int  # the file offset of its command's text
    raw: bytes | None  # its escaped bytes; None: a line too long to be a command
    borrowed: bool = False  # `when` is the entry's before it (its own was missing or impossible)

    @property
    def damaged(self) -> bool:
        """It holds NUL bytes, as a crash leaves them (fish escapes every byte it writes)."""
        return self.raw is not None and b"\0" in self.raw


def raw_entries(lines: Iterable[tuple[int, bytes | None]]) -> Iterator[RawEntry]:
    """The entries of fish's history from its lines (offset, line without its newline or None when
    over MAX_ENTRY_BYTES), in file order, each with its own `when` (or None). Lines of another
    shape are passed over; a line too long to be anything fish writes is taken for a command too
    long to keep (an entry, skipped); a line of another shape that holds NULs (a crash's: fish
    writes none) is taken for a damaged entry (skipped and counted)."""
    entry: list[Any] | None = None  # [when, bad, offset, raw]
    for start, line in lines:
        if line is None or line.startswith(CMD):
            if entry is not None:
                yield RawEntry(*entry)
            entry = [None, False, start + len(CMD), None if line is None else line[len(CMD) :]]
        elif line.startswith(WHEN) and entry is not None:
            entry[0] = parse_when(line[len(WHEN) :])
            entry[1] = entry[0] is None
        elif b"\0" in line:
            if entry is not None:
                yield RawEntry(*entry)
            entry = None
            yield RawEntry(None, False, start, line)
    if entry is not None:
        yield RawEntry(*entry)


def _numbered(lines: Iterable[tuple[bytes | None, int]], start: int) -> Iterator[tuple[int, bytes | None]]:
    """formats.file_lines' (line, offset after it) as (offset of the line, line): the lines follow
    each other, so each starts where the one before ended."""
    at = start
    for line, after in lines:
        yield at, line
        at = after


def parse_fish_history(raw: bytes) -> Iterator[tuple[float | None, str]]:
    """(when or None, command) per entry of a fish history in memory, in file order (an
    impossible `when` is None; damaged entries left out)."""
    lines, at = [], 0
    for line in raw.split(b"\n"):
        lines.append((at, line[:-1] if line.endswith(b"\r") else line))
        at += len(line) + 1
    for entry in raw_entries(lines):
        if entry.raw is not None and not entry.damaged:
            text = unescape(entry.raw).decode("utf-8", "surrogateescape")
            yield None if entry.when is None else float(entry.when), text


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


def _new_entries(fd: int, region: int, size: int, last: float, seen: int) -> Iterator[RawEntry]:
    """The entries of the file's bytes [region, size) that the import takes, in file order: those
    after the store's mark (`last`, `seen`: `_position`). An entry without a time of its own takes
    the time of the entry before it (its place in the file: fish appends); the first ones, none
    (the import gives them the first time after them). Read a chunk at a time, never whole."""
    lines = _numbered(file_lines(fd, region, size), region)
    if region:  # cut inside an entry: the first whole one starts at a `- cmd:` line
        lines = itertools.dropwhile(lambda item: item[1] is not None and not item[1].startswith(CMD),
                                    itertools.islice(lines, 1, None))  # fmt: skip
    at_last = 0
    previous: int | None = None
    for entry in raw_entries(lines):
        if entry.when is not None:
            previous = entry.when
        elif previous is not None:
            entry = entry._replace(when=previous, borrowed=True)
        stamp = float("-inf") if entry.when is None else float(entry.when)  # no time: the oldest
        if stamp < last:
            continue
        if stamp == last:
            at_last += 1
            if at_last <= seen:
                continue
        yield entry


def import_fish_history(
    store: HistoryStore, path: str | os.PathLike[str], *, max_bytes: int = MAX_IMPORT_BYTES,
    stop: threading.Event | None = None, leave_after: float | None = None,
) -> ImportResult:  # fmt: skip
    """Import the entries of a fish history file that the previous import of it did not read.

    Held to what bash's and zsh's imports are (calmd/history/imports.py `import_file`): a regular
    file only; refused whole (NotAHistory) when it is not a history (binary data); entries a
    crash's NULs damaged skipped and counted; at most its newest `max_bytes` read (fish keeps
    256,000 entries at most: a few MB); committed in batches, the new entries in time order so
    that each batch's mark is where the next import (or this one, stopped by `stop`) goes on; an
    impossible `when` dropped and counted, the command kept and timed by its neighbour; entries
    timed at `leave_after` or later left to the hooks; the runs the hooks recorded already and
    the commands typed while recording was paused left out (calmd/history/coverage.py).

    Streamed, in memory that does not grow with the file: a first pass counts the new entries
    and sees whether they come in time order (fish appends: the usual case); then they are read
    again and stored as they come, or, out of order, their times and places go to a temporary
    SQLite file that gives them back sorted (`_sorted_entries`). Before issue 30 the file was
    read whole into lists: 640 MB for 16 MiB of 1.8 million `- cmd: ls` entries."""
    p = Path(path).expanduser()
    with open_regular(p) as f:
        fd = f.fileno()
        st = os.fstat(fd)
        region = max(0, st.st_size - max_bytes)
        reason = refusal(fd, region, st.st_size)
        if reason is not None:
            count_refused(store, p, reason)
            raise NotAHistory(f"{p}: not a fish history ({reason}); nothing was imported from it")
        if not region and (head := os.pread(fd, 4096, 0)).strip() and not is_fish_history(head):
            raise NotAHistory(f"{p}: not a fish history (no `- cmd:` entry first); give fish's fish_history")
        last, seen = _position(import_position(store, p))
        count, in_order, previous = 0, True, -1
        for entry in _new_entries(fd, region, st.st_size, last, seen):
            count += 1
            time_order = -1 if entry.when is None else entry.when  # an entry without a time: the oldest
            in_order, previous = in_order and time_order >= previous, time_order
        new = _new_entries(fd, region, st.st_size, last, seen)
        with contextlib.ExitStack() as cleanup:
            ordered = new if in_order else cleanup.enter_context(_sorted_entries(fd, new))
            entries = _marked(ordered, count, last, seen, leave_after)
            result = import_entries(store, p, "fish", entries, count, st.st_mtime, stop, mark_text)
    return replace(result, skipped_bytes=region)


@contextlib.contextmanager
def _sorted_entries(fd: int, entries: Iterable[RawEntry]) -> Iterator[Iterator[RawEntry]]:
    """`entries` in time order (file order within a second), sorted on disk: a private temporary
    SQLite database (deleted when closed) holds each one's time and where its text is, never the
    text, and gives them back in order; its cache is bounded, so memory is too."""
    spill = sqlite3.connect("")
    try:
        spill.execute(f"PRAGMA cache_size = -{SPILL_CACHE_KIB}")
        spill.execute("CREATE TABLE entry (t INTEGER, n INTEGER, bad INTEGER, at INTEGER, len INTEGER, "
                      "flags INTEGER, PRIMARY KEY (t, n)) WITHOUT ROWID")  # fmt: skip
        spill.executemany(
            "INSERT INTO entry VALUES (?, ?, ?, ?, ?, ?)",
            ((-1 if e.when is None else e.when, n, e.bad, e.at, -1 if e.raw is None else len(e.raw),
              e.borrowed | e.damaged << 1) for n, e in enumerate(entries)),
        )  # fmt: skip

        def read() -> Iterator[RawEntry]:
            for when, bad, at, length, flags in spill.execute(
                "SELECT t, bad, at, len, flags FROM entry ORDER BY t, n"
            ):
                # a damaged entry's bytes are not read again: the NUL that marks it stands for them
                raw = None if length < 0 else b"\0" if flags & 2 else os.pread(fd, length, at)
                yield RawEntry(None if when < 0 else when, bool(bad), at, raw, bool(flags & 1))

        yield read()
    finally:
        spill.close()


def _marked(
    entries: Iterable[RawEntry], total: int, last: float, seen: int, leave_after: float | None
) -> Iterator[FileEntry]:
    """The new entries, in time order, as the store takes them: each with the mark the import is
    at after it (`mark_text`)."""
    count = 0
    previous: float | None = None
    for n, entry in enumerate(entries):
        when = entry.when
        stamp = float("-inf") if when is None else float(when)
        count = count + 1 if stamp == previous else (seen + 1 if stamp == last else 1)
        previous = stamp
        raw = entry.raw
        text: str | None = "" if raw is None else unescape(raw).decode("utf-8", "surrogateescape")
        own = when is not None and not entry.borrowed
        if leave_after is not None and own and stamp >= leave_after:
            text = None  # the command that started the daemon, still running: its hook records it
        yield FileEntry(None if when is None else stamp, text, (stamp, count, n == total - 1), entry.bad,
                        timed=own, too_long=raw is None, damaged=entry.damaged)  # fmt: skip


def mark_text(mark: tuple[float, int, bool]) -> str:
    """The store's mark of where a fish import is: `fish:<when>:<entries with that when imported>`,
    and `:done` after the last entry (made at the end of a batch only: `_stored_in_order`)."""
    stamp, count, done = mark
    return f"fish:{stamp}:{count}" + (":done" if done else "")


def import_first_start(
    store: HistoryStore, path: Path | None = None, stop: threading.Event | None = None,
    leave_after: float | None = None,
) -> ImportResult | None:  # fmt: skip
    """What the daemon does at start for a fish user, as it imports ~/.bash_history and
    ~/.zsh_history at its first start: import fish's history file while it was never read
    whole (an import stopped by `stop` goes on at the next start; entries timed at `leave_after`
    or later are left to the hooks). A file that cannot be read or is not a history is logged
    (its path and why, never its text) and counted (`import_refused`, `import_failures`: `calmd
    status` shows them); this never fails."""
    p = path or default_path()
    try:
        mark = import_position(store, p)
        if not p.is_file() or (mark is not None and mark.endswith(":done")):
            return None
        result = import_fish_history(store, p, stop=stop, leave_after=leave_after)
    except NotAHistory as exc:
        log.warning("did not import %s", exc)
        return None
    except Exception as exc:  # the daemon starts whatever the file holds
        log.warning("could not import %s: %s", p, type(exc).__name__)
        with contextlib.suppress(Exception):
            store.add_to_counter("import_failures")
        return None
    log.info("%s", import_log_line(result))
    return result
