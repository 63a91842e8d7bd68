"""One history across machines: sealed segments in a folder that another program replicates.

calmd never talks to the network. Each machine writes its share of the history into a folder the
user names (`calm sync --folder DIR`) and reads the other machines' shares from it; whatever
replicates the folder (Syncthing, a cloud drive, NFS, rsync, git) is the engine (docs/sync.md).

The folder: one sub-folder per machine, named by its random sync id (16 hex digits, made once,
kept in the store's meta), holding numbered segments `00000001.calm`, `00000002.calm`, ... (0700,
0600). A machine writes only in its own sub-folder, so no two machines ever write the same file
and an engine's conflict copies (any other name) are never read.

Segments never change once written: each export seals a NEW segment (the next number, never used
before, never used again), and nothing is ever appended or rewritten in place. So no two versions
of one file name exist, and an engine that reverts, reorders or mixes up versions of a file (rsync
comparing times to the second, a cloud drive restoring an older copy) has nothing to get wrong.
What replaces segments (merging many small ones, re-sealing a lost one, rewriting after a forget
or a new key) writes new segments and deletes the old ones; each segment's first chunk carries the
list of the machine's live segments at the time it was written (its manifest), so a reader skips,
unread, a segment a newer manifest no longer lists (one the engine has not deleted yet, or put
back), and the same record read from an old segment and from the one that replaced it is stored
once.

A segment: a 40-byte header (magic, key id, host id, segment number, number of chunks), then its
chunks, each sealed on its own with XChaCha20-Poly1305 (libsodium through PyNaCl) under the user's
key, with the header, the chunk's index and the previous chunk's tag as associated data: a chunk
cannot be altered, moved to another segment or host, reordered or dropped (from the middle or the
end: the header says how many there are) without failing to open. A chunk holds msgpack: the
machine's name, when it was sealed, its records (each with its number on that machine) and its
forgets (the identities of records deleted there); the first chunk also the manifest.

Export (`Sync.export`) first checks this machine's own live segments against what it wrote (kept in
`sync_own`: size, content hash, the records and forgets each holds): one that the engine deleted,
cut short or changed is re-sealed into a new segment from the store (one log line, counted in
`sync_healed`). Then it seals the new records and forgets into a new segment; once COMPACT_SEGMENTS
small segments are live it merges them into new ones, so the number of files stays bounded.

Import reads every other machine's segments that it has not read as they are (size, mtime,
ctime, inode), the newest first, skipping those its newest manifest replaced; it opens every chunk
before it stores anything (a file that fails is refused whole: one log line, counted, kept in
`sync_refused` with why, read again only when it changes), then stores the records in batches:
INSERT OR IGNORE on (origin, origin_id), so the same record twice is one record, in any order,
from any engine's copy; never one that was forgotten. Time is never used to decide anything (clocks disagree).

Forgetting: `HistoryStore` notes the identity of every shared row it deletes (`sync_forgotten`);
export sends them in the next segment, and import deletes the rows they name on every machine. A
machine whose own records were forgotten rewrites its segments from its store (new segments, the
old ones deleted), so that the forgotten text leaves the folder too. A new key does the same.

Only what the store kept is shared (it passed the credential detector when it was recorded), and
what arrives passes this machine's detector again before it is stored.
"""

from __future__ import annotations

import base64
import binascii
import bisect
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
import shutil
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
from calmd.errors import CalmError, one_line
from calmd.history.query import this_hostname
from calmd.history.recorded import clean_env
from calmd.history.secrets import DETECTOR_VERSION
from calmd.history.store import VERDICT_CACHE, HistoryStore, RecordResult, _comp_text, clean_text, valid_time

log = logging.getLogger("calmd.history.sync")

