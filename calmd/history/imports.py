"""Importing history files into the store: `calm import FILE` and the daemon's first start
(docs/history.md, "Importing history files"). The formats are read by calmd/history/formats.py
(bash, zsh) and calmd/history/fish.py; this module stores what they read.

Streamed, bounded, resumable: entries are stored in batches of IMPORT_BATCH, each batch one
transaction with the mark of where the file was read to (an import stopped or killed goes on from
there), the store's lock free between two. Each entry is checked as a record is (secrets, a
leading space, empty, too long) and counted; an entry damaged by NULs (a crash's) is skipped and
counted; a run the shell hooks recorded already, or a command typed while recording was paused,
is left out (calmd/history/coverage.py).

Times: an entry's own time when it is one (recorded.valid_time); one without a time, or with an
impossible one (counted in `bad_times`), is timed by its place in the file: the time of the entry
before it, the first ones the time of the first entry after them with one (within their batch);
in a file without times, a microsecond per byte (fish: per entry) before the file's mtime. Before
issue 39 an impossible time was replaced by the mtime rule in every file: the entry sorted among
the newest commands, and led completions.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from calmd.history.coverage import Coverage
from calmd.history.formats import (
    FORMAT_SNIFF_BYTES,
    MAX_IMPORT_BYTES,
    NotAHistory,
    ReadMark,
    bash_timestamped,
    decoded,
    detect_format,
    entry_start,
    open_regular,
    read_entries,
    refusal,
)
from calmd.history.recorded import VERDICT_CACHE, RecordResult, clean_text, valid_time
from calmd.visible import visible

if TYPE_CHECKING:
    from calmd.history.store import HistoryStore

log = logging.getLogger("calmd.history.imports")

IMPORT_BATCH = 2000  # commands per transaction: the store's lock is free between two
SHELL_HISTORIES = (".bash_history", ".zsh_history")


@dataclass(frozen=True)
class ImportResult:
    path: str
    format: str
    imported: int
    dropped_secrets: int
    skipped: int  # empty or space-prefixed entries
    undecodable: int = 0  # entries kept with U+FFFD for bytes that were not UTF-8
    skipped_bytes: int = 0  # bytes over the import bound not read yet (the next import reads them)
    complete: bool = True  # False: stopped after a batch; the next import goes on from there
    bad_times: int = 0  # commands kept without their time: it was impossible (`valid_time`)
    left_to_hooks: int = 0  # entries timed as the daemon started: still running (`leave_after`)
    too_long: int = 0  # entries longer than a command may be (64 Ki characters): not kept
    damaged: int = 0  # entries holding NUL bytes (a crash's): skipped
    recorded: int = 0  # runs the shell hooks had recorded already (calmd/history/coverage.py)
    paused: int = 0  # commands typed while recording was paused (CALM_RECORD=0): left out


def import_summary(result: ImportResult) -> str:
    """What an import did, in one line, as `calm import` prints it: the file's name through
    `visible` (a name is the user's bytes; calmd/visible.py), the rest calmd's own words."""
    imported = f"{commands(result.imported)} imported ({result.format} format)"
    return f"{visible(str(result.path))}: {imported}, " + ", ".join(import_details(result))


def import_log_line(result: ImportResult) -> str:
    """What an import did, as the daemon logs it (the file's name escaped too)."""
    details = ", ".join(import_details(result))
    return f"imported {commands(result.imported)} from {visible(str(result.path))} ({details})"


def commands(count: int) -> str:
    return f"{count} command{'s' * (count != 1)}"


def import_details(result: ImportResult) -> list[str]:
    """The counts of an import besides the commands stored."""
    parts = [f"{result.dropped_secrets} dropped as credentials", f"{result.skipped} empty or space-prefixed"]
    if result.too_long:
        parts.append(f"{result.too_long} over-long (more than 64 Ki characters: not kept)")
    if result.damaged:
        parts.append(f"{result.damaged} damaged by NUL bytes, as a crash leaves them (skipped)")
    if result.recorded:
        parts.append(f"{result.recorded} recorded already by the shell's hook")
    if result.paused:
        parts.append(f"{result.paused} typed while recording was paused (CALM_RECORD=0: left out)")
    if result.undecodable:
        parts.append(f"{result.undecodable} with bytes that are not UTF-8 (kept as U+FFFD)")
    if result.bad_times:
        parts.append(f"{result.bad_times} with an impossible time (before 1970, after 2100 or not a number: "
                     "kept, timed by their place in the file)")  # fmt: skip
    if result.left_to_hooks:
        parts.append(f"{result.left_to_hooks} run as calmd started left to the shell's hook")
    if result.skipped_bytes:
        parts.append(
            f"{result.skipped_bytes:,} older bytes not read yet (--max-mib): import it again to read them"
            if result.format != "fish"  # fish's mark is a time: what is older than it is not read later
            else f"its oldest {result.skipped_bytes:,} bytes left out (--max-mib)"
        )
    return parts


_COUNTS = ("imported", "dropped", "skipped", "too_long", "damaged", "recorded", "paused", "undecodable",
           "bad_times", "left")  # fmt: skip


class FileEntry(NamedTuple):
    """An entry another parser read (calmd/history/fish.py), as `import_entries` stores it."""

    ts: float | None  # its time: its own, or its neighbour's (`timed` False); None: none known
    text: str | None  # the command; None: left to the hooks (`leave_after`)
    mark: Any  # the parser's mark of where the import is after it
    bad_time: bool = False  # its own time was impossible
    timed: bool = True  # `ts` is its own time (only an own time is matched against the hooks')
    too_long: bool = False  # longer than any command: skipped unread
    damaged: bool = False  # it holds NUL bytes: skipped


@dataclass(frozen=True)
class ShellImport:
    """What the daemon's first-start import did: one result per file read, and the files that
    could not be read (path, error type; never their text)."""

    results: list[ImportResult] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)


# --------------------------------------------------------------------------- the store's side


def _meta(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def _set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))


