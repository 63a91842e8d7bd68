"""calmd: the daemon. One `Server` object owns the socket, the history store and the model.

- asyncio on uvloop (asyncio's own loop when uvloop is missing);
- the socket comes from systemd (LISTEN_FDS) or is bound at the calmd.md path with mode 0600; a
  folder calmd creates for it is 0700, an existing one keeps its mode but is refused when another
  user could swap the socket in it (calmd.paths.socket_dir); peers of another uid are refused
  (SO_PEERCRED); a stale socket file left by a killed daemon is replaced, a live one means
  another daemon runs: refuse to start;
- CALM_HOME is made private at start (0700, calmd's files in it 0600; the umask is 077), and
  what killed training runs left there is removed;
- completions run on one worker thread, off the event loop, so `status` and `record` stay instant;
  a newer `complete` from the same session cancels the older one;
- the weight file is watched (watchfiles) and reloaded when its mtime changes, debounced; a bad
  file is rejected, logged and shown by `status`, and the old model keeps serving; a bad file at
  start is no reason not to start: the packaged model serves until a good file appears;
- background training is calmd/trainer.py's `Trainer`;
- SIGTERM/SIGINT (or a `shutdown` request): stop accepting, answer in-flight requests, stop the
  training run, remove the socket file we bound, exit, all within `graceful_timeout` seconds: a
  worker thread that does not finish (a hung model) is abandoned, and a watchdog ends the
  process if anything else hangs. SIGHUP: reload the weights.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
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
from typing import Any, Protocol

import msgpack
from watchfiles import awatch  # imported before `ready`: 60 ms that would delay the first request

from calmd import __version__, paths
from calmd.errors import DiskFull
from calmd.history import HistoryStore
from calmd.protocol import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    CompleteRequest,
    ProtocolError,
    RecordRequest,
    SimpleRequest,
    error_reply,
    parse_request,
    reply,
)
from calmd.trainer import Trainer

log = logging.getLogger("calmd")

EXIT_ALREADY_RUNNING = 4
EXIT_STARTUP_FAILURE = 3
EXIT_SHUTDOWN_TIMEOUT = 1  # the watchdog ended a shutdown that overran graceful_timeout
SD_LISTEN_FDS_START = 3


class Engine(Protocol):
    """What the server needs from the model side (calmd/engine.py implements it)."""

    def describe(self) -> dict[str, Any]: ...

    def attach_history(self, store: HistoryStore) -> None: ...

    def complete(
        self, ctx: dict[str, Any], n: int, session: str, cancelled: threading.Event
    ) -> Iterator[tuple[str, float]]: ...


EngineLoader = Callable[[Path], Engine]


class AlreadyRunning(RuntimeError):
    pass


@dataclass(frozen=True)
class ServerConfig:
    socket_path: Path = field(default_factory=paths.socket_path)
    data_dir: Path = field(default_factory=paths.data_dir)
    weights_path: Path = field(default_factory=paths.weights_path)
    reload_debounce_ms: int = 300
    history_context: int = 5  # history frames put in the model's context when the client sends none
    import_shell_history: bool = True  # import ~/.bash_history and ~/.zsh_history on first start
    train_threshold: int = 200  # new commands before a background run; 0: only on request
    train_max_load: float = 1.0  # start automatically only when the 1-minute load is below this
    train_args: tuple[str, ...] = ()  # extra `python -m calmd.continual` arguments (tests shorten runs)
    graceful_timeout: float = 5.0  # SIGTERM to exit, at most (in-flight answers, the trainer's stop)
    fallback_weights: Path = field(default_factory=paths.packaged_weights)  # when the user's do not load


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
            raise RuntimeError(f"{path} exists and is not a socket; refusing to replace it")
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
    sock.listen(64)
    return sock


def peer_uid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


# --------------------------------------------------------------------------- the server


class Server:
    def __init__(self, config: ServerConfig, engine_loader: EngineLoader) -> None:
        self.config = config
        self.engine_loader = engine_loader
        self.engine: Engine | None = None
        self.loaded_at: float | None = None
        self.loaded_mtime: float | None = None
        self.last_reload_error: str | None = None
        self.started = time.time()
        self.requests = 0
        self.errors = 0
        self.first_ms = LatencyStats()
        self.done_ms = LatencyStats()
        self.history: HistoryStore | None = None
        self.should_exit = asyncio.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="calmd-infer")
        self._inflight: set[asyncio.Task[None]] = set()
        self._sessions: dict[str, threading.Event] = {}
        self._reload_lock = asyncio.Lock()
        self._server: asyncio.base_events.Server | None = None
        self.socket_path: str = ""
        self._bound_socket: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket we bound
        self.serving_fallback = False  # the packaged model serves: the user's weights did not load
        self.trainer = Trainer(config.data_dir, config.weights_path, config.train_args, self.reload)
        self._recent_cache: dict[str, list[dict[str, Any]]] = {}

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
        self.history = HistoryStore(self.config.data_dir / "history.sqlite3")
        self.trainer.clean_leftovers()
        if self.config.import_shell_history:
            await asyncio.to_thread(self._first_start_import)
        await self.reload()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        self._server = await asyncio.start_unix_server(self._handle, sock=sock, limit=MAX_MESSAGE_BYTES)
        watcher = asyncio.ensure_future(self._watch_weights())
        await asyncio.sleep(0)  # its first step sets up the inotify watch: later changes are seen
        if self._weights_mtime() != self.loaded_mtime:  # changed between the load and the watch
            await self.reload()
        log.info("calmd %s ready on %s (protocol %d)", __version__, self.socket_path, PROTOCOL_VERSION)
        print(f"calmd ready on {self.socket_path}", flush=True)
        try:
            await self.should_exit.wait()
        finally:
            await self._shutdown(watcher)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        if not self.should_exit.is_set():
            log.info("received %s: shutting down (at most %g s)", sig.name, self.config.graceful_timeout)
        self.should_exit.set()

    async def _shutdown(self, watcher: asyncio.Future[None]) -> None:
        """Everything within graceful_timeout; the watchdog ends the process if this overruns."""
        timeout = self.config.graceful_timeout
        start_watchdog(timeout)
        deadline = time.monotonic() + timeout
        watcher.cancel()
        if self._server is not None:
            self._server.close()
        for _ in range(3):  # requests that already arrived: read and dispatch them (poll, wake, run)
            await asyncio.sleep(0)
        log.info("shutting down: answering %d in-flight requests", len(self._inflight))
        # the run writes only temp files until its final rename: stopping it loses nothing
        trainer_stopped = asyncio.ensure_future(self.trainer.stop(max(0.0, timeout * 0.6)))
        if self._inflight:  # a hung model never answers: leave time for the rest
            await asyncio.wait(self._inflight, timeout=max(0.0, deadline - time.monotonic() - 1.0))
        self._pool.shutdown(wait=False, cancel_futures=True)
        await asyncio.wait([trainer_stopped], timeout=max(0.0, deadline - time.monotonic() - 0.5))
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

    def _first_start_import(self) -> None:
        assert self.history is not None
        if self.history.counter("first_start_done"):
            return
        home = Path.home()
        for name in (".bash_history", ".zsh_history"):
            path = home / name
            if path.is_file():
                try:
                    result = self.history.import_file(path)
                    log.info("imported %d commands from %s", result.imported, path)
                except OSError as exc:
                    log.warning("could not import %s: %s", path, exc)
        with self.history._lock:
            self.history._meta_set("first_start_done", "1")

    # -- model hosting ---------------------------------------------------------------------------

    async def reload(self) -> dict[str, Any]:
        """Load the weight file in a thread; keep the old engine when the new file is bad. With
        no engine yet (the start), a bad file gives way to the packaged model, and the error
        shows in `status` until a good file is loaded."""
        async with self._reload_lock:
            path = self.config.weights_path
            loop = asyncio.get_running_loop()
            mtime = self._weights_mtime()
            try:
                engine = await loop.run_in_executor(self._pool, self.engine_loader, path)
            except Exception as exc:  # a bad file must never take the daemon down
                self.last_reload_error = f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {exc}"
                if self.engine is not None:
                    log.error("reload of %s failed, keeping the current model: %s", path, exc)
                    return {"ok": False, "reload_error": self.last_reload_error}
                log.error("%s did not load, serving the packaged model until it does: %s", path, exc)
                fallback = self.config.fallback_weights
                engine = await loop.run_in_executor(self._pool, self.engine_loader, fallback)
                self._install(engine, mtime, fallback=True)
                return {"ok": False, "reload_error": self.last_reload_error}
            self.last_reload_error = None
            self._install(engine, mtime, fallback=mtime is None)  # no file: the loader's default
            return {"ok": True}

    def _install(self, engine: Engine, mtime: float | None, *, fallback: bool) -> None:
        if self.history is not None:
            engine.attach_history(self.history)
        self.engine = engine
        self.loaded_at = time.time()
        self.loaded_mtime = mtime  # a bad file's too: the watcher retries when it changes
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
            mtime = self._weights_mtime()
            if mtime is not None and mtime != self.loaded_mtime:
                await self.reload()

    def _weights_mtime(self) -> float | None:
        try:
            return self.config.weights_path.stat().st_mtime
        except OSError:
            return None

    # -- connections -------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        uid = peer_uid(sock) if sock is not None else None
        if uid is not None and uid != os.getuid():
            log.warning("refused a connection from uid %d", uid)
            writer.write(msgpack.packb(error_reply(None, "forbidden", "peer belongs to another user")))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=MAX_MESSAGE_BYTES, strict_map_key=False)
        conn_tasks: set[asyncio.Task[None]] = set()
        try:
            while not self.should_exit.is_set():
                data = await reader.read(65536)
                if not data:
                    break
                try:
                    unpacker.feed(data)
                    messages = list(unpacker)
                except (msgpack.exceptions.BufferFull, ValueError, msgpack.exceptions.ExtraData) as exc:
                    self.errors += 1
                    log.warning("closing a connection after an undecodable or oversized message: %s", exc)
                    self._send(
                        writer, error_reply(None, "bad_message", f"undecodable or oversized message: {exc}")
                    )
                    break  # the stream cannot be resynchronised
                for message in messages:
                    task = asyncio.ensure_future(self._dispatch(message, writer))
                    conn_tasks.add(task)
                    self._inflight.add(task)
                    task.add_done_callback(conn_tasks.discard)
                    task.add_done_callback(self._inflight.discard)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if conn_tasks:
                await asyncio.wait(conn_tasks, timeout=5.0)
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()
            writer.close()

    def _send(self, writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        if not writer.is_closing():
            writer.write(msgpack.packb(message, use_bin_type=True))

    async def _dispatch(self, message: Any, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        try:
            request = parse_request(message)
            if isinstance(request, CompleteRequest):
                await self._complete(request, writer)
            elif isinstance(request, RecordRequest):
                self._send(writer, reply(request.id, **await self._record(request)))
            else:
                self._send(writer, reply(request.id, **await self._simple(request)))
        except ProtocolError as exc:
            self.errors += 1
            self._send(writer, error_reply(exc.request_id, exc.code, exc.message))
        except DiskFull as exc:
            self.errors += 1
            rid = message.get("id") if isinstance(message, dict) else None
            log.error("disk full: %s", exc)
            self._send(writer, error_reply(rid if isinstance(rid, int) else None, "disk_full", str(exc)))
        except Exception as exc:  # never a dead daemon: log, answer, carry on
            self.errors += 1
            rid = message.get("id") if isinstance(message, dict) else None
            log.exception("request failed")
            self._send(writer, error_reply(rid if isinstance(rid, int) else None, "internal", str(exc)))
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()

    async def _record(self, request: RecordRequest) -> dict[str, Any]:
        assert self.history is not None
        result = await asyncio.to_thread(
            self.history.record,
            request.cmd,
            exit=request.exit,
            cwd=request.cwd,
            git=request.git,
            session=request.session,
            ts=request.ts,
        )
        if result.stored:
            self._recent_cache.clear()  # other sessions top up with this command too
        if result.stored and self.config.train_threshold and self._trainer_idle():
            pending = self.history.counter("recorded_since_train")
            if pending >= self.config.train_threshold and os.getloadavg()[0] < self.config.train_max_load:
                await self.start_training("threshold")
        return {"ok": True, "stored": result.stored, **({"reason": result.reason} if result.reason else {})}

    def _recent_history(self, session: str) -> list[dict[str, Any]]:
        """The context's history frames, cached per session until the next stored command (a
        keystroke must not cost a database query)."""
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

    def _trainer_idle(self) -> bool:
        return not self.trainer.running

    async def start_training(self, why: str) -> dict[str, Any]:
        """A background run (calmd/trainer.py); the count of new commands restarts with it."""
        result = await self.trainer.start(why)
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
        raise ProtocolError(
            "not_available", f"op {request.op!r} is not available in this version", request.id
        )

    async def _complete(self, request: CompleteRequest, writer: asyncio.StreamWriter) -> None:
        start = time.perf_counter()
        engine = self.engine
        if engine is None:
            raise ProtocolError("no_model", "no model is loaded", request.id)
        ctx = dict(request.ctx)
        if not request.history_given and self.history is not None:
            ctx["history"] = self._recent_history(request.session)
        # A newer request of the same session cancels the older one.
        cancelled = threading.Event()
        if request.session:
            previous = self._sessions.get(request.session)
            if previous is not None:
                previous.set()
            self._sessions[request.session] = cancelled
        loop = asyncio.get_running_loop()
        first: list[float] = []

        def emit(candidate: str, score: float) -> None:
            if not first:
                first.append((time.perf_counter() - start) * 1e3)
            self._send(writer, reply(request.id, candidate=candidate, score=round(score, 4)))

        def work() -> bool:
            if cancelled.is_set():
                return False
            for candidate, score in engine.complete(ctx, request.n, request.session, cancelled):
                if cancelled.is_set():
                    return False
                loop.call_soon_threadsafe(emit, candidate, score)
            return not cancelled.is_set()

        try:
            finished = request.n == 0 or await loop.run_in_executor(self._pool, work)
        finally:
            if request.session and self._sessions.get(request.session) is cancelled:
                del self._sessions[request.session]
        await asyncio.sleep(0)  # let the emits scheduled by the worker run before `done`
        ms = (time.perf_counter() - start) * 1e3
        if finished:
            self.done_ms.add(ms)
            if first:
                self.first_ms.add(first[0])
            self._send(writer, reply(request.id, done=True, ms=round(ms, 3)))
        else:
            self._send(writer, reply(request.id, done=True, cancelled=True, ms=round(ms, 3)))

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
            "latency_ms": {
                "first_p50": self.first_ms.percentile(50),
                "first_p99": self.first_ms.percentile(99),
                "done_p50": self.done_ms.percentile(50),
                "done_p99": self.done_ms.percentile(99),
            },
            "history": {
                "commands": self.history.count() if self.history else 0,
                "dropped_secrets": self.history.counter("dropped_secrets") if self.history else 0,
                "since_last_training": self.history.counter("recorded_since_train") if self.history else 0,
            },
            "training": self.trainer.status(self.config.train_threshold),
            "disk": self._disk_status(),
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
