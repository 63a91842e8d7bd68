"""COMP filled by the daemon and suggestions checked against the disk (issue 15), as a user meets
them: the packaged model behind a real daemon socket, a real directory as the shell's cwd."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from calmd import paths
from calmd.shell.client import CalmClient
from tests.support.daemon import running_daemon

ENGINE = "model"


def candidates(c: CalmClient, text: str, **kw: object) -> list[str]:
    return [m["candidate"] for m in c.complete(text, **kw) if "candidate" in m]  # type: ignore[arg-type]


@contextlib.contextmanager
def serve(home: Path) -> Iterator[CalmClient]:
    with (
        running_daemon(home, engine=ENGINE, args=("--no-import",)) as d,
        CalmClient(d.socket) as c,
    ):
        yield c


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / paths.WEIGHTS).write_bytes(paths.packaged_weights().read_bytes())
    return tmp_path


def test_paths_that_exist_are_suggested_and_missing_ones_never_first(home: Path) -> None:
    work = home / "work"
    work.mkdir()
    (work / "notes.md").write_text("x")
    cwd = str(work)
    with serve(home) as c:
        os.mkdir(work / "build")  # the user runs `mkdir build`, and the shell records it
        c.record("mkdir build", exit=0, cwd=cwd, session="s")
        got = candidates(c, "cd b", n=5, session="s", cwd=cwd)
        assert got and got[0] in ("cd build/", "cd build"), got
        got = candidates(c, "vim no", n=5, session="s", cwd=cwd)
        assert got and got[0] == "vim notes.md", got
        for typed in ("cd ", "cd d", "cd di", "cd dis"):
            got = candidates(c, typed, n=8, session="s", cwd=cwd)
            assert not any(t.rstrip("/") == "cd dist" for t in got), got
        # the user's own `cd dist` from before, now that dist/ is gone: never sent (not drawn, and
        # not offered to Shift-Tab or bash either), while what exists still is
        c.record("cd dist", exit=0, cwd=cwd, session="s")
        texts = [m["candidate"] for m in c.complete("cd ", n=8, session="s", cwd=cwd) if "candidate" in m]
        assert texts and "cd dist" not in texts, texts
        (home / "dist").mkdir()  # the user makes one where they are: the record drops the listings
        c.record("mkdir dist", exit=0, cwd=str(home), session="s")
        assert "cd dist" in candidates(c, "cd d", n=8, session="s", cwd=str(home))  # where it is
        context = c.status()["status"]["context"]
        assert context["folders_listed"] >= 1 and context["listings_queued"] == 0


def test_records_keep_the_comp_and_env_of_their_last_keystroke(home: Path) -> None:
    work = home / "work"
    (work / "node_modules").mkdir(parents=True)
    (work / "notes.md").write_text("x")
    cwd = str(work)
    with serve(home) as c:
        for i in range(1, len("vim no") + 1):
            list(c.complete("vim no"[:i], n=1, session="s", cwd=cwd, env="venv:work"))
        c.record("vim notes.md", exit=0, cwd=cwd, session="s", env="venv:work")
        c.record("make", exit=0, cwd=cwd, session="s")  # no keystroke asked about it: no COMP
    con = sqlite3.connect(home / "data" / paths.HISTORY)
    rows = con.execute("SELECT cmd, comp, env FROM commands ORDER BY id").fetchall()
    con.close()
    assert rows == [("vim notes.md", "node_modules/\nnotes.md", "venv:work"), ("make", "", "")]


def test_comp_reaches_the_model_from_path_sent_once(home: Path, tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "zzcalmtool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    with serve(home) as c:
        # the PATH comes once, on any complete; the commands are read in the background
        for m in c.replies(c.send("complete", n=0, session="p", path=str(bindir), ctx={"input": ""})):
            assert "error" not in m
        for _ in range(200):
            list(c.complete("zzcalm", n=1, session="p", cwd=str(tmp_path)))
            c.record("zzcalmtool", exit=0, cwd=str(tmp_path), session="p")
            con = sqlite3.connect(home / "data" / paths.HISTORY)
            comps = [r[0] for r in con.execute("SELECT comp FROM commands")]
            con.close()
            if "zzcalmtool" in comps:
                break
        assert "zzcalmtool" in comps
