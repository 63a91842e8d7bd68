"""Tools that take a secret in a place of their own: `mysql -pX`, `curl -u user:pass`,
`smbclient -U user%pass`, `7z -pX`, `ssh-keygen -N x`, `htpasswd -b`, `openssl ... pass:x`,
`kubectl --from-literal=password=x`, `helm --set a.password=x`, admin tools' positional
passwords (`mysqladmin password X`, `redis-cli AUTH X`), and a tool's own setting of a secret
(`aws configure set`, `npm config set`, `git config`).

These are the forms a generic rule cannot tell from an ordinary word (a separate `-p` prompts
in mysql and is a port elsewhere); calmd/secrets/positions.py generalizes what can be.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from calmd.secrets.archives import ARCHIVE_RULES
from calmd.secrets.names import chooses_a_key, name_kind
from calmd.secrets.network import NETWORK_RULES
from calmd.secrets.shellwords import SEPARATORS, Line, as_option, is_expansion, unquote
from calmd.secrets.values import (
    is_reference,
    key_id,
    literal,
    looks_random,
    names_no_secret,
    public_key,
    written_value,
)


def _option_value(args: Sequence[str], flags: tuple[str, ...], *, attached: bool = True,
                  separate: bool = True) -> list[str]:  # fmt: skip
    """Values of short/long options in `args`: `-p X`, `-pX`, `--password=X` (raw words; a quoted
    option, `"--password=x"`, is the option its quotes hold)."""
    values: list[str] = []
    for i, raw in enumerate(args):
        arg = as_option(raw)
        for flag in flags:
            if arg == flag:
                if separate and i + 1 < len(args) and not re.match(r"--?[A-Za-z]", args[i + 1]):
                    values.append(args[i + 1])  # (`mongo -u x -p -d db`: `-p` alone asks)
            elif arg.startswith(flag + "="):
                values.append(arg[len(flag) + 1 :])
            elif attached and not flag.startswith("--") and arg.startswith(flag) and len(arg) > len(flag):
                values.append(arg[len(flag) :])
    return values


def _any_literal(values: Sequence[str]) -> bool:
    return any(literal(v) for v in values)


def _pair_secret(values: Sequence[str], sep: str) -> bool:
    """`user:password` (curl -u), `user%password` (smbclient -U): the password part is literal."""
    for raw in values:
        if is_expansion(raw):
            continue
        value = unquote(raw)
        _, found, secret = value.partition(sep)
        if found and secret and not names_no_secret(raw, secret):
            return True
    return False


def _mysql(args: Sequence[str]) -> bool:
    # `-pSECRET` attached; `-p` alone prompts (and `-p db` names the database).
    options = [as_option(a) for a in args]
    if _any_literal([a[2:] for a in options if a.startswith("-p") and len(a) > 2 and not a.startswith("--")]):
        return True
    return args[0].endswith("admin") and _positional_after(args, ("password", "old-password"))


def _positional_after(args: Sequence[str], verbs: Sequence[str], skip: int = 0) -> bool:
    """A literal word `skip` words after one of `verbs` (`mysqladmin password NEW`, `AUTH pw`,
    `user set password 2 NEW`): an admin tool's password given as a positional argument."""
    lowered = [unquote(a).lower() for a in args]
    for verb in verbs:
        if verb in lowered:
            at = lowered.index(verb) + 1 + skip
            if at < len(args) and not args[at].startswith("-") and literal(args[at]):
                return True
    return False


def _positional(args: Sequence[str], verbs: Sequence[str], index: int) -> bool:
    """After the words `verbs` (in order), the `index`-th word that is not an option is a literal
    (`mc admin user add ALIAS USER PASSWORD`: index 2)."""
    lowered = [unquote(a).lower() for a in args]
    at = 0
    for verb in verbs:
        if verb not in lowered[at:]:
            return False
        at = lowered.index(verb, at) + 1
    operands = [a for a in args[at:] if not a.startswith("-")]
    return len(operands) > index and literal(operands[index]) is not None


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
    return len(positional) >= needed and literal(positional[needed - 1]) is not None


