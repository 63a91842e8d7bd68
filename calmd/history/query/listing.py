"""`calm history`'s lines: one per selected command, oldest first, plain (`time  status  [host]
folder  command`), JSON Lines (`Entry.to_json`) or the command lines alone; each made by SQLite
when every row has passed this calmd's credential detector (a few times faster), else by Python
over the rows that pass the gate (plain_lines, json_lines): the two ways print the same bytes, and
every line passes calmd/visible.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from calmd.history.query.connection import column_text, scanned_by_this_detector
from calmd.history.query.filters import HistoryFilter, ordered, rows
from calmd.history.query.hosts import HOST_SQL, host_label, several_hosts, this_host
from calmd.history.query.times import KNOWN_TS_SQL, UNKNOWN_TIME, iso_time, known_ts, minute_text
from calmd.visible import json_escaped, json_text, visible


class Entry(NamedTuple):
    """One executed command as `calm history` shows it (a tuple: 100,000 of them are made)."""

    id: int
    ts: float
    session: str
    cwd: str
    git: str
    cmd: str
    exit: int | None
    source: str
    duration: float | None  # seconds it ran, when the shell said
    host: str = ""  # the machine that recorded it ('' : this one; calmd/sync/)

    @property
    def failed(self) -> bool:
        """The shell reported a non-zero status (imported commands carry none: never failed)."""
        return self.exit is not None and self.exit != 0

    def to_json(self, this: str = "") -> dict[str, Any]:
        """The fields of `calm history --json` (times to the millisecond, as SQLite writes them); a
        time that is not one (`known_ts`) and a duration that is not a finite number are null;
        `this`: this machine's name, the host of the records it made (`host_label`)."""
        ts = known_ts(self.ts)
        took = self.duration
        duration = round(took, 3) if isinstance(took, int | float) and abs(took) <= 1e300 else None
        return {"id": self.id, "ts": None if ts is None else round(ts, 3),
                "time": None if ts is None else iso_time(ts), "cmd": column_text(self.cmd),
                "exit": self.exit if isinstance(self.exit, int) else None, "duration": duration,
                "cwd": column_text(self.cwd), "git": column_text(self.git),
                "session": column_text(self.session), "source": column_text(self.source),
                "host": host_label(self.host, this)}  # fmt: skip


ENTRY_COLUMNS = "id, ts, session, cwd, git, cmd, exit, source, duration, host"


def select(db: sqlite3.Connection, filt: HistoryFilter) -> Iterator[Entry]:
    """The commands `filt` selects, in time order (with a limit: the newest `limit` of them)."""
    return map(Entry._make, rows(db, filt, ENTRY_COLUMNS))


def short_path(path: str, home: str) -> str:
    """`path` with the home folder written `~`."""
    if home and home != "/" and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")) :]
    return path


PLAIN_COLUMNS = "ts, exit, cwd, cmd"
HOSTS_COLUMNS = "ts, exit, host, cwd, cmd"  # with a host column: the history holds other machines'


