"""Two calmd daemons with their own homes share one history through a real engine: two Syncthing
instances on loopback (tests/support/syncthing.py), and the same through rsync (the engine for a machine
where Syncthing cannot run). Each test's id says which engine ran. What is checked is what a user
sees: `calm history` and the suggestions on the other machine, `calm forget` on one removing it
on both, a daemon killed with SIGKILL in the middle of writing a segment losing nothing it had
stored, and a segment with a flipped byte refused (in `calmd status`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.shell.client import CalmClient
from calmd.sync.export import TEST_HOLD_ENV
from tests.support.daemon import BIN, ROOT, SCRIPTED_SERVE, daemon_env, running_daemon
from tests.support.syncthing import Syncthing
from tests.support.tools import need
from tests.support.waiting import HANG_S

pytestmark = pytest.mark.slow
INTERVAL = "0.5"  # seconds between the daemons' exports and imports


def calm(home: Path, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run([str(BIN / "calm"), *args], env=daemon_env(home), input=stdin, capture_output=True,
                         text=True, timeout=HANG_S)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def history(home: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in calm(home, "history", "--json").splitlines()]


def wait_until(check: Callable[[], bool], what: str, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


@contextlib.contextmanager
def engine(kind: str, tmp: Path, a: Path, b: Path) -> Iterator[Callable[[], None]]:
    """The two folders kept alike by `kind`; yields a function that nudges it (a rescan)."""
    if kind == "syncthing":
        need("syncthing")
        homes = Path(tempfile.mkdtemp(prefix="syncthing-", dir=tmp))  # each start its own pair
        one, two = Syncthing(homes / "a", "a"), Syncthing(homes / "b", "b")
        one.generate()
        two.generate()
        one.share(a, [two])
        two.share(b, [one])
        try:
            one.start()
            two.start()
            wait_until(lambda: one.connected(two) and two.connected(one), "the two syncthings connect", 60)
            yield lambda: (one.rescan(), two.rescan())
        finally:
            one.stop()
            two.stop()
        return
    need("rsync")
    stop = threading.Event()

    def copy() -> None:
        # Both ways, the newer file winning, as a user's cron job runs it (only more often): no
        # --delete (it would delete what the other side made since), no excludes. So what a machine
        # deletes comes back from the other side, calm's temp files are copied too, and a file's two
        # versions within one second used to be told apart by size alone: files that never change
        # once written are what make this safe (docs/sync.md).
        for src, dst in ((a, b), (b, a)):
            subprocess.run(
                ["rsync", "-a", "--update", f"{src}/", f"{dst}/"], capture_output=True, timeout=HANG_S
            )

    def loop() -> None:
        while not stop.wait(0.3):
            copy()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield copy
    finally:
        stop.set()
        thread.join(timeout=HANG_S)


def held(own: Path) -> list[str]:
    """The temp files in `own` that hold a sealed segment of the 30,000 commands (~2 MB): the one
    the daemon is writing once its bytes are in (an engine may copy older, small ones back)."""
    names = []
    for name in os.listdir(own):
        with contextlib.suppress(FileNotFoundError):
            if name.endswith(".tmp") and (own / name).stat().st_size > 30_000 * 20:
                names.append(name)
    return names


def set_up(laptop: Path, desktop: Path, folder_a: Path, folder_b: Path) -> None:
    calm(laptop, "sync", "--folder", str(folder_a), "--name", "laptop", "--interval", INTERVAL)
    phrase = calm(laptop, "sync", "key", "--show").strip()
    calm(desktop, "sync", "key", "--import", "-", stdin=phrase + "\n")
    calm(desktop, "sync", "--folder", str(folder_b), "--name", "desktop", "--interval", INTERVAL)


@pytest.mark.parametrize("kind", ["syncthing", "rsync"])
def test_two_daemons_share_one_history(kind: str, tmp_path: Path) -> None:
    laptop, desktop = tmp_path / "laptop", tmp_path / "desktop"
    folder_a, folder_b = tmp_path / "sync-a", tmp_path / "sync-b"
    for p in (laptop, desktop, folder_a, folder_b):
        p.mkdir(mode=0o700)
    print(f"sync engine: {kind}")
    set_up(laptop, desktop, folder_a, folder_b)
    args = ("--no-import",)
    with (
        engine(kind, tmp_path, folder_a, folder_b),
        running_daemon(laptop, engine="model", weights=False, args=args) as one,
        running_daemon(desktop, engine="model", weights=False, args=args) as two,
        CalmClient(one.socket) as a,
        CalmClient(two.socket) as b,
    ):
        # a command made on the laptop: in the desktop's history (with its host) and suggestions
        line = "terraform apply -target=module.staging"
        assert a.record(line, exit=0, cwd="/infra", session="l1")["stored"]
        assert b.record("htop", exit=0, cwd="/root", session="d1")["stored"]

        def on_desktop() -> bool:
            return any(e["cmd"] == "terraform apply -target=module.staging" for e in history(desktop))

        wait_until(on_desktop, f"the laptop's command reaches the desktop through {kind}")
        entry = next(e for e in history(desktop) if e["cmd"].startswith("terraform"))
        assert (entry["host"], entry["cwd"], entry["exit"]) == ("laptop", "/infra", 0)
        assert next(e for e in history(desktop) if e["cmd"] == "htop")["host"] == "desktop"
        assert [e["cmd"] for e in json_lines(calm(desktop, "history", "--json", "--host", "laptop"))] == [
            "terraform apply -target=module.staging"]  # fmt: skip
        found = [m["candidate"] for m in b.complete("terraform ap", n=5, session="d1", cwd="/infra")
                 if "candidate" in m]  # fmt: skip
        assert "terraform apply -target=module.staging" in found
        wait_until(lambda: any(e["cmd"] == "htop" and e["host"] == "desktop" for e in history(laptop)),
                   "the desktop's command reaches the laptop")  # fmt: skip
        status = b.status()["status"]["sync"]
        assert status["enabled"] and [h["name"] for h in status["hosts"]] == ["laptop"]
        assert status["hosts"][0]["records_in"] >= 1 and status["refused"]["count"] == 0

        # forgotten on the desktop: gone from both
        calm(desktop, "forget", "module.staging")
        assert not any("staging" in e["cmd"] for e in history(desktop))
        gone = lambda: not any("staging" in e["cmd"] for e in history(laptop))  # noqa: E731
        wait_until(gone, "the forget reaches the laptop")
        found = [m["candidate"] for m in a.complete("terraform ap", n=5, session="l1", cwd="/infra")
                 if "candidate" in m]  # fmt: skip
        assert "terraform apply -target=module.staging" not in found

    # SIGKILL in the middle of writing a segment: what the laptop had stored all arrives
    store = HistoryStore(paths.history_path(laptop / "data"))
    with store.writing() as db:
        db.executemany("INSERT INTO commands (ts, session, cmd) VALUES (?, 'bulk', ?)",
                       [(1000.0 + i, f"echo bulk {i}") for i in range(30_000)])  # fmt: skip
        laptop_id = db.execute("SELECT value FROM meta WHERE key = 'sync_host_id'").fetchone()[0]
    store.close()
    own = folder_a / laptop_id  # the laptop's sub-folder (the desktop's is there too)
    assert own.is_dir()
    with engine(kind, tmp_path, folder_a, folder_b) as nudge:
        # The daemon's first export seals the 30,000 commands into a segment; the test hook holds
        # that write once its temp file holds the bytes (a write lasts milliseconds: a test that
        # waited to catch it in the act failed under load), and the daemon is killed there.
        # From here on only sync is looked at (the records, the segments, status): the daemons are
        # `calmd serve` with the tests' scripted engine, which imports no torch (a model's daemon
        # costs 1.2 CPU-seconds more to start; the suggestions were checked above).
        hold = {TEST_HOLD_ENV: "600", "PYTHONPATH": str(ROOT)}  # (PYTHONPATH: tests.support.serve_scripted)
        serve = subprocess.Popen([*SCRIPTED_SERVE, *args], env=daemon_env(laptop, **hold),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            wait_until(
                lambda: bool(held(own)) or serve.poll() is not None, "the laptop writes its segment", 180
            )
            assert serve.poll() is None, f"calmd ended (status {serve.returncode}) before writing"
            [temp] = held(own)
        finally:
            os.kill(serve.pid, signal.SIGKILL)
            serve.wait(timeout=HANG_S)
        assert held(own) == [temp], "killed in the write: its temp file is left"
        assert not (own / (temp.split(".")[1] + ".calm")).exists(), "the segment it was writing is not there"
        with (
            running_daemon(laptop, args=args),
            running_daemon(desktop, args=args),
        ):

            def all_arrived() -> bool:
                nudge()
                return sum(1 for e in history(desktop) if e["cmd"].startswith("echo bulk")) == 30_000

            wait_until(all_arrived, "the 30,000 commands stored before the SIGKILL reach the desktop", 180)
        # one byte of the laptop's newest segment flipped in the folder (the laptop is off): the
        # desktop refuses the file, says why in `calmd status` and `calm sync`, stores nothing of it
        seg = max(own.glob("*.calm"))
        data = bytearray(seg.read_bytes())
        data[len(data) - 100] ^= 0x40
        tampered = own / ".tampered"
        tampered.write_bytes(bytes(data))
        os.chmod(tampered, 0o600)
        os.replace(tampered, seg)
        before = len(history(desktop))
        with (
            running_daemon(desktop, args=args) as two,
            CalmClient(two.socket) as b,
        ):

            def refused() -> list[dict[str, Any]]:
                nudge()
                files: list[dict[str, Any]] = b.status()["status"]["sync"]["refused"]["files"]
                return files

            wait_until(lambda: bool(refused()), "the segment with a flipped byte is refused")
            [bad] = refused()
            assert bad["path"] == str(folder_b / own.name / seg.name) and bad["reason"].startswith("tampered")
            assert "1 in all, 1 now" in calm(desktop, "sync")
            assert len(history(desktop)) == before


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_forget_all_takes_this_machine_out_of_sync_and_nothing_comes_back(tmp_path: Path) -> None:
    """`calm forget --all` on a machine that syncs, its daemon running: its commands are gone and
    stay gone (its daemon's next turns import nothing from the folder: sync is off, sync.json and
    the key deleted), its share of the folder is deleted, and the other machine is sent no forget:
    it keeps its history and what it received. What stays in the folder is said. Joining again
    reads the folder afresh, and what the machine records then reaches the other (its record
    numbers go on past those it gave: none is taken for one the other already has)."""
    laptop, desktop = tmp_path / "laptop", tmp_path / "desktop"
    folder = tmp_path / "sync"  # one folder for both: as an engine leaves it once it copied every file
    for p in (laptop, desktop, folder):
        p.mkdir(mode=0o700)
    set_up(laptop, desktop, folder, folder)
    args = ("--no-import",)

    def forget_all(*flags: str) -> subprocess.CompletedProcess[str]:
        env = daemon_env(desktop, CALM_CACHE=str(tmp_path / "desktop-cache"))  # not the machine's kernels
        argv = [str(BIN / "calm"), "forget", "--all", *flags]
        return subprocess.run(
            argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_S
        )

    def commands(home: Path) -> set[tuple[str, str]]:
        return {(e["cmd"], e["host"]) for e in history(home)}

    with (
        running_daemon(laptop, args=args) as one,
        running_daemon(desktop, args=args) as two,
        CalmClient(one.socket) as a,
        CalmClient(two.socket) as b,
    ):
        assert a.record("ssh build-box", exit=0, session="l1")["stored"]
        assert b.record("htop", exit=0, session="d1")["stored"]
        both = {("ssh build-box", "laptop"), ("htop", "desktop")}
        wait_until(lambda: commands(desktop) == commands(laptop) == both, "each machine has both commands")
        laptop_id = b.status()["status"]["sync"]["hosts"][0]["id"]
        desktop_id = b.status()["status"]["sync"]["host"]["id"]
        assert (folder / desktop_id).is_dir() and (folder / laptop_id).is_dir()

        dry = forget_all("--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert (
            paths.SYNC_CONFIG in dry.stdout
            and paths.SYNC_KEY in dry.stdout
            and "this machine's share" in dry.stdout
        )
        done = forget_all("--yes")
        assert done.returncode == 0, done.stderr
        assert "forgot 2 commands" in done.stdout and "sync is off on this machine" in done.stdout
        assert f"{folder} still holds the shares of 1 other machine" in done.stdout
        data = desktop / "data"
        assert not paths.sync_config_path(data).exists() and not paths.sync_key_path(data).exists()
        assert not (folder / desktop_id).exists() and (folder / laptop_id).is_dir()
        assert b.status()["status"]["sync"] == {"enabled": False}

        # the laptop goes on; several turns of both daemons later the desktop holds nothing again,
        # and the laptop was told to forget nothing
        assert a.record("make release", exit=0, session="l1")["stored"]
        wait_until(lambda: a.status()["status"]["sync"]["pending_out"] == 0, "the laptop exports")
        time.sleep(8 * float(INTERVAL))
        assert commands(desktop) == set()
        assert commands(laptop) == both | {("make release", "laptop")}

        # joining again: the folder is read afresh, and the desktop's new commands reach the laptop
        phrase = calm(laptop, "sync", "key", "--show").strip()
        calm(desktop, "sync", "key", "--import", "-", stdin=phrase + "\n")
        calm(desktop, "sync", "--folder", str(folder), "--name", "desktop", "--interval", INTERVAL)
        assert b.record("df -h", exit=0, session="d2")["stored"]
        new = ("df -h", "desktop")
        wait_until(lambda: new in commands(laptop), "the desktop's new command reaches the laptop")
        again = {("ssh build-box", "laptop"), ("make release", "laptop"), ("df -h", "desktop")}
        wait_until(lambda: commands(desktop) == again, "the desktop reads the laptop's share again")
        assert b.status()["status"]["sync"]["host"]["id"] == desktop_id


def test_daemons_read_a_folder_that_lies_and_heal_it(tmp_path: Path) -> None:
    """The folder cases of issue 39 with the daemons doing the work. While the laptop's daemon is
    off, its share gets a segment sealed with the key whose list of live segments names only itself,
    and another sub-folder 10,000 junk files named like segments. The desktop's daemon receives the
    laptop's commands all the same, says in `calmd status` which machine's list hid them, and
    refuses the junk with a count and the first five, its log saying five of them and one line for
    the rest. Once the laptop's daemon runs again, it writes its list again past the planted segment
    and deletes it, and the desktop's warning goes."""
    from tests.sync.test_sync_folder import plant_manifest

    laptop, desktop = tmp_path / "laptop", tmp_path / "desktop"
    folder = tmp_path / "sync"
    for p in (laptop, desktop, folder):
        p.mkdir(mode=0o700)
    set_up(laptop, desktop, folder, folder)
    args = ("--no-import",)
    made = ["make target0", "git status", "cargo build --release"]
    with running_daemon(laptop, args=args) as one, CalmClient(one.socket) as a:
        for line in made:
            assert a.record(line, exit=0, session="l1")["stored"]
        wait_until(lambda: a.status()["status"]["sync"]["pending_out"] == 0, "the laptop exports")
        share = folder / a.status()["status"]["sync"]["host"]["id"]
    from calmd.sync.seal import read_key

    planted = plant_manifest(share, read_key(laptop / "data" / "sync.key"))
    junk = folder / "0123456789abcdef"
    junk.mkdir()
    for i in range(1, 10_001):
        (junk / f"{i:08d}.calm").write_bytes(b"CALMSYN2" + os.urandom(60))

    with running_daemon(desktop, args=args) as two, CalmClient(two.socket) as b:
        wait_until(lambda: sorted(e["cmd"] for e in history(desktop)) == sorted(made),
                   "the desktop receives the laptop's commands")  # fmt: skip
        wait_until(lambda: bool(b.status()["status"]["sync"]["hidden"]), "the desktop says the list hid them")
        sync = b.status()["status"]["sync"]
        [hidden] = sync["hidden"]
        assert (hidden["host"], hidden["manifest"], hidden["records"]) == (share.name, int(planted.stem), 3)
        wait_until(lambda: b.status()["status"]["sync"]["refused"]["count"] == 10_000, "the junk is refused")
        refused = b.status()["status"]["sync"]["refused"]
        assert refused["now"] == 10_000 and len(refused["files"]) == 5
        two.wait_for("sync: refused 9995 more files")
        log = two.read_output()
        assert sum("sync: refused" in line for line in log.splitlines()) == 6
        status = calm(desktop, "sync")
        assert f"warning: laptop ({share.name}): its newest list of its segments" in status
        assert len(status.splitlines()) < 20

        with running_daemon(laptop, args=args) as one, CalmClient(one.socket) as a:
            wait_until(lambda: not planted.exists(), "the laptop deletes the segment it never wrote")
            assert a.status()["status"]["sync"]["disowned"] == 1
            one.wait_for("that its history does not know of")
        wait_until(lambda: b.status()["status"]["sync"]["hidden"] == [], "the desktop's warning goes")
        assert "warning" not in calm(desktop, "sync")
        assert sorted(e["cmd"] for e in history(desktop)) == sorted(made)
