"""`calm history` and `calm stats`: what the history store holds, asked from the command line.

    calm history [PATTERN] [--cwd [DIR]] [--below] [--session ID] [--host [NAME]]
                 [--exit N | --failed | --succeeded]
                 [--since WHEN] [--until WHEN] [--limit N] [--regex] [--json | --commands]
    calm stats   [the same filters] [--top N] [--json]

Both read the store read-only (calmd/history/query.py: safe while the daemon records) and never
show a line the credential detector flags. `calm history` prints one line per command, oldest
first (`time  status  folder  command`, a multi-line command on one line with `\\n`), or with
`--json` one JSON object per line (JSON Lines: a history is too long for one document), or with
`--commands` the command lines alone; a history that holds other machines' records (`calm sync`)
adds a host column after the status. `calm stats` prints tables (rich): the top commands and
subcommands (`git commit`, for the commands the packaged vocabulary knows to take subcommands),
the busiest folders with their top commands, the machines (synced), the failure rate (of the runs
whose status the shell reported: imported history has none) and the busiest hours of the day.

What they print of the store passes calmd/visible.py (`query.history_lines` for `calm history`;
here each cell of `calm stats`, given to rich as Text, never as markup: a command holding
`[link=...]` would otherwise be a hyperlink). A host's name is such text too: another machine's
segment names its host (calmd/sync/). Column widths are those of the escaped text.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from calmd import paths
from calmd.arguments import whole
from calmd.errors import CalmError
from calmd.history import query
from calmd.protocol import EXIT_MAX, EXIT_MIN
from calmd.visible import json_text, visible


def add_filters(p: argparse.ArgumentParser) -> None:
    """The filters `calm history` and `calm stats` share (one flag per HistoryFilter field)."""
    p.add_argument(
        "pattern",
        nargs="?",
        default="",
        metavar="PATTERN",
        help="only commands holding this text (case-sensitive; --regex: a regular expression)",
    )
    p.add_argument("--regex", "-E", action="store_true", help="PATTERN is a Python regular expression")
    p.add_argument(
        "--cwd",
        nargs="?",
        const=".",
        metavar="DIR",
        help="only commands run in this folder (the current one when DIR is left out)",
    )
    p.add_argument("--below", action="store_true", help="with --cwd: also in the folders under it")
    p.add_argument("--session", metavar="ID", help="only this shell session's commands (see --json)")
    p.add_argument("--host", nargs="?", const="", metavar="NAME",
                   help="only commands recorded on this machine (synced: `calm sync`; this one when NAME "
                   "is left out)")  # fmt: skip
    status = p.add_mutually_exclusive_group()
    status.add_argument(
        "--exit", type=whole(EXIT_MIN, EXIT_MAX), metavar="N", help="only commands that exited with N"
    )  # a status a shell reports: a C int
    status.add_argument("--failed", action="store_true", help="only commands that failed (non-zero status)")
    status.add_argument(
        "--succeeded",
        action="store_true",
        help="only commands that did not fail (status 0, or none known: imported)",
    )
    p.add_argument("--since", metavar="WHEN", help="from this time on: 30m, 2h, 3d, 1w, today, 2025-11-24...")
    p.add_argument("--until", metavar="WHEN", help="before this time (same forms)")
    p.add_argument("--limit", "-n", type=whole(0), default=0, metavar="N", help="only the newest N (0: all)")
    p.add_argument("--db", metavar="PATH", help=f"history database (default {paths.history_path()})")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def history_filter(args: argparse.Namespace, now: float | None = None) -> query.HistoryFilter:
    now = time.time() if now is None else now
    if args.limit < 0:
        raise CalmError("--limit must be 0 (all) or more")
    if args.below and args.cwd is None:
        raise CalmError("--below needs --cwd")
    cwd = None
    if args.cwd is not None:
        cwd = os.path.abspath(os.path.expanduser(args.cwd))
    failed = True if args.failed else False if args.succeeded else None
    since = query.parse_when(args.since, now) if args.since else None
    until = query.parse_when(args.until, now) if args.until else None
    if since is not None and until is not None and since >= until:
        raise CalmError("--since must be before --until")
    return query.HistoryFilter(cwd=cwd, below=args.below, session=args.session, exit=args.exit, failed=failed,
                               since=since, until=until, pattern=args.pattern, regex=args.regex,
                               limit=args.limit, host=getattr(args, "host", None))  # fmt: skip


def _db(args: argparse.Namespace) -> Path:
    return Path(args.db) if args.db else paths.history_path()


def cmd_history(args: argparse.Namespace) -> int:
    filt = history_filter(args)
    db = query.open_read_only(_db(args))
    form = "json" if args.json else "commands" if args.commands else "plain"
    try:
        filt = dataclasses.replace(filt, this_host=query.this_host(db))
        lines = query.history_lines(db, filt, form, os.environ.get("HOME", ""))
    finally:
        db.close()  # the rows are read: nothing holds the store while they are printed
    block: list[str] = []
    for line in lines:
        block.append(line)
        if len(block) >= 4096:  # written in blocks: one write per line costs more than the line
            sys.stdout.write("\n".join(block) + "\n")
            block.clear()
    if block:
        sys.stdout.write("\n".join(block) + "\n")
    sys.stdout.flush()
    return 0


def takes_subcommands() -> set[str]:
    """The commands whose second word is a subcommand (git, docker, systemctl: the packaged
    vocabulary's judged commands, calmd/suggest/filters.py). Only its `judged` list is read: the
    whole Vocabulary (every known token as a frozenset) costs 0.1 s that `calm stats` has not."""
    from calmd.atomic import read_json
    from calmd.suggest.filters import packaged_vocabulary_path

    data = read_json(packaged_vocabulary_path(), "vocabulary")
    judged = data.get("judged") if isinstance(data, dict) else None
    if not isinstance(judged, list):
        raise CalmError(f"{packaged_vocabulary_path()}: not a calm-vocabulary file (no 'judged' list)")
    return {str(key) for key in judged if " " not in str(key)}


def cmd_stats(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise CalmError("--top must be 1 or more")
    filt = history_filter(args)
    db = query.open_read_only(_db(args))
    try:
        filt = dataclasses.replace(filt, this_host=query.this_host(db))
        with_subcommands = takes_subcommands()
        rows = query.rows(db, filt, query.STATS_COLUMNS)
        stats = query.compute_stats(rows, with_subcommands.__contains__, top=args.top)
        stats.hosts = query.per_host(db, filt)
    finally:
        db.close()
    if args.json:
        print(json_text(stats.to_json(), indent=2))
        return 0
    from rich.console import Console

    console = Console(highlight=False, no_color=args.no_color, soft_wrap=False)
    for renderable in stats_tables(stats, os.environ.get("HOME", "")):
        console.print(renderable, soft_wrap=isinstance(renderable, str))  # a line of text is never cut
    return 0


def stats_tables(stats: query.Stats, home: str) -> list[object]:
    """The rich tables of `calm stats`."""
    from rich.table import Table
    from rich.text import Text

    if not stats.commands:
        return ["no commands match"]
    first = query.local_time(stats.first_ts)[:10] if stats.first_ts is not None else query.UNKNOWN_TIME
    last = query.local_time(stats.last_ts)[:10] if stats.last_ts is not None else query.UNKNOWN_TIME
    rate = stats.failure_rate
    with_status = f"the {stats.with_status:,} runs" if stats.with_status != 1 else "the one run"
    of = f"{stats.failed:,} of {with_status} with a known status"
    failures = f"{100 * rate:.1f}% failed ({of})" if rate else "no exit status (imported)"
    if rate == 0:
        failures = f"none of {with_status} with a known status failed"
    summary = f"{stats.commands:,} commands, {stats.distinct:,} distinct, {first} to {last}; {failures}"
    tables: list[object] = [summary]
    top = Table(title="top commands", title_justify="left")
    for name, justify in (("#", "right"), ("command", "left"), ("runs", "right"), ("share", "right"),
                          ("failed", "right")):  # fmt: skip
        top.add_column(name, justify=justify)  # type: ignore[arg-type]
    for rank, (name, runs, failed, known) in enumerate(stats.top_commands, 1):
        top.add_row(str(rank), Text(visible(name)), f"{runs:,}", query.percent(runs, stats.commands),
                    query.percent(failed, known) if known else "-")  # fmt: skip
    tables.append(top)
    if stats.top_subcommands:
        subs = Table(title="top subcommands", title_justify="left")
        for name, justify in (("#", "right"), ("command", "left"), ("runs", "right")):
            subs.add_column(name, justify=justify)  # type: ignore[arg-type]
        for rank, (name, runs) in enumerate(stats.top_subcommands, 1):
            subs.add_row(str(rank), Text(visible(name)), f"{runs:,}")
        tables.append(subs)
    if stats.folders:
        folders = Table(title="busiest folders", title_justify="left")
        for name, justify in (("folder", "left"), ("runs", "right"), ("top commands", "left")):
            folders.add_column(name, justify=justify)  # type: ignore[arg-type]
        for folder, runs, best in stats.folders:
            folders.add_row(Text(visible(query.short_path(folder, home))), f"{runs:,}",
                            Text(", ".join(f"{visible(c)} ({n:,})" for c, n in best)))  # fmt: skip
        tables.append(folders)
    if len(stats.hosts) > 1:  # a history synced from other machines (`calm sync`)
        hosts = Table(title="machines", title_justify="left")
        for name, justify in (("host", "left"), ("runs", "right"), ("share", "right"), ("failed", "right")):
            hosts.add_column(name, justify=justify)  # type: ignore[arg-type]
        for host, runs, failed, known in stats.hosts:
            hosts.add_row(Text(visible(host)), f"{runs:,}", query.percent(runs, stats.commands),
                          query.percent(failed, known) if known else "-")  # fmt: skip
        tables.append(hosts)
    hours = Table(title="busiest hours (local time)", title_justify="left")
    for name, justify in (("hour", "right"), ("runs", "right"), ("", "left")):
        hours.add_column(name, justify=justify)  # type: ignore[arg-type]
    for hour, (runs, bar) in enumerate(zip(stats.hours, query.hour_bars(stats.hours), strict=True)):
        if runs:
            hours.add_row(f"{hour:02d}:00", f"{runs:,}", bar)
    tables.append(hours)
    busiest = ", ".join(f"{h:02d}:00" for h in stats.busiest_hours())
    tables.append(f"busiest: {busiest}")
    return tables
