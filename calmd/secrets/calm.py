"""calm's own secrets: the sync key's phrase, what `calm sync key --import` is given, and
`calm forget PATTERN` (its argument is what the user wants gone).

The phrase is recognised by its shape, not by calling the sync code: `calm-` and 56 base32
letters (a-z, 2-7) in groups of four, as `calm sync key --show` prints it and `--import` takes
it (case, spaces and dashes do not matter to the importer, so they do not matter here either).
tests/secrets/test_calm.py checks that keys made by the sync module's own generator match.
"""

from __future__ import annotations

import re

# `calm-` and 56 letters in groups of four (or run together), in any case, a dash or a space
# between groups; or the 14 dashed groups without the `calm-` (the importer takes that too).
KEY_PHRASE = re.compile(
    r"(?i)(?<![a-z0-9])calm[\s-]?(?:[a-z2-7]{4}[\s-]?){13}[a-z2-7]{4}(?![a-z0-9])"
    r"|(?<![a-z0-9-])(?:[a-z2-7]{4}-){13}[a-z2-7]{4}(?![a-z0-9-])"
)

# `calm PATTERN` in any form: after a wrapper (sudo, env, command, ssh host ...), an assignment
# (`CALM_HOME=x calm forget`), a path or quotes (`/usr/bin/calm`, `\calm`, `"calm"`), a
# substitution (`$(calm forget x)`), options before the verb (`calm --no-color forget`).
_CALM = r"""(?:^|[\s;&|(`'"/\\=])calm['"]?(?:\s|\\\n)+(?:-\S*(?:\s|\\\n)+)*"""
_FORGET = re.compile(_CALM + r"""['"]?forget(?:['"]|\s|\\|$)""")
_SYNC_KEY = re.compile(_CALM + r"""['"]?sync['"]?(?:\s|\\\n)+(?:-\S*(?:\s|\\\n)+)*['"]?key(?:['"]|\s|\\|$)""")
_END = re.compile(r"[;&|)`\n]")
_IMPORT = re.compile(r"""(?:^|\s)['"]?(?:--i[a-z]*|-[a-z]*i)(?:[=\s'"]|$)""")


def forget_command(cmd: str) -> bool:
    """Whether `cmd` runs `calm forget`: never stored (its argument is what the user wants gone)."""
    return "forget" in cmd and _FORGET.search(cmd) is not None


def calm_secret_rule(cmd: str) -> str | None:
    """A sync key phrase anywhere in the line (`echo calm-... > key.txt`, a bare paste), or
    `calm sync key --import ...` whatever it is given (a phrase, a file, `-`)."""
    if KEY_PHRASE.search(cmd):
        return "calm-sync-key"
    if "key" in cmd and "sync" in cmd:
        searched = 0  # each command's words are searched once (linear on a line of many)
        for found in _SYNC_KEY.finditer(cmd):
            if found.end() <= searched:
                continue
            end = _END.search(cmd, found.end())
            searched = end.start() if end else len(cmd)
            if _IMPORT.search(cmd, found.end() - 1, searched):
                return "calm-sync-key"
    return None
