"""Random-looking tokens anywhere in a command, judged by shape and entropy, and the identifiers
that look random and are not secret, told apart by their context.

A word of 20+ letters and digits that mixes upper case, lower case and digits the way random
text does (class changes at ~62% of adjacent characters; CamelCase names ~20%) is a generated
key; so is base64 of random bytes (with `/` and `+`), and base64 of `user:password`. Not
candidates: paths and URLs (calmd/secrets/urls.py judges those), content ids and public keys
(`Qm...`, `bafy...`, `AAAA...` ssh keys, `age1...`; by format, values.public_key: a signature
tool's `RW...`, a Nix cache's `name-1:...`, DER), npm integrity strings, values after
`--hash`, `sha256:`, `--id`, `--commit`, `list=` ..., base64 of ordinary text. Hex and base36
ids (commits, checksums, containers) are never judged here: only in a credential position.
"""

from __future__ import annotations

import re

from calmd.secrets.values import (
    PUBLIC_PREFIXES,
    decodes_to_pair,
    decodes_to_text,
    mixes,
    path_like,
    public_key,
    random_bytes,
)

_LONG_WORD = re.compile(r"[A-Za-z0-9+/_=-]{20,}")
_SHELL_WORD = re.compile(r"""[^\s'"`]+""")
_NAME_PREFIX = re.compile(r"(?:--?[A-Za-z][\w.-]*|[A-Za-z_][\w.-]*)[=:]")
_AWS_SECRET = re.compile(r"[A-Za-z0-9/+]{40}")
_RANDOM_WORD = re.compile(r"[A-Za-z0-9_+-]{20,}={0,2}")
_BASE64 = re.compile(r"[A-Za-z0-9+/]{20,}={0,2}")
_PAIR_CANDIDATE = re.compile(r"(?<![\w+/=.-])[A-Za-z0-9+/]{11,}={0,2}(?![\w+/=.-])")
# ...and values of options or parameters whose name says they are an identifier of something.
_HARMLESS_BEFORE = re.compile(
    r"(?:--?[\w-]*(?:id|ids|hash|sha|digest|ref|rev|revision|commit|spreadsheet|sheet|doc|document|file|"
    r"folder|playlist|video|list|peer|pubkey|public-?keys?)|\bpeer|\bbtih|\bsha\d+|\bid|\blist)[\s=:'\"]+$",
    re.IGNORECASE,
)


def random_string_rule(cmd: str) -> str | None:
    """A word (or the value of `NAME=word`, `--opt=word`) that looks generated: 20+ characters
    of letters and digits (and `_-+`), upper and lower case and digits mixed the way random text
    mixes them. Paths, URLs and dotted names are not candidates: a generated path component is
    a file name, not a credential."""
    if len(cmd) < 20 or not _LONG_WORD.search(cmd):
        return None
    for found in _SHELL_WORD.finditer(cmd):
        word = found.group(0)
        if len(word) < 20:
            continue
        if public_key(word) or "://" in word:
            continue  # (`cache.nixos.org-1:KEY` whole: its name is part of it; a URL is urls.py's)
        prefix = _NAME_PREFIX.match(word)
        if prefix and prefix.end() == len(word.rstrip("=")) + 1:
            prefix = None  # base64's padding, not `NAME=`
        if prefix:
            word = word[prefix.end() :]
        if len(word) < 20 or word.startswith(("-", "$", "@")) or word.startswith(PUBLIC_PREFIXES):
            continue
        start = found.start() + (prefix.end() if prefix else 0)
        if _HARMLESS_BEFORE.search(cmd[max(0, start - 48) : start]) or public_key(word):
            continue
        if _AWS_SECRET.fullmatch(word):
            has_all, change = mixes(word)
            if has_all and change > 0.45 and not decodes_to_text(word):
                return "aws-secret-key"
            # (not AWS's shape: judged as any word below, a readable prefix apart)
        if _BASE64.fullmatch(word) and ("/" in word or "+" in word):
            if not path_like(word) and _random_base64(word):
                return "random-string"
            continue
        if not _RANDOM_WORD.fullmatch(word):
            continue
        if word.endswith("=") and _random_base64(word):
            return "random-string"  # a key in base64 (`...=`), with no `/` or `+` in it
        body = word.rstrip("=")
        # identifiers joined by separators (`my-app_v2-release`): judge the longest piece
        piece = (
            max(re.split(r"[_+-]", body), key=len) if ("_" in body or "-" in body or "+" in body) else body
        )
        if any(_generated_piece(*candidate) for candidate in _pieces(piece)) and not decodes_to_text(word):
            return "random-string"
    return None


# A readable prefix before a generated value (`mediaserverXk9Qm2...`, `PhotosAb3...`, `myApp...`):
# the words lower the share of class changes the whole is judged by (a 13-letter prefix let half
# of 200 random values through), so the rest is judged too.
_READABLE_PREFIX = re.compile(r"(?:[A-Z]?[a-z]{2,})+")


def _pieces(piece: str) -> tuple[tuple[str, int, float], ...]:
    """The piece (20+ characters, 45% class changes), and after a readable prefix of 3+ letters
    what follows it (16+ characters, 50%: shorter, so held to more)."""
    prefix = _READABLE_PREFIX.match(piece)
    if prefix is None or prefix.end() < 3 or len(piece) - prefix.end() < 16:
        return ((piece, 20, 0.45),)
    rest = piece[prefix.end() :]
    return (piece, 20, 0.45), (rest, 16, 0.45 if len(rest) >= 20 else 0.5)


def _generated_piece(piece: str, least: int, changes: float) -> bool:
    """`least`+ characters with a digit, most of them distinct, upper, lower and digits mixed
    as random text mixes them (class changes at `changes` of adjacent characters or more)."""
    if len(piece) < least or not any(c.isdigit() for c in piece):
        return False
    if len(set(piece)) < 0.5 * min(len(piece), 40):
        return False
    has_all, change = mixes(piece)
    return has_all and change >= changes


def _random_base64(word: str) -> bool:
    """base64 of random bytes (a key's line, a WireGuard or AES key): mixed like random text,
    decoding to bytes that are neither text nor a structure of few values. Not a certificate's or
    a public key's DER (`MII...`, values.public_key: told by its structure; random base64 starts
    `M[A-P]` once in 256, and was let through before issue 39)."""
    return not public_key(word) and random_bytes(word)


def basic_auth_rule(cmd: str) -> str | None:
    """base64 of `user:password` anywhere (written into a file, a config, a header)."""
    if len(cmd) < 11:
        return None
    for found in _PAIR_CANDIDATE.finditer(cmd):
        word = found.group(0)
        if len(word) <= 200 and not word.islower() and not word.isupper() and decodes_to_pair(word):
            return "basic-auth-base64"
    return None