MAGIC = b"CALMSYN2"  # 2: segments never change once written (1 grew them in place; never released)
HEADER = struct.Struct(">8s8s8sQII")  # magic, key id, host id, segment number, chunks, reserved (0)
CHUNK_HEAD = struct.Struct(">I24s")  # sealed length (the tag included), nonce
TAG_BYTES = 16
KEY_BYTES = 32
DIGEST_BYTES = 16  # blake2b of a segment as written: this machine's check of its own files
CHUNK_RECORDS = 2000  # records per chunk, at most
CHUNK_PLAIN_BYTES = 1 << 20  # ... and plain bytes, about (a record is at most ~260 KiB)
SEGMENT_BYTES = 4 << 20  # a segment is closed past this: the rest goes into the next one
CLOSED_BYTES = 1 << 20  # a segment this large is never merged again ...
COMPACT_SEGMENTS = 32  # ... smaller ones are merged into new ones once there are this many
MAX_SEGMENT_BYTES = 64 << 20  # a file larger than this is refused unread
MAX_CHUNK_BYTES = 8 << 20  # a chunk that says it is larger is refused
MAX_CHUNKS = 1 << 16  # a header that says more chunks is refused
MAX_LIVE_RANGES = 1 << 16  # a manifest longer than this is refused
MAX_NAME_CHARS = 64  # a host's name
IMPORT_BATCH = 2000  # records per transaction: the store's lock is free between two
FUTURE_SLACK_S = 86400.0  # a record stamped later than now + this is stored at now + this
GIT_TIMEOUT_S = 120.0
MODES = ("both", "send", "receive")
HOST_ID = re.compile(r"[0-9a-f]{16}\Z")
SEGMENT_NAME = re.compile(r"(\d{8})\.calm\Z")
# A test's hook (tests/test_sync_daemons.py kills the daemon in the middle of writing a segment):
# when set, each segment's write waits this many seconds once its temp file holds its bytes.
TEST_HOLD_ENV = "CALM_TEST_SYNC_HOLD_S"
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
        raise SyncError(f"{path}: cannot read the sync key: {one_line(exc, named=False)}") from None
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
        raise SyncError(f"{path}: cannot read the sync config: {one_line(exc, named=False)}") from None
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
    chunks: int

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.key_id, self.host, self.seq, self.chunks, 0)


def _aad(header: bytes, index: int, prev_tag: bytes) -> bytes:
    return header + struct.pack(">I", index) + prev_tag


def seal_chunk(key: bytes, header: bytes, index: int, prev_tag: bytes, plain: bytes) -> bytes:
    """One chunk: its length, its nonce (random: 24 bytes never repeat), the sealed payload."""
    nonce = secrets.token_bytes(24)
    sealed = crypto_aead_xchacha20poly1305_ietf_encrypt(plain, _aad(header, index, prev_tag), nonce, key)
    return CHUNK_HEAD.pack(len(sealed), nonce) + sealed


def seal_segment(key: bytes, host_id: str, seq: int, plains: Sequence[bytes]) -> bytes:
    """A whole segment: the header (which says how many chunks follow), then each chunk sealed
    with the header, its index and the previous chunk's tag as associated data."""
    header = Header(key_id(key), bytes.fromhex(host_id), seq, len(plains)).pack()
    out = bytearray(header)
    prev = bytes(TAG_BYTES)
    for index, plain in enumerate(plains):
        sealed = seal_chunk(key, header, index, prev, plain)
        out += sealed
        prev = sealed[-TAG_BYTES:]
    return bytes(out)


@dataclass
class Opened:
    """A segment whose every chunk authenticated."""

    header: Header
    payloads: list[dict[str, Any]]


