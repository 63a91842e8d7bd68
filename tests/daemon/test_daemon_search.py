"""The daemon's `search` and `forget` ops (calmd/daemon/search.py) over a real socket: what `calm
search` asks at each keystroke, answered from what the shells recorded."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from calmd import paths
from calmd.daemon.search import SearchService
from calmd.history.store import HistoryStore
from calmd.protocol import ForgetRequest, SearchRequest
from calmd.shell.client import CalmClient
from tests.support.daemon import BIN, daemon_env, running_daemon
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.slow  # a real daemon per test


def texts(reply: dict[str, object]) -> list[str]:
    return [r["cmd"] for r in reply["results"]]  # type: ignore[index, union-attr]


def stored(home: Path) -> list[str]:
    with sqlite3.connect(home / "data" / paths.HISTORY) as db:
        return [cmd for (cmd,) in db.execute("SELECT cmd FROM commands ORDER BY id")]


def test_search_answers_ranked_lines_with_their_latest_run(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        for cmd, cwd, code, session in (
            ("git status", "/src/app", 0, "s1"),
            ("make test", "/src/app", 2, "s1"),
            ("git push origin main", "/src/lib", 0, "s2"),
            ("make test", "/src/lib", 0, "s2"),
            ("grep -rn TODO .", "/src/app", 1, "s2"),
        ):
            assert c.record(cmd, exit=code, cwd=cwd, session=session, duration=0.25)["stored"]
        reply = c.search("git", session="s1", cwd="/src/app")
        assert set(reply) == {"id", "protocol", "results", "matches", "ms"}
        assert set(texts(reply)) == {"git status", "git push origin main"} and reply["matches"] == 2
        first = reply["results"][0]
        assert set(first) == {"cmd", "ts", "cwd", "exit", "runs", "failing"}
        assert abs(first["ts"] - time.time()) < 60
        make = next(r for r in c.search("make", cwd="/src/app")["results"] if r["cmd"] == "make test")
        assert (make["cwd"], make["exit"], make["runs"], make["failing"]) == ("/src/lib", 0, 2, False)
        # the modes: this folder, this session, what succeeded; each with the latest run in it
        folder = c.search("", mode="folder", session="s1", cwd="/src/app")
        assert set(texts(folder)) == {"git status", "make test", "grep -rn TODO ."}
        assert next(r for r in folder["results"] if r["cmd"] == "make test")["exit"] == 2
        assert set(texts(c.search("", mode="session", session="s2"))) == {
            "git push origin main", "make test", "grep -rn TODO ."}  # fmt: skip
        assert "grep -rn TODO ." not in texts(c.search("", mode="success"))
        assert texts(c.search("gpom"))[0] == "git push origin main"  # scattered letters
        assert texts(c.search("TEST MAKE")) == ["make test"]  # any order, any case
        assert c.search("git", n=1)["results"][1:] == [] and c.search("git", n=0)["results"] == []
        # a command recorded now is found by the next search
        c.record("git stash pop", exit=0, cwd="/src/app", session="s1")
        assert "git stash pop" in texts(c.search("stash"))
        status = c.status()["status"]["search"]
        assert status["ready"] and status["commands"] == 6 and status["searches"] >= 10
        table = subprocess.run(
            [str(BIN / "calmd"), "--no-color", "status"],
            capture_output=True,
            text=True,
            env={**daemon_env(tmp_path), "COLUMNS": "300"},
            timeout=HANG_S,
            check=True,
        ).stdout
        row = r"search\s+│\s+6 commands \(5 distinct\) indexed; \d+ searches, the last [\d.]+ ms; 0 forgotten"
        assert re.search(row, table), table


def test_forget_deletes_every_run_for_good(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        for i in range(50):
            c.record(f"echo filler {i}", exit=0, session="s")
        for _ in range(3):
            c.record("deploy --target prod-XYZZY", exit=0, session="s")
        assert texts(c.search("XYZZY")) == ["deploy --target prod-XYZZY"]
        assert c.forget("deploy --target prod-XYZZY") == {"id": 55, "protocol": 1, "ok": True, "forgotten": 3}
        assert c.search("XYZZY")["results"] == [] and c.search("deploy")["matches"] == 0
        assert not any("XYZZY" in cmd for cmd in stored(tmp_path)) and len(stored(tmp_path)) == 50
        files = b"".join(p.read_bytes() for p in (tmp_path / "data").glob(paths.HISTORY + "*"))
        assert b"XYZZY" not in files
        assert c.forget("deploy --target prod-XYZZY")["forgotten"] == 0
        assert c.status()["status"]["search"]["forgotten"] == 3
        history = c.status()["status"]["history"]  # no more since the last training than there are
        assert history["commands"] == history["since_last_training"] == 50, history
        c.record("deploy --target prod-XYZZY", exit=0, session="s")  # run again: back
        assert texts(c.search("XYZZY")) == ["deploy --target prod-XYZZY"]


def test_calm_forget_from_another_terminal_is_seen_by_the_next_search(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        c.record("curl https://internal/XYZZY", exit=0, session="s")
        c.record("curl https://example.com", exit=0, session="s")
        assert len(c.search("curl")["results"]) == 2
        out = subprocess.run([str(BIN / "calm"), "forget", "XYZZY"], env=daemon_env(tmp_path),
                             capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert texts(c.search("curl")) == ["curl https://example.com"]  # at once: checked in the store

        def rebuilt() -> bool:  # and the rebuilt index replaces it
            c.search("curl")
            return bool(c.status()["status"]["search"]["commands"] == 1)

        wait_until(rebuilt, "the search index rebuilt without the forgotten line")
        assert texts(c.search("curl")) == ["curl https://example.com"]


def test_a_line_the_detector_flags_is_never_answered(tmp_path: Path) -> None:
    """A row stored before the detector knew its rule (the daemon re-scans at its next start)."""
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        c.record("mysql -u root", exit=0, session="s")
        with sqlite3.connect(tmp_path / "data" / paths.HISTORY) as db:
            db.execute("INSERT INTO commands (ts, cmd, exit) VALUES (1, 'mysql -u root -phunter2xyz', 0)")
        c.record("ls", exit=0, session="s")  # the daemon reads the new rows
        assert c.search("mysql")["matches"] == 2
        assert texts(c.search("mysql")) == ["mysql -u root"]
        assert texts(c.search("hunter2")) == []


def test_bad_requests_get_bad_field_and_the_connection_goes_on(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        for fields, message in (
            ({"query": 5}, "'query' must be a string"),
            ({"query": "x" * 1025}, "'query' is longer than 1024 bytes"),
            ({"mode": "everywhere"}, "'mode' must be one of global, host, folder, session, success"),
            ({"n": 101}, "'n' must be 0 to 100"),
            ({"n": "3"}, "'n' must be an integer"),
            ({"session": "s" * 300}, "'session' is longer than 256 bytes"),
        ):
            rid = c.send("search", **fields)
            error = {"code": "bad_field", "message": message}
            assert c.read_message() == {"id": rid, "protocol": 1, "error": error}
        for fields in ({}, {"cmd": ""}, {"cmd": 3}):
            rid = c.send("forget", **fields)
            assert c.read_message()["error"]["code"] == "bad_field"
        c.record("ls -la", exit=0, session="s")
        assert texts(c.search("ls", mode=None)) == ["ls -la"]  # type: ignore[arg-type]  # null: global


def test_a_burst_of_searches_is_answered_newest_first_never_as_a_backlog(tmp_path: Path) -> None:
    """Keys faster than the search: every request is answered, and the ones a newer request of the
    same connection made useless say so rather than cost a search each."""
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        for i in range(300):
            c.record(f"git commit -m 'change {i}'", exit=0, session="s")
        typed = "git commit change 2"
        ids = [c.send("search", query=typed[:k], n=20) for k in range(1, len(typed) + 1)]
        replies = {}
        while len(replies) < len(ids):
            message = c.read_message()
            replies[message["id"]] = message
        last = replies[ids[-1]]
        assert not last.get("superseded") and last["results"]
        assert all("commit" in r["cmd"] and "2" in r["cmd"] for r in last["results"])
        skipped = [rid for rid in ids if replies[rid].get("superseded")]
        assert all(replies[rid]["results"] == [] for rid in skipped)
        assert c.status()["status"]["search"]["superseded"] == len(skipped)


def test_a_client_that_sends_a_search_as_raw_msgpack_is_answered(tmp_path: Path) -> None:
    """The op as any client library would send it (no CalmClient), with a 64-bit id."""
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        c.record("htop", exit=0, session="s")
        c.send_raw(msgpack.packb({"op": "search", "id": 2**62, "query": "ht"}))
        reply = c.read_message()
        assert reply["id"] == 2**62 and texts(reply) == ["htop"]


def test_long_lines_are_cut_so_the_count_asked_for_comes_back_and_a_row_gives_one_whole(
    tmp_path: Path,
) -> None:
    """50 lines of 60 KiB: the 256 KiB reply cap left 4 to 7 results where 20 were asked. Each is
    cut to 2 KiB now, with `cut` (its length) and `row`; a search with that `row` answers it whole."""
    from calmd.protocol import SEARCH_CWD_BYTES, SEARCH_LINE_BYTES

    folder = "/srv/" + "deep/" * 300  # 1.5 KiB: kept by its end
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        lines = [f"echo {i:02d} " + "é" * (30 << 10) for i in range(50)]  # 60 KiB each (2 bytes a char)
        for line in lines:
            assert c.record(line, exit=0, cwd=folder, session="s")["stored"]
        c.record("echo short", exit=0, cwd="/tmp", session="s")
        reply = c.search("echo", n=20)
        assert len(reply["results"]) == 20 and reply["matches"] == 51
        long = [r for r in reply["results"] if r["cmd"] != "echo short"]
        for result in long:
            assert (
                result["cut"] == len(lines[0].encode()) and len(result["cmd"].encode()) <= SEARCH_LINE_BYTES
            )
            assert result["cwd"].startswith("…") and folder.endswith(result["cwd"][1:])
            assert len(result["cwd"].encode()) <= SEARCH_CWD_BYTES
        short = next(r for r in reply["results"] if r["cmd"] == "echo short")
        assert "cut" not in short and "row" not in short and short["cwd"] == "/tmp"
        whole = c.call("search", row=long[0]["row"])["results"]
        assert [r["cmd"] for r in whole] == [next(line for line in lines if line.startswith(long[0]["cmd"]))]
        assert c.call("search", row=10**9)["results"] == []  # no such row: nothing
        for row in (0, -1, "3", 2**63):
            c.send("search", row=row)
            assert c.read_message()["error"]["code"] == "bad_field"


def test_a_command_run_again_after_its_newest_runs_were_forgotten_is_found_before_the_rebuild(
    tmp_path: Path,
) -> None:
    """SQLite gives the deleted newest rows' ids again: the search index, which reads on by id,
    must read on from the newest row left, not from the newest it had read (a CI run missed the
    command run again when its search came before the rebuild that follows a forget)."""
    store = HistoryStore(tmp_path / paths.HISTORY)
    for i in range(5):
        store.record(f"echo {i}", session="s")
    for _ in range(3):
        store.record("deploy --target prod-XYZZY", session="s")
    service = SearchService(store)
    service.start()
    hold = threading.Event()
    service._builder.submit(hold.wait)  # the rebuild after the forget waits behind this, as on a busy machine

    async def scenario() -> list[str]:
        def search(query: str) -> Any:
            return service.search(SearchRequest(id=1, query=query), (), "owner")

        assert [r["cmd"] for r in (await search("XYZZY"))["results"]] == ["deploy --target prod-XYZZY"]
        forgot = await service.forget(ForgetRequest(id=2, cmd="deploy --target prod-XYZZY"))
        assert forgot["forgotten"] == 3 and (await search("XYZZY"))["results"] == []
        store.record("deploy --target prod-XYZZY", session="s")  # the id of the first one forgotten
        return [r["cmd"] for r in (await search("XYZZY"))["results"]]

    try:
        assert asyncio.run(scenario()) == ["deploy --target prod-XYZZY"]
    finally:
        hold.set()
        service.close()
        store.close()
