"""Start a real `calmd serve` process for tests and talk to it over its socket."""

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

BIN = Path(sys.executable).parent


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

    def wait(self, timeout: float = 10.0) -> int:
        return self.proc.wait(timeout=timeout)

    def read_output(self) -> str:
        """Whatever the daemon printed so far (stdout and stderr are merged)."""
        return "".join(self.output)

    def wait_for(self, text: str, count: int = 1, timeout: float = 5.0) -> str:
        """Wait until the daemon's output holds `text` `count` times; return the output."""
        deadline = time.monotonic() + timeout
        while self.read_output().count(text) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} x{count} not in the daemon's output: {self.read_output()}")
            time.sleep(0.02)
        return self.read_output()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if "calmd ready on" in line:
                self.ready.set()


def daemon_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with its own HOME, data dir, runtime dir (0700, as logind makes it) and socket."""
    run = home / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    # Nothing of the developer's session: calm's variables, systemd's, and the active Python or
    # conda environment (the shells would record it as the ENV frame the tests expect empty).
    foreign = ("CALM", "LISTEN_", "CONDA_", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(foreign)}
    env.update({"HOME": str(home), "CALM_HOME": str(home / "data"), "XDG_RUNTIME_DIR": str(run),
                "CALMD_SOCKET": str(run / paths.APP / paths.SOCKET)})  # fmt: skip
    # The compiled scan kernel is built once per machine, not once per test home.
    env["CALM_CACHE"] = str(paths.cache_dir())
    env.update(extra)
    return env


CALMD_SERVE = [str(BIN / "calmd"), "serve"]
# The same daemon with the scripted engine in place of the model: needs PYTHONPATH at the repo.
SCRIPTED_SERVE = [sys.executable, "-m", "tests.serve_scripted", "serve"]


@contextlib.contextmanager
def running_daemon(
    home: Path,
    *,
    engine: str = "scripted",
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    weights: bool = True,
    prefix: tuple[str, ...] = (),
) -> Iterator[Daemon]:
    """`calmd serve` in a subprocess with its own HOME, data dir and socket; stopped afterwards.
    engine "model": the daemon as users run it; "scripted": the same daemon with the scripted
    engine of tests/scripted_engine.py in place of the model (tests/serve_scripted.py)."""
    assert engine in ("model", "scripted"), engine
    full_env = daemon_env(home, **(env or {}))
    sock = Path(full_env["CALMD_SOCKET"])
    if weights and not (home / "data" / paths.WEIGHTS).exists():
        write_test_weights(home / "data" / paths.WEIGHTS)
    argv = [*prefix, *(CALMD_SERVE if engine == "model" else SCRIPTED_SERVE), *args]
    full_env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)  # tests.serve_scripted
    # (stdin no terminal, as under systemd: SIGHUP reloads; typed at a prompt, it would stop it)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=full_env)  # fmt: skip
    daemon = Daemon(proc, sock, home)
    pump = threading.Thread(target=daemon._pump, daemon=True)
    pump.start()
    try:
        wait_ready(daemon)
        yield daemon
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        pump.join(timeout=5)
        if proc.stdout:
            proc.stdout.close()


def wait_ready(daemon: Daemon, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not daemon.ready.wait(0.05):
        if daemon.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"daemon did not start: {daemon.read_output()}")


def wait_imported(client: Any, timeout: float = 30.0) -> dict[str, Any]:
    """The daemon's status once its first-start import (which runs after `ready`) is done."""
    deadline = time.monotonic() + timeout
    while True:
        status: dict[str, Any] = client.status()["status"]
        if not status["history"]["import"]["running"]:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"the first-start import still runs after {timeout} s")
        time.sleep(0.02)
