"""Values given to names that mean secret: variables (`PGPASSWORD=x`), options (`--db-pass x`,
`-Dstore.password=x`, Windows' `/pass:x`), JSON fields (`"password": "x"`), config lines
(`password: x`, `api_secret = "x"`, `<password>x</password>`), headers (`Authorization: ...`)
and `Bearer` tokens; inside quoted arguments too (a JAAS string's `password="x"`).

A "password" name's value is a secret whatever it is (in a spaced config line, `password: x`,
one that could be a password: prose says "password: reset it"); a "token" name's when it looks
random.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from calmd.secrets.names import OPENPGP_TOOLS, chooses_a_key, name_kind, unnamed_key
from calmd.secrets.shellwords import Line, command_name, printf_output, shell_tokens, unquote
from calmd.secrets.values import (
    generated,
    is_placeholder,
    is_reference,
    key_id,
    literal,
    looks_random,
    password_like,
    quoted_reference,
)

# One shell word: quoted parts and single unquoted characters (no nested quantifier: linear time).
_VALUE = r"""(?:'[^']*'|"(?:[^"\\]|\\.)*"|[^\s'"&;|),])+"""
HINT = re.compile(r"pass|pw|secret|token|key|auth|cred|psk|cookie|bearer|appid|mnemonic|communit")
ASSIGNMENT = re.compile(rf"""(?:^|[\s;&|(,'"{{\[])([A-Za-z_][A-Za-z0-9_.-]*)=({_VALUE})""")
OPTION = re.compile(rf"(?:^|[\s=])--?([A-Za-z][A-Za-z0-9_.-]*[A-Za-z])(?:=|\s+(?=[^\s-]))({_VALUE})")
JSON_FIELD = re.compile(r"""["']([A-Za-z_][A-Za-z0-9_.-]*)["']\s*:\s*(?:"([^"]*)"|'([^']*)')""")
HEADER = re.compile(
    r"""(?:^|['"\s=])([A-Za-z][\w-]*)\s*:\s*['"]?"""
    r"""(?i:(?:bearer|basic|token|apikey|digest|sso-key|negotiate)\s+)?([^\s'"]+)"""
)
_HEADER_NAME = re.compile(r"(?i)(?:.*authorization|.*(?:token|api-?key|secret|-auth|cookie|session|-key))")
BEARER = re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{16,})")
# `password: x`, `api_secret = "x"`, `PrivateKey = x` (YAML, INI, TOML, properties, WireGuard)
_SPACED = re.compile(r"""(?:^|[\s'"{,;(\[])([A-Za-z_][\w.-]*)(?:\s*:\s+|\s+=\s*|=\s+)(['"]?)([^\s'"]+)""")
_CALL = re.compile(r"[a-z_][\w.]*\((?:['\")]|$)|\[.*\]$|\{.*\}$")  # code: `getpass.getpass(`, `[...]`
_CONVERSION = re.compile(r"%[-+ #0-9.]*[sdqb](?:\\n)*")
_REDIRECTION = re.compile(r"\d*[<>]|&>")  # a redirection's word ends a command's arguments
_WRITES = re.compile(r">|\btee\b")  # the line writes into a file
_BODY_ASSIGNMENT = re.compile(r"(?m)^[ \t]*(?:export[ \t]+)?([A-Za-z_][\w.-]*)[ \t]*[=:][ \t]*(\S.*)$")
_XML = re.compile(r"<([A-Za-z_][\w.-]*)>([^<>\s]{2,200})</\1>")
_WINDOWS = re.compile(r"(?:^|\s)/([A-Za-z][\w-]*):(\S+)")
_KEY_ID_HINT = re.compile(r"[0-9A-Fa-f]{8}")


