"""Background training runs when due, and says so (issue 25), against real daemons: the due check
at start, after the first-start import, on the timer and on record; the per-core load gate and
what status says while a due run waits; `calmd train` / `calm train --now` follow a run to its
result; the run's progress, result and priority as status and the kernel show them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from calmd import paths
from calmd.daemon.trainer import TEST_PRIORITY_ENV, exit_words
from calmd.shell.client import CalmClient
from calmd.training import background
from calmd.training.background import TrainingLock
from tests.daemon.test_trainer import ENGINE, fill, install, runs_on, training
from tests.support.daemon import BIN, daemon_env, running_daemon
from tests.support.waiting import HANG_S

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
        d.wait_for("training started (start)")
        assert training(c)["runs_started"] == 1 and training(c)["pending"] == 0
    # a first start: while the import runs (in batches, the daemon answering), a due run waits
    # for it, also when a command is recorded meanwhile; once it is done, the run starts
    imported = tmp_path / "b"
    imported.mkdir()
    n = 50_000  # about 2 s of import: the window a due run is seen waiting in
    (imported / ".bash_history").write_text("".join(f"git checkout branch-{i}\n" for i in range(n)))
    with running_daemon(imported, args=("--train-threshold", "50", *NO_GATE)) as d, CalmClient(d.socket) as c:
        seen = []
        while (status := c.status()["status"])["history"]["import"]["running"]:
            if status["training"]["due"]:  # what status said while the import ran, the last record included
                seen.append(status["training"])
                c.record("make test", exit=0, session="s")
            time.sleep(0.05)
        assert seen, "the import ended before a due run could be seen waiting for it"
        assert all(t["runs_started"] == 0 and "first-start import" in t["waiting"] for t in seen), seen[-1]
        d.wait_for("training started (after the first-start import)")
        assert training(c)["runs_started"] == 1
    assert f"imported {n} commands" in d.read_output()


def test_a_due_check_that_fails_at_start_leaves_the_daemon_serving(tmp_path: Path) -> None:
    """The check at start runs outside any request: a failure there (training.log is a folder)
    must not become a failed start."""
    counting = ("--no-import", "--train-threshold", "0")
    with running_daemon(tmp_path, args=counting) as d, CalmClient(d.socket) as c:
        for i in range(60):
            c.record(f"make target-{i}", exit=0, session="s")
    (tmp_path / "data" / paths.TRAINING_LOG).mkdir()
    args = ("--no-import", "--train-threshold", "50", *NO_GATE, "--train-check-interval", "0")
    with running_daemon(tmp_path, args=args) as d, CalmClient(d.socket) as c:
        d.wait_for("the training due check (start) failed")
        assert c.status()["status"]["training"]["runs_started"] == 0
        assert any("candidate" in m for m in c.complete("make", n=1, session="s"))


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
            d.wait_for("training started (timer)")
            assert training(c)["runs_started"] == 1


def test_calmd_train_follows_a_run_to_its_result_which_status_keeps(
    tmp_path: Path, tiny_weights: Path
) -> None:
    data = install(tmp_path, tiny_weights)
    args = ("--no-import", "--train-threshold", "0", "--train-arg=--min-examples=10",
            "--train-arg=--holdout=10", "--train-arg=--epochs=40")  # fmt: skip
    as_users_run = {TEST_PRIORITY_ENV: ""}  # the lowest priority, not the suite's (tests/support/daemon.py)
    with running_daemon(tmp_path, engine=ENGINE, args=args, env=as_users_run) as d, CalmClient(d.socket) as c:
        fill(c, 12)
        follow = subprocess.Popen([str(BIN / "calmd"), "train"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=daemon_env(tmp_path))  # fmt: skip
        assert follow.stdout is not None
        first = follow.stdout.readline()
        pid = int(re.fullmatch(r"training run started \(pid (\d+)\)\n", first).group(1))  # type: ignore[union-attr]
        # the lowest CPU priority: nice 19 and SCHED_IDLE, set in the child before exec
        assert os.getpriority(os.PRIO_PROCESS, pid) == 19
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        # that checked, the run goes on at the test's priority: beside a CPU hog at nice 0 an idle
        # run would wait for hours (raising it needs root, as CI has; elsewhere it just takes longer)
        with contextlib.suppress(PermissionError):
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0))
        out, err = follow.communicate(timeout=600)
        assert follow.returncode == 0, (first, out, err)
        lines = out.splitlines()
        steps = [m for line in lines if (m := re.match(r"training: step (\d+)/(\d+), loss [\d.]+", line))]
        assert steps and all(int(m.group(2)) == int(steps[0].group(2)) > 0 for m in steps), out
        assert any(re.search(r", about \d+ (s|min) left$", line) for line in lines), out
        stages = [line.split(":")[0] for line in lines[:-1]]
        assert "starting" not in stages[stages.index("training") :], out  # it showed again once done
        verdict = r"(not worse: swapped in|worse: kept the current model)"
        ranker = r"ranker refitted on \d+ ranking examples"  # the run's other half: the history ranker
        assert re.fullmatch(
            rf"done: held-out loss \d+\.\d{{4}} -> \d+\.\d{{4}}, {verdict}; {ranker}", lines[-1]
        ), out
        d.wait_for(f"training finished (exit 0): {lines[-1].removeprefix('done: ')}")
        last = training(c)["last_result"]
        assert last["old_loss"] > 0 and last["new_loss"] > 0 and last["steps"] == int(steps[0].group(2))
        assert last["swapped"] == ("swapped in" in lines[-1])
    assert runs_on(data) == []
    # after the run, and after a restart, status still shows what it bought
    one_epoch = (*args[:-1], "--train-arg=--epochs=1")  # the second run only has to end
    with running_daemon(tmp_path, engine=ENGINE, args=one_epoch):
        table = calmd(tmp_path, "status").stdout
        assert "last run " in table and lines[-1].removeprefix("done: ") in table, table
        shown = json.loads(calmd(tmp_path, "status", "--json").stdout)["training"]["last_result"]
        assert shown["old_loss"] == last["old_loss"] and shown["new_loss"] == last["new_loss"]
        # `calm train --now` sends the same request
        again = subprocess.run([str(BIN / "calm"), "train", "--now"], capture_output=True, text=True,
                               env=daemon_env(tmp_path), timeout=600)  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert (
            again.stdout.startswith("training run started (pid ") and "\ndone: held-out loss" in again.stdout
        )
    # no daemon: one line that says what to do
    down = calmd(tmp_path, "train")
    assert down.returncode == 3 and down.stdout == ""
    assert (
        down.stderr.count("\n") == 1
        and "calmd is not running" in down.stderr
        and "calmd serve" in down.stderr
    )


def test_calm_train_now_takes_no_training_flags(tmp_path: Path) -> None:
    result = subprocess.run([str(BIN / "calm"), "train", "--now", "--epochs", "3"], capture_output=True,
                            text=True, env=daemon_env(tmp_path), timeout=HANG_S)  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    assert (
        result.stderr
        == "calm: error: --now asks the daemon for its background run, which takes no --epochs: drop them\n"
    )


def test_every_exit_of_a_run_says_what_happened_in_words() -> None:
    """The log said "training finished (exit 4): ?" for a run that found the lock taken."""
    codes = (background.EXIT_DONE, background.EXIT_FAILED, background.EXIT_DISK_FULL, background.EXIT_LOCKED,
             background.EXIT_STOPPED, -9, -15, 70)  # fmt: skip
    words = {code: exit_words(123, code, {}) for code in codes}
    assert all(len(w.split()) >= 3 for w in words.values()), words
    assert len(set(words.values())) == len(codes)  # each says something of its own
    assert f"another training run held {paths.TRAINING_LOCK}" in words[background.EXIT_LOCKED]
    assert "SIGKILL" in words[-9] and "code 70" in words[70]
    mine = {"pid": 123, "state": "done", "reason": "held-out loss 2.1 -> 2.0, not worse: swapped in"}
    assert exit_words(123, 0, mine) == mine["reason"]
    assert exit_words(124, background.EXIT_LOCKED, mine) == words[background.EXIT_LOCKED]  # not its result


def test_the_result_of_a_followed_run_wraps_between_words_on_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`calmd train` (and `calm train --now`) printed the result as one long line, which a terminal
    cut anywhere: the next row began with a space. On a terminal each clause now has its lines,
    cut between words; a pipe still gets the one line."""
    from calmd.cli import daemon as daemon_cli

    reason = ("only 0 training examples (need 50): nothing trained, the current model stays; only 0 ranking "
              "examples (need 100): the packaged ranker stays")  # fmt: skip

    class Finished:
        def status(self) -> dict[str, object]:
            last = {"state": "done", "reason": reason}
            return {"status": {"training": {"pid": None, "last_result": last}}}

    for width in (80, 40, 33):
        monkeypatch.setattr(daemon_cli, "_terminal_width", lambda width=width: width)
        assert daemon_cli._follow_training(Finished(), 4201, poll_s=0) == 0  # type: ignore[arg-type]
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("done: only 0 training examples") and len(lines) >= 2
        assert all(line and not line.startswith(" ") and len(line) < width for line in lines), lines
        assert " ".join(lines) == f"done: {reason}".replace("; ", " ")  # every word, in order
    monkeypatch.setattr(daemon_cli, "_terminal_width", lambda: None)  # a pipe: one line, as before
    daemon_cli._follow_training(Finished(), 4201, poll_s=0)  # type: ignore[arg-type]
    assert capsys.readouterr().out == f"done: {reason}\n"
