"""History files as the shells write them: bash's and zsh's formats read entry by entry, a chunk
at a time (`file_lines`, `read_entries`), what marks a file as no history at all (`refusal`), and
what of a file the imports read (`ReadMark`). Bytes in, entries out: the store and the imports
(calmd/history/store.py, calmd/history/imports.py) decide what is kept.

A file a crash left NULs in (a run of them, a hole: the blocks it had not written yet) is still a
history: the entries the NULs touch are damaged (`Entry.damaged`: skipped and counted by the
import), the others are read as they are. A NUL is never part of a command a shell wrote (bash
and zsh keep C strings; zsh writes a NUL typed at its prompt metafied, 0x83 0x20).
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

from calmd.errors import CalmError

MAX_COMMAND_CHARS = 1 << 16  # as the protocol's `record` limit: longer is not a command worth keeping
# Read a chunk at a time; an entry longer than MAX_ENTRY_BYTES is skipped unread.
IMPORT_CHUNK = 1 << 20
MAX_ENTRY_BYTES = 4 * MAX_COMMAND_CHARS  # the most bytes 64 Ki characters take in UTF-8
FORMAT_SNIFF_BYTES = 65536
MAX_IMPORT_BYTES = 16 << 20  # an import reads at most this much of a file, the newest first
TIME_DIGITS = 12  # seconds since the epoch take 10 digits until 2286: a longer string is no time
# A line too long to keep (None from `file_lines`) whose bytes held a NUL: a crash's, not a command.
DAMAGED_LINE = b"\0"


def time_of(digits: bytes) -> float:
    """A history file's time (`#1700000000`, `: 1700000000:0;`): its digits as a number, infinite
    (impossible: recorded.valid_time) when there are more than TIME_DIGITS of them, zeros first or not."""
    return float(digits) if len(digits) <= TIME_DIGITS else math.inf


@dataclass(frozen=True)
class ReadMark:
    """What of a bash or zsh history file the imports read, as `meta` keeps it:
    `<done>:<fingerprint>[:<lo>-<hi>,...]`: the bytes [0, done), and the ranges after it (an
    import bounded by --max-mib reads the newest bytes first and leaves the older unread, for the
    next import); `fingerprint`: the hex of the file's first 64 bytes, which tells a file the shell
    rewrote (trimmed to HISTSIZE) from one it appended to."""

    done: int
    ranges: tuple[tuple[int, int], ...]
    fingerprint: str

    @property
    def extent(self) -> int:
        return max([self.done, *(hi for _, hi in self.ranges)])

    @classmethod
    def parse(cls, text: str) -> ReadMark | None:
        parts = text.split(":")
        if not parts[0].isdigit() or len(parts) not in (2, 3):
            return None
        ranges: list[tuple[int, int]] = []
        for item in parts[2].split(",") if len(parts) == 3 else ():
            lo, _, hi = item.partition("-")
            if not (lo.isdigit() and hi.isdigit()) or int(lo) >= int(hi):
                return None
            ranges.append((int(lo), int(hi)))
        done = int(parts[0])
        ends = [done] + [hi for _, hi in ranges]
        if any(lo <= after for (lo, _), after in zip(ranges, ends, strict=False)):
            return None  # not sorted, overlapping, or touching: not a mark this calmd wrote
        return cls(done, tuple(ranges), parts[1])

    def text(self) -> str:
        spans = ",".join(f"{lo}-{hi}" for lo, hi in self.ranges)
        return f"{self.done}:{self.fingerprint}" + (f":{spans}" if spans else "")

    def unread(self, size: int) -> list[tuple[int, int]]:
        """The byte ranges of a file of `size` bytes that no import read, oldest first."""
        gaps, at = [], self.done
        for lo, hi in (*self.ranges, (size, size)):
            if lo > at:
                gaps.append((at, min(lo, size)))
            at = max(at, hi)
        return [(lo, hi) for lo, hi in gaps if lo < hi]

    def with_read(self, lo: int, hi: int) -> ReadMark:
        """This mark with [lo, hi) read too (merged with the ranges it touches)."""
        if lo >= hi:
            return self
        spans = sorted([*self.ranges, (lo, hi)])
        done, merged = self.done, list[tuple[int, int]]()
        for a, b in spans:
            if a <= done:
                done = max(done, b)
            elif merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return ReadMark(done, tuple((a, b) for a, b in merged if b > done), self.fingerprint)


# --------------------------------------------------------------------------- history file formats

_ZSH_EXTENDED = re.compile(rb"^: *(\d+):(\d+);", re.MULTILINE)
NUL_RUN = b"\0" * 8  # a stray NUL is a paste or a flipped byte; eight in a row, a crash's block
_NUL_RUNS = re.compile(rb"\0{8,}")
NUL_FEW = 16  # stray NULs a chunk may hold (or one in a thousand bytes) and still be text
BINARY_SHARE = 0.25  # of a chunk's bytes: control characters and bytes that are not UTF-8
_CONTROLS = bytes(b for b in range(32) if b not in b"\t\n\r") + b"\x7f"
# A line of colon-separated fields whose first has no space: /etc/passwd, /etc/group, /etc/shadow.
_RECORD_LINE = re.compile(rb"[^\s:#]+(?::[^:\n]*){3,}")


class NotAHistory(CalmError):
    """A file refused by an import: not a shell history (nothing of it is imported)."""


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading, refused unless it is a regular file: a FIFO would block the
    reader (opened non-blocking, then switched back), a folder or a device is no history."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        fd = -1
    mode = os.fstat(fd).st_mode if fd >= 0 else stat.S_IFDIR
    if not stat.S_ISREG(mode):
        if fd >= 0:
            os.close(fd)
        if stat.S_ISDIR(mode):
            raise NotAHistory(f"{path}: a folder, not a history file; give the file inside it")
        raise NotAHistory(f"{path}: not a regular file (a FIFO, a socket or a device); give a history file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=0)


def check_history_file(path: Path) -> None:
    """NotAHistory (one line saying why) unless `path` is a regular file that reads as a shell
    history (`refusal` over its newest MAX_IMPORT_BYTES); OSError when it cannot be read."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        reason = refusal(f.fileno(), max(0, size - MAX_IMPORT_BYTES), size)
    if reason is not None:
        raise NotAHistory(f"{path}: not a shell history ({reason}); give a bash or zsh history file")


