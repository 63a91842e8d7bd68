"""fish without a terminal: its history file (calmd/history/fish.py) and the helper's transport
for it (calmd/shell/spool.py), driven as the hook drives them. The hook itself runs in a real
fish in tmux: test_shell_fish.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from calmd.cli import calm_main
from calmd.errors import CalmError
from calmd.history.fish import import_first_start, import_fish_history, is_fish_history, parse_fish_history
from calmd.history.store import HistoryStore
from calmd.shell import hooks, lines
from tests.support.daemon import Daemon, running_daemon
from tests.support.tmux import history_rows, shell_env
from tests.support.tools import need
from tests.support.waiting import HANG_S, wait_until

# What fish 3.6 wrote for these lines (tests/shell/test_shell_fish.py makes fish write one too).
FISH_HISTORY = b"""- cmd: echo 'a\\\\b'  # back\\\\slash
  when: 1700000000
- cmd: echo one\\necho two
  when: 1700000001
- cmd: vim src/main.rs
  when: 1700000001
  paths:
    - src/main.rs
- cmd: export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789
  when: 1700000002
- cmd:  ls -la
  when: 1700000003
- cmd: caf\xc3\xa9 \xff
  when: 1700000004
"""


def test_the_format_fish_writes_is_read_entry_by_entry() -> None:
    entries = list(parse_fish_history(FISH_HISTORY))
    assert entries[:3] == [
        (1700000000.0, "echo 'a\\b'  # back\\slash"),
        (1700000001.0, "echo one\necho two"),  # a multi-line command is one entry
        (1700000001.0, "vim src/main.rs"),  # its paths are not commands
    ]
    assert len(entries) == 6
    assert is_fish_history(FISH_HISTORY) and not is_fish_history(b": 1700000000:0;ls\n")
    # what is not an entry is passed over: fish 1's format, a line cut short, junk before the first
    odd = b"# 1600000000\nls\n- cmd: pwd\n  when: soon\n  something: else\n- cmd: date\n  when: 1700000009"
    assert list(parse_fish_history(odd)) == [(None, "pwd"), (1700000009.0, "date")]
    assert list(parse_fish_history(b"- cmd: a\\\\nb\\x\n")) == [(None, "a\\nb\\x")]  # \\ then n; \x stays


def test_import_keeps_what_was_read_and_takes_only_the_new_runs(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    path = tmp_path / "fish_history"
    path.write_bytes(FISH_HISTORY)
    result = import_fish_history(store, path)
    # the token never stored; the line starting with a space neither (fish's own habit too)
    assert (result.imported, result.dropped_secrets, result.skipped, result.undecodable) == (4, 1, 1, 1)
    rows = list(store.all_rows())
    assert [r.cmd for r in rows] == ["echo 'a\\b'  # back\\slash", "echo one\necho two", "vim src/main.rs",
                                     "café \ufffd"]  # fmt: skip
    assert [r.ts for r in rows][:2] == [1700000000.0, 1700000001.0] and rows[0].source == "import:fish"
    assert import_fish_history(store, path).imported == 0  # nothing new
    # fish rewrote the file: older duplicates gone, `vim` run again, a new command; merged order
    path.write_bytes(b"- cmd: echo one\\necho two\n  when: 1700000001\n"
                     b"- cmd: vim src/main.rs\n  when: 1700000001\n"
                     b"- cmd: caf\xc3\xa9 \xff\n  when: 1700000004\n"
                     b"- cmd: vim src/main.rs\n  when: 1700000050\n"
                     b"- cmd: cargo build\n  when: 1700000050\n")  # fmt: skip
    again = import_fish_history(store, path)
    assert again.imported == 2
    assert [r.cmd for r in store.all_rows()][-2:] == ["vim src/main.rs", "cargo build"]
    path.write_bytes(path.read_bytes() + b"- cmd: cargo test\n  when: 1700000050\n")  # same second
    assert import_fish_history(store, path).imported == 1
    assert import_fish_history(store, path).imported == 0
    store.close()


def test_a_file_that_is_not_fish_is_refused_and_calm_import_tells_them_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    bash = tmp_path / "bash_history"
    bash.write_text("ls\ngit status\n")
    with pytest.raises(CalmError, match="not a fish history"):
        import_fish_history(store, bash)
    store.close()
    fish = tmp_path / "fish_history"
    fish.write_bytes(FISH_HISTORY)
    db = str(tmp_path / "cli.sqlite3")
    assert calm_main(["import", "--db", db, str(fish), str(bash)]) == 0
    out = capsys.readouterr().out
    assert "4 commands imported (fish format), 1 dropped as credentials" in out
    assert "2 commands imported (bash format)" in out and "history: 6 commands" in out
    assert calm_main(["import", "--db", db, "--format", "fish", str(bash)]) == 1
    assert "not a fish history" in capsys.readouterr().err
    # held to what bash's and zsh's imports are: no FIFO waited on, no binary file read as commands
    os.mkfifo(tmp_path / "fifo")
    binary = tmp_path / "binary"
    binary.write_bytes(b"- cmd: ls\n" + bytes(range(256)) * 64)
    assert calm_main(["import", "--db", db, "--format", "fish", str(tmp_path / "fifo"), str(binary)]) == 1
    err = capsys.readouterr().err
    assert "not a regular file" in err and "binary data" in err


@pytest.mark.slow  # a daemon or helper process
def test_the_daemon_imports_fish_history_once_at_start(tmp_path: Path) -> None:
    data = tmp_path / "xdg"
    (data / "fish").mkdir(parents=True)
    (data / "fish" / "fish_history").write_bytes(FISH_HISTORY)
    with running_daemon(tmp_path, env={"XDG_DATA_HOME": str(data)}):
        pass
    rows = history_rows(tmp_path)
    assert len(rows) == 4
    assert [r.cmd for r in rows][:2] == ["echo 'a\\b'  # back\\slash", "echo one\necho two"]
    with running_daemon(tmp_path, env={"XDG_DATA_HOME": str(data)}):
        pass
    assert len(history_rows(tmp_path)) == 4  # not twice
    store = HistoryStore(tmp_path / "other.sqlite3")
    assert import_first_start(store, tmp_path / "none") is None
    broken = tmp_path / "broken"
    broken.write_bytes(b"not fish at all")
    assert import_first_start(store, broken) is None and store.count() == 0  # logged, never raised
    store.close()


# --------------------------------------------------------------------------- bounds (issue 30)


def test_impossible_whens_are_dropped_and_counted_and_the_commands_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 400-digit `when:` failed the whole import ("unexpected OverflowError"), a negative one was
    stored as 1969: each command is kept now, without that time, and counted. It is timed by its
    place in the file, the time of the entry before it (issue 39: it took the import's time and
    sorted as the newest command)."""
    path = tmp_path / "fish_history"
    path.write_bytes(b"- cmd: make\n  when: 1700000000\n- cmd: ls\n  when: " + b"9" * 400 + b"\n"
                     b"- cmd: pwd\n  when: -5\n- cmd: top\n  when: 999999999999\n"
                     b"- cmd: cargo build\n  when: 1700000100\n")  # fmt: skip
    db = str(tmp_path / "h.sqlite3")
    assert calm_main(["import", "--db", db, str(path)]) == 0
    out = capsys.readouterr().out
    assert "5 commands imported (fish format)" in out and "3 with an impossible time" in out
    store = HistoryStore(Path(db))
    rows = list(store.all_rows())
    assert store.counter("import_bad_times") == 3
    store.close()
    times = {r.cmd: r.ts for r in rows}
    assert times["make"] == 1700000000 and times["cargo build"] == 1700000100
    assert [r.cmd for r in rows] == ["make", "ls", "pwd", "top", "cargo build"]  # in file order
    assert all(times[c] == 1700000000 for c in ("ls", "pwd", "top"))  # the time before them
    assert calm_main(["history", "--db", db, "--commands"]) == 0
    assert capsys.readouterr().out.split("\n")[:5] == ["make", "ls", "pwd", "top", "cargo build"]
    assert list(parse_fish_history(path.read_bytes()))[1:4] == [(None, "ls"), (None, "pwd"), (None, "top")]
    assert calm_main(["import", "--db", db, str(path)]) == 0  # nothing twice
    assert "0 commands imported" in capsys.readouterr().out
    for argv in (["history", "--json"], ["stats"]):
        assert calm_main([*argv, "--db", db]) == 0
    assert "Infinity" not in capsys.readouterr().out


