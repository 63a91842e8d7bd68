"""Credentials in code given on the command line (`python3 -c`, `node -e`, `ruby -e`, `php -r`,
`mongosh --eval`, `psql -c`, `mysql -e`, an `expect` script): a password-named field or keyword
with a quoted literal, an auth pair, a connect call's password, SQL that sets one, a literal
hashed as a password (`crypt('x')`, `password_hash('x')`) or sent at a password prompt; and a
password hashed inline by a command substitution (`$(caddy hash-password --plaintext x)`).
"""

from __future__ import annotations

import re

from calmd.secrets.named import HINT
from calmd.secrets.names import name_kind
from calmd.secrets.shellwords import WORD, command_name
from calmd.secrets.values import is_placeholder, literal, looks_random, password_like

# Credentials in code given on the command line (`python3 -c`, `node -e`, `ruby -e`, `php -r`,
# `mongosh --eval`, `psql -c`, `mysql -e`): a password-named field or keyword argument with a
# quoted literal (`password: 'x'`, `:password => 'x'`, `pwd = "x"`), an auth pair (`auth=('u',
# 'x')`, `HTTPBasicAuth('u', 'x')`, `.login('u', 'x')`), a connect call's password argument
# (`mysqli('h', 'u', 'x')`), and SQL that sets one (`IDENTIFIED BY 'x'`, `WITH PASSWORD 'x'`).
_QUOTED = r"""\\?(?P<{0}>['"])(?P<{1}>[^'"\\\n]*)\\?(?P={0})"""
_CODE_FIELD = re.compile(
    # `name: 'x'`, `name => 'x'`, `name = 'x'` (spaced: `NAME='x'` is the shell's, rule 2's)
    r"""(?:^|[\s{(,;:\[])[:$]?["']?(?P<name>[A-Za-z_][A-Za-z0-9_]*)["']?(?:\s*(?::|=>)|\s+=|=(?=\s))\s*"""
    + _QUOTED.format("q", "value")
)
_ARGUMENT = r"""(?:\\?['"][^'"\\\n]*\\?['"]|\$?[A-Za-z_][\w.\[\]'"]*)"""
_AUTH_PAIR = re.compile(
    r"""(?i)(?:\bauth\s*=\s*|\b\w*(?:basic|digest)auth|\.login|\.auth|\.authenticate|\bauthenticate)\s*"""
    r"""[(\[]\s*""" + _ARGUMENT + r"""\s*,\s*""" + _QUOTED.format("q", "value")
)
_CONNECT = re.compile(
    r"""(?i)(?:\bmysqli(?:_connect)?|\bmysql_connect|\bMySQLdb\.connect|\bpymysql\.connect|\bPDO|"""
    r"""\bDBI->connect|\bftplib\.FTP|\bFTP(?:_TLS)?)\s*\(\s*"""
    + rf"""{_ARGUMENT}\s*,\s*{_ARGUMENT}\s*,\s*{_QUOTED.format("q", "value")}"""
)
_SQL_PASSWORD = re.compile(
    r"""(?i)(?:\bidentified\s+(?:with\s+\S+\s+)?by(?:\s+password)?|"""
    r"""\b(?:user|role|login)\b[^;]{0,80}?\bpassword\s*=?|\bset\s+password\b[^;]{0,80}?=\s*(?:password\s*\()?|"""
    r"""\b(?:requirepass|masterauth)\b)\s*""" + _QUOTED.format("q", "value")
)
# A literal hashed as a password in code (`crypt.crypt('x')`, `password_hash('x')`, `bcrypt.hashpw(b'x'`,
# `make_password('x')`), or sent by an `expect` script after a password prompt.
_HASHED = re.compile(
    r"""(?i)\b(?:crypt|hashpw|password_hash|hash_password|make_password|generate_password_hash|mkpasswd|"""
    r"""bcrypt\.hash|argon2\.hash|passlib\.\w+\.hash)\s*\(\s*b?""" + _QUOTED.format("q", "value")
)
_SENT = re.compile(r"""(?i)assword[^;\n]{0,40}?[;\n]\s*(?:exp_)?send\s+(?:--\s+)?["']?([^"'\s\\$]+)""")
_SQL_HINT = re.compile(r"identified|password|requirepass|masterauth")
_AUTH_HINT = re.compile(r"auth|login")
_CONNECT_HINT = re.compile(r"connect|pdo|mysqli|ftp")


