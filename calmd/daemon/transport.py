"""The daemon's transport: the socket, its connections, the message framing, the bounds and the
backpressure. What a request means is the service's (calmd/daemon/service.py); the transport
hands it each decoded message through the `Handler` interface and writes what it sends back.

- the socket comes from systemd (LISTEN_FDS) or is bound at the path of docs/protocol.md, mode 0600;
  a folder calmd creates for it is 0700, an existing one keeps its mode but is refused when
  another user could swap the socket in it (calmd.paths.socket_dir); a stale socket file left by
  a killed daemon is replaced, a live one means another daemon runs (AlreadyRunning);
- connections are accepted by hand, not with asyncio's server, so that running out of
  descriptors is logged and retried (the clients wait in the backlog) and connections over the
  cap, or from another uid (SO_PEERCRED), get a reply saying why;
- each connection is a `Connection`: requests are cut into messages by their msgpack headers
  before anything is decoded (1 MiB at most), up to MAX_PENDING_PER_CONNECTION are in progress at
  once, and reading stops while the client leaves REPLY_BUFFER_HIGH bytes of replies unread
  (closed after `reply_timeout_s` of that); what clients can provoke is logged rate-limited.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any, Protocol, cast

import msgpack

from calmd import paths
from calmd.protocol import MessageReader, ProtocolError, StreamError, decode_message, error_reply

log = logging.getLogger("calmd")

SD_LISTEN_FDS_START = 3
# Per-connection bounds (docs/protocol.md, "Limits"). A shell has one request in flight at a time
# and reads every reply at once, so none of these is ever near for it.
MAX_PENDING_PER_CONNECTION = 64  # requests being answered; past it the connection is not read
REPLY_BUFFER_HIGH = 256 << 10  # unread reply bytes at which the daemon stops reading a connection
REPLY_BUFFER_LOW = 64 << 10  # ... and resumes once the client has read down to this
CLOSE_GRACE_S = 2.0  # a closing connection whose client does not take its last replies: dropped
# Connections: a listen backlog deep enough for bursts of new shells, and a cap below the fd limit.
LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
DEFAULT_MAX_CONNECTIONS = 256
FD_RESERVE = 64  # descriptors kept for the store, the weights, the watcher, the trainer's pipes
ACCEPT_RETRY_S = 0.1  # out of descriptors: pending clients wait in the backlog, retried this often
ACCEPT_BATCH = 64  # accepts per wake-up, so that a burst of connects cannot monopolise the loop


class AlreadyRunning(RuntimeError):
    pass


class Handler(Protocol):
    """What the transport needs from the service: answer one decoded message (replies go out
    through `conn.send`), and forget what a closed connection asked for."""

    async def handle(self, message: Any, conn: Connection) -> None: ...

    def connection_closed(self, conn: Connection) -> None: ...


class RateLimitedLog:
    """Warnings a client can provoke at will (refusals, bad messages): the first of each kind is
    logged at once, then at most one per `interval` seconds with a count of those left out."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -self.interval) < self.interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += f" ({suppressed} more like it since the last report)"
        self._last[kind] = now
        log.warning(message, *args)


def default_max_connections() -> int:
    """DEFAULT_MAX_CONNECTIONS, or fewer when the fd limit is low, so that a full house refuses new
    clients with a reply instead of failing to accept them."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft - FD_RESERVE))


# --------------------------------------------------------------------------- sockets


def systemd_socket() -> socket.socket | None:
    """The listening socket systemd passed in (socket activation), if any."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = int(os.environ.get("LISTEN_FDS", "0") or 0)
    if count < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not inherited by children (the training process)
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise RuntimeError("the socket passed by systemd is not a Unix stream socket")
    return sock


