"""What a value is: a literal or where a secret lives (`$VAR`, a path, a placeholder), and how
random it looks (generated, chosen like a password, or ordinary text)."""

from __future__ import annotations

import base64
import binascii
import itertools
import math
import re
from collections import Counter

from calmd.secrets.shellwords import is_expansion, unquote


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


def mixes(word: str) -> tuple[bool, float]:
    """(has upper, lower and digit; share of adjacent characters that change class). Random
    base62 changes class ~62% of the time, CamelCase words and names far less."""
    classes = [_class_of(c) for c in word]
    has_all = 0 in classes and 1 in classes and 2 in classes
    changes = sum(a != b for a, b in itertools.pairwise(classes))
    return has_all, changes / max(1, len(word) - 1)


def _b64decode(word: str) -> bytes | None:
    padded = word.rstrip("=")
    padded += "=" * (-len(padded) % 4)
    try:
        return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None


_PAIR_TEXT = re.compile(r"[A-Za-z0-9._@+\\-]{1,64}:[^\s:]{3,}")


def decodes_to_pair(word: str) -> bool:
    """base64 of `user:password` (HTTP basic auth, a registry's `auth`)."""
    if len(word) < 8 or len(word.rstrip("=")) % 4 == 1:
        return False
    raw = _b64decode(word)
    if raw is None or not all(32 < b < 127 for b in raw):
        return False
    text = raw.decode("ascii")
    return _PAIR_TEXT.fullmatch(text) is not None and not text.startswith(("http:", "https:"))


def decodes_to_text(word: str) -> bool:
    """base64 (or base64url) of ordinary printable text: an encoded message, not a key. A
    decoded `user:password` pair (HTTP basic auth) does not count as text."""
    raw = _b64decode(word)
    if raw is None or len(raw) < 8:
        return False
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in raw)
    if printable < 0.95 * len(raw):
        return False
    text = raw.decode("ascii", "replace")
    return not re.fullmatch(r"[A-Za-z0-9._@+-]{1,64}:\S{3,}", text.strip())


def random_bytes(word: str) -> bool:
    """base64 of random bytes (a key, not text, not a structure of mostly zeros): 16+ bytes,
    most of them distinct, written in upper and lower case and digits mixed as random text is
    (a name of words and dashes decodes to bytes too)."""
    has_all, change = mixes(word.rstrip("="))
    if not has_all or change < 0.35:
        return False
    raw = _b64decode(word)
    if raw is None or len(raw) < 16:
        return False
    printable = sum(32 <= b < 127 for b in raw)
    return printable < 0.8 * len(raw) and len(set(raw)) >= 0.6 * min(len(raw), 64)


# --------------------------------------------------------------------------- public keys and key ids

# A Nix binary cache's key: `name-N:` and base64 of the key (32 bytes public, 64 secret).
_NAMED_KEY = re.compile(r"[A-Za-z0-9][\w.-]*-\d+:([A-Za-z0-9+/]{43}=)")
# An OpenSSH public key's line (git's `key::` before it: user.signingkey given the key itself).
_OPENSSH_PUBLIC = re.compile(
    r"(?:key::)?(?:ssh-(?:ed25519|rsa|dss)|ecdsa-sha2-nistp\d+|sk-\S+@openssh\.com) AAAA"
)
# An OpenPGP key chosen by its id or fingerprint: 8, 16 or 40 hex digits (`0x` before, `!` after:
# that very subkey); `gpg -k` prints them, and every tool that signs or encrypts takes them.
_KEY_ID = re.compile(r"(?:0x)?(?:[0-9A-Fa-f]{8}|[0-9A-Fa-f]{16}|[0-9A-Fa-f]{40})!?")


def public_key(word: str) -> bool:
    """A public key by its format, however random it looks: the Ed25519 key of minisign, signify
    and usign (`-P RW...`: base64 of 42 bytes, `Ed`, the key's id, the key), a Nix binary cache's
    (`cache.nixos.org-1:` and 32 bytes: its secret key is 64), an OpenSSH public key's line (git's
    `key::ssh-ed25519 AAAA...` too), and base64 of DER whose first element is a structure (a
    SubjectPublicKeyInfo, a certificate; a private key's starts with its version number)."""
    if _OPENSSH_PUBLIC.match(word):
        return True
    named = _NAMED_KEY.fullmatch(word)
    if named is not None:
        raw = _b64decode(named.group(1))
        return raw is not None and len(raw) == 32
    if len(word) < 40 or word[:1] not in "RM":
        return False
    if word[0] == "R":
        raw = _b64decode(word) if len(word) <= 60 else None
        return raw is not None and len(raw) == 42 and raw[:2] == b"Ed"
    head = _b64decode(word[:12])  # DER's first bytes (a line of a longer text decodes alone too)
    if head is None or head[0] != 0x30:
        return False
    inner = 2 + (head[1] & 0x7F if head[1] & 0x80 else 0)  # after the outer SEQUENCE's length
    return inner < len(head) and head[inner] == 0x30


