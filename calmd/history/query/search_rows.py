"""The rows the daemon's history search index reads (calmd/suggest/search.py), on a read-only
connection (connection.py): lean tuples in id order, where the index starts (the newest it keeps)
and the store's deletion counter, which tells the index to read again. What the index shows passes
connection.py's `shown` as every view's rows do.
"""

from __future__ import annotations

import sqlite3
from typing import Any

BATCH = 20_000  # rows the search index reads per round trip


def rows_after(db: sqlite3.Connection, after: int, limit: int = BATCH) -> list[tuple[Any, ...]]:
    """(id, ts, session, cwd, git, cmd, exit, host) of up to `limit` rows with an id above `after`,
    oldest first: what the daemon's search index reads, as plain tuples (a HistoryRow per row
    costs five times as much on 100,000 commands)."""
    sql = "SELECT id, ts, session, cwd, git, cmd, exit, host FROM commands WHERE id > ? ORDER BY id LIMIT ?"
    return db.execute(sql, (after, limit)).fetchall()


def newest_after(db: sqlite3.Connection, n: int) -> int:
    """The row id after which the newest `n` commands lie (0 when there are no more than n)."""
    row = db.execute("SELECT id FROM commands ORDER BY id DESC LIMIT 1 OFFSET ?", (n,)).fetchone()
    return int(row[0]) if row else 0


def generation(db: sqlite3.Connection) -> int:
    """The store's deletion counter (HistoryStore.generation): rows were deleted when it moved."""
    row = db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
    return int(row[0]) if row else 0
