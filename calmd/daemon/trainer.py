"""The daemon's background training: it starts `python -m calmd.training.background`, watches it, stops it,
and tells `status` what it is doing or why it ended.

- The run is started niced (19), one thread, output in `training.log` (0600) in the data dir.
- It dies with the daemon: between fork and exec the child asks the kernel for SIGKILL when its
  parent exits (PR_SET_PDEATHSIG), then checks that the parent is still the daemon (it may have
  died in between); the run also checks at every step (`--parent-pid`).
- One run per CALM_HOME: the run holds `training.lock`; the daemon starts none while anyone holds
  it (another daemon's run, a run started by hand) and reports who does; and one run per daemon,
  whatever the burst: deciding to start and starting are one step (`start`).
- No leftover: when the daemon sees its run end (a kill during evaluation), it removes what the
  run left (its candidate weights, its temp files), as it does at its own start.
- `status` tells a running run from a dead one by the lock, not by what `training.json` last
  said: a run killed mid-way left `training` there, and shows as `interrupted`. A failed run
  shows as `failed` with its reason, also when it could not write one (a full disk): the exit
  code says it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.training import background

log = logging.getLogger("calmd")

# what `status` shows of the last run: held-out loss per supervised token before and after, and
# whether (and why) its weights were swapped in, and whether the history ranker was refitted (on
# how many examples)
LAST_RESULT = ("state", "swapped", "reason", "finished", "old_loss", "new_loss", "steps",
               "ranker_refitted", "ranker_examples")  # fmt: skip
LOG_ROTATE_BYTES = 1 << 20  # training.log is moved to training.log.old past this, at a run's start
_PR_SET_PDEATHSIG = 1
# The test suite's hook (tests/support/daemon.py sets it for the daemons it starts): "inherit" leaves a run
# at the daemon's own priority, so that a machine kept busy at nice 0 (the suite's check beside two
# busy loops) cannot starve it for hours, as it starves SCHED_IDLE. A user's runs never see it; the
# lowest priority itself is tested without it (tests/daemon/test_trainer_due.py).
TEST_PRIORITY_ENV = "CALM_TEST_TRAIN_PRIORITY"


def child_setup(parent_pid: int) -> Callable[[], None]:
    """The trainer's `preexec_fn`: lowest priority, SIGKILL when the daemon exits, and exit at
    once if it already has. prctl is looked up here, in the parent: the child between fork and
    exec should do as little as it can."""
    try:
        prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):  # not Linux: the run's per-step parent check remains
        prctl = None
    lowest = os.environ.get(TEST_PRIORITY_ENV) != "inherit"

    def setup() -> None:
        if lowest:
            os.nice(19)
            # SCHED_IDLE: below nice 19 (weight 3 against 15), a keystroke's thread always goes first
            if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(background.EXIT_STOPPED)

    return setup


def _open_log(data_dir: Path) -> int:
    path = data_dir / paths.TRAINING_LOG
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_ROTATE_BYTES:
            path.replace(path.with_name(paths.TRAINING_LOG + ".old"))
    # O_NONBLOCK: a FIFO planted at the path fails here (ENXIO) instead of blocking the event loop
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    os.set_blocking(fd, True)  # what the run inherits: a plain log file
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o600)  # a log left 0644 by an older calmd
    return fd


def _exit_reason(pid: int, code: int) -> tuple[str, str] | None:
    """(state, reason) from the run's exit code, for when training.json does not tell."""
    if code == background.EXIT_DISK_FULL:
        return "failed", "disk full: the run could not write its files (training.log says which)"
    if code == background.EXIT_STOPPED:
        return "interrupted", "stopped (the daemon shut down)"
    if code < 0:
        return "interrupted", f"the run (pid {pid}) was killed by {signal.Signals(-code).name}"
    if code not in (background.EXIT_DONE, background.EXIT_LOCKED):
        return (
            "failed",
            f"the training process (pid {pid}) exited with code {code} (see {paths.TRAINING_LOG})",
        )
    return None


