"""One history across machines: sealed segments in a folder that another program replicates.

calmd never talks to the network. Each machine writes its share of the history into a folder the
user names (`calm sync --folder DIR`) and reads the other machines' shares from it; whatever
replicates the folder (Syncthing, a cloud drive, NFS, rsync, git) is the engine (docs/sync.md).

The folder: one sub-folder per machine, named by its random sync id (16 hex digits, made once,
kept in the store's meta), holding numbered segments `00000001.calm`, `00000002.calm`, ... (0700,
0600). A machine writes only in its own sub-folder, so no two machines ever write the same file
and an engine's conflict copies (any other name) are never read.

A segment: a 40-byte header (magic, key id, host id, segment number, revision), then chunks, each
sealed on its own with XChaCha20-Poly1305 (libsodium through PyNaCl) under the user's key, with
the header, the chunk's index and the previous chunk's tag as associated data: a chunk cannot be
altered, moved to another segment or host, reordered or dropped from the middle without failing
to open. A chunk holds msgpack: the machine's name, when it was sealed, its records (each with
its number on that machine) and its forgets (the identities of records deleted there). Export
appends a chunk by rewriting the segment atomically (the old bytes, then the new chunk: an
engine that syncs by blocks sends the new ones); past SEGMENT_BYTES a new segment starts.

Import reads every other machine's segments that changed since it last read them (size, mtime),
opens every chunk before it stores anything (a file that fails is refused whole: one log line,
counted, kept in `sync_refused` with why, read again only when it changes), then stores the new
chunks' records in batches: INSERT OR IGNORE on (origin, origin_id), so the same record twice is
one record, in any order, from any engine's copy; never one that was forgotten. Per segment the
store keeps the revision and the chunks read: an older revision or fewer chunks than were read is
a replayed or truncated file, refused. Time is never used to decide anything (clocks disagree).

Forgetting: `HistoryStore` notes the identity of every shared row it deletes (`sync_forgotten`);
export sends them in the next chunk, and import deletes the rows they name on every machine. A
machine whose own records were forgotten rewrites its segments from its store (a new revision), so
that the forgotten text leaves the folder too. A new key (rotation) rewrites them the same way.

Only what the store kept is shared (it passed the credential detector when it was recorded), and
what arrives passes this machine's detector again before it is stored.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import stat
import struct
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_decrypt,
    crypto_aead_xchacha20poly1305_ietf_encrypt,
)
from nacl.exceptions import CryptoError

from calmd import paths
from calmd.atomic import atomic_write, read_regular_file, remove_stale_temp_files
from calmd.errors import CalmError
from calmd.history.query import this_hostname
from calmd.history.recorded import clean_env
from calmd.history.secrets import DETECTOR_VERSION
from calmd.history.store import HistoryStore, _comp_text, clean_text

log = logging.getLogger("calmd.history.sync")

MAGIC = b"CALMSYN1"
HEADER = struct.Struct(">8s8s8sQII")  # magic, key id, host id, segment number, revision, reserved
CHUNK_HEAD = struct.Struct(">I24s")  # sealed length (the tag included), nonce
TAG_BYTES = 16
KEY_BYTES = 32
CHUNK_RECORDS = 2000  # records per chunk, at most
CHUNK_PLAIN_BYTES = 1 << 20  # ... and plain bytes, about (a record is at most ~260 KiB)
SEGMENT_BYTES = 4 << 20  # a segment past this is closed: the next export starts a new one
MAX_SEGMENT_BYTES = 64 << 20  # a file larger than this is refused unread
MAX_CHUNK_BYTES = 8 << 20  # a chunk that says it is larger is refused
MAX_NAME_CHARS = 64  # a host's name
IMPORT_BATCH = 2000  # records per transaction: the store's lock is free between two
FUTURE_SLACK_S = 86400.0  # a record stamped later than now + this is stored at now + this
GIT_TIMEOUT_S = 120.0
MODES = ("both", "send", "receive")
HOST_ID = re.compile(r"[0-9a-f]{16}\Z")
SEGMENT_NAME = re.compile(r"(\d{8})\.calm\Z")
KEY_PREFIX = "calm-"
SYNC_SOURCE = "sync"


class SyncError(CalmError):
    """Sync is not set up, or set up wrong (one line naming the file or the flag)."""


class Refused(Exception):
    """A file in the sync folder that is not imported, and why (one line, never its content)."""


# --------------------------------------------------------------------------- the key


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def _check(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=3, person=b"calm-sync-check").digest()


def key_id(key: bytes) -> bytes:
    """8 bytes that name the key (in each segment's header): a file sealed with another key is
    told apart from a damaged one. They say nothing of the key."""
    return hashlib.blake2b(key, digest_size=8, person=b"calm-sync-keyid").digest()


def key_phrase(key: bytes) -> str:
    """The key as text to carry to another machine: `calm-` and 56 base32 letters in groups of
    four (the key's 32 bytes and a 3-byte check, so that a typo is caught, not taken for a key)."""
    text = base64.b32encode(key + _check(key)).decode("ascii").lower()
    return KEY_PREFIX + "-".join(text[i : i + 4] for i in range(0, len(text), 4))


def parse_key_phrase(text: str, source: str = "the key") -> bytes:
    """The key a phrase (`key_phrase`) stands for; SyncError naming `source` when it is not one.
    Spaces, dashes, newlines and case do not matter."""
    letters = "".join(text.split()).lower().replace("-", "")
    if len(letters) == 60 and letters.startswith("calm"):
        letters = letters[4:]
    if len(letters) != 56:
        raise SyncError(
            f"{source}: not a calm sync key (56 letters after `calm-`, as `calm sync key --show` prints)"
        )
    try:
        raw = base64.b32decode(letters.upper())
    except (binascii.Error, ValueError):
        raise SyncError(f"{source}: not a calm sync key (letters outside a-z and 2-7)") from None
    key, check = raw[:KEY_BYTES], raw[KEY_BYTES:]
    if _check(key) != check:
        raise SyncError(f"{source}: the key's check does not match: a letter was mistyped")
    return key


def read_key(path: Path) -> bytes:
    """The key kept at `path`; SyncError when there is none or it is not one."""
    try:
        text = bytes(read_regular_file(path, limit=4096)).decode("utf-8")
    except FileNotFoundError:
        raise SyncError(
            f"{path}: no sync key on this machine: make one (`calm sync key --new`) on the first machine, "
            "or bring it from another (`calm sync key --import`)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SyncError(f"{path}: cannot read the sync key: {exc}") from None
    return parse_key_phrase(text, str(path))


def write_key(path: Path, key: bytes) -> None:
    with atomic_write(path) as f:
        f.write((key_phrase(key) + "\n").encode("ascii"))


# --------------------------------------------------------------------------- the config


@dataclass(frozen=True)
class SyncConfig:
    """`sync.json`: where the folder is and how this machine takes part."""

    folder: str
    mode: str = "both"  # both, send (share only), receive (receive only)
    git: str = ""  # a git remote the folder is committed to and pulled from ('' : none)
    interval_s: float = 30.0  # the daemon's export and import, every so often

    @property
    def sends(self) -> bool:
        return self.mode in ("both", "send")

    @property
    def receives(self) -> bool:
        return self.mode in ("both", "receive")


def read_config(path: Path) -> SyncConfig | None:
    """The sync config, or None when sync is not set up; SyncError naming the file and field."""
    try:
        data = json.loads(bytes(read_regular_file(path, limit=65536)).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SyncError(f"{path}: cannot read the sync config: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != "calm-sync-config":
        raise SyncError(f"{path}: not a calm sync config (run `calm sync --folder DIR` again)")
    folder, mode, git, interval = data.get("folder"), data.get("mode", "both"), data.get("git", ""), \
        data.get("interval_s", 30.0)  # fmt: skip
    if not isinstance(folder, str) or not folder.startswith("/"):
        raise SyncError(f"{path}: field 'folder' must be an absolute path")
    if mode not in MODES:
        raise SyncError(f"{path}: field 'mode' must be one of {', '.join(MODES)}")
    if not isinstance(git, str):
        raise SyncError(f"{path}: field 'git' must be a text (a git remote) or empty")
    if not isinstance(interval, int | float) or not math.isfinite(interval) or interval <= 0:
        raise SyncError(f"{path}: field 'interval_s' must be a positive number of seconds")
    return SyncConfig(folder, mode, git, float(interval))


def write_config(path: Path, config: SyncConfig) -> None:
    data = {"format": "calm-sync-config", "version": 1, **dataclasses.asdict(config)}
    with atomic_write(path) as f:
        f.write((json.dumps(data, indent=2) + "\n").encode("utf-8"))


# --------------------------------------------------------------------------- segments


@dataclass(frozen=True)
class Header:
    key_id: bytes
    host: bytes  # the 8 bytes of the host id
    seq: int
    revision: int

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.key_id, self.host, self.seq, self.revision, 0)


def _aad(header: bytes, index: int, prev_tag: bytes) -> bytes:
    return header + struct.pack(">I", index) + prev_tag


def seal_chunk(key: bytes, header: bytes, index: int, prev_tag: bytes, payload: dict[str, Any]) -> bytes:
    """One chunk: its length, its nonce (random: 24 bytes never repeat), the sealed payload."""
    plain = msgpack.packb(payload, use_bin_type=True)
    nonce = secrets.token_bytes(24)
    sealed = crypto_aead_xchacha20poly1305_ietf_encrypt(plain, _aad(header, index, prev_tag), nonce, key)
    return CHUNK_HEAD.pack(len(sealed), nonce) + sealed


@dataclass
class Opened:
    """A segment whose every chunk authenticated."""

    header: Header
    payloads: list[dict[str, Any]]
    last_tag: bytes  # for the next chunk's associated data


def frame(data: bytes | bytearray) -> tuple[bytes, list[tuple[int, bytes, bytes]]]:
    """(header bytes, [(offset, nonce, sealed)]) of a segment's bytes, unopened; Refused when the
    framing is wrong (truncated, oversized)."""
    if len(data) < HEADER.size:
        raise Refused(f"truncated: {len(data)} bytes, shorter than a header (still being copied?)")
    header = bytes(data[: HEADER.size])
    if header[:8] != MAGIC:
        raise Refused("not a calm sync segment (no CALMSYN1 header)")
    chunks: list[tuple[int, bytes, bytes]] = []
    at = HEADER.size
    while at < len(data):
        if at + CHUNK_HEAD.size > len(data):
            raise Refused(f"truncated at byte {at:,}: a chunk cut short (still being copied?)")
        length, nonce = CHUNK_HEAD.unpack_from(data, at)
        if length < TAG_BYTES or length > MAX_CHUNK_BYTES:
            raise Refused(f"malformed: chunk {len(chunks)} says {length:,} bytes")
        end = at + CHUNK_HEAD.size + length
        if end > len(data):
            raise Refused(
                f"truncated at byte {len(data):,}: chunk {len(chunks)} cut short (still being copied?)"
            )
        chunks.append((at, nonce, bytes(data[at + CHUNK_HEAD.size : end])))
        at = end
    return header, chunks


def open_segment(data: bytes | bytearray, key: bytes, host_id: str, seq: int) -> Opened:
    """Every chunk of a segment, opened; Refused (why, in one line) unless all of them open under
    `key` and the header names this host and this segment number."""
    header_bytes, chunks = frame(data)
    _, kid, host, number, revision, _ = HEADER.unpack(header_bytes)
    if kid != key_id(key):
        raise Refused(f"sealed with another key (key id {kid.hex()}, this machine's is {key_id(key).hex()})")
    if host.hex() != host_id or number != seq:
        raise Refused(f"misplaced: its header says host {host.hex()} segment {number}, not where it lies")
    payloads = []
    prev = bytes(TAG_BYTES)
    for index, (at, nonce, sealed) in enumerate(chunks):
        try:
            plain = crypto_aead_xchacha20poly1305_ietf_decrypt(
                sealed, _aad(header_bytes, index, prev), nonce, key
            )
        except CryptoError:
            raise Refused(f"tampered: chunk {index} (at byte {at:,}) does not authenticate") from None
        try:
            payload = msgpack.unpackb(plain, raw=False, strict_map_key=True)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise Refused(f"malformed: chunk {index} is not msgpack ({exc})") from None
        if not isinstance(payload, dict):
            raise Refused(f"malformed: chunk {index} is not a map")
        payloads.append(payload)
        prev = sealed[-TAG_BYTES:]
    return Opened(Header(kid, host, number, revision), payloads, prev)


# --------------------------------------------------------------------------- records on the wire

# A record: [origin_id, ts, session, cwd, git, cmd, exit, duration, comp, env, source]
RECORD_FIELDS = 11


@dataclass(frozen=True)
class Incoming:
    """A record from another machine, checked and cleaned as the store would store it."""

    origin_id: int
    ts: float
    session: str
    cwd: str
    git: str
    cmd: str
    exit: int | None
    duration: float | None
    comp: str
    env: str
    source: str


def _text(value: Any, what: str, limit: int = 1 << 18) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise Refused(f"malformed: a record's {what} is not a text")
    return clean_text(value)[0]


def parse_record(item: Any, now: float) -> Incoming:
    """A record as the chunk carries it -> Incoming; Refused when a field is of the wrong kind."""
    if not isinstance(item, list) or len(item) != RECORD_FIELDS:
        raise Refused(f"malformed: a record is not a list of {RECORD_FIELDS} fields")
    oid, ts, session, cwd, git, cmd, code, duration, comp, env, source = item
    if not isinstance(oid, int) or isinstance(oid, bool) or not 0 < oid < 1 << 62:
        raise Refused("malformed: a record's number is not a positive integer")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
        raise Refused("malformed: a record's time is not a finite number")
    if code is not None and (
        not isinstance(code, int) or isinstance(code, bool) or not -(1 << 31) <= code < 1 << 31
    ):
        raise Refused("malformed: a record's exit status is not an integer")
    if duration is not None and (not isinstance(duration, int | float) or not math.isfinite(duration)):
        raise Refused("malformed: a record's duration is not a number")
    comp_text = _text(comp, "comp")
    return Incoming(
        oid, min(float(ts), now + FUTURE_SLACK_S), _text(session, "session"), _text(cwd, "cwd"),
        _text(git, "git"), _text(cmd, "command"), code, None if duration is None else float(duration),
        _comp_text(comp_text.split("\n") if comp_text else ()), clean_env(_text(env, "env")),
        _text(source, "source", 64),
    )  # fmt: skip


def parse_forget(item: Any) -> tuple[str, int]:
    if not isinstance(item, list) or len(item) != 2:
        raise Refused("malformed: a forget is not [host id, record number]")
    if not isinstance(item[0], str) or not HOST_ID.match(item[0]):
        raise Refused("malformed: a forget is not [host id, record number]")
    if not isinstance(item[1], int) or isinstance(item[1], bool):
        raise Refused("malformed: a forget is not [host id, record number]")
    return item[0], item[1]


# --------------------------------------------------------------------------- status


@dataclass
class SyncReport:
    """What one run did."""

    exported: int = 0
    forgets_sent: int = 0
    imported: int = 0
    forgotten: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why), new refusals only
    rebuilt: bool = False
    git: str = ""  # what git said, when it failed


# --------------------------------------------------------------------------- the machine's part


class Sync:
    """Export and import for one history store. Thread-compatible: `run` takes the CALM_HOME's sync
    lock (a file lock), so the daemon and `calm sync now` never export at once."""

    def __init__(self, store: HistoryStore, data_dir: Path) -> None:
        self.store = store
        self.data_dir = data_dir
        self.last_run: float | None = None
        self.last_error: str | None = None

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
        name = " ".join(name.split())
        if not name or len(name) > MAX_NAME_CHARS:
            raise SyncError(f"--name: give 1 to {MAX_NAME_CHARS} characters")
        with self.store.writing() as db:
            self._set_meta(db, "sync_host_name", name)

    def config(self) -> SyncConfig | None:
        return read_config(paths.sync_config_path(self.data_dir))

    def key(self) -> bytes:
        return read_key(paths.sync_key_path(self.data_dir))

    # -- a run -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        path = paths.sync_lock_path(self.data_dir)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def run(self, *, wait: bool = False) -> SyncReport | None:
        """Export this machine's new records and forgets, import the others'; with a git remote,
        commit and pull the folder between the two. None when sync is not set up, or another
        process holds the lock (and `wait` is False)."""
        config = self.config()
        if config is None:
            return None
        key = self.key()
        folder = Path(config.folder)
        if not folder.is_dir():
            raise SyncError(f"{folder}: the sync folder does not exist (or is not a folder): create it, "
                            "or point `calm sync --folder` at another")  # fmt: skip
        deadline = time.monotonic() + (30.0 if wait else 0.0)
        while True:
            with self._locked() as held:
                if held:
                    report = SyncReport()
                    if config.sends:
                        self.export(folder, key, report)
                    if config.git:
                        report.git = git_sync(folder, config.git, self.host_name())
                    if config.receives:
                        self.import_all(folder, key, report)
                    if report.forgotten and config.sends and self._rebuild_due():
                        # what the others forgot of this machine's records leaves its segments now
                        self.export(folder, key, report)
                        if config.git:
                            report.git = git_sync(folder, config.git, self.host_name())
                    self.last_run = time.time()
                    return report
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    # -- export ------------------------------------------------------------------------------------

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

    def _own_segments(self, folder: Path, host_id: str) -> list[int]:
        own = paths.sync_host_dir(folder, host_id)
        try:
            names = os.listdir(own)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(SEGMENT_NAME.match, names) if m)

    def export(self, folder: Path, key: bytes, report: SyncReport) -> None:
        host_id = self.host_id()
        own = paths.private_dir(paths.sync_host_dir(folder, host_id))
        remove_stale_temp_files(own)
        self._number_new_rows()
        kid = key_id(key).hex()
        with self.store.reading() as db:
            rebuild = self._meta(db, "sync_rebuild") == "1" or self._meta(db, "sync_key_id") not in (
                None,
                kid,
            )
            written = int(self._meta(db, "sync_written_id") or 0)
            revision = int(self._meta(db, "sync_revision") or 0)
        segments = self._own_segments(folder, host_id)
        if written and not segments:
            rebuild = True  # the folder was emptied or replaced: everything again
        current: Opened | None = None
        data = b""
        if segments and not rebuild:
            path = paths.sync_segment(folder, host_id, segments[-1])
            try:
                data = bytes(read_regular_file(path, limit=MAX_SEGMENT_BYTES))
                current = open_segment(data, key, host_id, segments[-1])
            except (OSError, Refused) as exc:
                log.warning("this machine's segment %s does not open (%s): rewriting its segments", path, exc)
                rebuild = True
        if rebuild:
            self._rebuild(folder, key, host_id, revision + 1, segments, report)
            return
        records = list(self._records_after(written))
        forgets = self._unsent_forgets()
        if not records and not forgets and segments:
            with self.store.writing() as db:
                self._set_meta(db, "sync_key_id", kid)
            return
        if current is None:
            writer = _Writer(folder, key, host_id, revision, segments[-1] if segments else 0)
        else:
            writer = _Writer(folder, key, host_id, current.header.revision, current.header.seq, data,
                             len(current.payloads), current.last_tag)  # fmt: skip
        for payload in _payloads(self.host_name(), records, forgets):
            writer.add(payload)
        writer.close()
        with self.store.writing() as db:
            if records:
                self._set_meta(db, "sync_written_id", str(records[-1][0]))
            db.executemany("UPDATE sync_forgotten SET sent = 1 WHERE origin = ? AND origin_id = ?", forgets)
            self._set_meta(db, "sync_key_id", kid)
            self._add(db, "sync_records_out", len(records))
        report.exported += len(records)
        report.forgets_sent += len(forgets)

    def _rebuild(self, folder: Path, key: bytes, host_id: str, revision: int, old: list[int],
                 report: SyncReport) -> None:  # fmt: skip
        """Write this machine's segments anew from the store, at a new revision: after its own
        records were forgotten (their text leaves the folder), after a new key, or into a folder
        that lost them. Then the old segments past the new ones are removed."""
        with self.store.reading() as db:
            forgets = [(o, i) for o, i in db.execute("SELECT origin, origin_id FROM sync_forgotten")]
        writer = _Writer(folder, key, host_id, revision, 0)
        written = last_id = 0
        for payload in _payloads(self.host_name(), self._records_after(0), forgets):
            writer.add(payload)
            if payload["records"]:
                last_id = payload["records"][-1][0]
                written += len(payload["records"])
        seq = writer.close()
        for stale in old:
            if stale > seq:
                paths.sync_segment(folder, host_id, stale).unlink(missing_ok=True)
        with self.store.writing() as db:
            self._set_meta(
                db, "sync_written_id", str(max(last_id, int(self._meta(db, "sync_written_id") or 0)))
            )
            self._set_meta(db, "sync_revision", str(revision))
            self._set_meta(db, "sync_rebuild", "0")
            self._set_meta(db, "sync_key_id", key_id(key).hex())
            db.execute("UPDATE sync_forgotten SET sent = 1")
        log.info("rewrote this machine's %d sync segments (revision %d, %d records)", seq, revision, written)
        report.rebuilt = True
        report.forgets_sent += len(forgets)

    def _records_after(self, after: int) -> Iterator[list[Any]]:
        """This machine's shared records numbered above `after`, in number order, read in batches."""
        while True:
            with self.store.reading() as db:
                rows = db.execute(
                    "SELECT origin_id, ts, session, cwd, git, cmd, exit, duration, comp, env, source "
                    "FROM commands WHERE origin = '' AND origin_id > ? ORDER BY origin_id LIMIT ?",
                    (after, IMPORT_BATCH),
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

    # -- import ------------------------------------------------------------------------------------

    def _refuse(self, path: Path, st: os.stat_result, why: str, report: SyncReport) -> None:
        """Refuse a file: one log line, counted, kept (with why) until it changes or goes."""
        with self.store.writing() as db:
            db.execute(
                "INSERT OR REPLACE INTO sync_refused (path, reason, size, mtime_ns, at) "
                "VALUES (?, ?, ?, ?, ?)",
                (str(path), why, st.st_size, st.st_mtime_ns, time.time()),
            )
            self._add(db, "sync_refused", 1)
        log.warning("sync: refused %s: %s; nothing of it was imported", path, why)
        report.refused.append((str(path), why))

    def import_all(self, folder: Path, key: bytes, report: SyncReport) -> None:
        """Every other machine's segments that changed since they were read."""
        own = self.host_id()
        kid = key_id(key).hex()
        with self.store.writing() as db:
            if self._meta(db, "sync_import_key_id") != kid:  # a new key: what it refused is read again
                db.execute("DELETE FROM sync_refused")
                self._set_meta(db, "sync_import_key_id", kid)
        with self.store.reading() as db:
            files = db.execute("SELECT host, seq, revision, chunks, size, mtime_ns FROM sync_files")
            seen = {(h, s): (r, c, size, m) for h, s, r, c, size, m in files}
            refused = {
                p: (size, m) for p, size, m in db.execute("SELECT path, size, mtime_ns FROM sync_refused")
            }
        present: set[str] = set()
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
            for seq, name in sorted(
                (int(m.group(1)), m.group(0)) for m in map(SEGMENT_NAME.match, names) if m
            ):
                path = host_dir / name
                present.add(str(path))
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    continue
                state = seen.get((host, seq))
                if state is not None and state[2:] == (st.st_size, st.st_mtime_ns):
                    continue  # read as it is
                if refused.get(str(path)) == (st.st_size, st.st_mtime_ns):
                    continue  # refused as it is: said once
                self._import_segment(path, st, key, host, seq, state, report)
        gone = [p for p in refused if p not in present]
        if gone:
            with self.store.writing() as db:
                db.executemany("DELETE FROM sync_refused WHERE path = ?", [(p,) for p in gone])

    def _import_segment(self, path: Path, st: os.stat_result, key: bytes, host: str, seq: int,
                        state: tuple[int, int, int, int] | None, report: SyncReport) -> None:  # fmt: skip
        if not stat.S_ISREG(st.st_mode):
            self._refuse(path, st, "not a regular file", report)
            return
        try:
            data = read_regular_file(path, limit=MAX_SEGMENT_BYTES)
        except FileNotFoundError:
            return
        except OSError as exc:
            self._refuse(path, st, f"cannot be read ({exc.strerror or exc})", report)
            return
        now = time.time()
        try:
            opened = open_segment(data, key, host, seq)
            revision = opened.header.revision
            with self.store.reading() as db:
                row = db.execute("SELECT revision FROM sync_hosts WHERE id = ?", (host,)).fetchone()
            if row is not None and revision < row[0]:
                raise Refused(
                    f"replayed or stale: revision {revision}, older than this host's revision {row[0]}"
                )
            start = 0
            if state is not None:
                if revision < state[0]:
                    raise Refused(
                        f"replayed: revision {revision}, older than the revision {state[0]} already read"
                    )
                if revision == state[0]:
                    if len(opened.payloads) < state[1]:
                        raise Refused(f"truncated or replayed: {len(opened.payloads)} chunks, "
                                      f"{state[1]} were already read")  # fmt: skip
                    start = state[1]
            batches = [_parse_payload(p, now) for p in opened.payloads[start:]]
        except Refused as exc:
            self._refuse(path, st, str(exc), report)
            return
        name = next((b[0] for b in reversed(batches) if b[0]), None)
        sealed = max((b[1] for b in batches if b[1] is not None), default=None)
        imported = 0
        for _, _, records, forgets in batches:
            imported += self._store_records(host, name or host, records)
            report.forgotten += self._apply_forgets(forgets)
        with self.store.writing() as db:
            db.execute("INSERT OR REPLACE INTO sync_files (host, seq, revision, chunks, size, mtime_ns) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (host, seq, revision, len(opened.payloads), st.st_size,
                                                     st.st_mtime_ns))  # fmt: skip
            db.execute("INSERT OR IGNORE INTO sync_hosts (id, name) VALUES (?, ?)", (host, name or host))
            db.execute(
                "UPDATE sync_hosts SET name = coalesce(?, name), revision = max(revision, ?), "
                "records = records + ?, last_seq = max(last_seq, ?), "
                "last_sealed = CASE WHEN ? IS NULL THEN last_sealed WHEN last_seq > ? THEN last_sealed "
                "ELSE ? END WHERE id = ?",
                (name, revision, imported, seq, sealed, seq, sealed, host),
            )
            db.execute("DELETE FROM sync_refused WHERE path = ?", (str(path),))
            if name:  # a host that changed its name: all of its records show the new one
                db.execute("UPDATE commands SET host = ? WHERE origin = ? AND host != ?", (name, host, name))
        report.imported += imported

    def _store_records(self, host: str, name: str, records: list[Incoming]) -> int:
        """Store records of `host` that are new, not forgotten, and pass this machine's checks."""
        rows = []
        dropped = 0
        if not records:
            return 0
        for r in records:
            verdict = HistoryStore.check(r.cmd)
            if not verdict.stored:
                dropped += verdict.reason.startswith("secret:")
                continue
            rows.append((r.ts, f"{host}:{r.session}", r.cwd, r.git, r.cmd, r.exit, r.source, r.comp, r.env,
                         r.duration, name, host, r.origin_id, host, r.origin_id))  # fmt: skip
        stored = 0
        for first in range(0, len(rows), IMPORT_BATCH):
            with self.store.writing() as db:
                before = db.total_changes
                db.executemany(
                    "INSERT OR IGNORE INTO commands (ts, session, cwd, git, cmd, exit, source, comp, env, "
                    "duration, host, origin, origin_id) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? "
                    "WHERE NOT EXISTS (SELECT 1 FROM sync_forgotten WHERE origin = ? AND origin_id = ?)",
                    rows[first : first + IMPORT_BATCH],
                )
                added = db.total_changes - before
                stored += added
                self._add(db, "recorded_since_train", added)
                self._add(db, "sync_records_in", added)
        if dropped:  # stored on the other machine by an older detector: this one's refuses them
            with self.store.writing() as db:
                self._add(db, "dropped_secrets", dropped)
        return stored

    def _apply_forgets(self, forgets: list[tuple[str, int]]) -> int:
        """Delete what another machine forgot (remembered: it never comes back), for good."""
        if not forgets:
            return 0
        own = self.host_id()
        with self.store.writing() as db:
            db.executemany(
                "INSERT OR IGNORE INTO sync_forgotten (origin, origin_id, sent) VALUES (?, ?, 1)", forgets
            )
            doomed = []
            for origin, oid in forgets:
                row = db.execute("SELECT id FROM commands WHERE origin = ? AND origin_id = ?",
                                 ("" if origin == own else origin, oid)).fetchone()  # fmt: skip
                if row is not None:
                    doomed.append(row[0])
        return self.store.delete_rows(doomed)

    # -- status ------------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The folder, this machine, the hosts seen (their last segment and when it was sealed),
        records in and out, the refused files and why; what `calm sync` and `calmd status` show."""
        try:
            config = self.config()
        except SyncError as exc:
            return {"enabled": False, "error": str(exc)}
        if config is None:
            return {"enabled": False}
        key_path = paths.sync_key_path(self.data_dir)
        try:
            kid: str | None = key_id(read_key(key_path)).hex()
        except SyncError:
            kid = None
        with self.store.reading() as db:
            meta = dict(db.execute("SELECT key, value FROM meta WHERE key LIKE 'sync_%'").fetchall())
            hosts = db.execute("SELECT id, name, last_seq, last_sealed, records, revision FROM sync_hosts "
                               "ORDER BY name, id").fetchall()  # fmt: skip
            refused = db.execute("SELECT path, reason, at FROM sync_refused ORDER BY at").fetchall()
            written = int(meta.get("sync_written_id") or 0)
            pending = db.execute(
                "SELECT COUNT(*) FROM commands WHERE origin = '' AND (origin_id IS NULL OR origin_id > ?)",
                (written,),
            ).fetchone()[0]
        return {
            "enabled": True, "folder": config.folder, "mode": config.mode, "git": config.git or None,
            "interval_s": config.interval_s,
            "host": {"id": meta.get("sync_host_id"), "name": meta.get("sync_host_name") or this_hostname()},
            "key": {"id": kid, "path": str(key_path)},
            "hosts": [{"id": h, "name": n, "last_segment": s, "last_sealed": t, "records_in": r,
                       "revision": v} for h, n, s, t, r, v in hosts],
            "records_out": int(meta.get("sync_records_out") or 0),
            "records_in": int(meta.get("sync_records_in") or 0),
            "pending_out": pending if config.sends else 0,
            "refused": {"count": int(meta.get("sync_refused") or 0),
                        "files": [{"path": p, "reason": why, "at": at} for p, why, at in refused]},
            "last_run": self.last_run, "last_error": self.last_error,
        }  # fmt: skip


class _Writer:
    """Seals payloads into this machine's segments: appended to the last one (its bytes as they
    are, then the new chunks), a new one started past SEGMENT_BYTES; each written atomically."""

    def __init__(self, folder: Path, key: bytes, host_id: str, revision: int, seq: int, data: bytes = b"",
                 index: int = 0, prev: bytes = bytes(TAG_BYTES)) -> None:  # fmt: skip
        self.folder, self.key, self.host_id, self.revision = folder, key, host_id, revision
        self.seq, self.out, self.index, self.prev = seq, bytearray(data), index, prev
        self.dirty = False

    def add(self, payload: dict[str, Any]) -> None:
        if not self.out or (self.index and len(self.out) >= SEGMENT_BYTES):
            self._flush()
            self.seq += 1
            self.out = bytearray(Header(key_id(self.key), bytes.fromhex(self.host_id), self.seq,
                                        self.revision).pack())  # fmt: skip
            self.index, self.prev = 0, bytes(TAG_BYTES)
        sealed = seal_chunk(self.key, bytes(self.out[: HEADER.size]), self.index, self.prev, payload)
        self.out += sealed
        self.prev, self.index, self.dirty = sealed[-TAG_BYTES:], self.index + 1, True

    def _flush(self) -> None:
        if self.dirty:
            with atomic_write(paths.sync_segment(self.folder, self.host_id, self.seq)) as f:
                f.write(self.out)
            self.dirty = False

    def close(self) -> int:
        """Write what is left; returns the last segment's number."""
        self._flush()
        return self.seq


def _payloads(name: str, records: Iterator[list[Any]] | Sequence[list[Any]],
              forgets: Sequence[tuple[str, int]]) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The chunks' payloads for these records and forgets: at most CHUNK_RECORDS records and about
    CHUNK_PLAIN_BYTES each; the forgets ride in the first."""
    batch: list[list[Any]] = []
    size = 0
    pending = [list(f) for f in forgets]
    first = True
    for record in records:
        first = False
        batch.append(record)
        size += 64 + sum(len(v) for v in record if isinstance(v, str))
        if len(batch) >= CHUNK_RECORDS or size >= CHUNK_PLAIN_BYTES:
            yield _payload(name, batch, pending[: CHUNK_RECORDS * 4])
            pending = pending[CHUNK_RECORDS * 4 :]
            batch, size = [], 0
    if not batch and not pending and first:  # nothing to send: a chunk that says the machine is there
        yield _payload(name, [], [])
    while batch or pending:
        yield _payload(name, batch, pending[: CHUNK_RECORDS * 4])
        pending = pending[CHUNK_RECORDS * 4 :]
        batch = []


def _payload(name: str, records: list[list[Any]], forgets: list[list[Any]]) -> dict[str, Any]:
    return {"v": 1, "name": name, "sealed": time.time(), "detector": DETECTOR_VERSION, "records": records,
            "forgets": forgets}  # fmt: skip


def _parse_payload(payload: dict[str, Any], now: float) -> tuple[str | None, float | None, list[Incoming],
                                                                   list[tuple[str, int]]]:  # fmt: skip
    """(host name, when sealed, records, forgets) of a chunk; Refused when a field is wrong."""
    if payload.get("v") != 1:
        raise Refused(f"a chunk of version {payload.get('v')!r}: this calmd reads 1 (upgrade calm)")
    name, sealed, records, forgets = (payload.get(k) for k in ("name", "sealed", "records", "forgets"))
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_CHARS):
        raise Refused("malformed: the host's name is not a short text")
    if sealed is not None and (not isinstance(sealed, int | float) or not math.isfinite(sealed)):
        raise Refused("malformed: the chunk's time is not a number")
    if not isinstance(records, list) or not isinstance(forgets, list):
        raise Refused("malformed: a chunk without its records and forgets lists")
    clean_name = clean_text(name)[0] if name else None
    return clean_name, sealed, [parse_record(r, now) for r in records], [parse_forget(f) for f in forgets]


# --------------------------------------------------------------------------- git as the engine


def git_sync(folder: Path, remote: str, name: str) -> str:
    """Commit the folder and pull and push it (`calm sync --git REMOTE`): '' when it went well,
    else what git said (one line). Each machine changes only its own files, so merges never
    conflict. git talks to the remote (over SSH, as the user set it up); calmd does not."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    base = ["git", "-C", str(folder), "-c", "user.name=calm sync", "-c", f"user.email={name}@calm-sync",
            "-c", "commit.gpgsign=false"]  # fmt: skip

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, env=env, timeout=GIT_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)  # fmt: skip

    try:
        if not (folder / ".git").exists():
            git("init", "-q", "-b", "calm-sync")
        remotes = git("remote").stdout.split()
        if "calm" not in remotes:
            git("remote", "add", "calm", remote)
        elif git("remote", "get-url", "calm").stdout.strip() != remote:
            git("remote", "set-url", "calm", remote)
        git("add", "-A", "--", ".")
        if git("diff", "--cached", "--quiet").returncode:
            git("commit", "-q", "-m", f"calm sync: {name}")
        for _ in range(3):
            fetched = git("fetch", "-q", "calm")
            if fetched.returncode:
                return _git_error("fetch", fetched)
            if git("rev-parse", "-q", "--verify", "calm/calm-sync").returncode == 0:
                merged = git("merge", "-q", "--no-edit", "--allow-unrelated-histories", "-m",
                             f"calm sync: {name}", "calm/calm-sync")  # fmt: skip
                if merged.returncode:
                    git("merge", "--abort")
                    return _git_error("merge", merged)
            pushed = git("push", "-q", "calm", "HEAD:calm-sync")
            if pushed.returncode == 0:
                return ""
        return _git_error("push", pushed)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"git: {exc}"


def _git_error(step: str, done: subprocess.CompletedProcess[str]) -> str:
    said = " ".join((done.stderr or done.stdout).split())[:300]
    return f"git {step} failed: {said or f'exit {done.returncode}'}"
