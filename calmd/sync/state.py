"""What export and import share: the machine's state in the store (its sync id and name, the
counters in `meta`), the report of one run, and how a file is told unchanged without reading it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.history.query import this_hostname
from calmd.history.recorded import RecordResult
from calmd.history.store import HistoryStore
from calmd.sync.config import SyncConfig, SyncError, read_config
from calmd.sync.seal import read_key
from calmd.sync.wire import MAX_NAME_CHARS, Ranges, in_ranges, numbers_in, to_ranges

log = logging.getLogger("calmd.sync")

DIGEST_BYTES = 16  # blake2b of a segment as written: this machine's check of its own files
IMPORT_BATCH = 2000  # records per transaction: the store's lock is free between two
# A folder can hold any number of files that are refused (10,000 junk files named like segments):
# each is counted and kept with why, but only the first few are said, in the log, by `calm sync
# now` and by `calm sync` / `calmd status`; the rest are a count.
REFUSALS_SAID = 5


@dataclass
class SyncReport:
    """What one run did."""

    exported: int = 0
    forgets_sent: int = 0
    imported: int = 0
    forgotten: int = 0
    bad_times: int = 0  # records received with an impossible time (`valid_time`): kept without it
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why): the first new refusals
    refused_count: int = 0  # new refusals in all (`refused` holds the first REFUSALS_SAID)
    rebuilt: bool = False  # this machine's segments were all written anew (a forget, a new key)
    healed: int = 0  # this machine's segments found deleted, cut short or changed: re-sealed
    merged: int = 0  # small segments of this machine merged into new ones
    hidden: list[HiddenShare] = field(default_factory=list)  # other machines found hiding records
    disowned: int = 0  # segments in this machine's sub-folder sealed with its key that it never numbered
    git: str = ""  # what git said, when it failed


@dataclass(frozen=True)
class HiddenShare:
    """Another machine whose newest manifest (the list of its live segments, in segment
    `manifest`) leaves out segments still in the folder that held records not in the ones it lists:
    `records` of them, in `segments`, stored here all the same (calmd/sync/import_.py). A store
    restored from a backup writes such a manifest, and so can another program that holds the key;
    the machine itself writes a new one past it at its next export (calmd/sync/export.py)."""

    host: str
    name: str
    manifest: int
    segments: Ranges
    records: int
    new: bool = False  # found by this run (not only remembered from an earlier one)

    def healed(self, present: Collection[int], live: Ranges) -> bool:
        """Whether each segment it hid is listed by the host's newest manifest now, or gone."""
        return all(seq not in present or in_ranges(live, seq) for seq in numbers_in(self.segments))

    def adding(self, earlier: HiddenShare) -> HiddenShare:
        both = {*numbers_in(self.segments), *numbers_in(earlier.segments)}
        return dataclasses.replace(self, segments=to_ranges(both), records=self.records + earlier.records)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "name": self.name, "manifest": self.manifest,
                "segments": [list(r) for r in self.segments], "records": self.records}  # fmt: skip


def hidden_shares(text: str | None) -> dict[str, HiddenShare]:
    """The hidden shares kept in the store's meta (`sync_hidden`, JSON), by host id."""
    try:
        items = json.loads(text or "[]")
        shares = [HiddenShare(d["host"], d["name"], d["manifest"], [(a, b) for a, b in d["segments"]],
                              d["records"]) for d in items]  # fmt: skip
        return {share.host: share for share in shares}
    except (ValueError, TypeError, KeyError):
        return {}


@dataclass(frozen=True)
class OwnSegment:
    """One of this machine's live segments as it wrote it (`sync_own`): what the check before each
    export compares the folder's file with, and what re-sealing it takes from the store (its
    forgets are the `sync_forgotten` rows whose `sent` is its number)."""

    seq: int
    size: int
    digest: bytes
    stamp: tuple[int, int, int]  # the file's mtime, ctime and inode when last seen as written
    ranges: Ranges  # it holds every record of this machine numbered in these ranges
    records: int


@dataclass
class Sealed:
    """A segment the writer has just written (a row of `sync_own` to be)."""

    seq: int
    size: int
    digest: bytes
    stamp: tuple[int, int, int]
    ranges: Ranges
    records: int
    forgets: list[tuple[str, int]]


class SyncState:
    """One history store's part in sync: the store, CALM_HOME (sync.json, the key, the lock), and
    this machine's identity. calmd/sync/export.py and import_.py build on it; calmd/sync/machine.py
    `Sync` is both."""

    def __init__(self, store: HistoryStore, data_dir: Path) -> None:
        self.store = store
        self.data_dir = data_dir
        self.last_run: float | None = None
        self.last_error: str | None = None
        # the credential checks of an import's distinct commands (a history repeats itself): half
        # of an import's time went to checking each record again, time a keystroke waited for the
        # GIL meanwhile (bench/sync.py); bounded as the imports of history files bound theirs
        self._verdicts: dict[str, RecordResult] = {}
        # the refusals of an import not written yet (`sync_refused` rows): written in one
        # transaction per REFUSAL_BATCH, not one per file
        self._refusals: list[tuple[str, str, int, int, int, int, float]] = []

    # -- identity ----------------------------------------------------------------------------------

    def _meta(self, db: sqlite3.Connection, key: str) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, db: sqlite3.Connection, key: str, value: str) -> None:
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _add(self, db: sqlite3.Connection, key: str, n: int) -> None:
        self._set_meta(db, key, str(int(self._meta(db, key) or 0) + n))

    def host_id(self) -> str:
        """This machine's sync id: made once (random), kept in the store."""
        with self.store.reading() as db:
            found = self._meta(db, "sync_host_id")
        if found:
            return found
        with self.store.writing() as db:
            found = self._meta(db, "sync_host_id")
            if not found:
                found = secrets.token_hex(8)
                self._set_meta(db, "sync_host_id", found)
        return found

    def host_name(self) -> str:
        """This machine's name as the others show it (`calm sync --name`, else the hostname)."""
        with self.store.reading() as db:
            return self._meta(db, "sync_host_name") or this_hostname()

    def set_host_name(self, name: str) -> None:
        name = clean_host_name(name)
        with self.store.writing() as db:
            self._set_meta(db, "sync_host_name", name)

    def config(self) -> SyncConfig | None:
        return read_config(paths.sync_config_path(self.data_dir))

    def key(self) -> bytes:
        return read_key(paths.sync_key_path(self.data_dir))


def clean_host_name(name: str) -> str:
    """This machine's name as `calm sync --name` gives it, its spaces folded; SyncError unless it
    is 1 to MAX_NAME_CHARS characters of text (bytes that are not UTF-8, given on the command line,
    are not: the others could not be sent them)."""
    name = " ".join(name.split())
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise SyncError(f"--name {name}: not UTF-8 text: give 1 to {MAX_NAME_CHARS} characters") from None
    if not name or len(name) > MAX_NAME_CHARS:
        raise SyncError(f"--name: give 1 to {MAX_NAME_CHARS} characters")
    return name


def file_stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file's bytes changed without reading them: its size, mtime, ctime and inode.
    The ctime too: a copy written in place with its mtime set back keeps size, mtime and inode, but
    no program can set the ctime."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def content_digest(data: bytes | bytearray) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()
