"""Hostile and careless clients against a real `calmd serve` over its real socket: oversized and
malformed messages, a fuzzer, clients that never read, clients that flood the inference queue, too
many clients, and a daemon out of file descriptors. The protocol's fault cases run in-process too,
each in milliseconds (tests/daemon/test_transport.py, which shares this module's cases); here a few of
them keep the real daemon honest.

The daemon runs the scripted engine (tests/support/scripted_engine.py), whose per-candidate delay makes
queueing visible. Timing assertions compare against what the unfair alternative would cost (a
FIFO queue of the flood: tens of seconds) with generous margins, never against a quiet machine.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calmd.protocol import MessageReader
from calmd.shell.client import CalmClient
from tests.support.daemon import Daemon, running_daemon
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them

# docs/protocol.md, "Limits": no reply may carry another code.
SPEC_CODES = {"bad_message", "bad_field", "unknown_op", "too_large", "disk_full", "forbidden", "internal"}
MIB = 1 << 20
NO_TRAINING = ("--train-threshold", "0")


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled_fd_count(pid: int) -> int:
    """The daemon's descriptors once the count holds still over ten reads: one it opens for a moment
    (a file read, a query's connection) counted in the limit would let a waiting client in."""
    counts: list[int] = []

    def settled() -> bool:
        counts.append(fd_count(pid))
        return len(counts) >= 10 and len(set(counts[-10:])) == 1

    wait_until(settled, "the daemon's descriptors to hold still", every=0.02)
    return counts[-1]


def socket_count(pid: int) -> int:
    """The daemon's open sockets: its listener and its connections."""
    found = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            found += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return found


def connect(d: Daemon, timeout: float = HANG_S) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(d.socket))
    return sock


