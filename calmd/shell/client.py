"""A small synchronous client for calmd: stdlib sockets and msgpack, never torch.

with CalmClient() as client:
    for reply in client.complete("git co", cwd="/src/proj"):
        print(reply["candidate"], reply["score"])
    client.record("git commit -m fix", exit=0, cwd="/src/proj", session="s1")
    print(client.status())
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import msgpack

from calmd import paths
from calmd.protocol import PROTOCOL_VERSION


class DaemonNotRunning(ConnectionError):
    """Nothing listens on the socket (no file, refused, or a stale socket file)."""


class DaemonError(RuntimeError):
    """The daemon answered with an error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ProtocolMismatch(RuntimeError):
    """The daemon speaks another protocol version (restart it after an upgrade)."""


TERMINAL_KEYS = ("done", "ok", "error", "status", "results")


class CalmClient:
    def __init__(self, path: str | os.PathLike[str] | None = None, *, timeout: float | None = 10.0) -> None:
        self.path = Path(path) if path else paths.socket_path()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self._sock.close()
            raise DaemonNotRunning(f"no calmd listening on {self.path}") from exc
        except OSError:
            self._sock.close()
            raise
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self._ids = itertools.count(1)
        self._pending: dict[int, list[dict[str, Any]]] = {}

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> CalmClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------------

    def send(self, op: str, **fields: Any) -> int:
        """Send one request; returns its id. Replies are read with `replies(id)`."""
        request_id = next(self._ids)
        self._sock.sendall(msgpack.packb({"op": op, "id": request_id, **fields}, use_bin_type=True))
        self._pending[request_id] = []
        return request_id

    def send_raw(self, data: bytes) -> None:
        """Send bytes as they are (tests use this for malformed input)."""
        self._sock.sendall(data)

    def read_message(self) -> dict[str, Any]:
        """The next message on the connection, whichever request it answers."""
        while True:
            for message in self._unpacker:
                if not isinstance(message, dict):
                    raise DaemonError("bad_reply", f"expected a map, got {message!r}")
                if message.get("protocol") != PROTOCOL_VERSION:
                    raise ProtocolMismatch(
                        f"daemon speaks protocol {message.get('protocol')}, this client {PROTOCOL_VERSION}"
                    )
                return message
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("calmd closed the connection")
            self._unpacker.feed(data)

    def fileno(self) -> int:
        """The socket's descriptor, for select()/poll() beside other inputs (the shell helper)."""
        return self._sock.fileno()

    def read_available(self) -> list[dict[str, Any]]:
        """Every message already received, without blocking; ConnectionError when the daemon
        has closed the connection."""
        messages: list[dict[str, Any]] = []
        timeout = self._sock.gettimeout()
        self._sock.settimeout(0.0)
        try:
            while True:
                try:
                    messages.append(self.read_message())
                except (BlockingIOError, TimeoutError):
                    return messages
        finally:
            self._sock.settimeout(timeout)

    def replies(self, request_id: int) -> Iterator[dict[str, Any]]:
        """Messages for `request_id` until its last one (done/ok/error/status); messages for other
        ids that arrive meanwhile are kept for their own `replies()` call."""
        queue = self._pending.setdefault(request_id, [])
        while True:
            while queue:
                message = queue.pop(0)
                yield message
                if any(key in message for key in TERMINAL_KEYS):
                    self._pending.pop(request_id, None)
                    return
            message = self.read_message()
            self._pending.setdefault(message.get("id"), []).append(message)  # type: ignore[arg-type]

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send a request and return its final reply; DaemonError on an error reply."""
        *_, last = self.replies(self.send(op, **fields))
        if "error" in last:
            raise DaemonError(last["error"].get("code", "?"), last["error"].get("message", ""))
        return last

    # -- operations --------------------------------------------------------------------------------

    def complete(
        self, text: str, *, n: int = 5, session: str = "", early: bool = False,
        min_confidence: float | None = None, multiline: bool = False, **ctx: Any,
    ) -> Iterator[dict[str, Any]]:  # fmt: skip
        """Stream candidate replies (`candidate`, `score`, `confidence`, `ghost`), the drawn one
        first, then the `done` reply; with `early`, the history's best line (`early`) before them.
        `multiline`: the caller can show a multi-line entry as lines (docs/protocol.md)."""
        fields = {"input": text, **{k: v for k, v in ctx.items() if v is not None}}
        extra: dict[str, Any] = {"early": True} if early else {}
        if min_confidence is not None:
            extra["min_confidence"] = min_confidence
        if multiline:
            extra["multiline"] = True
        for message in self.replies(self.send("complete", n=n, session=session, ctx=fields, **extra)):
            if "error" in message:
                raise DaemonError(message["error"].get("code", "?"), message["error"].get("message", ""))
            yield message

    def record(self, cmd: str, **fields: Any) -> dict[str, Any]:
        return self.call("record", cmd=cmd, **{k: v for k, v in fields.items() if v is not None})

    def status(self) -> dict[str, Any]:
        return self.call("status")

    def search(self, query: str, *, mode: str = "global", n: int = 20, session: str = "",
               cwd: str = "") -> dict[str, Any]:  # fmt: skip
        """The history's best `n` commands for `query` (`results`, `matches`): docs/protocol.md."""
        return self.call("search", query=query, mode=mode, n=n, session=session, cwd=cwd)

    def forget(self, cmd: str) -> dict[str, Any]:
        """Delete every run of exactly `cmd` from the history, for good (`forgotten`: how many)."""
        return self.call("forget", cmd=cmd)

    def reload(self) -> dict[str, Any]:
        return self.call("reload")

    def train(self) -> dict[str, Any]:
        return self.call("train")

    def shutdown(self) -> dict[str, Any]:
        return self.call("shutdown")


def stop_daemon(path: str | os.PathLike[str] | None, *, timeout: float) -> tuple[int, bool]:
    """Ask the daemon to shut down and wait up to `timeout` seconds until it is gone: (its pid,
    whether it stopped). Gone means nothing accepts connections on the socket any more (a pid
    may linger as a zombie of whoever started the daemon). DaemonNotRunning when none answers."""
    with CalmClient(path, timeout=timeout) as client:
        pid = int(client.status()["status"]["pid"])
        client.shutdown()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            CalmClient(path, timeout=timeout).close()
        except (DaemonNotRunning, OSError):
            return pid, True
        time.sleep(0.05)
    return pid, False
