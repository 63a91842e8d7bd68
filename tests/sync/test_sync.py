"""calmd/sync: the sealed segments, export and import between stores that share a folder
(here the same folder, as an engine would leave it once it has copied every file)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.sync import export as export_module
from calmd.sync import wire as wire_module
from calmd.sync.config import SyncConfig, SyncError, read_config, write_config
from calmd.sync.machine import Sync
from calmd.sync.seal import (
    HEADER,
    Refused,
    frame,
    key_phrase,
    new_key,
    open_segment,
    parse_key_phrase,
    write_key,
)
from tests.support.waiting import HANG_S


@dataclass
class Machine:
    name: str
    data: Path
    store: HistoryStore
    sync: Sync

    def run(self) -> dict[str, object]:
        report = self.sync.run()
        assert report is not None
        return report.__dict__

    def commands(self) -> list[tuple[str, str]]:
        with self.store.reading() as db:
            return db.execute("SELECT cmd, host FROM commands ORDER BY ts, id").fetchall()

    def segments(self, folder: Path) -> list[Path]:
        return sorted(paths.sync_host_dir(folder, self.sync.host_id()).glob("*.calm"))


def machine(tmp: Path, name: str, folder: Path, key: bytes, mode: str = "both") -> Machine:
    data = tmp / name
    data.mkdir()
    store = HistoryStore(data / paths.HISTORY)
    write_config(paths.sync_config_path(data), SyncConfig(str(folder), mode))
    write_key(paths.sync_key_path(data), key)
    sync = Sync(store, data)
    sync.set_host_name(name)
    return Machine(name, data, store, sync)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Machine, Machine, Path]:
    folder = tmp_path / "shared"
    folder.mkdir()
    key = new_key()
    return machine(tmp_path, "laptop", folder, key), machine(tmp_path, "desktop", folder, key), folder


def plain_texts(m: Machine, folder: Path) -> str:
    """Everything this machine's segments say, opened with the key (what someone with it reads)."""
    key = m.sync.key()
    out = []
    for seg in m.segments(folder):
        opened = open_segment(seg.read_bytes(), key, m.sync.host_id(), int(seg.stem))
        out += [str(r) for p in opened.payloads for r in p["records"]]
    return "\n".join(out)


def test_the_key_travels_as_a_phrase_and_a_typo_is_caught() -> None:
    key = new_key()
    phrase = key_phrase(key)
    assert phrase.startswith("calm-") and len(phrase.replace("-", "")) == 60
    assert parse_key_phrase(phrase) == key
    assert parse_key_phrase("  " + phrase.upper().replace("-", " ") + "\n") == key  # case, spaces
    wrong = phrase[:-1] + ("a" if phrase[-1] != "a" else "b")
    with pytest.raises(SyncError, match="mistyped"):
        parse_key_phrase(wrong)
    with pytest.raises(SyncError, match="not a calm sync key"):
        parse_key_phrase("correct horse battery staple")


def test_a_record_made_on_one_machine_is_stored_on_the_other_once(
    pair: tuple[Machine, Machine, Path],
) -> None:
    laptop, desktop, folder = pair
    laptop.store.record("make deploy", cwd="/src/app", exit=0, session="s1", ts=1000.0, duration=2.5)
    laptop.store.record("git push", cwd="/src/app", exit=0, session="s1", ts=1001.0)
    desktop.store.record("htop", session="d1", ts=1002.0)
    assert laptop.run()["exported"] == 2
    assert desktop.run()["imported"] == 2 and desktop.run()["imported"] == 0
    assert laptop.run()["imported"] == 1
    assert desktop.commands() == [("make deploy", "laptop"), ("git push", "laptop"), ("htop", "")]
    assert laptop.commands() == [("make deploy", ""), ("git push", ""), ("htop", "desktop")]
    with desktop.store.reading() as db:
        sql = "SELECT cwd, exit, duration, session, source FROM commands WHERE cmd = 'make deploy'"
        row = db.execute(sql).fetchone()
    assert row == ("/src/app", 0, 2.5, f"{laptop.sync.host_id()}:s1", "shell")
    # an engine's conflict copy and a stray file beside the segments are never read
    seg = laptop.segments(folder)[0]
    shutil.copy(seg, seg.with_name("00000001.sync-conflict-20250101-000000-ABCDEFG.calm"))
    (folder / "notes.txt").write_text("hello")
    laptop.store.record("ls", session="s1", ts=1003.0)
    laptop.run()
    assert desktop.run()["imported"] == 1 and desktop.run()["refused"] == []
    assert [c for c, _ in desktop.commands()].count("make deploy") == 1
    # private: 0700 folders, 0600 files
    own = paths.sync_host_dir(folder, laptop.sync.host_id())
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in laptop.segments(folder))
    # the folder holds nothing readable
    raw = b"".join(p.read_bytes() for p in laptop.segments(folder))
    assert b"make deploy" not in raw and b"/src/app" not in raw and b"laptop" not in raw


def test_a_forget_travels_and_the_text_leaves_the_folder(pair: tuple[Machine, Machine, Path]) -> None:
    laptop, desktop, folder = pair
    laptop.store.record("echo hunter2x", session="s1", ts=1000.0)
    laptop.store.record("ls", session="s1", ts=1001.0)
    laptop.run()
    [old] = laptop.segments(folder)
    old_copy = old.read_bytes()
    desktop.run()
    assert "echo hunter2x" in [c for c, _ in desktop.commands()]
    assert "hunter2x" in plain_texts(laptop, folder)
    # forgotten on the desktop: the laptop deletes it too and writes new segments without it
    assert desktop.store.forget(lambda cmd: "hunter2x" in cmd) == 1
    assert desktop.run()["forgets_sent"] == 1
    report = laptop.run()
    assert report["forgotten"] == 1 and report["rebuilt"]
    assert [c for c, _ in laptop.commands()] == ["ls"]
    [new] = laptop.segments(folder)
    assert new.name > old.name  # a new file: no name ever holds two versions
    assert "hunter2x" not in plain_texts(laptop, folder)
    desktop.run()  # reads the new segment (its manifest: the old one is replaced)
    # the old segment put back (an engine that does not carry deletions, or someone replaying it):
    # skipped unread, counted, and what it holds never comes back
    old.write_bytes(old_copy)
    assert desktop.run()["refused"] == []
    assert desktop.sync.describe()["superseded"] == 1
    assert [c for c, _ in desktop.commands()] == ["ls"]
    # ... nor under a newer number: its header names the number it was sealed as
    stray = old.with_name("00000099.calm")
    stray.write_bytes(old_copy)
    [(path, why)] = desktop.run()["refused"]
    assert path == str(stray) and why.startswith("misplaced")
    stray.unlink()
    assert [c for c, _ in desktop.commands()] == ["ls"]
    # a third machine that joins later never gets it either
    third = machine(folder.parent, "server", folder, laptop.sync.key())
    laptop.sync.run()  # its segments as they should be again
    third.run()
    assert "echo hunter2x" not in [c for c, _ in third.commands()]
    assert "ls" in [c for c, _ in third.commands()]


