"""What the daemon suggests with its real engine and the packaged model, over its real socket:
failed commands demoted, nothing invented after a complete command, today's arguments first,
calibrated confidences and the early proposal."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.shell.client import CalmClient
from tests.support.builders import month_old_history
from tests.support.daemon import BIN, running_daemon, wait_imported

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them

ENGINE = "model"
ARGS = ("--train-threshold", "0")  # no background training while the tests run


def serve(home: Path, *, imports: bool = False) -> Any:
    """The daemon with the packaged model (no user weights: it serves the default one)."""
    return running_daemon(
        home, engine=ENGINE, args=ARGS if imports else (*ARGS, "--no-import"), weights=False
    )


def candidates(c: CalmClient, text: str, **kw: Any) -> list[dict[str, Any]]:
    return [m for m in c.complete(text, **kw) if "candidate" in m]


def test_a_typo_that_exited_127_does_not_come_back(tmp_path: Path) -> None:
    with serve(tmp_path) as d, CalmClient(d.socket) as c:
        c.record("git status", exit=0, session="s")
        for _ in range(3):  # typed more often, and more recently, than what worked
            c.record("gti status", exit=127, session="s")
        got = candidates(c, "g", session="s")
        assert got[0]["candidate"] == "git status"
        for typed in ("gt", "g"):
            got = candidates(c, typed, session="s")
            assert got and got[0]["candidate"] != "gti status"
            assert all(m["confidence"] == 0.0 for m in got if m["candidate"].startswith("gti"))
        c.record("(exit 3)", exit=3, session="s")
        c.record("(exit 3)", exit=3, session="s")
        got = candidates(c, "", session="s")
        assert got[0]["candidate"] != "(exit 3)"


def test_nothing_is_invented_after_a_complete_command(tmp_path: Path) -> None:
    with serve(tmp_path) as d, CalmClient(d.socket) as c:
        c.record("git status", exit=0, session="s")
        c.record('git commit -m "fix login redirect"', exit=0, session="s")
        assert candidates(c, "git status", session="s") == []
        assert candidates(c, 'git commit -m "fix login redirect"', session="s") == []
        c.record("git status -s", exit=0, session="s")  # the user's own history continues it
        assert [m["candidate"] for m in candidates(c, "git status", session="s")] == ["git status -s"]


def test_half_a_command_is_never_suggested(tmp_path: Path) -> None:
    with serve(tmp_path) as d, CalmClient(d.socket) as c:
        for _ in range(3):  # recorded more often than the good line: it would come first
            c.record('git commit -m "fix main', exit=0, session="s")
            c.record("awk '{print $1}", exit=0, session="s")
        c.record('git commit -m "fix main"', exit=0, session="s")
        got = [m["candidate"] for m in candidates(c, "git c", n=8, session="s")]
        assert got[0] == 'git commit -m "fix main"' and 'git commit -m "fix main' not in got
        assert "awk '{print $1}" not in [m["candidate"] for m in candidates(c, "aw", n=8, session="s")]
        rid = c.send("complete", n=1, session="s", early=True, ctx={"input": "git commit -m"})
        assert next(c.replies(rid))["early"] == 'git commit -m "fix main"'


def test_todays_hosts_come_before_a_month_old_imports(tmp_path: Path) -> None:
    (tmp_path / ".zsh_history").write_text(month_old_history())  # imported at the first start
    with serve(tmp_path, imports=True) as d, CalmClient(d.socket) as c:
        assert wait_imported(c)["history"]["commands"] == 300
        for cmd in ("cd ~/work", "ssh newhost", "ls", "git status", "ssh newhost", "vim todo", "make", "ls"):
            c.record(cmd, exit=0, session="s")
        assert candidates(c, "ssh ", session="s")[0]["candidate"] == "ssh newhost"


def test_early_proposal_and_confidences_from_the_real_engine(tmp_path: Path) -> None:
    with serve(tmp_path) as d, CalmClient(d.socket) as c:
        for _ in range(20):
            for cmd in ("vim main.c", "make", "./main", "ls"):
                c.record(cmd, exit=0, session="s")
        rid = c.send("complete", n=3, session="s", early=True, ctx={"input": ""})
        messages = list(c.replies(rid))
        assert messages[0]["early"] == "vim main.c" and 0.5 <= messages[0]["confidence"] <= 1
        cands = [m for m in messages if "candidate" in m]
        assert cands[0]["candidate"] == "vim main.c" and cands[0]["confidence"] >= 0.5
        assert all(0 <= m["confidence"] <= 1 for m in cands)
        assert messages[-1]["done"] is True and sum("early" in m for m in messages) == 1
        # a request without `early` gets no early message
        assert not any("early" in m for m in c.complete("", n=3, session="s"))


def test_a_users_ranker_that_passes_the_check_draws_ghosts_and_status_names_it(tmp_path: Path) -> None:
    """The sense check (calmd/suggest/ranker.py `check_sense`) refuses what cannot rank, never a
    ranker that can: a file near the packaged one, without `info.refit` (put there by hand, or by
    an older calmd), serves, draws ghosts, and `calmd status` names it (it was called "packaged")."""
    import json

    from calmd.suggest.ranker import packaged_ranker

    data = tmp_path / "data"
    data.mkdir()
    ranker = data / paths.RANKER
    mine = packaged_ranker().to_json()
    mine["w1"] = [[w * 0.9 for w in row] for row in mine["w1"]]
    ranker.write_text(json.dumps(mine))
    with serve(tmp_path) as d, CalmClient(d.socket) as c:
        model = c.status()["status"]["model"]
        assert model["ranker_path"] == str(ranker) and model["ranker_error"] is None, model
        assert model["ranker"].endswith(f", yours ({ranker})"), model["ranker"]
        for _ in range(20):
            for cmd in ("vim main.c", "make", "./main", "ls"):
                c.record(cmd, exit=0, session="s")
        drawn = [m for m in c.complete("", n=3, session="s") if m.get("ghost")]
        assert drawn and drawn[0]["candidate"] == "vim main.c", drawn
        argv = [str(BIN / "calmd"), "--socket", str(d.socket), "--no-color", "status"]
        table = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        assert "yours" in table and "packaged" not in table.split("ranking", 1)[1].split("loaded at")[0]
