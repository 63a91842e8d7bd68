"""The one way to start `calmd serve` for the tests and the benches (bench/harness.py).

`running_daemon(home)` starts it in a subprocess with its own HOME, data dir, runtime dir and socket
(`daemon_env`), waits for the daemon's own readiness signal, and stops it cleanly afterwards:

- ready: the daemon prints `calmd ready on SOCKET` once its socket listens (calmd/daemon/server.py),
  and every release since the first does. A thread reads the daemon's output as it comes (a
  blocking read, no polling) and sets an event on that line, or on the end of the output when the
  daemon exits first; the test blocks on it, with the ceiling of tests/support/waiting.py that only a hang
  reaches. A daemon that exits instead says why: its output is in the failure.
- stopped: SIGTERM, as systemd and `calmd stop` stop it, then its exit awaited (its graceful stop
  takes seconds on a busy machine); SIGKILL only after the ceiling.
- which daemon: this tree's `calmd` with the model ("model"), the same daemon with the scripted
  engine of tests/support/scripted_engine.py ("scripted", the default: the protocol, the scheduler and
  the shells without a model's latency), or another checkout's (`tree=`: an older release beside
  this one, for bench/harness.py's A/B runs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calmd import paths
from calmd.formats.cwgt import CwgtHeader, Metadata, write_cwgt
from tests.support.waiting import HANG_S, wait_until

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
READY = "calmd ready on"


def write_test_weights(path: Path, value: float = 0.0, n: int = 64) -> Path:
    header = CwgtHeader(
        d_model=8, n_layers=1, ffn_expand=0, expand=2, d_state=4, d_conv=4, dt_rank=1, param_count=0
    )
    return write_cwgt(path, header, np.full(n, value, np.float32), Metadata())


@dataclass
class Daemon:
    proc: subprocess.Popen[str]
    socket: Path
    home: Path
    output: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)  # its output closed: it exited
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None  # time.monotonic() when the ready line came
    _lines: threading.Condition = field(default_factory=threading.Condition)

    @property
    def start_s(self) -> float:
        """Seconds from the spawn to the ready line (bench/startup.py's cold start)."""
        assert self.ready_at is not None, "the daemon is not ready"
        return self.ready_at - self.started_at

    def wait(self, timeout: float = HANG_S) -> int:
        """Its exit status, once it exits (a stop asked by the test)."""
        return self.proc.wait(timeout=timeout)

    def read_output(self) -> str:
        """Whatever the daemon printed so far (stdout and stderr are merged)."""
        with self._lines:
            return "".join(self.output)

    def wait_for(self, text: str, count: int = 1, timeout: float = HANG_S) -> str:
        """Wait until the daemon's output holds `text` `count` times; return the output. Woken by
        each line the daemon prints; fails at once when the daemon exits without printing it."""
        with self._lines:
            done = self._lines.wait_for(
                lambda: "".join(self.output).count(text) >= count or self.ended.is_set(), timeout
            )
            output = "".join(self.output)
        if output.count(text) < count:
            why = "the daemon exited" if done else f"not after {timeout:.0f} s"
            raise AssertionError(f"{text!r} x{count} not in the daemon's output ({why}): {output}")
        return output

    def stop(self) -> int:
        """SIGTERM, then its exit status; SIGKILL after the ceiling (a daemon that hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"the daemon ignored SIGTERM for {HANG_S:.0f} s: {self.read_output()}"
                ) from None
        return self.proc.returncode

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lines:
                self.output.append(line)
                if READY in line and not self.ready.is_set():
                    self.ready_at = time.monotonic()
                    self.ready.set()
                self._lines.notify_all()
        with self._lines:
            self.ended.set()
            self._lines.notify_all()


# What the suite's daemons get besides (tests/conftest.py fills it; the benches leave it empty, so
# that they measure what a user runs): {"CALM_TEST_TRAIN_PRIORITY": "inherit"}, a training run at
# the daemon's priority instead of SCHED_IDLE, which a CPU hog at nice 0 starves (calmd/daemon/
# trainer.py). A test of the priority itself passes the variable as "" (dropped).
SUITE_ENV: dict[str, str] = {}


def daemon_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with its own HOME, data dir, runtime dir (0700, as logind makes it) and socket."""
    run = home / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    # Nothing of the developer's session: calm's variables, systemd's, and the active Python or
    # conda environment (the shells would record it as the ENV frame the tests expect empty).
    foreign = ("CALM", "LISTEN_", "NOTIFY_SOCKET", "CONDA_", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(foreign)}
    env.update({"HOME": str(home), "CALM_HOME": str(home / "data"), "XDG_RUNTIME_DIR": str(run),
                "CALMD_SOCKET": str(run / paths.APP / paths.SOCKET)})  # fmt: skip
    # The compiled kernels: CALM_CACHE as this process has it (the suite's folder, tests/conftest.py:
    # built once, not once per test home, and never in the user's own cache; a bench's, the user's).
    env["CALM_CACHE"] = str(paths.cache_dir())
    env.update(SUITE_ENV)
    env.update(extra)
    return {k: v for k, v in env.items() if v != "" or k not in SUITE_ENV}


CALMD_SERVE = [str(BIN / "calmd"), "serve"]
# The same daemon with the scripted engine in place of the model: needs PYTHONPATH at the repo.
SCRIPTED_SERVE = [sys.executable, "-m", "tests.support.serve_scripted", "serve"]
# Another checkout's daemon (an older release): its calmd on PYTHONPATH, run by this Python.
TREE_SERVE = [
    sys.executable,
    "-c",
    "import sys; from calmd.cli import calmd_main; sys.exit(calmd_main())",
    "serve",
]


def serve_argv(engine: str, tree: Path | None = None) -> list[str]:
    assert engine in ("model", "scripted"), engine
    if tree is not None:
        assert engine == "model", "another checkout serves its own model"
        return TREE_SERVE
    return CALMD_SERVE if engine == "model" else SCRIPTED_SERVE


def start_daemon(
    home: Path,
    *,
    engine: str = "scripted",
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    weights: bool = True,
    prefix: tuple[str, ...] = (),
    tree: Path | None = None,
    command: tuple[str, ...] | None = None,
) -> Daemon:
    """`calmd serve` started, not yet ready (running_daemon waits for it and stops it)."""
    full_env = daemon_env(home, **(env or {}))
    sock = Path(full_env["CALMD_SOCKET"])
    if weights and not (home / "data" / paths.WEIGHTS).exists():
        write_test_weights(home / "data" / paths.WEIGHTS)
    argv = [*prefix, *(command or serve_argv(engine, tree)), *args]
    # this tree (tests.support.serve_scripted), or the other checkout, first on the path
    full_env["PYTHONPATH"] = str(tree or ROOT)
    # (stdin no terminal, as under systemd: SIGHUP reloads; typed at a prompt, it would stop it)
    started_at = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=full_env, cwd=tree)  # fmt: skip
    # (cwd: `python -c` puts the current folder first on sys.path, before PYTHONPATH)
    daemon = Daemon(proc, sock, home, started_at=started_at)
    threading.Thread(target=daemon._pump, daemon=True, name=f"calmd-output-{proc.pid}").start()
    return daemon


