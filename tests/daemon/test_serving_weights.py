"""No command replaces the serving weights by accident (issue 23): `calm init` without `-o` wrote
the live shell.cwgt (the daemon loaded random weights, suggestions stopped, and `calm rollback`
could not undo it). Now `calm init` needs `-o`; whatever replaces a shell.cwgt keeps the replaced
file as shell.prev.cwgt; `calm rollback` puts it back, and with no previous file goes back to the
packaged model. Against a real daemon, which reloads each change."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.shell.client import CalmClient
from tests.support.daemon import BIN, daemon_env, running_daemon
from tests.support.waiting import HANG_S

pytestmark = pytest.mark.slow


def calm(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "calm"), *args], env=daemon_env(home), capture_output=True, text=True,
                          timeout=300, cwd=home)  # fmt: skip


def wait_for(check: Callable[[], Any], what: str, timeout: float = HANG_S) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def user_weights(home: Path, weights: Path) -> tuple[Path, Path]:
    """A data dir in `home` whose serving weights (shell.cwgt) are a copy of `weights`."""
    data = home / "data"
    data.mkdir()
    serving = data / paths.WEIGHTS
    serving.write_bytes(weights.read_bytes())
    return data, serving


def served(c: CalmClient) -> tuple[str, bool, float]:
    status = c.status()["status"]
    return status["model"]["path"], status["serving_fallback"], status["loaded_at"]


def test_init_replaces_nothing_by_accident_and_rollback_undoes_what_it_replaced(
    tmp_path: Path, tiny_weights: Path
) -> None:
    data, weights = user_weights(tmp_path, tiny_weights)
    with running_daemon(tmp_path, engine="model", args=("--no-import",)) as d, CalmClient(d.socket) as c:
        path, fallback, loaded = served(c)
        assert (path, fallback) == (str(weights), False)
        refused = calm(tmp_path, "init")
        assert refused.returncode == 1 and "give the new file with -o FILE" in refused.stderr
        assert len(refused.stderr.splitlines()) == 1
        assert weights.read_bytes() == tiny_weights.read_bytes() and served(c)[2] == loaded
        # asked for, by name and --force: replaced, the old one kept
        replaced = calm(tmp_path, "init", "-o", str(weights), "--force")
        assert replaced.returncode == 0 and "calm rollback" in replaced.stdout, replaced.stderr
        assert (data / paths.PREV_WEIGHTS).read_bytes() == tiny_weights.read_bytes()
        assert weights.read_bytes() != tiny_weights.read_bytes()
        loaded = wait_for(lambda: (s := served(c))[2] != loaded and s[2], "the reload of the random weights")
        assert calm(tmp_path, "rollback").returncode == 0
        wait_for(lambda: served(c)[2] != loaded, "the reload of the rolled-back weights")
        assert weights.read_bytes() == tiny_weights.read_bytes()


def test_calm_train_in_place_keeps_the_previous_weights(tmp_path: Path, tiny_weights: Path) -> None:
    data, weights = user_weights(tmp_path, tiny_weights)
    source = tmp_path / "train.txt"
    source.write_text("".join(f"<HIST>cd proj<EXIT>0\n<CMD>{c}\n\n" for c in ["git status", "make test"] * 8))
    assert (
        calm(
            tmp_path, "dataset", "--from", str(source), "--output", str(tmp_path / "t.ctds"), "-q"
        ).returncode
        == 0
    )
    trained = calm(tmp_path, "train", "-d", str(tmp_path / "t.ctds"), "--max-steps", "2", "-q")  # in place
    assert trained.returncode == 0, trained.stderr
    assert (data / paths.PREV_WEIGHTS).read_bytes() == tiny_weights.read_bytes()
    assert weights.read_bytes() != tiny_weights.read_bytes()


def test_rollback_with_no_previous_file_goes_back_to_the_packaged_model(
    tmp_path: Path, tiny_weights: Path
) -> None:
    data, weights = user_weights(tmp_path, tiny_weights)
    with running_daemon(tmp_path, engine="model", args=("--no-import",)) as d, CalmClient(d.socket) as c:
        assert served(c)[:2] == (str(weights), False)
        back = calm(tmp_path, "rollback")
        assert back.returncode == 0 and "the packaged model serves now" in back.stdout
        wait_for(lambda: served(c)[:2] == (str(paths.packaged_weights()), True), "the packaged model")
        assert not weights.exists() and (data / paths.PREV_WEIGHTS).read_bytes() == tiny_weights.read_bytes()
        # `calmd status` says so: it said "shell.cwgt does not exist yet", as before any training
        assert c.status()["status"]["rolled_back"] is True
        shown = subprocess.run([str(BIN / "calmd"), "--no-color", "status"], env=daemon_env(tmp_path),
                               capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
        table = " ".join(shown.stdout.split())
        assert "was rolled back" in table and "does not exist yet" not in table, table
        assert any("candidate" in m for m in c.complete("git st", n=2, session="s"))  # it answers
        again = calm(tmp_path, "rollback")  # and forward again
        assert again.returncode == 0 and "restored" in again.stdout
        wait_for(lambda: served(c)[:2] == (str(weights), False), "the user's weights again")
        assert weights.read_bytes() == tiny_weights.read_bytes()
    nothing = tmp_path / "other"
    nothing.mkdir()
    none = subprocess.run(
        [str(BIN / "calm"), "rollback"], env=daemon_env(nothing), capture_output=True, text=True
    )
    assert none.returncode == 1 and "the packaged model serves already" in none.stderr
