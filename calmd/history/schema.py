"""What a history store's file holds: calm's tables (SCHEMA_VERSION), the migration of a store an
older calmd wrote (its tables, its impossible times), and the check, when it is opened, that the
file's tables are calm's.

A file SQLite opens may still not be a calmd store: a table of another program under one of calm's
names (lacking a column calm writes), or a view in a table's place (`meta` as a view read well and
failed at the first write: "unexpected OperationalError: cannot modify meta because it is a view",
issue 39). `check_tables` compares each table and index the schema makes with the one the file
holds (its kind, its table, the columns calm reads and writes), and `not_calms` turns what SQLite
says of such a schema into one line naming the file. The read-only views open the store on their
own (calmd/history/query/connection.py): they write nothing, and read such a file as it is.
"""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path

from calmd.errors import CalmError
from calmd.history import coverage
from calmd.protocol import TS_MAX

SCHEMA_VERSION = 5  # 2: no prev_cmd column (nothing read it); 3: comp and env (the context's COMP, ENV);
# 4: duration (seconds the command ran, when the shell said); 5: host, origin, origin_id and the sync
# tables (calmd/sync/: the history shared between machines)
TABLES = """
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
# Schema 5, after the migration has added the columns (calmd/sync/, docs/sync.md). A row's
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
SYNC_TABLES = """
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


# SQLite's primary result codes that say what a file holds, not what happened to it: an error in a
# statement the schema made (SQLITE_ERROR: no such column, a view where a table was), a corrupt
# file, a value of the wrong kind, a constraint calm's tables do not have. A locked store, a full
# disk, an I/O error, a file that cannot be opened stay what they are.
_SCHEMA_CODES = {1, 11, 19, 20, 26}  # ERROR, CORRUPT, CONSTRAINT, MISMATCH, NOTADB
_GIVE = "give a history.sqlite3 calm wrote, or a new path"


def not_calms(exc: sqlite3.DatabaseError, path: Path) -> CalmError | None:
    """The one line for `exc`, raised while the store at `path` was opened, when it says the file
    is not a calmd store; None when it is another failure (locked, disk full)."""
    code = getattr(exc, "sqlite_errorcode", 1) & 0xFF
    return CalmError(f"{path}: not a calmd history store ({exc}); {_GIVE}") if code in _SCHEMA_CODES else None


def schema_version(db: sqlite3.Connection, path: Path) -> int | None:
    """The store's schema version (None: a new store); CalmError when it is not a number, or newer
    than this calmd."""
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        return None
    version = str(row[0])
    if not version.isdigit():
        raise CalmError(f"{path}: its schema version {version[:20]!r} is not a number: not a calmd history "
                        f"store; {_GIVE}")  # fmt: skip
    if int(version) > SCHEMA_VERSION:
        raise CalmError(f"{path}: history schema {version} is newer than this calmd ({SCHEMA_VERSION}): "
                        "upgrade calm to use it, or give another store")  # fmt: skip
    return int(version)


def migrate(db: sqlite3.Connection, version: int) -> None:
    """Bring a history written by an older calmd to SCHEMA_VERSION (inside the caller's transaction)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(commands)")}
    if version < 2 and "prev_cmd" in columns:
        db.execute("ALTER TABLE commands DROP COLUMN prev_cmd")
    if version < 3:  # older records: no COMP or ENV known (empty frames, as they were served)
        for column in ("comp", "env"):
            if column not in columns:
                db.execute(f"ALTER TABLE commands ADD COLUMN {column} TEXT NOT NULL DEFAULT ''")
    if version < 4 and "duration" not in columns:  # older records: how long they ran is unknown
        db.execute("ALTER TABLE commands ADD COLUMN duration REAL")
    if version < 5:  # older records: all of this machine, none shared yet
        text = "TEXT NOT NULL DEFAULT ''"
        for column, kind in (("host", text), ("origin", text), ("origin_id", "INTEGER")):
            if column not in columns:
                db.execute(f"ALTER TABLE commands ADD COLUMN {column} {kind}")
    db.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
    )


_IMPOSSIBLE = "ts < 0 OR ts > ?"  # a time no command ran at (recorded.valid_time)


def impossible_times(db: sqlite3.Connection) -> bool:
    """Whether a row holds an impossible time (`repair_times`): two probes of the `ts` index."""
    return db.execute(f"SELECT 1 FROM commands WHERE {_IMPOSSIBLE} LIMIT 1", (TS_MAX,)).fetchone() is not None


def repair_times(db: sqlite3.Connection) -> int:
    """Give the rows an older calmd stored with an impossible time (an import before issue 30 kept
    `: 999999999999:0;ls` as the year 33658, a negative fish `when:` as 1969, a 400-digit one as
    infinity) the time of the row before them (inside the caller's transaction); how many."""
    before = (
        "SELECT c.ts FROM commands c WHERE c.id < commands.id AND c.ts BETWEEN 0 AND ? ORDER BY c.id DESC"
    )
    sql = f"UPDATE commands SET ts = coalesce(({before} LIMIT 1), 0) WHERE {_IMPOSSIBLE}"
    return db.execute(sql, (TS_MAX, TS_MAX)).rowcount


@functools.cache
def _expected() -> dict[str, tuple[str, str, frozenset[str]]]:
    """Each table and index the schema makes: name -> (kind, its table, a table's columns), as
    SQLite reads the schema's own text (made once, in memory)."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(TABLES + SYNC_TABLES + coverage.SCHEMA)
        found = {}
        for kind, name, table in mem.execute("SELECT type, name, tbl_name FROM sqlite_master "
                                             "WHERE name NOT LIKE 'sqlite_%'"):  # fmt: skip
            columns = (
                frozenset(row[1] for row in mem.execute(f"PRAGMA table_info({name})"))
                if kind == "table"
                else frozenset()
            )
            found[name] = (kind, table, columns)
        return found
    finally:
        mem.close()


def check_tables(db: sqlite3.Connection, path: Path) -> None:
    """CalmError unless every table and index of the schema is in the file as calm makes it (the
    module's docstring): its kind, its table, every column."""
    held = {
        name: (kind, table)
        for kind, name, table in db.execute("SELECT type, name, tbl_name FROM sqlite_master")
    }
    for name, (kind, table, columns) in _expected().items():
        what = _unlike(name, kind, table, held.get(name))
        if what is None and columns:
            missing = columns - {row[1] for row in db.execute(f"PRAGMA table_info({name})")}
            what = f"{name} has no column {min(missing)}" if missing else None
        if what is not None:
            raise CalmError(f"{path}: not a calmd history store ({what}); {_GIVE}")


def _unlike(name: str, kind: str, table: str, held: tuple[str, str] | None) -> str | None:
    """How the file's `name` differs from the schema's `kind` of `table`; None: it does not."""
    if held is None:
        return f"no {kind} {name}"
    if held[0] != kind:
        return f"{name} is a {held[0]}, not a {kind}"
    return f"{name} is an index of {held[1]}, not of {table}" if held[1] != table else None
