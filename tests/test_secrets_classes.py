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

from calmd import paths
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


@pytest.mark.parametrize(
    "unit",
    ["grep password ~/.netrc ", "printf 'password %s' x >> .netrc ", "aws configure set ", "ghp_a1",
     "npm config set _authToken ", "a",
     # issue 30's rules: the tokenizer's pipes, process substitutions, here-documents, quoting;
     # key material, inline code, SQL
     "echo x | ", "<(", "<<-A\n\tA\n", '"-p', "$'\\x", "( ", "-----BEGIN RSA PRIVATE KEY----- ab", "MIIE",
     "auth=('a', ", "user x password '", "PDO(a, b, "],
)  # fmt: skip
def test_no_rule_is_quadratic_on_a_64_kib_command(unit: str) -> None:
    """The record limit's worst shapes for the new rules, and a 64 KiB run of letters before a
    URL's `://` (the URL rule tried a scheme at every letter: 5 s). The bound is a stall guard,
    thirty times what they cost (~0.03 s): the record path runs on the daemon's event loop."""
    cmd = (unit * (65536 // len(unit)))[: 65536 - 40] + " https://me:pw@example.com >> ~/.netrc"
    start = time.perf_counter()
    find_secret(cmd)
    assert time.perf_counter() - start < 1.0


# --------------------------------------------------------------------------- issue 30's classes

# A secret fed to a command that reads it from standard input, through a pipe, a here-string, a
# here-document or a process substitution; an admin tool's positional password; a password in
# code given on the command line; a quoted option; ANSI-C quoting. Each form is probed with 200
# random passwords (single-quoted, as a user would quote a password full of punctuation).
FED_FORMS = [
    "echo '{secret}' | docker login -u {user} --password-stdin {host}",
    "printf '%s' '{secret}' | podman login {host} -u {user} --password-stdin",
    "echo -n '{secret}' | passwd --stdin {user}",
    "printf '%s\\n%s\\n' '{secret}' '{secret}' | sudo passwd {user}",
    "echo '{user}:{secret}' | sudo chpasswd",
    "echo '{secret}' | sudo -S systemctl restart {user}",
    "echo -n '{secret}' | kubectl create secret generic {user} --from-file=password=/dev/stdin",
    "echo '{secret}' | gpg --batch --passphrase-fd 0 -c {user}.tar",
    "echo '{secret}' | openssl enc -aes-256-cbc -pass stdin -in a -out b",
    "printf '%s' '{secret}' | gh secret set DEPLOY_TOKEN --repo {user}/app",
    "passwd --stdin {user} <<< '{secret}'",
    "docker login -u {user} --password-stdin {host} <<< '{secret}'",
    "openssl passwd -6 -stdin <<< '{secret}'",
    "chpasswd <<< '{user}:{secret}'",
    "podman login -u {user} --password-stdin {host} < <(echo '{secret}')",
    "kubectl create secret generic {user} --from-file=password=<(printf '%s' '{secret}')",
    "sshpass -f <(echo '{secret}') ssh {user}@{host}",
    "restic -r /srv/backup --password-file <(echo '{secret}') snapshots",
    "docker login -u {user} --password-stdin {host} <<'EOF'\n{secret}\nEOF",
    "cat <<'END' | passwd --stdin {user}\n{secret}\nEND",
]
ADMIN_FORMS = [
    "mysqladmin -u root password '{secret}'",
    "mariadb-admin -u root -h {host} password '{secret}'",
    "redis-cli -h {host} CONFIG SET requirepass '{secret}'",
    "redis-cli -h {host} AUTH '{secret}'",
    "ipmitool -H {host} -U admin user set password 2 '{secret}'",
    "net user {user} '{secret}' /add",
    "mosquitto_passwd -b /etc/mosquitto/passwd {user} '{secret}'",
    "mc admin user add {user} {user} '{secret}'",
    "openssl passwd -6 '{secret}'",
    "mkpasswd -m sha-512 '{secret}'",
    "rclone obscure '{secret}'",
    "samba-tool user create {user} '{secret}'",
]
CODE_FORMS = [
    "python3 -c \"import requests; requests.get('https://{host}', auth=('{user}', '{code_secret}'))\"",
    "python3 -c \"import smtplib; smtplib.SMTP_SSL('{host}').login('{user}', '{code_secret}')\"",
    "node -e \"new Client({{host: '{host}', user: '{user}', password: '{code_secret}'}})\"",
    'mongosh --eval \'db.createUser({{user: "{user}", pwd: "{code_secret}", roles: []}})\'',
    "psql -h {host} -c \"ALTER USER {user} WITH PASSWORD '{code_secret}'\"",
    "mysql -e \"CREATE USER '{user}'@'%' IDENTIFIED BY '{code_secret}'\"",
    'php -r \'$db = new PDO("mysql:host={host}", "{user}", "{code_secret}");\'',
]
QUOTING_FORMS = [
    'mysql -u {user} "--password={dq_secret}" shop',
    "mysqldump '--password={secret}' --all-databases",
    "curl \"--user\" '{user}:{secret}' https://{host}/api",
    'wget "--http-password={dq_secret}" https://{host}/x.pdf',
    "export DB_PASSWORD=$'{ansi_secret}'",
    "mysql -u root -p$'{ansi_secret}' shop",
    "docker login -u {user} -p $'{ansi_secret}' {host}",
]
# What a code literal may hold inside shell and code quotes both; what double quotes keep
# literal; ANSI-C's escapes for a few characters.
CODE_CHARS = string.ascii_letters + string.digits + "!#%&()*+,-./:;<=>?@[]^_{|}~"
DQ_CHARS = string.ascii_letters + string.digits + "!#%&()*+,-./:;<=>?@[]^_{|}~'"
ANSI_ESCAPES = {"!": "\\x21", "'": "\\'", "\\": "\\\\", "$": "\\x24", "\n": "\\n"}


def random_password(rng: random.Random, alphabet: str = PASSWORD_CHARS) -> str:
    secret = random_word(rng, alphabet, 6, 32)
    return secret if secret.strip() else secret + "x"


@pytest.mark.parametrize("form", FED_FORMS + ADMIN_FORMS + CODE_FORMS + QUOTING_FORMS)
def test_200_random_passwords_fed_given_or_quoted_are_caught(form: str) -> None:
    rng = random.Random(RNG_SEED)
    missed = []
    for _ in range(200):
        host = random_word(rng, string.ascii_lowercase, 3, 10) + ".example.org"
        user = random_word(rng, string.ascii_lowercase, 3, 8)
        secret = random_password(rng)
        ansi = "".join(ANSI_ESCAPES.get(c, c) for c in random_password(rng, PASSWORD_CHARS + "'\\"))
        cmd = form.format(host=host, user=user, secret=secret, code_secret=random_password(rng, CODE_CHARS),
                          dq_secret=random_password(rng, DQ_CHARS), ansi_secret=ansi)  # fmt: skip
        if find_secret(cmd) is None:
            missed.append(cmd)
    assert not missed, missed[:5]


# The same commands with the secret where it lives, not in the command: never flagged.
FED_REFERENCES = [
    'echo "$REGISTRY_TOKEN" | docker login -u {user} --password-stdin {host}',
    "cat ~/.config/{user}.token | docker login -u {user} --password-stdin {host}",
    "pass show {user}/registry | podman login {host} -u {user} --password-stdin",
    "aws ecr get-login-password | docker login --username AWS --password-stdin {host}",
    "docker login -u {user} --password-stdin {host} < ~/.{user}-token",
    "printf '%s\\n' \"$NEW_PW\" | passwd --stdin {user}",
    'echo "{user}:$NEW_PW" | chpasswd',
    'passwd --stdin {user} <<< "$(pass show {user})"',
    "kubectl create secret generic {user} --from-file=password=<(pass show {user})",
    "sshpass -f ~/.{user}.pw ssh {user}@{host}",
    'mysqladmin -u root password "$ROOT_PW"',
    'redis-cli -h {host} CONFIG SET requirepass "$(cat /run/secrets/redis)"',
    "python3 -c \"import os, requests; requests.get(u, auth=('{user}', os.environ['PW']))\"",
    "git clone https://<user>:<token>@{host}/{user}/repo.git",
    "curl -u <{user}>:<password> https://{host}/api",
    'mysql -u {user} "--password=$DB_PW" shop',
]


@pytest.mark.parametrize("form", FED_REFERENCES)
def test_the_same_forms_with_the_secret_elsewhere_are_kept(form: str) -> None:
    rng = random.Random(RNG_SEED)
    for _ in range(20):
        host = random_word(rng, string.ascii_lowercase, 3, 10) + ".example.org"
        user = random_word(rng, string.ascii_lowercase, 3, 8)
        cmd = form.format(host=host, user=user)
        assert find_secret(cmd) is None, (cmd, find_secret(cmd))


def test_key_material_printed_line_by_line_is_caught_and_public_keys_are_not() -> None:
    """A private key's first base64 line decodes to a DER structure with a version number (or
    `openssh-key-v1`); a certificate's or a public key's does not. Generated keys, used nowhere."""
    private = [
        "MIIEpAIBAAKCAQEArlKgi3XCUK+kKMrdhqf2qn3rwyIvNwo78sDiU/4kVHZqMLYy",  # PKCS#1 RSA
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC3+MVJBVZvenmQ",  # PKCS#8 RSA
        "MHcCAQEEICMz78TCs2KT20zAGwEZDkqoiaXKHz7/Zb/o/Ur+shLToAoGCCqGSM49",  # SEC1 P-256
        "MC4CAQAwBQYDK2VwBCIEIBGElStLqXkK5b+ThiqmT64LnQsSZRvaKcpB9jk5aAxH",  # PKCS#8 Ed25519
        "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",  # OpenSSH
    ]
    public = [
        "MIIC+TCCAeGgAwIBAgIUWkdoorWyvcVLQwdep1s9AaMOdpgwDQYJKoZIhvcNAQEL",  # a certificate
        "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAzlCqYJFea3SJ80HNbrZ6",  # a public key
    ]
    for line in private:
        for form in ("echo '{}' >> key.pem", 'printf "%s\\n" "{}" >> k', "echo {} | tee -a ~/.ssh/id"):
            assert find_secret(form.format(line)) == "private-key-material", (form, line)
    for line in public:
        assert find_secret(f"echo '{line}' >> ca.pem") is None, line
    header = "'-----BEGIN EC PRIVATE KEY-----'"
    body = "'x9KcacSQ8lcBlAupYzNbvICjVRuin84HlVqnaX0d2FupDUdqeyaHTboKVpEW/bBh'"
    assert find_secret(f"printf '%s\\n' {header} {body} > ec.pem") is not None
    assert find_secret(f"echo {header} > ec.pem; echo {body} >> ec.pem") is not None
    assert find_secret(f"echo {header} > ec.pem") is None  # the header alone holds no key
    assert find_secret("grep -c 'BEGIN RSA PRIVATE KEY' /etc/ssl/private/server2024.key") is None


@pytest.mark.parametrize(
    ("value", "literal"),
    [("$'hunter\\x32'", "hunter2"), ("$'a\\'b'", "a'b"), ("$'\\101\\u00e9'", "Aé"), ('$"x y"', "x y")],
)
def test_ansi_c_quoting_is_read_as_the_shell_reads_it(value: str, literal: str) -> None:
    from calmd.history.secrets import _literal

    assert _literal(value) == literal
    assert find_secret(f"export DB_PASSWORD={value}") == "password-argument"
