"""Read-only questions to the history store: `calm history`, `calm stats`, and the lean rows the
daemon's search index reads (calmd/suggest/search.py).

The store is opened on a connection of its own, read-only (SQLite's `mode=ro`): it never writes,
never migrates and never takes the write lock, so it is safe while the daemon records (WAL: a
reader sees the last committed state and neither waits for the writer nor holds it up). A store
from a newer calmd (a schema this one does not know) is refused with a clear error rather than
misread; one from an older calmd is read as it is, with the columns it lacks as the migration would
fill them (`_older_columns`). The filters are SQL over the store's indexes; what SQL cannot say (a regular
expression) is a function registered on the connection.

What is printed passes calmd/visible.py: a control character, a bidi override or an invisible
character stored in a command, a folder or a host's name (`host_label`: a synced record's host is
what another machine's segment named) is shown as an escape (`\\e`, `\\u202e`), never sent to the
terminal; JSON writes them as `\\u` escapes. A timestamp that is not a time (none, not a number,
before 1970 or after 2100: an older calmd's store, a hand-made one) is shown as unknown
(`known_ts`), never a crash.

Nothing here shows what the store would refuse. Every row passed the credential detector when it
was stored, and the store is re-scanned when a newer detector comes (the daemon's next start);
until then (the store's `detector_version` is older than this calmd's), every row read passes
`HistoryStore.check` again, and one it flags is skipped, never printed. (Checking each row always
would cost 50 microseconds a row: 5 s for 100,000 commands.)
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import os
import re
import socket
import sqlite3
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from calmd.errors import CalmError
from calmd.history.store import SCHEMA_VERSION, HistoryStore, clean_text, valid_time
from calmd.protocol import TS_MAX
from calmd.secrets import DETECTOR_VERSION
from calmd.visible import json_escaped, json_text, visible

BATCH = 20_000  # rows the search index reads per round trip
TOP = 10  # rows in each of `calm stats`'s tables


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
    return _compiled(pattern).search(text) is not None


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    found = _PATTERNS.get(pattern)
    if found is None:
        if len(_PATTERNS) > 16:
            _PATTERNS.clear()
        found = _PATTERNS[pattern] = re.compile(pattern)
    return found


# --------------------------------------------------------------------------- rows


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
    host: str = ""  # the machine that recorded it ('' : this one; calmd/history/sync.py)

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
                "time": None if ts is None else _iso(ts), "cmd": _text(self.cmd),
                "exit": self.exit if isinstance(self.exit, int) else None, "duration": duration,
                "cwd": _text(self.cwd), "git": _text(self.git), "session": _text(self.session),
                "source": _text(self.source), "host": host_label(self.host, this)}  # fmt: skip


def _text(value: object) -> str:
    """A text column as text, whatever an old or hand-made store holds in it (NULL: empty)."""
    return value if isinstance(value, str) else "" if value is None else str(value)


ENTRY_COLUMNS = "id, ts, session, cwd, git, cmd, exit, source, duration, host"


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


def shown(cmd: str) -> bool:
    """Whether a stored command may be shown: what the store would store today."""
    return isinstance(cmd, str) and HistoryStore.check(cmd).stored


def scanned_by_this_detector(db: sqlite3.Connection) -> bool:
    """Whether every row has passed this calmd's credential detector (stored or re-scanned by it)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'detector_version'").fetchone()
    return row is not None and int(row[0]) >= DETECTOR_VERSION


# --------------------------------------------------------------------------- filters


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
                    _compiled(pattern)
                except re.error as exc:
                    raise CalmError(
                        f"--regex: {self.pattern!r} is not a valid regular expression: {exc}"
                    ) from None
                clauses.append("calm_regexp(?, cmd)")
            else:
                clauses.append("instr(cmd, ?) > 0")
            args.append(pattern)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def select(db: sqlite3.Connection, filt: HistoryFilter) -> Iterator[Entry]:
    """The commands `filt` selects, in time order (with a limit: the newest `limit` of them)."""
    return map(Entry._make, rows(db, filt, ENTRY_COLUMNS))


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


