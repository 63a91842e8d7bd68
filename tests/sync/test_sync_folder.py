"""The sync folder filled as an adversary would fill it (issue 39), met as a user meets it: `calm
sync ...` run as a process, each machine with its own HOME, one folder shared by all of them (as an
engine leaves it once it has copied every file). A segment sealed with the right key whose list of
live segments names only itself; a machine holding another key; 10,000 junk files named like
segments; `calm forget --all` with sync off; a name that is not UTF-8; the docs' git example run as
written. tests/sync/test_sync_daemons.py has the same folder cases with real daemons doing the work."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import msgpack
import pytest

from calmd.sync.seal import read_key, seal_segment
from tests.support.daemon import BIN, daemon_env
from tests.support.waiting import HANG_S

pytestmark = pytest.mark.slow  # processes: seconds each
REPO = Path(__file__).resolve().parents[2]


class Machine:
    """One machine: its HOME, and `calm` run there."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.home = root / name
        self.home.mkdir(mode=0o700)
        self.env = daemon_env(self.home, CALM_CACHE=str(root / "cache"))

    def calm(self, *args: str, stdin: str | None = None, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(BIN / "calm"), *args], env=self.env, input=stdin, capture_output=True,
                              text=True, timeout=HANG_S)  # fmt: skip
        if ok:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def record(self, *commands: str) -> None:
        """Commands as if typed here: a zsh history file imported (`calm import`)."""
        history = self.home / "history"
        history.write_text("".join(f": {1_700_000_000 + i}:0;{c}\n" for i, c in enumerate(commands)))
        self.calm("import", str(history))

    def commands(self) -> list[str]:
        return self.calm("history", "--commands").stdout.splitlines()

    def join(self, folder: Path, key_from: Machine | None = None) -> None:
        if key_from is not None:
            phrase = key_from.calm("sync", "key", "--show").stdout
            self.calm("sync", "key", "--import", "-", stdin=phrase)
        self.calm("sync", "--folder", str(folder), "--name", self.name)

    def share(self, folder: Path) -> Path:
        """This machine's sub-folder of the sync folder."""
        status = self.calm("sync").stdout
        host_id = re.search(r"this machine: .* \(([0-9a-f]{16})\)", status)
        assert host_id, status
        return folder / host_id.group(1)

    @property
    def key_path(self) -> Path:
        return self.home / "data" / "sync.key"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    shared = tmp_path / "folder"
    shared.mkdir(mode=0o700)
    return shared


def plant_manifest(share: Path, key: bytes, live: list[list[int]] | None = None) -> Path:
    """A segment past the share's newest, sealed with the key, its first chunk's list of live segments
    naming only itself (or `live`), and no record: what another program holding the key can write."""
    seq = max(int(p.stem) for p in share.glob("*.calm")) + 1
    first = {"v": 1, "name": "laptop", "sealed": time.time(), "records": [], "forgets": [],
             "live": live or [[seq, seq]]}  # fmt: skip
    path = share / f"{seq:08d}.calm"
    path.write_bytes(seal_segment(key, share.name, seq, [msgpack.packb(first, use_bin_type=True)]))
    return path


def test_a_list_of_segments_that_hides_the_others(tmp_path: Path, folder: Path) -> None:
    """The laptop's share holds three segments; a fourth, sealed with the key, lists only itself.
    A machine that joins receives every record all the same and says which machine's list hid them
    (exit 1); the laptop's next `calm sync now` finds the segment it never wrote, writes its list
    again past it and deletes it; the warning then goes, and a machine that joins after reads it
    all with no word. Before issue 39: 0 records, exit 0, no word; the laptop said only "restored
    from a backup?" and wrote nothing."""
    laptop, desktop, server = (Machine(tmp_path, n) for n in ("laptop", "desktop", "server"))
    laptop.join(folder)
    made = []
    for i in range(3):
        made += [f"make target{i}", f"git status {i}"]
        laptop.record(*made[-2:])
        laptop.calm("sync", "now")
    share = laptop.share(folder)
    assert sorted(p.name for p in share.glob("*.calm")) == [f"0000000{i}.calm" for i in (1, 2, 3)]
    planted = plant_manifest(share, read_key(laptop.key_path))

    desktop.join(folder, key_from=laptop)
    now = desktop.calm("sync", "now", ok=False)
    assert now.returncode == 1, now.stdout + now.stderr
    assert now.stdout.startswith("sent 0 records and 0 forgets; received 6 records and 0 forgets")
    [warning] = now.stderr.splitlines()
    assert warning.startswith(
        f"warning: laptop ({share.name}): its newest list of its segments (in "
        "00000004.calm) leaves out 3 segments still in the folder that held 6 records"
    )
    assert sorted(desktop.commands()) == sorted(made)
    status = desktop.calm("sync").stdout
    assert warning in status.splitlines()  # said until the laptop lists them again

    healed = laptop.calm("sync", "now")
    assert "found 1 segment sealed with this machine's key and id that it never wrote" in healed.stdout
    assert not planted.exists()
    assert sorted(p.name for p in share.glob("*.calm")) == ["00000001.calm", "00000002.calm", "00000003.calm",
                                                             "00000005.calm"]  # fmt: skip
    assert "1 found that it never wrote" in laptop.calm("sync").stdout
    again = desktop.calm("sync", "now")
    assert again.stderr == "" and "received 0 records" in again.stdout
    assert "warning" not in desktop.calm("sync").stdout
    server.join(folder, key_from=laptop)
    joined = server.calm("sync", "now")
    assert joined.stderr == "" and "received 6 records" in joined.stdout
    assert sorted(server.commands()) == sorted(made)