def refusal(fd: int, start: int, end: int) -> str | None:
    """Why the bytes [start, end) of a file are not a shell history, or None. Reads them once, a
    chunk at a time. Runs of NULs (NUL_RUN or longer: a crash's unwritten blocks, a sparse file's
    holes) are damage, not a reason: the rest of the chunk is judged without them, and the
    entries they touch are skipped by the import (`Entry.damaged`)."""
    position = start
    sample = b""
    while position < end:
        chunk = os.pread(fd, min(IMPORT_CHUNK, end - position), position)
        if not chunk:
            break
        text = _NUL_RUNS.sub(b"", chunk) if NUL_RUN in chunk else chunk
        nuls = text.count(0)
        if nuls > max(NUL_FEW, len(text) // 1000):  # a few stray NULs are damage; more are data
            return f"NUL bytes all through it ({nuls:,} from byte {position:,}): binary data, not text"
        if len(text) >= 64:
            controls = len(text) - len(text.translate(None, _CONTROLS))
            undecodable = text.decode("utf-8", "replace").count("\ufffd")
            if controls + undecodable > BINARY_SHARE * len(text):
                return f"binary data at byte {position:,}, not text"
        if len(sample) < FORMAT_SNIFF_BYTES:
            sample += text[: FORMAT_SNIFF_BYTES - len(sample)]
        position += len(chunk)
    lines = [line for line in sample.split(b"\n")[:1000] if line.strip() and not _is_bash_timestamp(line)]
    records = sum(1 for line in lines if _RECORD_LINE.fullmatch(line.rstrip(b"\r")))
    if len(lines) >= 3 and records >= 0.9 * len(lines):
        return "lines of colon-separated fields, like /etc/passwd, not commands"
    return None


def detect_format(raw: bytes, name: str = "") -> str:
    """`zsh` when most entries look like `: <epoch>:<duration>;cmd` (lines that continue the one
    before, which ends in a backslash, are not entries), or when a file of neither kind is named
    for zsh (`.zsh_history`, `zhistory`: zsh's plain format); else `bash`."""
    head = raw[:FORMAT_SNIFF_BYTES]
    lines = head.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    entries = sum(1 for i, line in enumerate(lines) if i == 0 or not lines[i - 1].endswith(b"\\"))
    extended = len(_ZSH_EXTENDED.findall(head))
    if extended and extended * 2 >= entries:
        return "zsh"
    named = name.lower()
    if "zsh" in named or "zhist" in named:
        return "zsh" if not any(_is_bash_timestamp(line) for line in lines[:100]) else "bash"
    return "bash"


def unmetafy(raw: bytes) -> bytes:
    """zsh stores bytes 0x83-0x9f and NUL 'metafied': 0x83 followed by the byte XOR 0x20."""
    if b"\x83" not in raw:
        return raw
    out = bytearray()
    it = iter(raw)
    for byte in it:
        if byte == 0x83:
            nxt = next(it, None)
            if nxt is not None:
                out.append(nxt ^ 0x20)
        else:
            out.append(byte)
    return bytes(out)


def decoded(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _is_bash_timestamp(line: bytes) -> bool:
    """`#<digits>`: the time of the next entry (bash with HISTTIMEFORMAT set, readline's rule)."""
    return line[:1] == b"#" and line[1:2].isdigit()


def bash_timestamped(head: bytes) -> bool:
    """A bash history that starts with a timestamp delimits its entries by timestamps: the lines
    between two are one entry (a multi-line command, with `shopt -s lithist`), as readline reads
    it (history_multiline_entries)."""
    return _is_bash_timestamp(head.split(b"\n", 1)[0])


def file_lines(fd: int, start: int, end: int) -> Iterator[tuple[bytes | None, int]]:
    """(line without its newline or None when it is longer than MAX_ENTRY_BYTES, offset after
    it) for the bytes [start, end) of `fd`, read a chunk at a time. A CR before the newline is
    dropped (a file that went through Windows); a last line without a newline counts. A line too
    long to keep whose bytes held a NUL (a crash's hole, read as NULs) is DAMAGED_LINE, not None:
    damage, not a command too long."""
    carry = b""
    base = start  # the file offset where `carry` begins
    dropping = False  # inside a line too long to keep: skip to its newline
    nul = False  # ... and it held a NUL
    position = start
    while position < end:
        chunk = os.pread(fd, min(IMPORT_CHUNK, end - position), position)
        if not chunk:
            break
        position += len(chunk)
        parts = (carry + chunk).split(b"\n")
        carry = parts.pop()
        for part in parts:
            after = base + len(part) + 1
            if dropping:
                dropping = False
                yield (DAMAGED_LINE if nul or b"\0" in part else None), after
            else:
                yield (part[:-1] if part.endswith(b"\r") else part), after
            base = after
        del parts, chunk  # before the next chunk is read: one chunk's lines in memory, not two
        if len(carry) > MAX_ENTRY_BYTES:
            nul = (dropping and nul) or b"\0" in carry
            dropping = True
            base += len(carry)
            carry = b""
    if dropping:
        yield (DAMAGED_LINE if nul or b"\0" in carry else None), position
    elif carry:
        yield (carry[:-1] if carry.endswith(b"\r") else carry), base + len(carry)


class Entry(NamedTuple):
    """One entry of a bash or zsh history file, as `read_entries` reads it."""

    ts: float | None  # its time, as the file wrote it (recorded.valid_time says whether it is one)
    cmd: bytes | None  # the command's bytes; None: longer than any command, skipped unread
    end: int  # the file offset after it
    damaged: bool = False  # it holds NUL bytes: a crash's, never a shell's (the module's docstring)


def read_entries(fd: int, start: int, end: int, kind: str, *, multiline: bool = False) -> Iterator[Entry]:
    """The entries of a history file's bytes [start, end), oldest first, as the shell reads them.

    bash: one command per line; `#<epoch>` lines (HISTTIMEFORMAT) time the next command; in a file
    that starts with one, the lines up to the next timestamp are one entry (`multiline`).
    zsh: `: <epoch>:<duration>;cmd` (extended) or plain lines (a leading `:` escaped as `\\:`);
    a line ending in a backslash goes on on the next line (a newline of the command); a command
    that ends in a backslash was written with a space after it, which is dropped; metafied bytes
    are decoded. An entry longer than MAX_ENTRY_BYTES comes as None (skipped, never read whole);
    one whose bytes hold a NUL is `damaged`.
    """
    if kind not in ("bash", "zsh"):
        raise ValueError(f"unknown history format {kind!r} (bash or zsh)")
    lines = file_lines(fd, start, end)
    yield from (_zsh_entries(lines) if kind == "zsh" else _bash_entries(lines, multiline))


def _bash_entries(lines: Iterator[tuple[bytes | None, int]], multiline: bool) -> Iterator[Entry]:
    stamp: float | None = None
    pending: list[bytes] | None = None  # the lines of the entry being read (multi-line files)
    pending_ts: float | None = None
    pending_end = 0
    too_long = damaged = False

    def entry() -> Entry:
        assert pending is not None
        return Entry(pending_ts, None if too_long else b"\n".join(pending), pending_end, damaged)

    for line, end in lines:
        if line is not None and _is_bash_timestamp(line):
            if pending is not None:
                yield entry()
                pending, too_long, damaged = None, False, False
            digits = re.match(rb"#(\d+)", line)  # all of them: a time cut to 12 digits is no time either
            stamp = time_of(digits.group(1)) if digits else None  # an impossible one: `valid_time`
            continue
        if multiline and pending is not None:
            damaged = damaged or (line is not None and b"\0" in line)
            if line is None or too_long or sum(map(len, pending)) + len(line) > MAX_ENTRY_BYTES:
                too_long = True
            else:
                pending.append(line)
            pending_end = end
            continue
        if pending is not None:
            yield entry()
            too_long = False
        if line is None:
            pending, too_long, damaged = [], True, False
        else:
            pending, damaged = [line], b"\0" in line
        pending_ts, pending_end, stamp = stamp, end, None
        if not multiline:
            yield entry()
            pending, too_long, damaged = None, False, False
    if pending is not None:
        yield entry()


def _zsh_entries(lines: Iterator[tuple[bytes | None, int]]) -> Iterator[Entry]:
    parts: list[bytes] = []
    size = 0
    too_long = damaged = False
    end = 0
    for line, end in lines:
        damaged = damaged or (line is not None and b"\0" in line)  # a file's NUL, not a metafied one
        if line is None or too_long or size + len(line) > MAX_ENTRY_BYTES:
            too_long = True
            line = b""
        if line.endswith(b"\\"):
            parts.append(line[:-1])  # the backslash stood for a newline of the command
            size += len(line)
            continue
        parts.append(line)
        yield _zsh_entry(parts, too_long, end, damaged)
        parts, size, too_long, damaged = [], 0, False, False
    if parts:  # a continuation cut by the end of the file
        yield _zsh_entry(parts, too_long, end, damaged)


def _zsh_entry(parts: list[bytes], too_long: bool, end: int, damaged: bool) -> Entry:
    """One zsh entry from its lines (their backslashes taken off)."""
    if too_long:
        return Entry(None, None, end, damaged)
    raw = b"\n".join(parts)
    trimmed = raw.rstrip(b" ")
    if trimmed != raw and trimmed.endswith(b"\\"):
        raw = raw[:-1]  # zsh writes a space after a command that ends in a backslash
    raw = unmetafy(raw)
    match = _ZSH_EXTENDED.match(raw)
    if match:
        return Entry(time_of(match.group(1)), raw[match.end() :], end, damaged)
    if raw.startswith(b"\\:"):
        raw = raw[1:]  # a plain line that starts with `:` is written `\:`
    return Entry(None, raw, end, damaged)


def entry_start(fd: int, offset: int, end: int, kind: str, multiline: bool) -> int:
    """The offset of the first entry that starts at or after `offset`: the start of a line that
    follows a line not ending in a backslash (zsh), a timestamp line (a multi-line bash file),
    any line (bash); `end` when there is none. The line before is read from 3 bytes before
    `offset` on: when `offset` is a line's start, the end of the line before (`\\`, `\\\r`) says
    whether it goes on (an entry once seemed to start at a zsh continuation line so)."""
    start = max(0, offset - 3)
    prev_line: bytes | None = None
    first = True  # the first line read is partial: never an entry's start
    for line, after in file_lines(fd, start, end):
        if not first and start >= offset:
            if kind == "bash" and multiline:
                begins = line is not None and _is_bash_timestamp(line)
            else:
                begins = kind == "bash" or prev_line is None or not prev_line.endswith(b"\\")
            if begins:
                return start
        first, prev_line, start = False, line, after
    return end


def parse_history(raw: bytes, kind: str) -> Iterator[tuple[float | None, str]]:
    """(timestamp or None, command) pairs of a whole history file in memory, oldest first, as
    `read_entries` reads them (entries too long to be commands, and damaged ones, left out)."""
    import tempfile

    with tempfile.TemporaryFile() as f:
        f.write(raw)
        f.flush()
        multiline = kind == "bash" and bash_timestamped(raw[:FORMAT_SNIFF_BYTES])
        for ts, cmd, _, damaged in read_entries(f.fileno(), 0, len(raw), kind, multiline=multiline):
            if cmd is not None and not damaged:
                yield ts, decoded(cmd)
