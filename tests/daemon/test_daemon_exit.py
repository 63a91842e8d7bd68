"""`calmd serve` removes the socket file it bound on every way out (issue 39: a store of a newer
schema made it exit 3 and leave the file behind): a start that fails after the bind (a store of a
newer schema, an exception no input explains), SIGTERM and SIGINT (while it starts, and while it
serves). Each failure is its one line and exit 3."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from calmd import paths
from calmd.history.store import HistoryStore
from tests.support.daemon import SCRIPTED_SERVE, daemon_env, running_daemon, write_test_weights
from tests.support.waiting import HANG_S, wait_until

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # daemons


def serve(home: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    full = {**daemon_env(home, **env), "PYTHONPATH": str(REPO)}
    write_test_weights(home / "data" / paths.WEIGHTS)
    out = subprocess.run([*SCRIPTED_SERVE, "--no-import"], env=full, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=HANG_S)  # fmt: skip
    return out, Path(full["CALMD_SOCKET"])


def test_a_store_of_a_newer_schema_is_one_line_exit_3_and_no_socket_left(tmp_path: Path) -> None:
    db = tmp_path / "data" / paths.HISTORY
    HistoryStore(db).close()
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    out, sock = serve(tmp_path)
    lines = [line for line in out.stdout.splitlines() if line.startswith("calmd: ")]
    assert out.returncode == 3 and "Traceback" not in out.stdout + out.stderr, out
    assert lines == [f"calmd: error: {db}: history schema 99 is newer than this calmd (5): upgrade calm to "
                     "use it, or give another store"]  # fmt: skip
    assert sock.parent.is_dir() and not sock.exists()  # bound, then removed


def test_an_exception_while_it_starts_removes_the_socket(tmp_path: Path) -> None:
    out, sock = serve(tmp_path, CALMD_TEST_LOAD_FAILS="1")
    assert out.returncode == 3 and "Traceback" not in out.stdout, out
    assert "calmd: error: unexpected ArithmeticError: the scripted engine was told to fail" in out.stdout
    assert sock.parent.is_dir() and not sock.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_removes_the_socket_while_it_starts_and_while_it_serves(
    tmp_path: Path, sig: signal.Signals
) -> None:
    with running_daemon(tmp_path) as daemon:
        assert daemon.socket.exists()
        daemon.proc.send_signal(sig)
        assert daemon.wait() == 0 and not daemon.socket.exists()
    # while it starts: the socket is bound, the engine takes 3 s to load (the signal's default
    # action ended the process there before, and left the file)
    env = {**daemon_env(tmp_path, CALMD_TEST_LOAD_DELAY="3"), "PYTHONPATH": str(REPO)}
    sock = Path(env["CALMD_SOCKET"])
    proc = subprocess.Popen([*SCRIPTED_SERVE, "--no-import"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, "the socket bound")
        assert proc.poll() is None, "it exited before it bound its socket"
        proc.send_signal(sig)
        assert proc.wait(timeout=HANG_S) == 0
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=HANG_S)
