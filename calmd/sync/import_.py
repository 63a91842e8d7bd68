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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.atomic import read_regular_file
from calmd.history.recorded import VERDICT_CACHE, valid_time
from calmd.history.store import HistoryStore
from calmd.sync.config import SyncError
from calmd.sync.seal import HOST_ID, MAX_SEGMENT_BYTES, SEGMENT_NAME, Refused, key_id, open_segment
from calmd.sync.state import (
    IMPORT_BATCH,
    REFUSALS_SAID,
    HiddenShare,
    SyncReport,
    SyncState,
    file_stamp,
    hidden_shares,
    log,
)
from calmd.sync.wire import Incoming, Ranges, in_ranges, numbers_in, parse_live, parse_payload, to_ranges

REFUSAL_BATCH = 1000  # refusals written to the store per transaction


@dataclass
class _Scan:
    """What one import knows of the folder as it goes: the segments read before (their stamps),
    the files refused as they are, what it read now, the files seen, the replaced ones counted."""

    seen: dict[tuple[str, int], tuple[int, ...]]
    refused: dict[str, tuple[int, ...]]
    read: set[tuple[str, int]] = field(default_factory=set)  # as they are now: read now or before
    present: set[str] = field(default_factory=set)
    live: dict[str, Ranges] = field(default_factory=dict)  # each host's newest manifest
    superseded: int = 0


