"""calmd: the daemon. One `Server` object owns the socket, the history store and the model.

- asyncio on uvloop (asyncio's own loop when uvloop is missing);
- the socket comes from systemd (LISTEN_FDS) or is bound at the path of docs/protocol.md, mode 0600; a
  folder calmd creates for it is 0700, an existing one keeps its mode but is refused when another
  user could swap the socket in it (calmd.paths.socket_dir); peers of another uid are refused
  (SO_PEERCRED); a stale socket file left by a killed daemon is replaced, a live one means
  another daemon runs: refuse to start;
- CALM_HOME is made private at start (0700, calmd's files in it 0600; the umask is 077), and
  what killed training runs left there is removed;
- each connection is a `Connection` protocol: requests are cut into frames by their msgpack
  headers before anything is decoded (1 MiB at most), up to 64 per connection are in progress at
  once, and reading stops while the client leaves 256 KiB of replies unread (backpressure; closed
  after `reply_timeout_s` of that); connections are capped, refusals logged (rate-limited);
- completions run on one worker thread, off the event loop, so `status` and `record` stay instant;
  a fair scheduler (calmd/daemon/scheduler.py) takes connections and sessions in turn, keeps only each
  session's newest request, and so lets no client delay another by more than one completion;
- the weight file is watched (watchfiles) and reloaded when it changes (inode, mtime, size), debounced; a bad
  file is rejected, logged and shown by `status`, and the old model keeps serving; a bad file at
  start is no reason not to start: the packaged model serves until a good file appears;
- background training is calmd/daemon/trainer.py's `Trainer`;
- SIGTERM/SIGINT (or a `shutdown` request): stop accepting, answer in-flight requests, stop the
  training run, remove the socket file we bound, exit, all within `graceful_timeout` seconds: a
  worker thread that does not finish (a hung model) is abandoned, and a watchdog ends the
  process if anything else hangs. SIGHUP: reload the weights.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import resource
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import msgpack
from watchfiles import awatch  # imported before `ready`: 60 ms that would delay the first request

from calmd import __version__, paths
from calmd.daemon.disk import Disk
from calmd.daemon.filters import sendable
from calmd.daemon.frames import SessionFrames
from calmd.daemon.protocol import (
    PROTOCOL_VERSION,
    CompleteRequest,
    ForgetRequest,
    FrameError,
    FrameReader,
    ProtocolError,
    RecordRequest,
    SearchRequest,
    SimpleRequest,
    decode_frame,
    error_reply,
    parse_request,
    reply,
)
from calmd.daemon.scheduler import FairScheduler, Job
from calmd.daemon.search import SearchService
from calmd.daemon.trainer import Trainer
from calmd.errors import CalmError, DiskFull
from calmd.history.context import HISTORY_FRAMES
from calmd.history.fish import import_first_start
from calmd.history.store import HistoryStore

log = logging.getLogger("calmd")

EXIT_ALREADY_RUNNING = 4
EXIT_STARTUP_FAILURE = 3
EXIT_SHUTDOWN_TIMEOUT = 1  # the watchdog ended a shutdown that overran graceful_timeout
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
RELOAD_ATTEMPTS = 5  # loads of a weight file that keeps changing under them before giving up
FileId = tuple[int, int, int, int]  # (device, inode, mtime in ns, size) of the weight file
SHUTDOWN_READ_GRACE_S = 0.1  # on SIGTERM, requests already sent are still read for this long


class Engine(Protocol):
    """What the server needs from the model side (calmd/daemon/engine.py implements it)."""

    def describe(self) -> dict[str, Any]: ...

    def attach_history(self, store: HistoryStore) -> None: ...

    def complete(
        self,
        ctx: dict[str, Any],
        n: int,
        session: str,
        cancelled: threading.Event,
        early: Callable[[str, float, bool], None] | None = None,
        *,
        min_confidence: float | None = None,
        drawn: str | None = None,
    ) -> Iterator[Suggestion]:
        """Yields (candidate, score, confidence, ghost) with the drawn one first, then best
        first; calls `early(candidate, confidence, ghost)` at most once, before the first
        candidate (the history's best proposal). `min_confidence`: the shell's threshold for the
        ghost in place of the fitted rule's (calmd/daemon/ghost.py); `drawn`: the line the shell
        shows already, which stays unless clearly beaten."""
        ...


EngineLoader = Callable[[Path], Engine]
Suggestion = tuple[Any, ...]  # (candidate, score, confidence, ghost, ...): calmd.daemon.engine.Suggestion


class AlreadyRunning(RuntimeError):
    pass


@dataclass(frozen=True)
class ServerConfig:
    socket_path: Path = field(default_factory=paths.socket_path)
    data_dir: Path = field(default_factory=paths.data_dir)
    weights_path: Path = field(default_factory=paths.weights_path)
    reload_debounce_ms: int = 300
    history_context: int = (
        HISTORY_FRAMES  # history frames put in the model's context when the client sends none
    )
    import_shell_history: bool = True  # import ~/.bash_history and ~/.zsh_history on first start
    train_threshold: int = 200  # new commands before a background run; 0: only on request
    train_max_load: float = 1.0  # start automatically only when the 1-minute load is below this
    train_args: tuple[
        str, ...
    ] = ()  # extra `python -m calmd.training.background` arguments (tests shorten runs)
    max_connections: int = 0  # concurrent clients; 0: DEFAULT_MAX_CONNECTIONS within the fd limit
    reply_timeout_s: float = 10.0  # a client that leaves REPLY_BUFFER_HIGH unread this long is closed
    graceful_timeout: float = 5.0  # SIGTERM to exit, at most (in-flight answers, the trainer's stop)
    fallback_weights: Path = field(default_factory=paths.packaged_weights)  # when the user's do not load
    prefetch: bool = True  # after a record, prepare the session's next empty prompt (its context's state)


class LatencyStats:
    """Recent latencies in ms; percentiles for `status`."""

    def __init__(self, size: int = 2000) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def add(self, ms: float) -> None:
        self.values.append(ms)

    def percentile(self, q: float) -> float | None:
        if not self.values:
            return None
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


class RateLimitedLog:
    """Warnings a client can provoke at will (refusals, bad frames): the first of each kind is
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
    """One client. Requests are framed by `FrameReader` (sizes checked on their headers), then
    decoded and dispatched one by one, so that the requests before a bad frame are answered. The
    connection stops reading while MAX_PENDING_PER_CONNECTION requests are being answered or while
    its client leaves REPLY_BUFFER_HIGH bytes of replies unread (backpressure); after
    `reply_timeout_s` of the latter it is closed with an error. A stream that cannot go on
    (`too_large`, bytes that are not msgpack) is answered with its error after the requests before
    it, then closed."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.frames = FrameReader()
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
        self.frames.feed(data)
        self._read_frames()

    def eof_received(self) -> bool:
        self.peer_done = True
        self._close_when_answered()
        return True  # keep our side open for the replies still due

    def pause_writing(self) -> None:
        self.write_blocked = True
        self._update_reading()
        timeout = self.server.config.reply_timeout_s
        self._stall_timer = asyncio.get_running_loop().call_later(timeout, self._stalled, timeout)

    def resume_writing(self) -> None:
        self.write_blocked = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._read_frames()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for timer in (self._stall_timer, self._abort_timer):
            if timer is not None:
                timer.cancel()
        self.server.connection_closed(self)
        self.frames = FrameReader()  # what a half-sent request held goes now, not with the last task

    # -- requests --------------------------------------------------------------------------------

    def _read_frames(self) -> None:
        server = self.server
        while (
            not self.closed
            and self.final_error is None
            and self.pending < MAX_PENDING_PER_CONNECTION
            and not self.write_blocked
        ):
            frame = None
            try:
                frame = self.frames.next_frame()
                if frame is None:
                    break
                server.requests += 1
                message = decode_frame(frame)
            except ProtocolError as exc:  # one bad frame, skipped whole: the stream goes on
                if frame is None:  # too deep to decode: it is still a request answered
                    server.requests += 1
                self.reject(exc.request_id, exc.code, exc.message)
                continue
            except FrameError as exc:
                server.requests += 1
                self._fail(exc.code, exc.message)
                break
            self.pending += 1
            task = asyncio.ensure_future(server._dispatch(message, self))
            server._inflight.add(task)
            task.add_done_callback(self._answered)
        self._update_reading()
        self._close_when_answered()

    def _answered(self, task: asyncio.Task[None]) -> None:
        self.server._inflight.discard(task)
        self.pending -= 1
        self._read_frames()  # the next requests already received, or reading again

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
            if self.frames.buffered:
                self.reject(None, "bad_message", "the connection ended inside a request")
            self.close()

    def _fail(self, code: str, message: str) -> None:
        """The stream cannot go on: answer what came before, then this error, then close."""
        self.server.errors += 1
        self.server.client_log.warning(code, "closing a connection: %s: %s", code, message)
        self.final_error = error_reply(None, code, message)
        self._update_reading()
        self.frames = FrameReader()

    def _stalled(self, timeout: float) -> None:
        self._stall_timer = None
        unread = self.transport.get_write_buffer_size() if self.transport else 0
        message = f"{unread} bytes of replies left unread for {timeout:g} s"
        self.server.errors += 1
        self.server.client_log.warning("stalled", "closing a connection: %s", message)
        self.send(error_reply(None, "too_large", message))
        self.close()

    def reject(self, request_id: int | None, code: str, message: str) -> None:
        self.server.errors += 1
        self.send(error_reply(request_id, code, message))

    def send(self, message: dict[str, Any]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(msgpack.packb(message, use_bin_type=True))

    def close(self) -> None:
        """Close after the replies already written are taken; drop them if the client does not."""
        if self.closed or self.transport is None:
            return
        self.closed = True
        self.server.scheduler.cancel_owner(self)
        self.transport.close()
        self._abort_timer = asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.abort)


# --------------------------------------------------------------------------- the server


class Server:
    def __init__(self, config: ServerConfig, engine_loader: EngineLoader) -> None:
        self.config = config
        self.engine_loader = engine_loader
        self.engine: Engine | None = None
        self.loaded_at: float | None = None
        self.loaded_id: FileId | None = None  # the weight file the engine was loaded from
        self.last_reload_error: str | None = None
        self.started = time.time()
        self.requests = 0
        self.errors = 0
        self.first_ms = LatencyStats()
        self.done_ms = LatencyStats()
        self.history: HistoryStore | None = None
        self.search: SearchService | None = None  # `search` and `forget`, on a thread of their own
        self.should_exit = asyncio.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="calmd-infer")
        self.scheduler = FairScheduler(self._pool)  # completions reach the pool only through it
        self._inflight: set[asyncio.Task[None]] = set()
        self._reload_lock = asyncio.Lock()
        self._listener: socket.socket | None = None
        self._accept_retry: asyncio.TimerHandle | None = None
        self.connections: set[Connection] = set()
        self.max_connections = config.max_connections or default_max_connections()
        self.client_log = RateLimitedLog()  # what clients can provoke is logged, not flooded
        self.socket_path: str = ""
        self._bound_socket: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket we bound
        self.serving_fallback = False  # the packaged model serves: the user's weights did not load
        self.trainer = Trainer(config.data_dir, config.weights_path, config.train_args, self.reload)
        self._recent_cache: dict[str, list[dict[str, Any]]] = {}
        self._recent_generation = 0  # the history's generation the cache was filled at
        self.disk = Disk()  # COMP's listings and the disk check (calmd/daemon/disk.py)
        self.frames = SessionFrames(self.disk)
        # Prefetch: each session's last request (its context without input and history, its n),
        # and the background job preparing its next line after a record.
        self._last_request: dict[str, tuple[dict[str, Any], int]] = {}
        self._prefetch: dict[str, Job] = {}
        self._prefetch_owner = object()  # the scheduler's owner of every prefetch job
        self.prefetch_stats = {"started": 0, "finished": 0, "stopped": 0}
        self.withheld = 0  # candidates the last gate held back (control characters)
        self._import: asyncio.Future[Any] | None = None  # the first start's import of the shells' files
        self._import_stop = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    async def serve(self, sock: socket.socket | None = None) -> None:
        loop = asyncio.get_running_loop()
        paths.private_data_dir(self.config.data_dir)  # before anything is written there
        if sock is None:
            sock = systemd_socket()
        if sock is None:
            sock = bind_socket(self.config.socket_path)
            st = self.config.socket_path.lstat()
            self._bound_socket = (st.st_dev, st.st_ino)
        self.socket_path = str(sock.getsockname())
        self.history = HistoryStore(paths.history_path(self.config.data_dir))
        self.trainer.clean_leftovers()
        await self.reload()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        scheduler = asyncio.ensure_future(self.scheduler.run())
        self._start_accepting(sock)
        watcher = asyncio.ensure_future(self._watch_weights())
        await asyncio.sleep(0)  # its first step sets up the inotify watch: later changes are seen
        if self._weights_id() != self.loaded_id:  # changed between the load and the watch
            await self.reload()
        self.search = SearchService(self.history)
        self.search.start()  # built in the background: a search waits for it only until it is
        log.info("calmd %s ready on %s (protocol %d)", __version__, self.socket_path, PROTOCOL_VERSION)
        print(f"calmd ready on {self.socket_path}", flush=True)
        if self.config.import_shell_history:
            # After `ready`, in batches (the store's lock is free between two): however large the
            # files, the daemon answers from the start (docs/history.md, "Importing").
            self._import = asyncio.ensure_future(asyncio.to_thread(self._first_imports))
        try:
            await self.should_exit.wait()
        finally:
            await self._shutdown(watcher, scheduler)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    def _first_imports(self) -> None:
        """~/.bash_history and ~/.zsh_history at the first start, fish's history while it was never
        read whole (calmd/history/fish.py): in batches, stopped by `_import_stop`."""
        history = self.history
        assert history is not None
        history.import_shell_histories(Path.home(), self._import_stop)
        if not self._import_stop.is_set():
            import_first_start(history, stop=self._import_stop)

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        if not self.should_exit.is_set():
            log.info("received %s: shutting down (at most %g s)", sig.name, self.config.graceful_timeout)
        self.should_exit.set()

    async def _shutdown(self, watcher: asyncio.Future[None], scheduler: asyncio.Future[None]) -> None:
        """Everything within graceful_timeout; the watchdog ends the process if this overruns."""
        timeout = self.config.graceful_timeout
        start_watchdog(timeout)
        deadline = time.monotonic() + timeout
        watcher.cancel()
        self._stop_accepting()
        # Connections are still read for a moment, so that what a client sent just before the
        # signal is answered too; they are closed once the in-flight requests are answered.
        await asyncio.sleep(SHUTDOWN_READ_GRACE_S)
        log.info("shutting down: answering %d in-flight requests", len(self._inflight))
        trainer_stopped = asyncio.ensure_future(self.trainer.stop(max(0.0, timeout * 0.6)))
        self._import_stop.set()  # it stops after its batch; the next start goes on from there
        # a hung model never answers: leave time for the rest
        while self._inflight and time.monotonic() < deadline - 1.0:
            await asyncio.wait(set(self._inflight), timeout=max(0.0, deadline - time.monotonic() - 1.0))
        for conn in list(self.connections):
            conn.close()
        scheduler.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.search is not None:
            self.search.close()
        self.disk.close()
        await asyncio.wait([trainer_stopped], timeout=max(0.0, deadline - time.monotonic() - 0.5))
        if self._import is not None:
            await asyncio.wait([self._import], timeout=max(0.0, deadline - time.monotonic() - 0.3))
        if self.history is not None:
            # under its lock, which a hung worker may hold: do not wait past the deadline
            closing = asyncio.ensure_future(asyncio.to_thread(self.history.close))
            await asyncio.wait([closing], timeout=max(0.0, deadline - time.monotonic() - 0.2))
        self._remove_socket()

    def _remove_socket(self) -> None:
        """Remove the socket file if we bound it and it is still ours (under socket activation
        systemd owns it; CALMD_KEEP_SOCKET keeps it for a test)."""
        if self._bound_socket is None or os.environ.get("CALMD_KEEP_SOCKET"):
            return
        path = self.config.socket_path
        with contextlib.suppress(OSError):
            st = path.lstat()
            if (st.st_dev, st.st_ino) == self._bound_socket:
                path.unlink()

    # -- model hosting ---------------------------------------------------------------------------

    def _attach(self, engine: Engine) -> None:
        if self.history is not None:
            engine.attach_history(self.history)
        attach_disk = getattr(engine, "attach_disk", None)  # a test's scripted engine has none
        if attach_disk is not None:
            attach_disk(self.disk)

    def _load_warm(self, path: Path) -> Engine:
        """Load an engine and warm it up (on the worker thread, before it serves): a fresh
        daemon's first keystroke, and the first after a swap, cost what any other costs. A warm-up
        that fails is logged; the engine serves all the same."""
        engine = self.engine_loader(path)
        warm_up = getattr(engine, "warm_up", None)  # a test's scripted engine has none
        if warm_up is not None:
            self._attach(engine)
            try:
                warm_up(str(Path.home()))
            except Exception:
                log.exception("the warm-up of %s failed", path)
        return engine

    async def reload(self) -> dict[str, Any]:
        """Load the weight file in a thread; keep the old engine when the new file is bad. With
        no engine yet (the start), a bad file gives way to the packaged model, and the error
        shows in `status` until a good file is loaded."""
        async with self._reload_lock:
            path = self.config.weights_path
            loop = asyncio.get_running_loop()
            try:
                # The file can be replaced while it loads (a training run's swap, `calm rollback`):
                # what is installed must carry the identity of the file that was read, or the
                # watcher would take a later swap back to it for "nothing changed".
                for _ in range(RELOAD_ATTEMPTS):
                    before = self._weights_id()
                    engine = await loop.run_in_executor(self._pool, self._load_warm, path)
                    if self._weights_id() == before:
                        break
                else:
                    log.warning("%s kept changing while it loaded: serving the last one read", path)
                    before = None  # the watcher's next look reloads it
                loaded = before
            except Exception as exc:  # a bad file must never take the daemon down
                self.last_reload_error = f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {exc}"
                if self.engine is not None:
                    log.error("reload of %s failed, keeping the current model: %s", path, exc)
                    return {"ok": False, "reload_error": self.last_reload_error}
                log.error("%s did not load, serving the packaged model until it does: %s", path, exc)
                identity = self._weights_id()
                fallback = self.config.fallback_weights
                engine = await loop.run_in_executor(self._pool, self._load_warm, fallback)
                self._install(engine, identity, fallback=True)
                return {"ok": False, "reload_error": self.last_reload_error}
            self.last_reload_error = None
            self._install(
                engine, loaded, fallback=loaded is None and not path.exists()
            )  # no file: the loader's default
            return {"ok": True}

    def _install(self, engine: Engine, identity: FileId | None, *, fallback: bool) -> None:
        self._attach(engine)
        self.engine = engine
        self.loaded_at = time.time()
        self.loaded_id = identity  # a bad file's too: the watcher retries when it changes
        self.serving_fallback = fallback
        log.info("model loaded: %s", engine.describe().get("path"))

    async def _watch_weights(self) -> None:
        folder = self.config.weights_path.parent
        folder.mkdir(parents=True, exist_ok=True)
        target = self.config.weights_path.name
        async for changes in awatch(
            folder,
            debounce=self.config.reload_debounce_ms,
            step=50,
            watch_filter=lambda _change, p: Path(p).name == target,
            stop_event=self.should_exit,
        ):
            del changes
            # a new file, or none any more (`calm rollback` with no previous weights moved it
            # aside): the packaged model serves then
            if self._weights_id() != self.loaded_id:
                await self.reload()

    def _weights_id(self) -> FileId | None:
        """Which file the weight path names now: a swap by rename changes the inode even when the
        two files share an mtime."""
        try:
            st = self.config.weights_path.stat()
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    # -- connections -------------------------------------------------------------------------------

    def _start_accepting(self, sock: socket.socket) -> None:
        """Accept on our own, not with asyncio's server: so that running out of descriptors is
        logged and retried (the clients wait in the backlog) instead of resetting them silently,
        and so that connections over the cap get a reply saying why."""
        sock.setblocking(False)
        sock.listen(LISTEN_BACKLOG)  # also deepens a socket systemd passed in
        self._listener = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept_ready)

    def _stop_accepting(self) -> None:
        if self._accept_retry is not None:
            self._accept_retry.cancel()
        if self._listener is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None

    def _resume_accepting(self) -> None:
        self._accept_retry = None
        if self._listener is not None and not self.should_exit.is_set():
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept_ready)
            self._accept_ready()

    def _accept_ready(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.client_log.warning(
                        "fd_limit", "cannot accept clients: %s (%d connections open); they wait in the "
                        "backlog, retrying every %g s", exc.strerror, len(self.connections), ACCEPT_RETRY_S,
                    )  # fmt: skip
                    loop.remove_reader(self._listener.fileno())
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

    def connection_closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
        self.scheduler.cancel_owner(connection)
        if self.search is not None:
            self.search.drop(connection)

    async def _dispatch(self, message: Any, conn: Connection) -> None:
        """Answer one decoded request (replies are written as they come; `Connection` does the flow
        control)."""
        try:
            request = parse_request(message)
            if isinstance(request, CompleteRequest):
                await self._complete(request, conn)
            elif isinstance(request, RecordRequest):
                conn.send(reply(request.id, **await self._record(request)))
            elif isinstance(request, SearchRequest | ForgetRequest):
                conn.send(reply(request.id, **await self._history_search(request, conn)))
            else:
                conn.send(reply(request.id, **await self._simple(request)))
        except ProtocolError as exc:
            conn.reject(exc.request_id, exc.code, exc.message)
        except DiskFull as exc:
            rid = message.get("id") if isinstance(message, dict) else None
            log.error("disk full: %s", exc)
            conn.reject(rid if isinstance(rid, int) else None, "disk_full", str(exc))
        except Exception as exc:  # never a dead daemon: log, answer, carry on
            rid = message.get("id") if isinstance(message, dict) else None
            log.exception("request failed")
            conn.reject(rid if isinstance(rid, int) else None, "internal", str(exc))

    async def _record(self, request: RecordRequest) -> dict[str, Any]:
        assert self.history is not None
        self.disk.invalidate()  # the command may have made or removed what the next keystroke lists
        result = await asyncio.to_thread(
            self.history.record,
            request.cmd,
            exit=request.exit,
            cwd=request.cwd,
            git=request.git,
            session=request.session,
            ts=request.ts,
            comp=self.frames.for_record(request.session, request.cmd, request.cwd),
            env=request.env,
            duration=request.duration,
        )
        if result.stored:
            self._recent_cache.clear()  # other sessions top up with this command too
            if self.search is not None:
                self.search.touch()
            if self.config.prefetch and request.session:
                self._start_prefetch(request.session)
        if result.stored and self.config.train_threshold and not self.trainer.busy:
            await self.start_training("threshold", wanted=self._training_due)
        return {"ok": True, "stored": result.stored, **({"reason": result.reason} if result.reason else {})}

    async def _history_search(
        self, request: SearchRequest | ForgetRequest, conn: Connection
    ) -> dict[str, Any]:
        """`search` (ranked with the session's latest commands as context) and `forget`
        (calmd/daemon/search.py, on the search's own thread)."""
        if self.search is None:  # serve() starts it before it accepts: a bug, answered `internal`
            raise RuntimeError("the history search is not running")
        if isinstance(request, ForgetRequest):
            outcome = await self.search.forget(request)
            self._recent_cache.clear()
            return outcome
        history = [h["cmd"] for h in self._recent_history(request.session)]
        return await self.search.search(request, history, conn)

    def _start_prefetch(self, session: str) -> None:
        """Prepare the session's next empty prompt in the background, as soon as its command is
        recorded: the new context's prefill and the empty-prompt answer, which the engine keeps
        (calmd/daemon/engine.py: the next request with that context continues it). The context is
        guessed from the session's last request (its cwd and git, the store's history frames): a
        command that changed folder makes the guess wrong. The session's next request stops it."""
        last = self._last_request.get(session)
        engine = self.engine
        if last is None or engine is None:
            return
        fields, n = last
        ctx = {**fields, "history": self._recent_history(session), "input": ""}
        older = self._prefetch.pop(session, None)
        if older is not None:
            self.scheduler.cancel(older)

        def work(cancelled: threading.Event, attempt: int) -> bool:
            try:  # ENV (and COMP, empty before a word is begun), as the request path fills them
                self.frames.fill(ctx, session, getattr(engine, "followers", None))
            except Exception:
                log.exception("the COMP frame could not be built; preparing without it")
            for _ in engine.complete(ctx, n, session, cancelled):
                if cancelled.is_set():
                    return False
            return not cancelled.is_set()

        job = Job(owner=self._prefetch_owner, session="", run=work, prepares=session)
        self._prefetch[session] = job
        self.prefetch_stats["started"] += 1

        def finished(future: asyncio.Future[bool]) -> None:
            ok = not future.cancelled() and future.exception() is None and future.result()
            self.prefetch_stats["finished" if ok else "stopped"] += 1
            if self._prefetch.get(session) is job:
                del self._prefetch[session]

        self.scheduler.submit(job).add_done_callback(finished)

    def _recent_history(self, session: str) -> list[dict[str, Any]]:
        """The context's history frames, cached per session until the next stored command (a
        keystroke must not cost a database query)."""
        generation = self.history.generation() if self.history is not None else 0
        if generation != self._recent_generation:  # rows were deleted (calm forget, a re-scan)
            self._recent_cache.clear()
            self._recent_generation = generation
        cached = self._recent_cache.get(session)
        if cached is None:
            assert self.history is not None
            rows = self.history.recent(session=session or None, limit=self.config.history_context)
            cached = [{"cmd": r.cmd, "exit": r.exit} for r in rows]
            if len(self._recent_cache) > 256:
                self._recent_cache.clear()
            self._recent_cache[session] = cached
        return cached

    # -- background training ----------------------------------------------------------------------

    def _training_due(self) -> bool:
        """Enough new commands since the last run, and a machine that is not busy."""
        assert self.history is not None
        pending = self.history.counter("recorded_since_train")
        return pending >= self.config.train_threshold and os.getloadavg()[0] < self.config.train_max_load

    async def start_training(self, why: str, wanted: Callable[[], bool] | None = None) -> dict[str, Any]:
        """A background run (calmd/daemon/trainer.py), when `wanted()` says it is due (decided
        and started in one step there); the count of new commands restarts with it."""
        result = await self.trainer.start(why, wanted)
        if result.get("started"):
            assert self.history is not None
            try:
                self.history.reset_counter("recorded_since_train")
            except Exception as exc:  # a full disk: the run reports it; the count restarts later
                log.warning("could not reset the count of new commands: %s", exc)
        return result

    async def _simple(self, request: SimpleRequest) -> dict[str, Any]:
        if request.op == "status":
            return {"status": await asyncio.to_thread(self.status)}
        if request.op == "reload":
            return await self.reload()
        if request.op == "train":
            return await self.start_training("request")
        if request.op == "shutdown":
            asyncio.get_running_loop().call_soon(self.should_exit.set)
            return {"ok": True}
        raise AssertionError(f"parse_request let through op {request.op!r}")  # SIMPLE_OPS are all here

    def _note_request(self, request: CompleteRequest, ctx: dict[str, Any]) -> None:
        """Remember what the session's next line will be asked with (for the prefetch), and stop
        the session's prefetch: the request does not wait for it. What it finished stays in the
        engine's caches: the new context's prefill (when the request has that context), and the
        whole empty-prompt answer when it had time to finish it (measured: waiting for a running
        prefetch delays the first candidate until its last, bench/prefetch.py --think 0)."""
        if request.history_given:  # the client's own history: the daemon cannot guess the next
            self._last_request.pop(request.session, None)
        else:
            fields = {k: v for k, v in ctx.items() if k not in ("input", "history")}
            self._last_request[request.session] = (fields, request.n)
            if len(self._last_request) > 256:
                self._last_request.pop(next(iter(self._last_request)))
        pending = self._prefetch.pop(request.session, None)
        if pending is not None:  # what it prepared so far stays in the engine's caches
            self.scheduler.cancel(pending)

    async def _complete(self, request: CompleteRequest, conn: Connection) -> None:
        start = time.perf_counter()
        engine = self.engine
        if engine is None:  # serve() loads a model before it accepts: a bug, answered `internal`
            raise RuntimeError("no model is loaded")
        ctx = dict(request.ctx)
        if request.multiline:  # the engine ranks (and picks the ghost) among what may be sent
            ctx["multiline"] = True
        if not request.history_given and self.history is not None:
            ctx["history"] = self._recent_history(request.session)
        if request.path is not None:
            self.frames.set_path(request.session, request.path)
        if request.session:
            self._note_request(request, ctx)
        loop = asyncio.get_running_loop()
        first: list[float] = []
        early_sent: list[bool] = []

        def emit(attempt: int, candidate: str, score: float, confidence: float, ghost: bool) -> None:
            if not self._terminal_safe(candidate, request):
                return
            if not job.deliver(attempt):  # that attempt was preempted; a later one sends it
                return
            if not first:
                first.append((time.perf_counter() - start) * 1e3)
            conn.send(reply(request.id, candidate=candidate, score=round(score, 4),
                            confidence=round(min(1.0, max(0.0, confidence)), 3), ghost=ghost))  # fmt: skip

        def emit_early(attempt: int, candidate: str, confidence: float, ghost: bool) -> None:
            # At most one per request: a preempted attempt's is dropped unless it went out, and
            # the rerun's is dropped if it did. It does not count as delivered, so the job can
            # still be preempted (the early proposal comes from the history alone).
            if early_sent or attempt != job.attempt or job.cancelled.is_set():
                return
            if not self._terminal_safe(candidate, request):
                return
            early_sent.append(True)
            conn.send(reply(request.id, early=candidate, confidence=round(min(1.0, max(0.0, confidence)), 3),
                            ghost=ghost))  # fmt: skip

        def work(cancelled: threading.Event, attempt: int) -> bool:
            if cancelled.is_set():
                return False
            # COMP and ENV (calmd/daemon/frames.py): here, off the event loop, bounded in time. A
            # failure there costs the keystroke its COMP, never its answer.
            try:
                self.frames.fill(ctx, request.session, getattr(engine, "followers", None))
            except Exception:
                log.exception("the COMP frame could not be built; answering without it")

            def on_early(candidate: str, confidence: float, ghost: bool) -> None:
                if not cancelled.is_set():
                    loop.call_soon_threadsafe(emit_early, attempt, candidate, confidence, bool(ghost))

            for candidate, score, confidence, ghost, *_ in engine.complete(
                ctx, request.n, request.session, cancelled, on_early if request.early else None,
                min_confidence=request.min_confidence, drawn=request.drawn,
            ):  # fmt: skip
                if cancelled.is_set():
                    return False
                loop.call_soon_threadsafe(emit, attempt, candidate, score, confidence, bool(ghost))
            return not cancelled.is_set()

        job = Job(owner=conn, session=request.session, run=work)
        if request.n == 0:
            if request.session:  # still the session's newest request: the older one is moot
                self.scheduler.cancel_session(request.session)
            finished = True
        else:
            finished = await self.scheduler.submit(job)
        await asyncio.sleep(0)  # let the emits scheduled by the worker run before `done`
        ms = (time.perf_counter() - start) * 1e3
        if finished:
            self.done_ms.add(ms)
            if first:
                self.first_ms.add(first[0])
            conn.send(reply(request.id, done=True, ms=round(ms, 3)))
        else:
            conn.send(reply(request.id, done=True, cancelled=True, ms=round(ms, 3)))

    def _terminal_safe(self, candidate: str, request: CompleteRequest) -> bool:
        """The last gate before a candidate leaves: nothing that drives a terminal and nothing over
        4 KiB, whatever the engine proposed (calmd/daemon/filters.py `sendable`); a multi-line entry
        only for a client that draws it as lines. What it holds back is counted, never logged (it
        is the user's history)."""
        if sendable(candidate, multiline=request.multiline):
            return True
        self.withheld += 1
        return False

    # -- status ------------------------------------------------------------------------------------

    def _disk_status(self) -> dict[str, Any]:
        """Free space where the history and weights live, and when a write last found none."""
        folder = self.config.data_dir
        free: int | None = None
        total: int | None = None
        with contextlib.suppress(OSError):
            fs = os.statvfs(folder)
            free, total = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
        times = [t for t in (self.history.last_disk_full if self.history else None,
                             self.trainer.last_disk_full) if t is not None]  # fmt: skip
        return {"path": str(folder), "free_bytes": free, "total_bytes": total,
                "last_full": max(times) if times else None}  # fmt: skip

    def _history_status(self) -> dict[str, Any]:
        store = self.history
        if store is None:
            return {"commands": 0, "dropped_secrets": 0, "since_last_training": 0, "import": None}
        return {
            "commands": store.count(),
            "dropped_secrets": store.counter("dropped_secrets"),
            "since_last_training": store.counter("recorded_since_train"),
            # the first start's import of ~/.bash_history and ~/.zsh_history, and the files any
            # import refused (not a history) or could not read
            "import": {
                "running": self._import is not None and not self._import.done(),
                "refused": store.counter("import_refused"),
                "last_refused": store.note("last_import_refused"),
                "failures": store.counter("import_failures"),
            },
        }

    def status(self) -> dict[str, Any]:
        engine = self.engine.describe() if self.engine else {}
        return {
            "version": __version__,
            "protocol": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "socket": self.socket_path,
            "uptime_s": round(time.time() - self.started, 1),
            "model": engine,
            "weights_path": str(self.config.weights_path),
            "serving_fallback": self.serving_fallback,
            "loaded_at": self.loaded_at,
            "last_reload_error": self.last_reload_error,
            "requests": self.requests,
            "errors": self.errors,
            "withheld_candidates": self.withheld,
            "latency_ms": {
                "first_p50": self.first_ms.percentile(50),
                "first_p99": self.first_ms.percentile(99),
                "done_p50": self.done_ms.percentile(50),
                "done_p99": self.done_ms.percentile(99),
            },
            "history": self._history_status(),
            "training": self.trainer.status(self.config.train_threshold),
            "prefetch": dict(self.prefetch_stats),
            "disk": self._disk_status(),
            "context": self.disk.describe(),
            "search": self.search.describe() if self.search is not None else {"ready": False},
        }


_watchdog_started = threading.Event()


def start_watchdog(timeout: float) -> None:
    """End the process `timeout` seconds from now if it is still there: SIGTERM always stops the
    daemon, whatever hangs (a worker thread, a lock, a client that never reads)."""
    if _watchdog_started.is_set():
        return
    _watchdog_started.set()

    def bark() -> None:
        time.sleep(timeout)
        log.error("shutdown did not finish within %g s: exiting now", timeout)
        _hard_exit(EXIT_SHUTDOWN_TIMEOUT)

    threading.Thread(target=bark, name="calmd-watchdog", daemon=True).start()


def _hard_exit(code: int) -> None:
    """os._exit, after flushing what was logged and printed."""
    with contextlib.suppress(Exception):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def run_server(config: ServerConfig, engine_loader: EngineLoader) -> int:
    """Run until SIGTERM/SIGINT or a `shutdown` request. Exit codes: 0 ok, 1 the shutdown overran
    graceful_timeout, 3 startup failure, 4 another daemon already serves the socket."""
    paths.set_private_umask()  # the history, its -wal/-shm, the trainer's files: 0600
    try:
        import uvloop

        runner: Callable[[Any], Any] = uvloop.run
    except ImportError:
        runner = asyncio.run
    server = Server(config, engine_loader)
    try:
        runner(server.serve())
    except AlreadyRunning as exc:
        log.error("%s", exc)
        print(f"calmd: {exc}", flush=True)
        return EXIT_ALREADY_RUNNING
    except (OSError, RuntimeError, CalmError) as exc:  # a bad path or file: one line, no traceback
        log.error("startup failed: %s", exc)
        print(f"calmd: startup failed: {exc}", flush=True)
        return EXIT_STARTUP_FAILURE
    except Exception as exc:
        log.exception("startup failed")
        print(f"calmd: startup failed: {exc}", flush=True)
        return EXIT_STARTUP_FAILURE
    busy = [t.name for t in threading.enumerate() if t.name.startswith("calmd-infer") and t.is_alive()]
    if busy:
        # A worker stuck in the model (or in a file it cannot read) would block the interpreter's
        # exit for good: everything else is closed, so leave without it.
        log.warning("the inference thread did not finish (%s): exiting without it", ", ".join(busy))
        _hard_exit(0)
    log.info("calmd stopped")
    return 0
