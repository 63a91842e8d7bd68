"""The calmd wire protocol (calmd.md; docs/protocol.md): msgpack maps over a Unix stream socket.

Every request is a map with `op` and an integer `id`; every reply carries the same `id` and
`protocol`. Messages are concatenated on the stream (msgpack is self-delimiting). This module
validates untrusted requests into typed objects and builds replies; it never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20  # a request larger than this is refused (and the connection closed)
MAX_CANDIDATES = 32
MAX_INPUT_BYTES = 4096
MAX_LIST_ITEMS = 256  # history/completions lists sent by a client; the template caps them at 15
# Candidate replies carry `confidence`, the calibrated probability that the candidate is the command
# the user runs (docs/quality.md). The shells show ghost text only for a top candidate at or above
# this (CALM_MIN_CONFIDENCE overrides it); cycling still reaches every candidate.
DEFAULT_MIN_CONFIDENCE = 0.5


class ProtocolError(Exception):
    """An invalid request: becomes an error reply; the daemon carries on."""

    def __init__(self, code: str, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class CompleteRequest:
    id: int
    ctx: dict[str, Any]
    n: int = 5
    session: str = ""
    history_given: bool = False  # False: the daemon fills history from its store


@dataclass(frozen=True)
class RecordRequest:
    id: int
    cmd: str
    session: str = ""
    exit: int | None = None
    cwd: str = ""
    git: str = ""
    ts: float | None = None


@dataclass(frozen=True)
class SimpleRequest:
    """status, reload, train, shutdown: no arguments."""

    id: int
    op: str
    extra: dict[str, Any] = field(default_factory=dict)


Request = CompleteRequest | RecordRequest | SimpleRequest
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


def _int(value: Any, key: str, rid: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError("bad_field", f"{key!r} must be an integer", rid)
    return value


def parse_request(msg: Any) -> Request:
    """Validate one decoded message. Raises ProtocolError with the request id when it has one."""
    if not isinstance(msg, dict):
        raise ProtocolError("bad_message", f"a request must be a map, got {type(msg).__name__}")
    raw_id = msg.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, int):
        raise ProtocolError("bad_message", "every request needs an integer 'id'")
    rid = raw_id
    op = msg.get("op")
    if not isinstance(op, str):
        raise ProtocolError("bad_message", "every request needs a string 'op'", rid)
    if op == "complete":
        return _parse_complete(msg, rid)
    if op == "record":
        return _parse_record(msg, rid)
    if op in SIMPLE_OPS:
        return SimpleRequest(rid, op)
    raise ProtocolError("unknown_op", f"unknown op {op!r}", rid)


def _parse_complete(msg: dict[str, Any], rid: int) -> CompleteRequest:
    n = _int(msg.get("n", 5), "n", rid)
    if not 0 <= n <= MAX_CANDIDATES:
        raise ProtocolError("bad_field", f"'n' must be 0-{MAX_CANDIDATES}", rid)
    raw_ctx = msg.get("ctx")
    if not isinstance(raw_ctx, dict):
        raise ProtocolError("bad_field", "'ctx' must be a map with at least 'input'", rid)
    if "input" not in raw_ctx:
        raise ProtocolError("missing_field", "'ctx.input' is required", rid)
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
                {"cmd": _str(item, "cmd", rid), "exit": None if code is None else _int(code, "exit", rid)}
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
    return CompleteRequest(rid, ctx, n, session, history_given)


def _parse_record(msg: dict[str, Any], rid: int) -> RecordRequest:
    if not isinstance(msg.get("cmd"), str):
        raise ProtocolError("missing_field", "'cmd' (a string) is required", rid)
    code = msg.get("exit")
    ts = msg.get("ts")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts)):
        raise ProtocolError("bad_field", "'ts' must be a number (seconds since the epoch)", rid)
    return RecordRequest(
        id=rid,
        cmd=_str(msg, "cmd", rid, limit=1 << 16),
        session=_str(msg, "session", rid, limit=256),
        exit=None if code is None else _int(code, "exit", rid),
        cwd=_str(msg, "cwd", rid),
        git=_str(msg, "git", rid, limit=256),
        ts=None if ts is None else float(ts),
    )


def reply(request_id: int | None, **fields: Any) -> dict[str, Any]:
    """A reply map: the request's id, the protocol version, then the fields."""
    return {"id": request_id, "protocol": PROTOCOL_VERSION, **fields}


def error_reply(request_id: int | None, code: str, message: str) -> dict[str, Any]:
    return reply(request_id, error={"code": code, "message": message})
