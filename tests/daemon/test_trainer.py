"""The background trainer under faults, against real daemons: it dies with its daemon, one run per
CALM_HOME, leftovers of killed runs are removed at start, status tells a dead run from a live one
and a failed run by its reason, and `calm rollback` swaps the two weight files atomically."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from calmd import paths
from calmd.cli import calm_main
from calmd.errors import CalmError, FormatError
from calmd.formats.cwgt import read_cwgt
from calmd.model.checkpoint import load_model
from calmd.shell.client import CalmClient
from calmd.suggest.ranker import Ranker, packaged_ranker
from calmd.training import background
from calmd.training.background import TrainingLock, read_status, rollback
from tests.support.daemon import BIN, daemon_env, running_daemon, write_test_weights
from tests.support.waiting import HANG_S

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them

ENGINE = "model"
COMMANDS = ["git status", "make build", "make test", "git commit -am wip", "docker ps -a"]


def wait_until(check: Callable[[], Any], what: str, timeout: float = HANG_S, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(step)


def training(c: CalmClient) -> dict[str, Any]:
    return c.status()["status"]["training"]  # type: ignore[no-any-return]


def fill(c: CalmClient, rounds: int) -> None:
    """Distinct commands (every one is a training example): 5 per round."""
    for i in range(rounds):
        for cmd in COMMANDS:
            c.record(f"{cmd} {i}", exit=0, session="s", cwd="/p")


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for whoever inherited it to reap it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def runs_on(data: Path) -> list[int]:
    """Pids of training runs working on `data`. (A run's child between its fork and its exec, as
    when the run starts g++ for the scan kernel, shows the run's command line: not a run.)"""
    found: dict[int, int] = {}  # pid: parent pid
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"calmd.training.background" in argv and str(data).encode() in argv and alive(int(proc.name)):
            found[int(proc.name)] = parent
    return [pid for pid, parent in found.items() if parent not in found]


def install(home: Path, weights: Path) -> Path:
    data = home / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / paths.WEIGHTS).write_bytes(weights.read_bytes())
    return data


LONG_RUN = ("--no-import", "--train-threshold", "0", "--train-arg=--min-examples=10",
            "--train-arg=--holdout=10", "--train-arg=--epochs=500")  # fmt: skip


@contextlib.contextmanager
def held_still() -> Iterator[Callable[[int], None]]:
    """hold(pid): a run stops where it is (SIGSTOP), alive, its lock held and its status as it was,
    without spending CPU on LONG_RUN's 500 epochs while the test looks at what is around it; every
    run held goes on (SIGCONT) when the block ends, so that the daemon's stop ends it as any run."""
    held: list[int] = []

    def hold(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            held.append(pid)

    try:
        yield hold
    finally:
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_a_run_dies_with_its_daemon_and_the_next_daemon_sees_it_dead(
    tmp_path: Path, tiny_weights: Path
) -> None:
    data = install(tmp_path, tiny_weights)
    with running_daemon(tmp_path, engine=ENGINE, args=LONG_RUN) as d, CalmClient(d.socket) as c:
        fill(c, 12)
        assert c.train()["started"] is True
        run = wait_until(lambda: (t := training(c))["state"] == "training" and t, "the run to train")
        pid = run["pid"]
        assert alive(pid) and runs_on(data) == [pid]
        d.proc.kill()  # kill -9: no shutdown code runs in the daemon
        d.proc.wait()
        wait_until(lambda: not alive(pid), "the orphaned run to die", timeout=HANG_S)  # was: it trained on
    assert (data / paths.WEIGHTS).read_bytes() == tiny_weights.read_bytes()
    with running_daemon(tmp_path, engine=ENGINE, args=LONG_RUN) as d, CalmClient(d.socket) as c:
        dead = training(c)
        assert dead["state"] == "interrupted" and dead["pid"] is None, dead  # not the dead run's state
        assert "ended without a result" in dead["last_result"]["reason"]
        assert c.train()["started"] is True
        wait_until(lambda: training(c)["state"] == "training", "the new run")
        assert len(runs_on(data)) == 1  # one run, not two
        d.proc.send_signal(signal.SIGTERM)  # a graceful stop stops the run too, cleanly
        assert d.wait(timeout=HANG_S) == 0
    assert runs_on(data) == []
    result = read_status(data)
    assert result["state"] == "interrupted" and result["reason"].startswith("stopped: SIGTERM"), result
    assert not list(data.glob(".shell.candidate.*"))


def test_one_run_per_calm_home(tmp_path: Path, tiny_weights: Path) -> None:
    data = install(tmp_path, tiny_weights)
    with running_daemon(tmp_path, engine=ENGINE, args=LONG_RUN) as d, CalmClient(d.socket) as c:
        fill(c, 12)
        assert c.train()["started"] is True
        pid = wait_until(lambda: (t := training(c))["state"] == "training" and t["pid"], "the run to train")
        with held_still() as hold:
            hold(pid)
            # a second run started by hand says who holds the data dir, and touches nothing
            argv = [sys.executable, "-m", "calmd.training.background", "--data-dir", str(data),
                    "--min-examples=10"]  # fmt: skip
            env = daemon_env(tmp_path)
            second = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S, env=env)
            assert second.returncode == background.EXIT_LOCKED, second.stderr
            assert f"another training run (pid {pid}) holds" in second.stderr
            assert read_status(data)["pid"] == pid
            # a second daemon on the same CALM_HOME (another socket) sees that run and starts none
            other = tmp_path / "other"
            other.mkdir()
            env = {"CALM_HOME": str(data), "CALMD_SOCKET": str(other / paths.SOCKET)}
            with (
                running_daemon(other, engine=ENGINE, args=LONG_RUN, env=env, weights=False) as d2,
                CalmClient(d2.socket) as c2,
            ):
                seen = training(c2)
                assert seen["pid"] == pid and seen["state"] in ("dataset", "training", "evaluating"), seen
                refused = c2.train()
                assert refused["started"] is False and f"(pid {pid}) already works on" in refused["reason"]
            assert runs_on(data) == [pid]


