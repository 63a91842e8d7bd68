"""Values in credential positions, told by what surrounds them rather than by the tool's name.

- **A login pair**: a command given a user (`-u bob`, `-l admin`, `--username x`, `/user:x`)
  and, beside it, a short password flag (`-p`, `-P`, `-pw`, `-pwd`, `-pass`): the flag's value is
  the password (`cqlsh -u cassandra -p x`, `hydra -l admin -p x`, `psexec -u a -p x`). A number
  (a port), a path, a file or a host is no password; tools whose separate `-p` prompts (mysql)
  are left to tools.py.
- **A short flag with a key's shape**: `-K`, `-k`, `-A`, `-X`, `-t`, `-H`... given a value that
  looks generated (hex, base36, base62, base64 of random bytes), or a pass-the-hash `LM:NT`.
- **A keyword of the tool** before a positional secret: a bare word whose name says password
  (`input_pw X`, `password X`, `requirepass X`, `secret_access_key X`), or a key path ending in
  one after a setting verb (`consul kv put app/db/password X`, `defaults write D Password X`).
- **A command that sets a secret** (`gh secret set`, `fly secrets set`, `az keyvault secret set`,
  `security add-generic-password`, `aws ssm put-parameter ... SecureString`): its values are
  secrets whatever their names.
- **Values after verbs** (subcommands.py): a subcommand whose name says it sets a secret, a
  secret's noun and a setting verb, a token after a login, auth or install verb.
- **A structured-data editor's value** (`dasel put -v X '.db.password'`, `plutil -replace
  Password -string X`): a literal set at a path whose last key says password.
- **Pairs**: `--user name:pass` (not a `uid:gid` of a container or chown), a client
  certificate's `cert.pem:passphrase`.

A reading command (`get`, `show`, `list`, `grep`, ...) asks for a secret; it does not hold one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from calmd.secrets.formats import prefix_rule, token_rule
from calmd.secrets.names import (
    READING_VERBS,
    SECRET_NOUNS,
    SETTING_VERBS,
    chooses_a_key,
    name_kind,
    name_words,
)
from calmd.secrets.shellwords import Line, command_name, is_expansion, unquote
from calmd.secrets.subcommands import noun_verb_operand, secret_subcommand, sole_operand
from calmd.secrets.values import (
    decodes_to_text,
    generated,
    is_placeholder,
    key_id,
    key_shaped,
    literal,
    looks_random,
    ordinary,
    password_like,
    public_key,
    reads_as_words,
)

# Tools whose separate `-p` asks for the password (the next word is a database): tools.py's.
_PROMPTING_P = frozenset({"mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlcheck", "mysqlshow",
                          "mysqlsh", "mariadb", "mariadb-dump", "mysqlpump", "mariadb-admin"})  # fmt: skip
# (`--user` alone is a flag of its own to systemctl, pip, npm: only `--user=NAME` names a user)
_USER_FLAGS = frozenset({"-u", "-U", "-l", "--username", "-user", "-username", "--login", "-login", "-usr"})
_PASSWORD_FLAGS = frozenset({"-p", "-P", "-pw", "-pwd", "-pass", "-passwd", "--pw", "--pwd", "--passwd"})
_USER_NAME = re.compile(r"[A-Za-z0-9_][\w.@\\-]{0,63}")
_FILE_LIKE = re.compile(r".*\.(?:py|sh|js|ts|rb|pl|txt|json|ya?ml|conf|cfg|ini|log|csv|sql|xml|toml|md)")
# Hex and base36 operands are ids to these tools (commits, containers, boot ids, snapshots).
_ID_TOOLS = frozenset({"git", "docker", "podman", "nerdctl", "crictl", "ctr", "kubectl", "oc", "gpg", "gpg2",
                       "apt-key", "ipfs", "zerotier-cli", "hg", "svn", "restic", "borg", "journalctl",
                       "systemd-run", "machinectl", "ostree", "flatpak", "nix", "nix-store", "guix",
                       "sha1sum", "sha256sum", "sha512sum", "md5sum", "b2sum", "cosign", "crane", "skopeo",
                       "buildah", "tor", "bluetoothctl", "gh", "glab", "hub", "dvc", "git-lfs", "jj",
                       "sl", "fossil", "bzr", "darcs", "repo", "cargo", "go", "npm", "yarn",
                       "pnpm"})  # fmt: skip
# Short flags that take a key in some tool (`openssl enc -K`, `swift -K`, `snmp* -A/-X`, `nuget
# -k`, `nxc -H`): a generated value after one is a key.
_KEY_FLAGS = frozenset({"-k", "-K", "-a", "-A", "-x", "-X", "-t", "-T", "-s", "-S", "-H", "-w", "-W",
                        "-p", "-P", "-pw", "-pwd", "-pass", "-key", "-secret", "-token",
                        "-auth"})  # fmt: skip
_LM_NT = re.compile(r"[0-9a-fA-F]{32}:[0-9a-fA-F]{32}")
_VALUE_OPTIONS = frozenset({"--value", "--body", "-b", "--data", "--string", "--secret-string", "--literal",
                            "--from-literal", "-w", "--secret", "--payload", "--secret-value",
                            "-v"})  # fmt: skip
_UID_GID_TOOLS = frozenset({"docker", "podman", "nerdctl", "kubectl", "chown", "chgrp", "install", "runuser",
                            "sudo", "su", "setpriv", "find", "tar", "rsync", "cp", "systemd-run", "bwrap",
                            "firejail", "lxc", "incus", "unshare", "ps", "pkill", "pgrep", "id", "stat",
                            "useradd", "usermod", "chroot", "nsenter", "buildah", "ctr",
                            "crictl"})  # fmt: skip
_PAIR_FLAGS = frozenset({"-u", "--user", "-user", "--auth", "--creds", "--cred", "--credentials", "--login",
                         "--basic-auth", "--basic", "--proxy-user", "--http-user", "--userpass",
                         "--user-pass", "--auth-user", "--dest-creds", "--src-creds"})  # fmt: skip
_SCHEME = re.compile(r"[A-Za-z][\w+.-]*://")
_CERT_PASS = re.compile(
    r"(?:-[\w-]*=)?[^\s=:]+\.(?:pem|p12|pfx|crt|cer|key|jks|keystore|der|pkcs12):(.+)", re.S
)
_CERT_NOT_PASS = frozenset({"ro", "rw", "z", "Z", "cached", "delegated", "consistent", "shared", "private"})


def _options_and_operands(args: Sequence[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The options of a command with the word after each (or the `=` value), and its operands
    (a word not taken as an option's value). Which options take a value is not known: a word
    after one is both its value and, when the option turns out to take none, an operand."""
    options: list[tuple[str, str | None]] = []
    operands: list[str] = []
    k = 0
    while k < len(args):
        word = unquote(args[k]) if args[k][:1] in "'\"" else args[k]
        if word == "--":
            operands += args[k + 1 :]
            break
        if word[:1] == "-" and (word[1:2].isalpha() or word[1:3].startswith("-")):
            flag, eq, value = word.partition("=")
            if eq:
                options.append((flag, value))
            elif k + 1 < len(args) and not args[k + 1].startswith("-"):
                options.append((flag, args[k + 1]))
                operands.append(args[k + 1])
                k += 1
            else:
                options.append((flag, None))
        else:
            operands.append(args[k])
        k += 1
    return options, operands


