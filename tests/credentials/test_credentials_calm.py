"""calm's own secrets are never stored (calmd/secrets/calm.py): the sync key's phrase, made by
the sync module's own generator, in any line (a bare paste, `echo ... > key.txt`, in groups with
spaces, in capitals); `calm sync key --import` whatever it is given; `calm forget` in any form."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.secrets import KEY_PHRASE, find_secret, forget_command
from calmd.shell.client import CalmClient
from calmd.sync.seal import key_phrase, new_key
from tests.support.daemon import running_daemon

PHRASE_FORMS = [
    "{phrase}",
    "echo {phrase} > ~/key.txt",
    "printf '%s\\n' '{phrase}' > /tmp/k",
    "calm sync key --import {phrase}",
    "calm sync key --import='{phrase}'",
    "echo {phrase} | calm sync key --import -",
    "ssh laptop 'calm sync key --import {phrase}'",
    "{upper}",
    "{spaced}",
    "{bare}",
    "{joined}",
]


def phrases(n: int) -> list[str]:
    return [key_phrase(new_key()) for _ in range(n)]


def test_the_generators_keys_have_the_shape_the_detector_knows() -> None:
    for phrase in phrases(500):
        assert KEY_PHRASE.fullmatch(phrase), phrase


@pytest.mark.parametrize("form", PHRASE_FORMS)
def test_a_sync_key_phrase_in_any_line_is_never_stored(form: str) -> None:
    for phrase in phrases(50):
        letters = phrase[5:]
        cmd = form.format(phrase=phrase, upper=phrase.upper(), spaced="calm " + letters.replace("-", " "),
                          bare=letters, joined="calm-" + letters.replace("-", ""))  # fmt: skip
        assert find_secret(cmd) == "calm-sync-key", cmd
        assert HistoryStore.check(cmd).stored is False


IMPORT_FORMS = [
    "calm sync key --import ~/Downloads/calm-key.txt",
    "calm sync key --import -",
    "calm sync key --imp /media/usb/key",
    "calm sync key -i key.txt",
    "sudo -u me calm sync key --import=/tmp/k",
    "~/.venv/bin/calm sync key --import k.txt",
    "CALM_HOME=/tmp/x calm sync key --import k.txt",
]


@pytest.mark.parametrize("cmd", IMPORT_FORMS)
def test_calm_sync_key_import_is_never_stored_whatever_it_is_given(cmd: str) -> None:
    assert find_secret(cmd) == "calm-sync-key"


@pytest.mark.parametrize(
    "cmd",
    ["calm sync key --show", "calm sync key --new", "calm sync --folder ~/Sync/calm", "calm sync now",
     "calm import ~/.zsh_history", "echo calm-down-and-carry-on", "git commit -m 'calm sync: keys import'"],
)  # fmt: skip
def test_other_calm_commands_are_kept(cmd: str) -> None:
    assert find_secret(cmd) is None
    assert HistoryStore.check(cmd).stored


def test_a_daemon_stores_no_sync_key_and_an_old_store_loses_it(tmp_path: Path) -> None:
    """Over the real socket: `record` of the key's forms stores nothing; a store an older calmd
    wrote (detector 4) loses them when opened."""
    phrase = key_phrase(new_key())
    with running_daemon(tmp_path, args=("--no-import",)) as daemon, CalmClient(daemon.socket) as c:
        for cmd in (f"calm sync key --import {phrase}", f"echo {phrase} > key.txt", phrase):
            reply = c.record(cmd, exit=0, session="s")
            assert (reply["stored"], reply["reason"]) == (False, "secret:calm-sync-key"), cmd
        assert c.record("calm sync key --show", exit=0, session="s")["stored"]
    path = tmp_path / "data" / paths.HISTORY
    db = sqlite3.connect(path)
    db.execute("INSERT INTO commands (ts, cmd) VALUES (1, ?)", (f"calm sync key --import {phrase}",))
    db.execute("UPDATE meta SET value = '4' WHERE key = 'detector_version'")
    db.commit()
    db.close()
    store = HistoryStore(path)
    assert store.rescanned == 1
    assert [r.cmd for r in store.all_rows()] == ["calm sync key --show"]
    store.close()
    assert phrase.encode() not in b"".join(p.read_bytes() for p in path.parent.glob("history.sqlite3*"))


# --------------------------------------------------------------------------- calm forget

FORGET_FORMS = [
    "calm forget hunter2",
    "calm --no-color forget hunter2",
    "CALM_HOME=/tmp/other calm forget hunter2",
    "sudo calm forget hunter2",
    "sudo -E -u me calm forget hunter2",
    "command calm forget hunter2",
    "env -i PATH=/usr/bin calm forget hunter2",
    "nice -n 10 calm forget --dry-run hunter2",
    "\\calm forget hunter2",
    "'calm' forget hunter2",
    "~/.venv/bin/calm forget -E 'hunt.*'",
    "cd /tmp && calm forget hunter2",
    "ssh box 'calm forget hunter2'",
    'echo "$(calm forget hunter2)"',
    "calm \\\n  forget hunter2",
]


@pytest.mark.parametrize("cmd", FORGET_FORMS)
def test_calm_forget_in_any_form_is_never_stored(cmd: str) -> None:
    assert forget_command(cmd)
    verdict = HistoryStore.check(cmd)
    assert (verdict.stored, verdict.reason) == (False, "forget-command")


@pytest.mark.parametrize(
    "cmd", ["calm import ~/.zsh_history", "git commit -m 'calm down, forget it'", "echo calm forgetful"]
)
def test_other_commands_mentioning_calm_are_kept(cmd: str) -> None:
    assert not forget_command(cmd)
    assert HistoryStore.check(cmd).stored


def test_a_daemon_stores_no_forget_command_and_an_old_store_loses_them(tmp_path: Path) -> None:
    with running_daemon(tmp_path, args=("--no-import",)) as daemon, CalmClient(daemon.socket) as c:
        for cmd in FORGET_FORMS:
            reply = c.record(cmd, exit=0, session="s")
            assert (reply["stored"], reply["reason"]) == (False, "forget-command"), cmd
        assert c.record("ls", exit=0, session="s")["stored"]
    path = tmp_path / "data" / paths.HISTORY
    db = sqlite3.connect(path)  # a store an older calmd wrote: it kept some forms
    db.execute("INSERT INTO commands (ts, cmd) VALUES (1, 'sudo calm forget hunter2')")
    db.execute("UPDATE meta SET value = '2' WHERE key = 'detector_version'")
    db.commit()
    db.close()
    store = HistoryStore(path)
    assert store.rescanned == 1
    assert [r.cmd for r in store.all_rows()] == ["ls"]
    store.close()
    assert b"hunter2" not in b"".join(p.read_bytes() for p in path.parent.glob("history.sqlite3*"))