def _openssl(args: Sequence[str]) -> bool:
    if any(unquote(a).startswith("pass:") and literal(unquote(a)[5:]) for a in args):
        return True
    if "passwd" in args:  # `openssl passwd -6 -salt S PASSWORD`: the password to hash
        rest = list(args[args.index("passwd") + 1 :])
        operands = [w for k, w in enumerate(rest) if not w.startswith("-")
                    and not (k and rest[k - 1] in ("-salt", "-in", "-rand", "-writerand"))]  # fmt: skip
        if "-stdin" not in rest and "-in" not in rest and operands and literal(operands[0]):
            return True
    return _any_literal(_option_value(args, ("-k",), attached=False))


def _ldap(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-w",))) or _any_literal(
        _option_value(args, ("-s", "-a"), attached=False) if args and "ldappasswd" in args[0] else []
    )


def _smb(args: Sequence[str]) -> bool:
    if args[0] == "net" and len(args) > 3 and unquote(args[1]).lower() == "user":
        new = unquote(args[3])  # `net user NAME PASSWORD [/add]`; `*` asks for it
        if new != "*" and literal(args[3]) and not args[3].startswith("/"):
            return True
    return _pair_secret(_option_value(args, ("-U", "--user")), "%")


def _dash_p(args: Sequence[str]) -> bool:
    """Tools whose `-p` is a password (`sshpass -p`, `smbmap -p`, `redis-cli -a`...)."""
    return _any_literal(_option_value(args, ("-p",)))


def _upper_p(args: Sequence[str]) -> bool:
    """`zip -P`, `sqlcmd -P`, `ipmitool -P`, `mosquitto_pub -P`: an upper-case P is the password."""
    return _any_literal(_option_value(args, ("-P",)))