class Import(SyncState):
    """The others' side of a run (calmd/sync/machine.py)."""

    def _refuse(self, path: Path, st: os.stat_result, why: str, report: SyncReport) -> None:
        """Refuse a file: counted, kept (with why) until it changes or goes; the first few of a run
        said one by one in the log (the rest in one line at the end of the run)."""
        self._refusals.append((str(path), why, *file_stamp(st), time.time()))
        if len(self._refusals) >= REFUSAL_BATCH:
            self._write_refusals()
        report.refused_count += 1
        if len(report.refused) < REFUSALS_SAID:
            report.refused.append((str(path), why))
            log.warning("sync: refused %s: %s; nothing of it was imported", path, why)

    def _write_refusals(self) -> None:
        if not self._refusals:
            return
        with self.store.writing() as db:
            db.executemany(
                "INSERT OR REPLACE INTO sync_refused (path, reason, size, mtime_ns, ctime_ns, ino, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                self._refusals,
            )
            self._add(db, "sync_refused", len(self._refusals))
        self._refusals.clear()

    def import_all(self, folder: Path, key: bytes, report: SyncReport) -> None:
        """Every other machine's segments not yet read as they are, each host's newest first,
        skipping (unread) those its newest manifest no longer lists."""
        try:
            self._import_all(folder, key, report)
        finally:
            self._verdicts.clear()  # not held between runs (and a newer detector checks afresh)
            self._write_refusals()
        if report.refused_count > len(report.refused):
            log.warning("sync: refused %d more files (%d in all this run; nothing of them was imported): "
                        "`calm sync` shows the first ones", report.refused_count - len(report.refused),
                        report.refused_count)  # fmt: skip

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
            hidden_before = hidden_shares(self._meta(db, "sync_hidden"))
        scan = _Scan(seen, refused)
        try:
            hosts = sorted(entry for entry in os.listdir(folder) if HOST_ID.match(entry) and entry != own)
        except OSError as exc:
            raise SyncError(f"{folder}: cannot read the sync folder: {exc.strerror}") from None
        hidden: dict[str, HiddenShare] = {}
        for host in hosts:
            host_dir = folder / host
            if host_dir.is_symlink() or not host_dir.is_dir():
                continue
            try:
                names = os.listdir(host_dir)
            except OSError:
                continue
            numbers = {int(m.group(1)): m.group(0) for m in map(SEGMENT_NAME.match, names) if m}
            flag = self._import_host(host_dir, host, numbers, manifests.get(host, (0, [])), key, scan, report)
            before = hidden_before.get(host)
            if before is not None and before.healed(numbers, scan.live.get(host, [])):
                before = None  # listed again by a newer manifest, or gone from the folder
            if flag is not None and before is not None:
                flag = flag.adding(before)
            kept = flag or before
            if kept is not None:
                hidden[host] = kept  # said until the machine lists them again
            prune = [(host, seq) for h, seq in seen if h == host and seq not in numbers]
            if prune:  # files that left the folder (read again if they come back: the same records)
                with self.store.writing() as db:
                    db.executemany("DELETE FROM sync_files WHERE host = ? AND seq = ?", prune)
        report.hidden = [h for h in hidden.values() if h.new]
        self._write_refusals()
        gone = [p for p in refused if p not in scan.present]
        with self.store.writing() as db:
            db.executemany("DELETE FROM sync_refused WHERE path = ?", [(p,) for p in gone])
            self._set_meta(db, "sync_superseded", str(scan.superseded))
            self._set_meta(db, "sync_hidden", json.dumps([h.to_json() for h in hidden.values()]))

    def _import_host(self, host_dir: Path, host: str, numbers: dict[int, str], manifest: tuple[int, Ranges],
                     key: bytes, scan: _Scan, report: SyncReport) -> HiddenShare | None:  # fmt: skip
        """One machine's segments: those its newest manifest lists (the live ones), newest first,
        then those it leaves out. A segment left out was replaced (merged, sealed again, written
        anew after a forget or a new key): what it holds is in the live ones, or was forgotten, and
        the engine left it or put it back. It is read once all the same, quietly (a file that does
        not open is not refused: it was replaced), and what it holds that is neither here nor
        forgotten is stored: a manifest that leaves out segments it should list (one sealed by
        another program that holds the key, or by a store restored from a backup) hides nothing
        from this machine. When all the live segments were read and a replaced one still brought
        records, the machine's manifest hid them: returned, to be said (`calm sync now`, `calm
        sync`, `calmd status`) until a newer manifest lists them again or they leave the folder."""
        newest, live = manifest
        replaced: list[int] = []
        for seq in sorted(numbers, reverse=True):
            if seq < newest and not in_ranges(live, seq):
                replaced.append(seq)  # replaced by newer segments: left (or put back) by the engine
                continue
            path = f"{host_dir}/{numbers[seq]}"  # a text, not a Path: 10,000 files cost 0.15 s less
            scan.present.add(path)
            got = self._read_segment(path, host, seq, key, scan, report, replaced=False)
            if got is not None and seq > newest:
                newest, live = seq, got[0]
        scan.superseded += len(replaced)
        scan.live[host] = live
        listed = sum(last - first + 1 for first, last in live)
        # every live segment there and read (counted first: a manifest can claim any number)
        whole = listed <= len(numbers) and all((host, seq) in scan.read for seq in numbers_in(live))
        brought: list[int] = []
        records = 0
        for seq in replaced:
            path = f"{host_dir}/{numbers[seq]}"
            got = self._read_segment(path, host, seq, key, scan, report, replaced=True)
            if got is not None and got[1]:
                brought.append(seq)
                records += got[1]
        if not brought or not whole:
            return None
        with self.store.reading() as db:
            row = db.execute("SELECT name FROM sync_hosts WHERE id = ?", (host,)).fetchone()
        log.warning("sync: %s's newest list of its segments (in %s) leaves out %d segments still in the "
                    "folder that held %d records not in the ones it lists: stored all the same",
                    host_dir, paths.SYNC_SEGMENT.format(seq=newest), len(brought), records)  # fmt: skip
        return HiddenShare(host, row[0] if row else host, newest, to_ranges(brought), records, new=True)

    def _read_segment(self, path: str, host: str, seq: int, key: bytes, scan: _Scan, report: SyncReport, *,
                      replaced: bool) -> tuple[Ranges, int] | None:  # fmt: skip
        """Read one segment unless it was read (or refused) as it is: its manifest and the records
        it brought; None when it was not read now (as it was, refused, gone)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if scan.seen.get((host, seq)) == file_stamp(st):
            scan.read.add((host, seq))
            return None  # read as it is
        if not replaced and scan.refused.get(path) == file_stamp(st):
            return None  # refused as it is: said once
        got = self._import_segment(Path(path), st, key, host, seq, report, replaced=replaced)
        if got is not None:
            scan.read.add((host, seq))
        return got

    def _import_segment(self, path: Path, st: os.stat_result, key: bytes, host: str, seq: int,
                        report: SyncReport, *, replaced: bool = False,
                        ) -> tuple[Ranges, int] | None:  # fmt: skip
        """Store what one segment holds: its manifest and how many records it brought, or None when
        it was refused. A `replaced` one (its host's newest manifest leaves it out) is not refused
        when it does not open, only noted as read; its name and times say nothing of the host now."""
        try:
            if not stat.S_ISREG(st.st_mode):
                raise Refused("not a regular file")
            try:
                data = read_regular_file(path, limit=MAX_SEGMENT_BYTES)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise Refused(f"cannot be read ({exc.strerror or exc})") from None
            now = time.time()
            opened = open_segment(data, key, host, seq)
            live = parse_live(opened.payloads[0].get("live"), seq)
            batches = [parse_payload(p, now) for p in opened.payloads]
        except Refused as exc:
            if replaced:
                with self.store.writing() as db:
                    db.execute("INSERT OR REPLACE INTO sync_files (host, seq, size, mtime_ns, ctime_ns, ino) "
                               "VALUES (?, ?, ?, ?, ?, ?)", (host, seq, *file_stamp(st)))  # fmt: skip
            else:
                self._refuse(path, st, str(exc), report)
            return None
        name = next((b[0] for b in reversed(batches) if b[0]), None)
        stored_name = name or host
        if replaced:  # an older name: the host's is the one its live segments say
            with self.store.reading() as db:
                row = db.execute("SELECT name FROM sync_hosts WHERE id = ?", (host,)).fetchone()
            name, stored_name = None, (row[0] if row else host)
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
            stored, bad_times = self._store_records(host, stored_name, timed)
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
        return live, imported

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