def read_until_closed(sock: socket.socket) -> list[dict[str, Any]]:
    """Every reply until the daemon closes the connection (EOF, or a reset once the replies it
    sent are read: a Unix socket closed with unread input resets its peer)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    messages: list[dict[str, Any]] = []
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            return messages
        unpacker.feed(data)
        messages.extend(unpacker)


def exchange(d: Daemon, data: bytes, timeout: float = HANG_S) -> list[dict[str, Any]]:
    """Send `data` in one write, say we are done (shut down our side), read all replies."""
    with connect(d, timeout) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it may close on us
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        return read_until_closed(sock)


def check_reply_shapes(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        assert isinstance(message, dict) and message.get("protocol") == 1, message
        if "error" in message:
            assert message["error"]["code"] in SPEC_CODES, message
            assert message["error"]["code"] != "internal", message
            assert isinstance(message["error"]["message"], str) and message["error"]["message"]


def terminal(messages: list[dict[str, Any]], request_id: int) -> dict[str, Any]:
    """The last reply of `request_id` (done, ok, status or error)."""
    mine = [m for m in messages if m.get("id") == request_id]
    assert mine, f"request {request_id} was not answered: {messages}"
    last = mine[-1]
    assert any(k in last for k in ("done", "ok", "status", "error")), last
    return last


def no_tracebacks(d: Daemon) -> None:
    output = d.read_output()
    assert "Traceback" not in output, output[-3000:]


# --------------------------------------------------------------------------- size limit


# Headers that announce far more than 1 MiB; the daemon must refuse on the header alone.
HUGE_HEADERS = {
    "str32 of 1.2 GB": b"\xdb" + (1_200_000_000).to_bytes(4, "big"),
    "bin32 of 4 GiB": b"\xc6\xff\xff\xff\xff",
    "ext32 of 4 GiB": b"\xc9\xff\xff\xff\xff\x01",
    "array32 of 2^32-1 items": b"\xdd\xff\xff\xff\xff",
    "map32 of 2^32-1 pairs": b"\xdf\xff\xff\xff\xff",
    "a record whose cmd is a str32 of 1.2 GB": b"\x83"
    + pack("op") + pack("record") + pack("id") + pack(9) + pack("cmd")
    + b"\xdb" + (1_200_000_000).to_bytes(4, "big"),
    "an array16 of 65535 nils (more objects than a request holds)": b"\xdc\xff\xff" + b"\xc0" * 65535,
}  # fmt: skip


def test_declared_sizes_are_refused_from_the_header_and_memory_stays_flat(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=NO_TRAINING) as d:
        before = rss_mb(d.proc.pid)
        for name, header in HUGE_HEADERS.items():
            # a valid request first, then the huge one followed by 8 MiB of its "payload"
            messages = exchange(d, pack({"op": "status", "id": 1}) + header + b"x" * (8 * MIB))
            check_reply_shapes(messages)
            assert [m["id"] for m in messages] == [1, None], (name, messages)
            assert "status" in messages[0], name
            assert messages[1]["error"]["code"] == "too_large", (name, messages[1])
        grown = rss_mb(d.proc.pid) - before
        assert grown < 24, f"the daemon grew by {grown:.0f} MB refusing requests that declared gigabytes"
        with CalmClient(d.socket) as c:
            assert c.status()["status"]["history"]["commands"] == 0
        d.wait_for("closing a connection: too_large")
        no_tracebacks(d)


# --------------------------------------------------------------------------- malformed frames


FATAL_TAILS = {
    "bytes that are not msgpack": (b"\xc1\xc1 not msgpack", "bad_message"),
    "a header announcing 1.2 GB": (b"\xdb" + (1_200_000_000).to_bytes(4, "big") + b"z" * 1000, "too_large"),
}


def test_requests_before_a_fatal_frame_are_answered_before_its_error(tmp_path: Path) -> None:
    """One end-to-end case of tests/daemon/test_transport.py's, over the real socket: the replies come
    in order, the error last, then the daemon closes the connection."""
    garbage, code = FATAL_TAILS["bytes that are not msgpack"]
    requests = [
        {"op": "status", "id": 1},
        {"op": "record", "id": 2, "cmd": "make test", "session": "s"},
        {"op": "complete", "id": 3, "n": 2, "session": "s", "ctx": {"input": "gi"}},
        {"op": "complete", "id": 4, "n": 0, "ctx": {"input": "x"}},
        {"op": "frobnicate", "id": 5},
    ]
    with running_daemon(tmp_path, env={"CALMD_TEST_DELAY": "0.05"}, args=NO_TRAINING) as d:
        messages = exchange(d, b"".join(pack(r) for r in requests) + garbage)
        check_reply_shapes(messages)
        assert "status" in terminal(messages, 1)
        assert terminal(messages, 2)["stored"] is True
        assert [m.get("candidate") for m in messages if m["id"] == 3] == ["gimmit", "gimmand", None]
        assert terminal(messages, 4)["done"] is True
        assert terminal(messages, 5)["error"]["code"] == "unknown_op"
        assert messages[-1] == {"id": None, "protocol": 1, "error": messages[-1]["error"]}
        assert messages[-1]["error"]["code"] == code  # the error comes last, then the close
        no_tracebacks(d)


def _str8(raw: bytes) -> bytes:
    return b"\xd9" + bytes([len(raw)]) + raw


# (frame, expected code, expected id): each is well framed, so the connection goes on after it.
BAD_FRAMES: dict[str, tuple[bytes, str, int | None]] = {
    "a map with a list as a key": (b"\x81\x92\x01\x02\x03", "bad_message", None),
    "a map with an integer key": (pack({1: 2}), "bad_message", None),
    "a map with nil as a key": (b"\x81\xc0\x01", "bad_message", None),
    "a request nested 100 deep": (b"\x81" + pack("op") + b"\x91" * 100 + b"\xc0", "bad_message", None),
    "a top-level string": (pack("status"), "bad_message", None),
    "a top-level array": (pack([1, 2, 3]), "bad_message", None),
    "an id that is a float": (pack({"op": "status", "id": 1.0}), "bad_message", None),
    "an id that is an ext": (pack({"op": "status", "id": msgpack.ExtType(1, b"x")}), "bad_message", None),
    "a timestamp ext of a bad length": (b"\x82" + pack("op") + pack("status") + pack("id")
                                        + b"\xc7\x03\xff123", "bad_message", None),
    "invalid UTF-8 in cmd": (b"\x83" + pack("op") + pack("record") + pack("id") + pack(7) + pack("cmd")
                             + _str8(b"ls \xff\xfe"), "bad_field", 7),
    "invalid UTF-8 in ctx.input": (b"\x83" + pack("op") + pack("complete") + pack("id") + pack(8)
                                   + pack("ctx") + b"\x81" + pack("input") + _str8(b"\xc3\x28"),
                                   "bad_field", 8),
    "invalid UTF-8 in a key": (b"\x83" + pack("op") + pack("status") + pack("id") + pack(9) + _str8(b"\xff")
                               + pack(1), "bad_field", 9),
    "a bin where cmd's string goes": (pack({"op": "record", "id": 10, "cmd": b"ls"}), "bad_field", 10),
    "an op that is not a string": (pack({"op": 3, "id": 11}), "bad_message", 11),
    "an unknown op": (pack({"op": "rm -rf", "id": 12}), "unknown_op", 12),
    "a PATH that is a list": (pack({"op": "complete", "id": 13, "ctx": {"input": "l"}, "path": ["/bin"]}),
                              "bad_field", 13),
    "a PATH over 8 KiB": (pack({"op": "complete", "id": 14, "ctx": {"input": "l"}, "path": "/b:" * 3000}),
                          "bad_field", 14),
    "an env that is a map": (pack({"op": "record", "id": 15, "cmd": "ls", "env": {"venv": "x"}}),
                             "bad_field", 15),
}  # fmt: skip


# --------------------------------------------------------------------------- field ranges


OUT_OF_RANGE: list[tuple[dict[str, Any], int | None]] = [
    ({"op": "record", "id": 1, "cmd": "ls", "exit": 2**63}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "exit": 2**64 - 1}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "exit": -(2**63)}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "exit": 2**31}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "exit": True}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "ts": 2**64 - 1}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "ts": -1.0}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "ts": math.nan}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "ts": math.inf}, 1),
    ({"op": "record", "id": 1, "cmd": "ls", "ts": 999999999999}, 1),  # the year 33658 (issue 30)
    ({"op": "record", "id": 1, "cmd": "ls", "ts": 4102444801}, 1),  # 2100 and a second
    ({"op": "complete", "id": 1, "ctx": {"input": "", "history": [{"cmd": "ls", "exit": 2**63}]}}, 1),
    ({"op": "complete", "id": 1, "n": -1, "ctx": {"input": ""}}, 1),
    ({"op": "complete", "id": 1, "n": 2**64 - 1, "ctx": {"input": ""}}, 1),
    ({"op": "complete", "id": 1, "n": 33, "ctx": {"input": ""}}, 1),
    ({"op": "status", "id": 2**64 - 1}, None),
    ({"op": "status", "id": 2**63}, None),
]


# --------------------------------------------------------------------------- the fuzzer


SAFE_OPS = ["complete", "record", "status", "complete ", "", "STATUS", "reload\x00"]  # never shutdown/train

leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=40)
    | st.binary(max_size=40)
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.text(max_size=8) | st.integers(-5, 5)
    return st.lists(children, max_size=6) | st.dictionaries(keys, children, max_size=6)


values = st.recursive(leaves, _containers, max_leaves=30)
contexts = st.fixed_dictionaries(
    {},
    optional={
        "input": st.text(max_size=30) | values,
        "cwd": st.text(max_size=30) | values,
        "history": st.lists(st.fixed_dictionaries({"cmd": st.text(max_size=20) | values},
                                                  optional={"exit": values}), max_size=4) | values,
        "completions": st.lists(st.text(max_size=10), max_size=4) | values,
    },
)  # fmt: skip
requests = st.fixed_dictionaries(
    {"op": st.sampled_from(SAFE_OPS), "id": st.integers(min_value=-(2**63), max_value=2**64 - 1) | values},
    optional={"n": st.integers(-3, 40) | values, "session": st.text(max_size=8) | values,
              "ctx": contexts | values, "cmd": st.text(max_size=30) | values, "exit": values, "ts": values,
              "cwd": values},
)  # fmt: skip


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A request-like map, packed, then maybe damaged: bytes flipped, cut short, garbage appended."""
    frame = bytearray(pack(draw(requests)))
    damage = draw(st.sampled_from(["none", "none", "flip", "cut", "append", "header"]))
    if damage == "flip":
        for _ in range(draw(st.integers(1, 4))):
            frame[draw(st.integers(0, len(frame) - 1))] = draw(st.integers(0, 255))
    elif damage == "cut":
        del frame[draw(st.integers(1, len(frame))) :]
    elif damage == "append":
        frame += draw(st.binary(min_size=1, max_size=16))
    elif damage == "header":
        frame[: draw(st.integers(0, 1))] = draw(st.sampled_from(list(HUGE_HEADERS.values())[:6]))
    return bytes(frame)