def test_a_key_that_reads_none_of_the_shares_is_refused(tmp_path: Path, folder: Path) -> None:
    """`calm sync --folder` on a machine whose key reads none of the shares in the folder: one line
    naming the key the shares are sealed with (its id) and this machine's, exit 1, sync stays off.
    With their key it joins. Before issue 39: "sync on", exit 0, and a share no one could read."""
    laptop, desktop = Machine(tmp_path, "laptop"), Machine(tmp_path, "desktop")
    laptop.join(folder)
    laptop.record("make all")
    laptop.calm("sync", "now")
    theirs = laptop.calm("sync", "key", "--show").stderr
    their_id = re.search(r"key id ([0-9a-f]{16})", theirs)
    assert their_id
    desktop.calm("sync", "key", "--new")
    mine = re.search(r"key id ([0-9a-f]{16})", desktop.calm("sync", "key", "--show").stderr)
    assert mine and mine.group(1) != their_id.group(1)
    refused = desktop.calm("sync", "--folder", str(folder), ok=False)
    assert refused.returncode == 1 and refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert line == (f"calm: error: {folder}: the other machines' shares there are sealed with key "
                    f"{their_id.group(1)} (1 machine), not this machine's ({mine.group(1)}): it could read "
                    "none of them, and they none of its. Bring their key (`calm sync key --show` on one of "
                    "them, `calm sync key --import` here), then run this again")  # fmt: skip
    phrase = laptop.calm("sync", "key", "--show").stdout
    assert phrase not in line and phrase.split("-")[1] not in line  # the id, never the key
    assert desktop.calm("sync").stdout.startswith("sync is off on this machine")
    assert [p.name for p in folder.iterdir()] == [laptop.share(folder).name]  # nothing written
    desktop.join(folder, key_from=laptop)
    desktop.calm("sync", "now")
    assert desktop.commands() == ["make all"]


def test_ten_thousand_junk_files_are_refused_once_counted_and_summarised(
    tmp_path: Path, folder: Path
) -> None:
    """10,000 files named like segments in a machine's sub-folder, none a segment. `calm sync now`
    refuses each (nothing imported), stores the refusals in a few transactions, and says a count and
    the first few, each once (not its log line and its own line: 20,000 lines before issue 39);
    `calm sync` says a count and the first few; the next run reads none of them again and says
    nothing of them. Only a hang reaches the ceilings."""
    desktop = Machine(tmp_path, "desktop")
    desktop.join(folder)
    junk = folder / "0123456789abcdef"
    junk.mkdir()
    for i in range(1, 10_001):
        (junk / f"{i:08d}.calm").write_bytes(b"CALMSYN2" + os.urandom(60))
    started = time.monotonic()
    now = desktop.calm("sync", "now", ok=False)
    assert time.monotonic() - started < 60
    assert now.returncode == 1
    assert now.stdout == ("sent 0 records and 0 forgets; received 0 records and 0 forgets; refused 10,000 "
                          "files (nothing of them imported)\n")  # fmt: skip
    lines = now.stderr.splitlines()
    assert len(lines) == 6 and len(set(lines)) == 6
    assert all(line.startswith(f"refused {junk}/000") and ": malformed: " in line for line in lines[:5])
    assert lines[5] == "... and 9,995 more refused files (`calm sync` counts them)"
    status = desktop.calm("sync").stdout.splitlines()
    assert len(status) < 20
    at = status.index("refused files: 10,000 in all, 10,000 now; the first 5:")
    assert [line.split(":")[0] for line in status[at + 1 : at + 6]] == [line.split(":")[0].replace(
        "refused ", "  ", 1) for line in lines[:5]]  # fmt: skip
    assert status[at + 6] == "  ... and 9,995 more"
    again = desktop.calm("sync", "now")
    assert again.stderr == "" and "refused" not in again.stdout
    # the engine takes them away: no longer listed, still counted
    for path in list(junk.iterdir())[:9_998]:
        path.unlink()
    desktop.calm("sync", "now")
    assert "refused files: 10,000 in all, 2 now" in desktop.calm("sync").stdout