def test_a_forget_of_a_record_not_yet_imported_still_wins(pair: tuple[Machine, Machine, Path]) -> None:
    laptop, desktop, folder = pair
    laptop.store.record("echo secret-ish", session="s1", ts=1.0)
    laptop.run()
    seg = laptop.segments(folder)[0]
    held_back = seg.read_bytes()  # the engine has not copied it to the desktop yet
    laptop.store.forget(lambda cmd: "secret-ish" in cmd)
    laptop.run()
    # the forget arrives first (the rewritten segment), then the old copy, late
    desktop.run()
    with desktop.store.reading() as db:
        assert db.execute("SELECT COUNT(*) FROM sync_forgotten").fetchone()[0] == 1
    seg.write_bytes(held_back)
    desktop.run()
    assert desktop.commands() == []


def test_a_flipped_byte_is_refused_whole_and_counted(pair: tuple[Machine, Machine, Path]) -> None:
    laptop, desktop, folder = pair
    for i in range(5):
        laptop.store.record(f"echo {i}", session="s", ts=float(i))
    laptop.run()
    seg = laptop.segments(folder)[0]
    good = seg.read_bytes()
    bad = bytearray(good)
    bad[HEADER.size + 40] ^= 0x01
    seg.write_bytes(bad)
    report = desktop.run()
    assert len(report["refused"]) == 1 and "tampered" in report["refused"][0][1]
    assert desktop.commands() == []
    status = desktop.sync.describe()
    assert status["refused"]["count"] == 1 and "tampered" in status["refused"]["files"][0]["reason"]
    assert desktop.run()["refused"] == []  # said once, not at every run
    seg.write_bytes(good)  # the engine brings the good copy
    assert desktop.run()["imported"] == 5
    assert desktop.sync.describe()["refused"]["files"] == []


def test_truncated_foreign_and_misplaced_files_are_refused(pair: tuple[Machine, Machine, Path]) -> None:
    laptop, desktop, folder = pair
    laptop.store.record("uptime", session="s", ts=1.0)
    laptop.run()
    seg = laptop.segments(folder)[0]
    good = seg.read_bytes()
    seg.write_bytes(good[:-7])  # half copied
    assert "truncated" in desktop.run()["refused"][0][1]
    # sealed with another key: a foreign file
    stranger = machine(folder.parent, "stranger", folder.parent / "elsewhere", new_key())
    (folder.parent / "elsewhere").mkdir()
    stranger.store.record("whoami", session="x", ts=2.0)
    stranger.run()
    foreign = stranger.segments(folder.parent / "elsewhere")[0]
    dest = paths.sync_segment(folder, stranger.sync.host_id(), 1)
    dest.parent.mkdir(mode=0o700)
    shutil.copy(foreign, dest)
    # the laptop's segment put where its second one would be
    seg.write_bytes(good)
    shutil.copy(seg, seg.with_name("00000003.calm"))
    reasons = sorted(why for _, why in desktop.run()["refused"])
    assert len(reasons) == 2
    assert reasons[0].startswith("misplaced") and reasons[1].startswith("sealed with another key")
    assert [c for c, _ in desktop.commands()] == ["uptime"]


def test_segments_arriving_late_or_out_of_order(pair: tuple[Machine, Machine, Path]) -> None:
    laptop, desktop, folder = pair
    for i in range(4):  # each export seals a new segment
        laptop.store.record(f"step {i}", session="s", ts=float(i))
        laptop.run()
    segs = laptop.segments(folder)
    assert len(segs) == 4
    held = {p: p.read_bytes() for p in segs}
    for p in segs[:3]:
        p.unlink()  # only the newest has arrived
    desktop.run()
    assert [c for c, _ in desktop.commands()] == ["step 3"]
    for p in reversed(segs[:3]):  # then the others, newest first
        p.write_bytes(held[p])
        desktop.run()
    assert [c for c, _ in desktop.commands()] == ["step 0", "step 1", "step 2", "step 3"]


# ----------------------------------------------------------------------- what an engine can do to the files


def digests(folder: Path) -> dict[str, bytes]:
    return {str(p): hashlib.sha256(p.read_bytes()).digest() for p in sorted(folder.glob("*/*.calm"))}


