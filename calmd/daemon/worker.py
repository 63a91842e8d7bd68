"""The daemon's heavy store work in a process of its own: the first start's import of the shells'
history files and each sync turn (export, import of what the other machines sealed).

Run in a thread of the daemon, they held the interpreter the keystrokes need: a keystroke waited
for the GIL behind the import's parsing, its credential checks and its inserts, 245-887 ms while a
sync imported 100,000 records (issue 42). Here they run in `python -m calmd.daemon.worker`, which
opens the same store (SQLite in WAL mode: the daemon reads while it writes, and a batch commits at
a time, so a `record` waits for one batch at most) at a lower CPU priority (nice +WORKER_NICE):
when the cores are contended, the keystrokes go first; on an idle core it runs at full speed. The
daemon's in-memory indexes catch up with the rows it wrote in slices between keystrokes
(calmd/daemon/catch_up.py).

The child reads one JSON job a line on stdin and answers one JSON line on stdout; it runs one job
at a time and exits at the end of its stdin. The daemon starts it when a job comes and closes its
stdin after IDLE_EXIT_S without one (a sync every 30 s keeps one process instead of starting one
per turn: 0.15 s of CPU each). SIGTERM (the daemon's shutdown) stops an import after its batch (the
next start goes on from there) and lets a sync turn end; the child is in a session of its own, so a
Ctrl-C typed at `calmd serve` reaches the daemon, which tells it. A daemon that dies takes its
worker with it (Linux's parent-death signal), as it took its threads: a worker left behind would
hold the sync lock from the next daemon; what a killed job committed stays, its open batch does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from calmd.history.store import HistoryStore
from calmd.sync.state import SyncReport

log = logging.getLogger("calmd")

WORKER_NICE = 10  # the child's niceness over the daemon's: below the keystrokes, above a training run
IDLE_EXIT_S = 120.0  # a worker with no job this long goes (the next job starts another)
MAX_ANSWER_BYTES = 1 << 20  # a job's answer line, at most (a sync report's refusals are bounded)
READY = "ready"  # the child's first line


class WorkerError(Exception):
    """A job failed in the worker (or the worker died): its words, as the job's caller logs them."""


class Worker:
    """One child process running `job`s one at a time, on the event loop's side. `run` starts it
    when none is running; jobs submitted together wait for each other (`_lock`)."""

    def __init__(
        self, name: str, store_path: Path, data_dir: Path, *, idle_exit_s: float = IDLE_EXIT_S
    ) -> None:
        self.name = name
        self.store_path = store_path
        self.data_dir = data_dir
        self.idle_exit_s = idle_exit_s
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._idle: asyncio.TimerHandle | None = None
        self._ready = asyncio.Event()  # the child said it runs: its SIGTERM handler is in place
        self._stopping = False  # the daemon's shutdown began
        self.busy = False
        self.jobs = 0  # jobs answered (status)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def start_for_first_import(self, store: HistoryStore, home: Path) -> bool:
        """The child started before `ready` when the first-start import has files to read (the
        fork of the daemon, a few hundred MB of mappings, holds the event loop 10-20 ms, which the
        first keystroke after `ready` waited for); whether it has."""
        due = await asyncio.to_thread(first_import_due, store, home)
        if due:
            async with self._lock:
                await self._started()
        return due

    async def run(self, job: str, **args: Any) -> Any:
        """Run `job` (see `JOBS`) in the worker; its result, or WorkerError with the job's words."""
        async with self._lock:
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
            self.busy = True
            try:
                return await self._ask(job, args)
            finally:
                self.busy = False
                self.jobs += 1
                if self._proc is not None and self.idle_exit_s >= 0:
                    self._idle = asyncio.get_running_loop().call_later(self.idle_exit_s, self._close_stdin)

    async def _ask(self, job: str, args: dict[str, Any]) -> Any:
        proc = await self._started()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"job": job, "args": args}).encode() + b"\n")
        try:
            await proc.stdin.drain()
            line = await proc.stdout.readline()
        except (OSError, ValueError) as exc:  # ValueError: a line over the limit
            line = b""
            log.error("the %s worker's answer could not be read: %s", self.name, exc)
        if not line:
            code = await proc.wait()
            self._proc = None
            raise WorkerError(f"the {self.name} worker ended ({_ended(code)}) before it answered")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise WorkerError(str(answer.get("error")))
        return answer.get("result")

    async def _started(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        env = dict(os.environ)
        # the worker imports what the daemon imported (an editable or a PYTHONPATH checkout alike)
        root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "calmd.daemon.worker",
            str(self.store_path), str(self.data_dir), str(os.getpid()),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            start_new_session=True, limit=MAX_ANSWER_BYTES,
        )  # fmt: skip
        self._ready.clear()
        assert self._proc.stdout is not None
        said = await self._proc.stdout.readline()  # the child's first line: it runs, signals handled
        if said.strip() != READY.encode():
            code = await self._proc.wait()
            self._proc = None
            raise WorkerError(f"the {self.name} worker ended ({_ended(code)}) as it started")
        self._ready.set()
        if self._stopping:  # the daemon stops: the job about to come runs one batch
            self._proc.send_signal(signal.SIGTERM)
        log.debug("the %s worker started (pid %d)", self.name, self._proc.pid)
        return self._proc

    def _close_stdin(self) -> None:
        """No job for a while: the worker ends at the end of its stdin."""
        self._idle = None
        proc = self._proc
        if proc is not None and proc.stdin is not None and not self.busy:
            proc.stdin.close()
            self._proc = None

    async def stop(self, timeout: float) -> None:
        """The daemon's shutdown: an import stops after its batch (a job asked for before or after
        this runs one batch), a sync turn ends; waits at most `timeout` s for the child to exit
        (what goes on after, the child finishes alone)."""
        self._stopping = True
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        if self._ready.is_set():  # else `_started` says it once the child's handler is in place
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        if proc.stdin is not None and not self.busy:
            proc.stdin.close()  # idle: it ends at the end of its stdin (busy: after its answer)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=max(0.0, timeout))


