"""The daemon with its real model engine, over its real socket: model candidates, history
proposals scored by the model, and hot reload of real weights."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.shell.client import CalmClient
from tests.support.daemon import running_daemon
from tests.support.tiny_model import CONTEXT
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them

ENGINE = "model"


@pytest.fixture(scope="module")
def weights(tiny_weights: Path) -> Path:
    return tiny_weights  # the session's tiny model (conftest.py)


def install(home: Path, weights: Path) -> None:
    (home / "data").mkdir(parents=True, exist_ok=True)
    (home / "data" / paths.WEIGHTS).write_bytes(weights.read_bytes())


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


def test_hot_reload_swaps_in_new_weights(tmp_path: Path, weights: Path, other_tiny_weights: Path) -> None:
    install(tmp_path, weights)
    with running_daemon(tmp_path, engine=ENGINE, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        before = c.status()["status"]["loaded_at"]
        assert candidates(c, "make", n=1, session="s", history=CONTEXT["history"]) == ["make test"]
        target = tmp_path / "data" / paths.WEIGHTS
        shutil.copy(other_tiny_weights, tmp_path / "new.cwgt")  # a model that learned other lines
        os.replace(tmp_path / "new.cwgt", target)  # atomically, as training does
        wait_until(lambda: c.status()["status"]["loaded_at"] != before, "the new weights loaded",
                   report=d.read_output)  # fmt: skip
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


def candidates_of(replies: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in replies if "candidate" in m]


def answers(c: CalmClient) -> dict[str, int]:
    return c.status()["status"]["model"]["answers"]  # type: ignore[no-any-return]


def test_typing_through_the_top_line_continues_the_previous_answer(tmp_path: Path, weights: Path) -> None:
    install(tmp_path, weights)
    history = CONTEXT["history"]
    with running_daemon(tmp_path, engine=ENGINE, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        for cmd in ["git status", "make test", "git stash pop"]:
            c.record(cmd, exit=0, cwd="/p", session="other")
        target = "git status"
        ghost = [m for m in c.complete("", n=5, session="s", cwd="/p", history=history) if "candidate" in m]
        assert ghost[0]["candidate"] == target
        before = answers(c)
        for i in range(1, len(target)):
            through = [m for m in c.complete(target[:i], n=5, session="s", cwd="/p", history=history)
                       if "candidate" in m]  # fmt: skip
            # the same context in a session with no previous answer: a whole search
            fresh = [m for m in c.complete(target[:i], n=5, session=f"fresh{i}", cwd="/p", history=history)
                     if "candidate" in m]  # fmt: skip
            # the ghost never changes while the user types along it, and it is the search's too,
            # with the same score and confidence; where the daemon fills a new COMP frame (a word
            # begun) the answer keeps the scores of the old frame, within what a COMP frame moves
            # them (docs/performance.md, "Typing through a suggestion"); exactly the search's
            # where the client sends its COMP items itself (none here: nothing changes)
            assert through[0]["candidate"] == fresh[0]["candidate"] == target
            assert through[0]["score"] == pytest.approx(fresh[0]["score"], abs=0.05)
            assert through[0]["confidence"] == pytest.approx(fresh[0]["confidence"], abs=0.05)
            mine = {"cwd": "/p", "history": history, "completions": []}
            exact = candidates_of(c.complete(target[:i], n=5, session="exact", **mine))
            searched = candidates_of(c.complete(target[:i], n=5, session=f"exact{i}", **mine))
            assert exact[0]["candidate"] == searched[0]["candidate"]
            assert exact[0]["score"] == pytest.approx(searched[0]["score"], abs=2e-3)
            assert exact[0]["confidence"] == pytest.approx(searched[0]["confidence"], abs=2e-3)
            # the documented difference: below the top, the previous answer's lines (and those its
            # search found beyond n) that extend the input, scored as the search scores them: the
            # lines both hold come in the same order, but the search may find others
            texts = [m["candidate"] for m in fresh]
            kept = [m["candidate"] for m in through]
            assert len(kept) <= 5 and all(t.startswith(target[:i]) for t in kept)
            common = [t for t in kept if t in texts]
            assert common == sorted(common, key=texts.index)
            scores = [m["score"] for m in through]
            assert scores == sorted(scores, reverse=True)
        after = answers(c)
        # every keystroke of session s was answered from the previous answer, also where a word
        # begins ("g", "git s") and the daemon fills a new COMP frame: its lines are then scored
        # afresh in the new context (the scores above match the search's); each fresh session searched
        through = after["typed_through"] - before["typed_through"]
        assert through >= 2 * (len(target) - 1) - 1  # sessions s and exact (whose first is a search)
        assert after["searched"] - before["searched"] == 2 * (len(target) - 1) + 1
        # a character the top line does not continue with: a new search
        candidates(c, "git sx", n=5, session="s", cwd="/p", history=history)
        assert answers(c)["searched"] == after["searched"] + 1


def wait_status(c: CalmClient, ready: object, timeout: float = HANG_S) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        status: dict[str, object] = c.status()["status"]
        if ready(status):  # type: ignore[operator]
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.02)


def test_a_record_prepares_the_next_empty_prompt(tmp_path: Path, weights: Path) -> None:
    install(tmp_path, weights)
    with running_daemon(tmp_path, engine=ENGINE, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        candidates(c, "", n=3, session="s", cwd="/p")  # the shell's context: cwd /p, 3 lines
        c.record("cd proj", exit=0, cwd="/p", session="s")
        wait_status(c, lambda s: s["prefetch"]["finished"] == 1)
        before = answers(c)
        got = list(c.complete("", n=3, session="s", cwd="/p"))
        after = answers(c)
        # answered from the prepared answer: no search
        assert (
            after["typed_through"] == before["typed_through"] + 1 and after["searched"] == before["searched"]
        )
        # what a search in a session with the same context answers
        history = [{"cmd": "cd proj", "exit": 0}]
        fresh = list(c.complete("", n=3, session="other", cwd="/p", history=history))
        assert [m.get("candidate") for m in got] == [m.get("candidate") for m in fresh]
        assert answers(c)["searched"] == after["searched"] + 1
        # the next command changed folder: the prepared context is not the one asked for
        c.record("cd sub", exit=0, cwd="/p", session="s")
        wait_status(c, lambda s: s["prefetch"]["finished"] == 2)
        candidates(c, "", n=3, session="s", cwd="/p/proj/sub")
        # a search of its own (besides the fresh session's and the prefetch's), nothing continued
        assert answers(c) == {"searched": after["searched"] + 3, "typed_through": after["typed_through"]}
        assert c.status()["status"]["prefetch"]["started"] == 2
    without = tmp_path / "without"
    install(without, weights)
    with (
        running_daemon(without, engine=ENGINE, args=("--no-import", "--no-prefetch")) as d,
        CalmClient(d.socket) as c,
    ):
        candidates(c, "", n=3, session="s", cwd="/p")
        c.record("cd proj", exit=0, cwd="/p", session="s")
        candidates(c, "", n=3, session="s", cwd="/p")
        assert c.status()["status"]["prefetch"]["started"] == 0
        assert answers(c)["searched"] == 2