def test_a_run_killed_in_evaluation_leaves_nothing_behind(tmp_path: Path, tiny_weights: Path) -> None:
    """Its 6 MB candidate (and temp files) go as soon as the daemon sees the run die, not at the
    next run or start (issue 23); what a killed daemon's run left goes at the next start."""
    data = install(tmp_path, tiny_weights)
    # a short training, a long evaluation (100 held-out commands): a wide window to kill it in
    args = ("--no-import", "--train-threshold", "0", "--train-arg=--min-examples=10",
            "--train-arg=--holdout=100", "--train-arg=--epochs=1")  # fmt: skip
    with running_daemon(tmp_path, engine=ENGINE, args=args) as d, CalmClient(d.socket) as c:
        fill(c, 40)
        assert c.train()["started"] is True
        info = wait_until(
            lambda: (s := read_status(data)).get("state") == "evaluating" and s, "evaluation", step=0.01
        )
        candidate = data / f".shell.candidate.{info['pid']}.cwgt"
        assert candidate.exists()  # written, and being evaluated
        half = data / f".{candidate.name}.k3q9.tmp"  # as a kill while it was written would leave
        half.write_bytes(b"half")
        spill = data / "training" / ".heldout.ctds.z8w1.tokens"
        spill.write_bytes(b"half")
        ranker = data / f".{paths.RANKER}.p4x7.tmp"  # a kill while it wrote the refitted ranker
        ranker.write_bytes(b"half")
        os.kill(info["pid"], signal.SIGKILL)
        wait_until(lambda: training(c)["state"] == "interrupted", "the daemon to see the run dead")
        assert "killed by SIGKILL" in training(c)["last_result"]["reason"]
        wait_until(lambda: not candidate.exists() and not half.exists() and not spill.exists()
                   and not ranker.exists(), "what the run left to be removed", timeout=HANG_S)  # fmt: skip
        d.wait_for(f"removed what the ended training run (pid {info['pid']}) left")
    # what a run left when its daemon was killed with it goes at the next start
    (data / ".shell.candidate.999999.cwgt").write_bytes(b"weights")
    # stale temp files of a killed writer go too; a fresh one (a live writer's) stays
    stale, fresh = data / f".{paths.TRAINING_STATUS}.x1y2.tmp", data / f".{paths.WEIGHTS}.a1b2.tmp"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    with running_daemon(tmp_path, engine=ENGINE, args=args) as d, CalmClient(d.socket) as c:
        assert training(c)["state"] == "interrupted"
        assert not list(data.glob(".shell.candidate.*")) and not stale.exists() and fresh.exists()
        d.wait_for("removed what killed training runs left")
    assert (data / paths.WEIGHTS).read_bytes() == tiny_weights.read_bytes()


