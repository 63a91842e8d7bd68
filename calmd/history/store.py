"""The history store: every executed command, in SQLite (WAL), with what the ranking needs.

One row per executed command: time, shell session, cwd, git branch, the command, its exit code,
the command that ran before it in the same session (for "what follows what"), and where it came
from (`shell` for the hooks, `import:bash` / `import:zsh` for imported history files).

Filters, applied to everything stored (docs/history.md):
- commands that start with a space are not stored (the bash/zsh `ignorespace` convention);
- commands holding credentials (calmd/secrets/) are dropped and counted, never stored;
- empty commands and commands over 64 KiB are ignored;
- bytes that are not UTF-8 (and NULs) are stored as U+FFFD and counted, never a failure.

Forgetting: a store scanned by an older credential detector is re-scanned when opened, and
`forget` deletes what matches a pattern; both delete for good (SQLite's secure_delete, then the
WAL checkpointed and truncated, then the datasets built from the old rows removed) and bump a
generation counter that the daemon's in-memory caches compare against.

History files (`~/.bash_history`, `~/.zsh_history` in plain or extended format, with zsh's
metafied bytes) are imported incrementally: the store remembers how many bytes of each file it
has read, so importing again only adds what the shell appended since.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from calmd import paths
from calmd.errors import CalmError, DiskFull
from calmd.history.recorded import COMP_ITEMS, clean_env
from calmd.protocol import INT64_MAX, TS_MAX
from calmd.secrets import DETECTOR_VERSION, find_secret, forget_command
from calmd.visible import visible

log = logging.getLogger("calmd.history.store")

MAX_COMMAND_CHARS = 1 << 16  # as the protocol's `record` limit: longer is not a command worth keeping
# Importing history files (`import_file`): read a chunk at a time, stored in batches, at most the
# newest MAX_IMPORT_BYTES of a file; an entry longer than MAX_ENTRY_BYTES is skipped unread.
IMPORT_CHUNK = 1 << 20
IMPORT_BATCH = 2000  # commands per transaction: the store's lock is free between two
MAX_IMPORT_BYTES = 16 << 20  # 0.5-0.8 million commands, more than shells keep (HISTSIZE): ~20 s
VERDICT_CACHE = 100_000  # distinct commands whose check an import remembers
MAX_ENTRY_BYTES = 4 * MAX_COMMAND_CHARS  # the most bytes 64 Ki characters take in UTF-8
FORMAT_SNIFF_BYTES = 65536
# Files built from the store's rows, under its folder (calmd/training/background.py writes them): removed
# when rows are deleted, so that a forgotten command does not live on in a dataset.
SHELL_HISTORIES = (".bash_history", ".zsh_history")

SCHEMA_VERSION = 5  # 2: no prev_cmd column (nothing read it); 3: comp and env (the context's COMP, ENV);
# 4: duration (seconds the command ran, when the shell said); 5: host, origin, origin_id and the sync
# tables (calmd/history/sync.py: the history shared between machines)
SQLITE_FULL = 13  # the primary result code of "database or disk is full"
SQLITE_IOERR = 10  # a failed write or shm growth; disk full when the file system has no space left
_SCHEMA = """
CREATE TABLE IF NOT EXISTS commands (
    id       INTEGER PRIMARY KEY,
    ts       REAL NOT NULL,
    session  TEXT NOT NULL DEFAULT '',
    cwd      TEXT NOT NULL DEFAULT '',
    git      TEXT NOT NULL DEFAULT '',
    cmd      TEXT NOT NULL,
    exit     INTEGER,
    source   TEXT NOT NULL DEFAULT 'shell',
    comp     TEXT NOT NULL DEFAULT '',
    env      TEXT NOT NULL DEFAULT '',
    duration REAL,
    host     TEXT NOT NULL DEFAULT '',
    origin   TEXT NOT NULL DEFAULT '',
    origin_id INTEGER
);
CREATE INDEX IF NOT EXISTS commands_cmd ON commands (cmd);
CREATE INDEX IF NOT EXISTS commands_session ON commands (session, id);
CREATE INDEX IF NOT EXISTS commands_cwd ON commands (cwd, id);
CREATE INDEX IF NOT EXISTS commands_ts ON commands (ts);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Schema 5, after the migration has added the columns (calmd/history/sync.py, docs/sync.md). A row's
# `host` is the name of the machine that recorded it ('' for this one), `origin` that machine's sync
# id ('' for this one) and `origin_id` the record's number there (this machine's: given when it is
# first shared): (origin, origin_id) is a record's identity across machines, so that importing it
# twice stores it once. `sync_forgotten` keeps the identity of every shared record deleted here or
# elsewhere (never its text): forgets travel, and a record forgotten never comes back; its `sent` is
# 0 until this machine sends it, then the number of this machine's segment that carries it (-1: one
# learnt from another machine, carried again only when this machine writes all its segments anew).
# `sync_own`: this machine's live segments as it wrote them (size, hash, the record ranges they hold)
# for its check of the folder; `sync_hosts`: the others, with the newest manifest read (the numbers of
# their live segments); `sync_files`: the others' segments read, as they were; `sync_refused`: why not.
# What `forget_all` keeps of sync in `meta`: this machine's id and name, and the next segment and
# record numbers (never given twice: the other machines know the ones given, and would ignore a
# new record under an old number).
SYNC_KEPT = ("sync_host_id", "sync_host_name", "sync_next_seq", "sync_next_id")
_SYNC_SCHEMA = """
CREATE UNIQUE INDEX IF NOT EXISTS commands_origin ON commands (origin, origin_id) WHERE origin_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS commands_unshared ON commands (id) WHERE origin_id IS NULL;
CREATE TABLE IF NOT EXISTS sync_forgotten (
    origin TEXT NOT NULL, origin_id INTEGER NOT NULL, sent INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (origin, origin_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_hosts (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, records INTEGER NOT NULL DEFAULT 0,
    last_seq INTEGER NOT NULL DEFAULT 0, last_sealed REAL,
    manifest_seq INTEGER NOT NULL DEFAULT 0, live TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS sync_files (
    host TEXT NOT NULL, seq INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL, ino INTEGER NOT NULL, PRIMARY KEY (host, seq)
);
CREATE TABLE IF NOT EXISTS sync_own (
    seq INTEGER PRIMARY KEY, size INTEGER NOT NULL, digest BLOB NOT NULL, mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL, ino INTEGER NOT NULL, ranges TEXT NOT NULL, records INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sync_refused (
    path TEXT PRIMARY KEY, reason TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL DEFAULT 0, ino INTEGER NOT NULL DEFAULT 0, at REAL NOT NULL
);
"""


TIME_DIGITS = 12  # seconds since the epoch take 10 digits until 2286: a longer string is no time


def time_of(digits: bytes) -> float:
    """A history file's time (`#1700000000`, `: 1700000000:0;`): its digits as a number, infinite
    (impossible: `valid_time`) when there are more than TIME_DIGITS of them, zeros first or not."""
    return float(digits) if len(digits) <= TIME_DIGITS else math.inf