def test_fuzzed_frames_get_typed_replies_and_never_hurt_the_daemon(tmp_path: Path) -> None:
    """Every fuzzed frame, followed by a cheap sentinel request (a complete of n=0): the sentinel
    is answered, or the damaged frame (which may have swallowed it) got an error reply; no reply
    carries a code outside docs/protocol.md or `internal`; no traceback; the daemon survives it all."""
    sentinel_id = 2**62 + 7
    sentinel = pack({"op": "complete", "id": sentinel_id, "n": 0, "ctx": {"input": ""}})
    with running_daemon(tmp_path, args=NO_TRAINING) as d:
        # 400 more, in-process: tests/daemon/test_transport.py; these keep the real socket honest
        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(frame=frames())
        def check(frame: bytes) -> None:
            messages = exchange(d, frame + sentinel)
            check_reply_shapes(messages)
            answered = any(m.get("id") == sentinel_id and m.get("done") for m in messages)
            assert answered or any("error" in m for m in messages), messages

        check()
        assert d.proc.poll() is None
        with CalmClient(d.socket) as c:
            assert c.status()["status"]["protocol"] == 1
        no_tracebacks(d)


@settings(max_examples=100, deadline=None)
@given(objects=st.lists(values, min_size=1, max_size=5), cuts=st.lists(st.integers(0, 1 << 16), max_size=8))
def test_the_frame_reader_cuts_any_split_stream_into_the_objects_sent(
    objects: list[Any], cuts: list[int]
) -> None:
    """The daemon's framing alone: however the bytes arrive, each object comes out whole, once."""
    data = b"".join(pack(o) for o in objects)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    reader, frames = MessageReader(), []
    for a, b in itertools.pairwise(points):
        reader.feed(data[a:b])
        while (frame := reader.next_message()) is not None:
            frames.append(frame)
    assert frames == [pack(o) for o in objects]
    assert reader.buffered == 0