def _fish_file(path: Path, size: int, *, shuffled: bool) -> int:
    """A fish history of `size` bytes of short entries (in time order, or with times shuffled)."""
    entries: list[bytes] = []
    total = 0
    while total < size:
        n = len(entries)
        entry = b"- cmd: l%d\n" % (n % 7)
        if shuffled:
            entry += b"  when: %d\n" % (1700000000 + (n * 7919) % 99991)
        entries.append(entry)
        total += len(entry)
    path.write_bytes(b"".join(entries))
    return len(entries)


@pytest.mark.slow  # seconds of CPU: the whole suite runs it, not the quick loop
@pytest.mark.parametrize("shuffled", [False, True], ids=["in-order", "out-of-order"])
def test_memory_does_not_grow_with_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            shuffled: bool) -> None:  # fmt: skip
    """The Python memory an import allocates at its peak (tracemalloc: counted, not timed) is the
    same for a file with four times the entries: it reads a chunk at a time (made small here) and
    holds no entry (1.8 million `- cmd: ls` entries held 640 MB; 20 bytes an entry would show)."""
    import tracemalloc

    from calmd.history import formats

    monkeypatch.setattr(formats, "IMPORT_CHUNK", 16 << 10)
    peaks = []
    for size in (128 << 10, 512 << 10):
        folder = tmp_path / str(size)
        folder.mkdir()
        entries = _fish_file(folder / "fish_history", size, shuffled=shuffled)
        store = HistoryStore(folder / "h.sqlite3")
        tracemalloc.start()
        try:
            result = import_fish_history(store, folder / "fish_history")
            peaks.append((entries, tracemalloc.get_traced_memory()[1]))
        finally:
            tracemalloc.stop()
        assert result.imported == entries
        stored = [r.ts for r in store.all_rows()]
        store.close()
        assert stored == sorted(stored)  # in time order, whatever the file's
    (small, small_peak), (big, big_peak) = peaks
    assert big - small > 12_000
    assert big_peak - small_peak < 4 * (big - small), peaks  # not even 4 bytes an entry more


