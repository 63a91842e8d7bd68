"""Values after a command's verbs, told by the verbs: a subcommand whose own name says it sets a
secret (`reset-admin-password X`, `set-password USER X`, `change-secret NAME X`, `passwd-set X`),
a secret's noun and a setting verb before the value (`kubeadm token create ID.SECRET`, `tool
token set X`, `doppler secrets set NAME X`), and a login, auth or install command whose only
operand is a token (`wandb login HEX`, `snyk auth UUID`, `exo auth login X`, `cloudflared
service install TOKEN`) or an unlock whose operand is a password (`bw unlock X`). A name where
the value would be is what is set and prompts for it (`gh secret set NAME`, `set-password
USER`); a reading verb asks (`get-password`, `token list`, `token delete`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from calmd.secrets.formats import prefix_rule
from calmd.secrets.names import READING_VERBS, SECRET_NOUNS, SETTING_VERBS, name_words
from calmd.secrets.values import (
    generated,
    is_placeholder,
    is_uuid,
    key_shaped,
    literal,
    ordinary,
    password_like,
    shannon_entropy,
)

# Verbs after which a sole operand is a token (`wandb login X`), or a password (`bw unlock X`); the
# verbs that may follow one before the value (`auth login X`, `token set X`); and those after which
# a UUID is a token too (services' API tokens often are; after `link`, `join` it names a project).
_TOKEN_VERBS = frozenset({"login", "auth", "authtoken", "add-authtoken", "authenticate", "install",
                          "register", "activate", "join", "connect", "token", "set-token", "enroll",
                          "link"})  # fmt: skip
_PASSWORD_VERBS = frozenset({"unlock", "unseal", "decrypt"})
_THEN_VERBS = frozenset({"login", "auth", "token", "set", "add", "save", "use", "key", "set-token", "apikey"})
_UUID_VERBS = frozenset({"login", "auth", "authtoken", "add-authtoken", "authenticate", "token", "set-token",
                         "set", "add", "save", "use", "key", "apikey"})  # fmt: skip
# A secret's noun and a setting verb among the first operands (`token create`, `secrets set`).
_SECRET_WORDS = frozenset(SECRET_NOUNS | {"token", "tokens", "apikey", "api-key", "passphrase", "pin"})
_SETTING_POSITIONAL = frozenset(SETTING_VERBS | {"change", "reset", "replace", "save"})


def noun_verb_operand(words: Sequence[str]) -> bool:
    """A secret's noun and a setting verb as the first operands, and a literal after them that
    could be the secret (`kubeadm token create abcdef.0123456789abcdef`, `tool token set X`,
    `doppler secrets set NAME X`); a name after them is what is set (`gh secret set NAME`)."""
    operands = _bare_operands(words[1:])
    head = [w.lower() for w in operands[:4]]
    nouns = [k for k, w in enumerate(head) if w in _SECRET_WORDS]
    verbs = [k for k, w in enumerate(head) if w in _SETTING_POSITIONAL]
    if not nouns or not verbs or not _ASKING.isdisjoint(head):
        return False
    rest = operands[max(nouns[0], verbs[0]) + 1 :]
    if not 1 <= len(rest) <= 2:
        return False
    value = literal(rest[-1])
    quoted = rest[-1][:1] in "'\""
    if value is None or is_placeholder(value):
        return False
    if generated(value) or key_shaped(value) or _id_and_secret(value):
        return True
    return len(rest) == 2 and (quoted or password_like(value))


_ID_AND_SECRET = re.compile(r"[a-z0-9]{6,}\.[a-z0-9]{12,}")


def _id_and_secret(value: str) -> bool:
    """A token of an id and a secret (`abcdef.0123456789abcdef`, Kubernetes' bootstrap tokens):
    lower-case letters and digits, random as a whole (random base36 of 16 has ~3.6 bits a
    character, and dips to 3.3: too few for values.generated's 4.0 when digits are few)."""
    joined = value.replace(".", "")
    return (
        _ID_AND_SECRET.fullmatch(value) is not None
        and any(c.isdigit() for c in joined)
        and shannon_entropy(joined) >= 3.2
    )


def _bare_operands(words: Sequence[str]) -> list[str]:
    """A command's operands but the word after a long option (`--project shop`: the option's
    value, likely) and options themselves."""
    return [w for k, w in enumerate(words) if not w.startswith("-") and not (k and words[k - 1][:2] == "--"
            and "=" not in words[k - 1])]  # fmt: skip


# A subcommand whose own name says it sets a password, secret or token (`reset-admin-password X`,
# `set-password USER X`, `change-secret NAME X`, `passwd-set X`): its last operand is the secret.
_SECRET_PARTS = frozenset({"password", "passwd", "pass", "pwd", "passphrase", "secret", "token", "pin",
                           "apikey", "credential", "credentials", "psk"})  # fmt: skip
_ASKING = frozenset(READING_VERBS - {"reset", "check", "verify", "test"})


def secret_subcommand(words: Sequence[str]) -> bool:
    operands = _bare_operands(words[1:])
    for k, word in enumerate(operands[:4]):
        parts = name_words(word) if re.fullmatch(r"[A-Za-z][\w:-]*", word) else []
        if len(parts) < 2 or _SECRET_PARTS.isdisjoint(parts) or not _ASKING.isdisjoint(parts):
            continue
        rest = operands[k + 1 :]
        if not 1 <= len(rest) <= 3:
            return False
        value = literal(rest[-1])
        quoted = rest[-1][:1] in "'\""  # (quoted, it is taken as written: `'mqjiib'` too)
        return (
            value is not None
            and not is_placeholder(value)
            and (quoted or password_like(value) or generated(value) or key_shaped(value))
        )
    return False


def sole_operand(operands: Sequence[str]) -> bool:
    """`wandb login HEX`, `snyk auth X`, `exo auth login X`, `cloudflared service install TOKEN`,
    `bw unlock PW`; after a login, auth or token verb a UUID too (API tokens are often UUIDs)."""
    for k, word in enumerate(operands[:3]):
        verb = word.lower()
        if verb in _TOKEN_VERBS or verb in _PASSWORD_VERBS:
            rest = operands[k + 1 :]
            while len(rest) > 1 and rest[0].lower() in _THEN_VERBS:
                rest = rest[1:]  # `auth login X`, `token set X`
            break
    else:
        return False
    if len(rest) != 1:
        return False
    value = literal(rest[0])
    if value is None or is_placeholder(value):
        return False
    if verb in _PASSWORD_VERBS:
        return password_like(value, quoted=rest[0][:1] in "'\"") or generated(value)
    if verb in _UUID_VERBS and is_uuid(value):
        return True  # (a project's id is given to `link`, `join`, `connect`: not here)
    if ordinary(value):
        return False
    return (
        key_shaped(value)
        or prefix_rule(value) is not None
        or (len(value) >= 40 and value.startswith("eyJ") and not any(c.isspace() for c in value))
    )