# --------------------------------------------------------------------------- hosts


def this_hostname() -> str:
    """This machine's name when sync has not named it (`calm sync --name`): the hostname."""
    return (socket.gethostname() or "this machine")[:64]


def this_host(db: sqlite3.Connection) -> str:
    """The name this machine's records show (the store keeps '' for them): `calm sync --name`'s,
    else the hostname."""
    row = db.execute("SELECT value FROM meta WHERE key = 'sync_host_name'").fetchone()
    return str(row[0]) if row and row[0] else this_hostname()


def host_label(host: object, this: str) -> str:
    """A record's host as every view prints it (`calm history`, `calm stats`, `calm sync`):
    its name, '' standing for this machine (`this`). The one place a host's name becomes text,
    as stored: another machine chose it (its segments name it), so the views print it as they
    print a command, `visible` (calmd/visible.py) on a terminal, through json_text in JSON."""
    return _text(host) or this or "this machine"


# --------------------------------------------------------------------------- times


_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hour|hours|d|day|days|w|week|weeks)\s*(?:ago)?\Z")
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400,
          "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}  # fmt: skip


def parse_when(text: str, now: float) -> float:
    """A point in time from the command line, as seconds since the epoch: `30m`, `2h`, `3d`,
    `1w` (that long ago), `today`, `yesterday`, a local date or time in ISO form (`2025-11-24`,
    `2025-11-24 13:00`), or seconds since the epoch. CalmError names what is accepted."""
    value = text.strip().lower()
    match = _RELATIVE.match(value)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    midnight = dt.datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if value == "today":
        return midnight.timestamp()
    if value == "yesterday":
        return (midnight - dt.timedelta(days=1)).timestamp()
    if re.fullmatch(r"\d{9,11}(\.\d+)?", value):
        return float(value)
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise CalmError(
            f"{text!r} is not a time: give e.g. 30m, 2h, 3d, 1w (ago), today, yesterday, "
            "2025-11-24, '2025-11-24 13:00' or seconds since the epoch"
        ) from None


# The times a view shows are the times a command can have run at: a number from 1970 to 2100
# (protocol.TS_MAX), the range every time is held to where it enters (`record`, the imports:
# store.valid_time). Anything else in `ts` (an older calmd's store not yet opened for writing,
# which repairs it; a hand-made one: NULL, text, an infinity, 1e300, a time before 1970 or after
# 2100) is shown as unknown, left out of `calm stats`'s times, never selected by --since or
# --until, and never raises: datetime cannot hold some of them, and a view must still show the rest.
# The one rule: `known_ts` here, `_KNOWN_TS` for the lines SQLite makes.
UNKNOWN_TIME = "unknown time"


def known_ts(ts: object) -> float | None:
    """`ts` when it is a time a view can show (a number store.valid_time takes), else None."""
    if isinstance(ts, int | float) and valid_time(ts):  # NaN fails both comparisons
        return float(ts)
    return None


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


@functools.lru_cache(maxsize=4096)
def _minute(minute: int) -> str:
    return dt.datetime.fromtimestamp(minute * 60).strftime("%Y-%m-%d %H:%M")


def local_time(ts: object) -> str:
    """`2025-11-24 13:02:11`, local time; `unknown time` when `ts` is not one (`known_ts`). The
    minute's text is kept (every time zone's offset is whole minutes): a history of 100,000 lines
    formats a few thousand minutes, not 100,000 times."""
    known = known_ts(ts)
    if known is None:
        return UNKNOWN_TIME
    whole = math.floor(known)
    return f"{_minute(whole // 60)}:{whole % 60:02d}"


def short_path(path: str, home: str) -> str:
    """`path` with the home folder written `~`."""
    if home and home != "/" and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")) :]
    return path


PLAIN_COLUMNS = "ts, exit, cwd, cmd"
HOSTS_COLUMNS = "ts, exit, host, cwd, cmd"  # with a host column: the history holds other machines'