def bind_socket(path: Path) -> socket.socket:
    """Bind `path` (0600; its folder: calmd.paths.socket_dir). A live daemon there:
    AlreadyRunning; a stale file of ours: replaced; anything else there: refused."""
    paths.socket_dir(path.parent)
    if path.exists() or path.is_symlink():
        st = path.lstat()
        if not stat.S_ISSOCK(st.st_mode):
            what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a socket"
            raise RuntimeError(
                f"{path} is {what}: refusing to replace it; give the socket's own path with --socket "
                "(or CALMD_SOCKET), e.g. a calmd.sock inside that folder"
            )
        if st.st_uid != os.getuid():
            raise RuntimeError(f"{path} belongs to uid {st.st_uid}; refusing to connect to it or replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            log.info("replacing stale socket %s", path)
            path.unlink(missing_ok=True)
        else:
            raise AlreadyRunning(f"calmd is already running on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others may connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(LISTEN_BACKLOG)
    return sock


def peer_uid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def refuse(conn: socket.socket, code: str, message: str) -> None:
    """Answer a connection that will not be served with one error reply, and close it."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(msgpack.packb(error_reply(None, code, message)))  # fits any fresh socket's buffer
    conn.close()


# --------------------------------------------------------------------------- connections


class Connection(asyncio.Protocol):
    """One client. Requests are framed by `MessageReader` (sizes checked on their headers), then
    decoded and handed to the handler one by one, so that the requests before a bad message are
    answered. The connection stops reading while MAX_PENDING_PER_CONNECTION requests are being
    answered or while its client leaves REPLY_BUFFER_HIGH bytes of replies unread (backpressure);
    after `reply_timeout_s` of the latter it is closed with an error. A stream that cannot go on
    (`too_large`, bytes that are not msgpack) is answered with its error after the requests before
    it, then closed."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.messages = MessageReader()
        self.transport: asyncio.Transport | None = None
        self.pending = 0
        self.reading = True
        self.write_blocked = False
        self.closed = False
        self.peer_done = False  # the client shut down its side: answer what came, then close
        self.final_error: dict[str, Any] | None = None  # sent once the pending requests are answered
        self._stall_timer: asyncio.TimerHandle | None = None
        self._abort_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's does not subclass it
        self.transport.set_write_buffer_limits(high=REPLY_BUFFER_HIGH, low=REPLY_BUFFER_LOW)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.final_error is not None:
            return
        self.messages.feed(data)
        self._read_messages()

    def eof_received(self) -> bool:
        self.peer_done = True
        self._close_when_answered()
        return True  # keep our side open for the replies still due

    def pause_writing(self) -> None:
        self.write_blocked = True
        self._update_reading()
        timeout = self.listener.reply_timeout_s
        self._stall_timer = asyncio.get_running_loop().call_later(timeout, self._stalled, timeout)

    def resume_writing(self) -> None:
        self.write_blocked = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._read_messages()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for timer in (self._stall_timer, self._abort_timer):
            if timer is not None:
                timer.cancel()
        self.listener.connection_closed(self)
        self.messages = MessageReader()  # what a half-sent request held goes now, not with the last task

    # -- requests --------------------------------------------------------------------------------

    def _read_messages(self) -> None:
        listener = self.listener
        while (
            not self.closed
            and self.final_error is None
            and self.pending < MAX_PENDING_PER_CONNECTION
            and not self.write_blocked
        ):
            raw = None
            try:
                raw = self.messages.next_message()
                if raw is None:
                    break
                listener.requests += 1
                message = decode_message(raw)
            except ProtocolError as exc:  # one bad message, skipped whole: the stream goes on
                if raw is None:  # too deep to decode: it is still a request answered
                    listener.requests += 1
                self.reject(exc.request_id, exc.code, exc.message)
                continue
            except StreamError as exc:
                listener.requests += 1
                self._fail(exc.code, exc.message)
                break
            self.pending += 1
            listener.start_task(listener.handler.handle(message, self), self._answered)
        self._update_reading()
        self._close_when_answered()

    def _answered(self, task: asyncio.Task[None]) -> None:
        self.pending -= 1
        self._read_messages()  # the next requests already received, or reading again

    def _update_reading(self) -> None:
        if self.closed or self.transport is None:
            return
        want = (
            self.final_error is None and self.pending < MAX_PENDING_PER_CONNECTION and not self.write_blocked
        )
        if want and not self.reading:
            self.transport.resume_reading()
        elif not want and self.reading:
            self.transport.pause_reading()
        self.reading = want

    def _close_when_answered(self) -> None:
        if self.closed or self.pending:
            return
        if self.final_error is not None:
            self.send(self.final_error)
            self.close()
        elif self.peer_done:
            if self.messages.buffered:
                self.reject(None, "bad_message", "the connection ended inside a request")
            self.close()

    def _fail(self, code: str, message: str) -> None:
        """The stream cannot go on: answer what came before, then this error, then close."""
        self.listener.errors += 1
        self.listener.client_log.warning(code, "closing a connection: %s: %s", code, message)
        self.final_error = error_reply(None, code, message)
        self._update_reading()
        self.messages = MessageReader()

    def _stalled(self, timeout: float) -> None:
        self._stall_timer = None
        unread = self.transport.get_write_buffer_size() if self.transport else 0
        message = f"{unread} bytes of replies left unread for {timeout:g} s"
        self.listener.errors += 1
        self.listener.client_log.warning("stalled", "closing a connection: %s", message)
        self.send(error_reply(None, "too_large", message))
        self.close()

    def reject(self, request_id: int | None, code: str, message: str) -> None:
        self.listener.errors += 1
        self.send(error_reply(request_id, code, message))

    def send(self, message: dict[str, Any]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(msgpack.packb(message, use_bin_type=True))

    def close(self) -> None:
        """Close after the replies already written are taken; drop them if the client does not."""
        if self.closed or self.transport is None:
            return
        self.closed = True
        self.listener.handler.connection_closed(self)
        self.transport.close()
        self._abort_timer = asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.abort)


# --------------------------------------------------------------------------- the listener


class Listener:
    """The listening socket and every connection on it: accepting (capped, peers of another uid
    refused), the requests in progress (`inflight`, what a shutdown waits for), and the counts of
    requests and errors `status` reports."""

    def __init__(self, handler: Handler, *, max_connections: int = 0, reply_timeout_s: float = 10.0) -> None:
        self.handler = handler
        self.max_connections = max_connections or default_max_connections()
        self.reply_timeout_s = reply_timeout_s
        self.connections: set[Connection] = set()
        self.inflight: set[asyncio.Task[None]] = set()
        self.requests = 0
        self.errors = 0
        self.client_log = RateLimitedLog()  # what clients can provoke is logged, not flooded
        self.accepting = False
        self._socket: socket.socket | None = None
        self._accept_retry: asyncio.TimerHandle | None = None

    def start_task(self, work: Any, done: Any) -> None:
        """Run one request's handling, counted in `inflight` until it ends, then `done(task)`."""
        task = asyncio.ensure_future(work)
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        task.add_done_callback(done)

    def start(self, sock: socket.socket) -> None:
        """Accept on `sock` from now on (made non-blocking, its backlog deepened)."""
        sock.setblocking(False)
        sock.listen(LISTEN_BACKLOG)  # also deepens a socket systemd passed in
        self._socket = sock
        self.accepting = True
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept_ready)

    def stop(self) -> None:
        """Accept no more: the listening socket is closed; open connections go on."""
        self.accepting = False
        if self._accept_retry is not None:
            self._accept_retry.cancel()
        if self._socket is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._socket.fileno())
            self._socket.close()
            self._socket = None

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()

    def connection_closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
        self.handler.connection_closed(connection)

    def _resume_accepting(self) -> None:
        self._accept_retry = None
        if self._socket is not None and self.accepting:
            asyncio.get_running_loop().add_reader(self._socket.fileno(), self._accept_ready)
            self._accept_ready()

    def _accept_ready(self) -> None:
        assert self._socket is not None
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _address = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.client_log.warning(
                        "fd_limit", "cannot accept clients: %s (%d connections open); they wait in the "
                        "backlog, retrying every %g s", exc.strerror, len(self.connections), ACCEPT_RETRY_S,
                    )  # fmt: skip
                    loop.remove_reader(self._socket.fileno())
                    self._accept_retry = loop.call_later(ACCEPT_RETRY_S, self._resume_accepting)
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue
                log.warning("accept failed: %s", exc)
                return
            self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        uid = peer_uid(conn)
        if uid is not None and uid != os.getuid():
            self.client_log.warning("forbidden", "refused a connection from uid %d", uid)
            refuse(conn, "forbidden", "peer belongs to another user")
            return
        if len(self.connections) >= self.max_connections:
            n = len(self.connections)
            self.client_log.warning("connections", "refused a client: %d connections open, the limit", n)
            refuse(conn, "too_large", f"calmd already serves {n} connections, its limit; try again later")
            return
        conn.setblocking(False)
        connection = Connection(self)
        self.connections.add(connection)
        task = asyncio.ensure_future(
            asyncio.get_running_loop().connect_accepted_socket(lambda: connection, sock=conn)
        )
        task.add_done_callback(lambda t: self._connected(t, connection, conn))

    def _connected(self, task: asyncio.Future[Any], connection: Connection, conn: socket.socket) -> None:
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.warning("could not set up a connection: %s", task.exception())
            self.connections.discard(connection)
            conn.close()
