"""A private key's PEM block base64-encoded again (calmd/secrets/keys.py), as keys are passed
through environment variables, CI secrets and `base64 -d`: whole, cut in two at any place,
wrapped with `\\n` escapes, after a newline, in every key type. The look-alikes are the same
encoding of a certificate (a kubeconfig's certificate-authority-data) and of a public key."""

from __future__ import annotations

import pytest

from calmd.secrets import find_secret
from tests.credentials.forms import flagged, missed

ENCODED_KEYS = [
    "echo {pem_b64} | base64 -d > ~/.ssh/id_{user}",
    'export DEPLOY_KEY_B64="{pem_b64}"',
    "docker run -e KEY_DATA={pem_b64} {user}/app",
    'echo "{pem_head}" "{pem_tail}" | tr -d \' \' | base64 -d > key',
    "printf '%s' '{pem_lines}' | base64 -d > /tmp/{user}.key",
    "KEY_PART1={pem_head} KEY_PART2={pem_tail} ./deploy.sh",
    "echo '{pem_nl_b64}' | base64 --decode > /tmp/k",
]


@pytest.mark.parametrize("form", ENCODED_KEYS)
def test_200_encoded_private_keys_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


HARMLESS = [
    "kubectl config set clusters.{user}.certificate-authority-data {cert_b64}",
    "echo {pub_b64} | base64 -d > {user}.pub",
    "echo LS0tLS0K | base64 -d",
    "echo '{cert_b64}' | base64 -d | openssl x509 -noout -text",
]


@pytest.mark.parametrize("form", HARMLESS)
def test_encoded_certificates_and_public_keys_are_kept(form: str) -> None:
    assert not flagged([form])


def test_the_rule_names_key_material() -> None:
    cmd = "echo LS0tLS1CRUdJTiBPUEVOU1NIIFBSSVZBVEUgS0VZLS0tLS0K | base64 -d"
    assert find_secret(cmd) == "private-key-material"
