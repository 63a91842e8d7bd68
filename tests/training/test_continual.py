"""Continual training: history datasets, the background run, and the daemon driving it."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from calmd import paths
from calmd.cli import calm_main
from calmd.formats.ctds import CtdsReader
from calmd.formats.tokenizer import parse_sequence
from calmd.history.store import HistoryStore
from calmd.shell.client import CalmClient
from calmd.suggest.ranker import Ranker, packaged_ranker
from calmd.training.background import RunOptions, read_status, run
from calmd.training.datasets import DatasetOptions, is_trivial, store_examples
from tests.support.builders import TRAIN_ARGS, WORK, record_work
from tests.support.daemon import BIN, daemon_env, running_daemon
from tests.support.waiting import HANG_S
from tests.training.test_ranker_refit import rounds

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them


@pytest.fixture(scope="module")
def tiny(tiny_weights: Path) -> Path:
    return tiny_weights


def fill(store: HistoryStore, rounds: int) -> None:
    for i in range(rounds):
        for j, cmd in enumerate(WORK):
            text = f"{cmd} {i}" if cmd.startswith("git commit") else cmd
            store.record(text, exit=1 if cmd == "false cmd" else 0, cwd="/p", git="main", session="s",
                         ts=1000 + 10 * i + j)  # fmt: skip


def data_dir_with(data: Path, tiny: Path, rounds: int) -> Path:
    """A data dir holding `rounds` of WORK in its store and the tiny model as its serving weights
    (returned), as a background run finds it."""
    store = HistoryStore(data / paths.HISTORY)
    fill(store, rounds)
    store.close()
    weights = data / paths.WEIGHTS
    weights.write_bytes(tiny.read_bytes())
    return weights


def test_trivial_commands() -> None:
    assert is_trivial("ls") and is_trivial("cd  ..") and is_trivial("pwd")
    assert not is_trivial("ls -la") and not is_trivial("cd src")


def test_history_examples_filter_and_keep_context(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    fill(store, 6)
    pairs = store_examples(store, DatasetOptions())
    cmds = [c for _, c in pairs]
    assert "ls" not in cmds and "cd .." not in cmds  # trivial
    assert "false cmd" not in cmds  # failed
    assert cmds.count("make build") == 3  # --max-dup 3
    assert len([c for c in cmds if c.startswith("git commit")]) == 6  # distinct commands
    ctx, _ = pairs[-1]
    assert [h["cmd"] for h in ctx["history"]][-1] in WORK  # the preceding commands, trivial ones too
    assert len(ctx["history"]) == 5 and ctx["cwd"] == "/p" and ctx["git"] == "main"
    wide = store_examples(store, DatasetOptions(include_failed=True, include_trivial=True, max_dup=100))
    assert len(wide) == 6 * len(WORK)
    assert len(store_examples(store, DatasetOptions(max_entries=7, max_dup=100))) == 4


def test_history_datasets_carry_the_comp_and_env_each_record_kept(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    store = HistoryStore(db)
    store.record("mkdir build", exit=0, cwd="/p", session="s", comp=["bin/"], env="venv:p")
    store.record("vim notes.md", exit=0, cwd="/p", session="s", comp=["notes.md", "node_modules/"])
    store.close()
    out = tmp_path / "hist.ctds"
    assert calm_main(["dataset", "--db", str(db), "-o", str(out), "--quiet"]) == 0
    reader = CtdsReader(out)
    examples = [parse_sequence(reader.sequence(i)) for i in range(reader.count())]
    assert [(e.cmd, e.fields.get("completions"), e.fields.get("env")) for e in examples] == [
        ("mkdir build", ["bin/"], "venv:p"),
        ("vim notes.md", ["notes.md", "node_modules/"], None),
    ]
    assert calm_main(["dataset", "--db", str(db), "-o", str(out), "--comp-frames", "1", "--quiet"]) == 0
    assert parse_sequence(CtdsReader(out).sequence(1)).fields["completions"] == ["notes.md"]


def test_calm_dataset_without_from_reads_the_history_store(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite3"
    store = HistoryStore(db)
    fill(store, 4)
    store.close()
    out = tmp_path / "hist.ctds"
    assert calm_main(["dataset", "--db", str(db), "-o", str(out), "--max-dup", "100", "--quiet"]) == 0
    # per round: make build, make test, git status, git commit (ls, cd .., a failure dropped)
    assert CtdsReader(out).count() == 4 * 4


def test_run_swaps_in_a_better_model_and_keeps_the_old_one(tmp_path: Path, tiny: Path) -> None:
    weights = data_dir_with(tmp_path, tiny, rounds=30)
    result = run(RunOptions(tmp_path, weights, min_examples=10, holdout=10, epochs=3, lr=3e-3))
    assert result["state"] == "done", result
    assert result["swapped"] is True and result["new_loss"] <= result["old_loss"], result
    assert (tmp_path / paths.PREV_WEIGHTS).read_bytes() == tiny.read_bytes()
    assert weights.read_bytes() != tiny.read_bytes()
    assert "swapped in; ranker refitted on" in read_status(tmp_path)["reason"]  # the model's, the ranker's
    assert not list(tmp_path.glob(".shell.candidate.*"))
    refitted = (tmp_path / paths.RANKER).read_bytes()
    assert calm_main(["rollback", "--weights", str(weights)]) == 0
    assert weights.read_bytes() == tiny.read_bytes()
    # the run's ranker goes too (moved aside: the packaged one serves, the next rollback undoes it)
    assert not (tmp_path / paths.RANKER).exists()
    assert (tmp_path / paths.PREV_RANKER).read_bytes() == refitted


def test_run_with_too_little_history_changes_nothing(tmp_path: Path, tiny: Path) -> None:
    weights = data_dir_with(tmp_path, tiny, rounds=1)
    result = run(RunOptions(tmp_path, weights))
    assert result["swapped"] is False and "training examples" in result["reason"]
    assert weights.read_bytes() == tiny.read_bytes()


def wait_status(c: CalmClient, check: object, timeout: float = HANG_S) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        status = c.status()["status"]
        if check(status):  # type: ignore[operator]
            return status  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def test_daemon_trains_on_request_and_reloads_the_result(tmp_path: Path, tiny: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / paths.WEIGHTS).write_bytes(tiny.read_bytes())
    args = ("--no-import", "--train-threshold", "0", *TRAIN_ARGS)
    with (
        running_daemon(tmp_path, engine="model", args=args) as d,
        CalmClient(d.socket) as c,
    ):
        record_work(c)
        before = c.status()["status"]["loaded_at"]
        assert c.train()["started"] is True
        assert c.train()["started"] is False  # one run at a time
        status = wait_status(
            c, lambda s: s["training"]["last_result"] is not None and s["training"]["pid"] is None
        )
        assert status["training"]["last_result"]["swapped"] is True, status  # type: ignore[index]
        wait_status(c, lambda s: s["loaded_at"] != before)
        assert (tmp_path / "data" / paths.PREV_WEIGHTS).exists()
        table = subprocess.run([str(BIN / "calmd"), "--socket", str(d.socket), "--no-color", "status"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert "swapped in" in " ".join(table.split())  # why the model changed, in the table
        # completions keep working with the new weights
        assert any("candidate" in m for m in c.complete("make", n=2, session="s"))


def test_threshold_starts_a_run_and_a_killed_run_leaves_the_model(tmp_path: Path, tiny: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / paths.WEIGHTS).write_bytes(tiny.read_bytes())
    args = ("--no-import", "--train-threshold", "40", "--train-max-load", "1000", *TRAIN_ARGS,
            "--train-arg=--epochs=50")  # fmt: skip
    with (
        running_daemon(tmp_path, engine="model", args=args) as d,
        CalmClient(d.socket) as c,
    ):
        for i in range(6):
            for cmd in WORK:
                c.record(f"{cmd} {i}", exit=0, session="s")
        status = wait_status(c, lambda s: s["training"]["state"] == "training")
        assert status["history"]["since_last_training"] < 40  # type: ignore[index]
        os.kill(status["training"]["pid"], signal.SIGKILL)  # type: ignore[index]
        status = wait_status(c, lambda s: s["training"]["state"] == "interrupted")
        assert (tmp_path / "data" / paths.WEIGHTS).read_bytes() == tiny.read_bytes()
        assert not (tmp_path / "data" / paths.PREV_WEIGHTS).exists()
        assert any("candidate" in m for m in c.complete("make", n=2, session="s"))


def test_run_refits_the_ranker_privately_and_keeps_the_one_it_replaces(tmp_path: Path, tiny: Path) -> None:
    weights = data_dir_with(tmp_path, tiny, rounds=30)
    ranker = tmp_path / paths.RANKER
    opts = RunOptions(tmp_path, weights, min_examples=10**6)  # the model's part: nothing to train yet
    result = run(opts)
    assert result["ranker_refitted"] is True and result["ranker_examples"] >= 100, result
    assert "ranker refitted on" in result["reason"] and result["swapped"] is False
    assert stat.S_IMODE(ranker.stat().st_mode) == 0o600
    fitted = Ranker.load(ranker)
    assert fitted.info["refit"]["examples"] == result["ranker_examples"]
    assert not np.allclose(fitted.w1, packaged_ranker().w1)  # it learned something of this user's
    # weights and the packaged carry-over table only: none of the user's commands is in the file
    text = ranker.read_text()
    assert not any(cmd in text for cmd in ("make build", "git commit -am wip", "git status"))
    assert not (tmp_path / paths.PREV_RANKER).exists()
    first = ranker.read_bytes()
    assert run(opts)["ranker_refitted"] is True
    assert (tmp_path / paths.PREV_RANKER).read_bytes() == first  # `calm rollback` brings it back
    assert read_status(tmp_path)["ranker_refitted"] is True
    # the model alone (as `calm replay --refit model` measures it): the ranker files stay
    second = ranker.read_bytes()
    alone = run(RunOptions(tmp_path, weights, min_examples=10**6, refit_ranker=False))
    assert alone["ranker_refitted"] is False and "--no-refit-ranker" in alone["reason"]
    assert ranker.read_bytes() == second and (tmp_path / paths.PREV_RANKER).read_bytes() == first


def test_run_with_too_few_commands_keeps_the_packaged_ranker(tmp_path: Path, tiny: Path) -> None:
    weights = data_dir_with(tmp_path, tiny, rounds=2)
    result = run(RunOptions(tmp_path, weights))
    assert result["ranker_refitted"] is False
    assert result["reason"].endswith("the packaged ranker stays"), result
    assert not (tmp_path / paths.RANKER).exists()


def test_daemon_serves_the_ranker_a_run_refitted_and_survives_a_corrupt_one(
    tmp_path: Path, tiny: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / paths.WEIGHTS).write_bytes(tiny.read_bytes())
    ranker = data / paths.RANKER
    # the model's fine-tune has too few examples to run: this run refits the ranker alone
    args = ("--no-import", "--train-threshold", "0", *TRAIN_ARGS, "--train-arg=--min-examples=100000")
    with (
        running_daemon(tmp_path, engine="model", args=args) as d,
        CalmClient(d.socket) as c,
    ):
        record_work(c)
        model = c.status()["status"]["model"]
        assert model["ranker_refit"] is None and "(packaged, " in model["ranker"], model
        assert c.train()["started"] is True
        status = wait_status(
            c, lambda s: s["training"]["last_result"] is not None and s["training"]["pid"] is None
        )
        last = status["training"]["last_result"]  # type: ignore[index]
        assert last["ranker_refitted"] is True and last["swapped"] is False, last
        assert stat.S_IMODE(ranker.stat().st_mode) == 0o600
        # reloaded without a restart: the daemon ranks with the file the run wrote
        model = wait_status(c, lambda s: s["model"]["ranker_refit"] is not None)["model"]  # type: ignore[index]
        assert (
            model["ranker_refit"]["examples"]
            == last["ranker_examples"]
            == Ranker.load(ranker).info["refit"]["examples"]
        )
        assert model["ranker_path"] == str(ranker) and model["ranker_error"] is None
        table = subprocess.run([str(BIN / "calmd"), "--socket", str(d.socket), "--no-color", "status"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert "ranker refitted on" in " ".join(table.split())  # the run's result, in the table
        assert "examples of yours" in " ".join(table.split())  # which ranker serves
        # a corrupt file (a foreign one, a disk error): one line in the log, the packaged ranker
        # serves, and the daemon answers on
        broken = data / "ranker.tmp"
        broken.write_text('{"format": "calm-ranker", "version": 1, "features": [')
        os.replace(broken, ranker)
        model = wait_status(c, lambda s: s["model"]["ranker_error"] is not None)["model"]  # type: ignore[index]
        assert model["ranker_refit"] is None and "did not load" in model["ranker_error"]
        assert [m for m in c.complete("make", n=2, session="s") if "candidate" in m]
        assert d.read_output().count("did not load") == 1, d.read_output()


def test_the_refitted_ranker_changes_the_daemons_order_and_calm_rollback_takes_it_back(
    tmp_path: Path, tiny: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / paths.WEIGHTS).write_bytes(tiny.read_bytes())
    # a previous model that is the same one: `calm rollback` (which undoes the model's swap too)
    # then changes only the ranker
    (data / paths.PREV_WEIGHTS).write_bytes(tiny.read_bytes())
    # --no-prefetch: the orders compared are the engines' own searches. A prefetched empty prompt
    # is continued by the engine that prepared it and not by the next one a reload installs, and
    # whether it was ready when the first order was taken depends on the machine's load (the
    # empty prompt's order differed once, with two busy loops beside the suite).
    args = ("--no-import", "--train-threshold", "0", "--train-arg=--min-examples=100000", "--no-prefetch")

    def calm_rollback() -> str:
        done = subprocess.run([str(BIN / "calm"), "rollback"], env=daemon_env(tmp_path), capture_output=True,
                              text=True, timeout=300, check=True)  # fmt: skip
        return done.stdout

    with (
        running_daemon(tmp_path, engine="model", args=args) as d,
        CalmClient(d.socket) as c,
    ):
        for cmd in rounds(50):  # a habit the packaged ranker misses (tests/training/test_ranker_refit.py)
            c.record(cmd, exit=0, session="s")
        # a burst of 400 records reaches the history index between keystrokes, a share a key and
        # the rest in the catch-up's slices (calmd/suggest/index_catch_up.py): all of it, first
        wait_status(c, lambda s: s["model"]["indexed_commands"] == s["history"]["commands"])

        def order() -> list[list[str]]:
            """The daemon's five lines for a few inputs, all asked at the same state of the history."""
            return [[m["candidate"] for m in c.complete(typed, n=5, session="s") if "candidate" in m]
                    for typed in ("", "v", "vim notes", "g", "c", "l", "m")]  # fmt: skip

        packaged = order()
        assert c.train()["started"] is True
        wait_status(c, lambda s: s["model"]["ranker_refit"] is not None)
        refitted = order()
        assert sum(a != b for a, b in zip(packaged, refitted, strict=True)) >= 2, (packaged, refitted)
        assert "the packaged ranker serves now" in calm_rollback()  # no previous ranker: moved aside
        wait_status(c, lambda s: s["model"]["ranker_refit"] is None)
        assert order() == packaged  # the ranker file was the only difference
        assert "restored" in calm_rollback()
        wait_status(c, lambda s: s["model"]["ranker_refit"] is not None)
        assert order() == refitted
