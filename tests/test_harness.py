"""The one way the tests and the benches start a daemon (tests/support/daemon.py), and where the suite
keeps what it builds."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import platformdirs
import pytest

from calmd import paths
from calmd.shell.client import CalmClient
from tests.support.daemon import daemon_env, running_daemon
from tests.support.waiting import HANG_S, wait_until


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


def test_another_checkouts_daemon_runs_from_its_own_tree(tmp_path: Path) -> None:
    """bench/harness.py's A/B runs start an older release's daemon: its tree first on the path and
    as its working folder (`python -c` puts the current folder first), its packaged model."""
    tree = Path(__file__).resolve().parent.parent
    with running_daemon(tmp_path, engine="model", tree=tree, weights=False, args=("--no-import",)) as d:
        with CalmClient(d.socket) as client:
            status = client.status()["status"]
        assert status["model"]["path"] == str(tree / "calmd" / "data" / "default.cwgt")
        assert Path(f"/proc/{d.proc.pid}/cwd").resolve() == tree


def test_the_ab_runner_alternates_who_goes_first() -> None:
    from bench.harness import alternate

    calls: list[tuple[str, int]] = []

    def system(name: str) -> Callable[[int], int]:
        return lambda step: calls.append((name, step)) or step * 10  # type: ignore[func-returns-value]

    results = alternate({"new": system("new"), "old": system("old")}, [1, 2, 3], warm_up=[0])
    assert results == {"new": [10, 20, 30], "old": [10, 20, 30]}
    assert calls == [
        ("new", 0),
        ("old", 0),
        ("old", 1),
        ("new", 1),
        ("new", 2),
        ("old", 2),
        ("old", 3),
        ("new", 3),
    ]


def test_the_report_gives_each_system_its_quantiles_and_the_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.harness import Report

    report = Report("a bench")
    figures = report.table(
        "request -> done", {"this tree": [1.0, 2.0, 3.0, 4.0], "old": [2.0, 4.0, 6.0, 8.0]}
    )
    assert figures == {
        "this tree": {"p50": 3.0, "p90": 4.0, "n": 4.0},
        "old": {"p50": 6.0, "p90": 8.0, "n": 4.0},
    }
    out = capsys.readouterr().out
    assert out.startswith("== a bench\n")
    assert "this tree / old: p50 0.50x, p90 0.50x" in out
