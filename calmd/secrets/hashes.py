"""A password's hash, known by its format wherever it stands: `usermod -p '$6$...'`, `echo
'user:$y$...' | chpasswd -e`, an htpasswd line (`$apr1$`, `$2y$`, `{SSHA}`), a config value set
to one (`hashedPassword = "$argon2id$..."`). A hash is not the password, but it is a copy an
attacker cracks offline (a chosen password falls to a dictionary in minutes), so it is kept out
of the history like the password itself.

The formats are crypt(3)'s modular form, `$id$[params$]salt$hash`, with the ids of glibc,
libxcrypt, BSD and passlib (md5-crypt `$1$`, Apache's `$apr1$`, sha-crypt `$5$`/`$6$` with
`rounds=N$`, bcrypt `$2a$`/`$2b$`/`$2y$`/`$2x$` and its cost, yescrypt `$y$`, gost-yescrypt
`$gy$`, scrypt `$7$`, argon2 `$argon2id$v=19$m=...,t=...,p=...$`, passlib's `$pbkdf2-sha256$`,
`$scrypt$`, `$bcrypt-sha256$`), Django's (`pbkdf2_sha256$ITERATIONS$salt$hash`, `argon2$...`),
and LDAP's `{SSHA}`-style schemes. What tells a hash from a word with dollars (`$1$2` in awk,
`'$6$'` in a grep) is its last field: 20+ characters of the hash alphabet, mixed as random text
mixes them.
"""

from __future__ import annotations

import re

from calmd.secrets.values import mixes

# `$id$`, optional parameter fields (`rounds=5000$`, `v=19$`, `m=65536,t=3,p=4$`, bcrypt's cost
# `10$`, yescrypt's `j9T$`), a salt field, and the hash. Every field is one run of characters
# without `$` (no nested quantifier: linear on a 64 KiB line).
_MODULAR = re.compile(
    r"(?<![\w$])\$(?:1|2[abxy]?|5|6|7|y|gy|md5|sha1|apr1|argon2(?:id|i|d)|pbkdf2(?:-sha\d+)?|scrypt|"
    r"bcrypt-sha256|sm3|sha256|sha512)\$"
    r"(?:[\w.,=+/-]{1,60}\$){0,4}"
    r"([A-Za-z0-9./+]{20,})"
)
# Django's hashers (`algorithm$iterations$salt$hash`): no leading `$`.
_DJANGO = re.compile(
    r"(?<![\w$])(?:pbkdf2_sha(?:256|1)|argon2|bcrypt_sha256|scrypt)\$(?:[\w.,=+/-]{1,60}\$){1,4}"
    r"([A-Za-z0-9./+=]{20,})"
)
# LDAP's schemes (`userPassword: {SSHA}base64`), and Dovecot's (`{SHA512-CRYPT}$6$...` is above).
_LDAP = re.compile(
    r"(?i)\{(?:SSHA|SHA|SSHA256|SSHA512|SHA256|SHA512|SMD5|MD5|PBKDF2[\w-]*|ARGON2)\}([A-Za-z0-9+/]{20,}={0,2})"
)
_HINT = re.compile(r"\$[0-9a-z][\w-]*\$|\}[A-Za-z0-9+/]{20}")


def _random_field(field: str) -> bool:
    """A hash's last field: random text in the crypt alphabet (`./0-9A-Za-z`) or base64, not a
    run of one class (`aaaaaaaaaaaaaaaaaaaa`, a path of words)."""
    body = field.rstrip("=")
    has_all, change = mixes(body.replace(".", "").replace("/", "").replace("+", ""))
    return len(set(body)) >= 0.4 * min(len(body), 40) and (has_all or change >= 0.4)


def password_hash_rule(cmd: str) -> str | None:
    if "$" not in cmd and "}" not in cmd:
        return None
    if _HINT.search(cmd) is None:
        return None
    for pattern in (_MODULAR, _DJANGO, _LDAP):
        for found in pattern.finditer(cmd):
            if _random_field(found.group(1)):
                return "password-hash"
    return None