def valid_time(ts: float | None) -> bool:
    """Whether `ts` is a time a command can have run at: seconds since the epoch from 1970 to 2100
    (protocol.TS_MAX). A negative, infinite or NaN time is not, nor one read from a digit string
    too long to be a time (`#999999999999` is the year 33658): an import keeps such a command
    without its time (`ImportResult.bad_times`), as sync keeps such a record from another machine
    (calmd/history/sync.py `parse_record`, `sync_bad_times`)."""
    return ts is not None and 0.0 <= ts <= TS_MAX


@dataclass(frozen=True)
class HistoryRow:
    id: int
    ts: float
    session: str
    cwd: str
    git: str
    cmd: str
    exit: int | None
    source: str
    # The COMP items and the ENV text the context held when the command was typed (schema 3,
    # calmd/suggest/frames.py): what the datasets put in the example's frames.
    comp: tuple[str, ...] = ()
    env: str = ""
    duration: float | None = None  # seconds it ran (schema 4; None: the shell did not say, or imported)
    host: str = ""  # the machine that recorded it (schema 5; '': this one, calmd/history/sync.py)

    @classmethod
    def from_db(cls, row: tuple[Any, ...]) -> HistoryRow:
        rid, ts, session, cwd, git, cmd, code, source, comp, env, duration, host = row
        return cls(rid, ts, session, cwd, git, cmd, code, source, _comp_items(comp), env, duration, host)


def _comp_items(text: str) -> tuple[str, ...]:
    """The stored COMP column: items separated by newlines (a name with a newline is never stored)."""
    return tuple(text.split("\n")) if text else ()


def _comp_text(items: Sequence[str]) -> str:
    """What is stored of a COMP frame: at most COMP_ITEMS items, none with a newline, none flagged as
    a credential. Only these few matching names are kept, never the directory listing."""
    kept = [i for i in items if i and "\n" not in i and find_secret(i) is None][:COMP_ITEMS]
    return "\n".join(clean_text(i)[0] for i in kept)


@dataclass(frozen=True)
class RecordResult:
    stored: bool
    reason: str = ""  # why not: "empty", "leading-space", "secret:<rule>"


@dataclass(frozen=True)
class ImportResult:
    path: str
    format: str
    imported: int
    dropped_secrets: int
    skipped: int  # empty, leading-space or over-long entries
    undecodable: int = 0  # entries kept with U+FFFD for bytes that were not UTF-8 (or NULs)
    skipped_bytes: int = 0  # bytes over the import bound not read yet (the next import reads them)
    complete: bool = True  # False: stopped after a batch; the next import goes on from there
    bad_times: int = 0  # commands kept without their time: it was impossible (`valid_time`)
    left_to_hooks: int = 0  # entries timed as the daemon started: still running (`leave_after`)


def import_summary(result: ImportResult) -> str:
    """What an import did, in one line, as `calm import` prints it: the file's name through
    `visible` (a name is the user's bytes; calmd/visible.py), the rest calmd's own words."""
    imported = f"{result.imported} commands imported ({result.format} format)"
    return f"{visible(str(result.path))}: {imported}, " + ", ".join(import_details(result))


def import_log_line(result: ImportResult) -> str:
    """What an import did, as the daemon logs it."""
    return f"imported {result.imported} commands from {result.path} ({', '.join(import_details(result))})"


def import_details(result: ImportResult) -> list[str]:
    """The counts of an import besides the commands stored."""
    parts = [f"{result.dropped_secrets} dropped as credentials", f"{result.skipped} empty or space-prefixed"]
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


_COUNTS = ("imported", "dropped", "skipped", "undecodable", "bad_times", "left")
# An entry another parser read (calmd/history/fish.py): (timestamp or None, the command or None
# when it is left to the hooks, the parser's mark after it, whether its time was impossible)
FileEntry = tuple[float | None, str | None, Any, bool]


@dataclass(frozen=True)
class ReadMark:
    """What of a bash or zsh history file the imports read, as `meta` keeps it:
    `<done>:<fingerprint>[:<lo>-<hi>,...]`: the bytes [0, done), and the ranges after it (an
    import bounded by --max-mib reads the newest bytes first and leaves the older unread, for the
    next import); `fingerprint`: the hex of the file's first 64 bytes, which tells a file the shell
    rewrote (trimmed to HISTSIZE) from one it appended to."""

    done: int
    ranges: tuple[tuple[int, int], ...]
    fingerprint: str

    @property
    def extent(self) -> int:
        return max([self.done, *(hi for _, hi in self.ranges)])

    @classmethod
    def parse(cls, text: str) -> ReadMark | None:
        parts = text.split(":")
        if not parts[0].isdigit() or len(parts) not in (2, 3):
            return None
        ranges: list[tuple[int, int]] = []
        for item in parts[2].split(",") if len(parts) == 3 else ():
            lo, _, hi = item.partition("-")
            if not (lo.isdigit() and hi.isdigit()) or int(lo) >= int(hi):
                return None
            ranges.append((int(lo), int(hi)))
        done = int(parts[0])
        ends = [done] + [hi for _, hi in ranges]
        if any(lo <= after for (lo, _), after in zip(ranges, ends, strict=False)):
            return None  # not sorted, overlapping, or touching: not a mark this calmd wrote
        return cls(done, tuple(ranges), parts[1])

    def text(self) -> str:
        spans = ",".join(f"{lo}-{hi}" for lo, hi in self.ranges)
        return f"{self.done}:{self.fingerprint}" + (f":{spans}" if spans else "")

    def unread(self, size: int) -> list[tuple[int, int]]:
        """The byte ranges of a file of `size` bytes that no import read, oldest first."""
        gaps, at = [], self.done
        for lo, hi in (*self.ranges, (size, size)):
            if lo > at:
                gaps.append((at, min(lo, size)))
            at = max(at, hi)
        return [(lo, hi) for lo, hi in gaps if lo < hi]

    def with_read(self, lo: int, hi: int) -> ReadMark:
        """This mark with [lo, hi) read too (merged with the ranges it touches)."""
        if lo >= hi:
            return self
        spans = sorted([*self.ranges, (lo, hi)])
        done, merged = self.done, list[tuple[int, int]]()
        for a, b in spans:
            if a <= done:
                done = max(done, b)
            elif merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return ReadMark(done, tuple((a, b) for a, b in merged if b > done), self.fingerprint)


@dataclass(frozen=True)
class _FileSource:
    """The file an import reads, and what it knows of it (import_file -> _import_ranges)."""

    fd: int
    key: str  # its `meta` key
    mark: ReadMark  # what was read before
    size: int
    kind: str  # bash or zsh
    multiline: bool  # a bash file delimited by timestamps
    mtime: float
    name: str


@dataclass(frozen=True)
class ShellImport:
    """What the daemon's first-start import did: one result per file read, and the files that
    could not be read (path, error type; never their text)."""

    results: list[ImportResult] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)


