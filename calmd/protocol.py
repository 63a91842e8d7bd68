"""The calmd wire protocol (docs/protocol.md): msgpack maps over a Unix stream socket.

Every request is a map with `op` and an integer `id`; every reply carries the same `id` and
`protocol`. Messages are concatenated on the stream (msgpack is self-delimiting). This module
validates untrusted requests into typed objects and builds replies; it never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20  # a request larger than this is refused (and the connection closed)
# A request holds at most ~1,600 msgpack objects (256 history entries of 5, 256 completions) and
# nests 4 deep (request > ctx > history > entry). Frames beyond these are refused before they are
# decoded, so that neither decoding time nor the decoded objects grow with what a client declares.
MAX_MESSAGE_OBJECTS = 8192
MAX_MESSAGE_DEPTH = 16
# What a shell can report as an exit status fits in a C int (zsh's `return 300` is 300, bash
# wraps to 0-255); SQLite stores 64-bit integers, and ids are echoed back as they came.
EXIT_MIN, EXIT_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Seconds since the epoch: 2100-01-01 UTC. Beyond is not a time a command ran at (a clock set
# wrong, `: 999999999999:0;ls` in a history file: the year 33658, which no view can print); the
# imports of history files hold their times to the same range (calmd/history/store.py `valid_time`).
TS_MAX = 4_102_444_800.0
DURATION_MAX = 1e9  # seconds a command ran: 31 years
# The error codes of docs/protocol.md; no reply carries any other.
ERROR_CODES = frozenset(
    {"bad_message", "bad_field", "unknown_op", "too_large", "disk_full", "forbidden", "internal"}
)
MAX_CANDIDATES = 32
MAX_INPUT_BYTES = 4096
MAX_LIST_ITEMS = 256  # history/completions lists sent by a client; the template caps them at 15
MAX_PATH_BYTES = 8192  # a shell's PATH
# The history search (`search`, `forget`; calmd/daemon/search.py): a query is what fits on a line,
# and a reply holds at most MAX_SEARCH_RESULTS lines (the screen's worth `calm search` asks for).
MAX_QUERY_BYTES = 1024
MAX_SEARCH_RESULTS = 100
# A line longer than this is cut in a search reply (`cut`: its whole length; `row`: what a search
# with `row` gives back whole), and a folder keeps its last SEARCH_CWD_BYTES: 100 lines always fit
# the reply's 256 KiB (50 lines of 60 KiB left room for 4 when 20 were asked).
SEARCH_LINE_BYTES = 2048
SEARCH_CWD_BYTES = 512
SEARCH_MODES = ("global", "host", "folder", "session", "success")  # host: recorded on this machine (sync)
# Candidate replies carry `confidence`, the calibrated probability that the candidate is the command
# the user runs (docs/quality.md), and `ghost`, whether the shells draw it (the fitted rule of
# calmd/suggest/ghost.py). This threshold is that rule's fallback when no fitted rule is packaged;
# cycling still reaches every candidate.
DEFAULT_MIN_CONFIDENCE = 0.5


class ProtocolError(Exception):
    """An invalid request: becomes an error reply; the daemon carries on."""

    def __init__(self, code: str, message: str, request_id: int | None = None) -> None:
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


# --------------------------------------------------------------------------- framing


class StreamError(Exception):
    """The stream cannot go on: a frame over the size limit, or bytes that are not msgpack. The
    connection answers the requests before it, sends this error and closes."""

    def __init__(self, code: str, message: str) -> None:
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.code = code
        self.message = message


_FIXED, _SIZED, _ARRAY, _MAP = range(4)
# First byte -> (bytes of the length or count field, fixed bytes after it, kind); the fix* forms,
# nil and booleans are handled inline. 0xc1 is the one byte msgpack never uses.
_HEADERS: dict[int, tuple[int, int, int]] = {
    0xC4: (1, 0, _SIZED), 0xC5: (2, 0, _SIZED), 0xC6: (4, 0, _SIZED),  # bin 8/16/32
    0xC7: (1, 1, _SIZED), 0xC8: (2, 1, _SIZED), 0xC9: (4, 1, _SIZED),  # ext 8/16/32 (+ type)
    0xCA: (0, 4, _FIXED), 0xCB: (0, 8, _FIXED),  # float 32/64
    0xCC: (0, 1, _FIXED), 0xCD: (0, 2, _FIXED), 0xCE: (0, 4, _FIXED), 0xCF: (0, 8, _FIXED),  # uint
    0xD0: (0, 1, _FIXED), 0xD1: (0, 2, _FIXED), 0xD2: (0, 4, _FIXED), 0xD3: (0, 8, _FIXED),  # int
    0xD4: (0, 2, _FIXED), 0xD5: (0, 3, _FIXED), 0xD6: (0, 5, _FIXED), 0xD7: (0, 9, _FIXED),  # fixext
    0xD8: (0, 17, _FIXED),
    0xD9: (1, 0, _SIZED), 0xDA: (2, 0, _SIZED), 0xDB: (4, 0, _SIZED),  # str 8/16/32
    0xDC: (2, 0, _ARRAY), 0xDD: (4, 0, _ARRAY), 0xDE: (2, 0, _MAP), 0xDF: (4, 0, _MAP),
}  # fmt: skip


def _one_byte_header(b: int) -> tuple[int, int, int] | None:
    if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):  # fixint, nil, booleans
        return 1, 0, 0
    if 0xA0 <= b <= 0xBF:  # fixstr
        return 1, b & 0x1F, 0
    if b <= 0x8F:  # fixmap
        return 1, 0, 2 * (b & 0x0F)
    if b <= 0x9F:  # fixarray
        return 1, 0, b & 0x0F
    known = _HEADERS.get(b)
    if known is not None and known[2] == _FIXED:
        return 1, known[1], 0
    return None


# The scan's hot path: most objects of a request are described by their first byte alone.
_ONE_BYTE_HEADERS = [_one_byte_header(b) for b in range(256)]


def _header(buf: bytearray, pos: int, end: int) -> tuple[int, int, int] | None:
    """(header bytes, payload bytes, child objects) of the object starting at `pos`, from its
    header alone; None while the header itself is incomplete."""
    b = buf[pos]
    known = _HEADERS.get(b)
    if known is None:
        raise StreamError("bad_message", f"byte 0x{b:02x} does not start a msgpack object")
    field_bytes, extra, kind = known
    if pos + 1 + field_bytes > end:
        return None
    value = int.from_bytes(buf[pos + 1 : pos + 1 + field_bytes], "big")
    if kind == _SIZED:
        return 1 + field_bytes + extra, value, 0
    return 1 + field_bytes, 0, value if kind == _ARRAY else 2 * value


class MessageReader:
    """Cuts a connection's byte stream into msgpack frames (one request each) without decoding.

    Only headers are read: a str, bin, array or map header that declares more than the limit is
    refused as soon as the header arrives, and so is a frame whose bytes grow past it, so the
    daemon never holds more than `max_bytes` of one request. The scan resumes where the last
    chunk ended (no rescans). Frames are then decoded one by one (`decode_message`), so that a
    well-framed but bad message gets its own error and the stream goes on.
    """

    def __init__(
        self,
        max_bytes: int = MAX_MESSAGE_BYTES,
        max_objects: int = MAX_MESSAGE_OBJECTS,
        max_depth: int = MAX_MESSAGE_DEPTH,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_objects = max_objects
        self.max_depth = max_depth
        self._buf = bytearray()
        self._start = 0  # where the current frame begins in _buf
        self._pos = 0  # how far the current frame has been scanned
        self._open: list[int] = []  # objects still due in each open container, outermost first
        self._objects = 0
        self._too_deep = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as frames."""
        return len(self._buf) - self._start

    def feed(self, data: bytes) -> None:
        if self._start:  # drop the frames handed out already
            del self._buf[: self._start]
            self._pos -= self._start
            self._start = 0
        self._buf += data

    def next_message(self) -> bytes | None:
        """The next complete frame, or None until more bytes arrive. Raises StreamError when the
        stream must close, ProtocolError (bad_message) for a frame that was skipped whole."""
        buf, end, pos, open_ = self._buf, len(self._buf), self._pos, self._open
        limit = self._start + self.max_bytes
        objects, max_objects = self._objects, self.max_objects
        one_byte = _ONE_BYTE_HEADERS
        try:
            while pos < end:
                header = one_byte[buf[pos]] or _header(buf, pos, end)
                if header is None:
                    break
                head, payload, children = header
                after = pos + head + payload
                if after > limit or pos + head + children > limit:  # each child takes a byte at least
                    raise StreamError("too_large", f"a request over {self.max_bytes} bytes")
                if after > end:
                    break
                objects += 1
                if objects > max_objects:
                    raise StreamError("too_large", f"a request of more than {max_objects} msgpack objects")
                pos = after
                if children:
                    open_.append(children)
                    if len(open_) > self.max_depth:
                        self._too_deep = True  # skipped whole once its end is found
                    continue
                while open_:  # a value is complete: so are the containers it was the last item of
                    open_[-1] -= 1
                    if open_[-1]:
                        break
                    open_.pop()
                else:
                    objects = 0
                    return self._cut(pos)
        finally:
            self._objects = objects
        self._pos = pos
        if end - self._start > self.max_bytes:
            raise StreamError("too_large", f"a request over {self.max_bytes} bytes")
        return None

    def _cut(self, end: int) -> bytes:
        frame = bytes(self._buf[self._start : end])
        too_deep = self._too_deep
        self._start = self._pos = end
        self._too_deep = False
        if too_deep:
            raise ProtocolError("bad_message", f"a request nested deeper than {self.max_depth}")
        return frame


