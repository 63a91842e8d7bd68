"""Credential detection for shell commands: a command that holds a secret is never stored,
trained on or suggested.

`find_secret(cmd)` names the first rule that says `cmd` holds a credential, or returns None.
The rules, cheapest first (docs/secrets.md lists each with where it comes from):
1. Token formats issued by services (AWS, GitHub, GitLab, Slack, Stripe, npm, PyPI, OpenAI,
   Anthropic, Google, Azure, Twilio, SendGrid, Discord, Telegram, Vault, ...): one combined
   regular expression over the whole command.
2. Named values: a variable, option, URL query parameter, JSON field or HTTP header whose
   *name* says password (`PGPASSWORD=x`, `--db-pass x`, `"password": "x"`, `?pwd=x`) is secret
   whatever its value; one whose name says token/key (`API_KEY=`, `--token`, `?api_key=`) is
   secret when its value looks random. Credentials in URLs (`scheme://user:pass@host`).
3. Tool rules: where a tool takes a password in an option of its own (`mysql -pX`,
   `curl -u user:pass`, `smbclient -U user%pass`, `7z -pX`, `ssh-keygen -N x`, `htpasswd -b`,
   `openssl -passin pass:x`, `kubectl --from-literal=password=x`, `helm --set a.password=x`...).
4. A standalone random-looking string (mixed case and digits, 20+ characters) that is not a
   known harmless shape (hex ids and checksums, UUIDs, base64 of ordinary text, public keys,
   content ids), and a bare 40-character AWS secret access key.

A value that is a shell expansion (`$VAR`, `${VAR}`, `$(pass show x)`) or a file path is not a
secret: it names where the secret lives. Bump DETECTOR_VERSION whenever a rule changes what is
flagged: stores scanned by an older version are re-scanned when opened (calmd/history/store.py).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DETECTOR_VERSION = 4  # 4: fed to stdin, admin positionals, key material, inline code, quoting
# (3: credential files, `config set`, token prefixes at any length, forget)

# --------------------------------------------------------------------------- 1. token formats

# (rule, needle, pattern): the pattern is only tried when the needle, a plain substring every
# match contains, is in the command (substring search runs at C speed; a regex alternation of
# seventy patterns would cost tens of microseconds per command). Word boundaries are checked after
# a match (_bounded).
TOKEN_FORMATS: tuple[tuple[str, str, str], ...] = (
    ("aws-access-key-id", "A", r"(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA)[A-Z2-7]{16}"),
    ("github-token", "gh", r"gh[pousr]_[A-Za-z0-9]{36,255}"),
    ("github-token", "github_pat_", r"github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}"),
    ("github-token", "gh1_", r"gh1_[A-Za-z0-9]{21}_[A-Za-z0-9]{59}"),
    ("github-token", "v1.", r"v1\.[0-9a-f]{40}"),
    ("gitlab-token", "gl", r"gl(?:pat|dt|rt|ptt|cbt|soat|ft|imt|agent|oas)-[A-Za-z0-9_-]{20,}"),
    ("gitlab-token", "GR1348941", r"GR1348941[A-Za-z0-9_-]{20}"),
    ("slack-token", "xox", r"xox[abposer]-(?=[0-9A-Za-z-]*\d)[0-9A-Za-z-]{10,}"),  # digits: team and user ids
    ("slack-token", "xapp-", r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+"),
    (
        "slack-webhook",
        "hooks.slack.com",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{20,}",
    ),
    ("stripe-key", "k_", r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("stripe-key", "whsec_", r"whsec_[A-Za-z0-9]{24,}"),
    ("npm-token", "npm_", r"npm_[A-Za-z0-9]{36}"),
    ("pypi-token", "pypi-AgE", r"pypi-AgE[A-Za-z0-9_-]{50,}"),
    ("openai-key", "T3BlbkFJ", r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20}T3BlbkFJ[A-Za-z0-9_-]{20,}"),
    ("openai-key", "sk-", r"sk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,}"),
    ("openai-key", "sk-", r"sk-[A-Za-z0-9]{48}"),
    ("anthropic-key", "sk-ant-", r"sk-ant-(?:api|admin)\d\d-[A-Za-z0-9_-]{80,}"),
    ("openrouter-key", "sk-or-v1-", r"sk-or-v1-[0-9a-f]{64}"),
    ("google-api-key", "AIza", r"AIza[0-9A-Za-z_-]{35}"),
    ("google-oauth", "GOCSPX-", r"GOCSPX-[A-Za-z0-9_-]{28}"),
    ("google-oauth", "ya29.", r"ya29\.[0-9A-Za-z_-]{30,}"),
    ("azure-storage-key", "AccountKey=", r"AccountKey=[A-Za-z0-9+/]{86}=="),
    ("azure-client-secret", "Q~", r"[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}"),
    ("azure-sas", "sig=", r"[?&]sig=[A-Za-z0-9%+/]{40,}"),
    ("twilio-key", "SK", r"SK[0-9a-f]{32}"),
    ("sendgrid-key", "SG.", r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),
    ("mailgun-key", "key-", r"key-[0-9a-f]{32}"),
    ("mailchimp-key", "-us", r"[0-9a-f]{32}-us\d{1,2}"),
    ("discord-token", ".", r"[MNO][A-Za-z0-9_-]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}"),
    ("discord-webhook", "/api/webhooks/", r"discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_-]{30,}"),
    ("telegram-bot-token", ":AA", r"(?:bot)?\d{8,10}:AA[A-Za-z0-9_-]{33}"),
    ("heroku-key", "HRKU-", r"HRKU-[A-Za-z0-9_-]{40,}"),
    ("digitalocean-token", "_v1_", r"do[opr]_v1_[0-9a-f]{64}"),
    ("shopify-token", "shp", r"shp(?:at|ca|pa|ss|tka)_[0-9a-fA-F]{32}"),
    ("vault-token", "hv", r"hv[sbr]\.[A-Za-z0-9_-]{24,}"),
    ("vault-token", "s.", r"s\.[A-Za-z0-9]{24}"),
    ("terraform-token", ".atlasv1.", r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,}"),
    ("doppler-token", "dp.", r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9_.-]{40,}"),
    ("databricks-token", "dapi", r"dapi[0-9a-f]{32}"),
    ("huggingface-token", "hf_", r"hf_[A-Za-z]{34}"),
    (
        "private-key-block",
        "PRIVATE KEY",
        r"-----BEGIN[A-Z ]{0,20} PRIVATE KEY(?: BLOCK)?-----(?:\\[nr]|\s)*[A-Za-z0-9+/=]{16,}",
    ),
    ("jwt", ".eyJ", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("netlify-token", "nf", r"nf[pcoub]_[0-9a-zA-Z]{36}"),
    ("pulumi-token", "pul-", r"pul-[0-9a-f]{40}"),
    ("age-secret-key", "AGE-SECRET-KEY-1", r"AGE-SECRET-KEY-1[0-9A-Z]{58}"),
    ("grafana-token", "gl", r"gl(?:sa|c)_[A-Za-z0-9_=+/-]{32,}"),
    ("linear-key", "lin_", r"lin_(?:api|oauth)_[A-Za-z0-9]{40}"),
    ("postman-key", "PMAK-", r"PMAK-[0-9a-f]{24}-[0-9a-f]{34}"),
    ("atlassian-token", "ATATT3", r"ATATT3[A-Za-z0-9_=-]{100,}"),
    ("docker-hub-token", "dckr_", r"dckr_(?:pat|oat)_[A-Za-z0-9_-]{27,}"),
    ("tailscale-key", "tskey-", r"tskey-(?:auth|api|client|scim|webhook)-[A-Za-z0-9]{6,}-[A-Za-z0-9]{20,}"),
    ("sentry-token", "sntr", r"sntr[ysu]_[A-Za-z0-9+/=_-]{40,}"),
    ("square-token", "EAAA", r"EAAA[A-Za-z0-9_-]{22,}"),
    ("square-token", "sq0", r"sq0(?:atp|csp)-[A-Za-z0-9_-]{22,}"),
    ("newrelic-key", "NR", r"NR(?:AK|AA|II|JS)-[A-Z0-9]{27}"),
    ("flyio-token", "fo1_", r"fo1_[A-Za-z0-9_-]{43}"),
    ("flyio-token", "FlyV1 ", r"FlyV1 fm\d_[A-Za-z0-9+/=_-]{40,}"),
    ("planetscale-token", "pscale_", r"pscale_(?:tkn|pw|oauth)_[A-Za-z0-9_.-]{32,}"),
    ("groq-key", "gsk_", r"gsk_[A-Za-z0-9]{48,}"),
    ("replicate-token", "r8_", r"r8_[A-Za-z0-9]{37}"),
    ("artifactory-token", "AKCp", r"AKCp[A-Za-z0-9]{69}"),
    ("alibaba-key", "LTAI", r"LTAI[A-Za-z0-9]{20}"),
    ("figma-token", "figd_", r"figd_[A-Za-z0-9_-]{40}"),
    ("supabase-token", "sbp_", r"sbp_[0-9a-f]{40}"),
    ("notion-token", "secret_", r"secret_[A-Za-z0-9]{43}"),
    ("notion-token", "ntn_", r"ntn_[A-Za-z0-9]{46}"),
    ("perplexity-key", "pplx-", r"pplx-[A-Za-z0-9]{48}"),
    ("xai-key", "xai-", r"xai-[A-Za-z0-9]{80}"),
    ("sendinblue-key", "xkeysib-", r"xkeysib-[0-9a-f]{64}-[A-Za-z0-9]{16}"),
    ("bitbucket-token", "ATBB", r"ATBB[A-Za-z0-9_=.-]{28,}"),
    ("buildkite-token", "bkua_", r"bkua_[a-f0-9]{40}"),
    ("circleci-token", "CCIPAT_", r"CCIPAT_[A-Za-z0-9]{22}_[a-f0-9]{40}"),
    ("rubygems-key", "rubygems_", r"rubygems_[0-9a-f]{48}"),
    ("dynatrace-token", "dt0c01.", r"dt0c01\.[A-Z0-9]{24}\.[A-Z0-9]{64}"),
    ("mapbox-token", "sk.eyJ", r"sk\.eyJ[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}"),
)
# needle -> [(rule, compiled pattern)]
_BY_NEEDLE: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
for _rule, _needle, _pattern in TOKEN_FORMATS:
    _BY_NEEDLE.setdefault(_needle, []).append((_rule, re.compile(_pattern)))
_WORDISH = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _bounded(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] is not part of a longer word (a token inside a longer random
    string or identifier is not the token)."""
    return (start == 0 or text[start - 1] not in _WORDISH or not text[start].isalnum()) and (
        end == len(text) or text[end] not in _WORDISH or not text[end - 1].isalnum()
    )


