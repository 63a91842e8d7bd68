"""The daemon with its real model engine, over its real socket: model candidates, history
proposals scored by the model, and hot reload of real weights."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from calmd.shell.client import CalmClient
from tests.daemon import running_daemon
from tests.tiny_model import CONTEXT, save_tiny, train_tiny

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them

ENGINE = "model"


@pytest.fixture(scope="module")
def weights(tiny_weights: Path) -> Path:
    return tiny_weights  # the session's tiny model (conftest.py)


def install(home: Path, weights: Path) -> None:
    (home / "data").mkdir(parents=True, exist_ok=True)
    (home / "data" / "shell.cwgt").write_bytes(weights.read_bytes())


def candidates(c: CalmClient, text: str, **kw: object) -> list[str]:
    return [m["candidate"] for m in c.complete(text, **kw) if "candidate" in m]  # type: ignore[arg-type]


def test_model_candidates_stream_best_first(tmp_path: Path, weights: Path) -> None:
    install(tmp_path, weights)
    with running_daemon(tmp_path, engine=ENGINE, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        messages = list(c.complete("git st", n=2, session="s", history=CONTEXT["history"]))
        assert [m.get("candidate") for m in messages[:2]] == ["git status", "git stash pop"]
        assert messages[0]["score"] >= messages[1]["score"]
        assert messages[-1]["done"] is True
        # the stop condition `|` ends a candidate at the pipe
        assert candidates(c, "ls", n=1, session="s", history=CONTEXT["history"]) == ["ls -la"]
        status = c.status()["status"]
        assert status["model"]["parameters"] > 0 and status["model"]["domain"] == "shell"


def test_recorded_commands_are_proposed_and_ranked_by_the_model(tmp_path: Path, weights: Path) -> None:
    install(tmp_path, weights)
    with running_daemon(tmp_path, engine=ENGINE, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        assert "git stash list --all" not in candidates(c, "git stash l", n=3, session="s")
        for _ in range(3):
            c.record("git stash list --all", exit=0, cwd="/p", session="s")
        got = candidates(c, "git stash l", n=3, session="s", cwd="/p")
        assert got[0] == "git stash list --all"
        assert len(got) == len(set(got))


def test_hot_reload_swaps_in_new_weights(tmp_path: Path, weights: Path) -> None:
    install(tmp_path, weights)
    with running_daemon(tmp_path, engine=ENGINE, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        before = c.status()["status"]["loaded_at"]
        assert candidates(c, "make", n=1, session="s", history=CONTEXT["history"]) == ["make test"]
        other = train_tiny(("make install", "git status"), favourite=0)
        target = tmp_path / "data" / "shell.cwgt"
        save_tiny(tmp_path / "new.cwgt", other)
        os.replace(tmp_path / "new.cwgt", target)  # atomically, as training does
        deadline = time.monotonic() + 10
        while c.status()["status"]["loaded_at"] == before:
            assert time.monotonic() < deadline, d.read_output()
            time.sleep(0.05)
        assert candidates(c, "make", n=1, session="s", history=CONTEXT["history"]) == ["make install"]


def test_learned_ranker_predicts_what_follows_in_the_users_loop(tmp_path: Path, weights: Path) -> None:
    install(tmp_path, weights)
    loop = ["vim main.c", "make", "./main", "ls"]
    with running_daemon(tmp_path, engine=ENGINE, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        for _ in range(6):
            for cmd in loop:
                c.record(cmd, exit=0, cwd="/p", session="s")
        # an empty prompt after "ls": the loop goes on with the editor, not the most recent or
        # most frequent command, and the daemon never saw this loop in training
        assert candidates(c, "", n=3, session="s", cwd="/p")[0] == "vim main.c"
        c.record("vim main.c", exit=0, cwd="/p", session="s")
        assert candidates(c, "", n=3, session="s", cwd="/p")[0] == "make"
        model = c.status()["status"]["model"]
        assert model["indexed_commands"] == 25 and "learned" in model["ranker"]


def test_a_new_line_carried_over_from_the_previous_command(tmp_path: Path, weights: Path) -> None:
    install(tmp_path, weights)
    with running_daemon(tmp_path, engine=ENGINE, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        for name in ["alpha", "beta", "gamma", "delta"]:
            for cmd in [f"mkdir {name}", f"cd {name}", "git init", "vim README.md", "cd .."]:
                c.record(cmd, exit=0, cwd="/p", session="s")
        c.record("mkdir newproj", exit=0, cwd="/p", session="s")
        # never run before, proposed from the user's own mkdir -> cd habit
        assert candidates(c, "cd ", n=3, session="s", cwd="/p")[0] == "cd newproj"