def test_a_failed_run_shows_as_failed_with_its_reason(tmp_path: Path) -> None:
    # The scripted engine serves any CWGT file; the trainer needs a real model: it fails.
    args = ("--no-import", "--train-threshold", "0")
    with running_daemon(tmp_path, args=args) as d, CalmClient(d.socket) as c:
        assert c.train()["started"] is True
        failed = wait_until(lambda: (t := training(c))["state"] == "failed" and t, "the run to fail")
        assert failed["pid"] is None
        assert failed["last_result"]["reason"].startswith("FormatError"), failed  # was shown as idle
        assert "parameters" in failed["last_result"]["reason"]
        table = subprocess.run([str(BIN / "calmd"), "--no-color", "status"], capture_output=True, text=True,
                               env={**daemon_env(tmp_path), "COLUMNS": "400"},
                               timeout=HANG_S).stdout  # fmt: skip
        assert "│ training " in table and "failed; last run" in table
    with running_daemon(tmp_path, args=args) as d, CalmClient(d.socket) as c:
        assert training(c)["state"] == "failed"  # kept across restarts: training.json says so


# --------------------------------------------------------------------------- rollback


def test_rollback_exchanges_the_two_files(tmp_path: Path, tiny_weights: Path) -> None:
    weights, prev = tmp_path / paths.WEIGHTS, tmp_path / paths.PREV_WEIGHTS
    write_test_weights(weights, n=64)  # the current file need not even be a model
    prev.write_bytes(tiny_weights.read_bytes())
    inodes = weights.stat().st_ino, prev.stat().st_ino
    rollback(weights)
    assert (weights.stat().st_ino, prev.stat().st_ino) == inodes[::-1]  # renamed, not copied
    assert weights.read_bytes() == tiny_weights.read_bytes()
    assert read_cwgt(prev).header.param_count == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shell.cwgt", "shell.prev.cwgt", "training.lock"]


