"""Cookies given on the command line: a session cookie is a login that needs no password (whoever
replays `curl -b 'JSESSIONID=...'` is that user until the session ends), so it is a secret.

A cookie string (`name=value; name=value`) is read where HTTP tools take one: the value of
`-b`/`--cookie` (curl and its kin, wget, ffuf, wfuzz, sqlmap, nikto...; `-sb` ends a cluster
of curl's short flags with it) and a `Cookie:` header (`-H 'Cookie: ...'`, `--header=...`,
httpie's `Cookie:...` item). A pair is a secret when its name says session or login (the
session ids of Java `JSESSIONID`, PHP `PHPSESSID`, ASP.NET `ASP.NET_SessionId` and `.ASPXAUTH`,
Express `connect.sid`, Django `sessionid`, Rails and Laravel `_*_session`, `remember_token`,
`auth`, `jwt`, `sid`...) and its value is no word or reference, or when its value looks
generated whatever its name. A file (`-b cookies.txt`, `@file`), an expansion (`"$COOKIE"`) and
settings (`lang=en; theme=dark`, `security=low`, `consent=yes`) are none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from calmd.secrets.shellwords import Line, unquote
from calmd.secrets.values import generated, is_placeholder

# Options whose value is a cookie string: curl's `-b` (alone, in a cluster `-sb`, or attached
# `-bNAME=V`), `--cookie`, and the spellings of other HTTP tools.
_COOKIE_OPTIONS = frozenset({"--cookie", "--cookies", "-cookie", "--cookie-string", "--cookie-header"})
_SHORT_CLUSTER = re.compile(r"-[A-Za-z]*b")
_HEADER = re.compile(r"(?i)(?:^|[\s=:'\"])cookie\s*:\s*(.+)")
# Names of cookies that hold a session or a login.
_SESSION_NAME = re.compile(
    r"(?i)sess|(?:^|[._-])sid$|^sid|auth|token|jwt|remember|login|logged|ident|secret|clearance|sso|saml|"
    r"oauth|credential|apikey|api_key|access"
)
_PAIR = re.compile(r"\s*([^=;\s]+)=([^;]*)")


def _pairs(cookies: str) -> Iterator[tuple[str, str]]:
    for piece in cookies.split(";")[:64]:
        found = _PAIR.match(piece)
        if found:
            yield found.group(1), found.group(2).strip().strip("'\"")


def _session_value(value: str) -> bool:
    """A session id: 8+ characters with a digit or mixed case, no spaces (`new`, `en`, `1` and
    `yes` are settings)."""
    return (
        len(value) >= 8
        and not any(c.isspace() for c in value)
        and (any(c.isdigit() for c in value) or (value.lower() != value and value.upper() != value))
    )


def secret_cookies(cookies: str) -> bool:
    """Whether a cookie string (`a=b; c=d`) holds a session's or login's cookie."""
    if "=" not in cookies:
        return False  # a file: `-b cookies.txt`
    for name, value in _pairs(cookies):
        if not value or value.startswith(("$", "`", "<", "{{")) or is_placeholder(value):
            continue
        if _SESSION_NAME.search(name) and _session_value(value):
            return True
        if generated(value.strip('"'), min_len=16):
            return True  # (`_ga=GA1.2.123456789.1700000000` is numbers: no)
    return False


def _cookie_strings(words: list[str]) -> Iterator[str]:
    """The cookie strings a command's words give: after a cookie option, or in a Cookie header."""
    for k, raw in enumerate(words):
        word = unquote(raw) if ("'" in raw or '"' in raw or "\\" in raw) else raw
        if raw.startswith(("$", '"$')):
            continue
        lowered = word.lower()
        if "cookie" in lowered:
            header = _HEADER.search(word)
            if header:
                yield header.group(1)
                continue
        flag, eq, attached = word.partition("=")
        if flag in _COOKIE_OPTIONS or (not eq and _SHORT_CLUSTER.fullmatch(word)):
            if eq:
                yield attached
            elif k + 1 < len(words) and not words[k + 1].startswith(("$", '"$')):
                yield unquote(words[k + 1])
        elif word.startswith("-b") and len(word) > 2 and word[2] != "-" and "=" in word:
            yield word[2:]  # `-bNAME=VALUE`


# What a line holds before its words are read: a cookie header or option, or a `-b` (most hold none).
COOKIE_HINT = re.compile(r"(?i)cookie|(?<!\S)['\"]?-[A-Za-z]{0,6}b")


def cookie_rule(line: Line) -> str | None:
    """(Only for a line where COOKIE_HINT is found.)"""
    for words in line.commands:
        for cookies in _cookie_strings(words):
            if secret_cookies(cookies):
                return "session-cookie"
    return None
