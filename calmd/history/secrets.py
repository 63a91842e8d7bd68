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

DETECTOR_VERSION = 3  # 3: credential files, `config set`, token prefixes at any length, forget

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
    """A shell word without its quotes (`'a b'`, `"x"`, `a'b'c`), backslash escapes resolved."""
    if "'" not in word and '"' not in word and "\\" not in word:
        return word
    out: list[str] = []
    i, n = 0, len(word)
    while i < n:
        c = word[i]
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


def is_reference(value: str) -> bool:
    """A value that names where a secret lives, or that asks for it: `$VAR`, `$(cmd)`, `<(...)`,
    `-` (stdin), a path, `@file`, `env:X`/`file:X`/`fd:N`/`stdin` (openssl), nothing at all."""
    v = value.strip()
    return (
        not v
        or v.startswith(("$", "<", "`", "/", "~/", "./", "../", "@", "env:", "file:", "fd:", "%(", "{{"))
        or v in ("-", "stdin", "''", '""', "<secret>", "***", "xxx", "...")
    )


def _literal(raw: str) -> str | None:
    """The value of a shell word when it is a literal secret candidate, else None."""
    if raw.startswith(("$", '"$', "'$")):
        return None
    value = _unquote(raw)
    return None if is_reference(value) else value


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
        if not password.startswith(("$", "{", "%")):
            return "url-credentials"
    for found in QUERY_PARAM.finditer(cmd):
        kind = name_kind(found.group(1), bare_key=True)
        value = found.group(2)
        if kind and not value.startswith(("$", "{", "%7B")) and (kind == "password" or looks_random(value)):
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
    """Values of short/long options in `args`: `-p X`, `-pX`, `--password=X` (raw words)."""
    values: list[str] = []
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag:
                if separate and i + 1 < len(args):
                    values.append(args[i + 1])
            elif arg.startswith(flag + "="):
                values.append(arg[len(flag) + 1 :])
            elif attached and not flag.startswith("--") and arg.startswith(flag) and len(arg) > len(flag):
                values.append(arg[len(flag) :])
    return values


def _any_literal(values: Sequence[str]) -> bool:
    return any(_literal(v) for v in values)


def _pair_secret(values: Sequence[str], sep: str) -> bool:
    """`user:password` (curl -u), `user%password` (smbclient -U): the password part is literal."""
    for raw in values:
        if raw.startswith(("$", '"$', "'$")):
            continue
        value = _unquote(raw)
        _, found, secret = value.partition(sep)
        if found and secret and not is_reference(secret):
            return True
    return False


def _mysql(args: Sequence[str]) -> bool:
    # `-pSECRET` attached; `-p` alone prompts (and `-p db` names the database).
    return _any_literal([a[2:] for a in args if a.startswith("-p") and len(a) > 2 and not a.startswith("--")])


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
    return _any_literal(_option_value(args, ("-k",), attached=False))


def _ldap(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-w",))) or _any_literal(
        _option_value(args, ("-s", "-a"), attached=False) if args and "ldappasswd" in args[0] else []
    )


def _smb(args: Sequence[str]) -> bool:
    return _pair_secret(_option_value(args, ("-U", "--user")), "%")


def _dash_p(args: Sequence[str]) -> bool:
    """Tools whose `-p` is a password (`sshpass -p`, `smbmap -p`, `redis-cli -a`...)."""
    return _any_literal(_option_value(args, ("-p",)))


def _upper_p(args: Sequence[str]) -> bool:
    """`zip -P`, `sqlcmd -P`, `ipmitool -P`, `mosquitto_pub -P`: an upper-case P is the password."""
    return _any_literal(_option_value(args, ("-P",)))


def _seven_zip(args: Sequence[str]) -> bool:
    return _any_literal([a[2:] for a in args if a.startswith("-p") and len(a) > 2])


