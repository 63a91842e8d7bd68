"""Which machine recorded a command, as every view names it: this machine's records are stored
with host '' and shown under its name (`calm sync --name`'s, else the hostname); another machine's
under the name its segments gave (`calm sync`), text that machine chose, so printed as a command is.
"""

from __future__ import annotations

import socket
import sqlite3

from calmd.history.query.connection import column_text


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
    return column_text(host) or this or "this machine"


# host_label in SQL (its one `?`: this machine's name), for the lines and counts SQLite makes
HOST_SQL = "CASE WHEN coalesce(host, '') = '' THEN ? ELSE CAST(host AS TEXT) END"


def several_hosts(db: sqlite3.Connection) -> bool:
    """Whether the store holds records of another machine (synced): views show a host column."""
    return db.execute("SELECT 1 FROM commands WHERE host != '' LIMIT 1").fetchone() is not None