def decode_message(frame: bytes) -> Any:
    """Decode one frame cut by MessageReader. A frame msgpack cannot turn into Python values (a list
    as a map key, invalid UTF-8, a bad timestamp) raises ProtocolError; the stream goes on."""
    try:
        return msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except UnicodeDecodeError:
        request_id, where = _locate_bad_utf8(frame)
        raise ProtocolError("bad_field", f"{where} is not valid UTF-8", request_id) from None
    except ValueError as exc:
        if "map key" in str(exc):
            raise ProtocolError("bad_message", "map keys must be strings") from None
        raise ProtocolError("bad_message", f"undecodable message: {exc}") from None
    except Exception as exc:  # whatever else the decoder refuses (unhashable keys, ...) is the frame's fault
        raise ProtocolError("bad_message", f"undecodable message: {type(exc).__name__}: {exc}") from None


def _locate_bad_utf8(frame: bytes) -> tuple[int | None, str]:
    """The request's id, if it has a valid one, and where its invalid UTF-8 string is."""
    try:
        raw = msgpack.unpackb(frame, raw=True, strict_map_key=False)
    except Exception:  # the frame is bad in more ways than one: report the first
        return None, "a string"
    if not isinstance(raw, dict):
        return None, "a string"
    raw_id = raw.get(b"id")
    valid_id = not isinstance(raw_id, bool) and isinstance(raw_id, int) and INT64_MIN <= raw_id <= INT64_MAX
    path = _bad_utf8_path(raw, "")
    return (raw_id if valid_id else None), (f"field {path!r}" if path else "a string")


