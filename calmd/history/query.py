"""Read-only questions to the history store: `calm history`, `calm stats`, and the lean rows the
daemon's search index reads (calmd/daemon/search.py).

The store is opened on a connection of its own, read-only (SQLite's `mode=ro`): it never writes,
never migrates and never takes the write lock, so it is safe while the daemon records (WAL: a
reader sees the last committed state and neither waits for the writer nor holds it up). A store
from a newer calmd (a schema this one does not know) is refused with a clear error rather than
misread. The filters are SQL over the store's indexes; what SQL cannot say (a regular
expression) is a function registered on the connection.

Nothing here shows what the store would refuse: every row read passes `HistoryStore.check` again
(a row stored before a newer credential detector, which the daemon re-scans at its next start, is
skipped, never printed).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import sqlite3
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd.errors import CalmError
from calmd.history.store import SCHEMA_VERSION, HistoryStore

BATCH = 20_000  # rows the search index reads per round trip
TOP = 10  # rows in each of `calm stats`'s tables


class NoHistory(CalmError):
    """There is no history store at the path (nothing recorded or imported yet)."""


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the store at `path`; NoHistory when there is none, CalmError for
    a file that is not a calmd history or is newer than this calmd."""
    if not path.is_file():
        raise NoHistory(f"{path}: no history yet (start calmd, or run `calm import FILE`)")
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    db = sqlite3.connect(uri, uri=True, check_same_thread=False)
    try:
        db.execute("PRAGMA busy_timeout=5000")  # a checkpoint after `calm forget` holds readers briefly
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as exc:
        db.close()
        raise CalmError(f"{path}: not a calmd history store ({exc})") from None
    version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        db.close()
        raise CalmError(
            f"{path}: history schema {version} is newer than this calmd ({SCHEMA_VERSION}): upgrade calm"
        )
    db.create_function("calm_regexp", 2, _regexp, deterministic=True)
    return db


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


@dataclass(frozen=True)
class Entry:
    """One executed command as `calm history` shows it."""

    id: int
    ts: float
    session: str
    cwd: str
    git: str
    cmd: str
    exit: int | None
    source: str

    @property
    def failed(self) -> bool:
        """The shell reported a non-zero status (imported commands carry none: never failed)."""
        return self.exit is not None and self.exit != 0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "ts": self.ts, "time": _iso(self.ts), "cmd": self.cmd, "exit": self.exit,
                "cwd": self.cwd, "git": self.git, "session": self.session, "source": self.source}  # fmt: skip


_ENTRY_COLUMNS = "id, ts, session, cwd, git, cmd, exit, source"


def rows_after(db: sqlite3.Connection, after: int, limit: int = BATCH) -> list[tuple[Any, ...]]:
    """(id, ts, session, cwd, git, cmd, exit) of up to `limit` rows with an id above `after`,
    oldest first: what the daemon's search index reads, as plain tuples (a HistoryRow per row
    costs five times as much on 100,000 commands)."""
    sql = "SELECT id, ts, session, cwd, git, cmd, exit FROM commands WHERE id > ? ORDER BY id LIMIT ?"
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
    return HistoryStore.check(cmd).stored


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

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if self.cwd is not None:
            folder = self.cwd.rstrip("/") or "/"
            if self.below:
                clauses.append("(cwd = ? OR substr(cwd, 1, ?) = ?)")
                inside = folder if folder.endswith("/") else folder + "/"
                args += [folder, len(inside), inside]
            else:
                clauses.append("cwd = ?")
                args.append(folder)
        if self.session is not None:
            clauses.append("session = ?")
            args.append(self.session)
        if self.exit is not None:
            clauses.append("exit = ?")
            args.append(self.exit)
        if self.failed is True:
            clauses.append("exit IS NOT NULL AND exit != 0")
        elif self.failed is False:
            clauses.append("(exit IS NULL OR exit = 0)")
        if self.since is not None:
            clauses.append("ts >= ?")
            args.append(self.since)
        if self.until is not None:
            clauses.append("ts < ?")
            args.append(self.until)
        if self.pattern:
            if self.regex:
                try:
                    _compiled(self.pattern)
                except re.error as exc:
                    raise CalmError(
                        f"--regex: {self.pattern!r} is not a valid regular expression: {exc}"
                    ) from None
                clauses.append("calm_regexp(?, cmd)")
            else:
                clauses.append("instr(cmd, ?) > 0")
            args.append(self.pattern)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args


