"""Tools' own places for a secret (calmd/secrets/tools.py): admin tools' positional passwords,
a tool's `config set` of a secret, quoted options and ANSI-C quoting. Each form holds 200 random
passwords."""

from __future__ import annotations

import random
import string

import pytest

from calmd.secrets import find_secret, literal
from tests.credentials.forms import RNG_SEED, flagged, missed, random_word

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


# Archivers' and encryption tools' passwords, attached to their flag or after a flag whose name
# says nothing of a password but to its tool; Wi-Fi and network tools' positional passphrases;
# database shells that take a password positionally (issue 39's fifth round).
ARCHIVE_FORMS = [
    "rar a -hp'{secret}' {user}.rar docs/",
    "unrar x -p'{secret}' backup.rar",
    "7z a -p'{secret}' -mhe=on {user}.7z dir",
    "zip -P '{secret}' -r {user}.zip dir",
    "openssl enc -aes-256-cbc -k '{secret}' -in a -out a.enc",
    "openssl enc -d -aes-256-cbc -pass 'pass:{secret}' -in a.enc",
    "veracrypt -t --mount {user}.hc /mnt -p '{secret}' --non-interactive",
    "arj a -g'{secret}' {user}.arj files",
    "qpdf --encrypt '{secret}' '{secret}x' 256 -- in.pdf out.pdf",
    "ccrypt -e -K '{secret}' notes.txt",
    "mcrypt -k '{secret}' {user}.txt",
    "zpaq a backup.zpaq docs -key '{secret}'",
    "aescrypt -e -p '{secret}' {user}.txt",
    "steghide embed -cf cover.jpg -ef {user}.txt -p '{secret}'",
]
NETWORK_FORMS = [
    "networksetup -setairportnetwork en0 {user}-wifi '{secret}'",
    "networksetup -addpreferredwirelessnetworkatindex en0 {user} 0 WPA2 '{secret}'",
    "nmcli dev wifi connect {user} password '{secret}'",
    "nmcli connection modify {user} 802-1x.password '{secret}'",
    "wpa_passphrase {user} '{secret}'",
    "iwctl --passphrase '{secret}' station wlan0 connect {user}",
    "netsh wlan set hostednetwork mode=allow ssid={user} key={pair_secret}",
    "iwconfig wlan0 essid {user} key s:'{secret}'",
    "iw dev wlan0 connect {user} key 0:{pair_secret}",
    "create_ap wlan0 eth0 {user} '{secret}'",
    "isql {user}_dsn {user} '{secret}'",
    "iusql -v warehouse {user} '{secret}'",
    "db2 connect to SAMPLE user {user} using '{secret}'",
    'db2 "connect to sample user {user} using {pair_secret}"',
]


@pytest.mark.parametrize("form", ARCHIVE_FORMS + NETWORK_FORMS)
def test_200_random_passwords_given_to_archivers_and_network_tools_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


ARCHIVE_AND_NETWORK_HARMLESS = [
    "rar a -hp {user}.rar docs",
    "unrar x -p- backup.rar",
    "7z x {user}.7z -o/tmp/out",
    "zip -r {user}.zip dir",
    "openssl enc -d -aes-256-cbc -kfile key.txt -in a.enc",
    "veracrypt -t --mount {user}.hc /mnt --keyfiles /run/{user}.key",
    "qpdf --decrypt --password-file=pw.txt in.pdf out.pdf",
    "ccrypt -d -k /run/{user}.key notes.txt.cpt",
    "steghide extract -sf {user}.jpg",
    "arj x {user}.arj",
    "zpaq x backup.zpaq -to /tmp/{user}",
    "networksetup -setairportnetwork en0 {user}-wifi",
    "networksetup -getairportnetwork en0",
    "nmcli dev wifi connect {user} --ask",
    "isql -v {user}_dsn",
    "iwctl station wlan0 connect {user}",
    "db2 connect to SAMPLE",
    "iwconfig wlan0 essid {user} key off",
    "iw dev wlan0 connect {user}",
    "nmcli connection modify {user} wifi-sec.key-mgmt wpa-psk",
    "netsh wlan show profile name={user} key=clear",
    "create_ap wlan0 eth0 {user}",
    'isql -U sa -P "$PW" -S {host}',
    "db2 connect to SAMPLE user {user}",
]


@pytest.mark.parametrize("form", ARCHIVE_AND_NETWORK_HARMLESS)
def test_prompts_key_files_and_settings_are_kept(form: str) -> None:
    assert not flagged([form])
