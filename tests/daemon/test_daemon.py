"""The daemon's mechanics against a real `calmd serve` process over its real socket.

These use a scripted engine (tests/support/scripted_engine.py) so that timing is controllable; the real
model engine is exercised end to end in test_daemon_model.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import pytest

from calmd import paths
from calmd.shell.client import CalmClient, DaemonNotRunning
from tests.support.daemon import (
    BIN,
    SCRIPTED_SERVE,
    daemon_env,
    running_daemon,
    wait_imported,
    write_test_weights,
)
from tests.support.tools import need_root
from tests.support.waiting import HANG_S, wait_until

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them


def test_record_then_status_and_complete_sees_it(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        assert c.record("git status", exit=0, cwd="/p", session="s1") == {
            "id": 1, "protocol": 1, "ok": True, "stored": True,
        }  # fmt: skip
        assert c.record(" hidden", session="s1")["reason"] == "leading-space"
        assert c.record("mysql -u root -phunter2", session="s1")["reason"] == "secret:password-option"
        status = c.status()["status"]
        assert status["history"]["commands"] == 1 and status["history"]["dropped_secrets"] == 1
        assert status["protocol"] == 1 and status["model"]["domain"] == "shell"
        candidates = [m["candidate"] for m in c.complete("git st", n=3, session="s1") if "candidate" in m]
        assert candidates[0] == "git status"  # the recorded command came back


def test_streaming_order_ids_and_done(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        messages = list(c.complete("git co", n=4))
        assert [m["id"] for m in messages] == [1] * 5
        assert [m["candidate"] for m in messages[:4]] == [
            "git commit",
            "git command",
            "git config",
            "git copy",
        ]
        scores = [m["score"] for m in messages[:4]]
        assert scores == sorted(scores, reverse=True)
        assert messages[-1]["done"] is True and messages[-1]["ms"] >= 0
        assert all(m["protocol"] == 1 for m in messages)
        assert list(c.complete("x", n=0)) == [
            {"id": 2, "protocol": 1, "done": True, "ms": pytest.approx(0, abs=50)}
        ]


def test_candidates_carry_a_confidence_and_whether_they_are_drawn(tmp_path: Path) -> None:
    with (
        running_daemon(tmp_path, env={"CALMD_TEST_CONFIDENCE": "0.875,0.25"}) as d,
        CalmClient(d.socket) as c,
    ):
        messages = list(c.complete("git co", n=3))  # no `early`: no early line
        fields = {"id", "protocol", "candidate", "score", "confidence", "ghost"}
        assert [set(m) for m in messages[:3]] == [fields] * 3
        assert [m["confidence"] for m in messages[:3]] == [0.875, 0.25, 0.25]
        assert [m["ghost"] for m in messages[:3]] == [True, False, False]  # the daemon's rule decides
        assert set(messages[3]) == {"id", "protocol", "done", "ms"}
        assert not any("early" in m for m in messages)
        # the shell's CALM_MIN_CONFIDENCE replaces the rule's thresholds: 0.875 is not enough for 0.9
        messages = list(c.complete("git co", n=3, min_confidence=0.9))
        assert [m["ghost"] for m in messages[:3]] == [False, False, False]
        messages = list(c.complete("git co", n=3, min_confidence=0.2))
        assert [m["ghost"] for m in messages[:3]] == [True, False, False]  # one ghost at most
        for bad in (1.5, -0.1, "high", True):
            c.send("complete", n=1, min_confidence=bad, ctx={"input": "ls"})
            assert c.read_message()["error"]["code"] == "bad_field"


def test_an_early_request_gets_the_history_proposal_first_then_the_candidates(tmp_path: Path) -> None:
    # 0.3 s per candidate: the early proposal must not wait for the first of them
    env = {"CALMD_TEST_DELAY": "0.3", "CALMD_TEST_CONFIDENCE": "0.7"}
    with running_daemon(tmp_path, env=env) as d, CalmClient(d.socket) as c:
        c.record("git status", session="s")
        rid = c.send("complete", n=2, session="s", early=True, ctx={"input": "git st"})
        sent = time.monotonic()
        first = c.read_message()
        waited = time.monotonic() - sent
        assert first == {"id": rid, "protocol": 1, "early": "git status", "confidence": 0.7, "ghost": True}
        assert waited < 0.25, f"the early proposal came after {waited:.2f} s"
        rest = list(c.replies(rid))
        assert [m.get("candidate") for m in rest] == ["git status", "git stmmit", None]
        assert rest[-1]["done"] is True and not any("early" in m for m in rest)
        # `"early": false` (or null) is the old request
        for early in (False, None):
            rid = c.send("complete", n=1, session="s", early=early, ctx={"input": "git st"})
            assert not any("early" in m for m in c.replies(rid))


def test_early_is_a_boolean(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        c.send("complete", n=1, early="yes", ctx={"input": "ls"})
        message = c.read_message()
        assert message["error"] == {"code": "bad_field", "message": "'early' must be true or false"}


def test_early_comes_once_even_when_a_shell_preempts_the_job(tmp_path: Path) -> None:
    # Flood jobs (2 candidates, 0.4 s each) ask for early proposals; a shell's request preempts
    # the running one after its early proposal went out: the rerun must not send another.
    daemon = running_daemon(tmp_path, env={"CALMD_TEST_DELAY": "0.4"}, args=("--train-threshold", "0"))
    with daemon as d, CalmClient(d.socket) as flood, CalmClient(d.socket) as shell:
        ids = [flood.send("complete", n=2, session=f"flood-{i}", early=True, ctx={"input": "ls"})
               for i in range(3)]  # fmt: skip
        first = flood.read_message()
        assert first.get("early") == "lsmmit"  # the first flood job has started
        flood._pending.setdefault(first["id"], []).append(first)
        got = list(
            shell.replies(shell.send("complete", n=1, session="shell", early=True, ctx={"input": "git"}))
        )
        assert [m.get("early") or m.get("candidate") for m in got] == ["gitmmit", "gitmmit", None]
        for rid in ids:
            mine = list(flood.replies(rid))
            assert [m.get("early") or m.get("candidate") for m in mine] == [
                "lsmmit",
                "lsmmit",
                "lsmmand",
                None,
            ]
            assert "early" in mine[0] and "cancelled" not in mine[-1]


def test_empty_input_uses_the_sessions_history(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        c.record("make", session="s1")
        c.record("make test", session="s2")
        first = next(m for m in c.complete("", n=1, session="s1"))
        assert first["candidate"] == "after make"  # s1's own last command is last in the context
        first = next(m for m in c.complete("", n=1, session="s2"))
        assert first["candidate"] == "after make test"


def test_interleaved_requests_on_one_connection(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env={"CALMD_TEST_DELAY": "0.2"}) as d, CalmClient(d.socket) as c:
        slow = c.send("complete", n=5, session="a", ctx={"input": "ls"})
        quick = c.send("status")
        order = []
        while len(order) < 7:
            message = c.read_message()
            order.append((message["id"], next(k for k in ("candidate", "done", "status") if k in message)))
        assert order[0] == (quick, "status")  # answered while the completion runs
        assert order[-1] == (slow, "done")
        assert [k for i, k in order if i == slow] == ["candidate"] * 5 + ["done"]


def test_newer_complete_cancels_older_of_same_session(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env={"CALMD_TEST_DELAY": "0.3"}) as d, CalmClient(d.socket) as c:
        old = c.send("complete", n=5, session="s", ctx={"input": "g"})
        time.sleep(0.1)
        new = c.send("complete", n=2, session="s", ctx={"input": "gi"})
        other = c.send("complete", n=1, session="t", ctx={"input": "x"})
        old_msgs = list(c.replies(old))
        assert old_msgs[-1]["done"] and old_msgs[-1]["cancelled"] is True
        assert len(old_msgs) < 6
        new_msgs = list(c.replies(new))
        assert [m.get("candidate") for m in new_msgs] == ["gimmit", "gimmand", None]
        assert "cancelled" not in new_msgs[-1]
        assert "cancelled" not in list(c.replies(other))[-1]  # another session is not affected


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        ([1, 2, 3], "bad_message"),
        ({"op": "complete"}, "bad_message"),
        ({"op": "complete", "id": 5}, "bad_field"),
        ({"op": "complete", "id": 5, "ctx": {}}, "bad_field"),
        ({"op": "complete", "id": 5, "n": 99, "ctx": {"input": ""}}, "bad_field"),
        ({"op": "complete", "id": 5, "ctx": {"input": 3}}, "bad_field"),
        ({"op": "complete", "id": 5, "ctx": {"input": "", "history": [{"exit": 0}]}}, "bad_field"),
        ({"op": "record", "id": 5}, "bad_field"),
        ({"op": "record", "id": 5, "cmd": "ls", "exit": "zero"}, "bad_field"),
        ({"op": "frobnicate", "id": 5}, "unknown_op"),
    ],
)
def test_malformed_requests_get_errors_and_the_daemon_carries_on(
    tmp_path: Path, request_: object, code: str
) -> None:
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        c.send_raw(msgpack.packb(request_))
        message = c.read_message()
        assert message["error"]["code"] == code, message
        assert message["protocol"] == 1
        assert message["id"] == (5 if isinstance(request_, dict) and "id" in request_ else None)
        assert c.status()["status"]["errors"] == 1  # same connection still works


def test_garbage_bytes_close_only_that_connection(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        with CalmClient(d.socket) as c:
            c.send_raw(b"\xc1\xc1\xc1 not msgpack")
            assert c.read_message()["error"]["code"] == "bad_message"
            with pytest.raises(ConnectionError):
                c.read_message()
        with CalmClient(d.socket) as c:
            assert c.status()["status"]["protocol"] == 1
        with CalmClient(d.socket) as c:  # an oversized message: refused, that connection closed
            try:
                c.send_raw(msgpack.packb({"op": "record", "id": 1, "cmd": "x" * (2 << 20)}))
                assert c.read_message()["error"]["code"] == "too_large"
            except (BrokenPipeError, ConnectionResetError):
                pass  # the daemon closed while we were still sending: also a refusal
        d.wait_for("closing a connection: bad_message: byte 0xc1")  # logged, both times
        d.wait_for("closing a connection: too_large: a request over 1048576 bytes")
        with CalmClient(d.socket) as c:
            status = c.status()["status"]
            assert status["history"]["commands"] == 0  # nothing of it was stored


def test_socket_mode_and_folder(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        assert stat.S_ISSOCK(d.socket.stat().st_mode)
        assert stat.S_IMODE(d.socket.stat().st_mode) == 0o600
        assert stat.S_IMODE(d.socket.parent.stat().st_mode) == 0o700


def test_second_daemon_refuses_to_start(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        proc = subprocess.run(
            SCRIPTED_SERVE,
            capture_output=True, text=True, timeout=HANG_S,
            env={**daemon_env(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )  # fmt: skip
        assert proc.returncode == 4
        assert "already running" in proc.stdout
        with CalmClient(d.socket) as c:  # the first one is untouched
            assert c.status()["status"]["pid"] == d.proc.pid


def test_stale_socket_is_replaced(tmp_path: Path) -> None:
    sock_path = tmp_path / "run" / paths.APP / paths.SOCKET
    sock_path.parent.mkdir(parents=True, mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_path))
    stale.close()  # the file stays, nobody listens: what a killed daemon leaves
    with pytest.raises(DaemonNotRunning):
        CalmClient(sock_path)
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        assert c.status()["status"]["pid"] == d.proc.pid


def test_killed_daemon_leaves_a_socket_the_next_one_replaces(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        d.proc.kill()
        d.proc.wait()
        assert d.socket.exists()
    with running_daemon(tmp_path) as d2, CalmClient(d2.socket) as c:
        assert c.status()["status"]["pid"] == d2.proc.pid


@pytest.mark.needs("setpriv")
def test_peer_of_another_uid_is_refused(tmp_path: Path) -> None:
    need_root("to connect as another uid")
    # The socket lives where uid 65534 can reach it (after the daemon made it 0700/0600, the test
    # opens it up), so that the SO_PEERCRED check has to hold on its own.
    public = Path(tempfile.mkdtemp(prefix="calmd-peer-", dir="/tmp"))
    try:
        sock_path = public / paths.APP / paths.SOCKET
        with running_daemon(tmp_path, env={"CALMD_SOCKET": str(sock_path)}) as d:
            os.chmod(public, 0o755)
            os.chmod(sock_path.parent, 0o755)
            os.chmod(sock_path, 0o777)
            script = (
                "import socket, msgpack\n"
                f"s = socket.socket(socket.AF_UNIX); s.connect({str(sock_path)!r})\n"
                "u = msgpack.Unpacker(raw=False)\n"
                "u.feed(s.recv(65536)); print(next(u)['error']['code']); print(repr(s.recv(10)))\n"
            )
            proc = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
                capture_output=True, text=True, timeout=HANG_S, cwd="/",
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.split() == ["forbidden", "b''"]  # refused, then closed
            with CalmClient(d.socket) as c:  # the owner still gets in
                assert c.status()["status"]["protocol"] == 1
            d.wait_for("refused a connection from uid 65534")
    finally:
        shutil.rmtree(public, ignore_errors=True)


def test_graceful_shutdown_answers_in_flight_requests(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env={"CALMD_TEST_DELAY": "0.15"}) as d, CalmClient(d.socket) as c:
        rid = c.send("complete", n=3, session="s", ctx={"input": "ls"})
        time.sleep(0.1)
        d.proc.send_signal(signal.SIGTERM)
        messages = list(c.replies(rid))
        assert [("candidate" in m) for m in messages] == [True, True, True, False]
        assert messages[-1]["done"] is True
        assert d.wait() == 0
        assert not d.socket.exists()


def test_calmd_stop_and_status_exit_codes(tmp_path: Path) -> None:
    env = daemon_env(tmp_path)
    with running_daemon(tmp_path) as d:
        status = subprocess.run(
            [str(BIN / "calmd"), "status", "--json"], capture_output=True, text=True, env=env
        )
        assert status.returncode == 0 and '"running": true' in status.stdout
        table = subprocess.run(
            [str(BIN / "calmd"), "--no-color", "status"], capture_output=True, text=True, env=env
        )
        assert "requests served" in table.stdout and "last reload error" in table.stdout
        stop = subprocess.run(
            [str(BIN / "calmd"), "stop"], capture_output=True, text=True, env=env, timeout=HANG_S
        )
        assert stop.returncode == 0 and "stopped" in stop.stdout
        assert d.wait() == 0
    status = subprocess.run([str(BIN / "calmd"), "status"], capture_output=True, text=True, env=env)
    assert status.returncode == 3 and "not running" in status.stderr


def test_calmd_complete_prints_candidates(tmp_path: Path) -> None:
    with running_daemon(tmp_path):
        out = subprocess.run(
            [str(BIN / "calmd"), "complete", "git co", "-n", "2"], capture_output=True, text=True,
            env=daemon_env(tmp_path), timeout=HANG_S,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["git commit", "git command"]


def test_hot_reload_and_corrupt_replacement(tmp_path: Path) -> None:
    weights = tmp_path / "data" / paths.WEIGHTS
    write_test_weights(weights, n=64)
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        first = c.status()["status"]
        assert first["model"]["parameters"] == 64
        write_test_weights(weights, n=128)  # an atomic replacement
        wait_until(lambda: c.status()["status"]["model"]["parameters"] == 128, "the new weights loaded")
        after = c.status()["status"]
        assert after["loaded_at"] > first["loaded_at"] and after["last_reload_error"] is None
        # a truncated file: rejected, the old model keeps serving, status says why
        weights.write_bytes(weights.read_bytes()[:-10])
        wait_until(lambda: c.status()["status"]["last_reload_error"], "the corrupt file noticed")
        status = c.status()["status"]
        assert "param_count" in status["last_reload_error"]
        assert status["model"]["parameters"] == 128
        assert [m["candidate"] for m in c.complete("ls", n=1) if "candidate" in m] == ["lsmmit"]
        assert c.reload()["ok"] is False  # an explicit reload reports the same problem
        d.wait_for("failed, keeping the current model")


def test_sighup_reloads(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        before = c.status()["status"]["loaded_at"]
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: c.status()["status"]["loaded_at"] != before, "a reload after SIGHUP")


@pytest.mark.needs("tmux")
def test_a_calmd_serve_typed_in_a_terminal_stops_when_the_terminal_closes(tmp_path: Path) -> None:
    """SIGHUP reloads a daemon that runs apart from a terminal (systemd, CALM_AUTOSTART; the test
    above); a `calmd serve` typed at a prompt stops with its terminal, as any program there."""
    from tests.support.tmux import Terminal

    write_test_weights(tmp_path / "data" / paths.WEIGHTS)
    env = {**daemon_env(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    term = Terminal([*SCRIPTED_SERVE, "--no-import"], env, cwd=tmp_path)
    try:
        term.wait_for("calmd ready on")
        pid = int(term.tmux("display-message", "-p", "-t", "t", "#{pane_pid}"))
        sock = Path(env["CALMD_SOCKET"])
        assert sock.exists()
    finally:
        term.close()  # the terminal goes: its processes get SIGHUP
    gone = lambda: not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)  # noqa: E731
    wait_until(gone, "calmd serve to end with its terminal")
    assert not sock.exists()  # it stopped as SIGTERM stops it: the socket is removed


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_first_start_imports_shell_history(tmp_path: Path) -> None:
    tmp_path.joinpath(".bash_history").write_text("ls -la\ngit status\n")
    tmp_path.joinpath(".zsh_history").write_text(": 1700000000:0;make test\n")
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:
        assert wait_imported(c)["history"]["commands"] == 3
    with running_daemon(tmp_path) as d, CalmClient(d.socket) as c:  # not imported twice
        assert wait_imported(c)["history"]["commands"] == 3


@pytest.mark.needs("systemd-socket-activate")
def test_systemd_socket_activation(tmp_path: Path) -> None:
    """systemd-socket-activate listens, starts calmd on the first connection and passes the
    socket in LISTEN_FDS; calmd must serve it and bind nothing of its own."""
    sock = tmp_path / "activated.sock"
    write_test_weights(tmp_path / "data" / paths.WEIGHTS)
    env = {**daemon_env(tmp_path, CALMD_SOCKET=str(tmp_path / "unused")),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # fmt: skip
    forward = [f"-E{name}" for name in ("HOME", "CALM_HOME", "CALMD_SOCKET", "XDG_RUNTIME_DIR", "PYTHONPATH")]
    argv = ["systemd-socket-activate", "-l", str(sock), *forward, *SCRIPTED_SERVE]
    with subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        try:
            wait_until(sock.exists, "systemd-socket-activate's socket")
            with CalmClient(sock) as c:  # this connection starts the daemon
                status = c.status()["status"]
                assert status["socket"] == str(sock)
                assert [m["candidate"] for m in c.complete("ls", n=1) if "candidate" in m] == ["lsmmit"]
            assert not (tmp_path / "unused").exists()  # it bound nothing itself
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=HANG_S)
    assert sock.exists()  # systemd's socket: calmd did not bind it, so it does not remove it


def test_a_weight_file_swapped_while_it_loads_is_loaded_again(tmp_path: Path) -> None:
    """`calm rollback` or a training run can swap the file while the daemon reads it: what the
    daemon installs must be what it read, or a later swap back to that file looks like no change."""
    import asyncio

    from calmd.daemon.server import Server, ServerConfig

    weights, other = tmp_path / paths.WEIGHTS, tmp_path / "other.cwgt"
    weights.write_bytes(b"A" * 10)
    other.write_bytes(b"B" * 20)
    loads: list[bytes] = []

    class Loaded:
        def __init__(self, content: bytes) -> None:
            self.content = content

        def attach_history(self, store: object) -> None: ...

        def describe(self) -> dict[str, object]:
            return {}

    def loader(path: Path) -> Loaded:
        content = path.read_bytes()
        loads.append(content)
        if len(loads) == 1:  # the first read races a rename: the path now names the other file
            os.replace(other, weights)
        return Loaded(content)

    server = Server(
        ServerConfig(socket_path=tmp_path / "s.sock", data_dir=tmp_path, weights_path=weights), loader
    )  # type: ignore[arg-type]
    assert asyncio.run(server.reload()) == {"ok": True}
    assert loads == [b"A" * 10, b"B" * 20]  # read again once the file held still
    assert server.engine.content == b"B" * 20  # type: ignore[union-attr]
    assert server.loaded_id == server._weights_id()
