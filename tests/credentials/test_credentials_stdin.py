"""A secret fed to a command that reads one on standard input (calmd/secrets/stdin.py): through
a pipe, a here-string, a here-document or a process substitution. Each form holds 200 random
passwords (single-quoted, as a user quotes a password full of punctuation); the same forms with
the secret where it lives are kept."""

from __future__ import annotations

import pytest

from tests.credentials.forms import flagged, missed

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
    # a Basic credential built inline: base64 of a literal `user:password`
    "echo -n '{user}:{pair_secret}x1' | base64",
    "curl -H \"Authorization: Basic $(printf '%s' '{user}:{pair_secret}x1' | base64)\" https://{host}/",
]


@pytest.mark.parametrize("form", FED_FORMS)
def test_200_random_passwords_fed_to_a_reader_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


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
    'echo -n "$API_USER:$API_PASS" | base64',
    "echo 'https://{host}/releases/download/v1.4.2/tool-1.4.2.jar' | base64",
    "echo hello:world | base64",
]


@pytest.mark.parametrize("form", FED_REFERENCES)
def test_the_same_forms_with_the_secret_elsewhere_are_kept(form: str) -> None:
    assert not flagged([form])