def exit_words(pid: int, code: int, info: dict[str, Any]) -> str:
    """What a run's end means, in words, for the log: its result when training.json is its own,
    else what its exit code says. Never `?` (issue 25: "training finished (exit 4): ?")."""
    if info.get("pid") == pid and info.get("reason") and info.get("state") not in background.RUNNING_STATES:
        return str(info["reason"])
    if code == background.EXIT_LOCKED:
        return f"not started: another training run held {paths.TRAINING_LOCK} (that run goes on)"
    if code == background.EXIT_DONE:
        return f"done, but it wrote no result to {paths.TRAINING_STATUS} (see {paths.TRAINING_LOG})"
    if code == background.EXIT_FAILED:
        return f"failed before it could write why (see {paths.TRAINING_LOG})"
    derived = _exit_reason(pid, code)
    assert derived is not None  # every other code has its words there
    return derived[1]


def _eta(info: dict[str, Any], now: float) -> float | None:
    """Seconds left in the training steps: the pace so far over the steps left, within the run's
    time budget; None before the first step says how fast they go."""
    step, total, since = info.get("step"), info.get("total_steps"), info.get("training_since")
    if not (isinstance(step, int) and isinstance(total, int) and isinstance(since, int | float)) or step <= 0:
        return None
    elapsed = max(0.0, float(info.get("updated") or now) - since)
    left = elapsed / step * max(0, total - step) - max(0.0, now - float(info.get("updated") or now))
    budget = info.get("deadline")
    if isinstance(budget, int | float):
        left = min(left, budget - now)
    return round(max(0.0, left), 1)