def _login_pair(name: str, args: Sequence[str]) -> bool:
    if name in _PROMPTING_P or not _PROMPTING_P.isdisjoint(command_name(w) for w in args):
        return False  # (also `docker compose exec db mysql -u root -p db`)
    user = password = None
    for k, raw in enumerate(args):
        if raw.startswith("--user=") and _USER_NAME.fullmatch(unquote(raw[7:])):
            user = k - 1
        elif raw in _USER_FLAGS and k + 1 < len(args):
            name_given = unquote(args[k + 1])
            if (
                _USER_NAME.fullmatch(name_given)
                and not name_given.isdigit()
                and not _FILE_LIKE.fullmatch(name_given)
            ):
                user = k
        elif raw in _PASSWORD_FLAGS and k + 1 < len(args) and not args[k + 1].startswith("-"):
            password = k
    if user is None and password is not None:
        user = _created_user(args, password)
    if user is None or password is None:
        return False
    between = args[min(user, password) + 2 : max(user, password)]
    if any(
        not w.startswith("-") and not (j and between[j - 1].startswith("-")) for j, w in enumerate(between)
    ):
        return False  # an operand between them: another command's flags (`compose -p x exec -u y`)
    value = literal(args[password + 1])
    if value is None or is_placeholder(value) or value in ("-", "*"):
        return False
    return not ordinary(value) or (args[password + 1][:1] in "'\"" and not value.isdigit())