def _options(text: str, *, openpgp: bool = False, depth: int = 0) -> str | None:
    """(`openpgp`: the line runs an OpenPGP tool, whose options but a passphrase take key ids)"""
    for pattern in (ASSIGNMENT, OPTION):
        for found in pattern.finditer(text):
            name = found.group(1)
            raw = found.group(2)
            kind = name_kind(name)
            if kind is None:
                if len(raw) >= 20 and unnamed_key(name):
                    value = literal(raw)
                    if value and generated(value, min_len=20):
                        return "token-argument"  # `SYNC_KEY=...`: a key whatever its qualifier says
                if depth == 0 and "=" in raw:
                    # a value that assigns in turn: `--add-config SCRAM-SHA-512=[password=x]`,
                    # `--set-string=db.password=x`, `-o opts=user=u,pass=x` (read as written:
                    # unquoted, `a\npassword=%s` would be `anpassword=%s`)
                    rule = _options(raw, openpgp=openpgp, depth=1)
                    if rule:
                        return rule
                continue
            in_connection = pattern is ASSIGNMENT and _connection_string(text, found)
            if pattern is ASSIGNMENT and name in _SHELL_PWD and not in_connection:
                continue  # `PWD=/srv/app make`: the shell's working directory
            if in_connection and raw.startswith("{") and kind == "password":
                braced = raw[1:].rstrip("}")  # ODBC quotes a value in braces: `Pwd={a;b}`
                if braced and not re.fullmatch(r"[A-Za-z_ ]+", braced):
                    return "password-argument"  # (`{password}`, `{your_password}`: placeholders)
            value = literal(raw)
            if value is None or (pattern is OPTION and re.match(r"(?:id|src|env|type|target)=", value)):
                continue  # `docker build --secret id=x,src=file` names a file
            if key_id(value) and (chooses_a_key(name) or (openpgp and "passphrase" not in name.lower())):
                continue  # `-c user.signingkey=3AA5C34371567BD2`, `gpg --export-secret-keys 3AA5...`
            if name == "pass" and value.isdigit() and len(value) <= 2:
                continue  # `ffmpeg -pass 1`: the first of a two-pass encode
            if (value.startswith("{{") and "}}" in value) or _CONVERSION.fullmatch(raw.strip("'\"")):
                continue  # a template (`password={{ vault_pw }}`), printf's `%s` (its argument is judged)
            if kind == "password" or looks_random(value):
                return "password-argument" if kind == "password" else "token-argument"
    return None


# `PWD` and `OLDPWD` are the shell's working directories; in a connection string (`UID=sa;PWD=x`,
# ODBC's and ADO's) `PWD` is the password: a `;` beside it says which.
_SHELL_PWD = frozenset({"PWD", "OLDPWD"})


def _connection_string(text: str, found: re.Match[str]) -> bool:
    before = text[max(0, found.start(1) - 1) : found.start(1)]
    return before == ";" or text[found.end() : found.end() + 1] == ";" or ";" in found.group(2)


def _fields(text: str, *, literal_text: bool = False, written: bool = False) -> str | None:
    """(`literal_text`: single-quoted or printed: `$` and `/` are characters; `written`: the line
    writes into a file, so a config line there is one, not prose)"""
    for found in JSON_FIELD.finditer(text):
        kind = name_kind(found.group(1), bare_key=True)
        value = found.group(2) if found.group(2) is not None else found.group(3)
        if kind and not is_reference(value.strip("'\"")) and (kind == "password" or looks_random(value)):
            return "json-secret"
    for found in _XML.finditer(text):
        kind = name_kind(found.group(1), bare_key=True)
        value = found.group(2)
        if kind and not is_reference(value) and (kind == "password" or looks_random(value)):
            return "config-secret"
    for found in _SPACED.finditer(text):
        kind = name_kind(found.group(1), bare_key=True)
        value = found.group(3).rstrip(",;")
        if value.endswith("}") and "{" not in value:
            value = value.rstrip("}")  # `{password: x}`
        # quoted, or the last word of its line (`password: x` in a YAML line): taken as written
        literal_value = bool(found.group(2)) or text[found.end() : found.end() + 1] in ("", "\n")
        if kind is None or _CALL.match(value):
            continue
        if is_reference(value) and not (literal_text and literal_value and not quoted_reference(value)):
            continue
        if kind == "token":
            if looks_random(value):
                return "config-secret"
        elif password_like(value, quoted=literal_value) or (written and literal_value and value.isalpha()):
            return "config-secret"
    return None


def _headers(text: str) -> str | None:
    for found in HEADER.finditer(text):
        name, value = found.group(1).lower(), found.group(2)
        if not _HEADER_NAME.fullmatch(name) or is_reference(value) or len(value) < 8:
            continue
        if "authorization" in name or "token" in name or looks_random(value.partition("=")[2] or value):
            return "auth-header"
    bearer = BEARER.search(text)
    if bearer and not bearer.group(1).startswith("$"):
        return "auth-header"
    return None


