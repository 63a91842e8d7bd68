"""History files read as the shells write them, streamed, and refused when they are no history
(issue 23). The files are written by a real zsh (`fc -W`) and a real bash (`history -w`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from calmd import paths
from calmd.history.formats import NotAHistory, parse_history
from calmd.history.imports import IMPORT_BATCH
from calmd.history.store import HistoryStore
from calmd.shell.client import CalmClient
from tests.support.daemon import BIN, daemon_env, running_daemon, wait_imported
from tests.support.tools import need
from tests.support.waiting import HANG_S, wait_until

LOOP = 'for f in *.log; do\n  gzip "$f"\ndone'
# What the user typed, as zsh keeps it: a multi-line loop, a command that ends in a backslash,
# one that starts with a colon, UTF-8, bytes zsh metafies (0x83-0x9f: here a C1 CSI and 0x83).
ZSH_COMMANDS = [
    "git commit -m fix",
    LOOP,
    "echo ends with backslash\\",
    ": a colon first",
    "echo café €",
    "echo \u009b\u0083",
    "kubectl logs web-1",
]


def zsh_writes(path: Path, commands: list[str], *, extended: bool) -> bytes:
    """`commands` added to a real zsh's history and written by `fc -W` to `path`."""
    need("zsh")
    script = ("setopt extendedhistory; " if extended else "") + (
        f"HISTFILE={path}; HISTSIZE=1000; SAVEHIST=1000; "
        + "; ".join(f"print -rs -- ${i}" for i in range(1, len(commands) + 1))
        + "; fc -W"
    )
    subprocess.run(["zsh", "-f", "-i", "-c", script, "zsh", *commands], stdin=subprocess.DEVNULL,
                   capture_output=True, check=True, timeout=HANG_S)  # fmt: skip
    return path.read_bytes()


def bash_writes(path: Path, commands: list[str], *, timestamps: bool) -> bytes:
    """`commands` added to a real bash's history (lithist: multi-line entries keep their
    newlines) and written by `history -w` to `path`."""
    need("bash")
    env = {**os.environ, "HISTFILE": str(path)}
    env.pop("HISTTIMEFORMAT", None)
    script = ('HISTTIMEFORMAT="%F %T "; ' if timestamps else "") + (
        "shopt -s lithist cmdhist; history -c; "
        + "; ".join(f'history -s -- "${i}"' for i in range(1, len(commands) + 1))
        + "; history -w; HISTFILE="  # and nothing more written at exit
    )
    subprocess.run(["bash", "--norc", "-i", "-c", script, "bash", *commands], stdin=subprocess.DEVNULL,
                   env=env, capture_output=True, check=True, timeout=HANG_S)  # fmt: skip
    return path.read_bytes()


def imported(tmp_path: Path, path: Path) -> list[str]:
    store = HistoryStore(tmp_path / "h.sqlite3")
    try:
        store.import_file(path)
        return [r.cmd for r in store.all_rows()]
    finally:
        store.close()


@pytest.mark.parametrize("extended", [True, False], ids=["extended", "plain"])
def test_a_real_zsh_history_reads_back_as_typed(tmp_path: Path, extended: bool) -> None:
    raw = zsh_writes(tmp_path / ".zsh_history", ZSH_COMMANDS, extended=extended)
    assert b"\\\n" in raw and b"\x83" in raw  # continuation lines and metafied bytes, as zsh wrote
    assert b"backslash\\ \n" in raw  # ... and the space after a final backslash
    got = imported(tmp_path, tmp_path / ".zsh_history")
    assert got == ZSH_COMMANDS
    times = [ts for ts, _ in parse_history(raw, "zsh")]
    assert all(ts is not None for ts in times) if extended else all(ts is None for ts in times)


