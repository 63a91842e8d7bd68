"""The detector: every rule, cheapest first, on the line and on the commands nested in it.

Each rule is tried only when a word it needs is in the line (most commands hold none), and a
rule that needs the line's words shares them with the others (shellwords.Line). A command run
inside `$(...)`, backquotes or `<(...)`, or given whole as a quoted argument (`ssh host '...'`,
`bash -c "..."`, `lftp -e '...'`), is judged as a command line of its own, two levels deep: a
password hashed inline (`-p "$(openssl passwd -6 'x')"`) is the hashing tool's argument.
"""

from __future__ import annotations

import re

from calmd.secrets.calm import calm_secret_rule
from calmd.secrets.code import hashed_literal_rule, inline_code_rule
from calmd.secrets.cookies import COOKIE_HINT, cookie_rule
from calmd.secrets.formats import prefix_rule, token_rule
from calmd.secrets.hashes import password_hash_rule
from calmd.secrets.keys import encoded_key_rule, key_material_rule
from calmd.secrets.named import HINT, named_value_rule
from calmd.secrets.positions import positions_rule
from calmd.secrets.randomness import basic_auth_rule, random_string_rule
from calmd.secrets.shellwords import Line, substitutions, unquote
from calmd.secrets.stdin import fed_rule
from calmd.secrets.tools import config_rule, tool_rule
from calmd.secrets.urls import url_rule
from calmd.secrets.written import credential_file_rule

DETECTOR_VERSION = 7
# 7: forms nobody listed, as classes (issue 39's fifth round): session cookies, password hashes,
#    private keys base64-encoded again, config text with `\n` escapes, structured-data edits,
#    bracketed values, secret-named subcommands, connection strings, archivers' and Wi-Fi tools'
#    passwords, notification services' URLs, `*_KEY` names of any qualifier, readable prefixes
# 6: random base64 that starts like DER (`M[A-P]`) and is no public key's or certificate's DER
#    (values.public_key: told by its structure); key ids and public keys left alone (issue 39)
# 5: credential positions without tool names, pairs without a scheme, URL query and path tokens,
#    quoted config values, nested commands, random base64, calm's own sync key (issue 39)
# 4: fed to stdin, admin positionals, key material, inline code, quoting (issue 30)
# 3: credential files, `config set`, token prefixes at any length, forget (issue 23)

_CREDENTIAL_HINT = re.compile(
    r"netrc|\.aws/|\.boto|s3cfg|pgpass|git-credentials|npmrc|yarnrc|pypirc|config\.json|my\.cnf|mylogin"
)
_QUOTED_SPACE = re.compile(r"['\"][^'\"]*\s")
NESTING = 2  # levels of commands inside commands that are judged
# A quoted argument is judged as a command line when a program runs it (`ssh host '...'`, `bash -c
# "..."`, `alias x='...'`) or it reads as one (an option, a pipe, a list): not a commit's message.
_RUNNERS = frozenset({"ssh", "sh", "bash", "zsh", "dash", "fish", "ksh", "su", "sudo", "doas", "watch",
                      "expect", "tmux", "screen", "eval", "alias", "nohup", "runuser", "xargs", "parallel",
                      "script", "flock", "mosh", "lftp", "exec"})  # fmt: skip
_COMMAND_OPTIONS = frozenset({"-c", "-e", "-x", "--command", "--eval", "--exec", "exec", "-exec", "--"})
_COMMANDISH = re.compile(r"\s-\w|[|;]|&&")


def find_secret(cmd: str) -> str | None:
    """The name of the first rule that says `cmd` holds a credential, or None. Costs a few
    microseconds for an ordinary command (bench/secrets_scan.py)."""
    return _judge(cmd, 0)


def _judge(cmd: str, depth: int) -> str | None:
    if len(cmd) < 6:
        return None
    line = Line(cmd)
    lowered = line.lower
    hinted = HINT.search(lowered) is not None
    rule = calm_secret_rule(cmd) if ("calm" in lowered or cmd.count("-") >= 13) else None
    rule = rule or token_rule(cmd)
    if rule is None and hinted:
        rule = named_value_rule(line)
    if rule is None and ("://" in cmd or "@" in cmd or ("=" in cmd and ("?" in cmd or "&" in cmd))):
        rule = url_rule(cmd)
    if rule is None and _CREDENTIAL_HINT.search(lowered):
        rule = credential_file_rule(cmd)
    rule = (
        rule or key_material_rule(cmd) or encoded_key_rule(cmd) or password_hash_rule(cmd)
        or inline_code_rule(cmd, lowered) or prefix_rule(cmd) or basic_auth_rule(cmd)
        or random_string_rule(cmd) or _structure_rule(line, hinted)
    )  # fmt: skip
    if rule is None and _nests(cmd):
        rule = _nested_rule(line, 1)
    return rule


def _structure_rule(line: Line, hinted: bool) -> str | None:
    """The rules that read a line's words and commands: on a whole line and on every command
    nested in it (the rules that read the text itself have read the nested ones already)."""
    rule = tool_rule(line) or config_rule(line) or fed_rule(line.text) or positions_rule(line, hinted)
    if rule is None and COOKIE_HINT.search(line.text):
        rule = cookie_rule(line)
    return rule


def _nests(cmd: str) -> bool:
    """Whether a line may nest a command: a substitution, or a quoted argument with a space."""
    return (
        "$(" in cmd
        or "`" in cmd
        or "<(" in cmd
        or (("'" in cmd or '"' in cmd) and " " in cmd and _QUOTED_SPACE.search(cmd) is not None)
    )


def _nested_rule(line: Line, depth: int) -> str | None:
    """The commands inside substitutions and quoted arguments, each judged as a line."""
    for inner in substitutions(line.text):
        rule = hashed_literal_rule(inner) or _nested(inner, depth)
        if rule:
            return rule
    words = line.words
    runner = bool(words) and words[0].rsplit("/", 1)[-1] in _RUNNERS
    for k, word in enumerate(words):
        if word[:1] in "'\"" or word[:2] == "$'":
            inner = unquote(word)
            if inner == word or " " not in inner.strip() or inner.startswith(("$(", "`")):
                continue  # (a substitution: judged above)
            if runner or (k and words[k - 1] in _COMMAND_OPTIONS) or _COMMANDISH.search(inner):
                rule = _nested(inner, depth)
                if rule:
                    return rule
    return None


def _nested(cmd: str, depth: int) -> str | None:
    line = Line(cmd)
    rule = _structure_rule(line, HINT.search(line.lower) is not None)
    if rule is None and depth < NESTING and _nests(cmd):
        rule = _nested_rule(line, depth + 1)
    return rule
