"""The secret classes of issue 23, as classes: a credential written into a credential file, a
secret given to a tool's `config set`, a known token prefix at any length, and `calm forget` in
any form (never stored). Each is probed with random values the way an outside probe does (200
random passwords per form), beside the corpus rows of tests/data/secrets/."""

from __future__ import annotations

import random
import sqlite3
import string
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from calmd.history.secrets import find_secret, forget_command
from calmd.history.store import HistoryStore
from calmd.shell.client import CalmClient
from tests.daemon import running_daemon

RNG_SEED = 23
# What password generators draw from (a quote is left out: it would end the shell word).
PASSWORD_CHARS = string.ascii_letters + string.digits + "!#$%&()*+,-./:;<=>?@[]^_{|}~"

CREDENTIAL_FILE_FORMS = [
    "echo 'machine {host} login {user} password {secret}' >> ~/.netrc",
    "echo 'machine {host} login {user} password {secret}' | tee -a $HOME/.netrc",
    "printf 'machine %s login %s password %s\\n' {host} {user} '{secret}' >> ~/.netrc",
    "echo 'aws_secret_access_key = {secret}' >> ~/.aws/credentials",
    "printf '[{user}]\\naws_secret_access_key={secret}\\n' >> ~/.aws/credentials",
    "echo '{host}:5432:app:{user}:{secret}' >> ~/.pgpass",
    "echo 'https://{user}:{url_secret}@{host}' >> ~/.git-credentials",  # URL-encoded, as git stores it
    "echo '//{host}/:_authToken={secret}' >> ~/.npmrc",
    "printf '[pypi]\\nusername = {user}\\npassword = {secret}\\n' > ~/.pypirc",
    'echo \'{{"auths":{{"{host}":{{"auth":"{secret}"}}}}}}\' > ~/.docker/config.json',
    "aws configure set aws_secret_access_key '{secret}'",
    "aws configure set aws_secret_access_key '{secret}' --profile {user}",
]


def random_word(rng: random.Random, alphabet: str, low: int, high: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


@pytest.mark.parametrize("form", CREDENTIAL_FILE_FORMS)
def test_200_random_passwords_written_into_credential_files_are_caught(form: str) -> None:
    rng = random.Random(RNG_SEED)
    missed = []
    for _ in range(200):
        host = random_word(rng, string.ascii_lowercase, 3, 10) + ".example.org"
        user = random_word(rng, string.ascii_lowercase, 3, 8)
        secret = random_word(rng, PASSWORD_CHARS, 6, 32)
        cmd = form.format(host=host, user=user, secret=secret, url_secret=quote(secret, safe=""))
        if find_secret(cmd) is None:
            missed.append(cmd)
    assert not missed, missed[:5]


def test_a_here_document_into_a_credential_file_is_caught() -> None:
    """A multi-line entry, as the shells' history files now keep it (docs/history.md)."""
    cmd = "cat >> ~/.netrc <<EOF\nmachine backup.example.com\nlogin nightly\npassword R7v@q!2mZ\nEOF"
    assert find_secret(cmd) == "credential-file:netrc"
    assert find_secret("cat >> ~/.netrc <<EOF\nmachine backup.example.com\nlogin nightly\nEOF") is None


def test_random_aws_secret_keys_are_caught_whatever_their_randomness() -> None:
    """The probe's `aws configure set aws_secret_access_key VALUE` sat on the random-string
    rule's cutoff; the tool's own setting is a secret whatever the value looks like."""
    rng = random.Random(RNG_SEED)
    alphabet = string.ascii_letters + string.digits + "/+"
    for _ in range(200):
        key = random_word(rng, alphabet, 40, 40)
        assert find_secret(f"aws configure set aws_secret_access_key {key}") is not None, key
    assert find_secret("aws configure set aws_secret_access_key password") is not None  # a weak one too
    assert find_secret("aws configure set region eu-north-1") is None


PREFIXES = ["github_pat_", "ghp_", "glpat-", "sk-ant-api03-", "hf_", "npm_", "dckr_pat_"]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_known_token_prefixes_at_any_length(prefix: str) -> None:
    rng = random.Random(RNG_SEED)
    alphabet = string.ascii_letters + string.digits
    for length in (16, 17, 23, 29, 41, 64, 93, 130):
        body = random_word(rng, alphabet, length, length)
        if not any(c.isdigit() for c in body):
            body = body[:-2] + "42"
        assert find_secret(f"export TOKEN_FOR_CI={prefix}{body}") is not None, (prefix, length)
        assert find_secret(f"git push https://x:{prefix}{body}@git.example.com/r.git") is not None


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
def test_calm_forget_in_any_form_is_never_stored(cmd: str, tmp_path: Path) -> None:
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
    path = tmp_path / "data" / "history.sqlite3"
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


@pytest.mark.parametrize(
    "unit",
    ["grep password ~/.netrc ", "printf 'password %s' x >> .netrc ", "aws configure set ", "ghp_a1",
     "npm config set _authToken ", "a"],
)  # fmt: skip
def test_no_rule_is_quadratic_on_a_64_kib_command(unit: str) -> None:
    """The record limit's worst shapes for the new rules, and a 64 KiB run of letters before a
    URL's `://` (the URL rule tried a scheme at every letter: 5 s). The bound is a stall guard,
    thirty times what they cost (~0.03 s): the record path runs on the daemon's event loop."""
    cmd = (unit * (65536 // len(unit)))[: 65536 - 40] + " https://me:pw@example.com >> ~/.netrc"
    start = time.perf_counter()
    find_secret(cmd)
    assert time.perf_counter() - start < 1.0