def first_import_due(store: HistoryStore, home: Path) -> bool:
    """Whether the first-start import has a file to read (a worker is started only then):
    ~/.bash_history or ~/.zsh_history before the first start's import is done, fish's history
    while it was never read whole."""
    from calmd.history.fish import default_path
    from calmd.history.imports import SHELL_HISTORIES, import_position

    if not store.counter("first_start_done") and any((home / n).is_file() for n in SHELL_HISTORIES):
        return True
    fish = default_path()
    return fish.is_file() and not (import_position(store, fish) or "").endswith(":done")


async def sync_turn(worker: Worker) -> SyncReport | None:
    """One sync turn in `worker`: its report's counts (None: sync not set up, or another process
    holds the sync lock)."""
    found = await worker.run("sync")
    return None if found is None else SyncReport(**found)


def _ended(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit status {code}"


# -- the child ----------------------------------------------------------------------------------------


class _Jobs:
    """The child's side: the store opened once, a Sync kept across turns (its credential verdicts
    are worth keeping: a history repeats itself)."""

    def __init__(self, store_path: Path, data_dir: Path) -> None:
        self.store = HistoryStore(store_path)
        self.data_dir = data_dir
        self.stop = threading.Event()
        self._sync: Any = None

    def first_import(self, home: str, leave_after: float | None) -> dict[str, Any]:
        """~/.bash_history and ~/.zsh_history at the first start, fish's history while it was
        never read whole (calmd/history/fish.py): in batches, stopped by SIGTERM after one each."""
        from calmd.history.fish import import_first_start

        done = self.store.import_shell_histories(Path(home), self.stop, leave_after=leave_after)
        # (stopped, each import still does a batch: a daemon stopped as it started imports some)
        import_first_start(self.store, stop=self.stop, leave_after=leave_after)
        return {"stopped": self.stop.is_set(), "files": len(done.results)}

    def sync(self) -> dict[str, Any] | None:
        """One turn of calmd/sync/machine.py's `Sync.run`: its report's counts (what the daemon
        logs and keeps; the lists stay here), or None (not set up, or another process holds the
        sync lock)."""
        from calmd.sync.machine import Sync

        if self._sync is None:
            self._sync = Sync(self.store, self.data_dir)
        report = self._sync.run()
        if report is None:
            return None
        return {k: v for k, v in dataclasses.asdict(report).items() if isinstance(v, int | str)}


def _answer(jobs: _Jobs, request: dict[str, Any]) -> dict[str, Any]:
    from calmd.sync.config import SyncError

    name = request.get("job")
    args = request.get("args") or {}
    try:
        if name == "first_import":
            return {"ok": True, "result": jobs.first_import(**args)}
        if name == "sync":
            return {"ok": True, "result": jobs.sync()}
        return {"ok": False, "error": f"no job {name!r}"}
    except (SyncError, OSError) as exc:  # the folder gone, no key: its own words
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # a bug: its kind too (the traceback goes to the log)
        log.exception("the worker's %s failed", name)
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with(parent: int) -> None:
    """SIGKILL this process when `parent` (the daemon) dies; at once if it died already (Linux; a
    no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str]) -> int:
    die_with(int(argv[2]))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s calmd-worker: %(message)s")
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)
    jobs = _Jobs(Path(argv[0]), Path(argv[1]))
    signal.signal(signal.SIGTERM, lambda *_: jobs.stop.set())
    signal.signal(signal.SIGINT, lambda *_: jobs.stop.set())
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    try:
        for line in sys.stdin:
            answer = _answer(jobs, json.loads(line))
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
            if jobs.stop.is_set():
                break
    except BrokenPipeError:  # the daemon is gone: what was stored stays
        pass
    finally:
        jobs.store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