# --------------------------------------------------------------------------- backpressure


def test_a_client_that_never_reads_is_bounded_then_closed_and_its_memory_returned(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=(*NO_TRAINING, "--reply-timeout", "2")) as d:
        pid = d.proc.pid
        with CalmClient(d.socket) as warm:  # the first status starts the store's threads
            warm.status()
        rss_before, fds_before = rss_mb(pid), fd_count(pid)
        flood = connect(d)
        flood.setblocking(False)
        batch = pack({"op": "status", "id": 1}) * 512  # status replies are ~100x their request
        sent, blocked_since = 0, None
        while blocked_since is None or time.monotonic() - blocked_since < 1.0:
            try:
                sent += flood.send(batch)
                blocked_since = None
            except BlockingIOError:
                blocked_since = blocked_since or time.monotonic()
                time.sleep(0.01)
            assert sent < 64 * MIB, "the daemon kept reading a client that reads nothing"
        peak = rss_mb(pid)
        with CalmClient(d.socket) as other:  # everyone else is still served at once
            t0 = time.monotonic()
            assert other.status()["status"]["protocol"] == 1
            assert time.monotonic() - t0 < 5.0  # a daemon held by the flood: the client's 10 s
        d.wait_for("replies left unread for 2 s")
        flood.setblocking(True)
        messages = read_until_closed(flood)  # what the daemon had buffered, then its error
        flood.close()
        assert messages[-1]["error"]["code"] == "too_large"
        assert "left unread" in messages[-1]["error"]["message"]
        assert len(messages) < sent // len(pack({"op": "status", "id": 1}))  # it stopped reading
        wait_until(lambda: fd_count(pid) <= fds_before, "the connection's descriptor released")
        assert peak - rss_before < 32, (
            f"{sent} bytes of unread requests grew the daemon by {peak - rss_before} MB"
        )
        assert rss_mb(pid) - rss_before < 32


# --------------------------------------------------------------------------- fairness


def _shell_latencies(d: Daemon, count: int) -> list[float]:
    """A well-behaved shell: one complete at a time, seconds each."""
    times = []
    with CalmClient(d.socket) as shell:
        for i in range(count):
            t0 = time.monotonic()
            replies = list(shell.complete("git" + "x" * i, n=1, session="shell"))
            times.append(time.monotonic() - t0)
            assert replies[0]["candidate"].startswith("git") and "cancelled" not in replies[-1]
    return times