def _bad_utf8_path(value: Any, path: str) -> str | None:
    if isinstance(value, bytes):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return path or "(the request)"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            found = _bad_utf8_path(key, f"{path}.{name}".lstrip(".")) if isinstance(key, bytes) else None
            found = found or _bad_utf8_path(item, f"{path}.{name}".lstrip("."))
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _bad_utf8_path(item, f"{path}[{i}]")
            if found:
                return found
    return None


def wire_text(text: str) -> str:
    """`text` as the wire carries it (UTF-8): a byte of a command line, a path or a query that was
    not UTF-8 (Python keeps it as a lone surrogate, surrogateescape) becomes U+FFFD, as the store
    keeps such bytes. msgpack refused the whole request ("unexpected UnicodeEncodeError") before."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        escapes = all(not ("\ud800" <= c <= "\udfff") or "\udc80" <= c <= "\udcff" for c in text)
        raw = text.encode("utf-8", "surrogateescape" if escapes else "surrogatepass")
        return raw.decode("utf-8", "replace")
    return text


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class CompleteRequest:
    id: int
    ctx: dict[str, Any]
    n: int = 5
    session: str = ""
    history_given: bool = False  # False: the daemon fills history from its store
    early: bool = False  # send the history's best proposal before the model runs (an `early` reply)
    path: str | None = None  # the shell's PATH (its helper sends it once): COMP's commands
    min_confidence: float | None = None  # the shell's CALM_MIN_CONFIDENCE: replaces the ghost
    # rule's fitted thresholds (calmd/suggest/ghost.py); None: as fitted
    drawn: str | None = None  # the line the shell shows as ghost text now: the incumbent
    multiline: bool = False  # the client draws a multi-line entry as lines (zsh): it may get one
    keys: bool = False  # with the empty prompt's answer, each likely first key's early line (`key`)


@dataclass(frozen=True)
class RecordRequest:
    id: int
    cmd: str
    session: str = ""
    exit: int | None = None
    cwd: str = ""
    git: str = ""
    ts: float | None = None
    env: str = ""  # the active environment, short form (calmd/suggest/frames.py: short_env)
    duration: float | None = None  # seconds the command ran
    paused: bool = False  # a command ran at `ts` while recording was paused: its time alone, no text


@dataclass(frozen=True)
class SearchRequest:
    """`search`: the history's commands matching `query`, best first (calmd/suggest/search.py)."""

    id: int
    query: str = ""
    mode: str = "global"
    n: int = 20
    session: str = ""
    cwd: str = ""
    row: int | None = None  # a cut line's `row`: that line, whole, and nothing else