def select(db: sqlite3.Connection, filt: HistoryFilter) -> Iterator[Entry]:
    """The commands `filt` selects, in time order (with a limit: the newest `limit` of them). One
    query, read as it is consumed (the index on `ts` keeps the sort cheap)."""
    where, args = filt.where()
    sql = f"SELECT {_ENTRY_COLUMNS} FROM commands{where} ORDER BY ts, id"
    if filt.limit:
        sql = (f"SELECT * FROM (SELECT {_ENTRY_COLUMNS} FROM commands{where} ORDER BY ts DESC, id DESC "
               "LIMIT ?) ORDER BY ts, id")  # fmt: skip
        args = [*args, filt.limit]
    for row in db.execute(sql, args):
        if shown(row[5]):
            yield Entry(*row)


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


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


def local_time(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def short_path(path: str, home: str) -> str:
    """`path` with the home folder written `~`."""
    if home and home != "/" and (path == home or path.startswith(home.rstrip("/") + "/")):
        return "~" + path[len(home.rstrip("/")) :]
    return path


def one_line(cmd: str) -> str:
    """A multi-line command on one line: newlines written `\\n`, tabs `\\t` (for plain output)."""
    return cmd.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") if _needs_escape(cmd) else cmd


def _needs_escape(cmd: str) -> bool:
    return "\n" in cmd or "\t" in cmd


def plain_line(entry: Entry, home: str) -> str:
    """`time  status  folder  command`, one line per command (status blank when unknown)."""
    status = "" if entry.exit is None else str(entry.exit)
    folder = short_path(entry.cwd, home) or "-"
    return f"{local_time(entry.ts)}  {status:>3}  {folder}  {one_line(entry.cmd)}"


# --------------------------------------------------------------------------- stats


def first_word(cmd: str) -> str:
    """The command's name: its first word after any `VAR=value` assignments."""
    for word in cmd.split():
        if "=" in word.split("/", 1)[0] and not word.startswith(("=", "-")):
            continue
        return word
    return ""


_PLAIN = re.compile(r"[a-z][a-z0-9_:-]*\Z")


def subcommand(cmd: str, takes_subcommands: Callable[[str], bool]) -> str | None:
    """`git commit` for `git commit -m x`, when the command takes subcommands (git, docker,
    systemctl: `takes_subcommands`) and its second word is a plain word; else None."""
    words = cmd.split()
    name = first_word(cmd)
    if not name or not takes_subcommands(name):
        return None
    at = words.index(name)
    if at + 1 < len(words) and _PLAIN.match(words[at + 1]):
        return f"{name} {words[at + 1]}"
    return None


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
        }  # fmt: skip


def compute_stats(
    entries: Iterator[Entry], takes_subcommands: Callable[[str], bool], *, top: int = TOP, folders: int = 5
) -> Stats:
    stats = Stats()
    names: Counter[str] = Counter()
    name_failed: Counter[str] = Counter()
    name_known: Counter[str] = Counter()
    subs: Counter[str] = Counter()
    by_folder: defaultdict[str, Counter[str]] = defaultdict(Counter)
    distinct: set[str] = set()
    # the local hour and weekday of each quarter of an hour since the epoch (every time zone's
    # offset is a whole number of quarters): one datetime per quarter, not one per command
    hour_of: dict[int, int] = {}
    for entry in entries:
        stats.commands += 1
        distinct.add(entry.cmd)
        name = first_word(entry.cmd)
        names[name] += 1
        if entry.exit is not None:
            stats.with_status += 1
            name_known[name] += 1
            if entry.exit != 0:
                stats.failed += 1
                name_failed[name] += 1
        sub = subcommand(entry.cmd, takes_subcommands)
        if sub is not None:
            subs[sub] += 1
        if entry.cwd:
            by_folder[entry.cwd][name] += 1
        if stats.first_ts is None or entry.ts < stats.first_ts:
            stats.first_ts = entry.ts
        if stats.last_ts is None or entry.ts > stats.last_ts:
            stats.last_ts = entry.ts
        quarter = math.floor(entry.ts / 900)
        hour = hour_of.get(quarter)
        if hour is None:
            when = dt.datetime.fromtimestamp(quarter * 900)
            hour = hour_of[quarter] = when.hour + 24 * when.weekday()
        stats.hours[hour % 24] += 1
        stats.weekdays[hour // 24] += 1
    stats.distinct = len(distinct)
    stats.top_commands = [(n, c, name_failed[n], name_known[n]) for n, c in names.most_common(top)]
    stats.top_subcommands = subs.most_common(top)
    busiest = sorted(by_folder, key=lambda d: -sum(by_folder[d].values()))[:folders]
    stats.folders = [(d, sum(by_folder[d].values()), by_folder[d].most_common(3)) for d in busiest]
    return stats


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def hour_bars(hours: Sequence[int], width: int = 30) -> list[str]:
    """One text bar per hour of the day, scaled to the busiest."""
    peak = max(hours) or 1
    return ["█" * round(width * n / peak) for n in hours]
