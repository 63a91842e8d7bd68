"""calmd: the daemon. One `Server` object wires the transport (calmd/daemon/transport.py: the
socket, connections, framing, bounds) to the service (calmd/daemon/service.py: what each request
means), hosts the model and reports status.

- CALM_HOME is made private at start (0700, calmd's files in it 0600; the umask is 077), and
  what killed training runs left there is removed;
- asyncio on uvloop (asyncio's own loop when uvloop is missing); completions on one worker thread;
- the weight file is watched (watchfiles) and reloaded when it changes (inode, mtime, size),
  debounced; a bad file is rejected, logged and shown by `status`, and the old model keeps
  serving; a bad file at start is no reason not to start: the packaged model serves until a good
  file appears; every engine is warmed up on the worker thread before it serves;
- the user's history ranker beside the weights (`ranker.json`, refitted by the training run) is
  watched and reloaded with them (the engine loader reads both); a bad ranker file is logged and
  the packaged ranker serves with the model (the engine says so in `status`);
- SIGTERM/SIGINT (or a `shutdown` request): stop accepting, answer in-flight requests, stop the
  training run, remove the socket file we bound, exit, all within `graceful_timeout` seconds: a
  worker thread that does not finish (a hung model) is abandoned, and a watchdog ends the
  process if anything else hangs. SIGHUP: reload the weights; or, for a `calmd serve` typed at a
  prompt (stdin a terminal: `hangup_stops`), stop as SIGTERM does, since its terminal closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchfiles import awatch  # imported before `ready`: 60 ms that would delay the first request

from calmd import __version__, paths
from calmd.daemon.catch_up import CatchUp, freeze_heap
from calmd.daemon.config import ServerConfig
from calmd.daemon.reload import load_beside
from calmd.daemon.scheduler import FairScheduler
from calmd.daemon.search import SearchService
from calmd.daemon.service import Engine, EngineLoader, Service
from calmd.daemon.trainer import Trainer
from calmd.daemon.transport import AlreadyRunning, Listener, bind_socket, systemd_socket
from calmd.daemon.worker import Worker, WorkerError, sync_turn
from calmd.errors import CalmError, one_line
from calmd.history.store import HistoryStore
from calmd.protocol import PROTOCOL_VERSION
from calmd.sync.config import SyncError
from calmd.sync.machine import Sync

log = logging.getLogger("calmd")

EXIT_ALREADY_RUNNING = 4
EXIT_STARTUP_FAILURE = 3
EXIT_SHUTDOWN_TIMEOUT = 1  # the watchdog ended a shutdown that overran graceful_timeout
RELOAD_ATTEMPTS = 5  # loads of a weight file that keeps changing under them before giving up
FileId = tuple[int, int, int, int]  # (device, inode, mtime in ns, size) of the weight file
# The first-start import leaves to the hooks the entries timed from this long before the process
# started: a history's times are whole seconds, and the shell writes the line before it forks.
START_SLACK_S = 2.0
SHELLS = frozenset({"bash", "zsh", "fish", "sh", "dash", "ksh", "mksh", "tcsh", "csh"})
SHUTDOWN_READ_GRACE_S = 0.1  # on SIGTERM, requests already sent are still read for this long
SYNC_IDLE_CHECK_S = 5.0  # without sync set up, how often sync.json is looked for

# what the CLI and the tests take from here
__all__ = ["AlreadyRunning", "Engine", "EngineLoader", "Server", "ServerConfig", "run_server"]


class Server:
    def __init__(self, config: ServerConfig, engine_loader: EngineLoader) -> None:
        self.config = config
        self.engine_loader = engine_loader
        self.engine: Engine | None = None
        self.loaded_at: float | None = None
        self.loaded_id: FileId | None = None  # the weight file the engine was loaded from
        self.loaded_ranker_id: FileId | None = None  # ... and the user's ranker file beside it
        self.ranker_path = paths.ranker_path(config.weights_path)
        self.last_reload_error: str | None = None
        self.started = time.time()
        self.history: HistoryStore | None = None
        self.should_exit = asyncio.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="calmd-infer")
        # (a hot reload reads the new weights here, beside the keystrokes: calmd/daemon/reload.py)
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="calmd-load")
        self.scheduler = FairScheduler(self._pool)  # completions reach the pool only through it
        self._reload_lock = asyncio.Lock()
        self.socket_path: str = ""
        self._bound_socket: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket we bound
        self.serving_fallback = False  # the packaged model serves: the user's weights did not load
        self.trainer = Trainer(config.data_dir, config.weights_path, config.train_args, self.reload)
        self.service = Service(
            self, self.scheduler, self.trainer, history_context=config.history_context,
            train_threshold=config.train_threshold, train_max_load=config.train_max_load,
            prefetch=config.prefetch,
        )  # fmt: skip
        self.listener = Listener(
            self.service, max_connections=config.max_connections, reply_timeout_s=config.reply_timeout_s
        )
        self.disk = self.service.disk
        self.catch_up = CatchUp(self.scheduler, self.service)  # the indexes follow the store between keys
        self._import: asyncio.Future[Any] | None = None  # the first start's import of the shells' files
        self._importing = False  # that import reads files (its task goes on to the due check after)
        self._import_due = False  # it has files to read (looked for before `ready`)
        self.sync: Sync | None = None  # the history shared with the user's other machines (docs/sync.md)
        self._syncing: asyncio.Future[Any] | None = None
        store_path = paths.history_path(config.data_dir)  # imports and sync turns: in processes (worker.py)
        self.import_worker = Worker("import", store_path, config.data_dir, idle_exit_s=0)
        self.sync_worker = Worker("sync", store_path, config.data_dir)

    # -- the service's control -------------------------------------------------------------------

    def shutdown(self) -> None:
        self.should_exit.set()

    # -- lifecycle -------------------------------------------------------------------------------

    async def serve(self, sock: socket.socket | None = None) -> None:
        """Bind (or take systemd's socket), start, serve until told to stop, shut down. The socket
        file this daemon bound is removed on every way out: a stop, a start that fails after the
        bind (a store of a newer schema), an exception; SIGTERM and SIGINT are handled from the
        bind on (before, their default ended the process while the model loaded)."""
        loop = asyncio.get_running_loop()
        paths.private_data_dir(self.config.data_dir)  # before anything is written there
        if sock is None:
            sock = systemd_socket()
        if sock is None:
            sock = bind_socket(self.config.socket_path)
            st = self.config.socket_path.lstat()
            self._bound_socket = (st.st_dev, st.st_ino)
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_stop_signal, sig)
            await self._serve(sock, loop)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            self._remove_socket()

    async def _serve(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.socket_path = str(sock.getsockname())
        self.history = HistoryStore(paths.history_path(self.config.data_dir))
        self.service.history = self.history
        self.sync = Sync(self.history, self.config.data_dir)
        self.trainer.clean_leftovers()
        await self.reload()
        if self.config.hangup_stops:  # the terminal `calmd serve` was typed in closed
            loop.add_signal_handler(signal.SIGHUP, self._on_stop_signal, signal.SIGHUP)
        else:
            loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        if self.should_exit.is_set():  # SIGTERM or SIGINT while it started: not a request served
            return
        scheduler = asyncio.ensure_future(self.scheduler.run())
        self.listener.start(sock)
        watcher = asyncio.ensure_future(self._watch_weights())
        await asyncio.sleep(0)  # its first step sets up the inotify watch: later changes are seen
        if self._files_changed():  # changed between the load and the watch
            await self.reload()
        self.service.search = SearchService(self.history, pause=self.service.gate.pause)
        self.service.search.start()  # built in the background: a search waits for it only until it is
        if self.config.import_shell_history:  # its files looked for, its worker forked (not beside a key)
            self._import_due = await self.import_worker.start_for_first_import(self.history, Path.home())
        freeze_heap(full=True)  # the model and the index: a full collection never walks them (catch_up.py)
        self.catch_up.start()  # before the first keystroke: it reads a few new rows, not thousands
        log.info("calmd %s ready on %s (protocol %d)", __version__, self.socket_path, PROTOCOL_VERSION)
        print(f"calmd ready on {self.socket_path}", flush=True)
        if self.config.import_shell_history:
            # After `ready`, in batches (the store's lock is free between two): however large the files,
            # the daemon answers from the start (docs/history.md, "Importing"). (Set here, not in the
            # task: a status answered before its first step says so too.)
            self.service.hold_training = "the first-start import of the shells' history files runs"
            self._importing = True
            self._import = asyncio.ensure_future(self._import_then_check())
        else:
            await self._due_check("start")  # commands counted before a restart
        timer = asyncio.ensure_future(self._training_timer())
        syncer = asyncio.ensure_future(self._sync_loop())
        try:
            await self.should_exit.wait()
        finally:
            timer.cancel()
            syncer.cancel()
            self.catch_up.stop()
            await self._shutdown(watcher, scheduler)

    async def _import_then_check(self) -> None:
        """The first-start import, then the due check: automatic runs wait for the import (a run
        started half-way would train on half the history), then the imported commands count. (The
        caller set `hold_training` and `_importing`; both end with the import.)"""
        try:
            await self._first_imports()
        except WorkerError as exc:  # the store's counters say what each file did; this, what the worker did
            log.error("the first-start import failed: %s", exc)
        finally:
            # both at once: status never says "import running" beside a due run waiting for nothing
            self._importing = False
            self.service.hold_training = None
            self.catch_up.poke()
        if not self.should_exit.is_set():
            await self._due_check("after the first-start import")

    async def _training_timer(self) -> None:
        """The due check every `train_check_interval_s`: a due run that waited for the load (or for
        someone else's run to end) starts once it can, without a new command to trigger it."""
        interval = self.config.train_check_interval_s
        if interval <= 0:
            return
        while not self.should_exit.is_set():
            await asyncio.sleep(interval)
            await self._due_check("timer")

    async def _due_check(self, why: str) -> None:
        """The due check outside a request: what fails there (a full disk, a training.log that
        is not a file) is logged, and the next check tries again; the daemon serves on."""
        try:
            await self.service.check_training(why)
        except Exception as exc:
            log.error("the training due check (%s) failed: %s", why, exc)

    async def _sync_loop(self) -> None:
        """Export and import through the sync folder every `interval_s` of sync.json (read again at
        each turn: `calm sync --folder` takes effect without a restart), on a thread; what fails
        (the folder gone, no key) is logged once and shown by `status`, and the daemon serves on."""
        while not self.should_exit.is_set():
            interval = SYNC_IDLE_CHECK_S
            try:
                config = self.sync.config() if self.sync is not None else None
                if config is not None:
                    interval = config.interval_s
                    self._syncing = asyncio.ensure_future(self._sync_once())
                    await asyncio.shield(self._syncing)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._sync_failed(exc)
            await asyncio.sleep(interval)

    async def _sync_once(self) -> None:
        assert self.sync is not None
        report = await sync_turn(self.sync_worker)
        self.catch_up.poke()
        if report is not None:
            self.sync.last_run = time.time()
            self.sync.last_error = report.git or None
            if report.exported or report.imported or report.forgotten or report.forgets_sent:
                log.info("sync: sent %d records and %d forgets, received %d records and %d forgets%s",
                         report.exported, report.forgets_sent, report.imported, report.forgotten,
                         f" ({report.bad_times} with an impossible time: kept without it)"
                         if report.bad_times else "")  # fmt: skip

    def _sync_failed(self, exc: Exception) -> None:
        said = isinstance(exc, SyncError | OSError | WorkerError)  # (a worker's error has its words already)
        why = str(exc) if said else f"{type(exc).__name__}: {exc}"
        if self.sync is not None:
            if self.sync.last_error != why:  # said once, not at every turn
                log.error("sync failed: %s", why)
            self.sync.last_error = why

    async def _first_imports(self) -> None:
        """~/.bash_history and ~/.zsh_history at the first start, fish's history while it was never
        read whole (calmd/history/fish.py): in batches, in the import worker, which the shutdown
        stops after its batch."""
        # Started at a shell's prompt (`calmd serve`), the entry timed as this daemon started is
        # the command that started it (zsh and fish write a command when it starts), still
        # running: not imported as a finished command without a status; the hook records it when
        # it ends, with its status. (Started by systemd or a hook's helper, no entry is.)
        leave_after = process_started() - START_SLACK_S if started_by_a_shell() else None
        assert self.history is not None
        if self._import_due:  # looked for before `ready`: a process only for files
            await self.import_worker.run("first_import", home=str(Path.home()), leave_after=leave_after)

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        if not self.should_exit.is_set():
            log.info("received %s: shutting down (at most %g s)", sig.name, self.config.graceful_timeout)
        self.should_exit.set()

    async def _shutdown(self, watcher: asyncio.Future[None], scheduler: asyncio.Future[None]) -> None:
        """Everything within graceful_timeout; the watchdog ends the process if this overruns."""
        timeout = self.config.graceful_timeout
        start_watchdog(timeout, self._remove_socket)
        deadline = time.monotonic() + timeout
        watcher.cancel()
        self.listener.stop()
        # Connections are still read for a moment, so that what a client sent just before the
        # signal is answered too; they are closed once the in-flight requests are answered.
        await asyncio.sleep(SHUTDOWN_READ_GRACE_S)
        inflight = self.listener.inflight
        log.info("shutting down: answering %d in-flight requests", len(inflight))
        trainer_stopped = asyncio.ensure_future(self.trainer.stop(max(0.0, timeout * 0.6)))
        # an import stops after its batch (the next start goes on from there); a sync turn ends
        left = max(0.0, deadline - time.monotonic() - 0.3)
        stopping = (self.import_worker.stop(left), self.sync_worker.stop(left))
        workers = asyncio.ensure_future(asyncio.gather(*stopping))
        # a hung model never answers: leave time for the rest
        while inflight and time.monotonic() < deadline - 1.0:
            await asyncio.wait(set(inflight), timeout=max(0.0, deadline - time.monotonic() - 1.0))
        self.listener.close_all()
        scheduler.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loader.shutdown(wait=False, cancel_futures=True)
        if self.service.search is not None:
            self.service.search.close()
        self.disk.close()
        await asyncio.wait([trainer_stopped], timeout=max(0.0, deadline - time.monotonic() - 0.5))
        await asyncio.wait([workers], timeout=max(0.0, deadline - time.monotonic() - 0.3))
        if self._import is not None:
            await asyncio.wait([self._import], timeout=max(0.0, deadline - time.monotonic() - 0.3))
        if self._syncing is not None and not self._syncing.done():  # its batch ends; the next start goes on
            await asyncio.wait([self._syncing], timeout=max(0.0, deadline - time.monotonic() - 0.3))
        if self.history is not None:
            # under its lock, which a hung worker may hold: do not wait past the deadline
            closing = asyncio.ensure_future(asyncio.to_thread(self.history.close))
            await asyncio.wait([closing], timeout=max(0.0, deadline - time.monotonic() - 0.2))
        self._remove_socket()

    def _remove_socket(self) -> None:
        """Remove the socket file if we bound it and it is still ours (under socket activation
        systemd owns it; CALMD_KEEP_SOCKET keeps it for a test). Safe to call again: once removed
        (or replaced by another daemon's), it is left alone."""
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
                    before, ranker_before = self._weights_id(), self._ranker_id()
                    if self.engine is None:  # the start: nothing to answer meanwhile
                        engine = await loop.run_in_executor(self._pool, self._load_warm, path)
                    else:
                        engine = await load_beside(path, self.engine_loader, self._loader, self.scheduler,
                                                   self._attach)  # fmt: skip
                    if self._weights_id() == before and self._ranker_id() == ranker_before:
                        break
                else:
                    log.warning("%s kept changing while it loaded: serving the last one read", path)
                    before = ranker_before = None  # the watcher's next look reloads it
                loaded = before
            except Exception as exc:  # a bad file must never take the daemon down
                self.last_reload_error = f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {exc}"
                if self.engine is not None:
                    log.error("reload of %s failed, keeping the current model: %s", path, exc)
                    return {"ok": False, "reload_error": self.last_reload_error}
                log.error("%s did not load, serving the packaged model until it does: %s", path, exc)
                identity, ranker_identity = self._weights_id(), self._ranker_id()
                fallback = self.config.fallback_weights
                engine = await loop.run_in_executor(self._pool, self._load_warm, fallback)
                self._install(engine, identity, ranker_identity, fallback=True)
                return {"ok": False, "reload_error": self.last_reload_error}
            self.last_reload_error = None
            self._install(
                engine, loaded, ranker_before, fallback=loaded is None and not path.exists()
            )  # no file: the loader's default
            return {"ok": True}

    def _install(
        self, engine: Engine, identity: FileId | None, ranker_identity: FileId | None, *, fallback: bool
    ) -> None:
        self._attach(engine)
        self.engine = self.service.engine = engine
        self.loaded_at = time.time()
        self.loaded_id = identity  # a bad file's too: the watcher retries when it changes
        self.loaded_ranker_id = ranker_identity
        self.serving_fallback = fallback
        log.info("model loaded: %s", engine.describe().get("path"))

    async def _watch_weights(self) -> None:
        folder = self.config.weights_path.parent
        folder.mkdir(parents=True, exist_ok=True)
        targets = {self.config.weights_path.name, self.ranker_path.name}
        async for changes in awatch(
            folder,
            debounce=self.config.reload_debounce_ms,
            step=50,
            watch_filter=lambda _change, p: Path(p).name in targets,
            stop_event=self.should_exit,
        ):
            del changes
            # a new file, or none any more (`calm rollback` with no previous weights moved it
            # aside): the packaged model (or ranker) serves then
            if self._files_changed():
                await self.reload()

    def _files_changed(self) -> bool:
        return self._weights_id() != self.loaded_id or self._ranker_id() != self.loaded_ranker_id

    def _weights_id(self) -> FileId | None:
        """Which file the weight path names now: a swap by rename changes the inode even when the
        two files share an mtime."""
        return file_id(self.config.weights_path)

    def _ranker_id(self) -> FileId | None:
        return file_id(self.ranker_path)

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
                "running": self._importing,
                "refused": store.counter("import_refused"),
                "last_refused": store.note("last_import_refused"),
                "failures": store.counter("import_failures"),
                "bad_times": store.counter("import_bad_times"),  # kept without their impossible time
                "damaged": store.counter("import_damaged"),  # entries with a crash's NULs: skipped
            },
        }

    def _training_wait(self) -> dict[str, Any]:
        if self.history is None:
            return {}
        wait = self.service.training_wait()
        return {**wait, "check_interval_s": self.config.train_check_interval_s}

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
            # the user's weights were rolled back to the packaged model (`calm rollback` moved them
            # to shell.prev.cwgt, which the next rollback brings back): not "not trained yet"
            "rolled_back": not self.config.weights_path.exists()
            and paths.prev_weights_path(self.config.weights_path).is_file(),
            "loaded_at": self.loaded_at,
            "last_reload_error": self.last_reload_error,
            "requests": self.listener.requests,
            "errors": self.listener.errors,
            "withheld_candidates": self.service.withheld,
            "latency_ms": self.service.latency_status(),
            "history": self._history_status(),
            "training": {**self.trainer.status(self.config.train_threshold), **self._training_wait()},
            # `first_keys`: first keys of a line answered at once from the empty prompt's answer;
            # `keyed`: empty-prompt answers sent with their first keys (zsh draws those itself)
            "prefetch": {**self.service.prefetch_stats, **self.service.answers.describe()},
            "disk": self._disk_status(),
            "context": self.disk.describe(),
            "search": self.service.search.describe() if self.service.search is not None else {"ready": False},
            "sync": self.sync.describe() if self.sync is not None else {"enabled": False},
        }