def key_id(value: str) -> bool:
    """An OpenPGP key's id or fingerprint (`3AA5C34371567BD2`, `0x...`, 40 hex digits, `...!`)."""
    return _KEY_ID.fullmatch(value) is not None


# --------------------------------------------------------------------------- references

# What documentation and templates put where a secret goes: `<token>`, `{password}`, `[pass]`,
# `YOUR_API_KEY`, `***`, `xxxx`. Not a secret: a reader is to put theirs there.
_PLACEHOLDER = re.compile(
    r"<[^<>\s]*>|\{\{?[^{}\s]*\}?\}|\[[A-Za-z][\w -]*\]|\*{3,}|[xX]{3,}|\.{3,}|"
    r"(?i:your[_-][a-z_-]*(?:token|key|secret|pass|password|pwd|pat))"
)


def is_placeholder(value: str) -> bool:
    """A value that stands for a secret in documentation (`<token>`, `{password}`, `YOUR_TOKEN`)."""
    return _PLACEHOLDER.fullmatch(value.strip("'\"")) is not None


def is_reference(value: str) -> bool:
    """A value that names where a secret lives, or that asks for it: `$VAR`, `$(cmd)`, `<(...)`,
    `-` (stdin), a path, `@file`, `env:X`/`file:X`/`fd:N`/`stdin` (openssl), nothing at all."""
    v = value.strip()
    return (
        not v
        or v.startswith(("$", "<", "`", "/", "~/", "./", "../", "@", "env:", "file:", "fd:", "%("))
        or (v.startswith("{{") and "}}" in v)
        or v in ("-", "stdin", "''", '""', "<secret>", "***", "xxx", "...")
        or _PLACEHOLDER.fullmatch(v) is not None
    )


# `${DB_PASSWORD}`, `$DB_PASSWORD`: what an app substitutes in its config, written literally
_TEMPLATE_VARIABLE = re.compile(r"\$\{[A-Za-z_][\w.:-]*\}|\$[A-Z_][A-Z0-9_]*")
_CLEAN_PATH = re.compile(r"(?:~|\.{1,2})?/[\w.+,=~-]*(?:/[\w.+,=~-]+)*/?")


def quoted_reference(value: str) -> bool:
    """A quoted value that is no secret: empty, `-`, a placeholder, a source (`env:X`), a
    template, a path made of path characters (`"~/.config/askpass"`; `'/:jN%c'` is no path)."""
    v = value.strip()
    return (
        v in ("", "-", "stdin", "***", "xxx", "...")
        or is_placeholder(v)
        or v.startswith(("env:", "file:", "fd:", "%("))
        or (v.startswith("{{") and "}}" in v)
        or _CLEAN_PATH.fullmatch(v) is not None
        or _TEMPLATE_VARIABLE.fullmatch(v) is not None
    )


def names_no_secret(raw: str, value: str) -> bool:
    """Whether `value` (the shell word `raw`, unquoted) is no secret: a reference when unquoted,
    and when quoted only what `_quoted_reference` says (in double quotes, an expansion too)."""
    if raw.startswith(("'", "$'")):
        return quoted_reference(value)
    if raw.startswith('"'):
        return quoted_reference(value) or value.startswith(("$", "`"))
    return is_reference(value)


def literal(raw: str) -> str | None:
    """The value of a shell word when it is a literal secret candidate, else None. A quoted
    word is what it holds (`'/:jN'` and `'@ee5{R'` are generated passwords, not a path or an
    `@file`): only a placeholder, an empty value or an `env:`/`file:` source is none."""
    if is_expansion(raw):
        return None
    value = unquote(raw)
    return None if names_no_secret(raw, value) else value


def written_value(raw: str) -> str | None:
    """The value of a shell word that sets a secret, unless it is an expansion (`$VAR`, `$(...)`,
    a backquote): single quotes keep anything literal, and a password may start with `/` or `@`."""
    if raw.startswith(("$", '"$', "`", '"`')) and not raw.startswith(("$'", '$"')):
        return None
    return unquote(raw) or None