def plain_lines(rows: Iterable[tuple[Any, ...]], home: str, this: str | None = None) -> Iterator[str]:
    """`time  status  folder  command` per (ts, exit, cwd, cmd) row (`rows(db, filt, PLAIN_COLUMNS)`),
    status blank when unknown; with `this` (this machine's name), `time  status  host  folder
    command` per (ts, exit, host, cwd, cmd) row (HOSTS_COLUMNS). Each line is `visible` (a
    multi-line command on one line: `\\n`; a host's name, which another machine chose, escaped as
    the rest). One tight loop with the minutes', hosts' and folders' text kept: 100,000 lines in a
    fraction of a second."""
    folders: dict[str, str] = {}
    minutes: dict[int, str] = {}
    statuses: dict[int | None, str] = {}
    hosts: dict[str, str] = {}
    seconds = [f":{s:02d}  " for s in range(60)]
    unknown = f"{UNKNOWN_TIME:<19}  "
    for row in rows:
        if this is None:
            ts, code, cwd, cmd = row
            host = ""
        else:
            ts, code, host, cwd, cmd = row
            label = hosts.get(host)
            if label is None:
                label = hosts[host] = host_label(host, this) + "  "
            host = label
        if known_ts(ts) is not None:
            whole = int(ts)
            minute = minutes.get(whole // 60)
            if minute is None:
                minute = minutes[whole // 60] = minute_text(whole // 60)
            when = minute + seconds[whole % 60]
        else:
            when = unknown
        status = statuses.get(code)
        if status is None:
            status = statuses[code] = f"{'' if code is None else code:>3}  "
        folder = folders.get(cwd)
        if folder is None:
            folder = folders[cwd] = short_path(column_text(cwd), home) or "-"
        yield visible(f"{when}{status}{host}{folder}  {column_text(cmd)}")


def json_lines(rows: Iterable[tuple[Any, ...]], this: str = "") -> Iterator[str]:
    """One JSON object per ENTRY_COLUMNS row (`Entry.to_json`), as SQLite's json_object writes it
    (json_text: the hidden characters as `\\u` escapes, never a NaN)."""
    for row in rows:
        yield json_text(Entry._make(row).to_json(this), compact=True)


# The same lines made by SQLite, a few times faster on 100,000 rows than formatting them in Python
# (history_lines): what `calm history` runs when every row has passed this calmd's credential
# detector. Python then passes each line through `visible` (plain, commands) or `json_escaped`
# (json), as it does the lines it makes itself: the two ways print the same bytes.
_PLAIN_SQL = (
    f"CASE WHEN {KNOWN_TS_SQL} THEN strftime('%Y-%m-%d %H:%M:%S', ts, 'unixepoch', 'localtime') "
    f"ELSE '{UNKNOWN_TIME:<19}' END || '  ' || "
    "printf('%3s', coalesce(exit, '')) || '  ' || {host}"
    "CASE WHEN coalesce(cwd, '') = '' THEN '-' "
    "WHEN ? != '' AND (cwd = ? OR substr(cwd, 1, length(?) + 1) = ? || '/') "
    "THEN '~' || substr(cwd, length(?) + 1) ELSE cwd END || '  ' || coalesce(cmd, '')"
)
_JSON_SQL = (f"json_object('id', id, 'ts', CASE WHEN {KNOWN_TS_SQL} THEN round(ts, 3) END, 'time', "
             f"CASE WHEN {KNOWN_TS_SQL} THEN strftime('%Y-%m-%dT%H:%M:%S', ts, 'unixepoch', 'localtime') "
             "END, "
             "'cmd', coalesce(cmd, ''), 'exit', CASE WHEN typeof(exit) = 'integer' THEN exit END, "
             "'duration', CASE WHEN typeof(duration) IN ('integer', 'real') AND abs(duration) <= 1e300 "
             "THEN round(duration, 3) END, "
             "'cwd', coalesce(cwd, ''), 'git', coalesce(git, ''), 'session', coalesce(session, ''), "
             "'source', coalesce(source, ''), 'host', " + HOST_SQL + ")")  # fmt: skip


def history_lines(db: sqlite3.Connection, filt: HistoryFilter, form: str, home: str = "") -> list[str]:
    """The lines of `calm history` in `form` (`plain`, `json` or `commands`), read whole at once."""
    assert form in ("plain", "json", "commands"), form
    this = filt.this_host or this_host(db)
    hosts = form == "plain" and several_hosts(db)
    if scanned_by_this_detector(db):
        home = "" if home in ("", "/") else home.rstrip("/")
        plain = _PLAIN_SQL.format(host=HOST_SQL + " || '  ' || " if hosts else "")
        expr, extra = {"plain": (plain, [this] * hosts + [home] * 5), "json": (_JSON_SQL, [this]),
                       "commands": ("coalesce(cmd, '')", [])}[form]  # fmt: skip
        try:
            sql, args = ordered(filt, expr, extra)
            shown = json_escaped if form == "json" else visible
            return [shown(line) for (line, *_) in db.execute(sql, args).fetchall()]
        except sqlite3.OperationalError as exc:  # an SQLite without json_object: Python writes it
            if "json_object" not in str(exc):
                raise
    if form == "json":
        return list(json_lines(rows(db, filt, ENTRY_COLUMNS), this))
    if form == "commands":
        return [visible(column_text(cmd)) for (cmd,) in rows(db, filt, "cmd")]
    if hosts:
        return list(plain_lines(rows(db, filt, HOSTS_COLUMNS), home, this))
    return list(plain_lines(rows(db, filt, PLAIN_COLUMNS), home))
