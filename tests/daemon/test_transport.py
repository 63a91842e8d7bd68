"""Protocol faults in-process: the transport and the service over a fake socket (tests/support/inprocess.py),
each case in milliseconds. The real daemon over its real socket: tests/daemon/test_faults_protocol.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings

from calmd.daemon.transport import MAX_PENDING_PER_CONNECTION
from tests.daemon.test_faults_protocol import (
    BAD_FRAMES,
    FATAL_TAILS,
    HUGE_HEADERS,
    MIB,
    OUT_OF_RANGE,
    check_reply_shapes,
    frames,
    pack,
    terminal,
)
from tests.support.inprocess import Client, Harness


def run(home: Path, body: Callable[[Harness], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        async with Harness(home, **kw) as h:
            await body(h)

    asyncio.run(main())


async def exchange(h: Harness, data: bytes, *, chunk: int = 0) -> tuple[Client, list[dict[str, Any]]]:
    """`data` on a new connection (in chunks of `chunk` bytes, else at once), the client's side then
    shut (EOF); every reply until the connection closes."""
    client = h.client()
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] if chunk else [data]
    for piece in pieces:
        client.send(piece)
    client.conn.eof_received()
    await h.settle()
    return client, client.replies()


def test_a_request_split_in_any_number_of_pieces_is_answered_once(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        # no session: neither supersedes the other, both are answered in full
        data = b"".join(pack({"op": "complete", "id": i, "n": 2, "ctx": {"input": "gi"}}) for i in (7, 8))
        for chunk in (1, 3, len(data) // 2, len(data)):
            client, replies = await exchange(h, data, chunk=chunk)
            for i in (7, 8):
                got = [m.get("candidate") for m in replies if m["id"] == i]
                assert got == ["gimmit", "gimmand", None], (chunk, i)
            assert client.transport.closing  # EOF: answered, then closed

    run(tmp_path, body)


@pytest.mark.parametrize("name", HUGE_HEADERS)
def test_declared_sizes_are_refused_from_the_header(tmp_path: Path, name: str) -> None:
    async def body(h: Harness) -> None:
        client, replies = await exchange(h, pack({"op": "status", "id": 1}) + HUGE_HEADERS[name] + b"x" * MIB)
        check_reply_shapes(replies)
        assert [m["id"] for m in replies] == [1, None] and "status" in replies[0]
        assert replies[1]["error"]["code"] == "too_large"
        assert client.transport.closing and h.store is not None and h.store.count() == 0
        assert client.conn.messages.buffered == 0  # nothing of the refused request is kept

    run(tmp_path, body)


def test_a_request_that_grows_past_1_mib_is_refused_and_one_just_under_is_served(tmp_path: Path) -> None:
    growing = b"\xdc\x00\x3c" + (b"\xda" + (20_000).to_bytes(2, "big") + b"y" * 20_000) * 60
    ctx = {"input": "ls", "completions": ["c" * 4000] * 256}
    under = pack({"op": "complete", "id": 2, "n": 1, "ctx": ctx})
    assert MIB - 30_000 < len(under) < MIB

    async def body(h: Harness) -> None:
        _, replies = await exchange(h, growing, chunk=4096)
        assert [m["error"]["code"] for m in replies] == ["too_large"], replies
        _, replies = await exchange(h, under, chunk=65536)
        assert [m.get("candidate") for m in replies] == ["lsmmit", None] and replies[-1]["done"]

    run(tmp_path, body)


@pytest.mark.parametrize("tail", FATAL_TAILS, ids=list(FATAL_TAILS))
def test_requests_before_a_fatal_message_are_answered_before_its_error(tmp_path: Path, tail: str) -> None:
    garbage, code = FATAL_TAILS[tail]
    requests = [
        {"op": "status", "id": 1},
        {"op": "record", "id": 2, "cmd": "make test", "session": "s"},
        {"op": "complete", "id": 3, "n": 2, "session": "s", "ctx": {"input": "gi"}},
        {"op": "complete", "id": 4, "n": 0, "ctx": {"input": "x"}},
        {"op": "frobnicate", "id": 5},
    ]

    async def body(h: Harness) -> None:
        client, replies = await exchange(h, b"".join(pack(r) for r in requests) + garbage)
        check_reply_shapes(replies)
        assert "status" in terminal(replies, 1)
        assert terminal(replies, 2)["stored"] is True
        assert [m.get("candidate") for m in replies if m["id"] == 3] == ["gimmit", "gimmand", None]
        assert terminal(replies, 4)["done"] is True
        assert terminal(replies, 5)["error"]["code"] == "unknown_op"
        assert replies[-1]["id"] is None and replies[-1]["error"]["code"] == code  # last, then closed
        assert client.transport.closing

    run(tmp_path, body)


def test_well_framed_bad_messages_get_typed_errors_and_the_connection_goes_on(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        client = h.client()
        for name, (message, code, request_id) in BAD_FRAMES.items():
            client.send(message)
            client.send(pack({"op": "status", "id": 99}))
            await h.settle()
            error, status = client.replies()
            assert error["error"]["code"] == code and error["id"] == request_id, (name, error)
            assert status["id"] == 99 and "status" in status, name  # the same connection still works
        assert h.listener.errors == len(BAD_FRAMES)
        assert h.store is not None and h.store.count() == 0
        client.send(BAD_FRAMES["invalid UTF-8 in ctx.input"][0])
        await h.settle()
        assert client.replies()[0]["error"]["message"] == "field 'ctx.input' is not valid UTF-8"

    run(tmp_path, body)


def test_integers_out_of_range_are_bad_field(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        client = h.client()
        for request, request_id in OUT_OF_RANGE:
            client.send(pack(request))
            await h.settle()
            (message,) = client.replies()
            assert message.get("error", {}).get("code") == "bad_field", (request, message)
            assert message["id"] == request_id, (request, message)
        client.send(pack({"op": "status", "id": -(2**63)}))
        await h.settle()
        assert client.replies()[0]["id"] == -(2**63)  # every int64 id is echoed
        # every status a shell can report, and the extremes of a C int, are stored as sent
        kept = [0, 1, 127, 130, 255, 300, -1, 2**31 - 1, -(2**31)]
        for i, code in enumerate(kept):  # one at a time, as a shell records
            client.send(pack({"op": "record", "id": 100 + i, "cmd": f"cmd{i}", "exit": code, "session": "s"}))
            await h.settle()
        assert all(m["stored"] for m in client.replies())
        assert h.store is not None and [r.exit for r in h.store.recent(limit=len(kept))] == kept

    run(tmp_path, body)


def test_fuzzed_messages_get_typed_replies(tmp_path: Path) -> None:
    """Every fuzzed message (tests/daemon/test_faults_protocol.py's generator), then a sentinel: the
    sentinel is answered, or the damaged message (which may have swallowed it) got an error; no
    reply carries a code outside docs/protocol.md, nor `internal`."""
    sentinel_id = 2**62 + 7
    sentinel = pack({"op": "complete", "id": sentinel_id, "n": 0, "ctx": {"input": ""}})
    loop = asyncio.new_event_loop()
    harness = Harness(tmp_path)
    h = loop.run_until_complete(harness.__aenter__())
    try:

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(frame=frames())
        def check(frame: bytes) -> None:
            _, replies = loop.run_until_complete(exchange(h, frame + sentinel))
            check_reply_shapes(replies)
            answered = any(m.get("id") == sentinel_id and m.get("done") for m in replies)
            assert answered or any("error" in m for m in replies), replies

        check()
    finally:
        loop.run_until_complete(harness.__aexit__(None, None, None))
        loop.close()


def test_a_connection_stops_reading_at_its_bound_of_requests_in_progress(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        client = h.client()
        gate = asyncio.Event()
        real = h.service.handle

        async def slow(message: Any, conn: Any) -> None:
            await gate.wait()
            await real(message, conn)

        h.listener.handler.handle = slow  # type: ignore[method-assign]
        burst = b"".join(pack({"op": "status", "id": i}) for i in range(MAX_PENDING_PER_CONNECTION + 10))
        client.send(burst)
        await asyncio.sleep(0)
        assert client.conn.pending == MAX_PENDING_PER_CONNECTION and not client.transport.reading
        gate.set()
        await h.settle()
        assert client.transport.reading  # answered: reading again, and the rest was answered too
        assert sorted(m["id"] for m in client.replies()) == list(range(MAX_PENDING_PER_CONNECTION + 10))

    run(tmp_path, body)


def test_a_client_that_leaves_its_replies_unread_is_paused_then_closed(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        client = h.client()
        client.send(pack({"op": "status", "id": 1}))
        await h.settle()
        client.transport.unread = 300_000
        client.conn.pause_writing()  # the transport's buffer passed REPLY_BUFFER_HIGH
        assert not client.transport.reading
        client.send(pack({"op": "status", "id": 2}))  # read by the kernel, not by the daemon
        await h.settle()
        assert [m["id"] for m in client.replies()] == [1]
        await asyncio.sleep(0.25)  # reply_timeout_s
        (error,) = client.replies()
        assert error["error"]["code"] == "too_large" and "left unread" in error["error"]["message"]
        assert client.transport.closing

    run(tmp_path, body, reply_timeout_s=0.2)


def test_the_end_of_the_stream_inside_a_request_is_a_bad_message(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        half = pack({"op": "status", "id": 3})[:-2]
        client, replies = await exchange(h, pack({"op": "status", "id": 1}) + half)
        assert [m["id"] for m in replies] == [1, None]
        ended = {"code": "bad_message", "message": "the connection ended inside a request"}
        assert replies[1]["error"] == ended
        assert client.transport.closing

    run(tmp_path, body)


def test_a_closed_connection_takes_its_jobs_with_it(tmp_path: Path) -> None:
    async def body(h: Harness) -> None:
        client = h.client()
        closed: list[Any] = []
        real = h.service.connection_closed
        h.listener.handler.connection_closed = (  # type: ignore[method-assign]
            lambda conn: (closed.append(conn), real(conn))
        )
        client.send(msgpack.packb({"op": "complete", "id": 1, "n": 5, "session": "s", "ctx": {"input": "x"}}))
        client.conn.close()
        await h.settle()
        assert client.transport.closing and closed == [client.conn]  # its jobs were cancelled with it
        assert h.scheduler.waiting == 0

    run(tmp_path, body)