_USER_NOUNS = frozenset({"user", "users", "account", "accounts", "login", "member", "admin"})
_CREATING = frozenset({"create", "add", "new", "update", "set", "register", "invite", "modify"})


def _created_user(args: Sequence[str], password: int) -> int | None:
    """A user named as an operand of `user create|add NAME` before the password flag (`rpk
    security user create alice -p X`, `influx user create -n bob -p X`): where the user stands."""
    lowered = [a.lower() for a in args[:password]]
    for k in range(len(lowered) - 2):
        if lowered[k] in _USER_NOUNS and lowered[k + 1] in _CREATING:
            if args[k + 2] in ("-n", "--name") and k + 3 < password:
                return k + 2  # the name as an option's value: `user create -n bob -p X`
            name = args[k + 2]
            return k + 1 if _USER_NAME.fullmatch(unquote(name)) and not name.startswith("-") else None
    return None


def _short_flag_values(name: str, options: Sequence[tuple[str, str | None]]) -> bool:
    if name in _ID_TOOLS:
        return False
    for flag, raw in options:
        if raw is None or flag not in _KEY_FLAGS:
            continue
        value = literal(raw)
        if value is None or (ordinary(value.rstrip("=")) and not _LM_NT.fullmatch(value)):
            continue
        if _LM_NT.fullmatch(value) or (key_shaped(value) and not decodes_to_text(value)):
            return True
    return False


# Where a setting command may send a value it then asks for (`vercel env add NAME production`).
_DEPLOYMENTS = frozenset({"production", "preview", "development", "staging"})
_KEY_SETTERS = frozenset({"set", "put", "write", "store", "insert", "kv", "config", "configure", "setenv",
                          "set-value", "setex", "hset", "put-value"})  # fmt: skip


_VERBS = frozenset(SETTING_VERBS | {"change", "reset", "rotate", "replace", "save"})
_SETTING_OPTIONS = frozenset({"--set", "-set", "--put", "--write", "--update", "--add"})