@pytest.mark.parametrize("flood", ["one session", "no session", "a new session each"])
def test_a_flooding_client_does_not_delay_another_shell(tmp_path: Path, flood: str) -> None:
    # 120 completes of 5 candidates at 10 ms each: 6 s of work queued ahead of the shell in FIFO
    # order; with turns the shell waits for one flood job (50 ms) at most.
    count = 120
    with running_daemon(tmp_path, env={"CALMD_TEST_DELAY": "0.01"}, args=NO_TRAINING) as d:
        flooder = connect(d, timeout=300)
        for i in range(count):
            session = {"one session": "flood", "no session": "", "a new session each": f"f{i}"}[flood]
            flooder.sendall(
                pack({"op": "complete", "id": i, "n": 5, "session": session, "ctx": {"input": "ls"}})
            )
        shell = _shell_latencies(d, 5)
        with CalmClient(d.socket) as other:  # status and record do not queue behind completions
            t0 = time.monotonic()
            other.status()
            other.record("make", session="x")
            quick = time.monotonic() - t0
        flooder.shutdown(socket.SHUT_WR)
        flooded = read_until_closed(flooder)
        flooder.close()
        check_reply_shapes(flooded)
        done = {m["id"]: m for m in flooded if m.get("done")}
        assert sorted(done) == list(range(count)), "every flood request gets its done"
        assert max(shell) < 2.5, f"the shell waited {max(shell):.2f} s behind a flood of {count}"
        assert quick < 2.5
        if flood == "one session":  # only the newest request of a session is worth answering
            assert "cancelled" not in done[count - 1]
            assert sum(1 for m in flooded if m.get("id") == count - 1 and "candidate" in m) == 5
            assert sum(1 for m in done.values() if m.get("cancelled")) >= count - 10
        else:  # nothing supersedes them: all are answered in full, in turns with the shell
            assert not any(m.get("cancelled") for m in done.values())
            assert sum(1 for m in flooded if "candidate" in m) == 5 * count


def test_a_shell_preempts_a_flood_job_that_has_sent_nothing_and_nothing_is_sent_twice(tmp_path: Path) -> None:
    # Flood jobs of 2 candidates at 0.5 s each: without preemption the shell's one-candidate
    # request waits for the running flood job (1 s) and the flood's first candidate comes first.
    with running_daemon(tmp_path, env={"CALMD_TEST_DELAY": "0.5"}, args=NO_TRAINING) as d:
        flooder = connect(d, timeout=HANG_S)
        flooder.sendall(b"".join(
            pack({"op": "complete", "id": i, "n": 2, "session": f"flood-{i}", "ctx": {"input": "ls"}})
            for i in range(3)
        ))  # fmt: skip
        with CalmClient(d.socket) as shell:
            replies = list(shell.complete("git", n=1, session="shell"))
        assert replies[0]["candidate"] == "gitmmit" and "cancelled" not in replies[-1]
        flooder.setblocking(False)
        with pytest.raises(BlockingIOError):  # the shell went first: the flood has sent nothing yet
            flooder.recv(65536)
        flooder.setblocking(True)
        flooder.shutdown(socket.SHUT_WR)
        flooded = read_until_closed(flooder)
        flooder.close()
        for i in range(3):  # the preempted job ran again from the start; nothing came twice
            assert [m.get("candidate") for m in flooded if m["id"] == i] == ["lsmmit", "lsmmand", None]
            assert "cancelled" not in terminal(flooded, i)


