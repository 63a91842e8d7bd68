"""Background training runs when due, and says so (issue 25), against real daemons: the due check
at start, after the first-start import, on the timer and on record; the per-core load gate and
what status says while a due run waits; `calmd train` / `calm train --now` follow a run to its
result; the run's progress, result and priority as status and the kernel show them."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from calmd.daemon.trainer import exit_words
from calmd.shell.client import CalmClient
from calmd.training import background
from calmd.training.background import TrainingLock
from tests.daemon import BIN, daemon_env, running_daemon
from tests.test_trainer import training

NO_GATE = ("--train-max-load", "1000")  # per core: lifted, whatever the shared machine's load


def calmd(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "calmd"), "--no-color", *args], capture_output=True, text=True,
                          env={**daemon_env(home), "COLUMNS": "400"}, timeout=timeout)  # fmt: skip


def test_a_due_run_starts_at_start_and_after_the_first_start_import(tmp_path: Path) -> None:
    """Commands counted before a restart start a run when the daemon starts, without a new one;
    a first start's import starts one once it is done. (The scripted engine's weights are no
    model: the runs fail, but they start, and only one each.)"""
    home = tmp_path / "a"
    home.mkdir()
    with running_daemon(home, args=("--no-import", "--train-threshold", "0")) as d, CalmClient(d.socket) as c:
        for i in range(60):
            c.record(f"make target-{i}", exit=0, session="s")
        assert training(c)["runs_started"] == 0  # threshold 0: only on request
    args = ("--no-import", "--train-threshold", "50", *NO_GATE)
    with running_daemon(home, args=args) as d, CalmClient(d.socket) as c:
        d.wait_for("training started (start)", timeout=10)
        assert training(c)["runs_started"] == 1 and training(c)["pending"] == 0
    imported = tmp_path / "b"
    imported.mkdir()
    (imported / ".bash_history").write_text("".join(f"git checkout branch-{i}\n" for i in range(60)))
    with running_daemon(imported, args=("--train-threshold", "50", *NO_GATE)) as d, CalmClient(d.socket) as c:
        d.wait_for("training started (after the first-start import)", timeout=30)
        assert training(c)["runs_started"] == 1
    assert "imported 60 commands" in d.read_output()


def test_a_due_run_says_why_it_waits_and_the_timer_starts_it(tmp_path: Path) -> None:
    # the load gate: nothing is below 0 per core, so the due run waits and status says for what
    args = (
        "--no-import",
        "--train-threshold",
        "50",
        "--train-max-load",
        "0",
        "--train-check-interval",
        "0.2",
    )
    with running_daemon(tmp_path, args=args) as d, CalmClient(d.socket) as c:
        for i in range(55):
            c.record(f"make target-{i}", exit=0, session="s")
        waiting = training(c)
        assert waiting["due"] and waiting["pending"] == 55, waiting
        assert re.fullmatch(r"load \d+\.\d\d per core, waiting for < 0\.0", waiting["waiting"]), waiting
        assert waiting["load_per_core"] == pytest.approx(os.getloadavg()[0] / os.cpu_count(), abs=0.5)
        table = calmd(tmp_path, "status").stdout
        assert "due (55 new commands), waiting: load " in table, table
        time.sleep(0.5)  # two timer ticks: still waiting, nothing started
        assert training(c)["runs_started"] == 0
    # the timer: a run started by hand holds the data dir while the commands come; when it ends,
    # the due run starts without a new command
    data = tmp_path / "data"
    args = ("--no-import", "--train-threshold", "50", *NO_GATE, "--train-check-interval", "0.2")
    with TrainingLock(data) as by_hand:
        assert by_hand.acquire()
        with running_daemon(tmp_path, args=args) as d, CalmClient(d.socket) as c:
            c.record("make one-more", exit=0, session="s")  # 56 pending: due, but the data dir is taken
            held = training(c)
            assert held["pid"] == os.getpid() and held["runs_started"] == 0, held
            by_hand.release()
            d.wait_for("training started (timer)", timeout=10)
            assert training(c)["runs_started"] == 1


def test_every_exit_of_a_run_says_what_happened_in_words() -> None:
    """The log said "training finished (exit 4): ?" for a run that found the lock taken."""
    codes = (background.EXIT_DONE, background.EXIT_FAILED, background.EXIT_DISK_FULL, background.EXIT_LOCKED,
             background.EXIT_STOPPED, -9, -15, 70)  # fmt: skip
    words = {code: exit_words(123, code, {}) for code in codes}
    assert all(len(w.split()) >= 3 for w in words.values()), words
    assert len(set(words.values())) == len(codes)  # each says something of its own
    assert "another training run held training.lock" in words[background.EXIT_LOCKED]
    assert "SIGKILL" in words[-9] and "code 70" in words[70]
    mine = {"pid": 123, "state": "done", "reason": "held-out loss 2.1 -> 2.0, not worse: swapped in"}
    assert exit_words(123, 0, mine) == mine["reason"]
    assert exit_words(124, background.EXIT_LOCKED, mine) == words[background.EXIT_LOCKED]  # not its result
