"""Export: this machine's share of the folder, written by it alone.

Segments never change once written: each export seals a NEW segment (the next number, never used
before, never used again), and nothing is ever appended or rewritten in place. So no two versions
of one file name exist, and an engine that reverts, reorders or mixes up versions of a file (rsync
comparing times to the second, a cloud drive restoring an older copy) has nothing to get wrong.
What replaces segments (merging many small ones, re-sealing a lost one, rewriting after a forget
or a new key) writes new segments and deletes the old ones; each segment's first chunk carries the
list of the machine's live segments at the time it was written (its manifest), so a reader skips,
unread, a segment a newer manifest no longer lists.

`Export.export` first checks this machine's own live segments against what it wrote (kept in
`sync_own`: size, content hash, the records and forgets each holds): one that the engine deleted,
cut short or changed is re-sealed into a new segment from the store (one log line, counted in
`sync_healed`). Then it seals the new records and forgets into a new segment; once COMPACT_SEGMENTS
small segments are live it merges them into new ones, so the number of files stays bounded. A
machine whose own records were forgotten rewrites its segments from its store (new segments, the
old ones deleted), so that the forgotten text leaves the folder too. A new key does the same.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from calmd import paths
from calmd.atomic import atomic_write, read_regular_file, remove_stale_temp_files
from calmd.sync.seal import (
    CHUNK_HEAD,
    HEADER,
    MAX_SEGMENT_BYTES,
    SEGMENT_NAME,
    TAG_BYTES,
    Refused,
    key_id,
    open_segment,
    peek_header,
    seal_segment,
)
from calmd.sync.state import (
    IMPORT_BATCH,
    OwnSegment,
    Sealed,
    SyncReport,
    SyncState,
    content_digest,
    file_stamp,
    log,
)
from calmd.sync.wire import chunk_payloads, to_ranges

SEGMENT_BYTES = 4 << 20  # a segment is closed past this: the rest goes into the next one
CLOSED_BYTES = 1 << 20  # a segment this large is never merged again ...
COMPACT_SEGMENTS = 32  # ... smaller ones are merged into new ones once there are this many
# A test's hook (tests/sync/test_sync_daemons.py kills the daemon in the middle of writing a segment):
# when set, each segment's write waits this many seconds once its temp file holds its bytes.
TEST_HOLD_ENV = "CALM_TEST_SYNC_HOLD_S"


class Export(SyncState):
    """This machine's side of a run: check its share, seal what is new (calmd/sync/machine.py)."""

    def _rebuild_due(self) -> bool:
        with self.store.reading() as db:
            return self._meta(db, "sync_rebuild") == "1"

    def _number_new_rows(self) -> None:
        """Give this machine's rows that were never shared their record numbers (a counter that
        never goes back: a deleted row's number is never reused), in batches."""
        while True:
            with self.store.writing() as db:
                ids = [rid for (rid,) in db.execute(
                    "SELECT id FROM commands WHERE origin_id IS NULL AND origin = '' ORDER BY id LIMIT ?",
                    (IMPORT_BATCH,))]  # fmt: skip
                if not ids:
                    return
                first = int(self._meta(db, "sync_next_id") or 1)
                db.executemany("UPDATE commands SET origin_id = ? WHERE id = ?",
                               [(first + i, rid) for i, rid in enumerate(ids)])  # fmt: skip
                self._set_meta(db, "sync_next_id", str(first + len(ids)))

    def _own_segments(self) -> dict[int, OwnSegment]:
        """This machine's live segments, as it wrote them."""
        with self.store.reading() as db:
            rows = db.execute(
                "SELECT seq, size, digest, mtime_ns, ctime_ns, ino, ranges, records FROM sync_own"
            ).fetchall()
        own = {}
        for seq, size, digest, mtime_ns, ctime_ns, ino, ranges, records in rows:
            spans = [(first, last) for first, last in json.loads(ranges)]
            own[seq] = OwnSegment(seq, size, bytes(digest), (mtime_ns, ctime_ns, ino), spans, records)
        return own

    def _unknown_segments(self, folder: Path, host_id: str, key: bytes, present: set[int],
                          newest: int) -> tuple[list[int], list[int]]:  # fmt: skip
        """Segments in this machine's sub-folder past its newest live one that open as its own
        (sealed with its key, naming its id and their number) but are not among its live ones:
        (those an export of its own left when it did not finish, those it never numbered). A
        reader takes the newest manifest it can open for the machine's: one of these hides what
        the machine's own manifest lists, so the export writes a segment past them that lists its
        live ones, and deletes them (`_remove_replaced`). Those it never numbered come from a store
        restored from a backup (it would give their numbers again) or from another program that
        holds the key: the store's counters go past theirs, so that no name and no record's
        identity is ever used twice. A file that does not open as this machine's (planted,
        damaged, junk) moves nothing: readers refuse it; only its first bytes are read here."""
        with self.store.reading() as db:
            floor = max(int(self._meta(db, "sync_next_seq") or 1), newest + 1)
        left: list[int] = []
        unknown: list[int] = []
        last_id = 0
        mine = key_id(key), bytes.fromhex(host_id)
        for seq in sorted((n for n in present if n > newest), reverse=True):
            path = paths.sync_segment(folder, host_id, seq)
            header = peek_header(path)
            if header is None or (header.key_id, header.host, header.seq) != (*mine, seq):
                continue
            try:
                opened = open_segment(read_regular_file(path, limit=MAX_SEGMENT_BYTES), key, host_id, seq)
            except (OSError, Refused):
                continue
            (unknown if seq >= floor else left).append(seq)
            if seq >= floor:
                for payload in opened.payloads:
                    for record in payload.get("records") or ():
                        if isinstance(record, list) and record and isinstance(record[0], int):
                            last_id = max(last_id, record[0])
        if not unknown:
            return left, unknown
        with self.store.writing() as db:
            self._set_meta(
                db, "sync_next_seq", str(max(int(self._meta(db, "sync_next_seq") or 1), max(unknown) + 1))
            )
            self._set_meta(
                db, "sync_next_id", str(max(int(self._meta(db, "sync_next_id") or 1), last_id + 1))
            )
            self._add(db, "sync_disowned", len(unknown))
        log.warning("sync: %s holds %d segments sealed with this machine's key and id up to %s that its "
                    "history does not know of (restored from a backup, or written by another program "
                    "with the key): a reader would take the newest for this machine's list of its "
                    "segments; new segments and records are numbered past them, the next one lists this "
                    "machine's segments again, and they are deleted", paths.sync_host_dir(folder, host_id),
                    len(unknown), paths.SYNC_SEGMENT.format(seq=max(unknown)))  # fmt: skip
        return left, unknown

    def reserve_seq(self, at_least: int) -> int:
        """The next segment number, taken for good before its file is written: a number is used
        once, even by a write that never finished."""
        with self.store.writing() as db:
            seq = max(at_least, int(self._meta(db, "sync_next_seq") or 1))
            self._set_meta(db, "sync_next_seq", str(seq + 1))
        return seq

    def _check_own(self, folder: Path, host_id: str, own: dict[int, OwnSegment]) -> dict[int, str]:
        """This machine's live segments that are not in the folder as it wrote them, and what
        became of each: deleted, cut short, changed (an engine, a person, a disk). A file whose
        size, mtime, ctime and inode are as last seen is taken as it is; any other is hashed."""
        broken: dict[int, str] = {}
        moved: list[tuple[int, int, int, int]] = []
        for seq, seg in sorted(own.items()):
            path = paths.sync_segment(folder, host_id, seq)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                broken[seq] = "deleted"
                continue
            except OSError as exc:
                broken[seq] = f"unreadable ({exc.strerror or exc})"
                continue
            if stat.S_ISREG(st.st_mode) and file_stamp(st) == (seg.size, *seg.stamp):
                continue
            try:
                data = read_regular_file(path, limit=MAX_SEGMENT_BYTES)
            except FileNotFoundError:
                broken[seq] = "deleted"
                continue
            except OSError as exc:
                broken[seq] = f"unreadable ({exc.strerror or exc})"
                continue
            if len(data) == seg.size and content_digest(data) == seg.digest:
                moved.append((st.st_mtime_ns, st.st_ctime_ns, st.st_ino, seq))  # the same bytes, copied again
            elif len(data) < seg.size:
                broken[seq] = f"cut short ({len(data):,} of {seg.size:,} bytes)"
            else:
                broken[seq] = f"changed ({len(data):,} bytes, not the {seg.size:,} written)"
        if moved:
            with self.store.writing() as db:
                db.executemany("UPDATE sync_own SET mtime_ns = ?, ctime_ns = ?, ino = ? WHERE seq = ?", moved)
        return broken

    def export(self, folder: Path, key: bytes, report: SyncReport) -> None:
        """Check this machine's segments in the folder (re-seal what the engine lost or changed),
        then seal its new records and forgets into a new segment, merging small segments once
        there are COMPACT_SEGMENTS of them; all segments anew after a forget of its own records
        or a new key. No file is ever written twice."""
        host_id = self.host_id()
        own_dir = paths.private_dir(paths.sync_host_dir(folder, host_id))
        with self.store.reading() as db:
            kept_folder = self._meta(db, "sync_folder")
        if kept_folder != str(folder):  # where its share is, for `calm forget --all` with sync off
            with self.store.writing() as db:
                self._set_meta(db, "sync_folder", str(folder))
        remove_stale_temp_files(own_dir)
        own = self._own_segments()
        present = files_in(own_dir)
        left, unknown = self._unknown_segments(folder, host_id, key, present, max(own, default=0))
        report.disowned += len(unknown)
        self._number_new_rows()
        kid = key_id(key).hex()
        with self.store.reading() as db:
            rebuild = self._meta(db, "sync_rebuild") == "1"
            rebuild |= self._meta(db, "sync_key_id") not in (None, kid)  # a new key
            written = int(self._meta(db, "sync_written_id") or 0)
            next_seq = max(int(self._meta(db, "sync_next_seq") or 1), max(own, default=0) + 1)
        if written and not own:
            rebuild = True  # records were sealed, but no record of where: all of them again
        if rebuild:
            self._rebuild(folder, key, host_id, next_seq, own, present, report)
            return
        broken = self._check_own(folder, host_id, own)
        small = [seq for seq, seg in own.items() if seq not in broken and seg.size < CLOSED_BYTES]
        merging = small if len(small) >= COMPACT_SEGMENTS else []
        replaced = sorted({*broken, *merging})
        fresh = self._unsent_forgets()
        overruled = left or unknown  # a newer manifest than this machine's own: it writes one past them
        if not replaced and not fresh and own and not overruled and not self._has_records_after(written):
            with self.store.writing() as db:
                self._set_meta(db, "sync_key_id", kid)
            return
        sources: list[tuple[int, int | None]] = [*sorted(r for seq in replaced for r in own[seq].ranges)]
        sources.append((written + 1, None))  # the records never sent
        carried = self._forgets_of(replaced)
        counted: dict[int, int] = {}
        sealed = self._write_batch(folder, key, host_id, next_seq, [s for s in own if s not in replaced],
                                   replaced, sources, carried + fresh, counted)  # fmt: skip
        exported = counted.get(len(sources) - 1, 0)
        self._commit_batch(sealed, replaced, written, exported, healed=len(broken), key_hex=kid)
        self._remove_replaced(folder, host_id, own, replaced, present, sealed)
        if broken:
            said = ", ".join(f"{paths.SYNC_SEGMENT.format(seq=seq)} {why}" for seq, why in broken.items())
            log.warning("sync: this machine's segments were not as it wrote them in %s (%s): what they held "
                        "(%d records) is sealed again in %s", paths.sync_host_dir(folder, host_id), said,
                        sum(own[seq].records for seq in broken), _names(sealed))  # fmt: skip
        if merging:
            log.info("sync: merged %d small segments of this machine into %s", len(merging), _names(sealed))
        report.exported += exported
        report.forgets_sent += len(fresh)
        report.healed += len(broken)
        report.merged += len(merging)

    def _rebuild(self, folder: Path, key: bytes, host_id: str, next_seq: int, own: dict[int, OwnSegment],
                 present: set[int], report: SyncReport) -> None:  # fmt: skip
        """Write this machine's segments anew from the store: after its own records were
        forgotten (their text leaves the folder), after a new key, or when it has no record of
        what it wrote. The new segments' manifest lists only them; every older file is deleted."""
        with self.store.reading() as db:
            forgets = [(o, i) for o, i in db.execute("SELECT origin, origin_id FROM sync_forgotten")]
            written = int(self._meta(db, "sync_written_id") or 0)
            generation = self._meta(db, "generation")  # bumped by every deletion
        counted: dict[int, int] = {}
        sources: list[tuple[int, int | None]] = [(1, written), (written + 1, None)]
        sealed = self._write_batch(folder, key, host_id, next_seq, [], sorted(own), sources, forgets, counted)
        kid = key_id(key).hex()
        exported = counted.get(1, 0)  # the records never sent before
        self._commit_batch(
            sealed, sorted(own), written, exported, healed=0, key_hex=kid, rebuilt=True, generation=generation
        )
        live = {s.seq for s in sealed}
        for seq in sorted(present | set(own)):
            if seq not in live:
                paths.sync_segment(folder, host_id, seq).unlink(missing_ok=True)
        log.info("sync: wrote this machine's segments anew (%s, %d records); the %d before are deleted",
                 _names(sealed), sum(counted.values()), len(present | set(own)))  # fmt: skip
        report.rebuilt = True
        report.exported += exported
        report.forgets_sent += len(forgets)

    def _write_batch(self, folder: Path, key: bytes, host_id: str, next_seq: int, kept: list[int],
                     replaced: list[int], sources: list[tuple[int, int | None]],
                     forgets: list[tuple[str, int]], counted: dict[int, int]) -> list[Sealed]:  # fmt: skip
        """Seal the records numbered in `sources` (and `forgets`) into new segments; `counted`
        gets how many records came from each source."""
        writer = _Writer(self, folder, key, host_id, next_seq, kept, replaced)
        records = self._records_in(sources, counted)
        for payload, pieces, sent in chunk_payloads(self.host_name(), records, forgets):
            writer.add(payload, pieces, sent)
        return writer.close()

    def _commit_batch(self, sealed: list[Sealed], replaced: list[int], written: int, exported: int, *,
                      healed: int, key_hex: str, rebuilt: bool = False,
                      generation: str | None = None) -> None:  # fmt: skip
        """Note the new segments as this machine's live ones (in place of `replaced`), which
        forgets each carries, and how far the records are sealed. After a rebuild, the rebuild is
        no longer due unless a row was deleted since it read the store (`generation`)."""
        last_id = max((hi for s in sealed for _, hi in s.ranges), default=0)
        with self.store.writing() as db:
            if rebuilt:
                db.execute("DELETE FROM sync_own")
                if self._meta(db, "generation") == generation:
                    self._set_meta(db, "sync_rebuild", "0")
            db.executemany("DELETE FROM sync_own WHERE seq = ?", [(seq,) for seq in replaced])
            db.executemany(
                "INSERT OR REPLACE INTO sync_own (seq, size, digest, mtime_ns, ctime_ns, ino, ranges, "
                "records) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(s.seq, s.size, s.digest, *s.stamp, json.dumps(s.ranges), s.records) for s in sealed],
            )
            db.executemany("UPDATE sync_forgotten SET sent = ? WHERE origin = ? AND origin_id = ?",
                           [(s.seq, o, i) for s in sealed for o, i in s.forgets])  # fmt: skip
            self._set_meta(db, "sync_written_id", str(max(written, last_id)))
            self._set_meta(db, "sync_key_id", key_hex)
            self._add(db, "sync_records_out", exported)
            self._add(db, "sync_healed", healed)

    @staticmethod
    def _remove_replaced(folder: Path, host_id: str, own: dict[int, OwnSegment], replaced: list[int],
                         present: set[int], sealed: list[Sealed]) -> None:  # fmt: skip
        """Delete the segments a batch replaced, and those a write that never finished left (past
        the last live segment before the batch, not live now). Files older than that which are
        not live (ones an engine that does not carry deletions put back) are left: every reader
        skips them unread, and deleting them again would only start the engine copying again."""
        live = {s.seq for s in sealed} | {seq for seq in own if seq not in replaced}
        newest_before = max(own, default=0)
        doomed = set(replaced) | {seq for seq in present if seq > newest_before and seq not in live}
        for seq in sorted(doomed):
            paths.sync_segment(folder, host_id, seq).unlink(missing_ok=True)

    def _has_records_after(self, after: int) -> bool:
        with self.store.reading() as db:
            found = db.execute("SELECT 1 FROM commands WHERE origin = '' AND origin_id > ? LIMIT 1",
                               (after,)).fetchone()  # fmt: skip
        return found is not None

    def _records_in(self, sources: list[tuple[int, int | None]],
                    counted: dict[int, int]) -> Iterator[tuple[int, list[Any]]]:  # fmt: skip
        """(source index, record) for this machine's records numbered in each source range, in
        order; `counted` counts them per source."""
        for index, (first, last) in enumerate(sources):
            for record in self._records_after(first - 1, last):
                counted[index] = counted.get(index, 0) + 1
                yield index, record

    def _records_after(self, after: int, upto: int | None = None) -> Iterator[list[Any]]:
        """This machine's shared records numbered above `after` (up to `upto`), in number order,
        read in batches."""
        top = (1 << 62) if upto is None else upto
        while True:
            with self.store.reading() as db:
                rows = db.execute(
                    "SELECT origin_id, ts, session, cwd, git, cmd, exit, duration, comp, env, source "
                    "FROM commands WHERE origin = '' AND origin_id > ? AND origin_id <= ? "
                    "ORDER BY origin_id LIMIT ?",
                    (after, top, IMPORT_BATCH),
                ).fetchall()  # fmt: skip
            if not rows:
                return
            for row in rows:
                yield list(row)
            after = rows[-1][0]

    def _unsent_forgets(self) -> list[tuple[str, int]]:
        with self.store.reading() as db:
            return [
                (o, i) for o, i in db.execute("SELECT origin, origin_id FROM sync_forgotten WHERE sent = 0")
            ]

    def _forgets_of(self, segments: list[int]) -> list[tuple[str, int]]:
        """The forgets these segments of this machine carry (to be carried by what replaces them)."""
        if not segments:
            return []
        wanted = set(segments)
        with self.store.reading() as db:
            rows = db.execute("SELECT origin, origin_id, sent FROM sync_forgotten WHERE sent > 0").fetchall()
        return [(o, i) for o, i, sent in rows if sent in wanted]


