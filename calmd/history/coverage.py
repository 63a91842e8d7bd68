"""What an import of a history file must leave out: the runs the shell hooks recorded already, and
the commands typed while recording was paused (`CALM_RECORD=0`).

A shell writes what it runs into its own history file (fish at once, zsh with INC_APPEND_HISTORY,
bash at exit) and the hook records the same run through the daemon: an import of that file
(`calm import`, the daemon's first start) would store each run twice, and bring back what the
user paused, which the shell wrote to its file all the same (issue 39).

- **Recorded runs.** A file's entry is the run of a stored row of this machine when the row holds
  the same command and its time lies within [when - MATCH_BEFORE_S, when + MATCH_AFTER_S] of the
  entry's (files keep whole seconds, written as the line is submitted; the hook times the command
  from its start). Each row stands for one entry, the nearest: a command run twice in the same
  second is two rows and two entries, and a run the hook did not record (another shell without
  it) is still imported. The rows matched are those the hooks recorded, and those an earlier
  import of the same format stored (a file imported again under another name, a mark lost): an
  import never repeats a run. Only an entry's own time is matched, never one borrowed from its
  neighbour (calmd/history/imports.py).
- **Paused commands.** The fish hook tells the helper, for each command it does not record
  because `CALM_RECORD` is not 1, when it started, and nothing else: not its text, folder or
  status (`p` line, calmd/shell/lines.py; the `paused` record, docs/protocol.md). The store keeps
  these times (`unrecorded`, at most MAX_UNRECORDED, the oldest dropped first), and an import
  leaves out every entry of that moment that no recorded row claims, whatever its command.
- **The other order.** A record or a pause that reaches the daemon after an import of the same
  moment (the helper kept it while the daemon restarted; a long command that was still running)
  finds the imported row: a record takes it over (the row gets the hook's status, folder and
  duration: one row), a pause deletes it for good. Only rows stored since the session's previous
  record are looked at: those that can be this very run.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict

MATCH_BEFORE_S = 2.0  # a hook's time may precede the file's second (a clock step, rounding)
MATCH_AFTER_S = 5.0  # ... or follow it: the second itself, then the start, a helper slow to start
MAX_UNRECORDED = 256_000  # the paused moments kept: fish's own history keeps 256,000 entries
PRUNE_EVERY = 1000
TAKEN_KEPT = 100_000  # rows an import remembers having matched (entries come in time order)
SCHEMA = """
CREATE TABLE IF NOT EXISTS unrecorded (ts REAL NOT NULL);
CREATE INDEX IF NOT EXISTS unrecorded_ts ON unrecorded (ts);
"""


class Coverage:
    """An import's view of what it must leave out (the module's docstring), taken when it starts:
    rows stored later (by this import's own batches) are never matched."""

    def __init__(self, db: sqlite3.Connection, source: str) -> None:
        self.source = source  # `import:fish`: an earlier import of the same format is matched too
        self.top = int(db.execute("SELECT coalesce(max(id), 0) FROM commands").fetchone()[0])
        firsts = [
            db.execute("SELECT min(ts) FROM commands WHERE host = '' AND source IN ('shell', ?)",
                       (source,)).fetchone()[0],
            db.execute("SELECT min(ts) FROM unrecorded").fetchone()[0],
        ]  # fmt: skip
        known = [float(t) for t in firsts if isinstance(t, int | float)]
        self.first = min(known) if known else None  # nothing before it can be covered
        self.taken: OrderedDict[int, None] = OrderedDict()

    def covers(self, db: sqlite3.Connection, when: float, cmd: str) -> str | None:
        """Why the entry timed `when` (its own time) holding `cmd` is left out: `recorded` (a row
        is its run; that row is taken), `paused`, or None (it is imported)."""
        if self.first is None or when + MATCH_AFTER_S < self.first:
            return None
        rows = db.execute(
            "SELECT id, ts FROM commands INDEXED BY commands_ts WHERE ts BETWEEN ? AND ? AND cmd = ? "
            "AND host = '' AND source IN ('shell', ?) AND id <= ?",
            (when - MATCH_BEFORE_S, when + MATCH_AFTER_S, cmd, self.source, self.top),
        ).fetchall()
        free = [(abs(ts - when - 0.5), rid) for rid, ts in rows if rid not in self.taken]
        if free:
            self.taken[min(free)[1]] = None
            if len(self.taken) > TAKEN_KEPT:
                self.taken.popitem(last=False)
            return "recorded"
        paused = db.execute("SELECT 1 FROM unrecorded WHERE ts BETWEEN ? AND ? LIMIT 1",
                            (when - MATCH_BEFORE_S, when + MATCH_AFTER_S)).fetchone()  # fmt: skip
        return "paused" if paused is not None else None


def _since_session(db: sqlite3.Connection, session: str) -> int:
    """The id after which rows may be this session's newest run: its previous record's."""
    row = db.execute("SELECT max(id) FROM commands WHERE session = ?", (session,)).fetchone()
    return int(row[0] or 0) if session else 0


def imported_run(db: sqlite3.Connection, cmd: str, ts: float, session: str) -> int | None:
    """The id of an imported row that is the run the hook now records (`cmd` started at `ts`),
    stored since the session's previous record and not yet shared; None when there is none."""
    found = db.execute(
        "SELECT id FROM commands INDEXED BY commands_ts WHERE ts BETWEEN ? AND ? AND cmd = ? AND host = '' "
        "AND source LIKE 'import:%' AND origin_id IS NULL AND id > ? ORDER BY abs(ts + 0.5 - ?) LIMIT 1",
        (ts - MATCH_AFTER_S, ts + MATCH_BEFORE_S, cmd, _since_session(db, session), ts),
    ).fetchone()
    return None if found is None else int(found[0])


def note_paused(db: sqlite3.Connection, ts: float, session: str) -> list[int]:
    """Keep the moment a paused command started (inside the caller's transaction); the oldest
    beyond MAX_UNRECORDED go (within PRUNE_EVERY more). Returns the imported rows of that moment
    stored since the session's previous record: the paused line itself, imported before its pause
    arrived (to delete)."""
    added = db.execute("INSERT INTO unrecorded (ts) VALUES (?)", (ts,)).lastrowid or 0
    if added % PRUNE_EVERY == 0:  # the bound, kept every PRUNE_EVERY pauses (a walk of the index)
        db.execute("DELETE FROM unrecorded WHERE rowid IN (SELECT rowid FROM unrecorded ORDER BY ts DESC "
                   "LIMIT -1 OFFSET ?)", (MAX_UNRECORDED,))  # fmt: skip
    rows = db.execute(
        "SELECT id FROM commands INDEXED BY commands_ts WHERE ts BETWEEN ? AND ? AND host = '' "
        "AND source LIKE 'import:%' AND id > ?",
        (ts - MATCH_AFTER_S, ts + MATCH_BEFORE_S, _since_session(db, session)),
    ).fetchall()
    return [int(rid) for (rid,) in rows]