def _ssh_keygen(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-N", "-P")))


def _atuin(args: Sequence[str]) -> bool:
    return _any_literal(_option_value(args, ("-p", "-k", "--key"), attached=False))


def _redis(args: Sequence[str]) -> bool:
    if _any_literal(_option_value(args, ("-a", "--pass"), attached=False)):
        return True
    lowered = [unquote(a).lower() for a in args]
    if "auth" in lowered:  # `AUTH [user] password`: the last word
        rest = args[lowered.index("auth") + 1 :]
        if rest and len(rest) <= 2 and literal(rest[-1]):
            return True
    return _positional_after(args, ("requirepass", "masterauth"))


def _impacket(args: Sequence[str]) -> bool:
    """`[domain/]user:password@host`."""
    return any(
        re.fullmatch(r"(?:[^/\s]+/)?[^:/\s@]+:([^@\s]+)@\S+", unquote(a))
        and not unquote(a).split(":", 1)[1].startswith("$")
        for a in args[1:]
    )


def _freerdp(args: Sequence[str]) -> bool:
    return any(unquote(a).startswith("/p:") and literal(unquote(a)[3:]) for a in args)


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
            if len(positional) >= 2 and literal(positional[1]):
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
    return len(rest) >= 2 and literal(rest[0]) is not None


def _mkpasswd(args: Sequence[str]) -> bool:
    """`mkpasswd [-m METHOD] [-S SALT] [-R ROUNDS] PASSWORD`: the password to hash."""
    valued = ("-m", "--method", "-S", "--salt", "-R", "--rounds", "-P")
    operands = [w for k, w in enumerate(args[1:], 1) if not w.startswith("-") and args[k - 1] not in valued]
    return "-s" not in args and "--stdin" not in args and bool(operands) and literal(operands[0]) is not None


def _rclone(args: Sequence[str]) -> bool:
    """`rclone obscure PASSWORD`, `rclone config create|update NAME TYPE ... pass|password VALUE`."""
    return _positional(args, ("obscure",), 0) or (
        "config" in args and _positional_after(args, ("pass", "password", "pass2"))
    )


def _cf(args: Sequence[str]) -> bool:
    """Cloud Foundry: `cf auth USER PASSWORD`, `cf login -p PASSWORD`."""
    return _positional(args, ("auth",), 1) or ("login" in args and _dash_p(args))


def _sqlplus(args: Sequence[str]) -> bool:
    return any(
        (m := re.fullmatch(r"[A-Za-z_][\w$#]*/([^@\s/]+)(?:@\S+)?", unquote(a)))
        and not m.group(1).startswith("$")
        for a in args[1:]
    )


def _lftp(args: Sequence[str]) -> bool:
    """`lftp -u user,pass`, and in its own script (`-e 'open -u user,pass host; ...'`, `user U P`)."""
    if _pair_secret(_option_value(args, ("-u",), attached=False), ","):
        return True
    for script in _option_value(args, ("-e", "-c"), attached=False):
        found = _LFTP_LOGIN.search(unquote(script))
        if found and not found.group(1).startswith("$"):
            return True
    return False


_LFTP_LOGIN = re.compile(r"(?:-u\s+[^,\s]+,|\buser\s+\S+\s+)([^\s;]+)")


def _vault(args: Sequence[str]) -> bool:
    if "login" not in args:
        return False
    for arg in args[args.index("login") + 1 :]:
        value = unquote(arg)
        if value.startswith("-"):
            continue
        name, eq, rest = value.partition("=")
        if not eq and literal(arg):
            return True  # `vault login TOKEN`
        if eq and name == "token" and literal(rest):
            return True
    return False


def _from_literal(args: Sequence[str]) -> bool:
    """`kubectl create secret ... --from-literal=NAME=VALUE`: a literal value of a secret-ish
    name, or one that looks random."""
    for raw in _option_value(args, ("--from-literal",), attached=False):
        name, eq, value_raw = unquote(raw).partition("=")
        value = literal(value_raw) if eq else None
        if value and (name_kind(name) == "password" or (name_kind(name) and looks_random(value))):
            return True
        if value and "secret" in args and name_kind(name) is not None:
            return True
    return False


def _helm(args: Sequence[str]) -> bool:
    if _registry_login(args):
        return True
    for raw in _option_value(args, ("--set", "--set-string", "--set-literal"), attached=False):
        for pair in unquote(raw).split(","):
            key, eq, value = pair.partition("=")
            if not eq or is_reference(value) or value.startswith("${"):
                continue
            kind = name_kind(key.rsplit(".", 1)[-1])
            if kind == "password" or (kind == "token" and looks_random(value)):
                return True
    return False


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
            key = unquote(rest[0])
            if key.startswith("http-basic.") and len(rest) >= 3 and written_value(rest[2]):
                return True  # poetry's `http-basic.REPO USER PASSWORD`
            name = re.split(r"[.:/]", key.rstrip("=").rstrip("/"))[-1] or key
            kind = name_kind(name) or ("password" if name.lower() in ("_auth", "_password") else None)
            if name.lower() in ("_authtoken", "_auth", "npmauthtoken"):
                kind = "password"  # npm's and yarn's registry token: a secret whatever it looks like
            value = written_value(rest[1])
            if kind is not None and value and (kind == "password" or _token_set(key, value)):
                return True
    return False


def _token_set(key: str, value: str) -> bool:
    """A value set under a token or key name that may be the token: not where it lives (a path, a
    variable), not a key's public name (`user.signingkey 3AA5C34371567BD2`, an ssh key's file)
    nor a public key (git's `key::ssh-ed25519 AAAA...`)."""
    if len(value) < 8 or is_reference(value) or public_key(value):
        return False
    return not (key_id(value) and chooses_a_key(key))


def _snmp(args: Sequence[str]) -> bool:
    """SNMPv3's `-A` (authentication) and `-X` (privacy) passphrases; v1/v2c's `-c` community,
    unless it is a default every device ships with (`public`, `private`) or a file (`-c dict.txt`)."""
    if _any_literal(_option_value(args, ("-A", "-X"), attached=False)):
        return True
    communities = (literal(v) for v in _option_value(args, ("-c",), attached=False))
    return any(
        c and c not in ("public", "private") and not re.fullmatch(r"[\w.-]+\.[a-z]{1,4}", c)
        for c in communities
    )


def _odbc_shell(args: Sequence[str]) -> bool:
    """unixODBC's `isql DSN USER PASSWORD [options]` (Sybase's isql takes `-U`/`-P`: `_upper_p`)."""
    if _upper_p(args):
        return True
    if any(a.startswith(("-U", "-P", "-S")) for a in args):
        return False
    operands = [a for a in args[1:] if not a.startswith("-")]
    return len(operands) >= 3 and literal(operands[2]) is not None


def _db2(args: Sequence[str]) -> bool:
    """`db2 connect to DB user NAME using PASSWORD` (also as one quoted statement)."""
    lowered = [a.lower() for a in args]
    if "connect" in lowered and "using" in lowered[:-1]:
        return literal(args[lowered.index("using") + 1]) is not None
    for raw in args[1:]:  # the statement as one quoted word: `db2 "connect to d user u using x"`
        words = unquote(raw).split()
        statement = [w.lower() for w in words]
        if raw[:1] in "'\"" and "connect" in statement and "using" in statement[:-1]:
            value = words[statement.index("using") + 1].rstrip(";")
            return bool(value) and (raw[0] == "'" or not value.startswith(("$", "`")))
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
_UPPER_P = _names("zip unzip zipcloak sqlcmd bcp osql mosquitto_pub mosquitto_sub mosquitto_rr")
_IMPACKET_TOOLS = (
    "psexec wmiexec smbexec secretsdump mssqlclient GetUserSPNs GetNPUsers smbclient atexec dcomexec"
)
_IMPACKET = [f"impacket-{t}" for t in _IMPACKET_TOOLS.split()] + [f"{t}.py" for t in _IMPACKET_TOOLS.split()]
_SNMP = _names(
    "snmpget snmpgetnext snmpbulkget snmpwalk snmpbulkwalk snmpset snmptrap snmpinform snmptable snmpdelta "
    "snmpstatus snmpdf snmpnetstat snmpusm snmpvacm snmptest snmptranslate net-snmp-create-v3-user"
)
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
    "ssh-keygen": ("ssh-keygen-passphrase", _ssh_keygen),
    "atuin": ("password-option", _atuin),
    "redis-cli": ("password-option", _redis),
    **{t: ("password-option", _impacket) for t in _IMPACKET},
    **{t: ("password-option", _freerdp) for t in ("xfreerdp", "wlfreerdp", "xfreerdp3", "sdl-freerdp")},
    "az": ("azure-password", _az),
    "rabbitmqctl": ("password-option", _rabbitmqctl),
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
    "vault": ("vault-token", _vault),
    **{t: ("snmp-secret", _snmp) for t in _SNMP},
    **{t: ("kubectl-literal", _from_literal) for t in ("kubectl", "oc", "microk8s.kubectl")},
    **{t: ("password-option", _odbc_shell) for t in ("isql", "iusql")},
    "db2": ("password-option", _db2),
    **ARCHIVE_RULES,
    **NETWORK_RULES,
}
_TOOL_NAMES = frozenset(TOOL_RULES)
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.+-]+")  # words as tool names are spelled (`mount.cifs`, `7z`)


