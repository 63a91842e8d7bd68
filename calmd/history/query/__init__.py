"""Read-only questions to the history store: `calm history`, `calm stats`, and the lean rows the
daemon's search index reads (calmd/suggest/search.py).

The store is opened on a connection of its own, read-only (SQLite's `mode=ro`): it never writes,
never migrates and never takes the write lock, so it is safe while the daemon records (WAL: a
reader sees the last committed state and neither waits for the writer nor holds it up). A store
from a newer calmd (a schema this one does not know) is refused with a clear error rather than
misread; one from an older calmd is read as it is, with the columns it lacks as the migration would
fill them. The filters are SQL over the store's indexes; what SQL cannot say (a regular
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

One concern a module. Callers outside the package (the views, the daemon's search, sync) use the
names listed in `__all__` here, as `query.history_lines`; the modules import each other directly.

    connection.py   open_read_only (the read-only connection, an older or newer store, the regular
                    expression function) and the gate (`shown`, `scanned_by_this_detector`)
    filters.py      HistoryFilter: what `calm history` and `calm stats` select, as SQL; `rows`
    listing.py      `calm history`'s lines: plain, JSON or the commands, by SQLite or by Python
    stats.py        `calm stats`'s tables, in one pass over the rows; per_host
    times.py        --since/--until (`parse_when`), a stored time shown or unknown (`known_ts`)
    hosts.py        which machine recorded a command, as every view names it (`host_label`)
    search_rows.py  the rows the daemon's search index reads (`rows_after`, `generation`)
"""

from calmd.history.query.connection import NoHistory, open_read_only, scanned_by_this_detector, shown
from calmd.history.query.filters import HistoryFilter, ordered, rows
from calmd.history.query.hosts import host_label, several_hosts, this_host, this_hostname
from calmd.history.query.listing import (
    ENTRY_COLUMNS,
    HOSTS_COLUMNS,
    PLAIN_COLUMNS,
    Entry,
    history_lines,
    json_lines,
    plain_lines,
    select,
    short_path,
)
from calmd.history.query.search_rows import BATCH, generation, newest_after, rows_after
from calmd.history.query.stats import (
    STATS_COLUMNS,
    TOP,
    Stats,
    busiest_folders,
    command_and_next,
    compute_stats,
    hour_bars,
    most_common,
    per_host,
    percent,
)
from calmd.history.query.times import UNKNOWN_TIME, known_ts, local_time, parse_when

__all__ = [
    "BATCH", "ENTRY_COLUMNS", "HOSTS_COLUMNS", "PLAIN_COLUMNS", "STATS_COLUMNS", "TOP", "UNKNOWN_TIME",
    "Entry", "HistoryFilter", "NoHistory", "Stats", "busiest_folders", "command_and_next",
    "compute_stats", "generation", "history_lines", "host_label", "hour_bars", "json_lines",
    "known_ts", "local_time", "most_common", "newest_after", "open_read_only", "ordered", "parse_when",
    "per_host", "percent", "plain_lines", "rows", "rows_after", "scanned_by_this_detector", "select",
    "several_hosts", "short_path", "shown", "this_host", "this_hostname",
]  # fmt: skip