def test_an_import_stopped_out_of_time_order_goes_on_where_it_was(tmp_path: Path) -> None:
    from calmd.history.imports import IMPORT_BATCH

    path = tmp_path / "fish_history"
    n = _fish_file(path, 3 * IMPORT_BATCH * 25, shuffled=True)
    store = HistoryStore(tmp_path / "h.sqlite3")
    stop = threading.Event()
    stop.set()  # as the daemon's shutdown does: the import ends after its first batch
    first = import_fish_history(store, path, stop=stop)
    assert not first.complete and first.imported == IMPORT_BATCH
    rest = import_fish_history(store, path)
    assert rest.complete and first.imported + rest.imported == n
    rows = list(store.all_rows())
    store.close()
    assert [r.ts for r in rows] == sorted(r.ts for r in rows)  # one run of the import: time order
    assert len({(r.ts, r.cmd, i) for i, r in enumerate(rows)}) == n == len(rows)  # none twice, none lost


def test_the_first_start_leaves_the_running_command_and_counts_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "fish_history"
    path.write_bytes(FISH_HISTORY + b"- cmd: calmd serve\n  when: 1800000000\n")
    store = HistoryStore(tmp_path / "h.sqlite3")
    result = import_first_start(store, path, leave_after=1800000000 - 2)
    assert result is not None and (result.imported, result.left_to_hooks) == (4, 1)
    assert "calmd serve" not in [r.cmd for r in store.all_rows()]
    assert import_first_start(store, path) is None  # read whole: done
    unreadable = Path("/proc/self/clear_refs")  # a regular file whose read fails (EINVAL)
    if unreadable.exists():
        (tmp_path / "link").symlink_to(unreadable)
        assert import_first_start(store, tmp_path / "link") is None
        assert store.counter("import_failures") == 1  # `calmd status` said 0 failures
    store.close()


