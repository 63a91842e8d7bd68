"""Archive and encryption tools' passwords: attached to a short flag, as archivers take them
(`7z -pX`, `rar -pX` and `-hpX`, which also hides the names, `arj -gX`), or after a flag whose
name says nothing of a password in general but does to its tool (`ccrypt -K X`, `mcrypt -k X`,
`zpaq -key X`, `aescrypt -p X`, `veracrypt -p X`, `steghide -p X`), and `qpdf --encrypt USER
OWNER BITS`'s two passwords. `-p-` (rar: ask for none) and a flag alone (it prompts) are no
password; neither is a key file (`-kfile`, `--keyfiles`). `zip -P`, openssl's `-k` and
`pass:`, and names that say password (`--password=X`, `-passphrase X`) are tools.py's and
named.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from calmd.secrets.shellwords import as_option
from calmd.secrets.values import literal


def _attached(args: Sequence[str], *flags: str) -> bool:
    """A literal attached to one of `flags` (`-pX`, `-p'X'`, `-hpX`): the archivers' form."""
    for raw in args[1:]:
        word = as_option(raw)
        for flag in flags:
            if word.startswith(flag) and len(word) > len(flag) and literal(word[len(flag) :]):
                return True
    return False


def _after(args: Sequence[str], *flags: str) -> bool:
    """A literal after one of `flags` as the next word (`-K X`), or `=`-attached (`--key=X`)."""
    for k, raw in enumerate(args[1:], 1):
        word = as_option(raw)
        name, eq, value = word.partition("=")
        if name in flags and eq and literal(value):
            return True
        if word in flags and k + 1 < len(args) and not args[k + 1].startswith("-") and literal(args[k + 1]):
            return True
    return False


def _qpdf(args: Sequence[str]) -> bool:
    """`qpdf --encrypt USER OWNER BITS [options] --`: the user's password may be empty."""
    words = list(args[1:])
    if "--encrypt" not in words:
        return False
    rest = words[words.index("--encrypt") + 1 : words.index("--encrypt") + 3]
    return len(rest) == 2 and any(literal(w) for w in rest if not w.startswith("-"))


_CCRYPT = ("ccrypt", "ccencrypt", "ccdecrypt")
# tool name -> (rule, check of the tool's argument words, its name first)
ARCHIVE_RULES: dict[str, tuple[str, Callable[[Sequence[str]], bool]]] = {
    **{t: ("archive-password", lambda a: _attached(a, "-p")) for t in ("7z", "7za", "7zr", "7zz", "p7zip")},
    **{t: ("archive-password", lambda a: _attached(a, "-p", "-hp")) for t in ("rar", "unrar", "winrar")},
    "arj": ("archive-password", lambda a: _attached(a, "-g")),
    "qpdf": ("archive-password", _qpdf),
    **{t: ("archive-password", lambda a: _after(a, "-K", "--key")) for t in _CCRYPT},
    "mcrypt": ("archive-password", lambda a: _after(a, "-k", "--key")),
    "zpaq": ("archive-password", lambda a: _after(a, "-key")),
    "aescrypt": ("archive-password", lambda a: _after(a, "-p")),
    **{t: ("archive-password", lambda a: _after(a, "-p")) for t in ("veracrypt", "truecrypt", "steghide")},
    "outguess": ("archive-password", lambda a: _after(a, "-k", "-K")),
}