def files_in(own_dir: Path) -> set[int]:
    """The segment numbers in a machine's sub-folder (its live ones, and any the engine left or put
    back)."""
    try:
        names = os.listdir(own_dir)
    except FileNotFoundError:
        return set()
    return {int(m.group(1)) for m in map(SEGMENT_NAME.match, names) if m}


def _names(sealed: list[Sealed]) -> str:
    return ", ".join(paths.SYNC_SEGMENT.format(seq=s.seq) for s in sealed) or "no segment"


def _hold_for_tests(f: Any) -> None:
    """TEST_HOLD_ENV's wait, once the temp file holds the segment's bytes (tests only)."""
    hold = os.environ.get(TEST_HOLD_ENV)
    if not hold:
        return
    try:
        seconds = float(hold)
    except ValueError:
        return
    f.flush()
    log.warning("sync: %s is set: this segment's write waits %g s (a test's hook)", TEST_HOLD_ENV, seconds)
    time.sleep(seconds)


class _Writer:
    """Seals payloads into NEW segments of this machine, each written once (atomically) and never
    again; past SEGMENT_BYTES a segment is closed and the rest goes into the next. The first chunk
    of each carries the manifest: the live segments once it is written, `kept` and the batch's own;
    `replaced` too until the batch's last segment, since they still hold what the rest of the batch
    has not written yet (a batch cut short by a crash drops nothing)."""

    def __init__(self, sync: Export, folder: Path, key: bytes, host_id: str, next_seq: int, kept: list[int],
                 replaced: list[int]) -> None:  # fmt: skip
        self.sync, self.folder, self.key, self.host_id = sync, folder, key, host_id
        self.next_seq, self.kept, self.replaced = next_seq, set(kept), set(replaced)
        self.done: list[Sealed] = []
        self._start()

    def _start(self) -> None:
        self.first: dict[str, Any] | None = None  # packed at the end, with the manifest
        self.plain: list[bytes] = []
        self.size = HEADER.size
        self.pieces: list[tuple[int, int, int]] = []  # (source, first, last) record numbers it holds
        self.records = 0
        self.forgets: list[tuple[str, int]] = []

    def add(self, payload: dict[str, Any], pieces: list[tuple[int, int, int]],
            forgets: list[tuple[str, int]]) -> None:  # fmt: skip
        if self.first is not None and self.size >= SEGMENT_BYTES:
            self._flush(final=False)
        packed = msgpack.packb(payload, use_bin_type=True)
        if self.first is None:
            self.first = payload
        else:
            self.plain.append(packed)
        self.size += CHUNK_HEAD.size + len(packed) + TAG_BYTES
        for source, first, last in pieces:  # a source's records come in order: one range per source
            if self.pieces and self.pieces[-1][0] == source:
                self.pieces[-1] = (source, self.pieces[-1][1], last)
            else:
                self.pieces.append((source, first, last))
        self.records += len(payload["records"])
        self.forgets += forgets

    def _flush(self, final: bool) -> None:
        assert self.first is not None
        seq = self.sync.reserve_seq(self.next_seq)
        self.next_seq = seq + 1
        live = self.kept | {s.seq for s in self.done} | {seq} | (set() if final else self.replaced)
        self.first["live"] = [list(r) for r in to_ranges(live)]
        data = seal_segment(self.key, self.host_id, seq, [msgpack.packb(self.first, use_bin_type=True),
                                                          *self.plain])  # fmt: skip
        path = paths.sync_segment(self.folder, self.host_id, seq)
        with atomic_write(path) as f:
            f.write(data)
            _hold_for_tests(f)
        st = os.lstat(path)
        written = (st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        spans = [(first, last) for _, first, last in self.pieces]
        sealed = Sealed(seq, len(data), content_digest(data), written, spans, self.records, self.forgets)
        self.done.append(sealed)
        self._start()

    def close(self) -> list[Sealed]:
        """Write the last segment (with the batch's final manifest); the segments written."""
        if self.first is not None:
            self._flush(final=True)
        return self.done