def _token_rule(cmd: str) -> str | None:
    for needle, patterns in _BY_NEEDLE.items():
        if needle not in cmd:
            continue
        for rule, pattern in patterns:
            for found in pattern.finditer(cmd):
                if _bounded(cmd, found.start(), found.end()):
                    return rule
    return None


# --------------------------------------------------------------------------- randomness


def shannon_entropy(text: str) -> float:
    """Bits per character of `text` under its own character frequencies."""
    if not text:
        return 0.0
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


ENTROPY_BITS = 3.0  # bits per character; random base64 is ~5.5-6, hex ~3.7-4, English words ~2.5-3
MIN_RANDOM_LEN = 12


def looks_random(value: str) -> bool:
    """A value given to a token/key-like name that looks generated rather than chosen."""
    return (
        len(value) >= MIN_RANDOM_LEN
        and shannon_entropy(value) >= ENTROPY_BITS
        and any(c.isdigit() for c in value)
        and not value.startswith(("http:", "https:"))
    )


def _class_of(c: str) -> int:
    return 0 if c.isdigit() else 1 if c.isupper() else 2 if c.islower() else 3


def _mixes(word: str) -> tuple[bool, float]:
    """(has upper, lower and digit; share of adjacent characters that change class). Random
    base62 changes class ~62% of the time, CamelCase words and names far less."""
    classes = [_class_of(c) for c in word]
    has_all = 0 in classes and 1 in classes and 2 in classes
    changes = sum(a != b for a, b in itertools.pairwise(classes))
    return has_all, changes / max(1, len(word) - 1)


def _decodes_to_text(word: str) -> bool:
    """base64 (or base64url) of ordinary printable text: an encoded message, not a key. A
    decoded `user:password` pair (HTTP basic auth) does not count as text."""
    padded = word + "=" * (-len(word) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) < 8:
        return False
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in raw)
    if printable < 0.95 * len(raw):
        return False
    text = raw.decode("ascii", "replace")
    return not re.fullmatch(r"[A-Za-z0-9._@+-]{1,64}:\S{3,}", text.strip())


# --------------------------------------------------------------------------- names and values

_PASSWORD_WORDS = ("password", "passwd", "passphrase", "pass", "pwd", "psk")
_NOT_PASS = ("bypass", "compass", "surpass", "encompass", "overpass", "underpass", "trespass", "nopass")
# Name endings that say the value is where a secret lives, or something about it, not the secret.
_REFERENCE_ENDINGS = (
    "file", "files", "path", "dir", "name", "names", "type", "length", "len", "size", "count", "id",
    "ids", "arn", "ref", "env", "stdin", "prompt", "policy", "store", "enabled", "enable", "mode",
    "url", "uri", "endpoint", "header", "helper", "cmd", "command", "program", "format", "version",
    "source", "provider", "manager", "backend", "timeout", "ttl", "expiry", "expires", "rotation",
    "min", "max", "hash", "algorithm", "algo", "method", "field", "key_id", "keyid", "fingerprint",
    "exchange", "mount", "location", "region", "server", "host", "port", "user", "username", "login",
)  # fmt: skip
_TOKEN_ENDINGS = (
    "token", "apikey", "api_key", "accesskey", "access_key", "secretkey", "privatekey", "private_key",
    "authkey", "auth_key", "accountkey", "account_key", "masterkey", "master_key", "signingkey",
    "signing_key", "encryptionkey", "encryption_key", "clientkey", "client_key", "licensekey",
    "license_key", "appkey", "app_key", "credential", "credentials", "creds", "auth", "sig",
    "signature", "appid", "secret", "key",
)  # fmt: skip

_NEGATORS = frozenset(
    {
        "no",
        "ask",
        "existing",
        "use",
        "show",
        "with",
        "allow",
        "require",
        "min",
        "max",
        "generate",
        "random",
        "reset",
        "rotate",
        "change",
        "forgot",
        "forgotten",
    }
)
# The words a name is cut into: `DB_PASSWORD`, `db-password`, `dbPassword`, `auth.password`.
_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def name_kind(name: str, *, bare_key: bool = False) -> str | None:
    """ "password" when a value given to `name` is a secret whatever it is, "token" when it is a
    secret if it looks random, None when the name says nothing secret. `bare_key`: a name that is
    just `key`/`secret`/`auth`/`sig` counts (in URL queries, not on command lines)."""
    parts = [p.lower() for p in _NAME_SPLIT.split(name) if p]
    if not parts:
        return None
    last = parts[-1]
    joined = "_".join(parts)
    if last in _REFERENCE_ENDINGS or not _NEGATORS.isdisjoint(parts[:-1]):
        return None  # ids, names, paths, lengths; `--no-password`, `existingSecret`
    flat = joined.replace("_", "")
    if last in _PASSWORD_WORDS or (flat.endswith(_PASSWORD_WORDS) and not flat.endswith(_NOT_PASS)):
        return "password"
    if "secret" in parts[:-1] or (last == "secret" and len(parts) > 1):
        return "password"  # `*_SECRET_KEY*=`, JWT_SECRET, CLIENT_SECRET
    if parts[0] == "azure" and last == "key":
        return "password"  # AZURE_*_KEY, as atuin
    if joined in ("aws_session_token", "google_service_account_key", "atuin_key"):
        return "password"
    if len(parts) == 1 and last in ("key", "secret", "auth", "sig", "signature", "appid") and not bare_key:
        return None  # `--key value`, `--secret name`: too often a name or a file
    if last in _TOKEN_ENDINGS or flat.endswith(_TOKEN_ENDINGS[:-2]):
        if last == "key" and len(parts) > 1 and parts[-2] not in (
            "api", "access", "secret", "private", "auth", "account", "master", "signing", "encryption",
            "client", "license", "app", "storage", "subscription", "service", "deploy", "integration",
        ):  # fmt: skip
            return None  # `--ssh-key`, `--gpg-key`, `PRIMARY_KEY`: names of things
        return "token"
    return None


