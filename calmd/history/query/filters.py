"""What `calm history` and `calm stats` select: HistoryFilter (every field optional, all of them
must hold) as a WHERE clause over the store's indexes, in time order with the newest `limit`, and
the rows read whole, each passing the detector's gate (connection.py) while the store awaits its
re-scan.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from calmd.errors import CalmError
from calmd.history.query.connection import compiled_pattern, scanned_by_this_detector, shown
from calmd.history.recorded import clean_text
from calmd.protocol import TS_MAX
from calmd.visible import quoted


@dataclass(frozen=True)
class HistoryFilter:
    """What `calm history` and `calm stats` select (every field optional; all of them must hold)."""

    cwd: str | None = None  # run in this folder
    below: bool = False  # ... or in a folder under it
    session: str | None = None
    exit: int | None = None  # this exact status
    failed: bool | None = None  # True: a non-zero status; False: 0 or no status (imported)
    since: float | None = None  # seconds since the epoch, inclusive
    until: float | None = None  # exclusive
    pattern: str = ""  # a substring of the command (case-sensitive), or with `regex` a Python regex
    regex: bool = False
    limit: int = 0  # only the newest `limit` (0: all)
    host: str | None = None  # recorded on this machine (its name, or '' for this one)
    this_host: str = ""  # this machine's name (`this_host(db)`): its records are stored with host ''

    def where(self) -> tuple[str, list[Any]]:
        """SQL and its arguments. A text holding bytes that are not UTF-8 (a Latin-1 folder's name,
        a pattern typed so) is looked for as the store keeps such bytes: U+FFFD (`clean_text`)."""
        clauses: list[str] = []
        args: list[Any] = []
        if self.cwd is not None:
            folder = clean_text(self.cwd)[0].rstrip("/") or "/"
            if self.below:
                clauses.append("(cwd = ? OR substr(cwd, 1, ?) = ?)")
                inside = folder if folder.endswith("/") else folder + "/"
                args += [folder, len(inside), inside]
            else:
                clauses.append("cwd = ?")
                args.append(folder)
        if self.session is not None:
            clauses.append("session = ?")
            args.append(clean_text(self.session)[0])
        if self.host is not None:
            if self.host in ("", self.this_host):
                clauses.append("host IN ('', ?)")  # this machine's records keep '' (and its name, if renamed)
                args.append(self.this_host)
            else:
                clauses.append("host = ?")
                args.append(clean_text(self.host)[0])
        if self.exit is not None:
            clauses.append("exit = ?")
            args.append(self.exit)
        if self.failed is True:
            clauses.append("exit IS NOT NULL AND exit != 0")
        elif self.failed is False:
            clauses.append("(exit IS NULL OR exit = 0)")
        # a time that is not one (known_ts) is neither since nor until anything: a text or an
        # infinity would sort after every number
        if self.since is not None:
            clauses.append(f"ts BETWEEN ? AND {TS_MAX:.0f}")
            args.append(self.since)
        if self.until is not None:
            clauses.append("ts >= 0 AND ts < ?")
            args.append(self.until)
        if self.pattern:
            pattern = clean_text(self.pattern)[0]
            if self.regex:
                try:
                    compiled_pattern(pattern)
                except re.error as exc:
                    raise CalmError(
                        f"--regex: {quoted(self.pattern)} is not a valid regular expression: {exc}"
                    ) from None
                clauses.append("calm_regexp(?, cmd)")
            else:
                clauses.append("instr(cmd, ?) > 0")
            args.append(pattern)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def ordered(filt: HistoryFilter, columns: str, extra: Sequence[Any] = ()) -> tuple[str, list[Any]]:
    """SQL and its arguments for `columns` of the rows `filt` selects, in time order; `extra`: the
    values of the `?` in `columns` (which come first in the statement)."""
    where, args = filt.where()
    sql = f"SELECT {columns} FROM commands{where} ORDER BY ts, id"
    args = [*extra, *args]
    if filt.limit:
        newest = f"SELECT {columns}, ts AS t_, id AS i_ FROM commands{where} ORDER BY ts DESC, id DESC " \
            "LIMIT ?"  # fmt: skip
        sql = f"SELECT * FROM ({newest}) ORDER BY t_, i_"
        args.append(filt.limit)
    return sql, args


def rows(db: sqlite3.Connection, filt: HistoryFilter, columns: str) -> Iterator[tuple[Any, ...]]:
    """The `columns` (which hold `cmd`) of the commands `filt` selects, in time order. Read whole
    at once (the index on `ts` keeps the sort cheap), never as they are printed: a read left open
    while `calm history | less` waits would hold up the checkpoint of the daemon's next deletion."""
    sql, args = ordered(filt, columns)
    cursor = iter(db.execute(sql, args).fetchall())
    if scanned_by_this_detector(db):
        if filt.limit:
            width = len(columns.split(","))
            return (row[:width] for row in cursor)
        return cursor
    at = [c.strip() for c in columns.split(",")].index("cmd")
    width = len(columns.split(","))
    return (row[:width] for row in cursor if shown(row[at]))