# --------------------------------------------------------------------------- shapes

_NUMBER = re.compile(r"[+-]?\d+(?:[.,:x-]\d+)*[kKmMgGsh%]?")
_VERSION = re.compile(r"v?\d+(?:\.\w+)+")
_HOSTLIKE = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+(?::\d+)?")
_FILE_NAME = re.compile(r"[\w.+-]*\.[A-Za-z][A-Za-z0-9]{0,4}")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_IDENTIFIER = re.compile(r"[a-z]+(?:[_-][a-z]+)*")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
HEX = re.compile(r"(?:0x)?[0-9a-fA-F]+")


def is_uuid(value: str) -> bool:
    return _UUID.fullmatch(value) is not None


# One pass for the shapes above (a number, a version, a host, a file name, an e-mail, a UUID).
_ORDINARY = re.compile("|".join(p.pattern for p in (_NUMBER, _VERSION, _HOSTLIKE, _FILE_NAME, _EMAIL, _UUID)))
_PORT_PART = re.compile(r"\d+(?:-\d+)?(?:/\w+)?")


def _port_map(value: str) -> bool:
    """`8080:80`, `127.0.0.1:8080:80/tcp`, `5432:db.internal:5432`: ports on one side or both."""
    parts = value.split(":")
    return (
        len(parts) >= 2
        and (_PORT_PART.fullmatch(parts[0]) is not None or _PORT_PART.fullmatch(parts[-1]) is not None)
        and all(re.fullmatch(r"[\w.-]*(?:/\w+)?", part) for part in parts)
    )


def ordinary(value: str) -> bool:
    """A value with a shape of its own that is not a password: a number, a version, a host, a
    file name, an e-mail address, a port mapping, a UUID, an assignment, an option, a path."""
    return (
        not value
        or value[0] in "-/~$"
        or value.startswith(("./", "../", "http:", "https:"))
        or "=" in value.rstrip("=")
        or any(c.isspace() for c in value)
        or _ORDINARY.fullmatch(value) is not None
        or (":" in value and _port_map(value))
    )


_SYMBOLS = frozenset("!#$%&*+,;<>?@[]^_{|}~()=:'\"\\`./-")


def password_like(value: str, *, quoted: bool = False) -> bool:
    """A literal that could be a chosen password in a place where a password may stand (the
    value of a `-p` beside a user, the word after a `password` keyword): 4-128 characters with
    no ordinary shape of its own, and something no name has (a digit, or a symbol and a letter)
    unless it is random-looking. `hunter2`, `Tr0ub4dor&3`, `Cobalt!Wren`; not `postgres`,
    `5432`, `config.yml`, `db.internal`, `feature-login`. A quoted value is taken as written:
    quotes keep `=`, `/` and spaces in a password."""
    if not 4 <= len(value) <= 128 or is_placeholder(value):
        return False
    if quoted:
        return not _NUMBER.fullmatch(value) and not _IDENTIFIER.fullmatch(value)
    if ordinary(value):
        return False
    letters = any(c.isalpha() for c in value)
    digits = any(c.isdigit() for c in value)
    symbols = any(c in _SYMBOLS for c in value if c not in "-_")
    if _IDENTIFIER.fullmatch(value):
        return False  # a lower-case name (`postgres`, `feature-login`)
    return (letters and (digits or symbols)) or looks_random(value)


# Shapes that are random-looking and public: content ids, public keys, integrity strings.
PUBLIC_PREFIXES = ("Qm", "bafy", "bafk", "AAAA", "age1", "npub", "sha256-", "sha512-", "sha384-", "sha1-",
                   "sha256:", "sha512:", "sha1:", "md5:", "blake2b:")  # fmt: skip
# a path's piece: words and numbers (`src`, `mib3Update`, `sri-csl`, `AndroidIDE`, `v2`, `2024`)
_NAMED_PIECE = re.compile(
    r"(?:[a-z]{2,}\d*|[A-Z][a-z]{2,}\d*)(?:[A-Z][a-z]{2,}\d*|[A-Z]{2,}(?![a-z])|[._-][A-Za-z0-9]+)*|\d+|v\d[\d.]*|~"
    r"|\.\w+"
)


def path_like(value: str) -> bool:
    """A value with a `/` that is a path (half its pieces or more are words), not base64 (its
    pieces are random)."""
    pieces = [p for p in value.split("/") if p]
    if value.endswith("/") or not pieces:
        return True
    words = sum(_NAMED_PIECE.fullmatch(p) is not None for p in pieces)
    return words * 2 >= len(pieces)


