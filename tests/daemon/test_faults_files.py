"""Faults done to a real `calmd serve` through its files and signals: file modes, the socket's
folder, weight files that are FIFOs, folders, corrupt or truncated while they load, a hung model
at SIGTERM, and a full disk (a small tmpfs, when root)."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.shell.client import CalmClient
from tests.support.builders import TRAIN_ARGS, record_work
from tests.support.daemon import BIN, SCRIPTED_SERVE, daemon_env, running_daemon, write_test_weights
from tests.support.tools import in_ci, need_root
from tests.support.waiting import HANG_S

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them

PYTHONPATH = str(Path(__file__).resolve().parents[2])  # tests.support.scripted_engine
PERMISSIVE = ("sh", "-c", 'umask 000 && exec "$@"', "sh")  # run a command under umask 000


def wait_until(check: Callable[[], Any], what: str, timeout: float = HANG_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def modes(folder: Path) -> dict[str, int]:
    """Every file and folder below `folder` (itself included as '.'), with its permission bits."""
    found = {".": stat.S_IMODE(folder.stat().st_mode)}
    for path in folder.rglob("*"):
        found[str(path.relative_to(folder))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def serve_once(
    home: Path, env: dict[str, str] | None = None, timeout: float = HANG_S
) -> subprocess.CompletedProcess[str]:
    """`calmd serve` that is expected to refuse to start."""
    full = {**daemon_env(home, **(env or {})), "PYTHONPATH": PYTHONPATH}
    argv = [*SCRIPTED_SERVE, "--no-import"]
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=HANG_S)


# --------------------------------------------------------------------------- private files


def test_every_file_calmd_its_cli_and_its_trainer_writes_is_private(
    tmp_path: Path, tiny_weights: Path
) -> None:
    # What an older calmd left: a 0755 CALM_HOME with 0644 files.
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    (data / paths.WEIGHTS).write_bytes(tiny_weights.read_bytes())
    (data / paths.TRAINING_LOG).write_text("an older run\n")
    for name in (paths.WEIGHTS, paths.TRAINING_LOG):
        os.chmod(data / name, 0o644)
    env = daemon_env(tmp_path)
    history = tmp_path / "old_history"
    history.write_text("ls -la\nmake test\n")
    args = ("--no-import", "--train-threshold", "0", *TRAIN_ARGS)
    # Everything runs under umask 000: what comes out private, calmd made private.
    with (
        running_daemon(tmp_path, engine="model", args=args, prefix=PERMISSIVE) as d,
        CalmClient(d.socket) as c,
    ):
        record_work(c)
        assert c.train()["started"] is True
        wait_until(
            lambda: (t := c.status()["status"]["training"])["last_result"] and t["pid"] is None,
            "the training run",
            timeout=HANG_S,
        )
        for argv in (
            [str(BIN / "calm"), "import", str(history)],
            [str(BIN / "calm"), "dataset", "--quiet"],  # into CALM_HOME/train.ctds
            [sys.executable, "-m", "calmd", "shell-helper", "--session", "s"],  # its log
        ):
            done = subprocess.run([*PERMISSIVE, *argv], env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
            assert done.returncode == 0, done.stderr
        found = modes(data)  # with the daemon running: SQLite's -wal and -shm are there
    work = paths.TRAINING_SUBDIR
    expected = {
        paths.HISTORY, paths.HISTORY + "-wal", paths.HISTORY + "-shm", paths.WEIGHTS, paths.TRAINING_STATUS,
        paths.TRAINING_LOG, paths.TRAINING_LOCK, work, f"{work}/{paths.TRAINING_SET}",
        f"{work}/{paths.HELDOUT_SET}", paths.DATASET, paths.HELPER_LOG,
    }  # fmt: skip
    assert expected <= set(found), sorted(found)
    loose = {name: oct(mode) for name, mode in found.items() if mode not in (0o600, 0o700)}
    assert not loose, loose
    folders = {name for name in found if (data / name).is_dir()}
    assert all(found[name] == 0o700 for name in folders) and {".", work} <= folders
    assert found[paths.WEIGHTS] == 0o600  # swapped in by the run, or tightened at start


# --------------------------------------------------------------------------- the socket's folder


def test_a_shared_sticky_folder_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # a /tmp-like folder that calmd did not create
    sock = shared / paths.SOCKET
    with running_daemon(tmp_path, env={"CALMD_SOCKET": str(sock)}) as d, CalmClient(d.socket) as c:
        assert c.status()["status"]["socket"] == str(sock)
        assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert not sock.exists()  # removed: we bound it


def test_an_existing_folder_of_ours_is_not_chmodded(tmp_path: Path) -> None:
    folder = tmp_path / "sockets"
    folder.mkdir()
    os.chmod(folder, 0o755)
    with running_daemon(tmp_path, env={"CALMD_SOCKET": str(folder / paths.SOCKET)}):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755


def test_a_folder_others_can_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    done = serve_once(tmp_path, {"CALMD_SOCKET": str(folder / paths.SOCKET)})
    assert done.returncode == 3, done.stdout
    assert "writable by others (mode 0777) without the sticky bit" in done.stdout
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 and not (folder / paths.SOCKET).exists()


def test_a_socket_file_of_another_user_is_neither_used_nor_replaced(tmp_path: Path) -> None:
    need_root("to give a file to another uid")
    sock = tmp_path / "run" / paths.APP / paths.SOCKET
    sock.parent.mkdir(parents=True, mode=0o700)
    planted = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    planted.bind(str(sock))
    planted.close()
    os.chown(sock, 65534, 65534)
    done = serve_once(tmp_path)
    assert done.returncode == 3 and "belongs to uid 65534" in done.stdout
    assert sock.lstat().st_uid == 65534  # left where it was


def test_a_store_whose_meta_is_a_view_is_one_line_exit_3(tmp_path: Path) -> None:
    """`calmd serve` on a store whose `meta` table is a view served, and answered every record
    with "internal: cannot modify meta because it is a view": the hooks' commands were lost. It
    now refuses to start, in one line naming the file, and leaves no socket."""
    import sqlite3

    from calmd.history.store import HistoryStore

    db = tmp_path / "data" / paths.HISTORY
    HistoryStore(db).close()
    with sqlite3.connect(db) as raw:
        raw.executescript("ALTER TABLE meta RENAME TO kept; CREATE VIEW meta AS SELECT * FROM kept")
    write_test_weights(tmp_path / "data" / paths.WEIGHTS)
    done = serve_once(tmp_path)
    said = [line for line in done.stdout.splitlines() if line.startswith("calmd: ")]
    assert done.returncode == 3 and "Traceback" not in done.stdout + done.stderr, done
    assert said == [f"calmd: error: {db}: not a calmd history store (meta is a view, not a table); give a "
                    "history.sqlite3 calm wrote, or a new path"]  # fmt: skip
    assert not Path(daemon_env(tmp_path)["CALMD_SOCKET"]).exists()


# --------------------------------------------------------------------------- weights


def status(c: CalmClient) -> dict[str, Any]:
    return c.status()["status"]  # type: ignore[no-any-return]


def status_table(home: Path, **env: str) -> str:
    """`calmd status` as a user sees it (wide enough that no line is folded)."""
    full = {**daemon_env(home, **env), "COLUMNS": "400"}
    argv = [str(BIN / "calmd"), "--no-color", "status"]
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=HANG_S, check=True).stdout


def candidates(c: CalmClient, text: str) -> list[str]:
    return [m["candidate"] for m in c.complete(text, n=1, session="s") if "candidate" in m]


def test_a_fifo_at_the_weight_path_is_refused_and_a_good_file_is_taken_back(tmp_path: Path) -> None:
    weights = tmp_path / "data" / paths.WEIGHTS
    write_test_weights(weights, n=64)
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        weights.unlink()
        os.mkfifo(weights)  # nobody will ever write to it
        wait_until(lambda: "FIFO" in (status(c)["last_reload_error"] or ""), "the FIFO to be refused")
        assert c.reload()["ok"] is False  # an explicit reload answers too, it does not hang
        assert status(c)["model"]["parameters"] == 64  # the old model keeps serving
        assert candidates(c, "ls") == ["lsmmit"]
        write_test_weights(weights, n=128)  # a good file renamed over the FIFO
        wait_until(lambda: status(c)["model"]["parameters"] == 128, "the good file to be loaded")
        assert status(c)["last_reload_error"] is None
        d.proc.send_signal(signal.SIGTERM)
        assert d.wait(timeout=HANG_S) == 0


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a weight file at all, but longer than the 48-byte header of one")


def _truncated(path: Path) -> None:
    path.write_bytes(write_test_weights(path.with_suffix(".good")).read_bytes()[:-10])


def _folder(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    ("make_bad", "error"),
    [
        (_fifo, "not a regular file (a FIFO)"),
        (_garbage, "expected b'CWGT'"),
        (_truncated, "param_count"),
        (_folder, "not a regular file (a folder)"),
    ],
    ids=["fifo", "garbage", "truncated", "folder"],
)
def test_bad_weights_at_start_serve_the_packaged_model_until_a_good_file_comes(
    tmp_path: Path, make_bad: Callable[[Path], None], error: str
) -> None:
    weights = tmp_path / "data" / paths.WEIGHTS
    weights.parent.mkdir(parents=True)
    make_bad(weights)
    with running_daemon(tmp_path, args=("--no-import",), weights=False) as d, CalmClient(d.socket) as c:
        first = status(c)
        assert first["serving_fallback"] is True
        assert first["model"]["path"] == str(paths.packaged_weights())
        assert error in first["last_reload_error"] and str(weights) in first["last_reload_error"]
        assert candidates(c, "git st") == ["git stmmit"]  # it serves
        table = status_table(tmp_path)
        assert "the packaged model" in table and "did not load" in table
        if weights.is_dir():
            weights.rmdir()
        write_test_weights(weights.with_suffix(".new"), n=96)
        os.replace(weights.with_suffix(".new"), weights)  # the hot reload takes it
        wait_until(lambda: not status(c)["serving_fallback"], "the good file to replace the packaged model")
        now = status(c)
        assert now["model"]["path"] == str(weights) and now["model"]["parameters"] == 96
        assert now["last_reload_error"] is None


def test_truncating_the_weights_in_place_while_they_load_never_kills_the_daemon(tmp_path: Path) -> None:
    """The bug: the file was memory-mapped while it loaded, and a truncation in place under the
    mapping killed the daemon with SIGBUS (2 of 60 tries). Truncations land at random moments
    of many loads here; the file grows back (zeros: still a valid file) between them."""
    weights = tmp_path / "data" / paths.WEIGHTS
    write_test_weights(weights, value=0.5, n=16 << 20)  # 64 MB: a load takes a while
    size = weights.stat().st_size
    rng = random.Random(12)
    outcomes = {"ok": 0, "refused": 0}
    with running_daemon(tmp_path, args=("--no-import",)) as d, CalmClient(d.socket) as c:
        started = time.monotonic()
        assert c.reload()["ok"] is True
        load_s = time.monotonic() - started  # how long one load takes on this machine now
        for _ in range(40):
            rid = c.send("reload")
            time.sleep(rng.uniform(0, 1.5 * load_s))
            os.truncate(weights, rng.randrange(4096, size))  # in place: same inode, shorter
            try:
                answer = next(iter(c.replies(rid)))
            except ConnectionError:
                pytest.fail(f"the daemon died: exit {d.proc.wait(timeout=HANG_S)} (-7 is SIGBUS)")
            outcomes["ok" if answer.get("ok") else "refused"] += 1
            assert d.proc.poll() is None, d.read_output()
            os.truncate(weights, size)  # back to full length (the tail reads as zeros)
        assert d.proc.poll() is None, d.read_output()
        assert "SIGBUS" not in d.read_output()
        assert c.reload()["ok"] is True and status(c)["last_reload_error"] is None
        assert candidates(c, "ls") == ["lsmmit"]
    assert outcomes["ok"] + outcomes["refused"] == 40


# --------------------------------------------------------------------------- stopping


def test_sigterm_stops_the_daemon_within_its_graceful_timeout_with_a_hung_model(tmp_path: Path) -> None:
    args = ("--no-import", "--graceful-timeout", "2")
    env = {"CALMD_TEST_HANG_INPUT": "hang"}
    with running_daemon(tmp_path, args=args, env=env) as d, CalmClient(d.socket) as c:
        c.send("complete", n=1, session="s", ctx={"input": "hang"})
        d.wait_for("scripted engine: hanging for good")
        assert status(c)["pid"] == d.proc.pid  # the event loop still answers
        started = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        code = d.proc.wait(timeout=HANG_S)  # before the fix: never (the worker thread was joined at exit)
        elapsed = time.monotonic() - started
        output = d.wait_for("exiting without it")
    assert code == 0, output
    assert elapsed < 2 + 10, elapsed  # 2 s, plus a generous margin for a loaded machine
    assert "received SIGTERM: shutting down (at most 2 s)" in output
    assert not d.socket.exists()


def test_sigint_stops_with_a_log_line_and_removes_the_socket(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=("--no-import",)) as d:
        d.proc.send_signal(signal.SIGINT)
        assert d.wait(timeout=HANG_S) == 0
        output = d.wait_for("calmd stopped")
        assert "received SIGINT: shutting down" in output
        assert not d.socket.exists()


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs of our own to fill up. Needs root: skipped otherwise (outside CI or not)."""
    ci = in_ci()
    need_root("to mount a tmpfs to fill")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "calmd-test", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        message = f"cannot mount a tmpfs as root: {done.stderr.strip()}"
        if ci:
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> Path:
    """Write a file until the file system has no block left; returns it."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 16, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * chunk)
    with pytest.raises(OSError) as info, open(folder / "probe", "wb", buffering=0) as probe:
        probe.write(b"\0" * 8192)
    assert info.value.errno == errno.ENOSPC
    return filler


def test_a_full_disk_answers_disk_full_loses_nothing_and_shows_in_status(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    data = small_tmpfs / "data"
    write_test_weights(data / paths.WEIGHTS)
    env = {"CALM_HOME": str(data)}
    stored: list[str] = []
    with (
        running_daemon(tmp_path, args=("--no-import", "--train-threshold", "0"), env=env, weights=False) as d,
        CalmClient(d.socket) as c,
    ):
        for i in range(20):
            assert c.record(f"make build {i}", exit=0, session="s")["stored"] is True
            stored.append(f"make build {i}")
        assert status(c)["disk"]["last_full"] is None
        filler = fill(small_tmpfs)
        errors = []
        for i in range(200):  # a write may still fit in a page SQLite had; one soon does not
            *_, reply = c.replies(c.send("record", cmd=f"git commit -m 'part {i}'", exit=0, session="s"))
            if "error" in reply:
                errors.append(reply["error"])
                break
            stored.append(f"git commit -m 'part {i}'")
        assert errors and errors[0]["code"] == "disk_full", errors  # was: internal, cannot rollback
        assert "is full" in errors[0]["message"]
        now = status(c)
        assert now["history"]["commands"] == len(stored)  # nothing half-written
        assert now["disk"]["last_full"] is not None and now["disk"]["free_bytes"] < 64 << 10
        table = status_table(tmp_path, **env)
        assert "last full at" in table
        # a training run on the full disk fails, and says why
        assert c.train()["started"] is True
        training = wait_until(
            lambda: (t := status(c)["training"])["state"] == "failed" and t, "the run to fail", timeout=HANG_S
        )
        assert training["last_result"]["reason"].startswith("disk full"), training
        # room again: records are stored, and every stored one is still there
        filler.unlink()
        assert c.record("make install", exit=0, session="s")["stored"] is True
        stored.append("make install")
        assert status(c)["history"]["commands"] == len(stored)
        assert candidates(c, "make ins") == ["make install"]
        assert status(c)["training"]["last_result"]["reason"].startswith("disk full")  # kept
    check = subprocess.run(["sqlite3", str(data / paths.HISTORY), "PRAGMA integrity_check"],
                           capture_output=True, text=True) if shutil.which("sqlite3") else None  # fmt: skip
    if check is not None:
        assert check.stdout.strip() == "ok"
