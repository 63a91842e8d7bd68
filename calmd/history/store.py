"""The history store: every executed command, in SQLite (WAL), with what the ranking needs.

One row per executed command: time, shell session, cwd, git branch, the command, its exit code,
the command that ran before it in the same session (for "what follows what"), and where it came
from (`shell` for the hooks, `import:bash` / `import:zsh` for imported history files).

Filters, applied to everything stored (docs/history.md):
- commands that start with a space are not stored (the bash/zsh `ignorespace` convention);
- commands holding credentials (calmd/history/secrets.py) are dropped and counted, never stored;
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
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.errors import DiskFull
from calmd.history.context import HISTORY_FRAMES, context_rows
from calmd.history.frames import COMP_ITEMS, clean_env
from calmd.history.secrets import DETECTOR_VERSION, find_secret

log = logging.getLogger("calmd.history.store")

MAX_COMMAND_CHARS = 1 << 16  # as the protocol's `record` limit: longer is not a command worth keeping
# Files built from the store's rows, under its folder (calmd/training/background.py writes them): removed
# when rows are deleted, so that a forgotten command does not live on in a dataset.
SHELL_HISTORIES = (".bash_history", ".zsh_history")

SCHEMA_VERSION = 4  # 2: no prev_cmd column (nothing read it); 3: comp and env (the context's COMP, ENV);
# 4: duration (seconds the command ran, when the shell said)
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
    duration REAL
);
CREATE INDEX IF NOT EXISTS commands_cmd ON commands (cmd);
CREATE INDEX IF NOT EXISTS commands_session ON commands (session, id);
CREATE INDEX IF NOT EXISTS commands_cwd ON commands (cwd, id);
CREATE INDEX IF NOT EXISTS commands_ts ON commands (ts);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


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
    # calmd/history/frames.py): what the datasets put in the example's frames.
    comp: tuple[str, ...] = ()
    env: str = ""
    duration: float | None = None  # seconds it ran (schema 4; None: the shell did not say, or imported)

    @classmethod
    def from_db(cls, row: tuple[Any, ...]) -> HistoryRow:
        rid, ts, session, cwd, git, cmd, code, source, comp, env, duration = row
        return cls(rid, ts, session, cwd, git, cmd, code, source, _comp_items(comp), env, duration)


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


_FORGET_COMMAND = re.compile(r"\s*(?:\S*/)?calm\s+forget(?:\s|$)")


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
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes
        self._db.execute("PRAGMA busy_timeout=5000")
        # Deleted rows are overwritten with zeros, not left in free pages (forget, re-scans).
        self._db.execute("PRAGMA secure_delete=ON")
        with self._lock:
            self._db.executescript(_SCHEMA)
            version = self._meta_get("schema_version")
            if version is None:
                self._meta_set("schema_version", str(SCHEMA_VERSION))
            elif int(version) > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path}: history schema {version} is newer than this calmd ({SCHEMA_VERSION})"
                )
        if version is not None and int(version) < SCHEMA_VERSION:
            self._migrate(int(version))
        os.chmod(self.path, 0o600)  # it is the user's whole shell history
        self.last_disk_full: float | None = None  # when a write last failed for lack of space
        self.rescanned = self._rescan_if_outdated()

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

    def reset_counter(self, key: str) -> None:
        with self._lock:
            self._meta_set(key, "0")

    def counter(self, key: str) -> int:
        with self._lock:
            return int(self._meta_get(key) or 0)

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
        dropped = self._delete_matching(lambda cmd: find_secret(cmd) is not None, counter="dropped_secrets")
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

    def forget_command(self, cmd: str) -> int:
        """Delete every run of exactly `cmd`, for good (the history search's delete key): what
        `forget` does, with the rows found through the `cmd` index instead of a scan of all."""
        with self._lock:
            doomed = [rid for (rid,) in self._db.execute("SELECT id FROM commands WHERE cmd = ?", (cmd,))]
        return self._delete_ids(doomed)

    def _delete_matching(self, match: Callable[[str], bool], *, counter: str = "") -> int:
        """Delete the matching rows and every trace of them (`_delete_ids`)."""
        return self._delete_ids([row.id for row in self.all_rows() if match(row.cmd)], counter=counter)

    def _delete_ids(self, doomed: list[int], *, counter: str = "") -> int:
        """Delete these rows and every trace of them: deleted cells are zeroed (secure_delete);
        the WAL, which still holds the pages as they were, is checkpointed and truncated; the
        datasets built from the old rows are removed; the generation is bumped."""
        if not doomed:
            return 0
        with self._write_transaction(immediate=True):
            for start in range(0, len(doomed), 500):
                chunk = doomed[start : start + 500]
                self._db.execute(f"DELETE FROM commands WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            if counter:
                self._meta_add(counter, len(doomed))
            self._meta_add("generation", 1)
        with self._lock:
            self._truncate_wal()
        self.remove_derived_datasets()
        return len(doomed)

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
        if _FORGET_COMMAND.match(cmd):
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

    _COLUMNS = "id, ts, session, cwd, git, cmd, exit, source, comp, env, duration"

    def recent(self, *, session: str | None = None, limit: int = HISTORY_FRAMES) -> list[HistoryRow]:
        """The latest `limit` commands, oldest first. With a session: the context a prediction in
        that session sees (calmd/history/context.py): its latest commands, preceded (when it has
        fewer than `limit`) by the user's latest other commands."""
        if not session:
            return self._rows(f"SELECT {self._COLUMNS} FROM commands ORDER BY id DESC LIMIT ?", (limit,))[
                ::-1
            ]
        own = self._rows(
            f"SELECT {self._COLUMNS} FROM commands WHERE session = ? ORDER BY id DESC LIMIT ?",
            (session, limit),
        )
        others: list[HistoryRow] = []
        if len(own) < limit:
            others = self._rows(
                f"SELECT {self._COLUMNS} FROM commands WHERE session != ? ORDER BY id DESC LIMIT ?",
                (session, limit - len(own)),
            )
        return context_rows(own[::-1], others[::-1], limit)

    def all_rows(self, *, after: int = 0, batch: int = 10_000) -> Iterator[HistoryRow]:
        """Every stored command (with a row id above `after`), oldest first, read in batches."""
        last = after
        while True:
            rows = self._rows(
                f"SELECT {self._COLUMNS} FROM commands WHERE id > ? ORDER BY id LIMIT ?", (last, batch)
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

    def import_file(self, path: str | os.PathLike[str], fmt: str = "auto") -> ImportResult:
        """Import a bash or zsh history file, from where the previous import of it stopped.
        Bytes that are not UTF-8 never fail an import: they are kept as U+FFFD and counted."""
        p = Path(path).expanduser()
        raw = p.read_bytes()
        key = f"imported:{p.resolve()}"
        with self._lock:
            state = self._meta_get(key)
        start = 0
        if state:
            done, _, head = state.partition(":")
            # Continue only if the file still starts with what was read (not truncated/rewritten).
            if int(done) <= len(raw) and raw[: min(64, int(done))].hex() == head:
                start = int(done)
        kind = detect_format(raw) if fmt == "auto" else fmt
        entries = list(parse_history(raw[start:], kind))
        imported = dropped = skipped = undecodable = 0
        base_ts = p.stat().st_mtime
        session, source = f"import:{p.name}", f"import:{kind}"
        with self._write_transaction():  # one transaction: all of the file or none of it
            for i, (ts, text) in enumerate(entries):
                cmd, replaced = clean_text(text)
                verdict = self.check(cmd)
                # Files without timestamps keep their order, one microsecond apart before mtime.
                stamp = ts if ts is not None else base_ts - (len(entries) - i) * 1e-6
                self._store(verdict, cmd, None, "", "", session, stamp, source)
                if verdict.stored:
                    imported += 1
                    undecodable += replaced
                elif verdict.reason.startswith("secret:"):
                    dropped += 1
                else:
                    skipped += 1
            if undecodable:
                self._meta_add("undecodable", undecodable)
            self._meta_set(key, f"{len(raw)}:{raw[:64].hex()}")
        return ImportResult(str(p), kind, imported, dropped, skipped, undecodable)

    def import_position(self, path: Path) -> str | None:
        """Where the last import of `path` stopped, as its importer wrote it (None: never read)."""
        with self._lock:
            return self._meta_get(f"imported:{path.resolve()}")

    def import_entries(
        self, path: Path, kind: str, entries: Sequence[tuple[float | None, str]], *, position: str
    ) -> ImportResult:
        """Store the commands another parser read from a history file (calmd/history/fish.py),
        checked and counted as `import_file` does, in one transaction with `position`, that
        parser's own mark of where it stopped (`import_position` gives it back)."""
        imported = dropped = skipped = undecodable = 0
        base_ts = path.stat().st_mtime
        session, source = f"import:{path.name}", f"import:{kind}"
        with self._write_transaction():  # all of it or none of it
            for i, (ts, text) in enumerate(entries):
                cmd, replaced = clean_text(text)
                verdict = self.check(cmd)
                stamp = ts if ts is not None else base_ts - (len(entries) - i) * 1e-6
                self._store(verdict, cmd, None, "", "", session, stamp, source)
                if verdict.stored:
                    imported += 1
                    undecodable += replaced
                elif verdict.reason.startswith("secret:"):
                    dropped += 1
                else:
                    skipped += 1
            if undecodable:
                self._meta_add("undecodable", undecodable)
            self._meta_set(f"imported:{path.resolve()}", position)
        return ImportResult(str(path), kind, imported, dropped, skipped, undecodable)

    def import_shell_histories(self, home: Path) -> ShellImport:
        """The daemon's first start: import ~/.bash_history and ~/.zsh_history once. A file that
        cannot be read or parsed is logged (its path and the error's type, never its text) and
        counted in `import_failures`, and the others are still imported: this never fails."""
        outcome = ShellImport()
        if self.counter("first_start_done"):
            return outcome
        for name in SHELL_HISTORIES:
            path = home / name
            try:
                if not path.is_file():
                    continue
                result = self.import_file(path)
            except Exception as exc:  # one bad file must not stop the daemon or the other file
                reason = type(exc).__name__ + (f" ({exc.strerror})" if isinstance(exc, OSError) else "")
                log.warning("could not import %s: %s", path, reason)
                outcome.failures.append((str(path), reason))
                with self._lock:
                    self._meta_add("import_failures", 1)
                continue
            outcome.results.append(result)
            log.info(
                "imported %d commands from %s (%d dropped as credentials, %d with undecodable bytes)",
                result.imported, path, result.dropped_secrets, result.undecodable,
            )  # fmt: skip
        with self._lock:
            self._meta_set("first_start_done", "1")
        return outcome


# --------------------------------------------------------------------------- history file formats

_ZSH_EXTENDED = re.compile(rb"^: *(\d+):(\d+);", re.MULTILINE)


def detect_format(raw: bytes) -> str:
    """`zsh` when most entries look like `: <epoch>:<duration>;cmd`, else `bash`."""
    head = raw[:65536]
    lines = head.count(b"\n") + 1
    return "zsh" if len(_ZSH_EXTENDED.findall(head)) * 2 >= lines else "bash"


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


def parse_history(raw: bytes, kind: str) -> Iterator[tuple[float | None, str]]:
    """(timestamp or None, command) pairs, oldest first.

    bash: one command per line; `#<epoch>` lines (HISTTIMEFORMAT) give the next command's time.
    zsh: `: <epoch>:<duration>;cmd` (extended) or plain lines; a line ending in a backslash
    continues the command on the next line (zsh writes embedded newlines that way).
    """
    if kind not in ("bash", "zsh"):
        raise ValueError(f"unknown history format {kind!r} (bash or zsh)")
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if b"\r" in raw:  # a file that went through Windows: CRLF line ends
        lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    if kind == "bash":
        stamp: float | None = None
        for line in lines:
            if line.startswith(b"#") and line[1:].isdigit():
                stamp = float(line[1:])
                continue
            yield stamp, _text(line)
            stamp = None
        return
    i = 0
    while i < len(lines):
        line = unmetafy(lines[i])
        ts: float | None = None
        match = _ZSH_EXTENDED.match(line)
        if match:
            ts = float(match.group(1))
            line = line[match.end() :]
        parts = [line]
        while parts[-1].endswith(b"\\") and i + 1 < len(lines):
            parts[-1] = parts[-1][:-1]
            i += 1
            parts.append(unmetafy(lines[i]))
        i += 1
        yield ts, _text(b"\n".join(parts))
