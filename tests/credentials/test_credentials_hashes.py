"""Password hashes in crypt(3)'s formats and their kin (calmd/secrets/hashes.py): md5-crypt,
Apache's apr1, sha-crypt with and without rounds, bcrypt, yescrypt, argon2id, LDAP's {SSHA},
Django's pbkdf2, given to usermod, chpasswd -e, an htpasswd line, a config edit, Ansible, a
secret. Each form holds 200 hashes made from random bytes; the look-alikes hold `$1$2` of awk
and perl, a grep for `$6$`, a cracker's format name."""

from __future__ import annotations

import pytest

from calmd.secrets import find_secret
from tests.credentials.forms import flagged, missed

HASHES = [
    "sudo usermod -p '{sha512crypt}' {user}",
    "echo '{user}:{md5crypt}' | sudo chpasswd -e",
    "echo '{user}:{apr1}' >> /etc/nginx/.htpasswd",
    "printf '{user}:{bcrypt}\\n' > /etc/caddy/users",
    "useradd -m -p '{yescrypt}' {user}",
    "kubectl create configmap {user}-auth --from-literal=hash='{argon2}'",
    "yq -i '.users.{user}.hashedPassword = \"{sha256crypt}\"' config.yaml",
    "ldapmodify -x -D cn=admin <<< 'userPassword: {ldap_ssha}'",
    "python manage.py shell -c \"User.objects.filter(username='{user}').update(password='{django_hash}')\"",
    "echo 'root:{sha512crypt}:19000:0:99999:7:::' >> shadow.bak",
    "ansible all -m user -a \"name={user} password='{sha512crypt}'\"",
    "http GET 'https://{host}/api/devices?user_api_hash={bcrypt}&id=42'",
]


@pytest.mark.parametrize("form", HASHES)
def test_200_random_password_hashes_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


HARMLESS = [
    "grep '$6$' /etc/shadow",
    "awk -F: '{{print $1$2}}' /etc/passwd",
    "echo $1$2$3",
    "perl -pe 's/(\\d+)-(\\d+)/$2$1/g' {user}.txt",
    "john --format=sha512crypt --wordlist=rockyou.txt hashes.txt",
    "mkpasswd -m sha-512",
    "hashcat -m 1800 -a 0 shadow.txt rockyou.txt",
    "sed -i 's/$1$/X/' {user}.conf",
    "echo 'costs $5$10$20 for {user}'",
    "awk '{{s+=$5$6}} END {{print s}}' {user}.csv",
]


@pytest.mark.parametrize("form", HARMLESS)
def test_dollars_that_are_no_hash_are_kept(form: str) -> None:
    assert not flagged([form])


def test_the_rule_names_the_hash() -> None:
    assert find_secret("usermod -p '$1$abcd1234$Z8yXw7VuT6sR5qP4oN3mL.' bob") == "password-hash"