def _windows_options(text: str) -> str | None:
    """`/pass:x`, `/password:x`, `/p:x` (RDP clients, `cmdkey`, `wmic`, `net use`)."""
    for found in _WINDOWS.finditer(text):
        name, raw = found.group(1), found.group(2)
        kind = "password" if name.lower() in ("p", "rp") else name_kind(name)
        value = literal(raw)
        if kind and value and value != "*" and (kind == "password" or looks_random(value)):
            return "password-argument"
    return None


def _escaped_lines(text: str) -> str:
    """A quoted text as `printf` and `echo -e` write it: `\\n`, `\\r` and `\\t` escapes as the
    characters they stand for (ANSI-C quoting, `$'a\\nb'`, is resolved by unquote already)."""
    if "\\" not in text:
        return text
    return text.replace("\\r\\n", "\n").replace("\\n", "\n").replace("\\t", "\t")


def _keyword_lines(text: str, *, written: bool, literal_text: bool = False) -> str | None:
    """Config lines in a text of several lines, or in one line written into a file: `keyword
    value` (msmtp's and netrc's `password X`, fetchmail's `pass X`; a `.netrc`'s `machine h login
    u password p` on one line reads the same) and `name=value` (an INI's `pass=X`), the value
    the rest of its line. `password reset flow` is prose; in a config file's lines written
    whole, a value is taken as written."""
    lines = "\n" in text.strip()
    if not lines and not written:
        return None
    as_written = written and lines
    for row in text.split("\n")[:256]:
        words = row.split()
        pairs = [(word, words[k + 1].strip("'\"")) for k, word in enumerate(words[:-1])]
        assigned = _ROW_ASSIGNMENT.search(row)
        if assigned:
            pairs.append((assigned.group(1), assigned.group(2).strip().strip("'\"")))
        for name, value in pairs:
            if not re.fullmatch(r"[A-Za-z_][\w.-]*", name) or name_kind(name, bare_key=True) != "password":
                continue
            if not value or _no_secret(value, literal_text=literal_text):
                continue
            if password_like(value, quoted=as_written) or generated(value):
                return "config-secret"
    return None


_ROW_ASSIGNMENT = re.compile(r"(?:^|[ \t])([A-Za-z_][\w.-]*)[ \t]*=[ \t]*(\S.*)")  # (mutt's `set x=`)


def _no_secret(value: str, *, literal_text: bool) -> bool:
    """A value written in a quoted text that names no secret: a template, a path, a placeholder,
    and, where the shell expands it (not single-quoted), an expansion."""
    return quoted_reference(value) or (not literal_text and value.startswith(("$", "`")))


# A path in a structured-data edit (jq, yq, dasel, gojq: `.db.password = "x"`, `.a["api-key"] |=
# "x"`): a selector's last key and the quoted literal assigned to it. (`==` compares; `$pw`,
# `env.PW`, `strenv(PW)` are references; the key is found by the `.` or `[` before it: linear.)
_SELECTOR_ASSIGNMENT = re.compile(
    r"""(?:\.([A-Za-z_][\w-]*)|\[\s*["']([\w.-]+)["']\s*\])\s*(?:\|=|:=|\+=|=(?!=))\s*"""
    r"""(?:"((?:[^"\\]|\\.)*)"|'([^']*)')"""
)


def _selector_assignments(text: str) -> str | None:
    if "=" not in text or ("." not in text and "[" not in text):
        return None
    for found in _SELECTOR_ASSIGNMENT.finditer(text):
        name = found.group(1) or found.group(2)
        value = found.group(3) if found.group(3) is not None else found.group(4)
        kind = name_kind(name, bare_key=True)
        if kind is None or not value or quoted_reference(value):
            continue
        if kind == "password" or looks_random(value):
            return "config-secret"
    return None