def process_started() -> float:
    """When this process started, in seconds since the epoch (Linux's /proc), else now: the
    moment its command line was run, before the interpreter's start."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))  # fmt: skip
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def started_by_a_shell() -> bool:
    """Whether this process's parent is a shell (the user typed `calmd serve` at its prompt)."""
    try:
        parent = Path(f"/proc/{os.getppid()}/comm").read_text().strip().lstrip("-")
    except OSError:
        return False
    return parent in SHELLS


def file_id(path: Path) -> FileId | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


_watchdog_started = threading.Event()


def start_watchdog(timeout: float, before_exit: Callable[[], None] = lambda: None) -> None:
    """End the process `timeout` seconds from now if it is still there: SIGTERM always stops the
    daemon, whatever hangs (a worker thread, a lock, a client that never reads). `before_exit`
    runs first (the socket file's removal: os._exit skips every `finally`)."""
    if _watchdog_started.is_set():
        return
    _watchdog_started.set()

    def bark() -> None:
        time.sleep(timeout)
        log.error("shutdown did not finish within %g s: exiting now", timeout)
        with contextlib.suppress(Exception):
            before_exit()
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
    except AlreadyRunning as exc:  # the tools' one error line (arguments.run_tool), its own exit code
        log.error("%s", exc)
        print(f"calmd: error: {one_line(exc)}", flush=True)
        return EXIT_ALREADY_RUNNING
    except (OSError, RuntimeError, CalmError) as exc:  # a bad path or file: one line, no traceback
        log.error("startup failed: %s", one_line(exc))
        print(f"calmd: error: {one_line(exc)}", flush=True)
        return EXIT_STARTUP_FAILURE
    except Exception as exc:
        log.exception("startup failed")  # a bug: the traceback goes to the log
        print(f"calmd: error: unexpected {type(exc).__name__}: {one_line(exc)}", flush=True)
        return EXIT_STARTUP_FAILURE
    busy = [t.name for t in threading.enumerate() if t.name.startswith("calmd-infer") and t.is_alive()]
    if busy:
        # A worker stuck in the model (or in a file it cannot read) would block the interpreter's
        # exit for good: everything else is closed, so leave without it.
        log.warning("the inference thread did not finish (%s): exiting without it", ", ".join(busy))
        _hard_exit(0)
    log.info("calmd stopped")
    return 0