class Trainer:
    """Background training runs of one data dir, as the daemon sees them."""

    def __init__(
        self, data_dir: Path, weights_path: Path, extra_args: tuple[str, ...] = (),
        on_swapped: Callable[[], Awaitable[object]] | None = None,
    ) -> None:  # fmt: skip
        self.data_dir = data_dir
        self.weights_path = weights_path
        self.extra_args = extra_args
        self.on_swapped = on_swapped
        self._proc: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._last: tuple[int, int] | None = None  # (pid, exit code) of the daemon's last run
        self.last_disk_full: float | None = None
        self._starting = False  # between the decision to start a run and its process existing
        self._closed = False  # stopping with the daemon: no new run
        self.started = 0  # runs this daemon started

    @property
    def running(self) -> bool:
        """This daemon's run is alive."""
        return self._proc is not None and self._proc.returncode is None

    @property
    def busy(self) -> bool:
        """A run of this daemon is alive, or being started."""
        return self._starting or self.running

    def clean_after(self, pid: int) -> list[str]:
        """Once this daemon's run `pid` has ended (a kill in evaluation left its 6 MB candidate):
        what it left, unless another run (someone else's) already holds the lock."""
        if background.lock_holder(self.data_dir) is not None:
            return []
        removed = background.remove_run_files(self.data_dir, pid)
        if removed:
            log.info("removed what the ended training run (pid %d) left: %s", pid, ", ".join(removed))
        return removed

    def clean_leftovers(self) -> list[str]:
        """At the daemon's start: what killed runs left, unless a run (someone else's) is live."""
        if background.lock_holder(self.data_dir) is not None:
            return []
        removed = background.clean_leftovers(self.data_dir)
        if removed:
            log.info("removed what killed training runs left: %s", ", ".join(removed))
        return removed

    async def start(self, why: str, wanted: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Start a run unless one is alive or being started, or `wanted()` (the daemon's threshold
        and load rule) says there is no need. The decision and the claim are one step: nothing is
        awaited between the check and `_starting`, so a burst of callers (205 records in one
        write) starts one run, not one per record that saw no run yet."""
        if self._closed:
            return {"ok": True, "started": False, "reason": "the daemon is shutting down"}
        if self.busy:
            assert self._proc is not None or self._starting
            pid = self._proc.pid if self._proc is not None and self.running else None
            return {"ok": True, "started": False, "reason": "a training run is in progress", "pid": pid}
        if wanted is not None and not wanted():
            return {"ok": True, "started": False, "reason": "not due"}
        holder = background.lock_holder(self.data_dir)
        if holder is not None:
            return {"ok": True, "started": False, "pid": holder or None,
                    "reason": f"a training run (pid {holder}) already works on {self.data_dir}"}  # fmt: skip
        self._starting = True
        try:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            argv = [sys.executable, "-m", "calmd.training.background", "--data-dir", str(self.data_dir),
                    "--weights", str(self.weights_path), "--parent-pid", str(os.getpid()),
                    *self.extra_args]  # fmt: skip
            log_fd = _open_log(self.data_dir)
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *argv, env=env, stdout=log_fd, stderr=log_fd, stdin=asyncio.subprocess.DEVNULL,
                    preexec_fn=child_setup(os.getpid()),
                )  # fmt: skip
            finally:
                os.close(log_fd)
        finally:
            self._starting = False
        self.started += 1
        log.info("training started (%s): pid %d", why, self._proc.pid)
        self._watch = asyncio.ensure_future(self._await(self._proc))
        return {"ok": True, "started": True, "pid": self._proc.pid}

    async def _await(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        self._last = (proc.pid, code)
        if code != background.EXIT_LOCKED:  # a run that never held the lock wrote nothing
            self.clean_after(proc.pid)
        raw = background.read_status(self.data_dir)
        info = self._state(raw)
        reason = exit_words(proc.pid, code, raw)
        log.info("training finished (exit %d): %s", code, reason)
        if code == background.EXIT_DISK_FULL or str(reason).startswith("disk full"):
            self.last_disk_full = time.time()
        last = info.get("last_result") or {}
        if (last.get("swapped") or last.get("ranker_refitted")) and self.on_swapped is not None:
            await self.on_swapped()  # do not wait for the file watcher

    async def stop(self, timeout: float) -> None:
        """SIGTERM (the run writes `interrupted` and removes its temp files), SIGKILL after
        `timeout`. Stopping loses nothing: a run replaces files only by rename. No run starts after."""
        self._closed = True
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), max(0.0, timeout))
        except TimeoutError:
            log.warning("the training run (pid %d) did not stop on SIGTERM: killing it", proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 1.0)

    def status(self, threshold: int) -> dict[str, Any]:
        return {**self._state(), "threshold": threshold, "runs_started": self.started}

    def _state(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run's state for `status` from training.json (`info`, when the caller read it)."""
        if info is None:
            info = background.read_status(self.data_dir)
        running_pid: int | None = None
        if self.running:
            assert self._proc is not None
            running_pid = self._proc.pid
        else:
            running_pid = background.lock_holder(self.data_dir)
        progress: dict[str, Any] = {
            k: info[k] for k in ("step", "total_steps", "loss", "sequences", "held_out") if k in info
        }
        if "step" in info:
            progress["eta_s"] = _eta(info, time.time())
        if running_pid is not None:
            state = str(info.get("state")) if info.get("state") in background.RUNNING_STATES else "starting"
            if info.get("pid") not in (running_pid, None) and running_pid != 0:
                state, progress = "starting", {}  # training.json is still the previous run's
            elif info.get("pid") == running_pid and state == "starting" and info.get("state"):
                state = "finishing"  # its result is written; the process is exiting
            return {"state": state, "pid": running_pid or None, "progress": progress, "last_result": None}
        last = {k: info.get(k) for k in LAST_RESULT}
        state = str(info.get("state") or "idle")
        if self._last is not None:
            pid, code = self._last
            if info.get("pid") != pid or state in background.RUNNING_STATES:
                derived = _exit_reason(pid, code)  # training.json does not say how our run ended
                if derived is not None:
                    state, reason = derived
                    last = {"state": state, "swapped": False, "reason": reason, "finished": None}
        if state in background.RUNNING_STATES:  # nobody holds the lock: that run is dead
            state = "interrupted"
            reason = f"the run (pid {info.get('pid', '?')}) ended without a result (killed)"
            last = {"state": state, "swapped": False, "finished": info.get("updated"), "reason": reason}
        if state == "done":
            state = "idle"
        return {"state": state, "pid": None, "progress": progress,
                "last_result": last if info or self._last else None}  # fmt: skip