def tool_rule(line: Line) -> str | None:
    if _TOOL_NAMES.isdisjoint(_NAME_CHARS.findall(line.text)):
        return None
    words = line.words
    seen: set[str] = set()  # tools already judged in this segment (each on the rest of it)
    end = 0
    for i, word in enumerate(words):
        if word in SEPARATORS:
            seen.clear()
            continue
        base = word.lstrip("$(<`").rsplit("/", 1)[-1]  # `$(openssl passwd x)` runs openssl too
        entry = TOOL_RULES.get(base)
        if entry is None or base in seen:
            continue
        seen.add(base)
        end = max(end, i + 1)
        while end < len(words) and words[end] not in SEPARATORS:
            end += 1
        rule, check = entry
        if check([base, *words[i + 1 : end]]):
            return rule
    return None


def config_rule(line: Line) -> str | None:
    """A tool's own setting of a secret (`_config_set`); git and npm are everywhere, so the tool
    words are looked at only in commands that say `config`/`configure`."""
    if "config" not in line.text:
        return None
    words = line.words
    judged = -1  # words up to here were judged with the tool before them (each segment once)
    for i, word in enumerate(words):
        if i > judged and word.rsplit("/", 1)[-1] in _CONFIG_TOOLS:
            end = i + 1
            while end < len(words) and words[end] not in SEPARATORS:
                end += 1
            if _config_set(words[i:end]):
                return "config-set-secret"
            judged = end
    return None
