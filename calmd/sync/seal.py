"""The key and the segment format: what is sealed, and how a file of the folder is opened.

A segment: a 40-byte header (magic, key id, host id, segment number, number of chunks), then its
chunks, each sealed on its own with XChaCha20-Poly1305 (libsodium through PyNaCl) under the user's
key, with the header, the chunk's index and the previous chunk's tag as associated data: a chunk
cannot be altered, moved to another segment or host, reordered or dropped (from the middle or the
end: the header says how many there are) without failing to open. What a chunk holds is
calmd/sync/wire.py's.

The key is 32 random bytes, carried between machines as a phrase (`calm-` and 56 base32 letters,
a 3-byte check among them: a typo is caught); its id (`key_id`, in every header) names it without
saying anything of it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_decrypt,
    crypto_aead_xchacha20poly1305_ietf_encrypt,
)
from nacl.exceptions import CryptoError

from calmd.atomic import atomic_write, read_regular_file
from calmd.errors import one_line
from calmd.sync.config import SyncError

MAGIC = b"CALMSYN2"  # 2: segments never change once written (1 grew them in place; never released)
HEADER = struct.Struct(">8s8s8sQII")  # magic, key id, host id, segment number, chunks, reserved (0)
CHUNK_HEAD = struct.Struct(">I24s")  # sealed length (the tag included), nonce
TAG_BYTES = 16
KEY_BYTES = 32
MAX_SEGMENT_BYTES = 64 << 20  # a file larger than this is refused unread
MAX_CHUNK_BYTES = 8 << 20  # a chunk that says it is larger is refused
MAX_CHUNKS = 1 << 16  # a header that says more chunks is refused
HOST_ID = re.compile(r"[0-9a-f]{16}\Z")
SEGMENT_NAME = re.compile(r"(\d{8})\.calm\Z")
KEY_PREFIX = "calm-"


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


def peek_header(path: Path) -> Header | None:
    """The header of the file at `path` when it has one (its first 40 bytes, the magic checked),
    else None: what a glance at a file of the folder tells (the key it says it is sealed with,
    where it says it belongs) without reading the rest. Nothing in it is authenticated."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.read(fd, HEADER.size)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(head) < HEADER.size or head[:8] != MAGIC:
        return None
    _, kid, host, seq, count, _ = HEADER.unpack(head)
    return Header(kid, host, seq, count)


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