@dataclass(frozen=True)
class ForgetRequest:
    """`forget`: delete every run of exactly `cmd` from the history, for good (the search's delete key)."""

    id: int
    cmd: str


@dataclass(frozen=True)
class SimpleRequest:
    """status, reload, train, shutdown: no arguments."""

    id: int
    op: str
    extra: dict[str, Any] = field(default_factory=dict)


Request = CompleteRequest | RecordRequest | SearchRequest | ForgetRequest | SimpleRequest
SIMPLE_OPS = frozenset({"status", "reload", "train", "shutdown"})


def _str(msg: dict[str, Any], key: str, rid: int, *, default: str = "", limit: int = MAX_INPUT_BYTES) -> str:
    value = msg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ProtocolError("bad_field", f"{key!r} must be a string", rid)
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise ProtocolError("bad_field", f"{key!r} is longer than {limit} bytes", rid)
    return value


def _int(value: Any, key: str, rid: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError("bad_field", f"{key!r} must be an integer", rid)
    if not low <= value <= high:
        raise ProtocolError("bad_field", f"{key!r} must be {low} to {high}", rid)
    return value


def _exit(value: Any, rid: int) -> int:
    return _int(value, "exit", rid, EXIT_MIN, EXIT_MAX)


def parse_request(msg: Any) -> Request:
    """Validate one decoded message. Raises ProtocolError with the request id when it has one."""
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", f"a request must be a map, got {type(msg).__name__}")
    raw_id = msg.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, int):
        raise ProtocolError("bad_message", "every request needs an integer 'id'")
    if not INT64_MIN <= raw_id <= INT64_MAX:  # not echoed: a client could not tell it from its own
        raise ProtocolError("bad_field", "'id' must fit in a signed 64-bit integer")
    rid = raw_id
    op = msg.get("op")
    if not isinstance(op, str):
        raise ProtocolError("bad_message", "every request needs a string 'op'", rid)
    if op == "complete":
        return _parse_complete(msg, rid)
    if op == "record":
        return _parse_record(msg, rid)
    if op == "search":
        return _parse_search(msg, rid)
    if op == "forget":
        return _parse_forget(msg, rid)
    if op in SIMPLE_OPS:
        return SimpleRequest(rid, op)
    raise ProtocolError("unknown_op", f"unknown op {op!r}", rid)


def _parse_complete(msg: dict[str, Any], rid: int) -> CompleteRequest:
    n = _int(msg.get("n", 5), "n", rid, 0, MAX_CANDIDATES)
    raw_ctx = msg.get("ctx")
    if not isinstance(raw_ctx, dict):
        raise ProtocolError("bad_field", "'ctx' must be a map with at least 'input'", rid)
    if "input" not in raw_ctx:
        raise ProtocolError("bad_field", "'ctx.input' is required", rid)
    ctx: dict[str, Any] = {"input": _str(raw_ctx, "input", rid)}
    for key in ("cwd", "git", "env"):
        if raw_ctx.get(key) is not None:
            ctx[key] = _str(raw_ctx, key, rid)
    history_given = "history" in raw_ctx and raw_ctx["history"] is not None
    if history_given:
        hist = raw_ctx["history"]
        if not isinstance(hist, list) or len(hist) > MAX_LIST_ITEMS:
            raise ProtocolError("bad_field", f"'ctx.history' must be a list of at most {MAX_LIST_ITEMS}", rid)
        entries = []
        for i, item in enumerate(hist):
            if not isinstance(item, dict) or not isinstance(item.get("cmd"), str):
                raise ProtocolError("bad_field", f"'ctx.history[{i}]' must be a map with a string 'cmd'", rid)
            code = item.get("exit")
            entries.append(
                {"cmd": _str(item, "cmd", rid), "exit": None if code is None else _exit(code, rid)}
            )
        ctx["history"] = entries
    comps = raw_ctx.get("completions")
    if comps is not None:
        if (
            not isinstance(comps, list)
            or len(comps) > MAX_LIST_ITEMS
            or not all(isinstance(c, str) for c in comps)
        ):
            raise ProtocolError("bad_field", "'ctx.completions' must be a list of strings", rid)
        ctx["completions"] = list(comps)
    session = _str(msg, "session", rid, limit=256)
    early, multiline, keys = _bool(msg, "early", rid), _bool(msg, "multiline", rid), _bool(msg, "keys", rid)
    path = _str(msg, "path", rid, limit=MAX_PATH_BYTES) if msg.get("path") is not None else None
    min_confidence = msg.get("min_confidence")
    if min_confidence is not None:
        if (
            isinstance(min_confidence, bool)
            or not isinstance(min_confidence, int | float)
            or not (0.0 <= float(min_confidence) <= 1.0)
        ):
            raise ProtocolError("bad_field", "'min_confidence' must be a number from 0 to 1", rid)
        min_confidence = float(min_confidence)
    drawn = _str(msg, "drawn", rid) if msg.get("drawn") is not None else None
    return CompleteRequest(
        rid, ctx, n, session, history_given, early, path, min_confidence, drawn, multiline, keys
    )