# A secret's name given as the name of a name/value pair: Kubernetes' `{"name": "DB_PASSWORD",
# "value": "x"}`, CloudFormation's `ParameterKey=DbPassword,ParameterValue=x`, a JSON patch's
# `{"path": "/data/password", "value": "x"}`, `Name=...,Value=...`.
_NAME_VALUE = re.compile(
    r"""(?i)["']?(?:name|key|path|parameterkey)["']?\s*[:=]\s*["']?([\w./:-]{1,128})["']?\s*,\s*"""
    r"""["']?(?:value|parametervalue)["']?\s*[:=]\s*(?:"([^"]*)"|'([^']*)'|([^\s,'"}\]]+))"""
)


def _name_value_pairs(text: str) -> str | None:
    for found in _NAME_VALUE.finditer(text):
        name = re.split(r"[./:]", found.group(1).rstrip("/"))[-1]
        value = next((g for g in found.groups()[1:] if g is not None), "")
        kind = name_kind(name)
        bare = found.group(4) is not None  # (a quoted string's `/` and `@` are its characters)
        if kind is None or not value or (is_reference(value) if bare else quoted_reference(value)):
            continue
        if kind == "password" or looks_random(value):
            return "config-secret"
    return None


def _quoted_texts(line: Line) -> Iterator[tuple[str, bool]]:
    """The contents of a line's quoted words that hold a name and a value (a JAAS string, a
    connection string, a config snippet): read as the tool reads them, escapes resolved; and
    whether they were single-quoted (then `$x` is no expansion)."""
    for word in line.words:
        if ("'" in word or '"' in word) and ("=" in word or ":" in word or "<" in word or "\\n" in word):
            inner = unquote(word)
            if inner != word and HINT.search(inner.lower()):
                yield inner, word.startswith(("'", "$'"))  # (ANSI-C quoting keeps `$` too)


def named_value_rule(line: Line) -> str | None:
    """(Only for a line whose lower case holds a HINT.)"""
    text = line.requoted  # `"--password=x"` read as `--password="x"`
    openpgp = _KEY_ID_HINT.search(text) is not None and any(
        command_name(words[0]) in OPENPGP_TOOLS for words in line.commands
    )
    rule = _options(text, openpgp=openpgp) or _fields(text) or _headers(text)
    if rule is None and "/" in text and ":" in text:
        rule = _windows_options(text)
    if rule is None and ("'" in text or '"' in text):
        written = _WRITES.search(text) is not None
        for inner, single in _quoted_texts(line):
            lines = _escaped_lines(inner)  # `printf 'a\nb'`, `echo -e "..."`: the lines it writes
            rule = (
                _options(lines) or _fields(lines, literal_text=single, written=written)
                or _keyword_lines(lines, written=written, literal_text=single)
                or _selector_assignments(inner)
            )  # fmt: skip
            if rule:
                break
    if rule is None and "alue" in text:
        rule = _name_value_pairs(text)
    if rule is None and "printf" in text:
        rule = _printed(line)
    if rule is None and "<<" in text:
        rule = _here_documents(text)
    return rule


def _here_documents(text: str) -> str | None:
    """A here-document's lines as the file they make holds them (`cat > .env <<'EOF'`: with the
    delimiter quoted, `$` and `/` in a value are its characters; unquoted, `$X` expands)."""
    for kind, body in shell_tokens(text):
        if kind not in ("heredoc", "heredoc-literal") or not body:
            continue
        for found in _BODY_ASSIGNMENT.finditer(body):
            name_is = name_kind(found.group(1), bare_key=True)
            value = found.group(2).strip().strip("'\"")
            if not name_is or not value or is_placeholder(value) or quoted_reference(value):
                continue
            if kind == "heredoc" and ("$" in value or "`" in value):
                continue  # the shell puts a value there
            if name_is == "password" or looks_random(value):
                return "config-secret"
    return None


def _printed(line: Line) -> str | None:
    """What `printf FORMAT ARGS` writes (a config line whose value is printf's argument)."""
    for words in line.commands:
        if command_name(words[0]) == "printf" and len(words) > 1 and words[1] != "-v":
            args = words[2:]
            args = args[: next((k for k, w in enumerate(args) if _REDIRECTION.match(w)), len(args))]
            printed = printf_output(words[1], args)
            written = _WRITES.search(line.text) is not None
            rule = (
                _options(printed) or _fields(printed, literal_text=True, written=written)
                or _keyword_lines(printed, written=written, literal_text=True)
            )  # fmt: skip
            if rule:
                return rule
    return None