@pytest.mark.parametrize(
    "revert", ["older-segment-same-mtime", "first-chunk-older-mtime", "byte-in-place-same-mtime", "deleted"]
)
def test_an_engine_reverting_a_segment_loses_nothing(
    pair: tuple[Machine, Machine, Path], revert: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """What `rsync --update` did when segments grew in place (two versions within one second: the
    older copied over the newer, the records in it taken as sent), and what any engine can do to a
    file: put older bytes under its name (in place, its mtime kept or set back), cut it back to its
    first chunk, change a byte in place (the same size, inode and mtime: only the ctime tells), delete
    it. The reader refuses what is not whole and authentic; the next export of
    the machine that wrote it finds it not as written and seals its records again, in a new file."""
    monkeypatch.setattr(wire_module, "CHUNK_RECORDS", 1)  # a chunk per record: segments of several chunks
    laptop, desktop, folder = pair
    laptop.store.record("make build", session="s", ts=1.0)
    laptop.run()
    laptop.store.record("make test", session="s", ts=2.0)
    laptop.store.record("make deploy", session="s", ts=3.0)
    laptop.run()
    first, second = laptop.segments(folder)
    written = second.read_bytes()
    st = second.stat()
    if revert == "older-segment-same-mtime":
        second.write_bytes(first.read_bytes())  # in place: the same inode
        os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif revert == "first-chunk-older-mtime":
        _, chunks = frame(written)
        second.write_bytes(written[: chunks[1][0]])  # a whole, authentic first chunk, and no more
        os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    elif revert == "byte-in-place-same-mtime":
        with open(second, "r+b") as f:
            f.seek(len(written) - 5)
            f.write(bytes([written[-5] ^ 0x20]))
        os.utime(second, ns=(st.st_atime_ns, st.st_mtime_ns))
        now = second.stat()
        assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    else:
        second.unlink()
    reverted = second.read_bytes() if second.exists() else b""
    report = desktop.run()
    assert [c for c, _ in desktop.commands()] == ["make build"]
    if reverted:
        [(path, why)] = report["refused"]
        assert path == str(second)
        expected = {"older": "misplaced", "first": "truncated", "byte": "tampered"}[revert.split("-")[0]]
        assert why.startswith(expected), why
    caplog.clear()
    report = laptop.run()
    assert report["healed"] == 1 and report["exported"] == 0
    [line] = [r.getMessage() for r in caplog.records if "not as it wrote them" in r.getMessage()]
    assert second.name in line and "(2 records)" in line
    assert laptop.sync.describe()["healed"] == 1
    assert not second.exists() and len(laptop.segments(folder)) == 2  # its records are in a new file
    assert desktop.run()["refused"] == []
    assert [c for c, _ in desktop.commands()] == ["make build", "make test", "make deploy"]
    assert desktop.sync.describe()["refused"]["files"] == []
    if reverted:  # the engine brings the bad copy back: skipped unread, nothing sealed again
        second.write_bytes(reverted)
        assert desktop.run()["refused"] == [] and desktop.sync.describe()["superseded"] == 1
        assert laptop.run()["healed"] == 0
    laptop.store.record("make clean", session="s", ts=4.0)
    assert laptop.run()["exported"] == 1
    desktop.run()
    assert [c for c, _ in desktop.commands()] == ["make build", "make test", "make deploy", "make clean"]


def test_small_segments_are_merged_and_each_record_is_stored_once(
    pair: tuple[Machine, Machine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each export seals a new segment; at COMPACT_SEGMENTS small ones the next export merges them
    into a new one and deletes them. A reader that read the small ones, one that sees only the
    merged one, and one that still sees both (an engine that has not carried the deletions) each
    store every record once."""
    monkeypatch.setattr(export_module, "COMPACT_SEGMENTS", 4)
    laptop, desktop, folder = pair
    for i in range(4):
        laptop.store.record(f"step {i}", session="s", ts=float(i))
        laptop.run()
    small = {p: p.read_bytes() for p in laptop.segments(folder)}
    assert len(small) == 4
    desktop.run()  # it has read the four small ones
    laptop.store.record("step 4", session="s", ts=4.0)
    report = laptop.run()
    assert report["merged"] == 4 and report["exported"] == 1
    [merged] = laptop.segments(folder)
    assert merged.name == "00000005.calm" and plain_texts(laptop, folder).count("step ") == 5
    assert desktop.run()["imported"] == 1  # the new one; the others are here already
    fresh = machine(folder.parent, "server", folder, laptop.sync.key())
    assert fresh.run()["imported"] == 5 and fresh.sync.describe()["superseded"] == 0
    for p, data in small.items():  # the engine puts the small ones back
        p.write_bytes(data)
    late = machine(folder.parent, "backup", folder, laptop.sync.key())
    assert late.run()["imported"] == 5 and late.sync.describe()["superseded"] == 4
    for m in (desktop, fresh, late):
        assert [c for c, _ in m.commands()] == [f"step {i}" for i in range(5)]
        assert m.run()["imported"] == 0
    # the number of this machine's files stays bounded however many exports it makes
    for p in small:
        p.unlink()
    for i in range(5, 25):
        laptop.store.record(f"step {i}", session="s", ts=float(i))
        laptop.run()
        assert len(laptop.segments(folder)) <= 4
    desktop.run()
    assert [c for c, _ in desktop.commands()] == [f"step {i}" for i in range(25)]


def test_an_export_cut_short_between_two_segments_drops_nothing(
    pair: tuple[Machine, Machine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine that dies between two segments of one export (a merge here): the segments it wrote
    still list those they were to replace as live, so a reader reads them; the next export writes
    it all again and deletes the segment left behind."""
    monkeypatch.setattr(wire_module, "CHUNK_RECORDS", 1)
    monkeypatch.setattr(export_module, "SEGMENT_BYTES", 1)  # a segment per chunk
    monkeypatch.setattr(export_module, "COMPACT_SEGMENTS", 3)
    laptop, desktop, folder = pair
    for i in range(3):
        laptop.store.record(f"step {i}", session="s", ts=float(i))
        laptop.run()
    assert len(laptop.segments(folder)) == 3
    laptop.store.record("step 3", session="s", ts=3.0)
    real = export_module.atomic_write
    calls: list[Path] = []

    def dies_at_the_second(path: Path, **kwargs: Any) -> Any:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(5, "the machine died")
        return real(path, **kwargs)

    monkeypatch.setattr(export_module, "atomic_write", dies_at_the_second)
    with pytest.raises(OSError, match="died"):
        laptop.run()
    monkeypatch.setattr(export_module, "atomic_write", real)
    left = laptop.segments(folder)
    assert [p.name for p in left] == [f"0000000{i}.calm" for i in range(1, 5)]  # the first of the merge
    desktop.run()
    assert [c for c, _ in desktop.commands()] == ["step 0", "step 1", "step 2"]
    assert laptop.run()["merged"] == 3
    assert left[-1] not in laptop.segments(folder) and not set(left[:3]) & set(laptop.segments(folder))
    desktop.run()
    assert [c for c, _ in desktop.commands()] == [f"step {i}" for i in range(4)]


def test_no_file_name_ever_holds_two_versions(
    pair: tuple[Machine, Machine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a whole life (exports, merges, a forget of each machine's records, a file lost and
    sealed again, a new key), every name in the folder has only ever held one content."""
    monkeypatch.setattr(export_module, "COMPACT_SEGMENTS", 3)
    laptop, desktop, folder = pair
    seen: dict[str, bytes] = {}

    def rounds(n: int = 1) -> None:
        for _ in range(n):
            laptop.run()
            desktop.run()
            for name, digest in digests(folder).items():
                assert seen.setdefault(name, digest) == digest, f"{name} was written twice"

    for i in range(8):
        laptop.store.record(f"laptop {i}", session="s", ts=float(i))
        desktop.store.record(f"desktop {i}", session="d", ts=float(i) + 0.5)
        rounds()
    laptop.store.forget(lambda cmd: cmd == "laptop 3")  # its own: the laptop writes anew
    desktop.store.forget(lambda cmd: cmd == "laptop 5")  # the laptop's, on the desktop
    rounds(2)
    laptop.segments(folder)[0].unlink()  # lost: sealed again
    rounds()
    fresh = new_key()
    write_key(paths.sync_key_path(laptop.data), fresh)
    write_key(paths.sync_key_path(desktop.data), fresh)
    rounds(2)
    expected = sorted({f"laptop {i}" for i in range(8)} - {"laptop 3", "laptop 5"}
                      | {f"desktop {i}" for i in range(8)})  # fmt: skip
    for m in (laptop, desktop):
        assert sorted(c for c, _ in m.commands()) == expected
    assert len(seen) > 10


def test_a_number_is_never_used_twice_even_after_a_restored_store(
    pair: tuple[Machine, Machine, Path], tmp_path: Path
) -> None:
    """A store restored from a backup would give again the segment and record numbers it gave
    since; the segments sealed since are in the folder and authenticate, so the next segment and
    record go past theirs (a machine that read them stores the new record too). A file planted
    under a high number that does not open as this machine's moves nothing."""
    laptop, desktop, folder = pair
    laptop.store.record("uptime", session="s", ts=1.0)
    laptop.run()
    backup = tmp_path / "backup.sqlite3"
    with sqlite3.connect(backup) as copy, laptop.store.reading() as db:
        db.backup(copy)
    for i in range(2):
        laptop.store.record(f"after the backup {i}", session="s", ts=2.0 + i)
        laptop.run()
    desktop.run()
    assert [p.name for p in laptop.segments(folder)] == ["00000001.calm", "00000002.calm", "00000003.calm"]
    planted = paths.sync_segment(folder, laptop.sync.host_id(), 99_999_990)
    planted.write_bytes(b"CALMSYN2" + bytes(100))
    before = digests(folder)
    laptop.store.close()
    shutil.copy(backup, laptop.store.path)
    store = HistoryStore(laptop.store.path)
    restored = Machine("laptop", laptop.data, store, Sync(store, laptop.data))
    restored.store.record("after the restore", session="s", ts=9.0)
    restored.run()
    names = [p.name for p in restored.segments(folder)]
    assert "00000004.calm" in names and "99999991.calm" not in names
    after = digests(folder)
    assert all(after[name] == digest for name, digest in before.items() if name in after)
    desktop.run()
    assert [c for c, _ in desktop.commands()] == ["uptime", "after the backup 0", "after the backup 1",
                                                   "after the restore"]  # fmt: skip


def test_rsync_update_both_ways_without_delete(tmp_path: Path) -> None:
    """The engine of the bug report: `rsync -a --update` from each folder to the other, as a cron
    job does (no --delete: it would delete the other side's new files). Two exports within one
    second, and the segments a machine replaced coming back from the other side, forever."""
    from tests.support.tools import need

    need("rsync")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    key = new_key()
    laptop, desktop = machine(tmp_path, "laptop", a, key), machine(tmp_path, "desktop", b, key)

    def engine() -> None:
        for src, dst in ((a, b), (b, a)):
            subprocess.run(["rsync", "-a", "--update", f"{src}/", f"{dst}/"], check=True, capture_output=True,
                           timeout=HANG_S)  # fmt: skip

    desktop.run()  # an empty history: a segment that says the desktop is there
    engine()
    desktop.store.record("htop", session="d", ts=1.0)
    desktop.run()  # within the same second
    engine()
    laptop.run()
    assert laptop.commands() == [("htop", "desktop")]
    laptop.store.record("make deploy", session="s", ts=2.0)
    laptop.store.record("make test", session="s", ts=3.0)
    laptop.run()
    engine()
    desktop.run()
    old = {p.name for p in laptop.segments(a)}
    desktop.store.forget(lambda cmd: cmd == "make deploy")
    desktop.run()
    engine()
    assert laptop.run()["rebuilt"]
    engine()
    assert old <= {p.name for p in laptop.segments(a)}  # its replaced segments are back
    for _ in range(3):
        engine()
        assert laptop.run()["healed"] == 0
        engine()
        report = desktop.run()
        assert report["refused"] == [] and report["healed"] == 0
    assert desktop.sync.describe()["superseded"] == len(old)
    assert [c for c, _ in desktop.commands()] == ["htop", "make test"]
    assert [c for c, _ in laptop.commands()] == ["htop", "make test"]


def test_receive_only_and_share_only(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    key = new_key()
    server = machine(tmp_path, "server", folder, key, mode="receive")
    laptop = machine(tmp_path, "laptop", folder, key, mode="send")
    server.store.record("journalctl -f", session="a", ts=1.0)
    laptop.store.record("ssh server", session="b", ts=2.0)
    server.run()
    laptop.run()
    server.run()
    laptop.run()
    assert not paths.sync_host_dir(folder, server.sync.host_id()).exists()  # it shares nothing
    assert [c for c, _ in server.commands()] == ["journalctl -f", "ssh server"]
    assert [c for c, _ in laptop.commands()] == ["ssh server"]  # it takes nothing


def test_what_this_machine_would_refuse_is_not_stored_and_clocks_do_not_matter(
    pair: tuple[Machine, Machine, Path],
) -> None:
    laptop, desktop, _ = pair
    # a row an older calmd let through (the detector has learnt since): written past the checks
    with laptop.store.writing() as db:
        token = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
        db.execute("INSERT INTO commands (ts, cmd) VALUES (5, ?)", (f"export GITHUB_TOKEN={token}",))
    laptop.store.record("date", session="s", ts=4e10)  # a clock far ahead
    laptop.store.record("cal", session="s", ts=10.0)
    laptop.run()
    desktop.run()
    with desktop.store.reading() as db:
        rows = db.execute("SELECT cmd, ts FROM commands ORDER BY cmd").fetchall()
    assert [c for c, _ in rows] == ["cal", "date"]
    import time

    assert dict(rows)["date"] < time.time() + 2 * 86400  # kept, at most a day ahead
    assert desktop.store.counter("dropped_secrets") == 1


def test_a_record_with_an_impossible_time_is_kept_without_it_and_counted(
    pair: tuple[Machine, Machine, Path],
) -> None:
    """Times from another machine pass the bounds the imports of history files pass (recorded.valid_time:
    1970 to 2100): a record that came with another is kept, timed by the record before it in its
    segment (the first one: when the segment was sealed), and counted once, however often read."""
    import math
    import time

    from calmd.cli.sync import status_lines
    from calmd.sync.wire import parse_record

    laptop, desktop, _ = pair
    # as an older calmd's store holds them (a zsh import of `: 999999999999:0;whoami`, a clock at -5)
    with laptop.store.writing() as db:
        db.executemany("INSERT INTO commands (ts, session, cmd) VALUES (?, 's', ?)",
                       [(-5.0, "uptime"), (1000.0, "ls"), (999999999999.0, "whoami"), (-5.0, "pwd"),
                        (1002.0, "date")])  # fmt: skip
    laptop.run()
    started = time.time()
    report = desktop.run()
    assert report["imported"] == 5 and report["bad_times"] == 3 and report["refused"] == []
    with desktop.store.reading() as db:
        times = dict(db.execute("SELECT cmd, ts FROM commands").fetchall())
    assert (times["ls"], times["whoami"], times["pwd"], times["date"]) == (1000.0, 1000.0, 1000.0, 1002.0)
    assert started - 60 <= times["uptime"] <= time.time()  # the first: when its segment was sealed
    assert desktop.store.counter("sync_bad_times") == 3
    with desktop.store.writing() as db:  # read it all again: stored once, counted once
        db.execute("DELETE FROM sync_files")
    assert desktop.run()["imported"] == 0 and desktop.store.counter("sync_bad_times") == 3
    status = desktop.sync.describe()
    assert status["bad_times"] == 3
    assert "5 received (3 with an impossible time: kept without it)" in "\n".join(status_lines(status))
    # what a segment may carry: a number that is no time is kept without it; no number is malformed
    fields = [7, 0.0, "s", "/", "", "ls", 0, None, "", "", "shell"]
    for impossible in (math.nan, math.inf, -1.0, 4_102_444_801, 10**18):
        record = parse_record([*fields[:1], impossible, *fields[2:]], now=2e9)
        assert record.ts is None and record.bad_time, impossible
    assert parse_record([*fields[:1], 4_102_444_800, *fields[2:]], now=2e9).ts == 2e9 + 86400  # a day ahead
    for wrong in ("1700000000", None, True):
        with pytest.raises(Refused, match="time is not a number"):
            parse_record([*fields[:1], wrong, *fields[2:]], now=2e9)


def test_a_new_key_rewrites_the_segments_and_the_old_key_reads_nothing(
    pair: tuple[Machine, Machine, Path],
) -> None:
    laptop, desktop, _ = pair
    laptop.store.record("vim notes", session="s", ts=1.0)
    laptop.run()
    fresh = new_key()
    write_key(paths.sync_key_path(laptop.data), fresh)
    assert laptop.run()["rebuilt"]
    refused = desktop.run()["refused"]
    assert refused and "another key" in refused[0][1] and desktop.commands() == []
    write_key(paths.sync_key_path(desktop.data), fresh)
    assert desktop.run()["imported"] == 1


def test_status_says_it_all(pair: tuple[Machine, Machine, Path]) -> None:
    laptop, desktop, folder = pair
    laptop.store.record("top", session="s", ts=1.0)
    laptop.store.record("free -h", session="s", ts=2.0)
    laptop.run()
    desktop.run()
    status = desktop.sync.describe()
    assert status["enabled"] and status["folder"] == str(folder) and status["mode"] == "both"
    assert status["host"] == {"id": desktop.sync.host_id(), "name": "desktop"}
    [host] = status["hosts"]
    assert (host["name"], host["id"], host["last_segment"], host["records_in"]) == (
        "laptop", laptop.sync.host_id(), 1, 2)  # fmt: skip
    assert host["last_sealed"] > 0
    assert status["records_in"] == 2 and status["refused"] == {"count": 0, "now": 0, "files": []}
    assert laptop.sync.describe()["records_out"] == 2 and laptop.sync.describe()["pending_out"] == 0
    laptop.store.record("df", session="s", ts=3.0)
    assert laptop.sync.describe()["pending_out"] == 1


def test_leaving_sync_forgets_this_machine_only_and_keeps_its_numbers(
    pair: tuple[Machine, Machine, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `calm forget --all` does to sync (calmd/sync/leave.py `leave`; the daemons' test is
    tests/sync/test_sync_daemons.py): every row deleted with no forget to send, what sync learnt
    cleared, the numbers it gave and the forgets made before kept; a forget not sent yet is said
    before anything is deleted; a sync in progress holds it off, with nothing deleted."""
    from calmd.cli import calm_main
    from calmd.sync.config import sync_lock
    from calmd.sync.leave import leave, sync_holdings

    laptop, desktop, folder = pair
    laptop.store.record("git pull", session="l", ts=1.0)
    desktop.store.record("htop", session="d", ts=2.0)
    desktop.store.record("echo pa55word-typed", session="d", ts=3.0)
    laptop.run()
    desktop.run()
    laptop.run()  # each has all three
    desktop.store.forget(lambda cmd: "pa55word" in cmd)  # made here, not sent yet
    with desktop.store.reading() as db:
        kept = "('sync_host_id', 'sync_next_id', 'sync_next_seq')"
        numbers = dict(db.execute(f"SELECT key, value FROM meta WHERE key IN {kept}").fetchall())
    holdings = sync_holdings(desktop.data, desktop.store)
    assert holdings.unsent_forgets == 1 and holdings.others == 1 and holdings.segments == 1
    assert holdings.share == folder / desktop.sync.host_id()
    monkeypatch.setenv("CALM_HOME", str(desktop.data))
    monkeypatch.setenv("CALM_CACHE", str(desktop.data.parent / "cache"))
    assert calm_main(["forget", "--all", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "2 stored commands" in said and paths.SYNC_KEY in said and "this machine's share" in said
    assert "1 forget made here not sent to your other machines yet" in said

    with sync_lock(desktop.data) as held:  # a sync in progress (calmd's)
        assert held
        with pytest.raises(SyncError, match=r"held .*sync\.lock for 0\.2 s: nothing was deleted"):
            leave(desktop.data, desktop.store, holdings, wait_s=0.2)
    assert desktop.store.count() == 2 and paths.sync_key_path(desktop.data).exists()
    assert leave(desktop.data, desktop.store, holdings) == (2, None)
    assert desktop.store.count() == 0 and holdings.share is not None and not holdings.share.exists()
    assert not paths.sync_config_path(desktop.data).exists()
    assert not paths.sync_key_path(desktop.data).exists()
    with desktop.store.reading() as db:
        left = dict(db.execute("SELECT key, value FROM meta WHERE key LIKE 'sync%'").fetchall())
        tables = [db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                  for t in ("sync_own", "sync_hosts", "sync_files", "sync_refused")]  # fmt: skip
        forgotten = db.execute("SELECT sent FROM sync_forgotten").fetchall()
    assert left == {**numbers, "sync_host_name": "desktop"} and tables == [0, 0, 0, 0]
    assert forgotten == [(0,)]  # the password's forget, still to send if it joins again; none for --all
    assert laptop.run()["forgotten"] == 0  # the laptop keeps all it had
    assert {c for c, _ in laptop.commands()} == {"git pull", "htop", "echo pa55word-typed"}


def test_a_bad_config_or_missing_key_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / paths.SYNC_CONFIG
    config.write_text('{"format": "calm-sync-config", "folder": "relative/path"}')
    with pytest.raises(SyncError, match=r"sync\.json: field 'folder' must be an absolute path"):
        read_config(config)
    config.write_text("{")
    with pytest.raises(SyncError, match="cannot read the sync config"):
        read_config(config)
    store = HistoryStore(tmp_path / paths.HISTORY)
    write_config(config, SyncConfig(str(tmp_path)))
    with pytest.raises(SyncError, match="no sync key on this machine"):
        Sync(store, tmp_path).run()


def test_a_version_4_history_gains_the_sync_columns(tmp_path: Path) -> None:
    path = tmp_path / paths.HISTORY
    store = HistoryStore(path)
    store.record("make", session="a", exit=0)
    store.close()
    con = sqlite3.connect(path)  # as calmd with schema 4 left it
    con.executescript(
        "DROP INDEX commands_origin; DROP INDEX commands_unshared; DROP TABLE sync_forgotten;"
        "DROP TABLE sync_hosts; DROP TABLE sync_files; DROP TABLE sync_refused; DROP TABLE sync_own;"
        "ALTER TABLE commands DROP COLUMN host; ALTER TABLE commands DROP COLUMN origin;"
        "ALTER TABLE commands DROP COLUMN origin_id;"
        "UPDATE meta SET value = '4' WHERE key = 'schema_version';"
    )
    con.close()
    store = HistoryStore(path)
    store.record("ls", session="a", exit=0)
    with store.reading() as db:
        assert db.execute("SELECT cmd, host, origin, origin_id FROM commands ORDER BY id").fetchall() == [
            ("make", "", "", None), ("ls", "", "", None)]  # fmt: skip
    assert [r.cmd for r in store.all_rows()] == ["make", "ls"]


@pytest.mark.parametrize("version", [3, 4])
def test_the_views_read_an_older_history_as_it_is(
    tmp_path: Path, version: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`calm history` and `calm stats` read a store the daemon has not migrated yet (it does at
    its next start) without writing to it: its records are this machine's, of unknown duration
    when the schema had none."""
    from calmd.cli import calm_main
    from calmd.history import query

    path = tmp_path / paths.HISTORY
    store = HistoryStore(path)
    store.record("make", cwd="/src", session="a", exit=0, ts=1000.0, duration=1.5)
    store.close()
    con = sqlite3.connect(path)
    con.executescript(
        "DROP INDEX commands_origin; DROP INDEX commands_unshared; DROP TABLE sync_forgotten;"
        "DROP TABLE sync_hosts; DROP TABLE sync_files; DROP TABLE sync_refused; DROP TABLE sync_own;"
        "ALTER TABLE commands DROP COLUMN host; ALTER TABLE commands DROP COLUMN origin;"
        "ALTER TABLE commands DROP COLUMN origin_id;"
        + ("ALTER TABLE commands DROP COLUMN duration;" if version < 4 else "")
        + f"UPDATE meta SET value = '{version}' WHERE key = 'schema_version';"
    )
    con.close()
    before = path.read_bytes()
    for scanned in (True, False):  # SQLite's lines, then Python's (an older detector's store)
        if not scanned:
            with sqlite3.connect(path) as con:
                con.execute("UPDATE meta SET value = '1' WHERE key = 'detector_version'")
            before = path.read_bytes()
        assert calm_main(["history", "--db", str(path)]) == 0
        assert capsys.readouterr().out.endswith("  0  /src  make\n")  # no host column
        assert calm_main(["history", "--db", str(path), "--json", "--host"]) == 0
        [doc] = map(json.loads, capsys.readouterr().out.splitlines())
        assert doc["host"] == query.this_hostname()
        assert doc["duration"] == (1.5 if version >= 4 else None)
        assert calm_main(["stats", "--db", str(path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["hosts"] == [
            {"host": query.this_hostname(), "runs": 1, "failed": 0, "with_status": 1}]  # fmt: skip
        assert path.read_bytes() == before  # read as it is, never migrated here


def test_open_segment_refuses_a_header_alone_with_another_magic() -> None:
    with pytest.raises(Refused, match="not a calm sync segment"):
        open_segment(b"X" * HEADER.size, new_key(), "0" * 16, 1)


# --------------------------------------------------------------------------- the views of a synced history


def test_the_history_knows_where_each_record_came_from(pair: tuple[Machine, Machine, Path]) -> None:
    from calmd.history import query

    laptop, desktop, _ = pair
    laptop.store.record("make deploy", cwd="/src", exit=2, session="s", ts=1000.0)
    desktop.store.record("htop", cwd="/root", exit=0, session="d", ts=1001.0)
    laptop.run()
    desktop.run()
    db = query.open_read_only(desktop.store.path)
    this = query.this_host(db)
    assert this == "desktop"
    lines = query.history_lines(db, query.HistoryFilter(this_host=this), "plain", "/home/u")
    assert [line.split("  ")[-3:] for line in lines] == [
        ["laptop", "/src", "make deploy"], ["desktop", "/root", "htop"]]  # fmt: skip
    only = query.HistoryFilter(host="laptop", this_host=this)
    assert [json.loads(line)["cmd"] for line in query.history_lines(db, only, "json")] == ["make deploy"]
    here = query.HistoryFilter(host="", this_host=this)
    assert [json.loads(line)["host"] for line in query.history_lines(db, here, "json")] == ["desktop"]
    everything = query.HistoryFilter(this_host=this)
    assert query.per_host(db, everything) == [("desktop", 1, 0, 1), ("laptop", 1, 1, 1)]
    db.close()
    # on a machine with no other machine's records, `calm history` prints as it always did
    db = query.open_read_only(laptop.store.path)
    with laptop.store.writing() as raw:
        raw.execute("DELETE FROM commands WHERE host != ''")
    lines = query.history_lines(db, query.HistoryFilter(), "plain")
    assert [line.split("  ")[-3:] for line in lines] == [["2", "/src", "make deploy"]]
    db.close()


# A host's name is what that machine's segments say (a calmd there, or anything that holds the key),
# and the sync folder's name is any name: every view prints them by the one rule for text bound for
# a terminal (calmd/visible.py), as it prints a command (issue 30).
HOSTILE_HOST = "lap\x1b]0;PWNED-TITLE\x07top\x1b[2J\u202eevil\x9b2J"


@pytest.fixture
def hostile_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Machine, Machine, Path]:
    """A laptop named HOSTILE_HOST and a desktop, sharing a folder whose name holds an OSC 0 and a
    bidi override; each has recorded one command and read the other's."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "300")  # rich's width off a terminal: no cell folded
    folder = tmp_path / "shared\x1b]0;T\x07\u202e"
    folder.mkdir()
    key = new_key()
    laptop, desktop = machine(tmp_path, "laptop", folder, key), machine(tmp_path, "desktop", folder, key)
    laptop.sync.set_host_name(HOSTILE_HOST)
    laptop.store.record("make deploy", cwd="/src", exit=2, session="s", ts=1000.0)
    desktop.store.record("htop", cwd="/srv", exit=0, session="d", ts=1001.0)
    laptop.run()
    desktop.run()
    laptop.run()
    assert desktop.commands() == [("make deploy", HOSTILE_HOST), ("htop", "")]  # stored as it came
    assert laptop.commands() == [("make deploy", ""), ("htop", "desktop")]
    return laptop, desktop, folder


def assert_nothing_hidden(out: str) -> None:
    from calmd.visible import HIDDEN

    assert HIDDEN.search(out.replace("\n", "")) is None, repr(out)


@pytest.mark.parametrize("scanned", [True, False], ids=["sqlite-lines", "python-lines"])
def test_a_hosts_name_is_shown_escaped_in_history_and_stats(
    hostile_pair: tuple[Machine, Machine, Path], scanned: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the machine that imported the name and on the one that chose it (its own records show
    its name): `calm history`'s host column, --json, --host, `calm stats`'s machines table."""
    from calmd.cli import calm_main
    from calmd.visible import visible

    for m in hostile_pair[:2]:
        if not scanned:  # an older detector's store: Python makes the lines, row by row
            with m.store.writing() as db:
                db.execute("UPDATE meta SET value = '1' WHERE key = 'detector_version'")
        db_path = str(m.store.path)
        assert calm_main(["history", "--db", db_path]) == 0
        out = capsys.readouterr().out
        assert_nothing_hidden(out)
        lines = out.splitlines()
        assert len(lines) == 2
        # a line is one text: the host, folder and command escaped together
        assert lines[0].endswith(visible(f"  2  {HOSTILE_HOST}  /src  make deploy")), lines[0]
        assert lines[1].endswith("  0  desktop  /srv  htop"), lines[1]
        assert calm_main(["history", "--db", db_path, "--host", HOSTILE_HOST, "--commands"]) == 0
        assert capsys.readouterr().out == "make deploy\n"
        assert calm_main(["history", "--db", db_path, "--json"]) == 0
        out = capsys.readouterr().out
        assert_nothing_hidden(out)
        assert [(d["cmd"], d["host"]) for d in map(json.loads, out.splitlines())] == [
            ("make deploy", HOSTILE_HOST), ("htop", "desktop")]  # fmt: skip
        assert calm_main(["--no-color", "stats", "--db", db_path]) == 0
        out = capsys.readouterr().out
        assert_nothing_hidden(out)
        table = out[out.index("machines") : out.index("busiest hours")]
        rows = [line for line in table.splitlines() if line.startswith("│")]
        assert [row.split("│")[1].strip() for row in rows] == ["desktop", visible(HOSTILE_HOST)]
        assert len({len(row) for row in rows}) == 1  # the columns line up on the escaped name
        assert calm_main(["stats", "--db", db_path, "--json"]) == 0
        out = capsys.readouterr().out
        assert_nothing_hidden(out)
        assert sorted(h["host"] for h in json.loads(out)["hosts"]) == sorted(["desktop", HOSTILE_HOST])


def test_calm_sync_and_calmd_status_show_names_and_refusals_escaped(
    hostile_pair: tuple[Machine, Machine, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`calm sync`, `calm sync now` and `calmd status`'s sync part: the folder, this machine's and
    the others' names, a refused file's name (in the folder) and why."""
    from rich.console import Console

    from calmd.cli import calm_main
    from calmd.cli.status_view import status_table
    from calmd.visible import visible

    laptop, desktop, folder = hostile_pair
    monkeypatch.setenv("CALM_HOME", str(laptop.data))
    assert calm_main(["sync"]) == 0
    out = capsys.readouterr().out
    assert_nothing_hidden(out)
    assert visible(f"folder: {folder} (both, every 30 s)") in out.splitlines()
    assert visible(f"this machine: {HOSTILE_HOST} ({laptop.sync.host_id()}); key ") in out
    assert f"  desktop ({desktop.sync.host_id()}): segment 1, sealed " in out
    # the laptop's new segment with a flipped byte: refused on the desktop, its name said escaped
    laptop.store.record("ls", session="s", ts=1002.0)
    laptop.run()
    seg = laptop.segments(folder)[-1]
    bad = bytearray(seg.read_bytes())
    bad[HEADER.size + 40] ^= 0x01
    seg.write_bytes(bad)
    monkeypatch.setenv("CALM_HOME", str(desktop.data))
    assert calm_main(["sync", "now"]) == 1
    now = capsys.readouterr()
    assert_nothing_hidden(now.out + now.err)
    [refusal] = [line for line in now.err.splitlines() if line.startswith("refused ")]
    assert refusal.startswith(visible(f"refused {seg}: ")) and "tampered" in refusal
    assert calm_main(["sync"]) == 0
    out = capsys.readouterr().out
    assert_nothing_hidden(out)
    lines = out.splitlines()
    assert visible(f"folder: {folder} (both, every 30 s)") in lines
    assert visible(f"  {HOSTILE_HOST} ({laptop.sync.host_id()}): segment 1, sealed ") in out
    assert "refused files: 1 in all, 1 now" in lines and refusal.replace("refused ", "  ", 1) in lines
    # calmd status draws the same lines in its sync cell, one per line, escaped once
    status: dict[str, Any] = {
        "model": {}, "history": {"commands": 2, "dropped_secrets": 0, "since_last_training": 0},
        "latency_ms": {"first_p50": None, "first_p99": None, "done_p50": None, "done_p99": None},
        "requests": 0, "errors": 0, "uptime_s": 1.0, "version": "x", "protocol": 1,
        "sync": desktop.sync.describe(),
    }  # fmt: skip
    buffer = io.StringIO()
    Console(file=buffer, width=300, force_terminal=True, color_system="standard").print(status_table(status))
    drawn = buffer.getvalue()
    for raw in ("\x1b]", "\x07", "\x9b", "\u202e"):
        assert raw not in drawn
    for line in lines:
        assert line in drawn, line  # not joined into one line with `\n`, not escaped twice


def test_search_has_a_this_machine_mode(pair: tuple[Machine, Machine, Path]) -> None:
    from calmd.history import query
    from calmd.suggest.search import SearchIndex

    laptop, desktop, _ = pair
    laptop.store.record("kubectl get pods", session="s", ts=1.0)
    desktop.store.record("kubectl logs web", session="d", ts=2.0)
    laptop.run()
    desktop.run()
    index = SearchIndex()
    db = query.open_read_only(desktop.store.path)
    index.sync(db)
    db.close()
    everywhere = {r.cmd for r in index.search("kubectl", "global").results}
    assert everywhere == {"kubectl get pods", "kubectl logs web"}
    assert [r.cmd for r in index.search("kubectl", "host").results] == ["kubectl logs web"]


def test_suggestions_use_every_machine_with_this_ones_recency_first(
    pair: tuple[Machine, Machine, Path],
) -> None:
    from calmd.suggest.ranking import FEATURES, HistoryIndex

    laptop, desktop, _ = pair
    desktop.store.record("git status", session="d", ts=1.0)
    for i in range(30):  # the laptop's day, imported after the desktop's last command
        laptop.store.record(f"git log -{i}", session="s", ts=2.0 + i)
    laptop.run()
    desktop.run()
    index = HistoryIndex()
    index.sync(desktop.store)
    assert len(index) == 31
    pool = index.pool("git ", None)
    assert pool[0] == "git status" and "git log -29" in pool  # this machine's first, the others' too
    rows = index.features("git ", ["git status", "git log -29"], [])
    distance = FEATURES.index("log_distance")
    assert rows[0][distance] == 0.0  # still the latest command here, whatever the laptop ran since
    assert rows[1][distance] > 0.0
    assert rows[1][FEATURES.index("log_count")] > 0.0  # the laptop's runs count


def test_a_keystroke_during_a_sync_import_reads_a_bounded_share(
    pair: tuple[Machine, Machine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion while sync imports another machine's history waits for neither: the import
    commits a chunk's records at a time, the store free in between (as an import of a history file
    does), and a keystroke's sync of the history index (issue 30's bound: at most `budget` rows,
    up to the newest there is when it starts) reads a bounded share of them; the next keystrokes
    catch up, with the other machine's commands counted but this machine's recency first."""
    from calmd.suggest.ranking import HistoryIndex

    laptop, desktop, _ = pair
    monkeypatch.setattr(wire_module, "CHUNK_RECORDS", 50)  # 8 chunks, stored one after the other
    with laptop.store.writing() as db:
        db.executemany("INSERT INTO commands (ts, session, cmd) VALUES (?, 's', ?)",
                       [(1000.0 + i, f"make target{i}") for i in range(400)])  # fmt: skip
    laptop.run()
    desktop.store.record("make clean", session="d", ts=5000.0)
    index = HistoryIndex()
    assert index.sync(desktop.store, budget=30) == 1
    keystrokes: list[tuple[int, int]] = []  # (rows the keystroke read, rows in the store then)
    store_records = Sync._store_records

    def storing(self: Sync, host: str, name: str, records: list[Any]) -> tuple[int, int]:
        stored = store_records(self, host, name, records)
        keystrokes.append((index.sync(self.store, budget=30), self.store.count()))  # between two chunks
        return stored

    monkeypatch.setattr(Sync, "_store_records", storing)
    assert desktop.run()["imported"] == 400
    assert len(keystrokes) == 8 and all(read == 30 for read, _ in keystrokes)
    assert [there for _, there in keystrokes] == [1 + 50 * n for n in range(1, 9)]  # in chunks
    while index.sync(desktop.store, budget=30):  # the next keystrokes catch up
        pass
    assert len(index) == 401 and list(index.last) == ["make clean"]  # this machine's recency alone
    assert index.pool("make ", None)[0] == "make clean" and index.count["make target399"] == 1


def test_a_git_remote_as_the_engine(tmp_path: Path) -> None:
    from tests.support.tools import need

    need("git")
    remote = tmp_path / "calm-sync.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    key = new_key()
    machines = []
    for name in ("laptop", "desktop"):
        folder = tmp_path / f"{name}-folder"
        folder.mkdir()
        m = machine(tmp_path, name, folder, key)
        write_config(paths.sync_config_path(m.data), SyncConfig(str(folder), git=str(remote)))
        machines.append(m)
    laptop, desktop = machines
    laptop.store.record("git push --tags", session="s", ts=1.0)
    desktop.store.record("make release", session="d", ts=2.0)
    assert laptop.run()["git"] == ""
    assert desktop.run()["imported"] == 1
    assert laptop.run()["imported"] == 1
    assert [c for c, _ in desktop.commands()] == ["git push --tags", "make release"]
    assert [c for c, _ in laptop.commands()] == ["git push --tags", "make release"]
    # a forget travels through git too
    laptop.store.forget(lambda cmd: "release" in cmd)
    laptop.run()
    desktop.run()
    assert [c for c, _ in desktop.commands()] == ["git push --tags"]
    # an unreachable remote is one line in the report, never an exception
    nowhere = SyncConfig(str(tmp_path / "laptop-folder"), git=str(tmp_path / "nowhere.git"))
    write_config(paths.sync_config_path(laptop.data), nowhere)
    assert laptop.run()["git"].startswith("git fetch failed")
