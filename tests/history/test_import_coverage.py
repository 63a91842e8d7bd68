"""An import of a shell's own history file never repeats what the hooks recorded, nor brings back
what the user typed while recording was paused (calmd/history/coverage.py, issue 39): the store
as the daemon and `calm import` use it. The same in a real fish with a real daemon:
tests/shell/test_shell_fish.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from calmd.history.fish import import_fish_history
from calmd.history.store import HistoryStore

T = 1_750_000_000  # a whole second, as fish writes `when`


def fish_file(path: Path, entries: list[tuple[str, int]]) -> Path:
    path.write_text("".join(f"- cmd: {cmd}\n  when: {when}\n" for cmd, when in entries))
    return path


def rows(store: HistoryStore) -> list[tuple[str, str]]:
    return [(r.cmd, r.source) for r in store.all_rows()]


def test_an_import_leaves_out_each_run_the_hooks_recorded_and_keeps_the_others(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    # the hook's times: the command's start, a little after the second fish wrote
    store.record("echo one", ts=T + 0.31, exit=0, session="fish-1")
    store.record("ls", ts=T + 2.2, exit=0, session="fish-1")
    store.record("ls", ts=T + 2.7, exit=0, session="fish-1")  # the same command twice in a second
    path = fish_file(tmp_path / "fish_history", [
        ("echo one", T), ("ls", T + 2), ("ls", T + 2),
        ("ls", T + 3),  # a third run, in a fish without the hook
        ("make", T + 3),  # never recorded: imported
        ("echo one", T + 600),  # the same line ten minutes later: another run
    ])  # fmt: skip
    result = import_fish_history(store, path)
    assert (result.imported, result.recorded, result.paused) == (3, 3, 0)
    assert rows(store) == [("echo one", "shell"), ("ls", "shell"), ("ls", "shell"), ("ls", "import:fish"),
                           ("make", "import:fish"), ("echo one", "import:fish")]  # fmt: skip
    # the same file under another name (a copy, a mark lost): nothing twice
    again = import_fish_history(store, shutil.copy(path, tmp_path / "copy_history"))
    assert (again.imported, again.recorded) == (0, 6)
    store.close()


def test_a_command_typed_while_recording_was_paused_is_never_imported(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    store.record("echo one", ts=T + 0.2, session="fish-1")
    store.note_paused(T + 1.4, "fish-1")  # `set CALM_RECORD 0`: it ran with recording off
    store.note_paused(T + 2.3, "fish-1")  # echo paused
    store.record("set CALM_RECORD 1", ts=T + 3.2, session="fish-1")
    store.record("echo two", ts=T + 4.2, session="fish-1")
    path = fish_file(tmp_path / "fish_history", [
        ("echo one", T), ("set CALM_RECORD 0", T + 1), ("echo paused", T + 2), ("set CALM_RECORD 1", T + 3),
        ("echo two", T + 4),
    ])  # fmt: skip
    result = import_fish_history(store, path)
    assert (result.imported, result.recorded, result.paused) == (0, 3, 2)
    assert [cmd for cmd, _ in rows(store)] == ["echo one", "set CALM_RECORD 1", "echo two"]
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("h.sqlite3*"))
    assert b"paused" not in raw  # nothing of the paused line, anywhere in the store's files
    store.close()


def test_a_record_or_a_pause_that_comes_after_the_import_finds_the_imported_row(tmp_path: Path) -> None:
    """The helper kept them while the daemon restarted (or the command still ran): the import came
    first. The record takes the imported row over, the pause deletes it for good."""
    store = HistoryStore(tmp_path / "h.sqlite3")
    store.record("cd src", ts=T - 60, session="fish-1")  # the session's previous record
    path = fish_file(tmp_path / "fish_history", [("git push", T), ("echo secret-ish", T + 5)])
    assert import_fish_history(store, path).imported == 2
    store.record("git push", ts=T + 0.4, exit=1, cwd="/src", duration=3.5, session="fish-1")
    assert store.note_paused(T + 5.3, "fish-1") == 1
    (push,) = [r for r in store.all_rows() if r.cmd == "git push"]
    assert (push.source, push.exit, push.cwd, push.duration, push.ts) == ("shell", 1, "/src", 3.5, T + 0.4)
    assert [r.cmd for r in store.all_rows()] == ["cd src", "git push"]
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("h.sqlite3*"))
    assert b"secret-ish" not in raw  # deleted for good (secure_delete, the WAL truncated)
    # a run the session recorded before the import is another run: nothing is taken over
    store.record("ls", ts=T + 100.2, session="fish-1")
    fish_file(path, [("git push", T), ("echo secret-ish", T + 5), ("ls", T + 100), ("ls", T + 101)])
    assert import_fish_history(store, path).imported == 1  # the second ls: a run the hook never saw
    store.record("ls", ts=T + 101.5, session="fish-2")  # another shell's run: takes over the imported one
    assert [(r.cmd, r.source) for r in store.all_rows()][-2:] == [("ls", "shell"), ("ls", "shell")]
    store.close()


def test_a_zsh_import_leaves_out_what_the_hook_recorded_too(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    store.record("make test", ts=T + 0.05, exit=0, session="zsh-1")
    path = tmp_path / ".zsh_history"
    path.write_text(f": {T}:3;make test\n: {T + 9}:0;git status\n: 999999999999:0;make test\n")
    result = store.import_file(path)
    assert (result.imported, result.recorded) == (2, 1)  # the impossible time is never matched
    assert [r.cmd for r in store.all_rows()] == ["make test", "git status", "make test"]
    store.close()


def test_a_paused_record_carries_nothing_of_the_line() -> None:
    """The `paused` record (docs/protocol.md): its time and session; a `cmd` in it is refused."""
    import pytest

    from calmd.protocol import ProtocolError, parse_request

    paused = parse_request({"id": 1, "op": "record", "paused": True, "ts": T + 0.5, "session": "fish-1"})
    assert (paused.paused, paused.cmd, paused.ts) == (True, "", T + 0.5)  # type: ignore[union-attr]
    with pytest.raises(ProtocolError, match="no 'cmd'"):
        parse_request({"id": 2, "op": "record", "paused": True, "cmd": "echo paused"})
    with pytest.raises(ProtocolError, match="'cmd'"):
        parse_request({"id": 3, "op": "record"})  # an ordinary record still needs its line
