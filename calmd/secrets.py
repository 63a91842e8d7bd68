"""Credential detection for shell commands: a command that holds a secret is never stored.

Three kinds of evidence (docs/history.md lists each rule with an example):
1. Token shapes issued by well-known services (AWS, GitHub, GitLab, Slack, Stripe, npm, ...):
   the same families atuin's history filter covers.
2. Credential variables and options: `AWS_SECRET_ACCESS_KEY=...`, `--password x`, `-p'x'`,
   `TOKEN=...`: a literal value given to a password-like name is always dropped; a value given to
   a token/key-like name is dropped when it looks random (Shannon entropy).
3. Credentials inside URLs (`https://user:pass@host`) and HTTP auth headers.

A value that is a shell expansion (`$VAR`, `$(cmd)`) is not a secret: it names where the secret
lives. Git object ids (40 hex digits) alone are not flagged: they are everywhere in history.
"""

from __future__ import annotations

import math
import re
from collections import Counter

# 1. Service token shapes.
TOKEN_PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern)
    for name, pattern in {
        "aws-access-key-id": r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}\b",
        "aws-secret-env": r"\bAWS_(?:SECRET_ACCESS_KEY|SESSION_TOKEN|ACCESS_KEY_ID)\s*=\s*[^\s$]",
        "azure-key-env": r"\bAZURE_\w*(?:KEY|SECRET)\s*=\s*[^\s$]",
        "gcp-key-env": r"\bGOOGLE_(?:SERVICE_ACCOUNT_KEY|APPLICATION_CREDENTIALS_JSON)\s*=\s*[^\s$]",
        "github-token": r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b",
        "github-fine-grained-pat": r"\bgithub_pat_[A-Za-z0-9_]{50,255}\b",
        "gitlab-token": r"\bgl(?:pat|dt|rt|ptt|cbt|soat)-[A-Za-z0-9_\-]{20,}",
        "slack-token": r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",
        "slack-webhook": r"hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9/_\-]+",
        "stripe-key": r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}\b",
        "npm-token": r"\bnpm_[A-Za-z0-9]{36}\b",
        "pypi-token": r"\bpypi-[A-Za-z0-9_\-]{50,}",
        "openai-key": r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{32,}",
        "google-api-key": r"\bAIza[0-9A-Za-z_\-]{35}\b",
        "private-key-block": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
        "jwt": r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    }.items()
}

# 2. Names that hold secrets, as an option (`--db-password x`, `--token=x`) or an assignment
# (`DB_PASSWORD=x`), the name *ending* in the word (so `--password-file`, `--password-stdin` and
# the `pwd` command are not matched). PASSWORD-like values are secret whatever they look like;
# TOKEN-like names also label harmless values (`--token-type bearer`), so theirs must look random.
_PASSWORD_WORDS = r"pass(?:word|wd|phrase)?|pwd|secret"
_TOKEN_WORDS = r"token|api[_-]?key|apikey|access[_-]?key|auth[_-]?key|private[_-]?key|credentials?"
_VALUE = r"""(?:'[^']*'|"[^"]*"|[^\s'"]+)"""
OPTION = re.compile(
    rf"(?i)(?:^|\s)--?(?!no-)(?:[\w-]*[-_])?({_PASSWORD_WORDS}|{_TOKEN_WORDS})(?:=|\s+)({_VALUE})"
)
ASSIGNMENT = re.compile(
    rf"(?i)(?:^|[\s;&|(])(?:[A-Za-z_][\w]*_)?({_PASSWORD_WORDS}|{_TOKEN_WORDS})=({_VALUE})"
)
# mysql -pSECRET (attached: `mysql -p db` prompts), sshpass -p SECRET.
SHORT_PASSWORD = re.compile(
    r"(?:^|[\s;&|])(?:(?:mysql|mysqldump|mariadb)\b[^|;&]*?\s-p(\S+)|sshpass\s+-p\s*(\S+))"
)
URL_CREDENTIALS = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@]+:([^\s/@]+)@")
AUTH_HEADER = re.compile(
    r"(?i)\b(?:authorization|x-api-key|private-token)\s*:\s*(?:bearer\s+|basic\s+|token\s+)?(\S+)"
)
BEARER = re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/=\-]{16,})")

ENTROPY_BITS = 3.0  # bits per character; random base64 is ~5.5-6, hex ~3.7-4, English words ~2.5-3
MIN_RANDOM_LEN = 12


def shannon_entropy(text: str) -> float:
    """Bits per character of `text` under its own character frequencies."""
    if not text:
        return 0.0
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def looks_random(value: str) -> bool:
    return len(value) >= MIN_RANDOM_LEN and shannon_entropy(value) >= ENTROPY_BITS


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _is_reference(value: str) -> bool:
    """`$VAR`, `${VAR}`, `$(cmd)`, `-`, empty, or a path to a file: where a secret lives, not one."""
    return not value or value.startswith(("$", "-", "<", "@", "/", "~/", "./")) or value in ("''", '""')


def find_secret(cmd: str) -> str | None:
    """The name of the first rule that says `cmd` holds a credential, or None."""
    for name, pattern in TOKEN_PATTERNS.items():
        if pattern.search(cmd):
            return name
    for pattern in (OPTION, ASSIGNMENT):
        for found in pattern.finditer(cmd):
            word, raw = found.group(1).lower(), found.group(2)
            value = _unquote(raw)
            if not value or value.startswith(("$", "<")) or (raw == value and _is_reference(value)):
                continue
            if re.fullmatch(_PASSWORD_WORDS, word):
                return "password-argument"
            if looks_random(value):
                return "token-argument"
    short = SHORT_PASSWORD.search(cmd)
    if short and not _unquote(short.group(1) or short.group(2)).startswith("$"):
        return "password-option"
    url = URL_CREDENTIALS.search(cmd)
    if url and not url.group(1).startswith("$"):
        return "url-credentials"
    for pattern in (AUTH_HEADER, BEARER):
        header = pattern.search(cmd)
        if header and not _unquote(header.group(1)).startswith("$"):
            return "auth-header"
    return None