@contextlib.contextmanager
def running_daemon(
    home: Path,
    *,
    engine: str = "scripted",
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    weights: bool = True,
    prefix: tuple[str, ...] = (),
    tree: Path | None = None,
    command: tuple[str, ...] | None = None,
) -> Iterator[Daemon]:
    """`calmd serve` in a subprocess with its own HOME, data dir and socket, ready; stopped
    afterwards. engine "model": the daemon as users run it; "scripted": the same daemon with the
    scripted engine (tests/support/scripted_engine.py) in place of the model.
    weights: a tiny weight file as the user's model when the home has none (False: the packaged
    model serves). prefix: a program the daemon runs under (`prlimit ... --`). tree: another
    checkout's daemon (with engine "model"). command: what serves in place of `calmd serve` (a
    bench's variant of the engine), `args` after it."""
    daemon = start_daemon(home, engine=engine, args=args, env=env, weights=weights, prefix=prefix, tree=tree,
                          command=command)  # fmt: skip
    try:
        wait_ready(daemon)
        yield daemon
    finally:
        try:
            daemon.stop()
        finally:
            if daemon.proc.stdout:
                daemon.proc.stdout.close()


def wait_ready(daemon: Daemon, timeout: float = HANG_S) -> None:
    """Until the daemon says it is ready; fails at once when it exits instead."""
    with daemon._lines:
        daemon._lines.wait_for(lambda: daemon.ready.is_set() or daemon.ended.is_set(), timeout)
    if not daemon.ready.is_set():
        if daemon.ended.is_set():  # its output closed: it exits, or has
            why = f"it exited with {daemon.proc.wait(timeout=HANG_S)}"
        else:
            why = f"not ready after {timeout:.0f} s"
        raise AssertionError(f"daemon did not start ({why}): {daemon.read_output()}")


def wait_imported(client: Any, timeout: float = HANG_S) -> dict[str, Any]:
    """The daemon's status once its first-start import (which runs after `ready`) is done."""

    def done() -> dict[str, Any] | None:
        status: dict[str, Any] = client.status()["status"]
        return None if status["history"]["import"]["running"] else status

    return wait_until(done, "the end of the first-start import", ceiling=timeout)
