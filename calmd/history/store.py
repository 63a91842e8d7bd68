"""The history store: every executed command, in SQLite (WAL), with what the ranking needs.

One row per executed command: time, shell session, cwd, git branch, the command, its exit code,
the command that ran before it in the same session (for "what follows what"), and where it came
from (`shell` for the hooks, `import:bash` / `import:zsh` for imported history files).

Filters, applied to everything stored (docs/history.md):
- commands that start with a space are not stored (the bash/zsh `ignorespace` convention);
- commands holding credentials (calmd/secrets/) are dropped and counted, never stored;
- empty commands and commands over 64 KiB are ignored;
- bytes that are not UTF-8 (and NULs) are stored as U+FFFD and counted, never a failure.

A record from a hook may be a run an import stored before it arrived, and a pause (a command run
while recording was paused: its time, never its text) may find its line imported: the store takes
the imported row over, or deletes it (calmd/history/coverage.py).

Forgetting: a store scanned by an older credential detector is re-scanned when opened, and
`forget` deletes what matches a pattern; both delete for good (SQLite's secure_delete, then the
WAL checkpointed and truncated, then the datasets built from the old rows removed) and bump a
generation counter that the daemon's in-memory caches compare against.

History files are read by calmd/history/formats.py and calmd/history/fish.py and imported by
calmd/history/imports.py (`import_file`, `import_shell_histories` here are its entry points).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calmd import paths
from calmd.errors import CalmError, DiskFull
from calmd.history import coverage, schema
from calmd.history.formats import MAX_COMMAND_CHARS, MAX_IMPORT_BYTES
from calmd.history.recorded import RecordResult, clean_env, clean_text, comp_items, comp_text
from calmd.history.schema import SCHEMA_VERSION, SYNC_KEPT
from calmd.protocol import INT64_MAX
from calmd.secrets import DETECTOR_VERSION, find_secret, forget_command

if TYPE_CHECKING:
    from calmd.history.imports import ImportResult, ShellImport

log = logging.getLogger("calmd.history.store")

SQLITE_FULL = 13  # the primary result code of "database or disk is full"
SQLITE_IOERR = 10  # a failed write or shm growth; disk full when the file system has no space left


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
    host: str = ""  # the machine that recorded it (schema 5; '': this one, calmd/sync/)

    @classmethod
    def from_db(cls, row: tuple[Any, ...]) -> HistoryRow:
        rid, ts, session, cwd, git, cmd, code, source, comp, env, duration, host = row
        return cls(rid, ts, session, cwd, git, cmd, code, source, comp_items(comp), env, duration, host)


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
        self.last_disk_full: float | None = None  # when a write last failed for lack of space
        try:
            self._prepare()
        except sqlite3.DatabaseError as exc:  # a table of another program, a view (schema.py)
            said = schema.not_calms(exc, self.path)
            if said is None:
                raise
            self._db.close()
            raise said from None
        os.chmod(self.path, 0o600)  # it is the user's whole shell history
        self.rescanned = self._rescan_if_outdated()
        self._repair_times()

    def _repair_times(self) -> None:
        """The impossible times an older calmd stored, repaired (schema.repair_times): `calm history`,
        `calm stats` and the rankings read times as times."""
        with self._lock:
            if not schema.impossible_times(self._db):
                return
        try:
            with self._write_transaction():
                repaired = schema.repair_times(self._db)
                self._meta_add("import_bad_times", repaired)
        except (DiskFull, sqlite3.OperationalError) as exc:  # the store still opens: the next open repairs
            log.warning("could not repair the impossible times of %s: %s", self.path, exc)
            return
        log.info("%d stored commands had an impossible time: given the time of the command before", repaired)

    def _prepare(self) -> None:
        """calm's tables made, an older calmd's store migrated, and the file's tables checked
        (calmd/history/schema.py); CalmError for a store of a newer calmd or one that is not calm's."""
        with self._lock:
            self._db.executescript(schema.TABLES)
            version = schema.schema_version(self._db, self.path)
            if version is None:
                self._meta_set("schema_version", str(SCHEMA_VERSION))
        if version is not None and version < SCHEMA_VERSION:
            with self._write_transaction():
                schema.migrate(self._db, version)
        with self._lock:
            self._db.executescript(schema.SYNC_TABLES)
            self._db.executescript(coverage.SCHEMA)  # the paused moments (no schema version: a table more)
            schema.check_tables(self._db, self.path)

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

    def forget_command(self, cmd: str) -> tuple[int, int]:
        """Delete every run of exactly `cmd`, for good (the history search's delete key): what
        `forget` does, with the rows found through the `cmd` index instead of a scan of all.
        Returns how many rows went, and the newest row id left right after (0: none): a row
        stored later has a larger id, but not always one larger than the deleted rows' (SQLite
        gives the newest rows' ids again), so a reader that goes on by id must go on from there."""
        with self._lock:
            doomed = [rid for (rid,) in self._db.execute("SELECT id FROM commands WHERE cmd = ?", (cmd,))]
        newest: list[int] = []
        return self._delete_ids(doomed, newest_left=newest), (newest[0] if newest else 0)

    def _delete_matching(self, match: Callable[[str], bool], *, counter: str = "") -> int:
        """Delete the matching rows and every trace of them (`_delete_ids`)."""
        return self._delete_ids([row.id for row in self.all_rows() if match(row.cmd)], counter=counter)

    def _delete_ids(
        self,
        doomed: list[int],
        *,
        counter: str = "",
        leave_sync: bool = False,
        newest_left: list[int] | None = None,
    ) -> int:
        """Delete these rows and every trace of them: deleted cells are zeroed (secure_delete);
        the WAL, which still holds the pages as they were, is checkpointed and truncated; the
        datasets built from the old rows are removed; the generation is bumped. The shared ones
        are remembered as forgotten, to be sent (`_remember_forgotten`), unless `leave_sync`
        (`forget_all`)."""
        if not doomed and not leave_sync:
            return 0
        with self._write_transaction():
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
            if newest_left is not None:  # inside the write lock: no row came since the deletion
                (newest,) = self._db.execute("SELECT coalesce(max(id), 0) FROM commands").fetchone()
                newest_left.append(int(newest))
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
        that were shared goes to `sync_forgotten` (to be sent: calmd/sync/), so that the
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
        """Delete these rows for good, as `forget` does (calmd/sync/: a forget that came
        from another machine)."""
        return self._delete_ids(list(ids))

    @contextlib.contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """The connection inside a write transaction under the lock (all of it or nothing):
        for calmd/sync/, whose tables live in this store."""
        with self._write_transaction():
            yield self._db

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock, for reads (calmd/sync/)."""
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
        `duration`: the seconds it ran, when the shell measured them. A hook's record of a run an
        import stored meanwhile takes that row over (calmd/history/coverage.py): one row."""
        cmd, replaced = clean_text(cmd)
        cwd, git, session = clean_text(cwd)[0], clean_text(git)[0], clean_text(session)[0]
        verdict = self.check(cmd)
        extra = (comp_text(comp), clean_env(clean_text(env)[0]))
        with self._write_transaction():
            stamp = time.time() if ts is None else ts
            imported = coverage.imported_run(self._db, cmd, stamp, session) if verdict.stored and \
                source == "shell" else None  # fmt: skip
            if imported is not None:
                self._db.execute(
                    "UPDATE commands SET ts = ?, session = ?, cwd = ?, git = ?, exit = ?, source = ?, "
                    "comp = ?, env = ?, duration = ? WHERE id = ?",
                    (stamp, session, cwd, git, exit, source, *extra, duration, imported),
                )
            else:
                self._store(verdict, cmd, exit, cwd, git, session, stamp, source, extra, duration=duration)
            if replaced and verdict.stored:
                self._meta_add("undecodable", 1)
        return verdict

    def note_paused(self, ts: float, session: str = "") -> int:
        """A command ran at `ts` in `session` while recording was paused (`CALM_RECORD=0`): its time
        is kept, never its text, so that no import brings its line back; the line an import stored
        meanwhile is deleted for good. Returns how many rows that deleted."""
        with self._write_transaction():
            doomed = coverage.note_paused(self._db, ts, clean_text(session)[0])
        return self._delete_ids(doomed) if doomed else 0

    @contextlib.contextmanager
    def _write_transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT under the lock: all of it or nothing. A full disk raises DiskFull.
        IMMEDIATE: other processes write too (the worker's imports and syncs); a deferred BEGIN whose
        snapshot another writer outdates fails at once, "database is locked", with no busy wait.
        SQLite may have rolled the transaction back itself when the write failed (SQLITE_FULL
        can end it), so ROLLBACK runs only while one is still open: a ROLLBACK without one
        raised "cannot rollback - no transaction is active" over the real error."""
        with self._lock:
            if self._db.in_transaction:  # left open by a ROLLBACK that failed: start clean
                self._db.execute("ROLLBACK")
            self._db.execute("BEGIN IMMEDIATE")
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

    # -- importing (calmd/history/imports.py) ------------------------------------------------------

    def import_file(
        self, path: str | os.PathLike[str], fmt: str = "auto", *, max_bytes: int = MAX_IMPORT_BYTES,
        stop: threading.Event | None = None, leave_after: float | None = None,
    ) -> ImportResult:  # fmt: skip
        """Import a bash or zsh history file: calmd/history/imports.py `import_file`."""
        from calmd.history import imports

        return imports.import_file(self, path, fmt, max_bytes=max_bytes, stop=stop, leave_after=leave_after)

    def import_shell_histories(
        self, home: Path, stop: threading.Event | None = None, leave_after: float | None = None
    ) -> ShellImport:
        """The daemon's first-start import: calmd/history/imports.py `import_shell_histories`."""
        from calmd.history import imports

        return imports.import_shell_histories(self, home, stop, leave_after)
