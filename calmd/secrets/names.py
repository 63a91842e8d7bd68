"""Names that mean secret: of options, variables, keywords, JSON and config keys, headers.

A name is cut into words (`DB_PASSWORD`, `db-password`, `dbPassword`, `auth.password`); its last
word says what the value is. "password" names take a secret whatever it is, "token" names one
that looks random; names that end in `file`, `path`, `name`, `id`, ... are where a secret lives
or something about it, not the secret.
"""

from __future__ import annotations

import re

PASSWORD_WORDS = ("password", "passwd", "passphrase", "passcode", "pass", "pwd", "psk", "pw", "pword")
_NOT_PASS = ("bypass", "compass", "surpass", "encompass", "overpass", "underpass", "trespass", "nopass",
             "askpass")  # fmt: skip
# Name endings that say the value is where a secret lives, or something about it, not the secret.
_REFERENCE_ENDINGS = frozenset({"file", "files", "path", "dir", "name", "names", "type", "length", "len",
                                "size", "count", "id", "ids", "arn", "ref", "env", "stdin", "prompt",
                                "policy", "store", "enabled", "enable", "mode", "url", "uri", "endpoint",
                                "header", "helper", "cmd", "command", "program", "format", "version",
                                "source", "provider", "manager", "backend", "timeout", "ttl", "expiry",
                                "expires", "rotation", "min", "max", "hash", "algorithm", "algo", "method",
                                "field", "key_id", "keyid", "fingerprint", "exchange", "mount", "location",
                                "region", "server", "host", "port", "user", "username", "login", "fd",
                                "required", "hint", "reset", "strength", "expiration",
                                "auth_method"})  # fmt: skip
_TOKEN_ENDINGS = (
    "token", "apikey", "api_key", "accesskey", "access_key", "secretkey", "privatekey", "private_key",
    "authkey", "auth_key", "accountkey", "account_key", "masterkey", "master_key", "signingkey",
    "signing_key", "encryptionkey", "encryption_key", "clientkey", "client_key", "licensekey",
    "license_key", "appkey", "app_key", "credential", "credentials", "creds", "auth", "sig",
    "signature", "appid", "secret", "key",
)  # fmt: skip
_KEY_QUALIFIERS = frozenset({"api", "access", "secret", "private", "auth", "account", "master", "signing",
                             "encryption", "client", "license", "app", "storage", "subscription", "service",
                             "deploy", "integration", "shared", "hmac", "session", "consumer", "write",
                             "read", "admin", "root", "unseal", "recovery", "priv"})  # fmt: skip
_NEGATORS = frozenset({"no", "ask", "existing", "use", "show", "with", "allow", "require", "min", "max",
                       "generate", "random", "reset", "rotate", "change", "forgot", "forgotten", "empty",
                       "skip", "disable", "save", "prompt"})  # fmt: skip
# The words a name is cut into: `DB_PASSWORD`, `db-password`, `dbPassword`, `auth.password`.
NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# Words whose value is a secret however it is spelled: a wallet's words, a TOTP seed.
_SECRET_PHRASES = frozenset({"mnemonic", "seedphrase", "seed_phrase", "recovery_phrase", "totp_secret",
                             "otp_secret", "private_key", "privkey", "secret_key", "aws_session_token",
                             "google_service_account_key", "atuin_key", "communitystring",
                             "community_string"})  # fmt: skip


def name_words(name: str) -> list[str]:
    return [p.lower() for p in NAME_SPLIT.split(name) if p]


def name_kind(name: str, *, bare_key: bool = False) -> str | None:
    """ "password" when a value given to `name` is a secret whatever it is, "token" when it is a
    secret if it looks random, None when the name says nothing secret. `bare_key`: a name that is
    just `key`/`secret`/`auth`/`sig` counts (in URL queries and config files, not command lines)."""
    parts = name_words(name)
    if not parts:
        return None
    last = parts[-1]
    joined = "_".join(parts)
    if last in _REFERENCE_ENDINGS or not _NEGATORS.isdisjoint(parts[:-1]):
        return None  # ids, names, paths, lengths; `--no-password`, `existingSecret`
    flat = joined.replace("_", "")
    if last in PASSWORD_WORDS or (flat.endswith(PASSWORD_WORDS[:-2]) and not flat.endswith(_NOT_PASS)):
        return "password"
    if joined.endswith(tuple(_SECRET_PHRASES)) or flat in _SECRET_PHRASES:
        return "password"
    if "secret" in parts[:-1] or (last == "secret" and len(parts) > 1):
        return "password"  # `*_SECRET_KEY*=`, JWT_SECRET, CLIENT_SECRET
    if parts[0] == "azure" and last == "key":
        return "password"  # AZURE_*_KEY, as atuin
    if len(parts) == 1 and last in ("key", "secret", "auth", "sig", "signature", "appid") and not bare_key:
        return None  # `--key value`, `--secret name`: too often a name or a file
    if last in _TOKEN_ENDINGS or flat.endswith(_TOKEN_ENDINGS[:-2]):
        if last == "key" and len(parts) > 1 and parts[-2] not in _KEY_QUALIFIERS:
            return None  # `--ssh-key`, `--gpg-key`, `PRIMARY_KEY`: names of things
        return "token"
    return None