def _ssh_keygen(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-N", "-P")))


def _atuin(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-p", "-k", "--key"), attached=False))


def _redis(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-a", "--pass"), attached=False))


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
    for sub in ("add_user", "change_password"):
        if sub in args:
            rest = args[args.index(sub) + 1 :]
            positional = [a for a in rest if not a.startswith("-")]
            if len(positional) >= 2 and _literal(positional[1]):
                return True
    return False


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
    if raw.startswith(("$", '"$', "`", '"`')):
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
    "mysql mysqldump mysqladmin mysqlimport mysqlcheck mysqlshow mysqlsh mariadb mariadb-dump mysqlpump"
)
_REGISTRIES = _names("docker podman buildah nerdctl oras skopeo crane regctl")
_LDAP = _names(
    "ldapsearch ldapadd ldapmodify ldapdelete ldappasswd ldapwhoami ldapcompare ldapmodrdn ldapexop"
)
_SMB = _names("smbclient rpcclient smbcacls smbget smbtree net smbcquotas mount.cifs")
_DASH_P = _names(
    "sshpass smbmap crackmapexec cme netexec nxc evil-winrm rdesktop ncftp ncftpget ncftpput mongo mongosh "
    "mongodump mongorestore mongoexport mongoimport kerbrute bloodhound-python"
)
_UPPER_P = _names("zip unzip zipcloak sqlcmd bcp osql isql ipmitool mosquitto_pub mosquitto_sub mosquitto_rr")
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
    "vault": ("vault-token", _vault),
    **{t: ("kubectl-literal", _from_literal) for t in ("kubectl", "oc", "microk8s.kubectl")},
}
_TOOL_NAMES = frozenset(TOOL_RULES)
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.+-]+")  # words as tool names are spelled (`mount.cifs`, `7z`)

# `echo PASSWORD | sudo -S`, `echo 'user:pass' | chpasswd`, `chpasswd <<< user:pass`
_PIPED_PASSWORD = re.compile(
    r"""(?:echo|printf)\s+(?:-[a-zA-Z]+\s+)*((?:'[^']*'|"[^"]*"|[^\s|'"]+))\s*\|\s*"""
    r"""(?:sudo\s+(?:-[A-Za-z]+\s+)*-[A-Za-z]*S\b|(?:sudo\s+)?chpasswd\b)"""
)
_CHPASSWD_HERE = re.compile(r"""chpasswd\s*<<<\s*['"]?[^\s:'"]+:([^\s'"]+)""")


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
        base = word.rsplit("/", 1)[-1]
        entry = TOOL_RULES.get(base)
        if entry is None or base in seen:
            continue
        seen.add(base)
        end = max(end, i + 1)
        while end < len(words) and words[end] not in _SEPARATORS:
            end += 1
        rule, check = entry
        if check(words[i:end]):
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


def _piped_rule(cmd: str) -> str | None:
    if "sudo" not in cmd and "chpasswd" not in cmd:
        return None
    piped = _PIPED_PASSWORD.search(cmd)
    if piped and _literal(piped.group(1)):
        return "piped-password"
    here = _CHPASSWD_HERE.search(cmd)
    if here and not here.group(1).startswith("$"):
        return "piped-password"
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


# --------------------------------------------------------------------------- the detector


def find_secret(cmd: str) -> str | None:
    """The name of the first rule that says `cmd` holds a credential, or None. Costs a few
    microseconds for an ordinary command (bench/secrets_scan.py)."""
    if len(cmd) < 6:
        return None
    rule = _token_rule(cmd)
    lowered = cmd.lower()
    if rule is None and _HINT.search(lowered):
        rule = _named_value_rule(cmd)
    if rule is None and _CREDENTIAL_HINT.search(lowered):
        rule = _credential_file_rule(cmd)
    return (
        rule or _tool_rule(cmd) or _config_rule(cmd) or _piped_rule(cmd) or _prefix_rule(cmd)
        or _random_string_rule(cmd)
    )  # fmt: skip


_CREDENTIAL_HINT = re.compile(
    r"netrc|\.aws/|\.boto|s3cfg|pgpass|git-credentials|npmrc|yarnrc|pypirc|config\.json|my\.cnf|mylogin"
)