def _unquote(word: str) -> str:
    """A shell word without its quotes (`'a b'`, `"x"`, `a'b'c`, ANSI-C `$'a\\x21'`), backslash
    escapes resolved."""
    if "'" not in word and '"' not in word and "\\" not in word:
        return word
    out: list[str] = []
    i, n = 0, len(word)
    while i < n:
        c = word[i]
        if c == "$" and i + 1 < n and word[i + 1] in "'\"":
            if word[i + 1] == "'":  # ANSI-C quoting: the escapes are the value's characters
                text, i = _ansi_c(word, i + 2)
                out.append(text)
                continue
            i += 1  # `$"..."` (a translated string) is a double-quoted one
            continue
        if c == "'":
            j = word.find("'", i + 1)
            j = n if j < 0 else j
            out.append(word[i + 1 : j])
            i = j + 1
        elif c == '"':
            j = i + 1
            while j < n and word[j] != '"':
                if word[j] == "\\" and j + 1 < n:
                    j += 1
                out.append(word[j])
                j += 1
            i = j + 1
        elif c == "\\" and i + 1 < n:
            out.append(word[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


_ANSI_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
                   "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip
_ANSI_C_NUMBER = re.compile(r"x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}")


def _ansi_c(word: str, start: int) -> tuple[str, int]:
    """The text of an ANSI-C quoted string (`$'...'`) whose body starts at `start`, and the index
    after its closing quote: `\\n`, `\\x21`, `\\041`, `\\u00e9`, `\\'` as bash and zsh read them."""
    out: list[str] = []
    i, n = start, len(word)
    while i < n and word[i] != "'":
        if word[i] == "\\" and i + 1 < n:
            number = _ANSI_C_NUMBER.match(word, i + 1)
            if number:
                digits = number.group(0)
                base = 8 if digits[0].isdigit() else 16
                code = int(digits if base == 8 else digits[1:], base)
                out.append(chr(code) if code < 0x110000 else "?")
                i = number.end()
                continue
            out.append(_ANSI_C_ESCAPES.get(word[i + 1], "\\" + word[i + 1]))
            i += 2
            continue
        out.append(word[i])
        i += 1
    return "".join(out), i + 1


def _is_expansion(raw: str) -> bool:
    """A shell word that starts with an expansion (`$VAR`, `${X}`, `$(cmd)`, `"$X"`), not with
    ANSI-C or translated quoting (`$'...'`, `$"..."`), whose content is literal."""
    if raw.startswith(("$'", '$"')):
        return False
    return raw.startswith(("$", '"$', "'$"))


def is_reference(value: str) -> bool:
    """A value that names where a secret lives, or that asks for it: `$VAR`, `$(cmd)`, `<(...)`,
    `-` (stdin), a path, `@file`, `env:X`/`file:X`/`fd:N`/`stdin` (openssl), nothing at all."""
    v = value.strip()
    return (
        not v
        or v.startswith(("$", "<", "`", "/", "~/", "./", "../", "@", "env:", "file:", "fd:", "%(", "{{"))
        or v in ("-", "stdin", "''", '""', "<secret>", "***", "xxx", "...")
        or _PLACEHOLDER.fullmatch(v) is not None
    )


# What documentation and templates put where a secret goes: `<token>`, `{password}`, `[pass]`,
# `YOUR_API_KEY`, `***`, `xxxx`. Not a secret: a reader is to put theirs there.
_PLACEHOLDER = re.compile(
    r"<[^<>\s]*>|\{\{?[^{}\s]*\}?\}|\[[A-Za-z][\w -]*\]|\*{3,}|[xX]{3,}|\.{3,}|"
    r"(?i:your[_-][a-z_-]*(?:token|key|secret|pass|password|pwd|pat))"
)


def is_placeholder(value: str) -> bool:
    """A value that stands for a secret in documentation (`<token>`, `{password}`, `YOUR_TOKEN`)."""
    return _PLACEHOLDER.fullmatch(value.strip("'\"")) is not None


def _literal(raw: str) -> str | None:
    """The value of a shell word when it is a literal secret candidate, else None. A quoted
    word is what it holds (`'/:jN'` and `'@ee5{R'` are generated passwords, not a path or an
    `@file`): only a placeholder, an empty value or an `env:`/`file:` source is none."""
    if _is_expansion(raw):
        return None
    value = _unquote(raw)
    return None if _names_no_secret(raw, value) else value


def _names_no_secret(raw: str, value: str) -> bool:
    """Whether `value` (the shell word `raw`, unquoted) is no secret: a reference when unquoted,
    and when quoted only what `_quoted_reference` says (in double quotes, an expansion too)."""
    if raw.startswith(("'", "$'")):
        return _quoted_reference(value)
    if raw.startswith('"'):
        return _quoted_reference(value) or value.startswith(("$", "`"))
    return is_reference(value)


def _quoted_reference(value: str) -> bool:
    """A quoted value that is no secret: empty, `-`, a placeholder, a source (`env:X`), a
    template, a path made of path characters (`"~/.config/askpass"`; `'/:jN%c'` is no path)."""
    v = value.strip()
    return (
        v in ("", "-", "stdin", "***", "xxx", "...")
        or is_placeholder(v)
        or v.startswith(("env:", "file:", "fd:", "{{", "%("))
        or _CLEAN_PATH.fullmatch(v) is not None
    )


_CLEAN_PATH = re.compile(r"(?:~|\.{1,2})?/[\w.+,=~-]*(?:/[\w.+,=~-]+)*/?")


# --------------------------------------------------------------------------- 2. named values

# One shell word: quoted parts and single unquoted characters (no nested quantifier: linear time).
_VALUE = r"""(?:'[^']*'|"(?:[^"\\]|\\.)*"|[^\s'"&;|),])+"""
_HINT = re.compile(r"pass|pwd|secret|token|key|auth|cred|psk|cookie|bearer|://|sig=|appid")
ASSIGNMENT = re.compile(rf"""(?:^|[\s;&|(,'"{{])([A-Za-z_][A-Za-z0-9_.-]*)=({_VALUE})""")
OPTION = re.compile(rf"(?:^|\s)--?([A-Za-z][A-Za-z0-9_.-]*[A-Za-z])(?:=|\s+(?=[^\s-]))({_VALUE})")
# (a scheme starts where no scheme character precedes it: tried at every `a` of a long run of
# letters, it cost quadratic time, 5 s for 64 KiB)
URL_CREDENTIALS = re.compile(
    r"""(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://([^\s/:@'"]*):([^\s/@'"]+)@[^\s'"]"""
)
QUERY_PARAM = re.compile(r"""[?&;]([A-Za-z_][A-Za-z0-9_.-]*)=([^&\s'"#]+)""")
JSON_FIELD = re.compile(r"""["']([A-Za-z_][A-Za-z0-9_.-]*)["']\s*:\s*(?:"([^"]*)"|'([^']*)')""")
HEADER = re.compile(
    r"""(?:^|['"\s=])([A-Za-z][\w-]*)\s*:\s*"""
    r"""(?i:(?:bearer|basic|token|apikey|digest|sso-key|negotiate)\s+)?([^\s'"]+)"""
)
_HEADER_NAME = re.compile(r"(?i)(?:.*authorization|.*(?:token|api-?key|secret|-auth|cookie|session|-key))")
BEARER = re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{16,})")


def _named_value_rule(cmd: str) -> str | None:
    for pattern in (ASSIGNMENT, OPTION):
        for found in pattern.finditer(cmd):
            kind = name_kind(found.group(1))
            if kind is None:
                continue
            raw = found.group(2)
            value = _literal(raw)
            if value is None or (pattern is OPTION and re.match(r"(?:id|src|env|type|target)=", value)):
                continue  # `docker build --secret id=x,src=file` names a file
            if found.group(1) == "pass" and value.isdigit() and len(value) <= 2:
                continue  # `ffmpeg -pass 1`: the first of a two-pass encode
            if kind == "password" or looks_random(value):
                return "password-argument" if kind == "password" else "token-argument"
    for found in URL_CREDENTIALS.finditer(cmd):
        password = found.group(2)
        if not password.startswith(("$", "{", "%")) and not is_placeholder(password):
            return "url-credentials"  # (`https://<user>:<token>@host` is documentation)
    for found in QUERY_PARAM.finditer(cmd):
        kind = name_kind(found.group(1), bare_key=True)
        value = found.group(2)
        if (
            kind and not value.startswith(("$", "{", "%7B")) and not is_placeholder(value)
            and (kind == "password" or looks_random(value))
        ):  # fmt: skip
            return "url-query-secret"
    for found in JSON_FIELD.finditer(cmd):
        kind = name_kind(found.group(1))
        value = found.group(2) if found.group(2) is not None else found.group(3)
        if kind and not is_reference(value.strip("'\"")) and (kind == "password" or looks_random(value)):
            return "json-secret"
    for found in HEADER.finditer(cmd):
        name, value = found.group(1).lower(), found.group(2)
        if not _HEADER_NAME.fullmatch(name) or is_reference(value) or len(value) < 8:
            continue
        if "authorization" in name or "token" in name or looks_random(value.partition("=")[2] or value):
            return "auth-header"
    bearer = BEARER.search(cmd)
    if bearer and not bearer.group(1).startswith("$"):
        return "auth-header"
    return None


# --------------------------------------------------------------------------- 3. tool rules

_WORD = re.compile(r"""(?:[^\s'"\\]+|'[^']*'?|"(?:[^"\\]|\\.)*"?|\\.?)+""")
_SEPARATORS = frozenset({"|", "||", "&&", ";", "&", "|&"})


def _option_value(args: Sequence[str], flags: tuple[str, ...], *, attached: bool = True,
                  separate: bool = True) -> list[str]:  # fmt: skip
    """Values of short/long options in `args`: `-p X`, `-pX`, `--password=X` (raw words; a quoted
    option, `"--password=x"`, is the option its quotes hold)."""
    values: list[str] = []
    for i, raw in enumerate(args):
        arg = _as_option(raw)
        for flag in flags:
            if arg == flag:
                if separate and i + 1 < len(args):
                    values.append(args[i + 1])
            elif arg.startswith(flag + "="):
                values.append(arg[len(flag) + 1 :])
            elif attached and not flag.startswith("--") and arg.startswith(flag) and len(arg) > len(flag):
                values.append(arg[len(flag) :])
    return values


def _as_option(word: str) -> str:
    """A word as an option: `"--password=x"` and `'-pX'` are `--password="x"` and `-pX` to the
    tool (the value keeps its quotes: `"--password=$PW"` gives `"$PW"`, an expansion)."""
    if word[:1] in ("'", '"') and word[1:2] == "-":
        return _requote_options(word)
    return word


def _any_literal(values: Sequence[str]) -> bool:
    return any(_literal(v) for v in values)


def _pair_secret(values: Sequence[str], sep: str) -> bool:
    """`user:password` (curl -u), `user%password` (smbclient -U): the password part is literal."""
    for raw in values:
        if _is_expansion(raw):
            continue
        value = _unquote(raw)
        _, found, secret = value.partition(sep)
        if found and secret and not _names_no_secret(raw, secret):
            return True
    return False


def _mysql(args: Sequence[str]) -> bool:
    # `-pSECRET` attached; `-p` alone prompts (and `-p db` names the database).
    options = [_as_option(a) for a in args]
    if _any_literal([a[2:] for a in options if a.startswith("-p") and len(a) > 2 and not a.startswith("--")]):
        return True
    return args[0].endswith("admin") and _positional_after(args, ("password", "old-password"))


def _positional_after(args: Sequence[str], verbs: Sequence[str], skip: int = 0) -> bool:
    """A literal word `skip` words after one of `verbs` (`mysqladmin password NEW`, `AUTH pw`,
    `user set password 2 NEW`): an admin tool's password given as a positional argument."""
    lowered = [_unquote(a).lower() for a in args]
    for verb in verbs:
        if verb in lowered:
            at = lowered.index(verb) + 1 + skip
            if at < len(args) and not args[at].startswith("-") and _literal(args[at]):
                return True
    return False


def _positional(args: Sequence[str], verbs: Sequence[str], index: int) -> bool:
    """After the words `verbs` (in order), the `index`-th word that is not an option is a literal
    (`mc admin user add ALIAS USER PASSWORD`: index 2)."""
    lowered = [_unquote(a).lower() for a in args]
    at = 0
    for verb in verbs:
        if verb not in lowered[at:]:
            return False
        at = lowered.index(verb, at) + 1
    operands = [a for a in args[at:] if not a.startswith("-")]
    return len(operands) > index and _literal(operands[index]) is not None


def _curl(args: Sequence[str]) -> bool:
    users = _option_value(args, ("-u", "--user", "-U", "--proxy-user"))
    return _pair_secret(users, ":")


def _httpie(args: Sequence[str]) -> bool:
    return _pair_secret(_option_value(args, ("-a", "--auth")), ":")


def _registry_login(args: Sequence[str]) -> bool:
    if _pair_secret(_option_value(args, ("--creds", "--src-creds", "--dest-creds")), ":"):
        return True
    return "login" in args[1:4] and _any_literal(_option_value(args, ("-p",), attached=False))


def _htpasswd(args: Sequence[str]) -> bool:
    options = [a for a in args if a.startswith("-") and not a.startswith("--")]
    if not any("b" in o[1:] for o in options):
        return False
    positional = [a for a in args[1:] if not a.startswith("-")]
    needed = 2 if any("n" in o[1:] for o in options) else 3
    return len(positional) >= needed and _literal(positional[needed - 1]) is not None


def _openssl(args: Sequence[str]) -> bool:
    if any(_unquote(a).startswith("pass:") and _literal(_unquote(a)[5:]) for a in args):
        return True
    if "passwd" in args:  # `openssl passwd -6 -salt S PASSWORD`: the password to hash
        rest = list(args[args.index("passwd") + 1 :])
        operands = [w for k, w in enumerate(rest) if not w.startswith("-")
                    and not (k and rest[k - 1] in ("-salt", "-in", "-rand", "-writerand"))]  # fmt: skip
        if "-stdin" not in rest and "-in" not in rest and operands and _literal(operands[0]):
            return True
    return _any_literal(_option_value(args, ("-k",), attached=False))


def _ldap(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-w",))) or _any_literal(
        _option_value(args, ("-s", "-a"), attached=False) if args and "ldappasswd" in args[0] else []
    )


def _smb(args: Sequence[str]) -> bool:
    if args[0] == "net" and len(args) > 3 and _unquote(args[1]).lower() == "user":
        new = _unquote(args[3])  # `net user NAME PASSWORD [/add]`; `*` asks for it
        if new != "*" and _literal(args[3]) and not args[3].startswith("/"):
            return True
    return _pair_secret(_option_value(args, ("-U", "--user")), "%")


def _dash_p(args: Sequence[str]) -> bool:
    """Tools whose `-p` is a password (`sshpass -p`, `smbmap -p`, `redis-cli -a`...)."""
    return _any_literal(_option_value(args, ("-p",)))


def _upper_p(args: Sequence[str]) -> bool:
    """`zip -P`, `sqlcmd -P`, `ipmitool -P`, `mosquitto_pub -P`: an upper-case P is the password."""
    return _any_literal(_option_value(args, ("-P",)))


def _seven_zip(args: Sequence[str]) -> bool:
    options = [_as_option(a) for a in args]
    return _any_literal([a[2:] for a in options if a.startswith("-p") and len(a) > 2])


def _ssh_keygen(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-N", "-P")))


def _atuin(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-p", "-k", "--key"), attached=False))


def _redis(args: Sequence[str]) -> bool:
    if _any_literal(_option_value(args, ("-a", "--pass"), attached=False)):
        return True
    lowered = [_unquote(a).lower() for a in args]
    if "auth" in lowered:  # `AUTH [user] password`: the last word
        rest = args[lowered.index("auth") + 1 :]
        if rest and len(rest) <= 2 and _literal(rest[-1]):
            return True
    return _positional_after(args, ("requirepass", "masterauth"))


def _impacket(args: Sequence[str]) -> bool:
    """`[domain/]user:password@host`."""
    return any(
        re.fullmatch(r"(?:[^/\s]+/)?[^:/\s@]+:([^@\s]+)@\S+", _unquote(a))
        and not _unquote(a).split(":", 1)[1].startswith("$")
        for a in args[1:]
    )


def _freerdp(args: Sequence[str]) -> bool:
    return any(_unquote(a).startswith("/p:") and _literal(_unquote(a)[3:]) for a in args)


def _az(args: Sequence[str]) -> bool:
    return _any_literal(
        _option_value(
            args, ("-p", "--secret", "--client-secret", "--sas-token", "--account-key"), attached=False
        )
    )


def _rabbitmqctl(args: Sequence[str]) -> bool:
    for sub in ("add_user", "change_password", "authenticate_user"):
        if sub in args:
            rest = args[args.index(sub) + 1 :]
            positional = [a for a in rest if not a.startswith("-")]
            if len(positional) >= 2 and _literal(positional[1]):
                return True
    return False


def _ipmitool(args: Sequence[str]) -> bool:
    """`ipmitool -P x`, and `ipmitool user set password ID PASSWORD`."""
    return _upper_p(args) or _positional(args, ("user", "set", "password"), 1)


def _mosquitto_passwd(args: Sequence[str]) -> bool:
    """`mosquitto_passwd -b FILE USER PASSWORD`."""
    return "-b" in args and _positional(args, ("-b",), 2)


def _minio(args: Sequence[str]) -> bool:
    """`mc admin user add ALIAS USER PASSWORD`, `mc alias set NAME URL ACCESS SECRET` (and the
    older `mc config host add`)."""
    return (
        _positional(args, ("admin", "user", "add"), 2)
        or _positional(args, ("alias", "set"), 3)
        or _positional(args, ("host", "add"), 3)
    )


def _samba_tool(args: Sequence[str]) -> bool:
    """`samba-tool user create|add USER PASSWORD`."""
    return _positional(args, ("user", "create"), 1) or _positional(args, ("user", "add"), 1)


def _x11vnc(args: Sequence[str]) -> bool:
    """`x11vnc -storepasswd PASSWORD FILE` (alone, it asks)."""
    if "-storepasswd" not in args:
        return False
    rest = [a for a in args[args.index("-storepasswd") + 1 :] if not a.startswith("-")]
    return len(rest) >= 2 and _literal(rest[0]) is not None


def _mkpasswd(args: Sequence[str]) -> bool:
    """`mkpasswd [-m METHOD] [-S SALT] [-R ROUNDS] PASSWORD`: the password to hash."""
    valued = ("-m", "--method", "-S", "--salt", "-R", "--rounds", "-P")
    operands = [w for k, w in enumerate(args[1:], 1) if not w.startswith("-") and args[k - 1] not in valued]
    return "-s" not in args and "--stdin" not in args and bool(operands) and _literal(operands[0]) is not None


def _rclone(args: Sequence[str]) -> bool:
    """`rclone obscure PASSWORD`, `rclone config create|update NAME TYPE ... pass|password VALUE`."""
    return _positional(args, ("obscure",), 0) or (
        "config" in args and _positional_after(args, ("pass", "password", "pass2"))
    )


def _cf(args: Sequence[str]) -> bool:
    """Cloud Foundry: `cf auth USER PASSWORD`, `cf login -p PASSWORD`."""
    return _positional(args, ("auth",), 1) or ("login" in args and _dash_p(args))


def _wpa_cli(args: Sequence[str]) -> bool:
    """`wpa_cli set_network ID psk|password VALUE`."""
    return _positional(args, ("set_network",), 2) and any(_unquote(a) in ("psk", "password") for a in args)


def _nmcli(args: Sequence[str]) -> bool:
    for i, arg in enumerate(args[:-1]):
        if arg in ("password", "wifi-sec.psk", "802-11-wireless-security.psk", "psk") and _literal(
            args[i + 1]
        ):
            return True
    return False


def _wpa_passphrase(args: Sequence[str]) -> bool:
    positional = [a for a in args[1:] if not a.startswith("-")]
    return len(positional) >= 2 and _literal(positional[1]) is not None


def _sqlplus(args: Sequence[str]) -> bool:
    return any(
        (m := re.fullmatch(r"[A-Za-z_][\w$#]*/([^@\s/]+)(?:@\S+)?", _unquote(a)))
        and not m.group(1).startswith("$")
        for a in args[1:]
    )


def _lftp(args: Sequence[str]) -> bool:
    return _pair_secret(_option_value(args, ("-u",), attached=False), ",")


def _vault(args: Sequence[str]) -> bool:
    if "login" not in args:
        return False
    for arg in args[args.index("login") + 1 :]:
        value = _unquote(arg)
        if value.startswith("-"):
            continue
        name, eq, rest = value.partition("=")
        if not eq and _literal(arg):
            return True  # `vault login TOKEN`
        if eq and name == "token" and _literal(rest):
            return True
    return False


def _from_literal(args: Sequence[str]) -> bool:
    """`kubectl create secret ... --from-literal=NAME=VALUE`: a literal value of a secret-ish
    name, or one that looks random."""
    for raw in _option_value(args, ("--from-literal",), attached=False):
        name, eq, value_raw = _unquote(raw).partition("=")
        value = _literal(value_raw) if eq else None
        if value and (name_kind(name) == "password" or (name_kind(name) and looks_random(value))):
            return True
        if value and "secret" in args and name_kind(name) is not None:
            return True
    return False


def _helm(args: Sequence[str]) -> bool:
    if _registry_login(args):
        return True
    for raw in _option_value(args, ("--set", "--set-string", "--set-literal"), attached=False):
        for pair in _unquote(raw).split(","):
            key, eq, value = pair.partition("=")
            if not eq or is_reference(value) or value.startswith("${"):
                continue
            kind = name_kind(key.rsplit(".", 1)[-1])
            if kind == "password" or (kind == "token" and looks_random(value)):
                return True
    return False


def _written_value(raw: str) -> str | None:
    """The value of a shell word that sets a secret, unless it is an expansion (`$VAR`, `$(...)`,
    a backquote): single quotes keep anything literal, and a password may start with `/` or `@`."""
    if raw.startswith(("$", '"$', "`", '"`')) and not raw.startswith(("$'", '$"')):
        return None
    return _unquote(raw) or None


def _config_set(args: Sequence[str]) -> bool:
    """`aws configure set NAME VALUE`, `npm|pnpm|yarn|pip config set NAME VALUE`, `poetry config
    NAME VALUE`, `git config [--global] NAME VALUE`: a value given to a name that says password,
    secret or token (the name's last part: `default.aws_secret_access_key`, `//host/:_authToken`)."""
    words = [w for w in args[1:] if not w.startswith("-")]
    for verb in ("set", "configure", "config"):
        if verb in words[:3]:
            rest = words[words.index(verb) + 1 :]
            if rest and rest[0] == "set":
                rest = rest[1:]
            if len(rest) < 2:
                continue
            key = _unquote(rest[0])
            if key.startswith("http-basic.") and len(rest) >= 3 and _written_value(rest[2]):
                return True  # poetry's `http-basic.REPO USER PASSWORD`
            name = re.split(r"[.:/]", key.rstrip("=").rstrip("/"))[-1] or key
            kind = name_kind(name) or ("password" if name.lower() in ("_auth", "_password") else None)
            value = _written_value(rest[1])
            if kind is not None and value and (kind == "password" or len(value) >= 8):
                return True
    return False


def _names(spaced: str) -> list[str]:
    return spaced.split()


# Tool names, as they are spelled on command lines.
_MYSQL = _names(
    "mysql mysqldump mysqladmin mysqlimport mysqlcheck mysqlshow mysqlsh mariadb mariadb-dump mysqlpump "
    "mariadb-admin"
)
_REGISTRIES = _names("docker podman buildah nerdctl oras skopeo crane regctl")
_LDAP = _names(
    "ldapsearch ldapadd ldapmodify ldapdelete ldappasswd ldapwhoami ldapcompare ldapmodrdn ldapexop"
)
_SMB = _names("smbclient rpcclient smbcacls smbget smbtree net smbcquotas mount.cifs")
_DASH_P = _names(
    "sshpass smbmap crackmapexec cme netexec nxc evil-winrm rdesktop ncftp ncftpget ncftpput mongo mongosh "
    "mongodump mongorestore mongoexport mongoimport kerbrute bloodhound-python couchbase-cli"
)
_UPPER_P = _names("zip unzip zipcloak sqlcmd bcp osql isql mosquitto_pub mosquitto_sub mosquitto_rr")
_IMPACKET_TOOLS = (
    "psexec wmiexec smbexec secretsdump mssqlclient GetUserSPNs GetNPUsers smbclient atexec dcomexec"
)
_IMPACKET = [f"impacket-{t}" for t in _IMPACKET_TOOLS.split()] + [f"{t}.py" for t in _IMPACKET_TOOLS.split()]
_ORACLE = _names("sqlplus sqlldr expdp impdp exp imp")
_CONFIG_TOOLS = frozenset(_names("aws npm pnpm yarn bun pip pip3 poetry git gh"))

# tool name -> (rule, check of the tool's argument words)
TOOL_RULES: dict[str, tuple[str, Callable[[Sequence[str]], bool]]] = {
    **{t: ("password-option", _mysql) for t in _MYSQL},
    **{t: ("http-user", _curl) for t in ("curl", "curlie")},
    **{t: ("http-user", _httpie) for t in ("http", "https", "xh", "xhs")},
    **{t: ("registry-login", _registry_login) for t in _REGISTRIES},
    "helm": ("helm-password", _helm),
    "htpasswd": ("htpasswd", _htpasswd),
    "openssl": ("openssl-password", _openssl),
    **{t: ("ldap-password", _ldap) for t in _LDAP},
    **{t: ("smb-password", _smb) for t in _SMB},
    **{t: ("password-option", _dash_p) for t in _DASH_P},
    **{t: ("password-option", _upper_p) for t in _UPPER_P},
    **{t: ("archive-password", _seven_zip) for t in ("7z", "7za", "7zr", "7zz", "rar", "unrar")},
    "ssh-keygen": ("ssh-keygen-passphrase", _ssh_keygen),
    "atuin": ("password-option", _atuin),
    "redis-cli": ("password-option", _redis),
    **{t: ("password-option", _impacket) for t in _IMPACKET},
    **{t: ("password-option", _freerdp) for t in ("xfreerdp", "wlfreerdp", "xfreerdp3", "sdl-freerdp")},
    "az": ("azure-password", _az),
    "rabbitmqctl": ("password-option", _rabbitmqctl),
    "nmcli": ("wifi-password", _nmcli),
    "wpa_passphrase": ("wifi-password", _wpa_passphrase),
    **{t: ("password-option", _sqlplus) for t in _ORACLE},
    "lftp": ("password-option", _lftp),
    "ipmitool": ("password-option", _ipmitool),
    "mosquitto_passwd": ("admin-password", _mosquitto_passwd),
    "mc": ("admin-password", _minio),
    "mcli": ("admin-password", _minio),
    "samba-tool": ("admin-password", _samba_tool),
    "x11vnc": ("admin-password", _x11vnc),
    "mkpasswd": ("admin-password", _mkpasswd),
    "rclone": ("admin-password", _rclone),
    "cf": ("admin-password", _cf),
    "cf8": ("admin-password", _cf),
    "wpa_cli": ("wifi-password", _wpa_cli),
    "vault": ("vault-token", _vault),
    **{t: ("kubectl-literal", _from_literal) for t in ("kubectl", "oc", "microk8s.kubectl")},
}
_TOOL_NAMES = frozenset(TOOL_RULES)
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.+-]+")  # words as tool names are spelled (`mount.cifs`, `7z`)


def _tool_rule(cmd: str) -> str | None:
    if _TOOL_NAMES.isdisjoint(_NAME_CHARS.findall(cmd)):
        return None
    words = _WORD.findall(cmd)
    seen: set[str] = set()  # tools already judged in this segment (each on the rest of it)
    end = 0
    for i, word in enumerate(words):
        if word in _SEPARATORS:
            seen.clear()
            continue
        base = word.lstrip("$(<`").rsplit("/", 1)[-1]  # `$(openssl passwd x)` runs openssl too
        entry = TOOL_RULES.get(base)
        if entry is None or base in seen:
            continue
        seen.add(base)
        end = max(end, i + 1)
        while end < len(words) and words[end] not in _SEPARATORS:
            end += 1
        rule, check = entry
        if check([base, *words[i + 1 : end]]):
            return rule
    return None


def _config_rule(cmd: str) -> str | None:
    """A tool's own setting of a secret (`_config_set`); git and npm are everywhere, so the tool
    words are looked at only in commands that say `config`/`configure`."""
    if "config" not in cmd:
        return None
    words = _WORD.findall(cmd)
    judged = -1  # words up to here were judged with the tool before them (each segment once)
    for i, word in enumerate(words):
        if i > judged and word.rsplit("/", 1)[-1] in _CONFIG_TOOLS:
            end = i + 1
            while end < len(words) and words[end] not in _SEPARATORS:
                end += 1
            if _config_set(words[i:end]):
                return "config-set-secret"
            judged = end
    return None


# --------------------------------------------------------------------------- 4. random strings

_LONG_WORD = re.compile(r"[A-Za-z0-9+/_=-]{20,}")
_SHELL_WORD = re.compile(r"""[^\s'"`]+""")
_NAME_PREFIX = re.compile(r"(?:--?[A-Za-z][\w.-]*|[A-Za-z_][\w.-]*)[=:]")
_AWS_SECRET = re.compile(r"[A-Za-z0-9/+]{40}")
_RANDOM_WORD = re.compile(r"[A-Za-z0-9_+-]{20,}={0,2}")
# Shapes that are random-looking and public: content ids, public keys, package store hashes.
_HARMLESS_PREFIXES = ("Qm", "bafy", "bafk", "AAAA", "age1", "npub", "sha256-", "sha512-", "sha1-")
# ...and values of options or parameters whose name says they are an identifier of something.
_HARMLESS_BEFORE = re.compile(
    r"(?:--?[\w-]*(?:id|ids|hash|sha|digest|ref|rev|revision|commit|spreadsheet|sheet|doc|document|file|"
    r"folder|playlist|video|list|peer|pubkey|public-?key)|\bpeer|\bbtih|\bsha\d+|\bid|\blist)[\s=:]+$",
    re.IGNORECASE,
)


def _random_string_rule(cmd: str) -> str | None:
    """A word (or the value of `NAME=word`, `--opt=word`) that looks generated: 20+ characters
    of letters and digits (and `_-+`), upper and lower case and digits mixed the way random text
    mixes them. Paths, URLs and dotted names are not candidates: a generated path component is
    a file name, not a credential."""
    if not _LONG_WORD.search(cmd):
        return None
    for found in _SHELL_WORD.finditer(cmd):
        word = found.group(0)
        if len(word) < 20:
            continue
        prefix = _NAME_PREFIX.match(word)
        if prefix:
            word = word[prefix.end() :]
        if len(word) < 20 or word.startswith(("-", "$", "@")) or word.startswith(_HARMLESS_PREFIXES):
            continue
        start = found.start() + (prefix.end() if prefix else 0)
        if _HARMLESS_BEFORE.search(cmd[max(0, start - 48) : start]):
            continue
        if _AWS_SECRET.fullmatch(word):
            has_all, change = _mixes(word)
            if has_all and change > 0.45 and not _decodes_to_text(word):
                return "aws-secret-key"
            continue
        if not _RANDOM_WORD.fullmatch(word):
            continue
        body = word.rstrip("=")
        # identifiers joined by separators (`my-app_v2-release`): judge the longest piece
        piece = (
            max(re.split(r"[_+-]", body), key=len) if ("_" in body or "-" in body or "+" in body) else body
        )
        if (
            len(piece) < 20
            or not any(c.isdigit() for c in piece)
            or len(set(piece)) < 0.5 * min(len(piece), 40)
        ):
            continue
        has_all, change = _mixes(piece)
        if has_all and change >= 0.45 and not _decodes_to_text(word):
            return "random-string"
    return None


# --------------------------------------------------------------------------- 5. credential files

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


def _credential_file_rule(cmd: str) -> str | None:
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
            value = (found.group(1) if quoted else _unquote(found.group(1))).strip("'\"").rstrip("\\")
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
        args = _WORD.findall(text[end:])
        for arg in args:
            if arg in _SEPARATORS or arg.startswith((">", "<", "|")):
                return False
            if index == 0:
                return _written_value(arg) is not None
            index -= 1
    return False


# --------------------------------------------------------------------------- 7. token prefixes

# Prefixes services put on their tokens: a word that starts with one and goes on with a generated
# string is a token whatever its length (the token formats above fix lengths; a new or unusual
# length still starts with the prefix).
_TOKEN_PREFIXES = (
    "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "gldt-", "glrt-", "glptt-", "glsoat-",
    "xoxb-", "xoxp-", "xoxa-", "xoxe-", "xoxs-", "xoxr-", "xapp-", "sk_live_", "rk_live_", "sk_test_",
    "rk_test_", "whsec_", "npm_", "pypi-AgE", "sk-ant-", "sk-proj-", "sk-svcacct-", "sk-admin-", "sk-or-v1-",
    "hf_", "dckr_pat_", "dckr_oat_", "GOCSPX-", "ya29.", "shpat_", "shpss_", "shpca_", "shppa_", "dop_v1_",
    "doo_v1_", "dor_v1_", "hvs.", "hvb.", "hvr.", "lin_api_", "lin_oauth_", "PMAK-", "ATATT3", "ATBB",
    "tskey-auth-", "tskey-api-", "tskey-client-", "sntrys_", "sntryu_", "glsa_", "glc_", "pscale_tkn_",
    "pscale_pw_", "gsk_", "r8_", "figd_", "sbp_", "ntn_", "pplx-", "xai-", "xkeysib-", "bkua_", "CCIPAT_",
    "rubygems_", "fo1_", "AGE-SECRET-KEY-1", "nfp_", "HRKU-", "AKCp", "sq0atp-", "sq0csp-", "dp.pt.",
    "dp.st.", "AIza",
)  # fmt: skip
_BY_LENGTH = tuple(sorted(_TOKEN_PREFIXES, key=len, reverse=True))  # the longest that fits wins
_TOKENISH = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z0-9_.+-]{19,}")  # a prefix and 16 more, at least


def _prefix_rule(cmd: str) -> str | None:
    for found in _TOKENISH.finditer(cmd):
        word = found.group(0)
        if not word.startswith(_BY_LENGTH):
            continue
        prefix = next(p for p in _BY_LENGTH if word.startswith(p))
        body = word[len(prefix) :].rstrip(".")
        if len(body) < 16:
            continue
        digits = sum(c.isdigit() for c in body)
        mixed = any(c.isupper() for c in body) and any(c.islower() for c in body)
        generated = digits >= 2 or (mixed and (digits or len(body) >= 20))  # not a word like `mode_enabled`
        if generated and shannon_entropy(body) >= ENTROPY_BITS:
            return "token-prefix"
    return None


# --------------------------------------------------------------------------- `calm forget`

# `calm forget PATTERN` in any form: after a wrapper (sudo, env, command, ssh host ...), an
# assignment (`CALM_HOME=x calm forget`), a path or quotes (`/usr/bin/calm`, `\calm`, `"calm"`),
# a substitution (`$(calm forget x)`), options before the verb (`calm --no-color forget`).
_FORGET = re.compile(
    r"""(?:^|[\s;&|(`'"/\\=])calm['"]?(?:\s|\\\n)+(?:-\S*(?:\s|\\\n)+)*['"]?forget(?:['"]|\s|\\|$)"""
)


def forget_command(cmd: str) -> bool:
    """Whether `cmd` runs `calm forget`: never stored (its argument is what the user wants gone)."""
    return "forget" in cmd and _FORGET.search(cmd) is not None


# --------------------------------------------------------------------------- 8. fed to a reader of secrets

# A secret fed to a command that reads one from standard input (`--password-stdin`, `passwd
# --stdin`, `openssl passwd -stdin`, `--from-file=k=/dev/stdin`, `sudo -S`, `cryptsetup`), or from
# a file argument that is a process substitution (`--password-file <(echo x)`): the literal comes
# from `echo`/`printf`/`yes` on the pipe's left, a here-string (`<<< 'x'`), a here-document, or
# `< <(echo x)`. A pipe from `cat ~/.token`, `pass show x` or `"$TOKEN"` names where the secret
# lives, and is not one.

_SHELL_OPERATORS = ("<<<", "<<-", "&&", "||", "|&", ";;", "<<", ">>", "<&", ">&", "<>", ">|", "|", "&", ";",
                    "<", ">", "(", ")", "\n")  # fmt: skip
_OPERATOR_CHARS = frozenset("|&;<>()\n")
_REDIRECTIONS = frozenset({">", ">>", ">|", "<>", "<&", ">&"})
_LIST_OPERATORS = frozenset({"&&", "||", ";", ";;", "&", "\n"})
_TOKEN_LIMIT = 2048  # a command line longer than this in words is judged on its first ones


def _closing(text: str, i: int, opening: str, closing: str) -> int:
    """The index after the `closing` that balances the `opening` before `i`, quotes respected."""
    depth, n = 1, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            end = text.find("'", i + 1)
            i = n if end < 0 else end + 1
            continue
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            continue
        if c == opening:
            depth += 1
        elif c == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _shell_tokens(cmd: str) -> list[tuple[str, str]]:
    """The command line as ("word", raw word), ("op", operator) and ("heredoc", body) tokens (a
    here-document's body replaces its delimiter word; "heredoc-literal" when the delimiter was
    quoted: then nothing in it expands). Linear in the length of `cmd`."""
    tokens: list[tuple[str, str]] = []
    pending: list[tuple[int, str, bool, bool]] = []  # (token index, delimiter, quoted, strip tabs)
    i, n = 0, len(cmd)
    word_start = -1
    while i < n and len(tokens) < _TOKEN_LIMIT:
        c = cmd[i]
        if c in " \t" or c in _OPERATOR_CHARS:
            if word_start >= 0 and c in "<>" and cmd[word_start:i].isdigit():
                word_start = -1  # `2>`: a file descriptor, not a word
            elif word_start >= 0:
                tokens.append(("word", cmd[word_start:i]))
                word_start = -1
            if c in " \t":
                i += 1
                continue
            if c in "<>" and i + 1 < n and cmd[i + 1] == "(":  # a process substitution: a word
                word_start = i
                i = _closing(cmd, i + 2, "(", ")")
                continue
            op = next(o for o in _SHELL_OPERATORS if cmd.startswith(o, i))
            i += len(op)
            if op in ("<<", "<<-"):
                tokens.append(("op", op))
                match = re.match(r"[ \t]*((?:'[^'\n]*'|\"[^\"\n]*\"|\\\\.|[^\s|&;<>()])+)", cmd[i:])
                if match:
                    raw = match.group(1)
                    pending.append((len(tokens), _unquote(raw), raw != _unquote(raw), op == "<<-"))
                    tokens.append(("heredoc", ""))
                    i += match.end()
                continue
            if op == "\n" and pending:
                for index, delimiter, quoted, strip_tabs in pending:
                    body: list[str] = []
                    while i < n:
                        end = cmd.find("\n", i)
                        end = n if end < 0 else end
                        line = cmd[i:end]
                        i = end + 1
                        if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                            break
                        body.append(line)
                    tokens[index] = ("heredoc-literal" if quoted else "heredoc", "\n".join(body))
                pending.clear()
            tokens.append(("op", op))
            continue
        if word_start < 0:
            word_start = i
        if c == "\\":
            i += 2
        elif c == "'":
            end = cmd.find("'", i + 1)
            i = n if end < 0 else end + 1
        elif c == '"':
            i += 1
            while i < n and cmd[i] != '"':
                if cmd[i] == "\\":
                    i += 1
                elif cmd.startswith("$(", i):
                    i = _closing(cmd, i + 2, "(", ")") - 1
                i += 1
            i += 1
        elif c == "$" and i + 1 < n and cmd[i + 1] == "'":
            i += 2
            while i < n and cmd[i] != "'":
                i += 2 if cmd[i] == "\\" else 1
            i += 1
        elif c == "$" and i + 1 < n and cmd[i + 1] in "({":
            i = _closing(cmd, i + 2, cmd[i + 1], ")" if cmd[i + 1] == "(" else "}")
        elif c == "`":
            end = cmd.find("`", i + 1)
            i = n if end < 0 else end + 1
        else:
            i += 1
    if word_start >= 0 and len(tokens) < _TOKEN_LIMIT:
        tokens.append(("word", cmd[word_start:]))
    return tokens


_EXPANSION = re.compile(r"\$(?:\{[^}]*\}?|\([^)]*\)?|[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])|`[^`]*`?")


def _fed_text(raw: str) -> str:
    """What a shell word puts on a pipe, with its expansions taken out (`"$PW"` puts nothing of
    its own; `'user:pw'` all of it): the literal part a secret could be."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "'":
            end = raw.find("'", i + 1)
            end = n if end < 0 else end
            out.append(raw[i + 1 : end])
            i = end + 1
        elif c == "$" and i + 1 < n and raw[i + 1] == "'":
            text, i = _ansi_c(raw, i + 2)
            out.append(text)
        elif c == '"':
            end = i + 1
            while end < n and raw[end] != '"':
                end += 2 if raw[end] == "\\" else 1
            out.append(_EXPANSION.sub("", raw[i + 1 : end]).replace('\\"', '"'))
            i = end + 1
        else:
            found = _EXPANSION.match(raw, i)
            if found:
                i = found.end()
                continue
            out.append(raw[i + 1] if c == "\\" and i + 1 < n else c)
            i += 2 if c == "\\" else 1
    return "".join(out)


def _fed_literal(raw: str) -> str | None:
    """The literal a word feeds, when it could be a secret: not a path, an expansion or a
    placeholder, not empty."""
    text = _fed_text(raw).strip()
    if not text or text in ("-", "''", '""') or is_placeholder(text) or raw.startswith("~"):
        return None  # (a password may well start with `/` or `@`: fed, it is not a file's name)
    return text


_PRINTF_PARTS = re.compile(r"%%|%[-+ #0-9.*]*[a-zA-Z]|\\(?:[0-7]{1,3}|x[0-9A-Fa-f]{1,2}|.)")


def _printf_output(fmt: str, args: Sequence[str]) -> str:
    """What `printf FORMAT ARGS...` prints, with the arguments' expansions left out (`printf
    'user:%s\\n' "$PW"` prints `user:` of its own): the literal text it writes, stripped."""
    values = iter([_fed_text(a) for a in args])

    def part(found: re.Match[str]) -> str:
        piece = found.group(0)
        if piece == "%%":
            return "%"
        if piece.startswith("%"):
            return next(values, "")
        return "\n" if piece == "\\n" else ""

    printed = _PRINTF_PARTS.sub(part, _fed_text(fmt))
    return (printed + "".join(values)).strip()


@dataclass
class _Stage:
    """One command of a pipeline: its words, and what is fed to its standard input."""

    words: list[str]
    here: list[str]  # here-strings' literals, here-documents' literal bodies
    stdin_procsub: list[str]  # `< <(...)`: the inner command line
    stdin_file: bool  # `< file`: its input is a file


def _stages(tokens: list[tuple[str, str]]) -> list[list[_Stage]]:
    """The pipelines of a command line (split at `;`, `&&`, `||`, `&`, newlines), each a list
    of stages (split at `|`). A group `( ... )` or `{ ...; }` stays one stage: its commands'
    words are all its words."""
    pipelines: list[list[_Stage]] = []
    stage = _Stage([], [], [], False)
    pipeline: list[_Stage] = [stage]
    depth = 0
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if (kind == "op" and text == "(") or (kind == "word" and text == "{"):
            depth += 1
            stage.words.append(_GROUP)
        elif (kind == "op" and text == ")") or (kind == "word" and text == "}"):
            depth = max(0, depth - 1)
            stage.words.append(_GROUP)
        elif kind == "op" and text in _LIST_OPERATORS and depth > 0:
            stage.words.append(_GROUP)
        elif kind == "op" and text in ("|", "|&") and depth == 0:
            stage = _Stage([], [], [], False)
            pipeline.append(stage)
        elif kind == "op" and text in _LIST_OPERATORS and depth == 0:
            pipelines.append(pipeline)
            stage = _Stage([], [], [], False)
            pipeline = [stage]
        elif kind == "op" and text == "<<<" and i + 1 < len(tokens) and tokens[i + 1][0] == "word":
            literal = _fed_literal(tokens[i + 1][1])
            if literal:
                stage.here.append(literal)
            i += 1
        elif kind in ("heredoc", "heredoc-literal"):
            body = text if kind == "heredoc-literal" else _EXPANSION.sub("", text)
            if body.strip() and not is_placeholder(body.strip()):
                stage.here.append(body.strip())
        elif kind == "op" and text == "<" and i + 1 < len(tokens) and tokens[i + 1][0] == "word":
            target = tokens[i + 1][1]
            if target.startswith("<("):
                stage.stdin_procsub.append(target[2:-1] if target.endswith(")") else target[2:])
            else:
                stage.stdin_file = True
            i += 1
        elif kind == "op" and text in _REDIRECTIONS:
            i += 1  # its target is no argument
        elif kind == "word":
            stage.words.append(text)
        i += 1
    pipelines.append(pipeline)
    return pipelines


# Filters that pass what they read on, changed (`base64 -d`, `tr -d '\\n'`): a literal goes through.
_PASS_THROUGH = {"cat": 0, "tee": 99, "tr": 2, "base64": 0, "head": 0, "tail": 0, "sed": 1, "rev": 0}


def _writes(stage: _Stage, fed: list[str]) -> list[str]:
    """The literals a stage writes on its standard output: `echo`/`printf`/`yes` arguments
    (each command of a group), or what a filter like `cat` passes on from its input."""
    written: list[str] = []
    for start in _command_starts(stage.words):
        name = _unquote(stage.words[start]).rsplit("/", 1)[-1]
        args = stage.words[start + 1 :]
        args = args[: next((k for k, w in enumerate(args) if w == _GROUP), len(args))]
        if name == "echo":
            while args and re.fullmatch(r"-[neE]+", args[0]):
                args = args[1:]
            written += [v for v in map(_fed_literal, args) if v]
        elif name == "printf" and args and args[0] != "-v":
            printed = _printf_output(args[0], args[1:])
            if printed and not is_placeholder(printed):
                written.append(printed)
        elif name == "yes":
            written += [v for v in map(_fed_literal, args) if v]
        elif name in _PASS_THROUGH and fed:
            operands = [a for a in args if not a.startswith("-")]
            if len(operands) <= _PASS_THROUGH[name]:  # no file of its own to read
                written += fed
    return written


_GROUP = "\0"  # between two commands of a group `( a; b )`, `{ a; b; }` in a stage's words
_WRAPPERS = frozenset({"sudo", "doas", "env", "command", "builtin", "exec", "nice", "nohup", "time",
                       "timeout", "stdbuf", "ionice", "chrt", "taskset", "xargs", "run0", "npx", "bunx",
                       "{", "(", _GROUP})  # fmt: skip
_WRAPPER_VALUES = frozenset({"-u", "-g", "-C", "-h", "-p", "-r", "-t", "-U", "-n", "-c", "-s", "-k", "-D"})


def _command_starts(words: Sequence[str]) -> list[int]:
    """Where commands start among a stage's words: the first word, the word after a wrapper
    (`sudo -u root`, `env A=b`, `timeout 5`) and the first of each command of a group."""
    starts: list[int] = []
    k, n = 0, len(words)
    expect = True
    while k < n:
        word = words[k]
        if word == _GROUP or word in ("{", "}"):
            expect = True
            k += 1
            continue
        if not expect:
            k += 1
            continue
        base = _unquote(word).rsplit("/", 1)[-1]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word, re.S):
            k += 1  # an assignment before the command
            continue
        starts.append(k)
        if base not in _WRAPPERS:
            expect = False
            k += 1
            continue
        k += 1
        while k < n and (
            words[k].startswith("-") or "=" in words[k] or re.fullmatch(r"[\d.]+[smhd]?", words[k])
        ):
            k += 2 if words[k] in _WRAPPER_VALUES and base in ("sudo", "doas", "nice", "run0") else 1
    return starts


_STDIN_VALUES = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "stdin", "fd:0",
                           "file:/dev/stdin", "file:///dev/stdin", "pass:stdin"})  # fmt: skip
_SECRET_PARTS = frozenset({"password", "passwd", "pass", "passphrase", "pwd", "psk", "secret", "secrets",
                           "token", "key", "cred", "creds", "credential", "credentials", "auth", "pin",
                           "passin", "passout", "kfile"})  # fmt: skip


_PUBLIC_PARTS = frozenset({"ssh", "public", "pub", "gpg", "host", "ca", "known", "authorized", "pgp"})


def _secret_option(name: str) -> bool:
    """An option whose name says it takes a secret (or where one is): `--password-file`,
    `--passphrase-fd`, `-passin`, `--key-file`; not `--ssh-key`, `--public-key`."""
    parts = {p.lower() for p in _NAME_SPLIT.split(name) if p}
    if not _SECRET_PARTS.isdisjoint(parts - {"key"}):
        return True
    return "key" in parts and _PUBLIC_PARTS.isdisjoint(parts)


def _stdin_option(args: Sequence[str]) -> bool:
    """An option that says the secret comes from standard input: its name says so
    (`--password-stdin`, `--token-stdin`, `--with-token`), or it names a secret and its value is
    stdin (`--password-file=/dev/stdin`, `--passphrase-fd 0`, `--key-file -`, `-passin stdin`),
    or it is kubectl's `--from-file=[KEY=]/dev/stdin` of a secret."""
    for k, arg in enumerate(args):
        if not arg.startswith("-") or arg in ("-", "--"):
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        parts = {p.lower() for p in _NAME_SPLIT.split(name) if p}
        if ("stdin" in parts and _secret_option(name)) or name == "with-token":
            return True
        if not eq and k + 1 < len(args):
            value = args[k + 1]
        if name in ("from-file", "from-env-file"):
            key, _, path = value.rpartition("=")
            if path in _STDIN_VALUES and ("secret" in args or name_kind(key) is not None):
                return True
        elif _secret_option(name) and (value in _STDIN_VALUES or (value == "0" and "fd" in parts)):
            return True
    return False


def _after(args: Sequence[str], *verbs: str) -> bool:
    """Whether the words hold these verbs in this order (`gh auth login`, `docker secret create`)."""
    at = 0
    for verb in verbs:
        try:
            at = args.index(verb, at) + 1
        except ValueError:
            return False
    return True


# Tools that read a password (or key) from standard input, in the form they do it.
_NOT_READING = frozenset(
    {"-l", "-u", "-d", "-e", "-S", "--lock", "--unlock", "--delete", "--expire", "--status"}
)
_STDIN_READERS: dict[str, Callable[[Sequence[str]], bool]] = {
    "passwd": lambda a: not _NOT_READING & set(a),
    "chpasswd": lambda a: True,
    "chgpasswd": lambda a: True,
    "smbpasswd": lambda a: "-s" in a,
    "vncpasswd": lambda a: "-f" in a,
    "tightvncpasswd": lambda a: "-f" in a,
    "kinit": lambda a: True,
    "mkpasswd": lambda a: "-s" in a or "--stdin" in a,
    "htpasswd": lambda a: any(w.startswith("-") and not w.startswith("--") and "i" in w for w in a),
    "openssl": lambda a: "passwd" in a and "-stdin" in a,
    "sudo": lambda a: "--stdin" in a or any(re.fullmatch(r"-[A-Za-z]*S[A-Za-z]*", w) for w in a[:4]),
    "cryptsetup": lambda a: bool({"open", "luksOpen", "luksFormat", "luksAddKey", "luksResume"} & set(a)),
    "zfs": lambda a: "load-key" in a,
    "ssh-add": lambda a: "-" in a,
    "secret-tool": lambda a: "store" in a,
    "keyring": lambda a: "set" in a,
    "pass": lambda a: "insert" in a or "add" in a,
    "gh": lambda a: _after(a, "auth", "login") or _after(a, "secret", "set"),
    "glab": lambda a: "--stdin" in a,
    "vault": lambda a: _after(a, "login", "-") or any(w.endswith("=-") for w in a),
    "docker": lambda a: _after(a, "secret", "create") and a[-1] == "-",
    "podman": lambda a: _after(a, "secret", "create") and a[-1] == "-",
    "wrangler": lambda a: _after(a, "secret", "put"),
    "vercel": lambda a: _after(a, "env", "add"),
    "ansible-vault": lambda a: "encrypt_string" in a,
    "sshpass": lambda a: not {"-p", "-f", "-e"} & {w[:2] for w in a},
    "wpa_passphrase": lambda a: len([w for w in a[1:] if not w.startswith("-")]) == 1,
    "argon2": lambda a: True,
    "systemd-creds": lambda a: "encrypt" in a and "-" in a,
}
_PAIR_READERS = frozenset({"chpasswd", "chgpasswd"})  # they read `user:password` lines


def _reads_secret(words: Sequence[str]) -> str | None:
    """How a stage reads a secret on its standard input: "plain", "pair" (`user:password` lines),
    or None when it does not."""
    args = [_unquote(w) for w in words]
    if _stdin_option(args):
        return "plain"
    for k in _command_starts(words):
        name = args[k].rsplit("/", 1)[-1]
        check = _STDIN_READERS.get(name)
        if check is not None and check(args[k:]):
            return "pair" if name in _PAIR_READERS else "plain"
    return None


def _secret_fed(literals: Sequence[str], how: str) -> bool:
    if how == "pair":
        return any(line.partition(":")[2].strip() for text in literals for line in text.splitlines())
    return any(literals)


def _procsub_literals(inner: str) -> list[str]:
    """What the command line inside a process substitution writes (`echo x`, `printf x`)."""
    written: list[str] = []
    for pipeline in _stages(_shell_tokens(inner)):
        fed: list[str] = []
        for stage in pipeline:
            fed = _writes(stage, fed + stage.here)
        written += fed
    return written


def _secret_file_argument(words: Sequence[str]) -> bool:
    """A process substitution that prints a literal, given where a secret file goes:
    `--password-file <(echo x)`, `--from-file=password=<(echo x)`, `sshpass -f <(echo x)`."""
    for k, raw in enumerate(words):
        if "<(" not in raw:
            continue
        option, key, value = "", "", raw
        if raw.startswith("-"):
            option, _, value = raw.partition("=")
        elif k and words[k - 1].startswith("-"):
            option = words[k - 1]
        if not value.startswith("<("):
            key, _, value = value.partition("=")  # `--from-file=password=<(...)`
        if not value.startswith("<(") or not _procsub_literals(value[2:].removesuffix(")")):
            continue
        name = option.lstrip("-")
        if _secret_option(name) or (key and name_kind(key) is not None):
            return True
        if option == "-f" and any(_unquote(w).rsplit("/", 1)[-1] == "sshpass" for w in words[:k]):
            return True
        if name in ("from-file", "from-env-file") and "secret" in words:
            return True
    return False


_FED_SOURCES = re.compile(r"echo|printf|yes\b|<<|<\(")


def _fed_rule(cmd: str) -> str | None:
    if ("|" not in cmd and "<" not in cmd) or not _FED_SOURCES.search(cmd):
        return None
    for pipeline in _stages(_shell_tokens(cmd)):
        piped: list[str] = []
        for stage in pipeline:
            fed = piped + stage.here
            for inner in stage.stdin_procsub:
                fed += _procsub_literals(inner)
            if stage.stdin_file and not stage.here and not stage.stdin_procsub:
                fed = []  # `< file` replaces the pipe
            how = _reads_secret(stage.words) if fed else None
            if how is not None and _secret_fed(fed, how):
                return "fed-secret"
            if "<(" in cmd and _secret_file_argument(stage.words):
                return "fed-secret"
            piped = _writes(stage, fed)
    return None


# --------------------------------------------------------------------------- 9. key material

# A private key printed piece by piece (`printf '%s\n' '-----BEGIN ... PRIVATE KEY-----' 'MIIE...'`,
# `echo 'b3BlbnNzaC1rZXktdjE...' >> id_ed25519`): the header with key-like base64 anywhere after
# it, or a base64 run that decodes to the start of a private key (a DER structure opening with a
# version number, as PKCS#1, PKCS#8 and SEC1 keys do, not certificates or public keys; OpenSSH's
# `openssh-key-v1`), or PuTTY's `Private-Lines:`.
_PEM_HEADER = re.compile(
    r"-----BEGIN[A-Z0-9 ]{0,30} PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File|Private-Lines:"
)
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/=_.-])[A-Za-z0-9+/]{16,}={0,2}")
_KEY_START = re.compile(
    r"(?<![A-Za-z0-9+/=_.-])(?:M[A-P][A-Za-z0-9+/]{14,}|b3BlbnNzaC1rZXktdjE[A-Za-z0-9+/]*)"
)


def _decodes_to_private_key(word: str) -> bool:
    head = word[: len(word) // 4 * 4][:24]
    try:
        raw = base64.b64decode(head, validate=True)
    except (binascii.Error, ValueError):
        return False
    if raw.startswith(b"openssh-key-v1"):
        return True
    if len(raw) < 8 or raw[0] != 0x30:
        return False
    at = {0x81: 3, 0x82: 4, 0x83: 5}.get(raw[1], 2 if raw[1] < 0x80 else 0)
    # version 0 or 1, then the key's first part: an INTEGER (RSA, DSA), an AlgorithmIdentifier
    # (PKCS#8) or an OCTET STRING (SEC1 EC keys)
    return at > 0 and raw[at : at + 3] in (b"\x02\x01\x00", b"\x02\x01\x01") and raw[at + 3 : at + 4] in (
        b"\x02", b"\x30", b"\x04",
    )  # fmt: skip


def _key_material_rule(cmd: str) -> str | None:
    if "M" in cmd or "b3Blbn" in cmd:
        for found in _KEY_START.finditer(cmd):
            if _decodes_to_private_key(found.group(0)):
                return "private-key-material"
    if "PRIVATE KEY" in cmd or "PuTTY" in cmd or "Private-Lines" in cmd:
        header = _PEM_HEADER.search(cmd)
        if header:
            for found in itertools.islice(_BASE64_RUN.finditer(cmd, header.end()), 64):
                word = found.group(0).rstrip("=")
                has_all, change = _mixes(word)
                if has_all and change >= 0.4 and not _decodes_to_text(found.group(0)):
                    return "private-key-material"
    return None


# --------------------------------------------------------------------------- 10. inline code

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
_SQL_HINT = re.compile(r"identified|password|requirepass|masterauth")
_AUTH_HINT = re.compile(r"auth|login")
_CONNECT_HINT = re.compile(r"connect|pdo|mysqli|ftp")


def _code_literal(value: str) -> bool:
    """A string literal in code that could be a password (not `''`, `<password>`, `${PW}`, `%s`)."""
    v = value.strip()
    return (
        v not in ("", "-", "***", "xxx", "...") and not is_placeholder(v)
        and not v.startswith(("$", "%s", "#{", "{{", "%("))
    )  # fmt: skip


def _inline_code_rule(cmd: str, lowered: str) -> str | None:
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
    if not _HINT.search(lowered):
        return None
    for found in _CODE_FIELD.finditer(cmd):
        kind = name_kind(found.group("name"))
        value = found.group("value")
        if kind and _code_literal(value) and (kind == "password" or looks_random(value)):
            return "code-credential"
    return None


# --------------------------------------------------------------------------- the detector


def find_secret(cmd: str) -> str | None:
    """The name of the first rule that says `cmd` holds a credential, or None. Costs a few
    microseconds for an ordinary command (bench/secrets_scan.py)."""
    if len(cmd) < 6:
        return None
    rule = _token_rule(cmd)
    lowered = cmd.lower()
    if rule is None and _HINT.search(lowered):
        rule = _named_value_rule(_requote_options(cmd))  # `"--password=x"` read as `--password="x"`
    if rule is None and _CREDENTIAL_HINT.search(lowered):
        rule = _credential_file_rule(cmd)
    return (
        rule or _tool_rule(cmd) or _config_rule(cmd) or _fed_rule(cmd)
        or _key_material_rule(cmd) or _inline_code_rule(cmd, lowered) or _prefix_rule(cmd)
        or _random_string_rule(cmd)
    )  # fmt: skip


# A quoted option (`"--password=x"`, `'-pX'`, `"--db-pass" x`) is the option its quotes hold: the
# quote moves after the name, as the shell reads it (`--password="x"`).
# (A quoted `-pVALUE` keeps its value quoted: `"-PSq1Pass!"` is `-P"Sq1Pass!"`.)
_QUOTED_OPTION = re.compile(
    r"""(?<![^\s=(|;&])(['"])(?:(--?[A-Za-z][A-Za-z0-9_.-]*)(?:(\1)|(=))|(-[A-Za-z])(?=[^'"\s][^'"]*\1))"""
)


def _requote_options(cmd: str) -> str:
    if "'-" not in cmd and '"-' not in cmd:
        return cmd

    def moved(found: re.Match[str]) -> str:
        quote, flag, closed, eq, short = found.groups()
        if short:
            return short + quote
        return flag if closed else flag + eq + quote

    return _QUOTED_OPTION.sub(moved, cmd)


_CREDENTIAL_HINT = re.compile(
    r"netrc|\.aws/|\.boto|s3cfg|pgpass|git-credentials|npmrc|yarnrc|pypirc|config\.json|my\.cnf|mylogin"
)