_AFTER_NUMBERS = frozenset({"st", "nd", "rd", "th", "s", "x", "d", "k", "b", "m", "g", "px", "mb", "gb"})


def reads_as_words(word: str) -> bool:
    """Whether a mixed-case word is made of words, as names are (`InvoiceServiceImpl2`,
    `mib3Update`, `XMLHttpRequest`, `AddIsSyncedToJobs`, `Harry20thAnniversary`): a lower-case
    run starts the word or follows a capital (not a number, but for `20th`, `4k`), and follows
    a run of capitals (`XMLHttp`) rarely. Random base62 breaks both."""
    for piece in re.split(r"[._+/-]", word):
        runs: list[tuple[int, int, int]] = []  # (class, start, length)
        for k, c in enumerate(piece):
            kind = _class_of(c)
            if runs and runs[-1][0] == kind:
                runs[-1] = (kind, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((kind, k, 1))
        lowers = odd = after_caps = 0
        for k, (kind, start, length) in enumerate(runs):
            if kind != 2 or not k:
                continue
            lowers += 1
            before = runs[k - 1]
            if before[0] == 0 and piece[start : start + length].lower() not in _AFTER_NUMBERS:
                return False  # `9m`: a word does not start after a number
            if before[0] == 1 and before[2] >= 2:
                after_caps += 1  # `MEi`: after a run of capitals (`XMLHttp` has one)
                odd += length == 1
            elif length == 1 and k + 1 < len(runs) and runs[k + 1][0] == 0:
                odd += 1  # `Zh9`
        capitals = sum(c.isupper() for c in piece)
        letters = sum(c.isalpha() for c in piece)
        if odd >= 2 or (odd and lowers <= 2) or (after_caps >= 2 and capitals >= 0.4 * letters):
            return False
    return True


def generated(value: str, *, min_len: int = 16) -> bool:
    """A value that looks made by a generator, in any alphabet: mixed-case base62 that does
    not read as words, or a run of hex or of lower-case letters and digits with high entropy (a
    key in hex, an API key in base36). Only for values already in a credential position: hex
    and base36 ids are everywhere else (commits, containers, checksums)."""
    body = value.rstrip("=")
    if len(body) < min_len or not re.fullmatch(r"[A-Za-z0-9+/_.~-]+", body) or is_uuid(body):
        return False
    if body.startswith(PUBLIC_PREFIXES) or len(set(body)) < min(10.0, 0.4 * min(len(body), 40)):
        return False
    digits = sum(c.isdigit() for c in body)
    if digits == len(body):
        return False
    if body.lower() != body and body.upper() != body:  # mixed case
        entropy = shannon_entropy(body)
        if len(body) >= 20 and entropy >= 0.9 * math.log2(len(body)):
            return True  # nearly every character different: names repeat their letters
        return not reads_as_words(body) and entropy >= 3.5
    run = max(re.findall(r"[A-Za-z0-9]+", body), key=len)
    run_digits = sum(c.isdigit() for c in run)
    if len(run) < 0.8 * min_len or run_digits < 2:
        return False  # words and numbers joined by dashes: `xf86-video-modesetting`, `fcitx5-gtk3`
    # hex is ~3.7-3.9 bits a character at 20+ characters, base36 ~4.2; names of words ~3.5
    entropy = shannon_entropy(run)
    if set(run.lower()) <= set("0123456789abcdef"):
        return entropy >= 3.4
    return entropy >= (3.5 if run_digits >= 0.1 * len(run) else 4.0)


def key_shaped(value: str) -> bool:
    """A value with a generated key's shape, for a place where a key may stand: 20+ characters of
    random bytes' base64, mixed-case base62 or base36 that does not read as words, hex of 32+;
    not a package's name, a path, a public key."""
    if len(value) < 20 or (value.islower() and not any(c.isdigit() for c in value)):
        return False  # (a package's name: `texlive-latex-recommended`)
    if ("/" in value and path_like(value)) or value.startswith(PUBLIC_PREFIXES) or public_key(value):
        return False  # (minisign's, signify's `-P RW...`: the key a signature is verified with)
    core = value.strip("=")
    if len(core) >= 20 and random_bytes(value):
        return True
    return generated(value, min_len=20) or (
        len(core) >= 32 and re.fullmatch(r"[0-9a-fA-F]+", core) is not None
    )