def test_rollback_without_an_exchange_keeps_the_weights_whole(
    tmp_path: Path, tiny_weights: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(background, "exchange", lambda a, b: False)  # a file system without it
    weights, prev = tmp_path / paths.WEIGHTS, tmp_path / paths.PREV_WEIGHTS
    write_test_weights(weights, n=64)
    prev.write_bytes(tiny_weights.read_bytes())
    rollback(weights)
    assert weights.read_bytes() == tiny_weights.read_bytes() and read_cwgt(prev).header.param_count == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shell.cwgt", "shell.prev.cwgt", "training.lock"]


def ranker_file(path: Path, examples: int) -> bytes:
    """A ranker as a run writes it, told apart by the number of examples it says it learned from."""
    base = packaged_ranker()
    refit = Ranker(base.mean, base.scale, base.w1, base.b1, base.w2, base.b2,
                   {**base.info, "refit": {"examples": examples}}, base.prior)  # fmt: skip
    background.write_ranker(refit, path)
    return path.read_bytes()


def test_rollback_brings_back_the_ranker_with_the_weights(
    tmp_path: Path, tiny_weights: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights, prev = tmp_path / paths.WEIGHTS, tmp_path / paths.PREV_WEIGHTS
    ranker, prev_ranker = tmp_path / paths.RANKER, tmp_path / paths.PREV_RANKER
    write_test_weights(weights, n=64)
    prev.write_bytes(tiny_weights.read_bytes())
    older = ranker_file(ranker, 100)
    newer = ranker_file(ranker, 200)  # the second run's: the first one's is kept as the prev
    assert prev_ranker.read_bytes() == older
    assert calm_main(["rollback", "--weights", str(weights)]) == 0
    said = capsys.readouterr().out
    assert f"restored {weights}" in said and f"restored {ranker} from {prev_ranker}" in said
    assert weights.read_bytes() == tiny_weights.read_bytes() and ranker.read_bytes() == older
    assert prev_ranker.read_bytes() == newer
    # a previous ranker that does not load is refused before anything moves
    prev_ranker.write_text("{")
    with pytest.raises(FormatError):
        rollback(weights)
    assert weights.read_bytes() == tiny_weights.read_bytes() and ranker.read_bytes() == older
    # only a ranker (the model never swapped): it moves aside, the packaged one serves, and back
    prev_ranker.unlink()
    weights.unlink()
    prev.unlink()
    assert rollback(weights) == [f"no previous ranker: moved {ranker} to {prev_ranker}; "
                                 "the packaged ranker serves now"]  # fmt: skip
    assert not ranker.exists() and prev_ranker.read_bytes() == older
    assert rollback(weights) == [f"restored {ranker} from {prev_ranker}"]
    assert ranker.read_bytes() == older and not prev_ranker.exists()


def test_rollback_refuses_a_bad_file_and_a_running_run(tmp_path: Path, tiny_weights: Path) -> None:
    weights, prev = tmp_path / paths.WEIGHTS, tmp_path / paths.PREV_WEIGHTS
    weights.write_bytes(tiny_weights.read_bytes())
    prev.write_bytes(b"CWGT but not really")
    with pytest.raises(FormatError):
        rollback(weights)
    assert weights.read_bytes() == tiny_weights.read_bytes()
    write_test_weights(tmp_path / "x.cwgt")
    prev.write_bytes(tiny_weights.read_bytes())
    with TrainingLock(tmp_path) as run:  # as a training run holds it
        assert run.acquire()
        with pytest.raises(CalmError, match=f"a training run \\(pid {os.getpid()}\\) is in progress"):
            rollback(weights)
    assert weights.read_bytes() == prev.read_bytes() == tiny_weights.read_bytes()


def test_calm_rollback_while_the_daemon_serves_never_shows_a_missing_file(
    tmp_path: Path, tiny_weights: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    weights = data / paths.WEIGHTS
    weights.write_bytes(paths.packaged_weights().read_bytes())  # two real models, back and forth
    (data / paths.PREV_WEIGHTS).write_bytes(tiny_weights.read_bytes())
    tiny_params = load_model(tiny_weights).header.param_count
    packaged_params = read_cwgt(weights).header.param_count
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # what any reader of shell.cwgt sees during the rollbacks
        while not stop.is_set():
            try:
                seen.append(str(read_cwgt(weights).header.param_count))
            except FormatError as exc:
                seen.append(f"error: {exc}")

    with running_daemon(tmp_path, args=("--no-import",), weights=False) as d, CalmClient(d.socket) as c:
        reader = threading.Thread(target=watch)
        reader.start()
        try:
            for _ in range(10):
                assert calm_main(["rollback", "--weights", str(weights)]) == 0
        finally:
            stop.set()
            reader.join()
        assert calm_main(["rollback", "--weights", str(weights)]) == 0  # 11: the tiny model serves
        wait_until(lambda: c.status()["status"]["model"]["parameters"] == tiny_params, "the reload")
    errors = [s for s in seen if s.startswith("error")]
    assert seen and set(seen) <= {str(packaged_params), str(tiny_params)}, errors[:3]


def test_a_pipelined_burst_of_records_starts_one_run(tmp_path: Path, tiny_weights: Path) -> None:
    """205 records in one write (a shell's backlog flushed when the daemon comes back), threshold
    50, the load gate lifted: each record past the threshold saw no run yet while the first was
    being started, and 43-45 runs were alive at once. Deciding and starting are one step: one.
    The other triggers at the same moment start no second one: `train` requests in the burst
    and from a second client, and the timer's due check every 10 ms."""
    data = install(tmp_path, tiny_weights)
    args = (*LONG_RUN, "--train-threshold", "50", "--train-max-load", "1000",  # the last threshold wins
            "--train-check-interval", "0.01")  # fmt: skip
    with (
        running_daemon(tmp_path, engine=ENGINE, args=args) as d,
        CalmClient(d.socket) as c,
        CalmClient(d.socket) as other,
    ):
        burst = b"".join(
            msgpack.packb({"op": "train", "id": i} if i % 20 == 0 else
                          {"op": "record", "id": i, "cmd": f"make target-{i}", "exit": 0, "session": "s"})
            for i in range(1, 226)
        )  # fmt: skip
        asks = b"".join(msgpack.packb({"op": "train", "id": i}) for i in range(1, 12))
        other.send_raw(asks)
        c.send_raw(burst)
        replies = [c.read_message() for _ in range(225)]
        records = [r for r in replies if "stored" in r]
        assert len(records) == 214 and all(r["stored"] for r in records), [
            r for r in records if not r["stored"]
        ][:3]
        answers = [other.read_message() for _ in range(11)] + [r for r in replies if "started" in r]
        assert sum(bool(r["started"]) for r in answers) <= 1, answers
        seen: set[int] = set()
        with held_still() as hold:  # a run seen stops there: no CPU on training while the test watches
            deadline = time.monotonic() + 8  # each run imports torch for a second or two: all would show
            while time.monotonic() < deadline:
                for pid in set(runs_on(data)) - seen:
                    hold(pid)
                    seen.add(pid)
                time.sleep(0.02)
            log = (data / paths.TRAINING_LOG).read_text(errors="replace")[-2000:]
            assert len(seen) == 1, (seen, d.read_output()[-3000:], log)
            status = training(c)
            assert status["runs_started"] == 1 and status["pid"] == next(iter(seen))
            assert c.train()["started"] is False  # and no second one on request while it runs
            assert d.read_output().count("training started") == 1