def _keywords(words: Sequence[str]) -> bool:
    """A keyword naming a secret before its value (`input_pw X`), or a key path ending in one
    after a setting verb (`kv put app/db/password X`, `defaults write D Password X`)."""
    if command_name(words[0]) in READING_VERBS:
        return False
    setting = False
    for k, raw in enumerate(words[:-1]):
        if raw in _SETTING_OPTIONS:
            setting = True  # `crudini --set FILE SECTION password X`
        if not k or raw[:1] == "-":
            continue
        word = (unquote(raw) if raw[:1] in "'\"" else raw).rstrip("=:")
        lowered = word.lower()
        if lowered in READING_VERBS:
            return False
        if lowered in _KEY_SETTERS or lowered == "write":
            setting = True
            continue
        if not re.fullmatch(r"[\w./:~-]+", word) or (word[:1] in "./~" and not setting):
            continue  # a file (`.htpasswd`, `/etc/passwd`) unless a key path after `put`
        key = re.split(r"[/.:]", word)[-1]
        kind = name_kind(key)
        if (
            kind is None
            or not READING_VERBS.isdisjoint(name_words(key))
            or not _VERBS.isdisjoint(name_words(key))
        ):
            continue  # (`get-password NAME` asks for one; `set-password USER` is _secret_subcommand's)
        if words[k + 1].startswith("-"):
            continue
        value = literal(words[k + 1])
        if value is None or is_placeholder(value):
            continue
        compound = key != word or len(name_words(key)) > 1
        quoted = words[k + 1][:1] in "'\""
        if kind == "token":
            if public_key(value) or (key_id(value) and chooses_a_key(word)):
                continue  # `config user.signingkey 3AA5C34371567BD2`: the key's public name
            if looks_random(value) or token_rule(value) or prefix_rule(value):
                return True
        elif compound or setting:
            if not quoted and value in _DEPLOYMENTS and words[k + 2 : k + 3] in ([], ["--"]):
                continue  # `vercel env add DB_PASSWORD production`: where it goes; it prompts
            if not (ordinary(value) and not quoted) or value.isdigit():
                return True
        elif password_like(value, quoted=quoted) or generated(value):
            return True
    return False


# Options that give the value a structured-data editor sets at a path (`dasel put -v X '.db.password'`,
# `xmlstarlet ed -u //password -v X`, `plutil -replace password -string X`).
_SET_VALUE_OPTIONS = frozenset({"-v", "--value", "-value", "--string", "-string", "--set-value"})
_EDITING = frozenset({"put", "set", "ed", "edit", "update", "modify", "write", "-replace", "-insert", "-u",
                      "--update", "-s", "--set", "patch", "replace", "upsert"})  # fmt: skip


def _value_for_path(words: Sequence[str]) -> bool:
    """An editor given a path whose last key says password and, by an option, a literal value."""
    lowered = {w.lower() for w in words[1:]}
    if _EDITING.isdisjoint(lowered) or _SET_VALUE_OPTIONS.isdisjoint(lowered):
        return False
    named = False
    for k, raw in enumerate(words[1:], 1):
        path = unquote(raw) if raw[:1] in "'\"" else raw
        pieces = [p for p in re.split(r"[./:\[\]]", path) if p]
        # a path (`.db.password`), or a key given just before its value (`-replace Password -string X`)
        placed = len(pieces) >= 2 or (k + 1 < len(words) and words[k + 1] in _SET_VALUE_OPTIONS)
        if pieces and placed and name_kind(pieces[-1].strip("'\"")) == "password":
            named = True
    if not named:
        return False
    for k, raw in enumerate(words[:-1]):
        if raw in _SET_VALUE_OPTIONS:
            value = literal(words[k + 1])
            if value and not is_placeholder(value) and (words[k + 1][:1] in "'\"" or password_like(value)):
                return True  # (quoted, a value set at a password's path is taken as written)
    return False


def _secret_command(words: Sequence[str], options: Sequence[tuple[str, str | None]]) -> bool:
    """A command that sets a secret: its values are secrets whatever their names."""
    lowered = {unquote(w).lower() for w in words}
    parts = lowered | {part for word in lowered if "-" in word for part in word.split("-")}  # `user-secrets`
    if not (SECRET_NOUNS & parts) or not (SETTING_VERBS & {unquote(w).lower() for w in words[:5]}):
        return False
    if READING_VERBS & lowered:
        return False
    for flag, raw in options:
        if raw is not None and flag in _VALUE_OPTIONS:
            named = re.match(r"[A-Za-z_][\w.-]*=", raw)
            value = literal(raw[named.end() :] if named else raw)
            if value and not is_placeholder(value) and not _names_what_is_set(words, flag, raw):
                return True
    for raw in words[1:]:
        if raw.startswith("-") or "=" not in raw:
            continue
        key, _, value_raw = raw.partition("=")
        if not re.fullmatch(r"[A-Za-z_][\w.-]*", key) or (name_kind(key) is None and _reference_name(key)):
            continue
        value = literal(value_raw) if value_raw else None
        if value and not is_placeholder(value) and len(value) >= 4:
            return True
    return False


