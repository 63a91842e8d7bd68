"""Secrets written into files: a credential file's line (`.netrc`, `.pgpass`, `.aws/credentials`,
`.npmrc`, docker's `config.json`, ...) by `echo`/`printf`/`tee`/a here-document/`sed -i`.
Private key material is keys.py's; config lines with a secret-named key (`password: x`,
`PrivateKey = ...`), base64 of `user:password` and lines of random base64 are judged wherever
they are written (calmd/secrets/named.py, randomness.py).
"""

from __future__ import annotations

import itertools
import re

from calmd.secrets.shellwords import SEPARATORS, WORD, unquote
from calmd.secrets.values import written_value

# A credential written into a file made to hold one: the file named anywhere in the command (an
# `>>` redirection, `tee -a`, a here-document, `sed -i`) and a line of its credential form with a
# literal value. (file pattern, credential line pattern: group 1 is the secret)
_CREDENTIAL_FILES: tuple[tuple[str, re.Pattern[str], re.Pattern[str]], ...] = (
    ("netrc", re.compile(r"[._]netrc\b"), re.compile(r"\b(?:password|passwd|account)\s+(\S+)")),
    (
        "aws-credentials",
        re.compile(r"\.aws/credentials\b|\.aws/config\b|\.boto\b|\.s3cfg\b"),
        re.compile(
            r"\b(?:aws_secret_access_key|aws_session_token|aws_security_token|secret_key)"
            r"\s*=\s*([^\s'\"]+)",
            re.IGNORECASE,
        ),
    ),
    (
        "pgpass",
        re.compile(r"\.pgpass\b"),  # host:port:database:user:password
        re.compile(r"(?:^|[\s'\"])[^\s:'\"]+:[^\s:]*:[^\s:]*:[^\s:]+:([^\s'\"]+)"),
    ),
    ("git-credentials", re.compile(r"\.git-credentials\b"), re.compile(r"://[^\s:/@'\"]*:([^\s@'\"]+)@")),
    (
        "npmrc",
        re.compile(r"\.npmrc\b|\.yarnrc"),
        re.compile(r"(?:_authToken|_auth|_password|npmAuthToken)[\s'\"]*[=:]\s*['\"]?([^\s'\"]+)"),
    ),
    ("pypirc", re.compile(r"\.pypirc\b"), re.compile(r"\bpassword\s*[=:]\s*([^\s'\"]+)")),
    (
        "docker-config",
        re.compile(r"\.docker/config\.json|\bconfig\.json\b"),
        re.compile(
            r"\\?[\"'](?:auth|identitytoken|registrytoken|password)\\?[\"']\s*:\s*\\?[\"']([^\"'\\]+)"
        ),
    ),
    (
        "mysql-config",
        re.compile(r"\.my\.cnf\b|\.mylogin\.cnf\b"),
        re.compile(r"\bpassword\s*=\s*([^\s'\"]+)"),
    ),
)


def credential_file_rule(cmd: str) -> str | None:
    # printf and `echo -e` write lines as `\n`: read them as the file will hold them
    text = cmd.replace("\\n", "\n").replace("\\t", "\t")
    quoted_spans: list[tuple[int, int]] | None = None
    for name, file_pattern, line_pattern in _CREDENTIAL_FILES:
        if not file_pattern.search(text):
            continue
        for found in itertools.islice(line_pattern.finditer(text), 16):  # a real command has a few
            if quoted_spans is None:
                quoted_spans = _single_quoted(text)
            quoted = any(a <= found.start(1) < b for a, b in quoted_spans)  # then `$x` is no expansion
            value = (found.group(1) if quoted else unquote(found.group(1))).strip("'\"").rstrip("\\")
            if _CONVERSION.fullmatch(value) and "printf" in text:  # the secret is printf's argument
                if _printf_argument_literal(text, found.start(1)):
                    return f"credential-file:{name}"
                continue
            if not value or file_pattern.search(value) or value.startswith(("{{", "${")):
                continue  # `grep password ~/.netrc` names the file; `{{ .Password }}`, npm's `${X}`
            if quoted or not value.startswith(("$", "`")):
                return f"credential-file:{name}"  # a random password may well start with `/` or `@`
    return None


def _single_quoted(text: str) -> list[tuple[int, int]]:
    """The spans of a command line that lie inside single quotes, as the shell reads it."""
    spans: list[tuple[int, int]] = []
    start = -1
    double = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if start >= 0:
            if c == "'":
                spans.append((start, i))
                start = -1
        elif c == "\\":
            i += 1
        elif c == '"':
            double = not double
        elif c == "'" and not double:
            start = i + 1
        i += 1
    if start >= 0:
        spans.append((start, n))
    return spans


_CONVERSION = re.compile(r"%[-+ #0-9.]*[a-zA-Z]")


def _printf_argument_literal(text: str, at: int) -> bool:
    """Whether the argument that `printf FORMAT ARG...` puts at offset `at` of its format (the
    n-th conversion, `%s`) is a literal value (not `$VAR`, not a path)."""
    for found in re.finditer(r"\bprintf\s+(?:-v\s+\S+\s+)?('[^']*'|\"(?:[^\"\\]|\\.)*\"|\S+)", text):
        start, end = found.span(1)
        if not start <= at < end:
            continue
        index = len(_CONVERSION.findall(text[start:at].replace("%%", "")))
        args = WORD.findall(text[end:])
        for arg in args:
            if arg in SEPARATORS or arg.startswith((">", "<", "|")):
                return False
            if index == 0:
                return written_value(arg) is not None
            index -= 1
    return False