def test_forget_all_deletes_this_machines_share_with_sync_off(tmp_path: Path, folder: Path) -> None:
    """`calm sync --off` keeps the folder, the key and the share; `calm forget --all` then deletes
    the share too, as the README says (before issue 39 it was left in the folder)."""
    laptop, desktop = Machine(tmp_path, "laptop"), Machine(tmp_path, "desktop")
    laptop.join(folder)
    desktop.join(folder, key_from=laptop)
    for m in (laptop, desktop):
        m.record(f"echo from {m.name}")
        m.calm("sync", "now")
    share, other = laptop.share(folder), desktop.share(folder)
    laptop.calm("sync", "--off")
    assert share.is_dir() and laptop.key_path.exists()
    dry = laptop.calm("forget", "--all", "--dry-run").stdout
    assert f"{share} (this machine's share of the sync folder: 1 segment; your other machines" in dry  # one
    done = laptop.calm("forget", "--all", "--yes").stdout
    assert f"its share of the sync folder ({share}) is deleted" in done
    assert f"{folder} still holds the shares of 1 other machine" in done
    assert not share.exists() and other.is_dir() and not laptop.key_path.exists()
    assert laptop.commands() == []
    desktop.calm("sync", "now")
    assert sorted(desktop.commands()) == ["echo from desktop", "echo from laptop"]  # no forget sent


def test_a_name_that_is_not_utf8_is_one_line(tmp_path: Path, folder: Path) -> None:
    """`calm sync --name $'\\xff'` (and a folder named so): one line naming the flag, the byte shown
    escaped, exit 1, nothing changed (before issue 39: "unexpected UnicodeEncodeError")."""
    laptop = Machine(tmp_path, "laptop")
    laptop.join(folder)
    odd = os.fsdecode(bytes(tmp_path) + b"/fo\xff")
    os.mkdir(odd)
    for args, said in (
        (["--name", "\udcff"], "calm: error: --name \\xff: not UTF-8 text: give 1 to 64 characters"),
        (
            ["--name", "lap\udcfftop", "--folder", str(folder)],
            "calm: error: --name lap\\xfftop: not UTF-8 text",
        ),
        (["--folder", odd], f"calm: error: --folder {tmp_path}/fo\\xff: not UTF-8 text"),
    ):
        done = laptop.calm("sync", *args, ok=False)
        assert done.returncode == 1 and done.stdout == "", done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith(said) and "unexpected" not in line
    status = laptop.calm("sync").stdout
    assert f"folder: {folder} (both" in status and "this machine: laptop (" in status


def doc_blocks(heading: str) -> list[list[str]]:
    """The indented code blocks (each a list of lines) of docs/sync.md's section `heading`."""
    text = (REPO / "docs" / "sync.md").read_text()
    section = text.split(f"\n### {heading}\n", 1)[1].split("\n#", 1)[0]
    blocks: list[list[str]] = []
    previous = ""
    for line in section.splitlines():
        if line.startswith("    ") and line.strip():
            if not previous.startswith("    "):
                blocks.append([])
            blocks[-1].append(line.strip())
        previous = line
    return blocks


@pytest.mark.needs("git", "bash")
def test_the_docs_git_example_runs_as_written(tmp_path: Path) -> None:
    """docs/sync.md's "With a git remote", line by line in bash as written, on two machines (each its
    own HOME), the remote `myserver:calm-sync.git` reached through an `ssh` that runs the command it
    is given in a third folder (the server's home). The laptop's command reaches the desktop and the
    desktop's the laptop. Before issue 39 the second line said "not a folder; create it"."""
    [once], each = doc_blocks("With a git remote")
    assert once.startswith("ssh myserver ") and [line.split()[:2] for line in each] == [["calm", "sync"]] * 2
    server = tmp_path / "server"
    server.mkdir()
    fake = tmp_path / "bin"
    fake.mkdir()
    ssh = fake / "ssh"
    # ssh [-o opt | -p port ...] host command...: the command run by sh in the server's home
    ssh.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in -o|-p|-l|-i) shift 2;; -*) shift;; '
                   '*) break;; esac; done\nshift\ncd "$FAKE_SERVER" && exec sh -c "$*"\n')  # fmt: skip
    ssh.chmod(0o755)
    laptop, desktop = Machine(tmp_path, "laptop"), Machine(tmp_path, "desktop")

    def run(machine: Machine, line: str) -> str:
        env = {**machine.env, "PATH": f"{fake}:{BIN}:/usr/bin:/bin", "FAKE_SERVER": str(server)}
        done = subprocess.run(["bash", "-c", line], env=env, cwd=machine.home, capture_output=True, text=True,
                              timeout=HANG_S)  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
        return done.stdout

    run(laptop, once)
    assert (server / "calm-sync.git" / "HEAD").is_file()
    laptop.record("make release")
    for line in each:
        run(laptop, line)
    assert (laptop.home / ".local" / "share" / "calm-sync" / ".git").is_dir()
    desktop.calm("sync", "key", "--import", "-", stdin=laptop.calm("sync", "key", "--show").stdout)
    desktop.record("htop")
    said = [run(desktop, line) for line in each]
    assert said[-1].startswith("sent 1 records and 0 forgets; received 1 records")
    run(laptop, each[-1])
    assert sorted(desktop.commands()) == sorted(laptop.commands()) == ["htop", "make release"]
    # the desktop's own folder was made by calm, private
    assert (desktop.home / ".local" / "share" / "calm-sync").stat().st_mode & 0o777 == 0o700