def _add_meta(db: sqlite3.Connection, key: str, delta: int) -> None:
    if delta:
        _set_meta(db, key, str(int(_meta(db, key) or 0) + delta))


def path_text(path: Path) -> str:
    """A file's name as the store keeps it (SQLite takes UTF-8): as it is, its bytes that are not
    UTF-8 as `\\xHH` (a name of Latin-1 bytes failed `calm import` with "unexpected
    UnicodeEncodeError" before issue 39)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def mark_key(path: Path) -> str:
    """The `meta` key of what the imports read of `path` (the resolved path: one key a file)."""
    return f"imported:{path_text(path.resolve())}"


def import_position(store: HistoryStore, path: Path) -> str | None:
    """Where the last import of `path` stopped, as its importer wrote it (None: never read)."""
    with store.reading() as db:
        return _meta(db, mark_key(path))


def count_refused(store: HistoryStore, path: Path, reason: str) -> None:
    """An import refused `path` as not a history (`calmd status` shows the count and the last)."""
    with store.writing() as db:
        _add_meta(db, "import_refused", 1)
        _set_meta(db, "last_import_refused", f"{path_text(path)}: {reason}")


class _Writer:
    """Stores one import's entries, batch by batch (the module's docstring): checks, counts, the
    times of entries without one, what the hooks covered, the mark of each batch."""

    def __init__(self, store: HistoryStore, path: Path, kind: str) -> None:
        self.store = store
        self.key = mark_key(path)
        self.session, self.source = f"import:{path_text(Path(path.name))}", f"import:{kind}"
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.tally = dict.fromkeys(_COUNTS, 0)
        self.verdicts: dict[str, RecordResult] = {}
        # [ts or None (waiting for a time), cmd, own time, undecodable, impossible time, fallback ts]
        self.rows: list[list[Any]] = []
        self.waiting: list[list[Any]] = []  # rows without a time yet: the next own time is theirs
        self.last_time: float | None = None  # the newest own time read: the next untimed entry's
        self.coverage: Coverage | None = None
        self.entries = 0  # read since the last batch

    def add(self, ts: float | None, text: str | None, *, fallback: float, bad_time: bool = False,
            timed: bool = True, too_long: bool = False, damaged: bool = False) -> None:  # fmt: skip
        """One entry: `ts` its time (None: none, or an impossible one, `bad_time`), `text` its
        command (None: left to the hooks), `fallback` its time when the file gives none at all."""
        self.entries += 1
        if damaged:
            self.tally["damaged"] += 1
            return
        if too_long:
            self.tally["too_long"] += 1
            return
        if text is None:
            self.tally["left"] += 1
            return
        cmd, replaced = clean_text(text)
        verdict = self.verdicts.get(cmd)
        if verdict is None:  # a history repeats itself: each distinct command is checked once
            if len(self.verdicts) >= VERDICT_CACHE:
                self.verdicts.clear()
            verdict = self.verdicts[cmd] = self.store.check(cmd)
        if not verdict.stored:
            reason = verdict.reason
            self.tally["dropped" if reason.startswith("secret:") else "too_long" if reason == "too-long"
                       else "skipped"] += 1  # fmt: skip
            return
        own = ts is not None and timed
        if ts is not None:
            for row in self.waiting:  # the first ones without a time: the time after them
                row[0] = ts
            self.waiting.clear()
            if own:
                self.last_time = ts
        elif self.last_time is not None:
            ts = self.last_time  # its place in the file: the time of the entry before it
        row = [ts, cmd, own, replaced, bad_time, fallback]
        self.rows.append(row)
        if ts is None:
            self.waiting.append(row)

    def flush(self, mark: str) -> None:
        """The rows read so far, and `mark`, in one transaction."""
        with self.store.writing() as db:
            if self.coverage is None:  # before this import stores a row: it matches none of its own
                self.coverage = Coverage(db, self.source)
            stored = []
            for ts, cmd, own, replaced, bad_time, fallback in self.rows:
                stamp = fallback if ts is None else ts
                why = self.coverage.covers(db, stamp, cmd) if own else None
                if why is not None:
                    self.tally[why] += 1
                    continue
                stored.append((stamp, self.session, cmd, self.source))
                self.tally["imported"] += 1
                self.tally["undecodable"] += replaced
                self.tally["bad_times"] += bad_time
            if stored:
                db.executemany("INSERT INTO commands (ts, session, cwd, git, cmd, exit, source, comp, env) "
                               "VALUES (?, ?, '', '', ?, NULL, ?, '', '')", stored)  # fmt: skip
            for name, key in (("imported", "recorded_since_train"), ("dropped", "dropped_secrets"),
                              ("undecodable", "undecodable"), ("bad_times", "import_bad_times"),
                              ("damaged", "import_damaged")):  # fmt: skip
                _add_meta(db, key, self.tally[name])
            _set_meta(db, self.key, mark)
        for name in self.counts:
            self.counts[name] += self.tally[name]
            self.tally[name] = 0
        self.rows.clear()
        self.waiting.clear()
        self.entries = 0

    def result(self, path: Path, kind: str, **extra: Any) -> ImportResult:
        c = self.counts
        return ImportResult(str(path), kind, c["imported"], c["dropped"], c["skipped"], c["undecodable"],
                            bad_times=c["bad_times"], left_to_hooks=c["left"], too_long=c["too_long"],
                            damaged=c["damaged"], recorded=c["recorded"], paused=c["paused"],
                            **extra)  # fmt: skip


# --------------------------------------------------------------------------- bash and zsh


@dataclass(frozen=True)
class _FileSource:
    """The file an import reads, and what it knows of it (import_file -> _import_ranges)."""

    fd: int
    mark: ReadMark  # what was read before
    size: int
    kind: str  # bash or zsh
    multiline: bool  # a bash file delimited by timestamps
    mtime: float
    path: Path


def import_file(
    store: HistoryStore, path: str | os.PathLike[str], fmt: str = "auto", *,
    max_bytes: int = MAX_IMPORT_BYTES, stop: threading.Event | None = None, leave_after: float | None = None,
) -> ImportResult:  # fmt: skip
    """Import a bash or zsh history file: the bytes of it no import read yet.

    Streamed: the file is read in chunks and committed in batches of IMPORT_BATCH commands,
    each with the part of the file read so far (`ReadMark`: an import that is stopped or
    killed goes on from there next time), so memory does not grow with the file and the
    store's lock is free between batches. At most `max_bytes` are read, the newest unread
    ones first: the older are counted in `skipped_bytes` and stay unread, for the next import
    (never marked as read). A file that is not a shell history (binary data, records like
    /etc/passwd) is refused whole (NotAHistory), counted in `meta` `import_refused`; NULs a crash
    left damage only the entries they touch. Entries timed at `leave_after` or later are read but
    not stored (the daemon's first start: the command that started it is still running; its hook
    records it when it ends). `stop` ends it after a batch."""
    p = Path(path).expanduser()
    if fmt not in ("auto", "bash", "zsh"):
        raise ValueError(f"unknown history format {fmt!r} (auto, bash or zsh)")
    with open_regular(p) as f:
        fd = f.fileno()
        st = os.fstat(fd)
        size = st.st_size
        head = os.pread(fd, FORMAT_SNIFF_BYTES, 0)
        mark = ReadMark.parse(import_position(store, p) or "")
        if mark is None or mark.extent > size or head[: min(64, mark.extent)].hex() != mark.fingerprint:
            mark = ReadMark(0, (), head[:64].hex())  # never read, or rewritten (trimmed): from the start
        kind = detect_format(head, p.name) if fmt == "auto" else fmt
        multiline = kind == "bash" and bash_timestamped(head)
        spans, budget = [], max_bytes  # what this import reads: the newest unread bytes, max_bytes
        for lo, hi in reversed(mark.unread(size)):
            if budget > 0:
                spans.append((max(lo, hi - budget), hi))
                budget -= hi - lo
        reason = next((why for lo, hi in spans if (why := refusal(fd, lo, hi)) is not None), None)
        if reason is not None:
            count_refused(store, p, reason)
            raise NotAHistory(
                f"{p}: not a shell history ({reason}); nothing was imported from it. Check that it "
                "is the file you meant; a history has one command per line"
            )
        plan = []
        for lo, hi in reversed(spans):
            if (lo, hi) not in mark.unread(size):  # cut inside an entry: the first whole one after it
                lo = entry_start(fd, lo, hi, kind, multiline)
            if lo < hi:
                plan.append((lo, hi))
        left_out = sum(hi - lo for lo, hi in mark.unread(size)) - sum(hi - lo for lo, hi in plan)
        result = ImportResult(str(p), kind, 0, 0, 0, skipped_bytes=left_out)
        if not plan:
            return result
        source = _FileSource(fd, mark, size, kind, multiline, st.st_mtime, p)
        return _import_ranges(store, source, plan, stop, result, leave_after)


def _import_ranges(
    store: HistoryStore, source: _FileSource, plan: list[tuple[int, int]], stop: threading.Event | None,
    result: ImportResult, leave_after: float | None,
) -> ImportResult:  # fmt: skip
    """Read the entries of each byte range of `plan` (oldest first) and store them batch by
    batch, each batch with the mark of what is read (see import_file)."""
    writer = _Writer(store, source.path, source.kind)
    read = source.mark  # the ranges read completely, this import's included
    lo = position = 0  # the range being read, and how far
    complete = True
    for lo, hi in plan:
        position = lo
        for ts, raw, end, damaged in read_entries(source.fd, lo, hi, source.kind, multiline=source.multiline):
            position = end
            bad_time = ts is not None and not valid_time(ts)
            own = None if bad_time else ts
            left = leave_after is not None and own is not None and own >= leave_after
            # a file without times keeps its order: a microsecond per byte before its mtime
            writer.add(own, None if left or raw is None else decoded(raw), bad_time=bad_time,
                       fallback=source.mtime - (source.size - end) * 1e-6, too_long=raw is None and not left,
                       damaged=damaged)  # fmt: skip
            if writer.entries >= IMPORT_BATCH:
                writer.flush(read.with_read(lo, position).text())
                if stop is not None and stop.is_set():
                    complete = False
                    break
        else:
            read = read.with_read(lo, hi)
            lo = position = hi
            continue
        break
    if complete:
        writer.flush(read.with_read(lo, position).text())
    return writer.result(source.path, source.kind, skipped_bytes=result.skipped_bytes, complete=complete)


# --------------------------------------------------------------------------- another parser's entries


def import_entries(
    store: HistoryStore, path: Path, kind: str, entries: Iterable[FileEntry], count: int, mtime: float,
    stop: threading.Event | None = None, mark_text: Callable[[Any], str] = str,
) -> ImportResult:  # fmt: skip
    """Store the entries another parser read from a history file (calmd/history/fish.py), in
    time order, as they come (an iterator: they are not held). Checked, counted, timed and
    matched as `import_file`'s; committed in batches of IMPORT_BATCH, each with the mark of its
    last entry (written by `mark_text`; `import_position` gives it back: a stopped or killed
    import goes on from there). Entries without any time known keep their order, a microsecond
    apart before `mtime` (`count`: how many entries there are)."""
    writer = _Writer(store, path, kind)
    complete, mark = True, None
    for i, entry in enumerate(entries):
        mark = entry.mark
        writer.add(entry.ts, entry.text, fallback=mtime - (count - i) * 1e-6, bad_time=entry.bad_time,
                   timed=entry.timed, too_long=entry.too_long, damaged=entry.damaged)  # fmt: skip
        if writer.entries >= IMPORT_BATCH:
            writer.flush(mark_text(mark))
            if stop is not None and stop.is_set() and i + 1 < count:
                complete = False
                break
    if writer.entries:
        writer.flush(mark_text(mark))
    return writer.result(path, kind, complete=complete)


# --------------------------------------------------------------------------- the daemon's first start


def import_shell_histories(
    store: HistoryStore, home: Path, stop: threading.Event | None = None, leave_after: float | None = None
) -> ShellImport:
    """The daemon's first start: import ~/.bash_history and ~/.zsh_history once (entries timed
    at `leave_after` or later are left to the hooks: `import_file`). A file that cannot be read or
    is not a history is logged (its path and why, never its text) and counted (`import_failures`,
    `import_refused`), and the other is still imported: this never fails. Stopped (`stop`) before
    it is done, it goes on from where it was at the next start."""
    outcome = ShellImport()
    if store.counter("first_start_done"):
        return outcome
    for name in SHELL_HISTORIES:
        path = home / name
        try:
            if not path.is_file():
                continue
            result = import_file(store, path, stop=stop, leave_after=leave_after)
        except NotAHistory as exc:
            log.warning("did not import %s", exc)
            outcome.failures.append((str(path), "NotAHistory"))
            continue
        except Exception as exc:  # one bad file must not stop the daemon or the other file
            reason = type(exc).__name__ + (f" ({exc.strerror})" if isinstance(exc, OSError) else "")
            log.warning("could not import %s: %s", path, reason)
            outcome.failures.append((str(path), reason))
            with contextlib.suppress(Exception):
                store.add_to_counter("import_failures")
            continue
        outcome.results.append(result)
        log.info("%s", import_log_line(result))
        if not result.complete:
            return outcome  # stopped: the next start goes on
    with store.writing() as db:
        _set_meta(db, "first_start_done", "1")
    return outcome
