"""The credential detector: a command that holds a secret is never stored, logged, trained on
or suggested (docs/secrets.md says what it looks for and why).

`find_secret(cmd)` names the first rule that says `cmd` holds a credential, or returns None;
`forget_command(cmd)` says whether it runs `calm forget`. The rules are grouped by what they
look for:

    shellwords.py   the command line as the shell reads it (words, quotes, here-documents)
    values.py       literals and references; how random a value looks
    names.py        names that mean secret (options, variables, keywords, config keys)
    named.py        values given to such names, inside quoted arguments too
    positions.py    values in credential positions told by what surrounds them
    subcommands.py  values after verbs (`set-password X`, `token create X`, `auth login TOKEN`)
    tools.py        tools' own places for a secret that no generic rule can tell
    archives.py     archivers' and encryption tools' passwords (`rar -hpX`, `qpdf --encrypt U O`)
    network.py      Wi-Fi and network tools' passphrases (`networksetup`, `nmcli`, `iwconfig key`)
    cookies.py      session cookies given to HTTP tools (`-b`, `--cookie`, a `Cookie:` header)
    urls.py         userinfo, `user:pass@host` without a scheme, query, path and services' tokens
    written.py      credential files written by echo/printf/tee
    keys.py         private key material, a PEM block base64-encoded again too
    hashes.py       password hashes in crypt(3)'s formats and their kin
    stdin.py        a literal fed to a command that reads a secret on standard input
    code.py         inline code (`python -c`, SQL) and passwords hashed inline
    formats.py      tokens services issue, by format or prefix
    randomness.py   random-looking tokens anywhere, and the ids that look random but are not
    calm.py         calm's own: the sync key phrase, `calm sync key --import`, `calm forget`
    detector.py     the order of the rules, and the commands nested in a line

Bump DETECTOR_VERSION whenever a rule flags more: stores scanned by an older version are
re-scanned when opened (calmd/history/store.py).
"""

from calmd.secrets.calm import KEY_PHRASE, forget_command
from calmd.secrets.detector import DETECTOR_VERSION, find_secret
from calmd.secrets.names import name_kind
from calmd.secrets.values import is_placeholder, is_reference, literal, looks_random, shannon_entropy

__all__ = [
    "DETECTOR_VERSION",
    "KEY_PHRASE",
    "find_secret",
    "forget_command",
    "is_placeholder",
    "is_reference",
    "literal",
    "looks_random",
    "name_kind",
    "shannon_entropy",
]