def frame(data: bytes | bytearray) -> tuple[bytes, list[tuple[int, bytes, bytes]]]:
    """(header bytes, [(offset, nonce, sealed)]) of a segment's bytes, unopened; Refused when the
    framing is wrong (truncated: fewer chunks than the header says, oversized, trailing bytes)."""
    if len(data) < HEADER.size:
        raise Refused(f"truncated: {len(data)} bytes, shorter than a header (still being copied?)")
    header = bytes(data[: HEADER.size])
    if header[:8] != MAGIC:
        raise Refused(f"not a calm sync segment (no {MAGIC.decode()} header)")
    count = HEADER.unpack(header)[4]
    if not 0 < count <= MAX_CHUNKS:
        raise Refused(f"malformed: its header says {count:,} chunks")
    chunks: list[tuple[int, bytes, bytes]] = []
    at = HEADER.size
    while len(chunks) < count:
        if at + CHUNK_HEAD.size > len(data):
            raise Refused(f"truncated at byte {len(data):,}: {len(chunks)} of its {count} chunks "
                          "(still being copied?)")  # fmt: skip
        length, nonce = CHUNK_HEAD.unpack_from(data, at)
        if length < TAG_BYTES or length > MAX_CHUNK_BYTES:
            raise Refused(f"malformed: chunk {len(chunks)} says {length:,} bytes")
        end = at + CHUNK_HEAD.size + length
        if end > len(data):
            raise Refused(f"truncated at byte {len(data):,}: chunk {len(chunks)} of {count} cut short "
                          "(still being copied?)")  # fmt: skip
        chunks.append((at, nonce, bytes(data[at + CHUNK_HEAD.size : end])))
        at = end
    if at != len(data):
        raise Refused(f"malformed: {len(data) - at:,} bytes after its last chunk")
    return header, chunks


def open_segment(data: bytes | bytearray, key: bytes, host_id: str, seq: int) -> Opened:
    """Every chunk of a segment, opened; Refused (why, in one line) unless all of them open under
    `key` and the header names this host and this segment number."""
    header_bytes, chunks = frame(data)
    _, kid, host, number, count, _ = HEADER.unpack(header_bytes)
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
    return Opened(Header(kid, host, number, count), payloads)


# --------------------------------------------------------------------------- manifests

# A manifest: the numbers of a machine's live segments, as sorted, disjoint [first, last] ranges.
Ranges = list[tuple[int, int]]


def to_ranges(numbers: Iterator[int] | Sequence[int] | set[int]) -> Ranges:
    out: Ranges = []
    for n in sorted(set(numbers)):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def in_ranges(ranges: Ranges, n: int) -> bool:
    at = bisect.bisect_right(ranges, n, key=lambda r: r[0]) - 1
    return at >= 0 and ranges[at][0] <= n <= ranges[at][1]


def parse_live(value: Any, seq: int) -> Ranges:
    """The manifest of segment `seq` (its first chunk's `live`); Refused unless it is sorted,
    disjoint ranges of segment numbers up to `seq` that hold `seq`."""
    if not isinstance(value, list) or not value or len(value) > MAX_LIVE_RANGES:
        raise Refused("malformed: its first chunk has no list of live segments")
    ranges: Ranges = []
    for item in value:
        if (not isinstance(item, list) or len(item) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) for n in item)):  # fmt: skip
            raise Refused("malformed: a live segment range is not [first, last]")
        first, last = item
        if not 0 < first <= last <= seq or (ranges and first <= ranges[-1][1]):
            raise Refused("malformed: the live segment ranges are not sorted, disjoint, up to its own number")
        ranges.append((first, last))
    if not in_ranges(ranges, seq):
        raise Refused("malformed: its list of live segments leaves itself out")
    return ranges


# --------------------------------------------------------------------------- records on the wire

# A record: [origin_id, ts, session, cwd, git, cmd, exit, duration, comp, env, source]
RECORD_FIELDS = 11


@dataclass(frozen=True)
class Incoming:
    """A record from another machine, checked and cleaned as the store would store it."""

    origin_id: int
    ts: float | None  # None: the time it came with was impossible (`valid_time`), given at import
    session: str
    cwd: str
    git: str
    cmd: str
    exit: int | None
    duration: float | None
    comp: str
    env: str
    source: str
    bad_time: bool = False  # it came with an impossible time: kept without it, counted


def _text(value: Any, what: str, limit: int = 1 << 18) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise Refused(f"malformed: a record's {what} is not a text")
    return clean_text(value)[0]