def clean_text(text: str) -> tuple[str, bool]:
    """`text` as SQLite can store it: lone surrogates (undecodable bytes kept by surrogateescape)
    and NULs become U+FFFD. Returns (text, whether anything was replaced)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape" if _only_escapes(text) else "surrogatepass").decode(
            "utf-8", "replace"
        )
        return text.replace("\0", "\ufffd"), True
    if "\0" in text:
        return text.replace("\0", "\ufffd"), True
    return text, False


def _only_escapes(text: str) -> bool:
    """Whether every surrogate in `text` is a surrogateescape'd byte (U+DC80-U+DCFF)."""
    return all(not ("\ud800" <= c <= "\udfff") or "\udc80" <= c <= "\udcff" for c in text)


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern (ESCAPE '\\') matching strings that start with `prefix`. LIKE ignores ASCII
    case, so callers re-check with str.startswith."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class HistoryStore:
    """Thread-safe: one connection guarded by a lock (the daemon records from its event loop and
    reads from a worker thread; SQLite work here is sub-millisecond)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        if self.path.is_dir():
            raise CalmError(f"{self.path}: a folder, not a history store; give its history.sqlite3")
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as exc:
            raise CalmError(
                f"{self.path}: SQLite cannot open it as a history store ({exc}); give a history.sqlite3 "
                "calm wrote, or a new path"
            ) from None
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
        self._db.execute("PRAGMA busy_timeout=5000")
        # Deleted rows are overwritten with zeros, not left in free pages (forget, re-scans).
        self._db.execute("PRAGMA secure_delete=ON")
        with self._lock:
            self._db.executescript(_SCHEMA)
            version = self._meta_get("schema_version")
            if version is None:
                self._meta_set("schema_version", str(SCHEMA_VERSION))
            elif not version.isdigit():
                raise CalmError(
                    f"{self.path}: its schema version {version[:20]!r} is not a number: not a calmd history "
                    "store; give a history.sqlite3 calm wrote, or a new path"
                )
            elif int(version) > SCHEMA_VERSION:
                raise CalmError(
                    f"{self.path}: history schema {version} is newer than this calmd ({SCHEMA_VERSION}): "
                    "upgrade calm to use it, or give another store"
                )
        if version is not None and int(version) < SCHEMA_VERSION:
            self._migrate(int(version))
        with self._lock:
            self._db.executescript(_SYNC_SCHEMA)
        os.chmod(self.path, 0o600)  # it is the user's whole shell history
        self.last_disk_full: float | None = None  # when a write last failed for lack of space
        self.rescanned = self._rescan_if_outdated()
        self._repair_times()

    def _repair_times(self) -> None:
        """Give the rows an older calmd stored with an impossible time (an import before issue 30
        kept `: 999999999999:0;ls` as the year 33658, a negative fish `when:` as 1969, a 400-digit
        one as infinity) the time of the row before them: `calm history`, `calm stats` and the
        rankings read times as times. Two probes of the `ts` index when there are none."""
        bad = "ts < 0 OR ts > ?"
        with self._lock:
            if self._db.execute(f"SELECT 1 FROM commands WHERE {bad} LIMIT 1", (TS_MAX,)).fetchone() is None:
                return
        try:
            before = "SELECT c.ts FROM commands c WHERE c.id < commands.id AND c.ts BETWEEN 0 AND ? " \
                "ORDER BY c.id DESC"  # fmt: skip
            with self._write_transaction(immediate=True):
                repaired = self._db.execute(
                    f"UPDATE commands SET ts = coalesce(({before} LIMIT 1), 0) WHERE {bad}", (TS_MAX, TS_MAX)
                ).rowcount
                self._meta_add("import_bad_times", repaired)
        except (DiskFull, sqlite3.OperationalError) as exc:  # the store still opens: the next open repairs
            log.warning("could not repair the impossible times of %s: %s", self.path, exc)
            return
        log.info("%d stored commands had an impossible time: given the time of the command before", repaired)

    def _migrate(self, version: int) -> None:
        """Bring a history written by an older calmd to SCHEMA_VERSION, in one transaction."""
        with self._write_transaction(immediate=True):
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(commands)")}
            if version < 2 and "prev_cmd" in columns:
                self._db.execute("ALTER TABLE commands DROP COLUMN prev_cmd")
            if version < 3:  # older records: no COMP or ENV known (empty frames, as they were served)
                for column in ("comp", "env"):
                    if column not in columns:
                        self._db.execute(f"ALTER TABLE commands ADD COLUMN {column} TEXT NOT NULL DEFAULT ''")
            if version < 4 and "duration" not in columns:  # older records: how long they ran is unknown
                self._db.execute("ALTER TABLE commands ADD COLUMN duration REAL")
            if version < 5:  # older records: all of this machine, none shared yet
                text = "TEXT NOT NULL DEFAULT ''"
                for column, kind in (("host", text), ("origin", text), ("origin_id", "INTEGER")):
                    if column not in columns:
                        self._db.execute(f"ALTER TABLE commands ADD COLUMN {column} {kind}")
            self._meta_set("schema_version", str(SCHEMA_VERSION))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- meta ------------------------------------------------------------------------------------

    def _meta_get(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _meta_set(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _meta_add(self, key: str, delta: int) -> None:
        current = int(self._meta_get(key) or 0)
        self._meta_set(key, str(current + delta))

    def add_to_counter(self, key: str, delta: int = 1) -> None:
        with self._lock:
            self._meta_add(key, delta)

    def reset_counter(self, key: str) -> None:
        with self._lock:
            self._meta_set(key, "0")

    def counter(self, key: str) -> int:
        with self._lock:
            return int(self._meta_get(key) or 0)

    def note(self, key: str) -> str | None:
        """A text kept in `meta` (`last_import_refused`: which file and why, never its text)."""
        with self._lock:
            return self._meta_get(key)

    def generation(self) -> int:
        """A number bumped whenever rows are deleted (a re-scan, `calm forget`), by any process:
        an in-memory copy of the history built at another generation is stale."""
        with self._lock:
            return int(self._meta_get("generation") or 0)

    # -- forgetting --------------------------------------------------------------------------------

    def _rescan_if_outdated(self) -> int:
        """Delete the rows that the current detector flags when the store was last scanned by an
        older one (or by none); returns how many. Counted in `dropped_secrets`."""
        with self._lock:
            scanned = int(self._meta_get("detector_version") or 0)
        if scanned >= DETECTOR_VERSION:
            return 0
        dropped = self._delete_matching(
            lambda cmd: find_secret(cmd) is not None or forget_command(cmd), counter="dropped_secrets"
        )
        with self._lock:
            self._meta_set("detector_version", str(DETECTOR_VERSION))
        if dropped:
            log.info(
                "re-scanned the history with detector %d: %d commands removed", DETECTOR_VERSION, dropped
            )
        return dropped

    def count_matching(self, match: Callable[[str], bool]) -> int:
        """How many stored commands `match` (what `forget` would delete)."""
        return sum(1 for row in self.all_rows() if match(row.cmd))

    def forget(self, match: Callable[[str], bool]) -> int:
        """Delete every command for which `match(cmd)` holds, for good; returns how many. The
        pattern behind `match` is not written anywhere."""
        return self._delete_matching(match)

    def forget_all(self) -> int:
        """Every stored command, deleted for good as `forget` deletes them (`calm forget --all`),
        and this machine out of sync, in the same transaction: the rows' deletions are NOT sent as
        forgets (--all empties this machine; the user's other machines keep their own history and
        what they received: docs/sync.md, "Leaving"), and what sync learnt here is cleared (its
        segments `sync_own`, what it read of the others, its counts), so that joining again reads
        the folder afresh. Kept: the identities forgotten before (`sync_forgotten`, never a text:
        none comes back, and one not sent yet is sent if this machine joins again) and the numbers
        it gave (SYNC_KEPT: a segment's or a record's number is never given twice)."""
        with self._lock:
            doomed = [rid for (rid,) in self._db.execute("SELECT id FROM commands")]
        return self._delete_ids(doomed, leave_sync=True)

    def forget_command(self, cmd: str) -> int:
        """Delete every run of exactly `cmd`, for good (the history search's delete key): what
        `forget` does, with the rows found through the `cmd` index instead of a scan of all."""
        with self._lock:
            doomed = [rid for (rid,) in self._db.execute("SELECT id FROM commands WHERE cmd = ?", (cmd,))]
        return self._delete_ids(doomed)

    def _delete_matching(self, match: Callable[[str], bool], *, counter: str = "") -> int:
        """Delete the matching rows and every trace of them (`_delete_ids`)."""
        return self._delete_ids([row.id for row in self.all_rows() if match(row.cmd)], counter=counter)

    def _delete_ids(self, doomed: list[int], *, counter: str = "", leave_sync: bool = False) -> int:
        """Delete these rows and every trace of them: deleted cells are zeroed (secure_delete);
        the WAL, which still holds the pages as they were, is checkpointed and truncated; the
        datasets built from the old rows are removed; the generation is bumped. The shared ones
        are remembered as forgotten, to be sent (`_remember_forgotten`), unless `leave_sync`
        (`forget_all`)."""
        if not doomed and not leave_sync:
            return 0
        with self._write_transaction(immediate=True):
            self._uncount_recent(doomed)
            for start in range(0, len(doomed), 500):
                chunk = doomed[start : start + 500]
                if not leave_sync:
                    self._remember_forgotten(chunk)
                self._db.execute(f"DELETE FROM commands WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            if leave_sync:
                for table in ("sync_own", "sync_hosts", "sync_files", "sync_refused"):
                    self._db.execute(f"DELETE FROM {table}")
                marks = ",".join("?" * len(SYNC_KEPT))
                self._db.execute(f"DELETE FROM meta WHERE key LIKE 'sync\\_%' ESCAPE '\\' "
                                 f"AND key NOT IN ({marks})", SYNC_KEPT)  # fmt: skip
            if counter:
                self._meta_add(counter, len(doomed))
            self._meta_add("generation", 1)
        with self._lock:
            self._truncate_wal()
        self.remove_derived_datasets()
        return len(doomed)

    def _uncount_recent(self, doomed: list[int]) -> None:
        """Take the rows about to be deleted out of `recorded_since_train` when they are among the
        commands it counts (the newest ones): `calmd status` said 20 commands since the last
        training in a history of 19 after one deletion. Inside the caller's transaction."""
        since = int(self._meta_get("recorded_since_train") or 0)
        if since <= 0:
            return
        sql = "SELECT id FROM commands ORDER BY id DESC LIMIT 1 OFFSET ?"
        row = self._db.execute(sql, (since,)).fetchone()
        after = int(row[0]) if row else 0  # the counted commands are the rows with an id above it
        counted = sum(1 for rid in doomed if rid > after)
        total = int(self._db.execute("SELECT COUNT(*) FROM commands").fetchone()[0])
        self._meta_set("recorded_since_train", str(max(0, min(since, total) - counted)))

    def _remember_forgotten(self, ids: list[int]) -> None:
        """Before rows are deleted (inside the caller's transaction): the sync identity of those
        that were shared goes to `sync_forgotten` (to be sent: calmd/history/sync.py), so that the
        other machines delete them too and an import never brings them back; when some were this
        machine's own, its segments are to be rewritten without them (`sync_rebuild`)."""
        marks = ",".join("?" * len(ids))
        shared = f"FROM commands WHERE origin_id IS NOT NULL AND id IN ({marks})"
        own = self._db.execute(f"SELECT COUNT(*) {shared} AND origin = ''", ids).fetchone()[0]
        if not own and self._db.execute(f"SELECT 1 {shared} LIMIT 1", ids).fetchone() is None:
            return
        self_id = self._meta_get("sync_host_id") or ""
        self._db.execute(
            "INSERT OR IGNORE INTO sync_forgotten (origin, origin_id, sent) "
            f"SELECT CASE WHEN origin = '' THEN ? ELSE origin END, origin_id, 0 {shared}",
            [self_id, *ids],
        )
        if own:
            self._meta_set("sync_rebuild", "1")

    def delete_rows(self, ids: Sequence[int]) -> int:
        """Delete these rows for good, as `forget` does (calmd/history/sync.py: a forget that came
        from another machine)."""
        return self._delete_ids(list(ids))

    @contextlib.contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """The connection inside a write transaction under the lock (all of it or nothing):
        for calmd/history/sync.py, whose tables live in this store."""
        with self._write_transaction(immediate=True):
            yield self._db

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock, for reads (calmd/history/sync.py)."""
        with self._lock:
            yield self._db

    def _truncate_wal(self) -> None:
        """Copy the WAL into the database and truncate it to zero bytes (under the lock). Another
        connection in the middle of a read can make the checkpoint incomplete: retry briefly."""
        for _ in range(50):
            busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return
            time.sleep(0.02)
        log.warning("the history's WAL could not be truncated (another process is reading it)")

    def remove_derived_datasets(self) -> list[Path]:
        """Delete the datasets built from this store's rows; returns the files removed."""
        removed = []
        for path in paths.training_sets(self.path.parent):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(path)
        return removed

    # -- writing ---------------------------------------------------------------------------------

    @staticmethod
    def check(cmd: str) -> RecordResult:
        """Whether `cmd` may be stored, and why not."""
        if not cmd.strip():
            return RecordResult(False, "empty")
        if cmd.startswith(" "):
            return RecordResult(False, "leading-space")
        if len(cmd) > MAX_COMMAND_CHARS:
            return RecordResult(False, "too-long")
        if forget_command(cmd):
            return RecordResult(False, "forget-command")  # its argument is what the user wants gone
        rule = find_secret(cmd)
        if rule:
            return RecordResult(False, f"secret:{rule}")
        return RecordResult(True)

    def record(
        self,
        cmd: str,
        *,
        exit: int | None = None,
        cwd: str = "",
        git: str = "",
        session: str = "",
        ts: float | None = None,
        source: str = "shell",
        comp: Sequence[str] = (),
        env: str = "",
        duration: float | None = None,
    ) -> RecordResult:
        """Store one command (unless `check` refuses it) with its context: `comp` and `env` are the
        COMP items and ENV text of the context it was typed in; they pass the secret checks too.
        `duration`: the seconds it ran, when the shell measured them."""
        cmd, replaced = clean_text(cmd)
        cwd, git, session = clean_text(cwd)[0], clean_text(git)[0], clean_text(session)[0]
        verdict = self.check(cmd)
        extra = (_comp_text(comp), clean_env(clean_text(env)[0]))
        with self._write_transaction():
            stamp = time.time() if ts is None else ts
            self._store(verdict, cmd, exit, cwd, git, session, stamp, source, extra, duration=duration)
            if replaced and verdict.stored:
                self._meta_add("undecodable", 1)
        return verdict

    @contextlib.contextmanager
    def _write_transaction(self, *, immediate: bool = False) -> Iterator[None]:
        """BEGIN ... COMMIT under the lock: all of it or nothing. A full disk raises DiskFull.
        SQLite may have rolled the transaction back itself when the write failed (SQLITE_FULL
        can end it), so ROLLBACK runs only while one is still open: a ROLLBACK without one
        raised "cannot rollback - no transaction is active" over the real error."""
        with self._lock:
            if self._db.in_transaction:  # left open by a ROLLBACK that failed: start clean
                self._db.execute("ROLLBACK")
            self._db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException as exc:
                if self._db.in_transaction:
                    # if this fails too, the write's own error is the one to report (the next
                    # write rolls back what is left open)
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                if self._is_disk_full(exc):
                    self.last_disk_full = time.time()
                    raise DiskFull(
                        f"the disk holding {self.path.parent} is full: nothing was written"
                    ) from exc
                raise

    def _is_disk_full(self, exc: BaseException) -> bool:
        if isinstance(exc, OSError):
            return exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if not isinstance(exc, sqlite3.Error):
            return False
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code == SQLITE_FULL:
            return True
        if code != SQLITE_IOERR:
            return False
        try:  # an I/O error while growing the WAL or its index on a file system with no room left
            fs = os.statvfs(self.path.parent)
        except OSError:
            return False
        return fs.f_bavail * fs.f_frsize < 1 << 20

    def _store(
        self, verdict: RecordResult, cmd: str, exit: int | None, cwd: str, git: str, session: str, ts: float,
        source: str, extra: tuple[str, str] = ("", ""), *, duration: float | None = None,
    ) -> None:  # fmt: skip
        """Insert under the lock, inside the caller's transaction (`extra`: comp, env as stored)."""
        if not verdict.stored:
            if verdict.reason.startswith("secret:"):
                self._meta_add("dropped_secrets", 1)
            return
        self._db.execute(
            "INSERT INTO commands (ts, session, cwd, git, cmd, exit, source, comp, env, duration) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (ts, session, cwd, git, cmd, exit, source, *extra, duration),
        )
        self._meta_add("recorded_since_train", 1)

    # -- reading ---------------------------------------------------------------------------------

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM commands").fetchone()[0])

    def _rows(self, sql: str, args: tuple[object, ...]) -> list[HistoryRow]:
        with self._lock:
            return [HistoryRow.from_db(row) for row in self._db.execute(sql, args).fetchall()]

    _COLUMNS = "id, ts, session, cwd, git, cmd, exit, source, comp, env, duration, host"

    def recent(self, *, limit: int, session: str | None = None, others: bool = False) -> list[HistoryRow]:
        """The latest `limit` commands, oldest first: of every session, of `session` alone, or
        (`others`) of every session but `session`. Which of them a prediction sees is the context
        rule's (calmd/suggest/context.py `recent_context`)."""
        if not session:
            rows = self._rows(f"SELECT {self._COLUMNS} FROM commands ORDER BY id DESC LIMIT ?", (limit,))
            return rows[::-1]
        op = "!=" if others else "="
        sql = f"SELECT {self._COLUMNS} FROM commands WHERE session {op} ? ORDER BY id DESC LIMIT ?"
        return self._rows(sql, (session, limit))[::-1]

    def all_rows(
        self, *, after: int = 0, until: int | None = None, batch: int = 10_000
    ) -> Iterator[HistoryRow]:
        """Every stored command (with a row id above `after`, and at most `until`), oldest first,
        read in batches."""
        last = after
        end = INT64_MAX if until is None else until
        while True:
            rows = self._rows(
                f"SELECT {self._COLUMNS} FROM commands WHERE id > ? AND id <= ? ORDER BY id LIMIT ?",
                (last, end, batch),
            )
            if not rows:
                return
            yield from rows
            last = rows[-1].id

    def newest_after(self, n: int) -> int:
        """The row id after which the newest `n` commands lie (0 when there are no more than n)."""
        with self._lock:
            sql = "SELECT id FROM commands ORDER BY id DESC LIMIT 1 OFFSET ?"
            row = self._db.execute(sql, (n,)).fetchone()
        return int(row[0]) if row else 0

    def more_after(self, after: int, n: int) -> bool:
        """Whether more than `n` commands have a row id above `after` (costs at most n steps)."""
        with self._lock:
            sql = "SELECT 1 FROM commands WHERE id > ? ORDER BY id LIMIT 1 OFFSET ?"
            return self._db.execute(sql, (after, n)).fetchone() is not None

    def in_cwd(self, cwd: str, *, prefix: str = "", limit: int = 20) -> list[str]:
        """Distinct commands run in `cwd` that start with `prefix`, most recent first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT cmd FROM commands WHERE cwd = ? AND cmd LIKE ? ESCAPE '\\' "
                "GROUP BY cmd ORDER BY MAX(id) DESC LIMIT ?",
                (cwd, _like_prefix(prefix), limit),
            ).fetchall()
        return [c for (c,) in rows if c.startswith(prefix)]

    # -- importing -------------------------------------------------------------------------------

    def import_file(
        self,
        path: str | os.PathLike[str],
        fmt: str = "auto",
        *,
        max_bytes: int = MAX_IMPORT_BYTES,
        stop: threading.Event | None = None,
        leave_after: float | None = None,
    ) -> ImportResult:
        """Import a bash or zsh history file: the bytes of it no import read yet.

        Streamed: the file is read in chunks and committed in batches of IMPORT_BATCH commands,
        each with the part of the file read so far (`ReadMark`: an import that is stopped or
        killed goes on from there next time), so memory does not grow with the file and the
        store's lock is free between batches. At most `max_bytes` are read, the newest unread
        ones first: the older are counted in `skipped_bytes` and stay unread, for the next import
        (never marked as read). A file that is not a shell history (NUL runs or holes, binary
        data, records like /etc/passwd) is refused whole (NotAHistory), counted in `meta`
        `import_refused`. Bytes that are not UTF-8 never fail an import: they are kept as U+FFFD
        and counted; an impossible time (`valid_time`) is dropped and counted, the command kept.
        Entries timed at `leave_after` or later are read but not stored (the daemon's first start:
        the command that started it is still running; its hook records it when it ends). `stop`
        ends it after a batch."""
        p = Path(path).expanduser()
        if fmt not in ("auto", "bash", "zsh"):
            raise ValueError(f"unknown history format {fmt!r} (auto, bash or zsh)")
        with open_regular(p) as f:
            fd = f.fileno()
            st = os.fstat(fd)
            size = st.st_size
            head = os.pread(fd, FORMAT_SNIFF_BYTES, 0)
            key = f"imported:{p.resolve()}"
            with self._lock:
                mark = ReadMark.parse(self._meta_get(key) or "")
            if mark is None or mark.extent > size or head[: min(64, mark.extent)].hex() != mark.fingerprint:
                mark = ReadMark(0, (), head[:64].hex())  # never read, or rewritten (trimmed): from the start
            kind = detect_format(head, p.name) if fmt == "auto" else fmt
            multiline = kind == "bash" and _bash_timestamped(head)
            spans, budget = [], max_bytes  # what this import reads: the newest unread bytes, max_bytes
            for lo, hi in reversed(mark.unread(size)):
                if budget > 0:
                    spans.append((max(lo, hi - budget), hi))
                    budget -= hi - lo
            reason = next((why for lo, hi in spans if (why := refusal(fd, lo, hi)) is not None), None)
            if reason is not None:
                self.count_refused(p, reason)
                raise NotAHistory(
                    f"{p}: not a shell history ({reason}); nothing was imported from it. Check that it "
                    "is the file you meant; a history has one command per line"
                )
            plan = []
            for lo, hi in reversed(spans):
                if (lo, hi) not in mark.unread(size):  # cut inside an entry: the first whole one after it
                    lo = _entry_start(fd, lo, hi, kind, multiline)
                if lo < hi:
                    plan.append((lo, hi))
            left_out = sum(hi - lo for lo, hi in mark.unread(size)) - sum(hi - lo for lo, hi in plan)
            result = ImportResult(str(p), kind, 0, 0, 0, skipped_bytes=left_out)
            if not plan:
                return result
            source = _FileSource(fd, key, mark, size, kind, multiline, st.st_mtime, p.name)
            return self._import_ranges(source, plan, stop, result, leave_after)

    def _import_ranges(
        self, source: _FileSource, plan: list[tuple[int, int]], stop: threading.Event | None,
        result: ImportResult, leave_after: float | None,
    ) -> ImportResult:  # fmt: skip
        """Read the entries of each byte range of `plan` (oldest first) and store them batch by
        batch, each batch with the mark of what is read (see import_file)."""
        counts = dict.fromkeys(_COUNTS, 0)
        tally = dict.fromkeys(_COUNTS, 0)
        session, kind = f"import:{source.name}", f"import:{source.kind}"
        batch: list[tuple[Any, ...]] = []
        read = source.mark  # the ranges read completely, this import's included
        lo = position = 0  # the range being read, and how far
        complete = True
        verdicts: dict[str, RecordResult] = {}

        def flush() -> None:
            with self._write_transaction():
                if batch:
                    self._db.executemany(
                        "INSERT INTO commands (ts, session, cwd, git, cmd, exit, source, comp, env) "
                        "VALUES (?, ?, '', '', ?, NULL, ?, '', '')",
                        batch,
                    )
                self._add_import_counts(tally)
                self._meta_set(source.key, read.with_read(lo, position).text())
            for name in counts:
                counts[name] += tally[name]
                tally[name] = 0
            batch.clear()

        entries = 0  # read since the last batch
        for lo, hi in plan:
            position = lo
            for ts, raw, end in read_entries(source.fd, lo, hi, source.kind, multiline=source.multiline):
                position = end
                entries += 1
                if ts is not None and not valid_time(ts):
                    ts, bad_time = None, True
                else:
                    bad_time = False
                if raw is None:  # longer than any command: skipped unread
                    tally["skipped"] += 1
                elif leave_after is not None and ts is not None and ts >= leave_after:
                    tally["left"] += 1
                else:
                    cmd, replaced = clean_text(_text(raw))
                    verdict = verdicts.get(cmd)
                    if verdict is None:  # a history repeats itself: each distinct command is checked once
                        if len(verdicts) >= VERDICT_CACHE:
                            verdicts.clear()
                        verdict = verdicts[cmd] = self.check(cmd)
                    if verdict.stored:
                        # Without a time, the file's order is kept: one microsecond per byte before mtime.
                        stamp = ts if ts is not None else source.mtime - (source.size - end) * 1e-6
                        batch.append((stamp, session, cmd, kind))
                        tally["imported"] += 1
                        tally["undecodable"] += replaced
                        tally["bad_times"] += bad_time
                    elif verdict.reason.startswith("secret:"):
                        tally["dropped"] += 1
                    else:
                        tally["skipped"] += 1
                if entries >= IMPORT_BATCH:
                    entries = 0
                    flush()
                    if stop is not None and stop.is_set():
                        complete = False
                        break
            else:
                read = read.with_read(lo, hi)
                lo = position = hi
                continue
            break
        if complete:
            flush()
        return replace(result, imported=counts["imported"], dropped_secrets=counts["dropped"],
                       skipped=counts["skipped"], undecodable=counts["undecodable"],
                       bad_times=counts["bad_times"], left_to_hooks=counts["left"],
                       complete=complete)  # fmt: skip

    def _add_import_counts(self, tally: dict[str, int]) -> None:
        """An import batch's counts into `meta` (inside its transaction)."""
        for name, key in (("imported", "recorded_since_train"), ("dropped", "dropped_secrets"),
                          ("undecodable", "undecodable"), ("bad_times", "import_bad_times")):  # fmt: skip
            if tally[name]:
                self._meta_add(key, tally[name])

    def count_refused(self, path: Path, reason: str) -> None:
        """An import refused `path` as not a history (`calmd status` shows the count and the last)."""
        with self._lock:
            self._meta_add("import_refused", 1)
            self._meta_set("last_import_refused", f"{path}: {reason}")

    def import_position(self, path: Path) -> str | None:
        """Where the last import of `path` stopped, as its importer wrote it (None: never read)."""
        with self._lock:
            return self._meta_get(f"imported:{path.resolve()}")

    def import_entries(
        self, path: Path, kind: str, entries: Iterable[FileEntry], count: int, mtime: float,
        stop: threading.Event | None = None, mark_text: Callable[[Any], str] = str,
    ) -> ImportResult:  # fmt: skip
        """Store the commands another parser read from a history file (calmd/history/fish.py), as
        they come (an iterator: they are not held): (timestamp or None, the command or None for
        an entry read but left to the hooks, that parser's mark of where the import is after it,
        whether the entry's time was impossible). Checked and counted as `import_file`'s,
        committed in batches of IMPORT_BATCH, each with the mark of its last entry (written by
        `mark_text`, once a batch; `import_position` gives it back: a stopped or killed import
        goes on from there). Entries without a timestamp keep their order, a microsecond apart
        before `mtime` (`count`: how many entries there are)."""
        key = f"imported:{path.resolve()}"
        session, source = f"import:{path.name}", f"import:{kind}"
        counts = dict.fromkeys(_COUNTS, 0)
        tally = dict.fromkeys(_COUNTS, 0)
        verdicts: dict[str, RecordResult] = {}
        batch: list[tuple[Any, ...]] = []
        complete = True

        def flush(mark: Any) -> None:
            with self._write_transaction():  # a batch and its mark: all of it or none of it
                if batch:
                    self._db.executemany(
                        "INSERT INTO commands (ts, session, cwd, git, cmd, exit, source, comp, env) "
                        "VALUES (?, ?, '', '', ?, NULL, ?, '', '')",
                        batch,
                    )
                self._add_import_counts(tally)
                self._meta_set(key, mark_text(mark))
            for name in counts:
                counts[name] += tally[name]
                tally[name] = 0
            batch.clear()

        read, mark = 0, None
        for i, (ts, text, mark, bad_time) in enumerate(entries):
            read += 1
            if text is None:
                tally["left"] += 1
            else:
                cmd, replaced = clean_text(text)
                verdict = verdicts.get(cmd)
                if verdict is None:
                    if len(verdicts) >= VERDICT_CACHE:
                        verdicts.clear()
                    verdict = verdicts[cmd] = self.check(cmd)
                if verdict.stored:
                    stamp = ts if ts is not None else mtime - (count - i) * 1e-6
                    batch.append((stamp, session, cmd, source))
                    tally["imported"] += 1
                    tally["undecodable"] += replaced
                    tally["bad_times"] += bad_time
                else:
                    tally["dropped" if verdict.reason.startswith("secret:") else "skipped"] += 1
            if read >= IMPORT_BATCH:
                read = 0
                flush(mark)
                if stop is not None and stop.is_set() and i + 1 < count:
                    complete = False
                    break
        if read:
            flush(mark)
        return ImportResult(str(path), kind, counts["imported"], counts["dropped"], counts["skipped"],
                            counts["undecodable"], complete=complete, bad_times=counts["bad_times"],
                            left_to_hooks=counts["left"])  # fmt: skip

    def import_shell_histories(
        self, home: Path, stop: threading.Event | None = None, leave_after: float | None = None
    ) -> ShellImport:
        """The daemon's first start: import ~/.bash_history and ~/.zsh_history once (entries timed
        at `leave_after` or later are left to the hooks: `import_file`). A file that
        cannot be read or is not a history is logged (its path and why, never its text) and
        counted (`import_failures`, `import_refused`), and the other is still imported: this never
        fails. Stopped (`stop`) before it is done, it goes on from where it was at the next start."""
        outcome = ShellImport()
        if self.counter("first_start_done"):
            return outcome
        for name in SHELL_HISTORIES:
            path = home / name
            try:
                if not path.is_file():
                    continue
                result = self.import_file(path, stop=stop, leave_after=leave_after)
            except NotAHistory as exc:
                log.warning("did not import %s", exc)
                outcome.failures.append((str(path), "NotAHistory"))
                continue
            except Exception as exc:  # one bad file must not stop the daemon or the other file
                reason = type(exc).__name__ + (f" ({exc.strerror})" if isinstance(exc, OSError) else "")
                log.warning("could not import %s: %s", path, reason)
                outcome.failures.append((str(path), reason))
                with self._lock:
                    self._meta_add("import_failures", 1)
                continue
            outcome.results.append(result)
            log.info("%s", import_log_line(result))
            if not result.complete:
                return outcome  # stopped: the next start goes on
        with self._lock:
            self._meta_set("first_start_done", "1")
        return outcome


# --------------------------------------------------------------------------- history file formats

_ZSH_EXTENDED = re.compile(rb"^: *(\d+):(\d+);", re.MULTILINE)
NUL_RUN = b"\0" * 8  # a real history may hold a stray NUL (a paste); never eight in a row
BINARY_SHARE = 0.25  # of a chunk's bytes: control characters and bytes that are not UTF-8
_CONTROLS = bytes(b for b in range(32) if b not in b"\t\n\r") + b"\x7f"
# A line of colon-separated fields whose first has no space: /etc/passwd, /etc/group, /etc/shadow.
_RECORD_LINE = re.compile(rb"[^\s:#]+(?::[^:\n]*){3,}")


class NotAHistory(CalmError):
    """A file refused by an import: not a shell history (nothing of it is imported)."""


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading, refused unless it is a regular file: a FIFO would block the
    reader (opened non-blocking, then switched back), a folder or a device is no history."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        fd = -1
    mode = os.fstat(fd).st_mode if fd >= 0 else stat.S_IFDIR
    if not stat.S_ISREG(mode):
        if fd >= 0:
            os.close(fd)
        if stat.S_ISDIR(mode):
            raise NotAHistory(f"{path}: a folder, not a history file; give the file inside it")
        raise NotAHistory(f"{path}: not a regular file (a FIFO, a socket or a device); give a history file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=0)


def check_history_file(path: Path) -> None:
    """NotAHistory (one line saying why) unless `path` is a regular file that reads as a shell
    history (`refusal` over its newest MAX_IMPORT_BYTES); OSError when it cannot be read."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        reason = refusal(f.fileno(), max(0, size - MAX_IMPORT_BYTES), size)
    if reason is not None:
        raise NotAHistory(f"{path}: not a shell history ({reason}); give a bash or zsh history file")


def refusal(fd: int, start: int, end: int) -> str | None:
    """Why the bytes [start, end) of a file are not a shell history, or None. Reads them once, a
    chunk at a time; a sparse file's holes are found without reading them (SEEK_HOLE)."""
    try:
        hole = os.lseek(fd, start, os.SEEK_HOLE)
    except OSError:  # a file system that cannot tell: the chunks are read all the same
        hole = end
    if hole < end:
        return f"a hole of NUL bytes at byte {hole:,}, as a crash or a full disk can leave a file"
    position = start
    sample = b""
    while position < end:
        chunk = os.pread(fd, min(IMPORT_CHUNK, end - position), position)
        if not chunk:
            break
        nul = chunk.find(NUL_RUN)
        if nul >= 0:
            at = position + nul
            return f"a run of NUL bytes at byte {at:,}, as a crash or a full disk can leave a file"
        nuls = chunk.count(0)
        if nuls > max(1, len(chunk) // 1000):  # a stray NUL is a paste; one in a thousand bytes is data
            return f"NUL bytes all through it ({nuls:,} from byte {position:,}): binary data, not text"
        if len(chunk) >= 64:
            controls = len(chunk) - len(chunk.translate(None, _CONTROLS))
            undecodable = chunk.decode("utf-8", "replace").count("\ufffd")
            if controls + undecodable > BINARY_SHARE * len(chunk):
                return f"binary data at byte {position:,}, not text"
        if not sample:
            sample = chunk[:FORMAT_SNIFF_BYTES]
        position += len(chunk)
    lines = [line for line in sample.split(b"\n")[:1000] if line.strip() and not _is_bash_timestamp(line)]
    records = sum(1 for line in lines if _RECORD_LINE.fullmatch(line.rstrip(b"\r")))
    if len(lines) >= 3 and records >= 0.9 * len(lines):
        return "lines of colon-separated fields, like /etc/passwd, not commands"
    return None


def detect_format(raw: bytes, name: str = "") -> str:
    """`zsh` when most entries look like `: <epoch>:<duration>;cmd` (lines that continue the one
    before, which ends in a backslash, are not entries), or when a file of neither kind is named
    for zsh (`.zsh_history`, `zhistory`: zsh's plain format); else `bash`."""
    head = raw[:FORMAT_SNIFF_BYTES]
    lines = head.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    entries = sum(1 for i, line in enumerate(lines) if i == 0 or not lines[i - 1].endswith(b"\\"))
    extended = len(_ZSH_EXTENDED.findall(head))
    if extended and extended * 2 >= entries:
        return "zsh"
    named = name.lower()
    if "zsh" in named or "zhist" in named:
        return "zsh" if not any(_is_bash_timestamp(line) for line in lines[:100]) else "bash"
    return "bash"


def unmetafy(raw: bytes) -> bytes:
    """zsh stores bytes 0x83-0x9f and NUL 'metafied': 0x83 followed by the byte XOR 0x20."""
    if b"\x83" not in raw:
        return raw
    out = bytearray()
    it = iter(raw)
    for byte in it:
        if byte == 0x83:
            nxt = next(it, None)
            if nxt is not None:
                out.append(nxt ^ 0x20)
        else:
            out.append(byte)
    return bytes(out)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _is_bash_timestamp(line: bytes) -> bool:
    """`#<digits>`: the time of the next entry (bash with HISTTIMEFORMAT set, readline's rule)."""
    return line[:1] == b"#" and line[1:2].isdigit()


def _bash_timestamped(head: bytes) -> bool:
    """A bash history that starts with a timestamp delimits its entries by timestamps: the lines
    between two are one entry (a multi-line command, with `shopt -s lithist`), as readline reads
    it (history_multiline_entries)."""
    return _is_bash_timestamp(head.split(b"\n", 1)[0])


Entry = tuple[float | None, bytes | None, int]  # (timestamp, command bytes or None: too long, end offset)


def file_lines(fd: int, start: int, end: int) -> Iterator[tuple[bytes | None, int]]:
    """(line without its newline or None when it is longer than MAX_ENTRY_BYTES, offset after
    it) for the bytes [start, end) of `fd`, read a chunk at a time. A CR before the newline is
    dropped (a file that went through Windows); a last line without a newline counts."""
    carry = b""
    base = start  # the file offset where `carry` begins
    dropping = False  # inside a line too long to keep: skip to its newline
    position = start
    while position < end:
        chunk = os.pread(fd, min(IMPORT_CHUNK, end - position), position)
        if not chunk:
            break
        position += len(chunk)
        parts = (carry + chunk).split(b"\n")
        carry = parts.pop()
        for part in parts:
            after = base + len(part) + 1
            if dropping:
                dropping = False
                yield None, after
            else:
                yield (part[:-1] if part.endswith(b"\r") else part), after
            base = after
        del parts, chunk  # before the next chunk is read: one chunk's lines in memory, not two
        if len(carry) > MAX_ENTRY_BYTES:
            dropping = True
            base += len(carry)
            carry = b""
    if dropping:
        yield None, position
    elif carry:
        yield (carry[:-1] if carry.endswith(b"\r") else carry), base + len(carry)


def read_entries(fd: int, start: int, end: int, kind: str, *, multiline: bool = False) -> Iterator[Entry]:
    """The entries of a history file's bytes [start, end), oldest first, as the shell reads them.

    bash: one command per line; `#<epoch>` lines (HISTTIMEFORMAT) time the next command; in a file
    that starts with one, the lines up to the next timestamp are one entry (`multiline`).
    zsh: `: <epoch>:<duration>;cmd` (extended) or plain lines (a leading `:` escaped as `\\:`);
    a line ending in a backslash goes on on the next line (a newline of the command); a command
    that ends in a backslash was written with a space after it, which is dropped; metafied bytes
    are decoded. An entry longer than MAX_ENTRY_BYTES comes as None (skipped, never read whole).
    """
    if kind not in ("bash", "zsh"):
        raise ValueError(f"unknown history format {kind!r} (bash or zsh)")
    lines = file_lines(fd, start, end)
    yield from (_zsh_entries(lines) if kind == "zsh" else _bash_entries(lines, multiline))


def _bash_entries(lines: Iterator[tuple[bytes | None, int]], multiline: bool) -> Iterator[Entry]:
    stamp: float | None = None
    pending: list[bytes] | None = None  # the lines of the entry being read (multi-line files)
    pending_ts: float | None = None
    pending_end = 0
    too_long = False
    for line, end in lines:
        if line is not None and _is_bash_timestamp(line):
            if pending is not None:
                yield pending_ts, None if too_long else b"\n".join(pending), pending_end
                pending, too_long = None, False
            digits = re.match(rb"#(\d+)", line)  # all of them: a time cut to 12 digits is no time either
            stamp = time_of(digits.group(1)) if digits else None  # an impossible one: `valid_time`
            continue
        if multiline and pending is not None:
            if line is None or too_long or sum(map(len, pending)) + len(line) > MAX_ENTRY_BYTES:
                too_long = True
            else:
                pending.append(line)
            pending_end = end
            continue
        if pending is not None:
            yield pending_ts, None if too_long else b"\n".join(pending), pending_end
            too_long = False
        if line is None:
            pending, too_long = [], True
        else:
            pending = [line]
        pending_ts, pending_end, stamp = stamp, end, None
        if not multiline:
            yield pending_ts, None if too_long else b"\n".join(pending), pending_end
            pending, too_long = None, False
    if pending is not None:
        yield pending_ts, None if too_long else b"\n".join(pending), pending_end


def _zsh_entries(lines: Iterator[tuple[bytes | None, int]]) -> Iterator[Entry]:
    parts: list[bytes] = []
    size = 0
    too_long = False
    end = 0
    for line, end in lines:
        if line is None or too_long or size + len(line) > MAX_ENTRY_BYTES:
            too_long = True
            line = b""
        if line.endswith(b"\\"):
            parts.append(line[:-1])  # the backslash stood for a newline of the command
            size += len(line)
            continue
        parts.append(line)
        raw = None if too_long else _zsh_entry(b"\n".join(parts))
        yield (None if raw is None else raw[0]), (None if raw is None else raw[1]), end
        parts, size, too_long = [], 0, False
    if parts:  # a continuation cut by the end of the file
        raw = None if too_long else _zsh_entry(b"\n".join(parts))
        yield (None if raw is None else raw[0]), (None if raw is None else raw[1]), end


def _zsh_entry(raw: bytes) -> tuple[float | None, bytes]:
    """One joined zsh entry -> (timestamp, command bytes)."""
    trimmed = raw.rstrip(b" ")
    if trimmed != raw and trimmed.endswith(b"\\"):
        raw = raw[:-1]  # zsh writes a space after a command that ends in a backslash
    raw = unmetafy(raw)
    match = _ZSH_EXTENDED.match(raw)
    if match:
        return time_of(match.group(1)), raw[match.end() :]
    if raw.startswith(b"\\:"):
        raw = raw[1:]  # a plain line that starts with `:` is written `\:`
    return None, raw


def _entry_start(fd: int, offset: int, end: int, kind: str, multiline: bool) -> int:
    """The offset of the first entry that starts at or after `offset`: the start of a line that
    follows a line not ending in a backslash (zsh), a timestamp line (a multi-line bash file),
    any line (bash); `end` when there is none. The line before is read from 3 bytes before
    `offset` on: when `offset` is a line's start, the end of the line before (`\\`, `\\\r`) says
    whether it goes on (an entry once seemed to start at a zsh continuation line so)."""
    start = max(0, offset - 3)
    prev_line: bytes | None = None
    first = True  # the first line read is partial: never an entry's start
    for line, after in file_lines(fd, start, end):
        if not first and start >= offset:
            if kind == "bash" and multiline:
                begins = line is not None and _is_bash_timestamp(line)
            else:
                begins = kind == "bash" or prev_line is None or not prev_line.endswith(b"\\")
            if begins:
                return start
        first, prev_line, start = False, line, after
    return end


def parse_history(raw: bytes, kind: str) -> Iterator[tuple[float | None, str]]:
    """(timestamp or None, command) pairs of a whole history file in memory, oldest first, as
    `read_entries` reads them (entries too long to be commands left out)."""
    import tempfile

    with tempfile.TemporaryFile() as f:
        f.write(raw)
        f.flush()
        multiline = kind == "bash" and _bash_timestamped(raw[:FORMAT_SNIFF_BYTES])
        for ts, cmd, _ in read_entries(f.fileno(), 0, len(raw), kind, multiline=multiline):
            if cmd is not None:
                yield ts, _text(cmd)
