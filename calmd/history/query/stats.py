"""`calm stats`: the tables of the selected commands (the top commands and subcommands, the
busiest folders with their top commands, the failure rate, the busiest hours and weekdays), counted
in one pass over their rows; the machines (`per_host`) counted by SQLite.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from calmd.history.query.connection import column_text
from calmd.history.query.filters import HistoryFilter
from calmd.history.query.hosts import HOST_SQL, host_label, this_host
from calmd.history.query.times import iso_time, known_ts

TOP = 10  # rows in each of `calm stats`'s tables

_PLAIN = re.compile(r"[a-z][a-z0-9_:-]*\Z")  # a word counted as a subcommand (no path, flag, value)


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
            "first": None if self.first_ts is None else iso_time(self.first_ts),
            "last": None if self.last_ts is None else iso_time(self.last_ts),
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
            cmd, cwd = column_text(cmd), column_text(cwd)
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
    sql = (f"SELECT {HOST_SQL} AS h, COUNT(*), SUM(exit IS NOT NULL AND exit != 0), SUM(exit IS NOT NULL) "
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