def parse_record(item: Any, now: float) -> Incoming:
    """A record as the chunk carries it -> Incoming; Refused when a field is of the wrong kind. A
    time that is a number but not one a command can have run at (`valid_time`: before 1970, after
    2100, not finite: another machine's clock, or its older calmd's store) is not a reason to lose
    the record: it is kept without it (`ts` None, `bad_time`), as the imports of history files keep
    theirs; one later than now + FUTURE_SLACK_S is stored at that."""
    if not isinstance(item, list) or len(item) != RECORD_FIELDS:
        raise Refused(f"malformed: a record is not a list of {RECORD_FIELDS} fields")
    oid, ts, session, cwd, git, cmd, code, duration, comp, env, source = item
    if not isinstance(oid, int) or isinstance(oid, bool) or not 0 < oid < 1 << 62:
        raise Refused("malformed: a record's number is not a positive integer")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise Refused("malformed: a record's time is not a number")
    if code is not None and (
        not isinstance(code, int) or isinstance(code, bool) or not -(1 << 31) <= code < 1 << 31
    ):
        raise Refused("malformed: a record's exit status is not an integer")
    if duration is not None and (not isinstance(duration, int | float) or not math.isfinite(duration)):
        raise Refused("malformed: a record's duration is not a number")
    comp_text = _text(comp, "comp")
    possible = valid_time(float(ts))
    return Incoming(
        oid, min(float(ts), now + FUTURE_SLACK_S) if possible else None, _text(session, "session"),
        _text(cwd, "cwd"), _text(git, "git"), _text(cmd, "command"), code,
        None if duration is None else float(duration),
        _comp_text(comp_text.split("\n") if comp_text else ()), clean_env(_text(env, "env")),
        _text(source, "source", 64), bad_time=not possible,
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
    bad_times: int = 0  # records received with an impossible time (`valid_time`): kept without it
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why), new refusals only
    rebuilt: bool = False  # this machine's segments were all written anew (a forget, a new key)
    healed: int = 0  # this machine's segments found deleted, cut short or changed: re-sealed
    merged: int = 0  # small segments of this machine merged into new ones
    git: str = ""  # what git said, when it failed


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
class _Sealed:
    """A segment the writer has just written (a row of `sync_own` to be)."""

    seq: int
    size: int
    digest: bytes
    stamp: tuple[int, int, int]
    ranges: Ranges
    records: int
    forgets: list[tuple[str, int]]


# --------------------------------------------------------------------------- the machine's part