def test_a_real_bash_history_with_timestamps_keeps_multi_line_entries(tmp_path: Path) -> None:
    commands = ["ls -la", LOOP, "#not a time: a comment line the user ran", "git status"]
    raw = bash_writes(tmp_path / ".bash_history", commands, timestamps=True)
    assert raw.startswith(b"#") and raw.count(b"\n#1") == 3
    assert imported(tmp_path, tmp_path / ".bash_history") == commands
    assert all(ts is not None for ts, _ in parse_history(raw, "bash"))


def test_a_bash_history_without_timestamps_is_one_command_per_line(tmp_path: Path) -> None:
    """bash itself reads such a file line by line (a multi-line entry comes back as its lines)."""
    raw = bash_writes(tmp_path / ".bash_history", ["ls", LOOP], timestamps=False)
    assert raw == ("ls\n" + LOOP + "\n").encode()
    # its indented line is one that starts with a space: never stored (ignorespace)
    assert imported(tmp_path, tmp_path / ".bash_history") == ["ls", "for f in *.log; do", "done"]


def test_a_multi_line_zsh_entry_is_not_glued_to_other_commands(tmp_path: Path) -> None:
    """The defect: after importing a zsh history that ends in a multi-line `for` loop, `calmd
    complete "git co"` offered `git commit f in *.log; do gzip "$f" done`."""
    need("zsh")
    history = ["git commit -m fix", "git checkout main", "kubectl logs web-1", "kubectl get pods", LOOP]
    zsh_writes(tmp_path / ".zsh_history", history, extended=True)
    with running_daemon(tmp_path, engine="model", weights=False) as daemon, CalmClient(daemon.socket) as c:
        wait_imported(c)
        for typed in ("git co", "kubectl lo", "ls "):
            out = subprocess.run([str(BIN / "calmd"), "complete", "-n", "8", typed], env=daemon_env(tmp_path),
                                 capture_output=True, text=True, check=True, timeout=HANG_S)  # fmt: skip
            lines = out.stdout.splitlines()
            assert lines and not [line for line in lines if "gzip" in line or " in *.log" in line], lines
        found = [m["candidate"] for m in c.complete("for", n=5, multiline=True) if "candidate" in m]
        assert found[0] == LOOP  # the loop itself, whole, for a shell that draws it as lines


# --------------------------------------------------------------------------- not a history


