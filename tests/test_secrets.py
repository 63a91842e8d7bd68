"""The credential filter: known token shapes, password options, URLs, headers; and no false alarms."""

from __future__ import annotations

from pathlib import Path

import pytest

from calmd.secrets import find_secret, shannon_entropy

SECRETS = {
    "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY": "aws-secret-env",
    "aws configure set aws_access_key_id AKIAIOSFODNN7EXAMPLE": "aws-access-key-id",
    "git clone https://ghp_abcdefghijklmnopqrstuvwxyz0123456789@github.com/x/y": "github-token",
    "export GH=github_pat_11ABCDEFG0123456789_" + "abcdefghij" * 4: "github-fine-grained-pat",
    "export GITLAB_TOKEN=glpat-abcdefghijklmnopqrst": "gitlab-token",
    "slack-cli --token xoxb-1234567890-abcdefghij": "slack-token",
    "curl -X POST https://hooks.slack.com/services/T000/B000/XXXX": "slack-webhook",
    "stripe login --api-key sk_live_abcdefghijklmnop1234": "stripe-key",
    "npm config set //registry.npmjs.org/:_authToken npm_abcdefghijklmnopqrstuvwxyz0123456789": "npm-token",
    "mysql -u root -phunter2 db": "password-option",
    "sshpass -p s3cret ssh host": "password-option",
    "psql postgres://bob:hunter2@db/app": "url-credentials",
    "docker login --password hunter2": "password-argument",
    "tool --password=hunter2": "password-argument",
    "heroku config:set DB_PWD=d83ZBWSR9j -a app": "password-argument",
    "export API_KEY=Zx8Qw2Lm9Rt4Vb7Np3": "token-argument",
    "TOKEN=9f8e7d6c5b4a39281706f5e4d3c2b1a0 ./run": "token-argument",
    "vault login -token='s.Zx8Qw2Lm9Rt4Vb7Np3aa'": "token-argument",
    "curl -H 'Authorization: Bearer abc123def456ghi789jkl' https://api": "auth-header",
    "curl -H 'X-Api-Key: 0a1b2c3d4e5f' https://api": "auth-header",
}

HARMLESS = [
    "git checkout 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39",  # a commit id, not a key
    "export PASSWORD_FILE=/etc/secret",
    "docker login --password-stdin",
    "mysql -p db",  # -p with a space prompts for the password
    "mysql -u root -p test_db",
    "echo $TOKEN",
    "export API_KEY=$(pass show api)",
    'curl -H "Authorization: Bearer $TOKEN" https://x',
    "kubectl get secrets",
    "pass show email",
    "passwd",
    "pwd | pbcopy",
    "gpg --passphrase-file key.txt -d f.gpg",
    "export KEY=up",
    "cat token.txt",
    "python mssqlclient.py -no-pass 10.0.0.1",
    'git commit -m "only pass the token as a prop"',
    'git config --global credential.helper "cache --timeout=3600"',
    "oauth --token-type bearer",
]


@pytest.mark.parametrize(("cmd", "rule"), SECRETS.items())
def test_secrets_are_found(cmd: str, rule: str) -> None:
    assert find_secret(cmd) == rule


@pytest.mark.parametrize("cmd", HARMLESS)
def test_harmless_commands_pass(cmd: str) -> None:
    assert find_secret(cmd) is None


def test_entropy() -> None:
    assert shannon_entropy("") == 0.0
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == 2.0


HISTORIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "histories" / "users"


@pytest.mark.skipif(not HISTORIES.is_dir(), reason="shared/data not beside the repo")
def test_false_alarm_rate_on_real_histories() -> None:
    """Real users' histories were scrubbed of obvious secrets already: nearly nothing should fire."""
    total = flagged = 0
    for path in sorted(HISTORIES.glob("*.txt")):
        for line in path.read_text(errors="surrogateescape").splitlines():
            total += 1
            flagged += find_secret(line) is not None
    assert total > 100_000
    assert flagged / total < 1e-4, (flagged, total)