class Sync:
    """Export and import for one history store. Thread-compatible: `run` takes the CALM_HOME's sync
    lock (a file lock), so the daemon and `calm sync now` never export at once."""

    def __init__(self, store: HistoryStore, data_dir: Path) -> None:
        self.store = store
        self.data_dir = data_dir
        self.last_run: float | None = None
        self.last_error: str | None = None
        # the credential checks of an import's distinct commands (a history repeats itself): half
        # of an import's time went to checking each record again, time a keystroke waited for the
        # GIL meanwhile (bench/sync.py); bounded as the imports of history files bound theirs
        self._verdicts: dict[str, RecordResult] = {}

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

    def _locked(self) -> contextlib.AbstractContextManager[bool]:
        return _sync_lock(self.data_dir)

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

    @staticmethod
    def _files_in(own_dir: Path) -> set[int]:
        """The segment numbers in this machine's sub-folder (its live ones, and any the engine
        left or put back)."""
        try:
            names = os.listdir(own_dir)
        except FileNotFoundError:
            return set()
        return {int(m.group(1)) for m in map(SEGMENT_NAME.match, names) if m}

    def _past_a_restore(self, folder: Path, host_id: str, key: bytes, present: set[int], newest: int) -> None:
        """A store restored from a backup would give again the segment and record numbers it gave
        since: when this machine's sub-folder holds segments it sealed (they authenticate) past
        the next number the store knows, the store's counters go past theirs, so that no name
        and no record's identity is ever used twice. A file that does not open as this machine's
        (planted, damaged) moves nothing."""
        with self.store.reading() as db:
            floor = max(int(self._meta(db, "sync_next_seq") or 1), newest + 1)
        last_seq = last_id = 0
        for seq in sorted(n for n in present if n >= floor):
            try:
                data = read_regular_file(paths.sync_segment(folder, host_id, seq), limit=MAX_SEGMENT_BYTES)
                opened = open_segment(data, key, host_id, seq)
            except (OSError, Refused):
                continue
            last_seq = seq
            for payload in opened.payloads:
                for record in payload.get("records") or ():
                    if isinstance(record, list) and record and isinstance(record[0], int):
                        last_id = max(last_id, record[0])
        if not last_seq:
            return
        with self.store.writing() as db:
            self._set_meta(
                db, "sync_next_seq", str(max(int(self._meta(db, "sync_next_seq") or 1), last_seq + 1))
            )
            self._set_meta(
                db, "sync_next_id", str(max(int(self._meta(db, "sync_next_id") or 1), last_id + 1))
            )
        log.warning("sync: %s holds segments of this machine up to %s that its history does not know of "
                    "(restored from a backup?): new segments and records are numbered past them",
                    paths.sync_host_dir(folder, host_id), f"{last_seq:08d}.calm")  # fmt: skip

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
            if stat.S_ISREG(st.st_mode) and _stamp(st) == (seg.size, *seg.stamp):
                continue
            try:
                data = read_regular_file(path, limit=MAX_SEGMENT_BYTES)
            except FileNotFoundError:
                broken[seq] = "deleted"
                continue
            except OSError as exc:
                broken[seq] = f"unreadable ({exc.strerror or exc})"
                continue
            if len(data) == seg.size and _digest(data) == seg.digest:
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
        remove_stale_temp_files(own_dir)
        own = self._own_segments()
        present = self._files_in(own_dir)
        self._past_a_restore(folder, host_id, key, present, max(own, default=0))
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
        if not replaced and not fresh and own and not self._has_records_after(written):
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
                     forgets: list[tuple[str, int]], counted: dict[int, int]) -> list[_Sealed]:  # fmt: skip
        """Seal the records numbered in `sources` (and `forgets`) into new segments; `counted`
        gets how many records came from each source."""
        writer = _Writer(self, folder, key, host_id, next_seq, kept, replaced)
        for payload, pieces, sent in _payloads(self.host_name(), self._records_in(sources, counted), forgets):
            writer.add(payload, pieces, sent)
        return writer.close()

    def _commit_batch(self, sealed: list[_Sealed], replaced: list[int], written: int, exported: int, *,
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
                         present: set[int], sealed: list[_Sealed]) -> None:  # fmt: skip
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

    # -- import ------------------------------------------------------------------------------------

    def _refuse(self, path: Path, st: os.stat_result, why: str, report: SyncReport) -> None:
        """Refuse a file: one log line, counted, kept (with why) until it changes or goes."""
        with self.store.writing() as db:
            db.execute(
                "INSERT OR REPLACE INTO sync_refused (path, reason, size, mtime_ns, ctime_ns, ino, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (str(path), why, *_stamp(st), time.time()),
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
                if seen.get((host, seq)) == _stamp(st):
                    continue  # read as it is
                if refused.get(str(path)) == _stamp(st):
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
            batches = [_parse_payload(p, now) for p in opened.payloads]
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
                       "VALUES (?, ?, ?, ?, ?, ?)", (host, seq, *_stamp(st)))  # fmt: skip
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

    def describe(self) -> dict[str, Any]:
        """The folder, this machine (its live segments, how many it re-sealed), the hosts seen
        (their last segment and when it was sealed), records in and out, the refused files and
        why, the replaced segments still in the folder; what `calm sync` and `calmd status` show."""
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
            hosts = db.execute("SELECT id, name, last_seq, last_sealed, records, live FROM sync_hosts "
                               "ORDER BY name, id").fetchall()  # fmt: skip
            refused = db.execute("SELECT path, reason, at FROM sync_refused ORDER BY at").fetchall()
            segments = db.execute("SELECT COUNT(*) FROM sync_own").fetchone()[0]
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
            "segments": segments, "healed": int(meta.get("sync_healed") or 0),
            "hosts": [{"id": h, "name": n, "last_segment": s, "last_sealed": t, "records_in": r,
                       "segments": sum(b - a + 1 for a, b in json.loads(live))}
                      for h, n, s, t, r, live in hosts],
            "records_out": int(meta.get("sync_records_out") or 0),
            "records_in": int(meta.get("sync_records_in") or 0),
            "bad_times": int(meta.get("sync_bad_times") or 0),
            "pending_out": pending if config.sends else 0,
            "refused": {"count": int(meta.get("sync_refused") or 0),
                        "files": [{"path": p, "reason": why, "at": at} for p, why, at in refused]},
            "superseded": int(meta.get("sync_superseded") or 0),
            "last_run": self.last_run, "last_error": self.last_error,
        }  # fmt: skip


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a file's bytes changed without reading them: its size, mtime, ctime and inode.
    The ctime too: a copy written in place with its mtime set back keeps size, mtime and inode, but
    no program can set the ctime."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _digest(data: bytes | bytearray) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def _names(sealed: list[_Sealed]) -> str:
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

    def __init__(self, sync: Sync, folder: Path, key: bytes, host_id: str, next_seq: int, kept: list[int],
                 replaced: list[int]) -> None:  # fmt: skip
        self.sync, self.folder, self.key, self.host_id = sync, folder, key, host_id
        self.next_seq, self.kept, self.replaced = next_seq, set(kept), set(replaced)
        self.done: list[_Sealed] = []
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
        self.done.append(_Sealed(seq, len(data), _digest(data), (st.st_mtime_ns, st.st_ctime_ns, st.st_ino),
                                 [(first, last) for _, first, last in self.pieces], self.records,
                                 self.forgets))  # fmt: skip
        self._start()

    def close(self) -> list[_Sealed]:
        """Write the last segment (with the batch's final manifest); the segments written."""
        if self.first is not None:
            self._flush(final=True)
        return self.done


