"""Credentials in code given on the command line, passwords hashed inline, and commands nested
in a line (calmd/secrets/code.py, detector.py): code's password fields, auth pairs, connect
calls and SQL (issue 30); a hash built by a command substitution from a literal, a password sent
by an `expect` script, a tool run inside `ssh host '...'` or `bash -c "..."` (issue 39)."""

from __future__ import annotations

import pytest

from calmd.secrets import find_secret
from tests.credentials.forms import flagged, missed

CODE_FORMS = [
    "python3 -c \"import requests; requests.get('https://{host}', auth=('{user}', '{code_secret}'))\"",
    "python3 -c \"import smtplib; smtplib.SMTP_SSL('{host}').login('{user}', '{code_secret}')\"",
    "node -e \"new Client({{host: '{host}', user: '{user}', password: '{code_secret}'}})\"",
    'mongosh --eval \'db.createUser({{user: "{user}", pwd: "{code_secret}", roles: []}})\'',
    "psql -h {host} -c \"ALTER USER {user} WITH PASSWORD '{code_secret}'\"",
    "mysql -e \"CREATE USER '{user}'@'%' IDENTIFIED BY '{code_secret}'\"",
    'php -r \'$db = new PDO("mysql:host={host}", "{user}", "{code_secret}");\'',
]
HASHED_INLINE = [
    "useradd -m -p \"$(openssl passwd -6 '{secret}')\" {user}",
    "usermod -p \"$(mkpasswd -m sha-512 '{secret}')\" {user}",
    "echo \"{user}:$(htpasswd -nbB {user} '{secret}' | cut -d: -f2)\" >> /etc/nginx/users",
    "docker run -e ADMIN_HASH=\"$(caddy hash-password --plaintext '{secret}')\" caddy",
    "sed -i \"s|^admin:.*|admin:$(slappasswd -s '{secret}')|\" users.ldif",
    "usermod --password $(echo '{secret}' | openssl passwd -1 -stdin) {user}",
    "chpasswd -e <<< \"{user}:$(mkpasswd -m sha-512 '{secret}')\"",
    'echo "root:$(python3 -c \'import crypt; print(crypt.crypt("{code_secret}"))\')" | chpasswd -e',
]
NESTED = [
    "ssh {host} \"mysql -uroot -p'{secret}' -e 'show databases'\"",
    "ssh {host} 'mysql -uroot -p{pair_secret} -e \"show databases\"'",
    "bash -c \"sshpass -p '{secret}' ssh {user}@{host} uptime\"",
    "sudo sh -c \"echo '{user}:{secret}' | chpasswd\"",
    'expect -c \'spawn su - {user}; expect "Password:"; send "{code_secret}\\r"; interact\'',
    'docker exec -it db sh -c "mysql -u root -p{pair_secret} app"',
    "lftp -e 'open -u {user},{pair_secret} {host}; mirror /pub /srv; quit'",
]


@pytest.mark.parametrize("form", CODE_FORMS + HASHED_INLINE + NESTED)
def test_200_random_passwords_in_code_hashes_and_nested_commands_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


HARMLESS = [
    'useradd -m -p "$(openssl passwd -6 "$NEW_PW")" {user}',
    'usermod -p "$(mkpasswd -m sha-512 -s < /run/secrets/pw)" {user}',
    'echo "$(openssl passwd -6 -stdin < pw.txt)"',
    "hash=$(sha256sum release.tar.gz | cut -d' ' -f1)",
    'NOW=$(date +%s) && echo "$NOW" > stamp',
    "hashcat -m 1000 -a 3 ntlm.txt ?u?l?l?l?d?d",
    "passwd {user}",
    "ssh {host} 'mysql -uroot -p -e \"show databases\"'",
    'bash -c "sshpass -f ~/.pw ssh {user}@{host} uptime"',
    "git commit -m 'rotate the password policy, see docs'",
    "python3 -c \"import getpass; pw = getpass.getpass('Password: ')\"",
    "mongosh --eval 'db.auth(\"root\", passwordPrompt())'",
    'expect -c \'spawn ssh {user}@{host}; expect "Password:"; send "$env(PW)\\r"; interact\'',
]


@pytest.mark.parametrize("form", HARMLESS)
def test_the_same_forms_without_a_literal_are_kept(form: str) -> None:
    assert not flagged([form])


def test_a_hash_built_inline_is_the_hashing_tools_argument() -> None:
    assert find_secret("docker run -e H=\"$(caddy hash-password --plaintext 'Sprocket77')\" caddy") == (
        "hashed-password"
    )
    assert find_secret("useradd -p \"$(openssl passwd -1 'Stoat-Rye4')\" b") is not None
    assert find_secret('useradd -p "$(openssl passwd -1 "$PW")" b') is None