def sparse(path: Path, size: int, head: bytes = b"") -> Path:
    """A file of `size` bytes that is mostly a hole (NULs on reading), as a crash can leave one."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def passwd_like(path: Path) -> Path:
    users = ["root:x:0:0:root:/root:/bin/bash", "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin"]
    users += [f"user{i}:x:{1000 + i}:{1000 + i}:User {i},,,:/home/user{i}:/bin/zsh" for i in range(22)]
    path.write_text("\n".join(users) + "\n")
    return path


def binary(path: Path) -> Path:
    path.write_bytes(bytes(range(256)) * 64 + os.urandom(1 << 16))
    return path


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (binary, "binary data"),
        (lambda p: p.write_bytes(Path(shutil.which("ls") or "/bin/ls").read_bytes()) and p, "NUL bytes"),
        (passwd_like, "colon-separated fields"),
    ],
    ids=["random", "executable", "passwd"],
)
def test_a_file_that_is_no_history_is_refused_whole(tmp_path: Path, make: object, why: str) -> None:
    path = make(tmp_path / ".bash_history")  # type: ignore[operator]
    store = HistoryStore(tmp_path / "h.sqlite3")
    store.record("kept", session="s")
    with pytest.raises(NotAHistory) as refused:
        store.import_file(path)
    message = str(refused.value)
    assert why in message and str(path) in message and "\n" not in message
    assert [r.cmd for r in store.all_rows()] == ["kept"]  # nothing of it
    assert store.counter("import_refused") == 1
    store.close()


FISH_CRASHED = (b"- cmd: ls\n  when: 1700000000\n- cmd: git status\n  when: 1700000001\n" + b"\0" * 4096
                + b"\n- cmd: make\n  when: 1700000005\n- cmd: mak" + b"\0" * 300)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "content", "fmt", "kept", "damaged"),
    [
        ("bash_history", b"ls\necho a\0b\ngit status\nmake\0\0\n", "auto", ["ls", "git status"], 2),
        (
            "zsh_history",
            b": 1700000000:0;ls\n: 1700000001:0;echo a\0b\n: 1700000002:0;make\n",
            "auto",
            ["ls", "make"],
            1,
        ),
        ("bash_history", b"ls\n" + b"\0" * 100_000 + b"make\n" + b"pwd\n", "auto", ["ls", "pwd"], 1),
        ("fish_history", FISH_CRASHED, "auto", ["ls", "git status", "make"], 2),
    ],
    ids=["bash-few-nuls", "zsh-few-nuls", "bash-nul-run", "fish-nul-runs"],
)
def test_a_history_a_crash_left_nuls_in_is_imported_but_the_damaged_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, fmt: str, kept: list[str],
    damaged: int,
) -> None:  # fmt: skip
    """NULs in a history are a crash's (a shell writes none): the entries they touch are skipped
    and counted, the rest imported. Before issue 39 the whole file was refused."""
    from calmd.cli import calm_main

    path = tmp_path / name
    path.write_bytes(content)
    db = str(tmp_path / "h.sqlite3")
    assert calm_main(["import", "--db", db, "--format", fmt, str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{len(kept)} commands imported" in out and f"{damaged} damaged by NUL bytes" in out, out
    store = HistoryStore(Path(db))
    assert [r.cmd for r in store.all_rows()] == kept
    assert store.counter("import_damaged") == damaged
    store.close()


def test_calm_import_refuses_with_one_line_and_imports_the_other_files(tmp_path: Path) -> None:
    bad = passwd_like(tmp_path / "passwd")
    good = tmp_path / ".bash_history"
    good.write_text("ls\nmake\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "CALM_HOME": str(tmp_path / "data")}
    out = subprocess.run([str(BIN / "calm"), "import", str(bad), str(fifo), str(tmp_path), str(good)],
                         env=env, capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
    assert out.returncode == 1
    errors = out.stderr.splitlines()
    assert len(errors) == 3 and all(line.startswith("calm: error: ") for line in errors), errors
    assert "not a shell history" in errors[0] and "FIFO" in errors[1] and "folder" in errors[2]
    assert f"{good}: 2 commands imported" in out.stdout and "Traceback" not in out.stderr


def test_the_daemon_imports_what_a_crash_left_of_a_history_and_says_so(tmp_path: Path) -> None:
    """A 1 GB sparse ~/.bash_history (a crash's NULs, then what the shell appended, with a second
    crash's block of NULs in it): the daemon is ready at once, imports what is not damaged of it
    and ~/.zsh_history, and `calmd status` counts the damaged entry (the hole's line is cut by the
    16 MiB bound: not an entry read). Before issue 39 the file was refused whole."""
    path = sparse(tmp_path / ".bash_history", 1 << 30, b"ls\n")
    with open(path, "ab") as f:  # what the shell appended after the crash, and a second crash's block
        f.write(b"\nmake\n" + b"\0" * 4096 + b"\ngit status\n")
    (tmp_path / ".zsh_history").write_text(": 1700000000:0;make test\n")
    with running_daemon(tmp_path) as daemon, CalmClient(daemon.socket) as c:
        status = wait_imported(c)
        assert status["history"]["commands"] == 3  # make test; make, git status (ls: beyond 16 MiB)
        assert status["history"]["import"]["refused"] == 0 and status["history"]["import"]["damaged"] == 1
        shown = subprocess.run([str(BIN / "calmd"), "status"], env=daemon_env(tmp_path),
                               capture_output=True, text=True, check=True, timeout=HANG_S).stdout  # fmt: skip
        assert "1 entry was damaged by NUL bytes" in " ".join(shown.split())
    assert "1 damaged by NUL bytes" in daemon.read_output()


# --------------------------------------------------------------------------- streaming


def test_an_import_stopped_after_a_batch_goes_on_where_it_was(tmp_path: Path) -> None:
    path = tmp_path / ".bash_history"
    n = IMPORT_BATCH * 2 + 10
    path.write_text("".join(f"echo {i}\n" for i in range(n)))
    store = HistoryStore(tmp_path / "h.sqlite3")
    stop = threading.Event()
    stop.set()  # as the daemon's shutdown does: the import ends after its first batch
    first = store.import_file(path, stop=stop)
    assert not first.complete and first.imported == IMPORT_BATCH
    rest = store.import_file(path)
    assert rest.complete and first.imported + rest.imported == n
    assert [r.cmd for r in store.all_rows()] == [f"echo {i}" for i in range(n)]  # none twice, in order
    store.close()


def test_only_the_newest_part_of_a_huge_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / ".zsh_history"
    entries = [f": {1700000000 + i}:0;echo {i}\\\n  and more {i}\n" for i in range(5000)]
    path.write_text("".join(entries))
    store = HistoryStore(tmp_path / "h.sqlite3")
    result = store.import_file(path, max_bytes=20_000)
    cmds = [r.cmd for r in store.all_rows()]
    assert 0 < len(cmds) < 5000 and result.skipped_bytes > 0
    assert cmds[-1] == "echo 4999\n  and more 4999"  # the newest, whole
    assert all(c.startswith("echo ") and "\n  and more " in c for c in cmds)  # never half an entry
    store.close()


def test_a_line_with_no_end_is_skipped_unread(tmp_path: Path) -> None:
    path = tmp_path / ".bash_history"
    with open(path, "wb") as f:
        f.write(b"ls\n")
        f.write(b"y" * (8 << 20))  # 8 MiB without a newline: no command
        f.write(b"\nmake\n")
    store = HistoryStore(tmp_path / "h.sqlite3")
    result = store.import_file(path)
    assert [r.cmd for r in store.all_rows()] == ["ls", "make"]
    assert (result.too_long, result.skipped) == (1, 0)  # counted as what it is (issue 39)
    store.close()


def import_worker(daemon_pid: int) -> int:
    """The pid of the daemon's worker process (`python -m calmd.daemon.worker`), once it runs."""

    def find() -> int | None:
        for child in Path(f"/proc/{daemon_pid}/task/{daemon_pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                if b"calmd.daemon.worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
        return None

    return int(wait_until(find, "the daemon's worker process runs"))


def test_a_daemon_killed_while_it_imports_goes_on_where_it_was(tmp_path: Path) -> None:
    """kill -9 in the middle of the first start's import (the daemon answers meanwhile): the next
    start imports the rest, each command once, in order."""
    n = 200_000  # a wide window to kill it in, on a loaded machine too
    (tmp_path / ".bash_history").write_text("".join(f"echo line-{i}\n" for i in range(n)))
    with running_daemon(tmp_path) as daemon, CalmClient(daemon.socket) as c:
        while (status := c.status()["status"])["history"]["commands"] < 2 * IMPORT_BATCH:
            assert status["history"]["import"]["running"], "the import ended before it could be killed"
            time.sleep(0.01)
        # The import runs in the daemon's worker process (calmd/daemon/worker.py): held still there,
        # it is mid-import whatever the request below costs on a busy machine (with two busy loops
        # beside the suite, the import ended before the daemon had answered it).
        worker = import_worker(daemon.proc.pid)
        os.kill(worker, signal.SIGSTOP)
        assert any("candidate" in m for m in c.complete("echo", n=1))  # it serves while it imports
        assert c.status()["status"]["history"]["import"]["running"]
        daemon.proc.kill()  # the worker dies with it (its parent-death signal), stopped or not
        daemon.proc.wait()
        wait_until(lambda: not Path(f"/proc/{worker}").exists(), "the worker died with the daemon")
    store = HistoryStore(tmp_path / "data" / paths.HISTORY)
    stored_before = store.count()
    store.close()
    assert 0 < stored_before < n
    with running_daemon(tmp_path) as daemon, CalmClient(daemon.socket) as c:
        assert wait_imported(c)["history"]["commands"] == n
    store = HistoryStore(tmp_path / "data" / paths.HISTORY)
    assert [r.cmd for r in store.all_rows()] == [f"echo line-{i}" for i in range(n)]
    store.close()


# --------------------------------------------------------------------------- bounds (issue 30)


def test_impossible_times_are_dropped_and_counted_and_the_commands_kept(tmp_path: Path) -> None:
    """`#999999999999` is the year 33658, a 400-digit time is infinity (`calm history` and `calm
    stats` failed on both); each command is kept, timed by its place in the file (the entry before
    it), and counted."""
    bash = tmp_path / ".bash_history"
    bash.write_text(
        "#1700000000\ngit status\n#999999999999\nls\n#" + "9" * 400 + "\nmake\n#1700000100\npwd\n"
        "#0000000000001700000200\nwho\n"  # zeros first: still too many digits for a time
    )
    zsh = tmp_path / ".zsh_history"
    zsh.write_text(
        ": 1700000000:0;vim\n: 999999999999:0;top\n: " + "9" * 400 + ":0;htop\n: 1700000200:0;cd\n"
    )
    db = tmp_path / "h.sqlite3"
    env = {**os.environ, "CALM_HOME": str(tmp_path / "data")}
    out = subprocess.run([str(BIN / "calm"), "import", "--db", str(db), str(bash), str(zsh)], env=env,
                         capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"{bash}: 5 commands imported (bash format)" in out.stdout
    assert "3 with an impossible time" in out.stdout and "2 with an impossible time" in out.stdout, out.stdout
    store = HistoryStore(db)
    times = {r.cmd: r.ts for r in store.all_rows()}
    assert store.counter("import_bad_times") == 5
    store.close()
    assert times["git status"] == 1700000000 and times["pwd"] == 1700000100 and times["cd"] == 1700000200
    assert all(0 < ts < time.time() + 60 for ts in times.values()), times
    # their place in the file: the time of the entry before them (they took the import's time, and
    # sorted as the newest commands, before issue 39)
    assert times["ls"] == times["make"] == 1700000000 and times["who"] == 1700000100
    listed = subprocess.run([str(BIN / "calm"), "history", "--commands", "--db", str(db)], env=env,
                            capture_output=True, text=True, timeout=HANG_S).stdout.split("\n")  # fmt: skip
    assert listed[:9] == ["git status", "ls", "make", "vim", "top", "htop", "pwd", "who", "cd"], listed
    for argv in (["history"], ["history", "--json"], ["stats"]):
        shown = subprocess.run([str(BIN / "calm"), *argv, "--db", str(db)], env=env, capture_output=True,
                               text=True, timeout=HANG_S)  # fmt: skip
        assert shown.returncode == 0 and "Infinity" not in shown.stdout, shown.stderr


def test_the_import_summary_names_a_hostile_file_escaped(tmp_path: Path) -> None:
    """`calm import`'s line (the counts of issue 30's bounds: "N with an impossible time") names the
    file through calmd/visible.py: a name holding an OSC sequence sets no terminal title."""
    hostile = tmp_path / "hist\x1b]0;pwned\x07"
    hostile.write_text("#1700000000\ngit status\n#999999999999\nls\n")
    env = {**os.environ, "CALM_HOME": str(tmp_path / "data")}
    out = subprocess.run([str(BIN / "calm"), "import", "--db", str(tmp_path / "h.sqlite3"), str(hostile)],
                         env=env, capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    escaped = str(tmp_path).replace("\\", "\\\\") + "/hist\\e]0;pwned\\x07"
    assert f"{escaped}: 2 commands imported (bash format)" in out.stdout, out.stdout
    assert "1 with an impossible time" in out.stdout


def test_a_bounded_import_leaves_the_older_lines_for_the_next_one(tmp_path: Path) -> None:
    """`--max-mib` below the file's size reads the newest part and marks only that as read: each
    import after it reads the next older part (and what the shell appended), until all of it is
    stored, each command once (the whole file used to be marked as read)."""
    path = tmp_path / ".zsh_history"  # multi-line entries: a part never starts inside one
    entries = [f": {1700000000 + i}:0;echo {i}\\\n  and more {i}\n" for i in range(3000)]
    path.write_text("".join(entries))
    store = HistoryStore(tmp_path / "h.sqlite3")
    first = store.import_file(path, max_bytes=20_000)
    assert 0 < first.imported < 3000 and first.skipped_bytes > 0
    assert [r.cmd for r in store.all_rows()][-1] == "echo 2999\n  and more 2999"  # the newest first
    with open(path, "a") as f:
        f.write(": 1700009999:0;appended meanwhile\n")
    results = [first]
    while results[-1].skipped_bytes:
        results.append(store.import_file(path, max_bytes=20_000))
        assert results[-1].imported > 0 and len(results) < 100
    cmds = [r.cmd for r in store.all_rows()]
    store.close()
    expected = [f"echo {i}\n  and more {i}" for i in range(3000)] + ["appended meanwhile"]
    assert sorted(cmds) == sorted(expected)  # all of them, each once, never half an entry
    assert "appended meanwhile" in cmds[first.imported : first.imported + results[1].imported]  # newest first


def test_calm_import_says_the_older_bytes_are_left_for_the_next_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from calmd.cli import calm_main

    path = tmp_path / "bash_history"
    path.write_text("".join(f"echo {i}\n" for i in range(4000)))
    db = str(tmp_path / "h.sqlite3")
    assert calm_main(["import", "--db", db, "--max-mib", "0.01", str(path)]) == 0
    out = capsys.readouterr().out
    assert "older bytes not read yet (--max-mib): import it again to read them" in out
    while "not read yet" in out:
        assert calm_main(["import", "--db", db, "--max-mib", "0.01", str(path)]) == 0
        out = capsys.readouterr().out
    assert "history: 4000 commands" in out


def test_the_first_start_leaves_the_running_command_to_the_hooks(tmp_path: Path) -> None:
    """zsh (INC_APPEND_HISTORY) and fish write a command when it starts: the `calmd serve` that
    started the daemon is in the file, still running. The first-start import passes over what is
    timed as the daemon started; the hook records it when it ends, with its status."""
    home = tmp_path / "home"
    home.mkdir()
    started = 1700000100.0
    (home / ".zsh_history").write_text(": 1700000000:0;make\n: 1700000099:0;calmd serve\n")
    store = HistoryStore(tmp_path / "h.sqlite3")
    (result,) = store.import_shell_histories(home, leave_after=started - 2).results
    assert (result.imported, result.left_to_hooks) == (1, 1)
    assert [r.cmd for r in store.all_rows()] == ["make"]
    assert store.import_file(home / ".zsh_history").imported == 0  # read: not imported later either
    store.close()


def test_calmd_status_counts_the_impossible_times_of_the_first_start(tmp_path: Path) -> None:
    (tmp_path / ".zsh_history").write_text(": 1700000000:0;make\n: 999999999999:0;top\n: -5:0;htop\n")
    with running_daemon(tmp_path) as daemon, CalmClient(daemon.socket) as c:
        status = wait_imported(c)
        assert status["history"]["commands"] == 3 and status["history"]["import"]["bad_times"] == 1
        shown = subprocess.run([str(BIN / "calmd"), "status"], env={**daemon_env(tmp_path), "COLUMNS": "400"},
                               capture_output=True, text=True, check=True, timeout=HANG_S).stdout  # fmt: skip
        assert "1 imported command had an impossible time (kept without it)" in shown