_NAME_SET = re.compile(r"[A-Za-z_][\w-]*(?:[:./][A-Za-z_][\w-]*)*")


def _names_what_is_set(words: Sequence[str], flag: str, raw: str) -> bool:
    """`pulumi config set --secret dbPassword`: a flag named by the noun alone may only mark what
    is set as a secret; the word after it is then the name of what is set, when it reads as a name
    (it says what it holds, or is words without a digit) and no value follows it: the command
    prompts for the value (`--secret NAME VALUE`: the value follows; `--secret NAME "$X"`: a
    reference does)."""
    if flag.lstrip("-") not in SECRET_NOUNS:
        return False
    after = next((k + 2 for k in range(len(words) - 1) if words[k] == flag and words[k + 1] == raw), None)
    if after is None:
        return False
    if after < len(words) and not words[after].startswith("-"):
        value = literal(words[after])  # what follows the name: the value, when it is a literal
        if value is not None and not is_placeholder(value):
            return False
    name = unquote(raw)
    if _NAME_SET.fullmatch(name) is None or generated(name):
        return False  # (a password: `hunter2` has a digit no name of words has)
    said = name_kind(re.split(r"[:./]", name)[-1]) is not None  # `dbPassword`, `github:token`
    return said or (reads_as_words(name) and not any(c.isdigit() for c in name))


_REFERENCE_NAMES = frozenset({"user", "username", "host", "hostname", "url", "uri", "port", "name", "id",
                              "region", "endpoint", "path", "file", "dir", "email"})  # fmt: skip


def _reference_name(key: str) -> bool:
    """A name whose value says where or who, not a secret (`DB_HOST`, `SMTP_USER`)."""
    words = name_words(key)
    return bool(words) and words[-1] in _REFERENCE_NAMES


def _pairs(name: str, options: Sequence[tuple[str, str | None]]) -> bool:
    """`--user name:pass` (not a `uid:gid`), `-H LM:NT`."""
    for flag, raw in options:
        if raw is None or is_expansion(raw):
            continue
        if flag not in _PAIR_FLAGS:
            continue
        value = unquote(raw)
        quoted = "'" in raw or '"' in raw
        user, colon, secret = value.partition(":")
        if not colon or not secret or not user or is_placeholder(secret) or _SCHEME.match(value):
            continue  # (a URL's userinfo is urls.py's)
        if secret.startswith(("$", "`")) and ":'" not in raw and not raw.startswith("'"):
            continue
        if not quoted and (secret.startswith("/") or "@" in secret):
            continue  # `git:x@host`
        if secret.isdigit() or secret == user or re.fullmatch(r"\d+", user) or "/" in user:
            continue  # `1000:1000`, `www-data:www-data`
        if not quoted and ordinary(secret):
            continue  # `1000:1000`, `www-data:www-data`, `git:x@host`
        if name in _UID_GID_TOOLS and re.fullmatch(r"[a-z_][a-z0-9_-]*\$?", secret):
            continue  # `docker exec -u app:staff`
        return True
    return False


def _certificate_passphrase(words: Sequence[str]) -> bool:
    """`--cert client.p12:PASS`, `-E cert.pem:PASS` (curl's form), anywhere a key file is given."""
    for raw in words:
        if ":" not in raw:
            continue
        found = _CERT_PASS.fullmatch(unquote(raw))
        if found is None:
            continue
        secret = found.group(1)
        quoted = "'" in raw or '"' in raw
        if secret in _CERT_NOT_PASS or secret.isdigit() or is_placeholder(secret):
            continue
        if not quoted and secret.startswith(("/", "$", "~", ".")):
            continue
        return True
    return False


