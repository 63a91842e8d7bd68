"""A stand-in for calmd on a real Unix socket, whose answers to `complete` a test scripts.

The shell side needs replies a real daemon sends only at its own pace or not yet at all: the
`early` message and `confidence` fields of docs/protocol.md, a candidate held back until the test
has looked at the screen, a reply without `confidence` (an older daemon). The stand-in speaks the
same framing (concatenated msgpack maps, `id` and `protocol` in every reply) and answers `record`
and `status` too, so the helper cannot tell it from calmd.

    def script(request):          # the `complete` request as received
        yield {"early": "git status", "confidence": 0.9}
        yield release             # a threading.Event: wait for the test
        yield {"candidate": "git stash", "score": -1.0, "confidence": 0.4}
                                  # `done` follows by itself
    with FakeDaemon(socket_path, script) as fake: ...
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import msgpack

from calmd.protocol import DEFAULT_MIN_CONFIDENCE, PROTOCOL_VERSION
from tests.support.waiting import HANG_S, wait_until

# Either side of the default threshold, whatever value the daemon side gives it.
SURE = round(min(1.0, DEFAULT_MIN_CONFIDENCE + 0.1), 3)
UNSURE = round(max(0.0, DEFAULT_MIN_CONFIDENCE - 0.1), 3)

Step = dict[str, Any] | float | threading.Event  # a reply's fields, seconds to sleep, a gate
Script = Callable[[dict[str, Any]], Iterable[Step]]


def candidates(*pairs: tuple[str, float | None]) -> list[dict[str, Any]]:
    """Candidate replies from (text, confidence) pairs, best first; None: no confidence field."""
    out = []
    for i, (text, confidence) in enumerate(pairs):
        reply: dict[str, Any] = {"candidate": text, "score": -float(i)}
        if confidence is not None:
            reply["confidence"] = confidence
        out.append(reply)
    return out


class FakeDaemon:
    def __init__(self, path: Path, script: Script) -> None:
        self.path = path
        self.script = script
        self.requests: list[dict[str, Any]] = []  # every `complete` received, in order
        self.records: list[str] = []
        self.gates: list[threading.Event] = []  # set on close, so that no script thread hangs
        self._lock = threading.Lock()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(16)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def at_home(cls, home: Path, script: Script) -> FakeDaemon:
        """On the socket that the shells and helpers of tests.support.daemon.daemon_env(home) use."""
        from tests.support.daemon import daemon_env

        return cls(Path(daemon_env(home)["CALMD_SOCKET"]), script)

    def wait_requests(self, count: int, timeout: float = HANG_S) -> list[dict[str, Any]]:
        """The `complete` requests once at least `count` have come."""
        wait_until(lambda: len(self.requests) >= count, f"{count} complete requests", ceiling=timeout,
                   every=0.005, report=lambda: f"{len(self.requests)} came")  # fmt: skip
        return self.requests

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        lock = threading.Lock()  # replies of concurrent scripts are written whole
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                unpacker.feed(data)
                for request in unpacker:
                    self._answer(conn, lock, request)

    def _send(self, conn: socket.socket, lock: threading.Lock, rid: Any, fields: dict[str, Any]) -> None:
        frame = msgpack.packb({"id": rid, "protocol": PROTOCOL_VERSION, **fields}, use_bin_type=True)
        with lock, contextlib.suppress(OSError):
            conn.sendall(frame)

    def _answer(self, conn: socket.socket, lock: threading.Lock, request: dict[str, Any]) -> None:
        rid, op = request.get("id"), request.get("op")
        if op == "record":
            self.records.append(str(request.get("cmd")))
            self._send(conn, lock, rid, {"ok": True, "stored": True})
        elif op == "status":
            self._send(conn, lock, rid, {"status": {"pid": os.getpid(), "fake": True}})
        elif op == "complete":
            with self._lock:
                self.requests.append(request)
            threading.Thread(target=self._complete, args=(conn, lock, request), daemon=True).start()
        else:
            self._send(conn, lock, rid, {"error": {"code": "unknown_op", "message": str(op)}})

    def _complete(self, conn: socket.socket, lock: threading.Lock, request: dict[str, Any]) -> None:
        rid = request.get("id")
        for step in self.script(request):
            if isinstance(step, threading.Event):
                self.gates.append(step)
                step.wait(HANG_S)  # the test opens it (close() opens them all)
            elif isinstance(step, float | int):
                time.sleep(step)
            else:
                self._send(conn, lock, rid, step)
        self._send(conn, lock, rid, {"done": True, "ms": 0.1})

    def close(self) -> None:
        self._closed = True
        for gate in self.gates:
            gate.set()
        self._server.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> FakeDaemon:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
