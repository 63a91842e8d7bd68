"""The daemon's disk reads for COMP and the disk check (calmd/suggest/disk.py): bounded in time,
never on network mounts, fresh after a command ran."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from calmd.suggest import disk as disk_module
from calmd.suggest.disk import Disk, missing_argument
from calmd.suggest.frames import completions
from tests.support.waiting import wait_until


def test_listing_marks_directories_and_follows_invalidation(tmp_path: Path) -> None:
    (tmp_path / "build").mkdir()
    (tmp_path / "notes.md").write_text("x")
    disk = Disk(budget=5.0)
    assert disk.listing(str(tmp_path)) == ("build/", "notes.md")
    (tmp_path / "dist").mkdir()
    assert disk.listing(str(tmp_path)) == ("build/", "notes.md")  # trusted for the ttl
    disk.invalidate()  # a command was recorded
    assert disk.listing(str(tmp_path)) == ("build/", "dist/", "notes.md")
    assert disk.listing("relative/dir") is None and disk.listing(str(tmp_path / "nope")) is None
    assert completions("cd d", lister=disk.lister(str(tmp_path))) == ["dist/"]


def test_a_slow_directory_gives_no_comp_then_serves_a_later_keystroke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "notes.md").write_text("x")
    release = threading.Event()
    real = disk_module._list

    def slow(directory: str, max_entries: int) -> disk_module.Listing | None:
        release.wait(10)
        return real(directory, max_entries)

    monkeypatch.setattr(disk_module, "_list", slow)
    disk = Disk(budget=0.01)
    t0 = time.perf_counter()
    assert disk.listing(str(tmp_path)) is None
    assert time.perf_counter() - t0 < 5.0  # the keystroke did not wait for the disk (10 s)
    assert disk.exists(str(tmp_path), "notes.md") is None  # unknown: nothing is judged by it
    release.set()
    for _ in range(1000):  # the listing finishes in the background
        if disk.listing(str(tmp_path)) is not None:
            break
        time.sleep(0.005)
    assert disk.listing(str(tmp_path)) == ("notes.md",)
    assert disk.timeouts >= 2


def test_network_mounts_are_never_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mounts = [(str(tmp_path / "nfs"), "nfs4"), (str(tmp_path), "ext4"), ("/", "ext4")]
    monkeypatch.setattr(disk_module, "_read_mounts", lambda: sorted(mounts, key=lambda m: -len(m[0])))
    (tmp_path / "nfs").mkdir()
    (tmp_path / "nfs" / "file").write_text("x")
    disk = Disk(budget=5.0)
    assert disk.remote(str(tmp_path / "nfs" / "deep")) and not disk.remote(str(tmp_path))
    assert disk.listing(str(tmp_path / "nfs")) is None
    assert disk.exists(str(tmp_path / "nfs"), "missing.txt") is None
    assert disk.listing(str(tmp_path)) == ("nfs/",)


def test_missing_cd_targets_and_file_arguments(tmp_path: Path) -> None:
    (tmp_path / "build").mkdir()
    (tmp_path / "notes.md").write_text("x")
    disk, cwd = Disk(budget=5.0), str(tmp_path)
    assert missing_argument("cd dist", cwd, disk) == "dist/"
    assert missing_argument("cd build", cwd, disk) is None
    assert missing_argument("cd notes.md", cwd, disk) == "notes.md/"  # a file is no directory
    assert missing_argument("vim notes.txt", cwd, disk) == "notes.txt"
    assert missing_argument("vim -p notes.md", cwd, disk) is None
    assert missing_argument("python -m http.server", cwd, disk) is None
    assert missing_argument("cd $HOME", cwd, disk) is None and missing_argument("cd -", cwd, disk) is None
    assert missing_argument("make dist", cwd, disk) is None  # not a command that names a path
    assert missing_argument("cd build && vim x.md", cwd, disk) is None  # x.md would be in build/
    assert missing_argument("cat nope", "relative", disk) is None


def test_path_commands_are_read_once_in_the_background(tmp_path: Path) -> None:
    tool = tmp_path / "calmtool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "data.txt").write_text("not executable")
    disk = Disk()
    path = f"{tmp_path}:relative:/nonexistent"
    first = disk.commands(path)
    wait_until(lambda: disk.commands(path), "PATH's commands read in the background", every=0.005)
    assert first == () and disk.commands(path) == ("calmtool",)


def test_the_listing_queue_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    calls: list[str] = []

    def stuck(directory: str, max_entries: int) -> disk_module.Listing | None:
        calls.append(directory)
        release.wait(10)
        return None

    monkeypatch.setattr(disk_module, "_list", stuck)
    disk = Disk(budget=0.001)
    try:
        for i in range(100):  # a client naming a hundred folders while the disk hangs
            assert disk.listing(str(tmp_path / f"d{i}")) is None
        assert len(disk._pending) == disk_module.MAX_PENDING
    finally:
        release.set()
    wait_until(lambda: not disk._pending, "the queued listings to end", every=0.005)
    assert not disk._pending and len(calls) == disk_module.MAX_PENDING


def test_paths_in_the_home_are_checked_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cd ~/src/website/` where there is none, and `cd ~/src/info.txt` (a file): both junk."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "src" / "app").mkdir(parents=True)
    (tmp_path / "src" / "info.txt").write_text("x")
    disk, cwd = Disk(budget=5.0), "/"
    assert missing_argument("cd ~/src/website/", cwd, disk) == str(tmp_path / "src" / "website") + "/"
    assert missing_argument("cd ~/src/info.txt", cwd, disk) == str(tmp_path / "src" / "info.txt") + "/"
    assert missing_argument("cd ~/src/app", cwd, disk) is None
    assert missing_argument("cat ~/src/info.txt", cwd, disk) is None
    assert missing_argument("cd ~", cwd, disk) is None