# What each rule needs in a line before it looks at the line's commands (most lines have none):
# the options a line gives (one pass), long words, a verb (substring search first: it runs at C
# speed, a regular expression's alternation tries every position).
_FLAG = re.compile(r"(?<!\S)['\"]?(--?[A-Za-z][\w-]{0,20})(?=[\s=]|$)")
_LOGIN_FLAGS = frozenset({"-p", "-P", "-pw", "-pwd", "-pass", "-passwd", "--pw", "--pwd", "--passwd"})
_USER_HINTS = frozenset({"-u", "-U", "-l", "--username", "-user", "-username", "--login", "-login", "-usr",
                         "--user"})  # fmt: skip
_KEY_HINTS = frozenset({*_KEY_FLAGS, "-key", "-secret", "-token", "-auth"})
_USER_CREATE_HINT = re.compile(
    r"\b(?:user|users|account|accounts|login|member|admin) "
    r"(?:create|add|new|update|set|register|invite|modify)\b"
)
_CERT_HINT = re.compile(r"\.(?:pem|p12|pfx|crt|cer|key|jks|keystore|der|pkcs12):")
_TOKEN_VERB_HINT = re.compile(
    r"\b(?:login|auth|authtoken|authenticate|install|register|activate|join|connect|token|enroll|link)\b"
)
_VERB_NEEDLES = (
    "login",
    "auth",
    "install",
    "register",
    "activate",
    "join",
    "connect",
    "token",
    "enroll",
    "link",
)


def positions_rule(line: Line, hinted: bool) -> str | None:
    """(`hinted`: the line holds a word that may name a secret, named.HINT)"""
    text = line.text
    lower = line.lower
    if ":" in text and _CERT_HINT.search(text) and _certificate_passphrase(line.words):
        return "certificate-passphrase"
    flags = set(_FLAG.findall(text)) if "-" in text else set()
    long_word = len(text) >= 20 and any(len(word) >= 20 for word in text.split())
    login = not flags.isdisjoint(_LOGIN_FLAGS) and (
        not flags.isdisjoint(_USER_HINTS) or "--user=" in text or _USER_CREATE_HINT.search(lower) is not None
    )
    pairs = ":" in text and not flags.isdisjoint(_PAIR_FLAGS)
    keys = long_word and not flags.isdisjoint(_KEY_HINTS)
    nouns = "secret" in lower or "keych" in lower or "keyring" in lower or "cred" in lower
    nouns = nouns or "password" in lower or "securestring" in lower
    verbs = "unlock" in lower or "unseal" in lower or "decrypt" in lower
    verbs = verbs or (
        long_word
        and any(verb in lower for verb in _VERB_NEEDLES)
        and _TOKEN_VERB_HINT.search(lower) is not None
    )
    if not (login or pairs or keys or nouns or verbs or hinted):
        return None
    for words in line.commands:
        if len(words) < 2:
            continue
        name = command_name(words[0])
        args = words[1:]
        options, operands = _options_and_operands(args)
        if login and _login_pair(name, args):
            return "login-password"
        if pairs and _pairs(name, options):
            return "user-password-pair"
        if keys and _short_flag_values(name, options):
            return "key-option"
        if nouns and _secret_command(words, options):
            return "secret-setting"
        if hinted and len(words) >= 3 and _keywords(words):
            return "keyword-password"
        if hinted and operands and (secret_subcommand(words) or noun_verb_operand(words)):
            return "secret-subcommand"
        if hinted and len(words) >= 4 and _value_for_path(words):
            return "keyword-password"
        if verbs and operands and sole_operand(operands):
            return "login-token"
    return None