def _code_literal(value: str) -> bool:
    """A string literal in code that could be a password (not `''`, `<password>`, `${PW}`, `%s`)."""
    v = value.strip()
    return (
        v not in ("", "-", "***", "xxx", "...") and not is_placeholder(v)
        and not v.startswith(("$", "%s", "#{", "%("))
        and not (v.startswith("{{") and "}}" in v)
    )  # fmt: skip


def inline_code_rule(cmd: str, lowered: str) -> str | None:
    """(Each pattern is tried only when a word it needs is in the command: most commands have none.)"""
    if "'" not in cmd and '"' not in cmd:
        return None  # a code literal is quoted
    if _SQL_HINT.search(lowered):
        for found in _SQL_PASSWORD.finditer(cmd):
            if _code_literal(found.group("value")):
                return "sql-password"
    for hint, pattern in ((_AUTH_HINT, _AUTH_PAIR), (_CONNECT_HINT, _CONNECT)):
        if hint.search(lowered):
            for found in pattern.finditer(cmd):
                if _code_literal(found.group("value")):
                    return "code-credential"
    if "crypt" in lowered or "hash" in lowered:
        for found in _HASHED.finditer(cmd):
            if _code_literal(found.group("value")):
                return "code-credential"
    if "send" in lowered and "assword" in lowered:
        for found in _SENT.finditer(cmd):
            if _code_literal(found.group(1)):
                return "code-credential"
    if not HINT.search(lowered):
        return None
    for found in _CODE_FIELD.finditer(cmd):
        kind = name_kind(found.group("name"))
        value = found.group("value")
        if re.match(r"[;,)]\s", value):
            continue  # between two strings: `expect "Password:"; send "..."`
        if kind and _code_literal(value) and (kind == "password" or looks_random(value)):
            return "code-credential"
    return None


# --------------------------------------------------------------------------- hashed inline

# A command that makes a password's hash: its name or first word says so (`openssl passwd`,
# `mkpasswd`, `slappasswd`, `doveadm pw`, `caddy hash-password`, `bcrypt-cli`). Not the tools that
# change a user's password (`passwd bob`: the operand is a user) nor crackers (`hashcat`).
_HASHER = re.compile(r"passw|hash-?password|password-?hash|hashpw|bcrypt|scrypt|pbkdf|\bpw\b|mkpasswd")
_NOT_HASHERS = frozenset({"passwd", "chpasswd", "gpasswd", "smbpasswd", "ldappasswd", "yppasswd",
                          "vncpasswd", "chgpasswd", "mosquitto_passwd", "htpasswd", "hashcat", "john",
                          "pwgen"})  # fmt: skip
# Options whose value is no password: a salt, a method, a cost (`-salt`, `-m sha-512`, `-R 5000`).
_SETTING_OPTIONS = re.compile(
    r"-{1,2}(?:salt|S|m|method|R|rounds|C|cost|t|type|scheme|s?format|algorithm|a|alg)$"
)


def hashed_literal_rule(inner: str) -> str | None:
    """The command inside a substitution hashes a literal password (`$(slappasswd -s x)`,
    `$(caddy hash-password --plaintext x)`, `$(python3 -c 'import crypt; print(crypt.crypt("x"))')`)."""
    lowered = inner.lower()
    if not _HASHER.search(lowered):
        return None
    words = WORD.findall(inner)
    if not words or command_name(words[0]) in _NOT_HASHERS:
        return None
    head = " ".join(words[:2]).lower()
    if not _HASHER.search(head):
        return None
    for k, raw in enumerate(words[1:], 1):
        if raw.startswith("-") or _SETTING_OPTIONS.match(words[k - 1]):
            continue
        value = literal(raw)
        if value and (password_like(value) or raw[:1] in "'\"") and not _HASHER.search(value.lower()):
            return "hashed-password"
    return None