def test_many_clients_pipelining_get_every_sessions_newest_answered(tmp_path: Path) -> None:
    clients, per_client, sessions = 16, 60, 3
    errors: list[str] = []
    newest_ok: list[bool] = []

    def client(k: int, d: Daemon) -> None:
        try:
            with connect(d, timeout=HANG_S) as sock:
                newest: dict[str, int] = {}
                for i in range(per_client):
                    session = f"c{k}-s{i % sessions}"
                    rid = k * 1000 + i
                    newest[session] = rid
                    sock.sendall(pack({"op": "complete", "id": rid, "n": 2, "session": session,
                                       "ctx": {"input": f"cmd{i}"}}))  # fmt: skip
                sock.shutdown(socket.SHUT_WR)
                messages = read_until_closed(sock)
            errors.extend(str(m) for m in messages if "error" in m)
            answered = {m["id"] for m in messages if m.get("done")}
            if answered != {k * 1000 + i for i in range(per_client)}:
                errors.append(f"client {k}: {per_client - len(answered)} requests unanswered")
            for rid in newest.values():
                cands = [m for m in messages if m["id"] == rid and "candidate" in m]
                newest_ok.append(len(cands) == 2 and not terminal(messages, rid).get("cancelled"))
        except Exception as exc:  # reported by the main thread
            errors.append(repr(exc))

    with running_daemon(tmp_path, env={"CALMD_TEST_DELAY": "0.002"}, args=NO_TRAINING) as d:
        threads = [threading.Thread(target=client, args=(k, d)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=HANG_S)
        assert errors == []
        assert len(newest_ok) == clients * sessions and all(newest_ok)
        no_tracebacks(d)


# --------------------------------------------------------------------------- connection limits


@contextlib.contextmanager
def open_clients(d: Daemon, count: int) -> Iterator[list[CalmClient]]:
    clients: list[CalmClient] = []
    try:
        for _ in range(count):
            clients.append(CalmClient(d.socket))
        yield clients
    finally:
        for c in clients:
            c.close()


def test_connections_over_the_cap_get_an_error_and_are_logged(tmp_path: Path) -> None:
    def served_again() -> bool:
        with CalmClient(d.socket) as again:
            try:
                return "status" in again.status()
            except ConnectionError:
                return False

    with running_daemon(tmp_path, args=(*NO_TRAINING, "--max-connections", "4")) as d:
        with open_clients(d, 4) as clients:
            for c in clients:
                assert c.status()["status"]["protocol"] == 1
            with connect(d) as extra:
                refused = read_until_closed(extra)
            assert refused[0]["error"]["code"] == "too_large"
            assert "4 connections" in refused[0]["error"]["message"]
            clients[0].close()
            wait_until(served_again, "a new client served once the daemon saw the close")
        d.wait_for("refused a client: 4 connections open, the limit")


def test_a_burst_of_clients_beyond_the_old_backlog_of_64_is_queued_not_refused(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=NO_TRAINING) as d:
        d.proc.send_signal(signal.SIGSTOP)  # nothing is accepted: every connect waits in the backlog
        burst: list[socket.socket] = []
        try:
            for _ in range(200):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.setblocking(False)
                burst.append(sock)
                sock.connect(str(d.socket))  # BlockingIOError here: the backlog is full
            d.proc.send_signal(signal.SIGCONT)
            for i, sock in enumerate(burst):
                sock.setblocking(True)
                sock.settimeout(HANG_S)
                sock.sendall(pack({"op": "complete", "id": i, "n": 0, "ctx": {"input": ""}}))
            for i, sock in enumerate(burst):
                unpacker = msgpack.Unpacker(raw=False)
                unpacker.feed(sock.recv(65536))
                reply = next(unpacker)
                assert reply["id"] == i and reply["done"] is True
        finally:
            d.proc.send_signal(signal.SIGCONT)
            for sock in burst:
                sock.close()


def test_the_default_cap_follows_a_low_fd_limit(tmp_path: Path) -> None:
    # RLIMIT_NOFILE 100 leaves 36 connections after the daemon's reserve of 64
    with running_daemon(tmp_path, args=NO_TRAINING, prefix=("prlimit", "--nofile=100:100", "--")) as d:
        with open_clients(d, 36) as clients:
            for c in clients:
                c.status()
            with connect(d) as extra:
                assert read_until_closed(extra)[0]["error"]["code"] == "too_large"
        no_tracebacks(d)


def test_out_of_descriptors_is_logged_and_waiting_clients_are_served_once_fds_free(tmp_path: Path) -> None:
    # --no-import: no first-start import in the worker process, whose pipes and the catch-up's
    # connections opened and closed meanwhile would free a descriptor under the limit (a waiting
    # client was once served while it should wait)
    with running_daemon(tmp_path, args=(*NO_TRAINING, "--no-import")) as d:
        pid = d.proc.pid
        sockets = socket_count(pid)
        with CalmClient(d.socket) as warm:
            warm.status()
        # the limit is taken once the daemon has closed the warm-up connection
        wait_until(lambda: socket_count(pid) <= sockets, "the daemon to close the warm-up connection")
        limit = settled_fd_count(pid) + 6
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))  # lowered under the running daemon
        first: list[CalmClient] = []
        waiting: list[CalmClient] = []
        try:
            first = [CalmClient(d.socket) for _ in range(6)]
            for c in first:
                assert "status" in c.status()
            waiting = [CalmClient(d.socket) for _ in range(4)]  # they sit in the backlog
            for c in waiting:
                c.send("status")
            d.wait_for("cannot accept clients: Too many open files")
            for c in waiting:  # neither served nor reset: waiting
                c._sock.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    c.read_message()
                c._sock.settimeout(HANG_S)
            for c in first:
                c.close()
            for c in waiting:  # descriptors are free again: accepted and answered
                assert "status" in c.read_message()
        finally:
            for c in first + waiting:
                c.close()
        no_tracebacks(d)
