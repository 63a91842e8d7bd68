"""Import: the other machines' shares, read and stored here.

`Import.import_all` reads every other machine's segments that it has not read as they are (size,
mtime, ctime, inode), the newest first, skipping those its newest manifest replaced; it opens
every chunk before it stores anything (a file that fails is refused whole: one log line, counted,
kept in `sync_refused` with why, read again only when it changes), then stores the records in
batches: INSERT OR IGNORE on (origin, origin_id), so the same record twice is one record, in any
order, from any engine's copy; never one that was forgotten. Time is never used to decide anything
(clocks disagree). What arrives passes this machine's credential detector again before it is
stored, and the forgets it carries delete the records they name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from calmd.atomic import read_regular_file
from calmd.history.store import VERDICT_CACHE, HistoryStore, valid_time
from calmd.sync.config import SyncError
from calmd.sync.seal import HOST_ID, MAX_SEGMENT_BYTES, SEGMENT_NAME, Refused, key_id, open_segment
from calmd.sync.state import IMPORT_BATCH, SyncReport, SyncState, file_stamp, log
from calmd.sync.wire import Incoming, Ranges, in_ranges, parse_live, parse_payload


class Import(SyncState):
    """The others' side of a run (calmd/sync/machine.py)."""

    def _refuse(self, path: Path, st: os.stat_result, why: str, report: SyncReport) -> None:
        """Refuse a file: one log line, counted, kept (with why) until it changes or goes."""
        with self.store.writing() as db:
            db.execute(
                "INSERT OR REPLACE INTO sync_refused (path, reason, size, mtime_ns, ctime_ns, ino, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (str(path), why, *file_stamp(st), time.time()),
            )
            self._add(db, "sync_refused", 1)
        log.warning("sync: refused %s: %s; nothing of it was imported", path, why)
        report.refused.append((str(path), why))

    def import_all(self, folder: Path, key: bytes, report: SyncReport) -> None:
        """Every other machine's segments not yet read as they are, each host's newest first,
        skipping (unread) those its newest manifest no longer lists."""
        try:
            self._import_all(folder, key, report)
        finally:
            self._verdicts.clear()  # not held between runs (and a newer detector checks afresh)

    def _import_all(self, folder: Path, key: bytes, report: SyncReport) -> None:
        own = self.host_id()
        kid = key_id(key).hex()
        with self.store.writing() as db:
            if self._meta(db, "sync_import_key_id") != kid:  # a new key: what it refused is read again
                db.execute("DELETE FROM sync_refused")
                self._set_meta(db, "sync_import_key_id", kid)
        with self.store.reading() as db:
            files = db.execute("SELECT host, seq, size, mtime_ns, ctime_ns, ino FROM sync_files")
            seen = {(h, s): tuple(stamp) for h, s, *stamp in files}
            refused = {p: tuple(stamp) for p, *stamp in db.execute(
                "SELECT path, size, mtime_ns, ctime_ns, ino FROM sync_refused")}  # fmt: skip
            manifests = {h: (s, [(a, b) for a, b in json.loads(live)]) for h, s, live in db.execute(
                "SELECT id, manifest_seq, live FROM sync_hosts WHERE manifest_seq > 0")}  # fmt: skip
        present: set[str] = set()
        superseded = 0
        try:
            hosts = sorted(entry for entry in os.listdir(folder) if HOST_ID.match(entry) and entry != own)
        except OSError as exc:
            raise SyncError(f"{folder}: cannot read the sync folder: {exc.strerror}") from None
        for host in hosts:
            host_dir = folder / host
            if host_dir.is_symlink() or not host_dir.is_dir():
                continue
            try:
                names = os.listdir(host_dir)
            except OSError:
                continue
            newest, live = manifests.get(host, (0, []))
            for seq, name in sorted(
                ((int(m.group(1)), m.group(0)) for m in map(SEGMENT_NAME.match, names) if m), reverse=True
            ):
                if seq < newest and not in_ranges(live, seq):
                    superseded += 1  # replaced by newer segments: left (or put back) by the engine
                    continue
                path = host_dir / name
                present.add(str(path))
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                if seen.get((host, seq)) == file_stamp(st):
                    continue  # read as it is
                if refused.get(str(path)) == file_stamp(st):
                    continue  # refused as it is: said once
                manifest = self._import_segment(path, st, key, host, seq, report)
                if manifest is not None and seq > newest:
                    newest, live = seq, manifest
            stale = [(h, seq) for h, seq in seen if h == host and seq < newest and not in_ranges(live, seq)]
            if stale:
                with self.store.writing() as db:
                    db.executemany("DELETE FROM sync_files WHERE host = ? AND seq = ?", stale)
        gone = [p for p in refused if p not in present]
        with self.store.writing() as db:
            db.executemany("DELETE FROM sync_refused WHERE path = ?", [(p,) for p in gone])
            self._set_meta(db, "sync_superseded", str(superseded))

    def _import_segment(self, path: Path, st: os.stat_result, key: bytes, host: str, seq: int,
                        report: SyncReport) -> Ranges | None:  # fmt: skip
        """Store what one segment holds; its manifest, or None when it was refused."""
        if not stat.S_ISREG(st.st_mode):
            self._refuse(path, st, "not a regular file", report)
            return None
        try:
            data = read_regular_file(path, limit=MAX_SEGMENT_BYTES)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._refuse(path, st, f"cannot be read ({exc.strerror or exc})", report)
            return None
        now = time.time()
        try:
            opened = open_segment(data, key, host, seq)
            live = parse_live(opened.payloads[0].get("live"), seq)
            batches = [parse_payload(p, now) for p in opened.payloads]
        except Refused as exc:
            self._refuse(path, st, str(exc), report)
            return None
        name = next((b[0] for b in reversed(batches) if b[0]), None)
        sealed = max((b[1] for b in batches if b[1] is not None), default=None)
        # a record that came without a possible time takes the time of the record before it in
        # the segment (its machine's order), the first one when it was sealed, else now: the
        # rule the store's repair of older rows follows (HistoryStore._repair_times)
        before = min(sealed, now) if sealed is not None and valid_time(sealed) else now
        imported = 0
        for _, _, records, forgets in batches:
            timed = []
            for r in records:
                if r.ts is None:
                    r = dataclasses.replace(r, ts=before)
                else:
                    before = r.ts
                timed.append(r)
            stored, bad_times = self._store_records(host, name or host, timed)
            imported += stored
            report.bad_times += bad_times
            report.forgotten += self._apply_forgets(forgets)
        with self.store.writing() as db:
            db.execute("INSERT OR REPLACE INTO sync_files (host, seq, size, mtime_ns, ctime_ns, ino) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (host, seq, *file_stamp(st)))  # fmt: skip
            db.execute("INSERT OR IGNORE INTO sync_hosts (id, name) VALUES (?, ?)", (host, name or host))
            db.execute(
                "UPDATE sync_hosts SET name = coalesce(?, name), records = records + ?, "
                "last_sealed = CASE WHEN ? IS NULL THEN last_sealed WHEN last_seq > ? THEN last_sealed "
                "ELSE ? END, last_seq = max(last_seq, ?) WHERE id = ?",
                (name, imported, sealed, seq, sealed, seq, host),
            )
            db.execute("UPDATE sync_hosts SET manifest_seq = ?, live = ? WHERE id = ? AND manifest_seq < ?",
                       (seq, json.dumps(live), host, seq))  # fmt: skip
            db.execute("DELETE FROM sync_refused WHERE path = ?", (str(path),))
            if name:  # a host that changed its name: all of its records show the new one (through the
                # origin index: a scan of the whole store, 60 ms on 500,000 rows, held every keystroke
                # that came meanwhile, at each segment read)
                db.execute("UPDATE commands SET host = ? WHERE origin = ? AND origin_id IS NOT NULL "
                           "AND host != ?", (name, host, name))  # fmt: skip
        report.imported += imported
        return live

    def _store_records(self, host: str, name: str, records: list[Incoming]) -> tuple[int, int]:
        """Store records of `host` that are new, not forgotten, and pass this machine's checks
        (each timed: `_import_segment`); returns how many were stored, and how many of those came
        with an impossible time (counted in `sync_bad_times`, as the imports count theirs)."""
        rows: list[tuple[tuple[Any, ...], bool]] = []
        dropped = 0
        if not records:
            return 0, 0
        for r in records:
            verdict = self._verdicts.get(r.cmd)
            if verdict is None:
                if len(self._verdicts) >= VERDICT_CACHE:
                    self._verdicts.clear()
                verdict = self._verdicts[r.cmd] = HistoryStore.check(r.cmd)
            if not verdict.stored:
                dropped += verdict.reason.startswith("secret:")
                continue
            rows.append(((r.ts, f"{host}:{r.session}", r.cwd, r.git, r.cmd, r.exit, r.source, r.comp, r.env,
                          r.duration, name, host, r.origin_id, host, r.origin_id), r.bad_time))  # fmt: skip
        stored = bad_times = 0
        insert = (
            "INSERT OR IGNORE INTO commands (ts, session, cwd, git, cmd, exit, source, comp, env, "
            "duration, host, origin, origin_id) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? "
            "WHERE NOT EXISTS (SELECT 1 FROM sync_forgotten WHERE origin = ? AND origin_id = ?)"
        )
        for first in range(0, len(rows), IMPORT_BATCH):
            batch = rows[first : first + IMPORT_BATCH]
            with self.store.writing() as db:
                before = db.total_changes
                bad = 0
                if any(flag for _, flag in batch):  # one by one: a record read twice is counted once
                    for values, bad_time in batch:
                        changes = db.total_changes
                        db.execute(insert, values)
                        bad += bad_time and db.total_changes > changes
                else:
                    db.executemany(insert, [values for values, _ in batch])
                added = db.total_changes - before  # (before the counters' own changes)
                stored += added
                bad_times += bad
                self._add(db, "recorded_since_train", added)
                self._add(db, "sync_records_in", added)
                if bad:
                    self._add(db, "sync_bad_times", bad)
        if dropped:  # stored on the other machine by an older detector: this one's refuses them
            with self.store.writing() as db:
                self._add(db, "dropped_secrets", dropped)
        return stored, bad_times

    def _apply_forgets(self, forgets: list[tuple[str, int]]) -> int:
        """Delete what another machine forgot (remembered: it never comes back), for good."""
        if not forgets:
            return 0
        own = self.host_id()
        with self.store.writing() as db:
            db.executemany(
                "INSERT OR IGNORE INTO sync_forgotten (origin, origin_id, sent) VALUES (?, ?, -1)", forgets
            )
            doomed = []
            for origin, oid in forgets:
                row = db.execute("SELECT id FROM commands WHERE origin = ? AND origin_id = ?",
                                 ("" if origin == own else origin, oid)).fetchone()  # fmt: skip
                if row is not None:
                    doomed.append(row[0])
        return self.store.delete_rows(doomed)

    # -- status ------------------------------------------------------------------------------------
