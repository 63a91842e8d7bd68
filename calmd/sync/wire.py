"""What a segment's chunks hold (msgpack, once opened: calmd/sync/seal.py): the machine's name,
when the chunk was sealed, its records (each with its number on that machine) and its forgets (the
identities of records deleted there); the first chunk also the manifest, the numbers of the
machine's live segments once the segment is written. Parsed here with every field checked (a
record as the store would store it); built here for the writer."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from calmd.history.recorded import clean_env, clean_text, comp_text, valid_time
from calmd.secrets import DETECTOR_VERSION
from calmd.sync.seal import HOST_ID, Refused

CHUNK_RECORDS = 2000  # records per chunk, at most
CHUNK_PLAIN_BYTES = 1 << 20  # ... and plain bytes, about (a record is at most ~260 KiB)
MAX_LIVE_RANGES = 1 << 16  # a manifest longer than this is refused
MAX_NAME_CHARS = 64  # a host's name
FUTURE_SLACK_S = 86400.0  # a record stamped later than now + this is stored at now + this


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


def numbers_in(ranges: Ranges) -> Iterator[int]:
    """Each number the ranges hold (as many as they say: count them first when they come from
    another machine)."""
    for first, last in ranges:
        yield from range(first, last + 1)


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
    comp_items = _text(comp, "comp")
    possible = valid_time(float(ts))
    return Incoming(
        oid, min(float(ts), now + FUTURE_SLACK_S) if possible else None, _text(session, "session"),
        _text(cwd, "cwd"), _text(git, "git"), _text(cmd, "command"), code,
        None if duration is None else float(duration),
        comp_text(comp_items.split("\n") if comp_items else ()), clean_env(_text(env, "env")),
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


# --------------------------------------------------------------------------- chunks

FORGETS_PER_CHUNK = CHUNK_RECORDS * 4


Pieces = list[tuple[int, int, int]]  # (source, first, last): the record numbers a chunk holds, per source


Chunk = tuple[dict[str, Any], Pieces, list[tuple[str, int]]]  # a payload, its pieces, its forgets


def chunk_payloads(name: str, records: Iterator[tuple[int, list[Any]]],
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
            yield chunk_payload(name, batch, sent), pieces, sent
            batch, pieces, size = [], [], 0
    if empty and not pending:
        yield chunk_payload(name, [], []), [], []
    while batch or pending:
        sent = take()
        yield chunk_payload(name, batch, sent), pieces, sent
        batch, pieces = [], []


def chunk_payload(name: str, records: list[list[Any]], forgets: list[tuple[str, int]]) -> dict[str, Any]:
    return {"v": 1, "name": name, "sealed": time.time(), "detector": DETECTOR_VERSION, "records": records,
            "forgets": [list(f) for f in forgets]}  # fmt: skip


def parse_payload(payload: dict[str, Any], now: float) -> tuple[str | None, float | None, list[Incoming],
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
