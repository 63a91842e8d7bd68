"""A real daemon typed at while its heavy work runs (issue 42): the first-start import and a sync
import run in the worker process (calmd/daemon/worker.py), every keystroke meanwhile is answered,
the work completes, and what it brought reaches the suggestions (calmd/daemon/catch_up.py). How
fast the keystrokes are beside it is bench/heavy_jobs.py's to measure, not a test's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.shell.client import CalmClient
from calmd.sync.config import SyncConfig, write_config
from calmd.sync.machine import Sync
from calmd.sync.seal import new_key, write_key
from tests.support.daemon import READY, running_daemon
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.slow  # real daemons, tens of thousands of commands

NO_TRAINING = ("--train-threshold", "0")


def keystroke(client: CalmClient, typed: str) -> list[dict[str, Any]]:
    """One keystroke as a shell sends it; its replies, checked to end in a `done` not cancelled."""
    replies = list(client.complete(typed, n=3, session="typing", early=True))
    assert replies and replies[-1].get("done") and not replies[-1].get("cancelled"), replies
    return replies


def type_while(client: CalmClient, busy: Any, ceiling: float = HANG_S) -> int:
    """Keystrokes until `busy(status)` says the work is over; how many were typed while it ran."""
    deadline = time.monotonic() + ceiling
    typed = 0
    while busy(client.status()["status"]):
        assert time.monotonic() < deadline, "the heavy work did not end"
        keystroke(client, "git st"[: typed % 6 + 1])
        typed += 1
    return typed


def test_keystrokes_are_answered_while_the_first_start_import_runs_in_its_worker(tmp_path: Path) -> None:
    lines = 60_000
    (tmp_path / ".zsh_history").write_text(
        "".join(f": {1_600_000_000 + i}:0;echo line {i}\n" for i in range(lines))
    )
    with running_daemon(tmp_path, args=NO_TRAINING) as d, CalmClient(d.socket) as c:
        during = type_while(c, lambda s: s["history"]["import"]["running"])
        assert during >= 1  # `running` from `ready` on: the first keystroke was typed beside the import
        status = c.status()["status"]
        assert status["history"]["commands"] == lines
        assert status["history"]["import"]["failures"] == 0
        # in a process of its own: its log lines are the worker's
        assert "calmd-worker: " in d.read_output() and "echo line" not in d.read_output()
        assert keystroke(c, "echo line 5999")  # the daemon answers on once it is over


@pytest.mark.parametrize("files", [True, False], ids=["a history file", "none"])
def test_the_first_start_forks_its_import_worker_before_ready(tmp_path: Path, files: bool) -> None:
    """The daemon's fork (a few hundred MB of mappings) held the event loop 10-20 ms, which the
    first keystroke after `ready` waited for: the worker starts before `ready`, and only when the
    import has a file to read."""
    if files:
        (tmp_path / ".bash_history").write_text("make test\ngit status\n")
    with running_daemon(tmp_path, args=(*NO_TRAINING, "--verbose")) as d, CalmClient(d.socket) as c:
        wait_until(lambda: not c.status()["status"]["history"]["import"]["running"], "the import's end")
        lines = d.read_output().splitlines()
    ready = next(i for i, line in enumerate(lines) if READY in line)
    started = [i for i, line in enumerate(lines) if "the import worker started" in line]
    assert started == ([started[0]] if files else []) and (not files or started[0] < ready), lines


def test_a_sync_import_beside_typing_reaches_the_suggestions(tmp_path: Path) -> None:
    records = 20_000
    other, folder, home = tmp_path / "other", tmp_path / "folder", tmp_path / "home"
    for folder_made in (other, folder, home, home / "data"):
        folder_made.mkdir(mode=0o700)
    key = new_key()
    store = HistoryStore(other / paths.HISTORY)
    with store.writing() as db:
        db.executemany(
            "INSERT INTO commands (ts, session, cwd, cmd, exit) VALUES (?, 'o', '/srv', ?, 0)",
            [(1.7e9 + i, f"kubectl rollout restart deploy/service{i % 500}") for i in range(records - 1)]
            + [(1.7e9 + records, "terraform apply -target=module.imported_from_the_desktop")],
        )
    for data, mode in ((other, "send"), (home / "data", "receive")):
        write_config(paths.sync_config_path(data), SyncConfig(str(folder), mode))
        write_key(paths.sync_key_path(data), key)
    report = Sync(store, other).run(wait=True)
    assert report is not None and report.exported == records
    store.close()
    args = (*NO_TRAINING, "--no-import")
    with (
        running_daemon(home, engine="model", weights=False, args=args) as d,
        CalmClient(d.socket) as c,
    ):
        type_while(c, lambda s: s["sync"].get("last_run") is None)
        assert c.status()["status"]["sync"]["records_in"] == records
        # the history index reads them between keystrokes: the desktop's line is proposed
        deadline = time.monotonic() + HANG_S
        while True:
            replies = keystroke(c, "terraform apply -target=module.imp")
            lines = [m.get("early") or m.get("candidate") for m in replies]
            if "terraform apply -target=module.imported_from_the_desktop" in lines:
                break
            assert time.monotonic() < deadline, f"the imported line never came: {lines}"