@pytest.mark.slow  # a daemon process
def test_a_daemon_started_at_a_fish_prompt_does_not_import_its_own_command(tmp_path: Path) -> None:
    """`calmd serve` typed at a prompt: fish wrote it to its history when it started, and the
    first-start import read it as a finished command without a status, which the hook then
    recorded a second time when it ended. It is left to the hook now."""
    import signal

    from calmd.shell.client import CalmClient
    from tests.support.daemon import running_daemon, wait_imported

    data = tmp_path / "xdg"
    (data / "fish").mkdir(parents=True)
    now = int(time.time())
    (data / "fish" / "fish_history").write_bytes(FISH_HISTORY + b"- cmd: calmd serve\n  when: %d\n" % now)
    # a shell runs it, as at a prompt (`&` and `wait`: bash stays its parent)
    at_a_prompt = ("bash", "-c", '"$@" & wait', "bash")
    with running_daemon(tmp_path, env={"XDG_DATA_HOME": str(data)}, prefix=at_a_prompt) as daemon:
        with CalmClient(daemon.socket) as client:
            pid = client.status()["status"]["pid"]
            wait_imported(client)
        os.kill(pid, signal.SIGTERM)  # the daemon, not its shell: the shell's `wait` ends with it
        assert daemon.wait() == 0
    assert [r.cmd for r in history_rows(tmp_path)] == [
        "echo 'a\\b'  # back\\slash",
        "echo one\necho two",
        "vim src/main.rs",
        "café \ufffd",
    ]


# --------------------------------------------------------------------------- the helper's transport


class SpoolHelper:
    """`calmd shell-helper --spool DIR`, written to and read from as the fish hook does."""

    def __init__(self, home: Path, daemon: Daemon | None = None, shell_pid: int | None = None) -> None:
        need("timeout")
        self.folder = home / "spool"
        self.folder.mkdir(mode=0o700)
        self.seq = 0
        pid = [] if shell_pid is None else ["--shell-pid", str(shell_pid)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "calmd", "shell-helper", "--format", "2", "--session", "fish-test",
             "--shell", "fish", *pid, "--spool", str(self.folder)],
            stdin=subprocess.DEVNULL, env=shell_env(home, CALM_DEBUG="1"),
        )  # fmt: skip
        wait_until(
            lambda: (self.folder / "reply").exists() or self.proc.poll() is not None, "the helper's FIFO"
        )
        assert self.proc.poll() is None, "the helper did not start"

    def write(self, *lines: str, partial: bool = False) -> Path:
        self.seq += 1
        path = self.folder / str(self.seq)
        path.write_text("\n".join(lines) + ("" if partial else "\n"))
        return path

    def ask(self, text: str, timeout: float = HANG_S) -> list[str]:
        """A `c` line and the answer, read as the hook reads it (`timeout cat reply`)."""
        seq = self.seq + 1
        self.write("\t".join(["c", str(seq), "5", "/tmp", "", "0", lines.escape(text)]))
        out = subprocess.run(["timeout", str(timeout), "cat", str(self.folder / "reply")],
                             capture_output=True, timeout=timeout + 5)  # fmt: skip
        fields = out.stdout.decode().split("\0")
        assert fields[-1] == "" and fields[0] == str(seq) and fields[1] == "1", fields
        return fields[3:-1]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=HANG_S)