FORGETS_PER_CHUNK = CHUNK_RECORDS * 4


Pieces = list[tuple[int, int, int]]  # (source, first, last): the record numbers a chunk holds, per source


Chunk = tuple[dict[str, Any], Pieces, list[tuple[str, int]]]  # a payload, its pieces, its forgets


def _payloads(name: str, records: Iterator[tuple[int, list[Any]]],
              forgets: Sequence[tuple[str, int]]) -> Iterator[Chunk]:  # fmt: skip
    """The chunks' payloads for these (source, record)s and forgets, each with the record number
    ranges it holds per source and the forgets it carries: at most CHUNK_RECORDS records and about
    CHUNK_PLAIN_BYTES each; the forgets ride in the first. At least one (a chunk with nothing
    says the machine is there)."""
    batch: list[list[Any]] = []
    pieces: list[tuple[int, int, int]] = []
    size = 0
    pending = [(o, i) for o, i in forgets]
    empty = True

    def take() -> list[tuple[str, int]]:
        nonlocal pending
        taken, pending = pending[:FORGETS_PER_CHUNK], pending[FORGETS_PER_CHUNK:]
        return taken

    for source, record in records:
        empty = False
        number = record[0]
        if pieces and pieces[-1][0] == source:
            pieces[-1] = (source, pieces[-1][1], number)
        else:
            pieces.append((source, number, number))
        batch.append(record)
        size += 64 + sum(len(v) for v in record if isinstance(v, str))
        if len(batch) >= CHUNK_RECORDS or size >= CHUNK_PLAIN_BYTES:
            sent = take()
            yield _payload(name, batch, sent), pieces, sent
            batch, pieces, size = [], [], 0
    if empty and not pending:
        yield _payload(name, [], []), [], []
    while batch or pending:
        sent = take()
        yield _payload(name, batch, sent), pieces, sent
        batch, pieces = [], []