# Qualifiers that make `*_KEY` the name of a thing, not a key to something: a record's, a cache
# entry's, a public key's (`SORT_KEY=created_at`, `CACHE_KEY=deps-v2`, `SSH_KEY=~/.ssh/id`).
_THING_KEYS = frozenset({"ssh", "gpg", "pgp", "public", "pub", "publishable", "site", "verify",
                         "verification", "primary", "foreign", "sort", "partition", "range", "cache",
                         "hash", "idempotency", "dedup", "dedupe", "routing", "lookup", "map", "object",
                         "s3", "row", "column", "unique", "composite", "index", "shard", "group",
                         "message", "event", "cursor", "page", "pagination", "hot", "short", "shortcut",
                         "keyboard", "host", "known", "authorized", "ca", "cert", "tls", "ssl", "kms",
                         "redis", "memcache", "translation", "i18n", "label", "field", "attribute",
                         "property", "metric", "feature", "flag", "experiment", "queue", "topic",
                         "bucket", "config", "setting", "settings", "registry", "env", "yubi",
                         "hardware"})  # fmt: skip


def unnamed_key(name: str) -> bool:
    """A name that ends in `key` after a qualifier that says neither secret (name_kind's) nor a
    thing's name (`_THING_KEYS`): `SYNC_KEY`, `BACKUP_ENCRYPT_KEY`, `REPLICATION_KEY`. Its value
    is a key when it looks generated (values.generated): the qualifiers of secrets are not a
    list anyone can finish."""
    parts = name_words(name)
    return (
        len(parts) > 1
        and parts[-1] == "key"
        and name_kind(name) is None
        and parts[-2] not in _THING_KEYS
        and not _NEGATORS.intersection(parts)
        and _THING_KEYS.isdisjoint(parts[:-1])
    )


# An OpenPGP key is chosen by its id: a value of that shape (values.key_id) given to such a name, or
# to an option of an OpenPGP tool that is no passphrase, names the key (`gpg -k` prints it).
_OPENPGP_WORDS = frozenset({"gpg", "pgp", "gnupg", "openpgp", "signingkey"})
OPENPGP_TOOLS = frozenset({"gpg", "gpg2", "gpgsm", "gpgv", "gpgv2", "sq", "sqop"})


def chooses_a_key(name: str) -> bool:
    """A name whose value chooses an OpenPGP key to sign or encrypt with: git's `user.signingkey`
    (however cased), `GPG_SIGNING_KEY`, `gpg.keyname`, `PGP_KEY`."""
    parts = name_words(name)
    return not _OPENPGP_WORDS.isdisjoint(parts) or parts[-3:] == ["user", "signing", "key"]


# --------------------------------------------------------------------------- options

SECRET_PARTS = frozenset({"password", "passwd", "pass", "passphrase", "pwd", "psk", "secret", "secrets",
                          "token", "key", "cred", "creds", "credential", "credentials", "auth", "pin",
                          "passin", "passout", "kfile", "pw"})  # fmt: skip
_PUBLIC_PARTS = frozenset({"ssh", "public", "pub", "gpg", "host", "ca", "known", "authorized", "pgp"})


def secret_option(name: str) -> bool:
    """An option whose name says it takes a secret (or where one is): `--password-file`,
    `--passphrase-fd`, `-passin`, `--key-file`; not `--ssh-key`, `--public-key`."""
    parts = set(name_words(name))
    if not SECRET_PARTS.isdisjoint(parts - {"key"}):
        return True
    return "key" in parts and _PUBLIC_PARTS.isdisjoint(parts)


# Words that, standing alone in a command, say it sets a secret (`gh secret set`, `fly secrets
# set`, `security add-generic-password`, `az keyvault secret set`, `aws ssm ... SecureString`).
SECRET_NOUNS = frozenset({"secret", "secrets", "keychain", "keyring", "credential", "credentials", "creds",
                          "password", "passwords", "securestring", "add-generic-password",
                          "add-internet-password", "set-secret", "create-secret", "put-secret-value",
                          "secret:set", "secrets:set"})  # fmt: skip
SETTING_VERBS = frozenset({"set", "put", "add", "create", "store", "insert", "import", "encrypt", "write",
                           "new", "update", "put-parameter", "put-secret-value", "create-secret",
                           "add-generic-password", "add-internet-password", "secret:set",
                           "secrets:set"})  # fmt: skip

# A reading or removing verb: the command asks for a secret, or names one to remove.
READING_VERBS = frozenset({"get", "show", "lookup", "find", "read", "search", "list", "ls", "cat", "print",
                      "grep", "describe", "view", "query", "generate", "gen", "reset", "forget", "remove",
                      "rm", "delete", "del", "unset", "clear", "expire", "check", "verify", "help", "man",
                      "which", "whatis", "apropos", "info", "history", "locate", "find-generic-password",
                      "find-internet-password", "get-secret-value", "get-parameter", "get-parameters",
                      "egrep", "fgrep", "rg", "ag", "ack", "less", "more", "fzf", "diff", "test",
                      "inspect", "export", "dump", "reveal", "copy", "clip", "rotate", "edit", "uninstall",
                      "purge", "erase", "revoke", "logout"})  # fmt: skip