def _bool(msg: dict[str, Any], key: str, rid: int) -> bool:
    value = msg.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ProtocolError("bad_field", f"{key!r} must be true or false", rid)
    return value


def _parse_record(msg: dict[str, Any], rid: int) -> RecordRequest:
    paused = _bool(msg, "paused", rid)
    if paused and msg.get("cmd") not in (None, ""):
        raise ProtocolError("bad_field", "a paused record carries no 'cmd' (nothing of the line)", rid)
    if not paused and not isinstance(msg.get("cmd"), str):
        raise ProtocolError("bad_field", "'cmd' (a string) is required", rid)
    code = msg.get("exit")
    ts = msg.get("ts")
    if ts is not None and (
        isinstance(ts, bool) or not isinstance(ts, int | float) or not 0 <= ts <= TS_MAX  # NaN fails too
    ):
        raise ProtocolError(
            "bad_field", f"'ts' must be seconds since the epoch, 0 to {TS_MAX:.0f} (2100)", rid
        )
    duration = msg.get("duration")
    if duration is not None and (
        isinstance(duration, bool)
        or not isinstance(duration, int | float)
        or not 0 <= duration <= DURATION_MAX  # NaN fails too
    ):
        raise ProtocolError("bad_field", f"'duration' must be seconds, 0 to {DURATION_MAX:.0e}", rid)
    return RecordRequest(
        id=rid,
        cmd=_str(msg, "cmd", rid, limit=1 << 16),
        session=_str(msg, "session", rid, limit=256),
        exit=None if code is None else _exit(code, rid),
        cwd=_str(msg, "cwd", rid),
        git=_str(msg, "git", rid, limit=256),
        ts=None if ts is None else float(ts),
        env=_str(msg, "env", rid, limit=256),
        duration=None if duration is None else float(duration),
        paused=paused,
    )


def _parse_search(msg: dict[str, Any], rid: int) -> SearchRequest:
    mode = msg.get("mode", "global")
    if mode is None:
        mode = "global"
    if mode not in SEARCH_MODES:
        raise ProtocolError("bad_field", f"'mode' must be one of {', '.join(SEARCH_MODES)}", rid)
    return SearchRequest(
        id=rid,
        query=_str(msg, "query", rid, limit=MAX_QUERY_BYTES),
        mode=mode,
        n=_int(msg.get("n", 20), "n", rid, 0, MAX_SEARCH_RESULTS),
        session=_str(msg, "session", rid, limit=256),
        cwd=_str(msg, "cwd", rid),
        row=None if msg.get("row") is None else _int(msg["row"], "row", rid, 1, INT64_MAX),
    )


def _parse_forget(msg: dict[str, Any], rid: int) -> ForgetRequest:
    if not isinstance(msg.get("cmd"), str) or not msg["cmd"]:
        raise ProtocolError("bad_field", "'cmd' (the whole command line to forget) is required", rid)
    return ForgetRequest(rid, _str(msg, "cmd", rid, limit=1 << 16))


def reply(request_id: int | None, **fields: Any) -> dict[str, Any]:
    """A reply map: the request's id, the protocol version, then the fields."""
    return {"id": request_id, "protocol": PROTOCOL_VERSION, **fields}


def error_reply(request_id: int | None, code: str, message: str) -> dict[str, Any]:
    return reply(request_id, error={"code": code, "message": message})