def _payload(name: str, records: list[list[Any]], forgets: list[tuple[str, int]]) -> dict[str, Any]:
    return {"v": 1, "name": name, "sealed": time.time(), "detector": DETECTOR_VERSION, "records": records,
            "forgets": [list(f) for f in forgets]}  # fmt: skip


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


@contextlib.contextmanager
def _sync_lock(data_dir: Path) -> Iterator[bool]:
    """The CALM_HOME's sync lock (a file lock), taken without waiting: whether it was."""
    fd = os.open(paths.sync_lock_path(data_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- leaving (calm forget --all)


@dataclass(frozen=True)
class SyncHoldings:
    """What sync holds for this machine, as `calm forget --all` deletes it (`leave`): its files in
    CALM_HOME (sync.json, the key) and its share of the sync folder (its own sub-folder), with
    what stays in the folder (the other machines' shares) and the forgets made here that the other
    machines have not been sent yet (they would not forget those commands)."""

    files: tuple[Path, ...]  # sync.json and sync.key, those there
    folder: Path | None  # the sync folder sync.json names (None: sync is off, or sync.json unreadable)
    share: Path | None  # this machine's sub-folder there, when there is one
    segments: int  # the segments in it
    others: int  # the other machines' sub-folders in the folder
    unsent_forgets: int

    @property
    def anything(self) -> bool:
        return bool(self.files or self.share or self.unsent_forgets)


def sync_holdings(data_dir: Path, store: HistoryStore | None) -> SyncHoldings:
    """What sync holds for this machine (reads only)."""
    files = tuple(p for p in (paths.sync_config_path(data_dir), paths.sync_key_path(data_dir)) if p.is_file())
    try:
        config = read_config(paths.sync_config_path(data_dir))
    except SyncError:
        config = None  # deleted all the same; which folder it named is unknown
    host_id, unsent = None, 0
    if store is not None:
        with store.reading() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'sync_host_id'").fetchone()
            host_id = str(row[0]) if row else None
            unsent = db.execute("SELECT COUNT(*) FROM sync_forgotten WHERE sent = 0").fetchone()[0]
    folder = Path(config.folder) if config is not None else None
    share, segments, others = None, 0, 0
    if folder is not None:
        try:
            names = os.listdir(folder)
        except OSError:
            names = []
        others = sum(1 for n in names if HOST_ID.match(n) and n != host_id)
        if host_id is not None:
            own = paths.sync_host_dir(folder, host_id)
            if own.is_dir() and not own.is_symlink():
                share = own
                segments = len(Sync._files_in(own))
    return SyncHoldings(files, folder, share, segments, others, unsent if config is not None else 0)


def leave(
    data_dir: Path, store: HistoryStore | None, holdings: SyncHoldings, wait_s: float = 30.0
) -> tuple[int, str | None]:
    """This machine leaves sync for good (`calm forget --all`): under the sync lock (a sync in
    progress ends first; the daemon's next turn finds no sync.json and does nothing), sync.json
    and the key deleted, every stored command deleted without a forget sent (`forget_all`), this
    machine's share of the folder deleted (its own sub-folder: nothing of this machine's history
    stays there; the engine carries the deletion, and the other machines keep what they received).
    Returns how many commands were deleted, and why the share could not be deleted (None: it
    was, or there was none); SyncError, with nothing deleted, when the lock stays held."""
    deadline = time.monotonic() + wait_s
    while True:
        with _sync_lock(data_dir) as held:
            if held:
                for path in holdings.files:
                    path.unlink(missing_ok=True)
                commands = store.forget_all() if store is not None else 0
                problem = None
                if holdings.share is not None:
                    try:
                        shutil.rmtree(holdings.share)
                    except OSError as exc:
                        problem = f"{holdings.share}: {exc.strerror or exc}"
                return commands, problem
        if time.monotonic() > deadline:
            raise SyncError(f"a sync (calmd's) held {paths.sync_lock_path(data_dir)} for {wait_s:g} s: "
                            "nothing was deleted; try again")  # fmt: skip
        time.sleep(0.1)


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
