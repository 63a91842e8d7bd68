"""The one way the tests and the benches start a daemon (tests/daemon.py), and where the suite
keeps what it builds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import platformdirs
import pytest

from calmd import paths
from calmd.shell.client import CalmClient
from tests.daemon import daemon_env, running_daemon
from tests.waiting import HANG_S, wait_until


def test_a_daemon_is_ready_when_it_says_so_and_stops_cleanly(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=("--no-import",)) as d:
        assert d.ready.is_set() and 0 < d.start_s < HANG_S
        with CalmClient(d.socket) as client:  # ready: the socket answers at once
            assert client.status()["status"]["pid"] == d.proc.pid
        assert "calmd ready on" in d.wait_for("calmd ready on")
    assert d.proc.returncode == 0  # SIGTERM: its graceful stop, not a kill
    assert not d.socket.exists()
    assert "calmd stopped" in d.read_output()


def test_a_daemon_that_cannot_start_fails_at_once_with_its_output(tmp_path: Path) -> None:
    """Not after the ceiling: the end of its output wakes the wait."""
    began = time.monotonic()
    with (
        pytest.raises(AssertionError, match=r"daemon did not start \(it exited with 2\).*--no-such-flag"),
        running_daemon(tmp_path, args=("--no-such-flag",)),
    ):
        pass
    assert time.monotonic() - began < HANG_S / 2


def test_wait_for_fails_when_the_daemon_exits_without_the_line(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=("--no-import",)) as d:
        with CalmClient(d.socket) as client:
            client.shutdown()
        with pytest.raises(AssertionError, match="the daemon exited"):
            d.wait_for("a line it never prints")
        assert d.wait() == 0


def test_the_suite_builds_its_kernels_in_a_cache_of_its_own(tmp_path: Path) -> None:
    """Never in the user's ~/.cache/calm (tests/conftest.py): in-process and in every daemon."""
    user_cache = Path(platformdirs.user_cache_dir(paths.APP, appauthor=False))
    assert os.environ["CALM_CACHE"] == str(paths.cache_dir())
    assert not paths.cache_dir().is_relative_to(user_cache)
    assert daemon_env(tmp_path)["CALM_CACHE"] == str(paths.cache_dir())


def test_wait_until_returns_the_value_or_names_what_it_waited_for() -> None:
    ticks = iter(range(5))
    assert wait_until(lambda: next(ticks) >= 3 and "third", "the third tick", every=0) == "third"
    with pytest.raises(AssertionError, match="still waiting after 0 s for nothing"):
        wait_until(lambda: False, "nothing", ceiling=0.05, every=0.01)