@pytest.mark.slow  # a daemon or helper process
def test_requests_as_files_answers_through_the_fifo(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        helper = SpoolHelper(tmp_path, d)
        try:
            assert stat_mode(helper.folder) == 0o700
            # records in order, one with its duration (ts: now minus it), one multi-line
            helper.write("r\t0\t/src\tmain\t\tgit status\t1.500",
                         "r\t2\t/src\t\t1700000000.5\tmake\\nmake test")  # fmt: skip
            started = time.time()
            assert helper.ask("git st")[0] == "git status"  # recorded before the request is answered
            rows = history_rows(tmp_path)
            assert [(r.cmd, r.exit, r.cwd, r.git, r.duration) for r in rows] == [
                ("git status", 0, "/src", "main", 1.5), ("make\nmake test", 2, "/src", "", None)]  # fmt: skip
            assert started - 1.5 - 5 < rows[0].ts <= started - 1.4 and rows[1].ts == 1700000000.5
            assert [p.name for p in helper.folder.iterdir()] == ["reply"]  # read and removed
            # a file still being written waits, and the ones after it too
            part = helper.write("r\t0\t/src\t\t\techo late", partial=True)
            helper.write("r\t0\t/src\t\t\techo later")
            time.sleep(0.3)
            assert [r.cmd for r in history_rows(tmp_path)][-1] == "make\nmake test"
            with part.open("a") as f:
                f.write("\n")
            assert "echo later" in helper.ask("echo")
            assert [r.cmd for r in history_rows(tmp_path)][-2:] == ["echo late", "echo later"]
            # an answer nobody reads any more is dropped, never left for the next key
            helper.write("\t".join(["c", str(helper.seq + 1), "5", "/tmp", "", "0", "xyz"]))
            time.sleep(0.5)
            assert helper.ask("abc")[0] == "abcmmit"
        finally:
            helper.close()


@pytest.mark.slow  # a daemon or helper process
def test_without_a_daemon_the_answer_is_empty_at_once(tmp_path: Path) -> None:
    helper = SpoolHelper(tmp_path)
    try:
        started = time.monotonic()
        assert helper.ask("git st") == []
        assert time.monotonic() - started < 2.5
    finally:
        helper.close()


def _gone(pid: int, folder: Path) -> None:
    """Wait until the helper `pid` has exited and its folder is removed (a hang: the ceiling)."""
    wait_until(lambda: not folder.exists() and not os.path.exists(f"/proc/{pid}"),
               "the helper to go with its shell (and take its folder)")  # fmt: skip


@pytest.mark.slow  # a daemon or helper process
@pytest.mark.parametrize("parent", ["waits", "gone-at-once"])
def test_the_helper_goes_with_its_shell_and_removes_its_folder(tmp_path: Path, parent: str) -> None:
    """The fish hook starts it as a background job; when fish exits, it notices and cleans up.
    Started as `sh -c 'calmd shell-helper ... & :'`, whose shell is gone before Python runs, it
    used to read init's pid as its parent's and run on for good (issue 39: 25 minutes in a suite
    run, with parent 1): it goes at once now."""
    need("timeout")
    folder = tmp_path / "spool"
    folder.mkdir(mode=0o700)
    (folder / "reply").touch()  # what the hook makes first; the helper removes it with the rest
    argv = [sys.executable, "-m", "calmd", "shell-helper", "--format", "2", "--spool", str(folder)]
    script = '"$@" </dev/null >/dev/null 2>&1 & echo $!' + ("; sleep 1" if parent == "waits" else "; :")
    shell = subprocess.Popen(["sh", "-c", script, "sh", *argv], stdout=subprocess.PIPE, text=True,
                             env=shell_env(tmp_path))  # fmt: skip
    assert shell.stdout is not None
    pid = int(shell.stdout.readline())
    shell.wait(timeout=HANG_S)
    shell.stdout.close()
    _gone(pid, folder)


@pytest.mark.slow  # a helper process
@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "shell-pid"])
def test_the_helper_removes_its_folder_however_it_is_ended(tmp_path: Path, how: str) -> None:
    """SIGTERM and SIGHUP end fish's helper with its folder (it left `reply` behind on SIGTERM);
    with `--shell-pid` (the hook gives `$fish_pid`) it goes when that process ends, though its
    parent runs on."""
    shell = subprocess.Popen(["sleep", "60"])
    helper = SpoolHelper(tmp_path, shell_pid=shell.pid)
    try:
        helper.write("r\t0\t/src\t\t\tgit status")  # a request it has not sent anywhere: no daemon
        if how == "shell-pid":
            shell.kill()
            shell.wait()
        else:
            helper.proc.send_signal(getattr(signal, how))
        assert helper.proc.wait(timeout=HANG_S) == 0
        assert not helper.folder.exists()
    finally:
        shell.kill()
        shell.wait()
        helper.close()


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_fish_hook_is_baked_with_fish_quoting(tmp_path: Path) -> None:
    text = hooks.init_script("fish", socket="/run/it's here/calmd.sock")
    head = text.splitlines()[:4]
    assert head[1].startswith("set -g _CALM_HELPER ")
    assert "'--socket' '/run/it\\'s here/calmd.sock'" in head[1]
    assert head[2].startswith("set -g _CALM_SEARCH ") and "'calmd.shell.search_ui'" in head[2]
    assert hooks.fish_quote("a\\b'c") == "'a\\\\b\\'c'"
    if need_fish():
        word = hooks.fish_quote("\\x'")
        script = f"printf '%s\\n' {word}"
        out = subprocess.run(["fish", "-c", script], capture_output=True, text=True, timeout=HANG_S)
        assert out.stdout == "\\x'\n"


def need_fish() -> bool:
    need("fish")
    return True
