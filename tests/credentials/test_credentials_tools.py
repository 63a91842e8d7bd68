"""Tools' own places for a secret (calmd/secrets/tools.py): admin tools' positional passwords,
a tool's `config set` of a secret, quoted options and ANSI-C quoting. Each form holds 200 random
passwords."""

from __future__ import annotations

import random
import string

import pytest

from calmd.secrets import find_secret, literal
from tests.credentials.forms import RNG_SEED, missed, random_word

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
QUOTING_FORMS = [
    'mysql -u {user} "--password={dq_secret}" shop',
    "mysqldump '--password={secret}' --all-databases",
    "curl \"--user\" '{user}:{secret}' https://{host}/api",
    'wget "--http-password={dq_secret}" https://{host}/x.pdf',
    "export DB_PASSWORD=$'{ansi_secret}'",
    "mysql -u root -p$'{ansi_secret}' shop",
    "docker login -u {user} -p $'{ansi_secret}' {host}",
]
CONFIG_FORMS = [
    "aws configure set aws_secret_access_key '{secret}'",
    "aws configure set aws_secret_access_key '{secret}' --profile {user}",
    "npm config set //{host}/:_authToken '{secret}'",
    "git config --global user.password '{secret}'",
]


@pytest.mark.parametrize("form", ADMIN_FORMS + QUOTING_FORMS + CONFIG_FORMS)
def test_200_random_passwords_given_to_tools_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


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


@pytest.mark.parametrize(
    ("value", "text"),
    [("$'hunter\\x32'", "hunter2"), ("$'a\\'b'", "a'b"), ("$'\\101\\u00e9'", "Aé"), ('$"x y"', "x y")],
)
def test_ansi_c_quoting_is_read_as_the_shell_reads_it(value: str, text: str) -> None:
    assert literal(value) == text
    assert find_secret(f"export DB_PASSWORD={value}") == "password-argument"


def test_tool_rules_name_the_tool_family() -> None:
    assert find_secret("mysql -u root -phunter2 shop") == "password-option"
    assert find_secret("curl -u admin:hunter2 https://ci.local") == "http-user"
    assert find_secret("snmpwalk -v3 -u ops -A 'Harbor#Light9' -X Fern.Quill77 sw1") == "snmp-secret"
    assert find_secret("snmpwalk -v2c -c public sw1 system") is None