def several_hosts(db: sqlite3.Connection) -> bool:
    """Whether the store holds records of another machine (synced): views show a host column."""
    return db.execute("SELECT 1 FROM commands WHERE host != '' LIMIT 1").fetchone() is not None


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
                minute = minutes[whole // 60] = _minute(whole // 60)
            when = minute + seconds[whole % 60]
        else:
            when = unknown
        status = statuses.get(code)
        if status is None:
            status = statuses[code] = f"{'' if code is None else code:>3}  "
        folder = folders.get(cwd)
        if folder is None:
            folder = folders[cwd] = short_path(_text(cwd), home) or "-"
        yield visible(f"{when}{status}{host}{folder}  {_text(cmd)}")


def json_lines(rows: Iterable[tuple[Any, ...]], this: str = "") -> Iterator[str]:
    """One JSON object per ENTRY_COLUMNS row (`Entry.to_json`), as SQLite's json_object writes it
    (json_text: the hidden characters as `\\u` escapes, never a NaN)."""
    for row in rows:
        yield json_text(Entry._make(row).to_json(this), compact=True)


# The same lines made by SQLite, a few times faster on 100,000 rows than formatting them in Python
# (history_lines): what `calm history` runs when every row has passed this calmd's credential
# detector. Python then passes each line through `visible` (plain, commands) or `json_escaped`
# (json), as it does the lines it makes itself: the two ways print the same bytes.
_KNOWN_TS = f"typeof(ts) IN ('integer', 'real') AND ts BETWEEN 0 AND {TS_MAX:.0f}"  # known_ts
_HOST_SQL = "CASE WHEN coalesce(host, '') = '' THEN ? ELSE CAST(host AS TEXT) END"  # host_label in SQL
_PLAIN_SQL = (
    f"CASE WHEN {_KNOWN_TS} THEN strftime('%Y-%m-%d %H:%M:%S', ts, 'unixepoch', 'localtime') "
    f"ELSE '{UNKNOWN_TIME:<19}' END || '  ' || "
    "printf('%3s', coalesce(exit, '')) || '  ' || {host}"
    "CASE WHEN coalesce(cwd, '') = '' THEN '-' "
    "WHEN ? != '' AND (cwd = ? OR substr(cwd, 1, length(?) + 1) = ? || '/') "
    "THEN '~' || substr(cwd, length(?) + 1) ELSE cwd END || '  ' || coalesce(cmd, '')"
)
_JSON_SQL = (f"json_object('id', id, 'ts', CASE WHEN {_KNOWN_TS} THEN round(ts, 3) END, 'time', "
             f"CASE WHEN {_KNOWN_TS} THEN strftime('%Y-%m-%dT%H:%M:%S', ts, 'unixepoch', 'localtime') END, "
             "'cmd', coalesce(cmd, ''), 'exit', CASE WHEN typeof(exit) = 'integer' THEN exit END, "
             "'duration', CASE WHEN typeof(duration) IN ('integer', 'real') AND abs(duration) <= 1e300 "
             "THEN round(duration, 3) END, "
             "'cwd', coalesce(cwd, ''), 'git', coalesce(git, ''), 'session', coalesce(session, ''), "
             "'source', coalesce(source, ''), 'host', " + _HOST_SQL + ")")  # fmt: skip


def history_lines(db: sqlite3.Connection, filt: HistoryFilter, form: str, home: str = "") -> list[str]:
    """The lines of `calm history` in `form` (`plain`, `json` or `commands`), read whole at once."""
    assert form in ("plain", "json", "commands"), form
    this = filt.this_host or this_host(db)
    hosts = form == "plain" and several_hosts(db)
    if scanned_by_this_detector(db):
        home = "" if home in ("", "/") else home.rstrip("/")
        plain = _PLAIN_SQL.format(host=_HOST_SQL + " || '  ' || " if hosts else "")
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
        return [visible(_text(cmd)) for (cmd,) in rows(db, filt, "cmd")]
    if hosts:
        return list(plain_lines(rows(db, filt, HOSTS_COLUMNS), home, this))
    return list(plain_lines(rows(db, filt, PLAIN_COLUMNS), home))


def plain_line(entry: Entry, home: str) -> str:
    return next(plain_lines([(entry.ts, entry.exit, entry.cwd, entry.cmd)], home))


# --------------------------------------------------------------------------- stats


_PLAIN = re.compile(r"[a-z][a-z0-9_:-]*\Z")


@dataclass
class Stats:
    """What `calm stats` shows, computed from the selected commands in one pass."""

    commands: int = 0
    distinct: int = 0
    with_status: int = 0  # runs whose exit status is known (recorded by a hook, not imported)
    failed: int = 0  # ... of which non-zero
    first_ts: float | None = None
    last_ts: float | None = None
    top_commands: list[tuple[str, int, int, int]] = field(default_factory=list)  # name, runs, failed, known
    top_subcommands: list[tuple[str, int]] = field(default_factory=list)
    folders: list[tuple[str, int, list[tuple[str, int]]]] = field(default_factory=list)  # folder, runs, top
    hours: list[int] = field(default_factory=lambda: [0] * 24)  # runs per local hour of the day
    weekdays: list[int] = field(default_factory=lambda: [0] * 7)  # Monday first
    # per machine (`per_host`): host, runs, failed, runs with a known status
    hosts: list[tuple[str, int, int, int]] = field(default_factory=list)

    @property
    def failure_rate(self) -> float | None:
        return self.failed / self.with_status if self.with_status else None

    def busiest_hours(self, n: int = 3) -> list[int]:
        return sorted((h for h in range(24) if self.hours[h]), key=lambda h: (-self.hours[h], h))[:n]

    def to_json(self) -> dict[str, Any]:
        return {
            "commands": self.commands, "distinct": self.distinct, "with_status": self.with_status,
            "failed": self.failed, "failure_rate": self.failure_rate,
            "first": None if self.first_ts is None else _iso(self.first_ts),
            "last": None if self.last_ts is None else _iso(self.last_ts),
            "top_commands": [{"command": c, "runs": n, "failed": f, "with_status": k}
                             for c, n, f, k in self.top_commands],
            "top_subcommands": [{"command": c, "runs": n} for c, n in self.top_subcommands],
            "folders": [{"folder": d, "runs": n, "top": [{"command": c, "runs": m} for c, m in top]}
                        for d, n, top in self.folders],
            "hours": self.hours, "busiest_hours": self.busiest_hours(), "weekdays": self.weekdays,
            "hosts": [{"host": h, "runs": n, "failed": f, "with_status": k} for h, n, f, k in self.hosts],
        }  # fmt: skip


STATS_COLUMNS = "ts, cwd, cmd, exit"


def most_common(counts: Counter[str], n: int) -> list[tuple[str, int]]:
    """The `n` largest counts, ties in name order (the same whichever order they were counted in)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def busiest_folders(
    per_folder: dict[str, Counter[str]], n: int
) -> list[tuple[str, int, list[tuple[str, int]]]]:
    """The `n` folders with the most runs (ties in name order), each with its 3 top commands."""
    runs = {folder: sum(counts.values()) for folder, counts in per_folder.items()}
    busiest = sorted(runs, key=lambda d: (-runs[d], d))[:n]
    return [(d, runs[d], most_common(per_folder[d], 3)) for d in busiest]


def command_and_next(cmd: str) -> tuple[str, str | None]:
    """The command's name (its first word after `VAR=value` assignments) and the word after it."""
    words = cmd.split()
    at = 0
    while at < len(words) and "=" in words[at].split("/", 1)[0] and not words[at].startswith(("=", "-")):
        at += 1  # `FOO=1 make`: the command is make
    if at >= len(words):
        return "", None
    return words[at], words[at + 1] if at + 1 < len(words) else None


def compute_stats(
    entries: Iterable[tuple[Any, ...]], takes_subcommands: Callable[[str], bool], *, top: int = TOP,
    folders: int = 5,
) -> Stats:  # fmt: skip
    """The tables of `calm stats`, in one pass over (ts, cwd, cmd, exit) rows (`rows(db, filt,
    STATS_COLUMNS)`: 100,000 of them, so the loop does little per row). Counting in SQL instead
    (GROUP BY the first word, the second, the folder, the hour) was measured 6 times slower: the
    words are cut by nested substr/instr that SQLite evaluates again at each use."""
    stats = Stats()
    names: Counter[str] = Counter()
    name_failed: Counter[str] = Counter()
    name_known: Counter[str] = Counter()
    subs: Counter[str] = Counter()
    by_folder: Counter[tuple[str, str]] = Counter()
    distinct: set[str] = set()
    hours = [0] * (24 * 7)
    # the local hour and weekday of each quarter of an hour since the epoch (every time zone's
    # offset is a whole number of quarters): one datetime per quarter, not one per command
    hour_of: dict[int, int] = {}
    taking: dict[str, bool] = {}
    first_ts = last_ts = None
    for ts, cwd, cmd, code in entries:
        if not isinstance(cmd, str) or not isinstance(cwd, str):
            cmd, cwd = _text(cmd), _text(cwd)
        distinct.add(cmd)
        name, following = command_and_next(cmd)
        names[name] += 1
        if code is not None:
            name_known[name] += 1
            if code != 0:
                name_failed[name] += 1
        if following is not None:
            takes = taking.get(name)
            if takes is None:
                takes = taking[name] = bool(name) and takes_subcommands(name)
            if takes and _PLAIN.match(following):
                subs[f"{name} {following}"] += 1
        if cwd:
            by_folder[(cwd, name)] += 1
        if known_ts(ts) is None:
            continue  # not a time (known_ts): counted, but in no hour
        if first_ts is None or ts < first_ts:
            first_ts = ts
        if last_ts is None or ts > last_ts:
            last_ts = ts
        quarter = math.floor(ts / 900)
        hour = hour_of.get(quarter)
        if hour is None:
            when = dt.datetime.fromtimestamp(quarter * 900)
            hour = hour_of[quarter] = when.hour + 24 * when.weekday()
        hours[hour] += 1
    stats.commands = sum(names.values())
    stats.with_status = sum(name_known.values())
    stats.failed = sum(name_failed.values())
    stats.first_ts, stats.last_ts = first_ts, last_ts
    stats.hours = [sum(hours[h + 24 * d] for d in range(7)) for h in range(24)]
    stats.weekdays = [sum(hours[24 * d : 24 * d + 24]) for d in range(7)]
    stats.distinct = len(distinct)
    stats.top_commands = [(n, c, name_failed[n], name_known[n]) for n, c in most_common(names, top)]
    stats.top_subcommands = most_common(subs, top)
    per_folder: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for (folder, name), n in by_folder.items():
        per_folder[folder][name] += n
    stats.folders = busiest_folders(per_folder, folders)
    return stats


def per_host(db: sqlite3.Connection, filt: HistoryFilter) -> list[tuple[str, int, int, int]]:
    """`calm stats` per machine: (host, runs, failed, runs with a known status) of the commands
    `filt` selects, most runs first; this machine's records under its name."""
    where, args = filt.where()
    sql = (f"SELECT {_HOST_SQL} AS h, COUNT(*), SUM(exit IS NOT NULL AND exit != 0), SUM(exit IS NOT NULL) "
           f"FROM commands{where} GROUP BY h ORDER BY COUNT(*) DESC, h")  # fmt: skip
    this = filt.this_host or this_host(db)
    found = db.execute(sql, [this, *args]).fetchall()
    return [(host_label(h, this), n, int(f or 0), int(k or 0)) for h, n, f, k in found]


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def hour_bars(hours: Sequence[int], width: int = 30) -> list[str]:
    """One text bar per hour of the day, scaled to the busiest."""
    peak = max(hours) or 1
    return ["█" * round(width * n / peak) for n in hours]
