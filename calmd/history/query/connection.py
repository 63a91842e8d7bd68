"""The read-only connection every query reads through, and the gate between the store and a view.

`open_read_only` opens the store as SQLite's `mode=ro` (never writing, migrating or taking the
write lock), refuses a store from a newer calmd, reads one from an older calmd as the migration
would fill its missing columns (`_older_columns`), and registers the regular expression function
the filters' `--regex` needs (`calm_regexp`).

The gate: until this calmd's credential detector has scanned the store (`scanned_by_this_detector`),
every row read passes `shown` (HistoryStore.check) again, and one it flags is never shown.
"""

from __future__ import annotations

import os
import re
import sqlite3
import urllib.parse
from pathlib import Path

from calmd.errors import CalmError
from calmd.history.store import SCHEMA_VERSION, HistoryStore
from calmd.secrets import DETECTOR_VERSION


class NoHistory(CalmError):
    """There is no history store at the path (nothing recorded or imported yet)."""


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the store at `path`; NoHistory when there is none, CalmError for
    a file that is not a calmd history or is newer than this calmd."""
    if not path.is_file():
        raise NoHistory(f"{path}: no history yet (start calmd, or run `calm import FILE`)")
    uri = "file:" + urllib.parse.quote(os.fsencode(path.resolve())) + "?mode=ro"  # a path's own bytes
    # autocommit: no statement ever opens a transaction that would outlive it (an open read would
    # hold up the checkpoint after the daemon's next deletion)
    db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA busy_timeout=5000")  # a checkpoint after `calm forget` holds readers briefly
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as exc:
        db.close()
        raise CalmError(f"{path}: not a calmd history store ({exc})") from None
    text = str(row[0]) if row else "0"
    if not text.isdigit():
        db.close()
        raise CalmError(f"{path}: its schema version {text[:20]!r} is not a number: not a calmd store")
    version = int(text)
    if version > SCHEMA_VERSION:
        db.close()
        raise CalmError(
            f"{path}: history schema {version} is newer than this calmd ({SCHEMA_VERSION}): upgrade calm"
        )
    if version < SCHEMA_VERSION:
        _older_columns(db)
    db.create_function("calm_regexp", 2, _regexp, deterministic=True)
    return db


# The columns later schemas added that the views read, each as the migration fills it for older
# rows: a store from an older calmd is read as it is (read-only: the daemon migrates it at its next
# start), its rows all this machine's (`host` '') and of unknown duration.
_ADDED_COLUMNS = {"duration": "NULL", "host": "''"}


def _older_columns(db: sqlite3.Connection) -> None:
    """For a store whose `commands` lacks some of _ADDED_COLUMNS: a temporary view of the same
    name (in the connection's own temp schema, which shadows the file's table; nothing is written
    to the store) that adds them, so every query here reads one schema."""
    present = {row[1] for row in db.execute("PRAGMA main.table_info(commands)")}
    missing = [f"{value} AS {name}" for name, value in _ADDED_COLUMNS.items() if name not in present]
    if present and missing:
        db.execute(f"CREATE TEMP VIEW commands AS SELECT *, {', '.join(missing)} FROM main.commands")


def _regexp(pattern: str, text: str) -> bool:
    return compiled_pattern(pattern).search(text) is not None


_PATTERNS: dict[str, re.Pattern[str]] = {}


def compiled_pattern(pattern: str) -> re.Pattern[str]:
    """`pattern` compiled, kept for the next row (a few kept: a query asks for one or two)."""
    found = _PATTERNS.get(pattern)
    if found is None:
        if len(_PATTERNS) > 16:
            _PATTERNS.clear()
        found = _PATTERNS[pattern] = re.compile(pattern)
    return found


def column_text(value: object) -> str:
    """A text column as text, whatever an old or hand-made store holds in it (NULL: empty)."""
    return value if isinstance(value, str) else "" if value is None else str(value)


def shown(cmd: str) -> bool:
    """Whether a stored command may be shown: what the store would store today."""
    return isinstance(cmd, str) and HistoryStore.check(cmd).stored


def scanned_by_this_detector(db: sqlite3.Connection) -> bool:
    """Whether every row has passed this calmd's credential detector (stored or re-scanned by it)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'detector_version'").fetchone()
    return row is not None and int(row[0]) >= DETECTOR_VERSION
