"""The detector runs on every record and every imported line, on the daemon's event loop: no
rule may be quadratic on the record limit's worst shapes (64 KiB). The bound is a stall guard,
far above what they cost (bench/secrets_scan.py measures the cost), in the CPU time of the
thread: wall time failed it on a loaded machine (2.1 s for a shape that costs 0.1)."""

from __future__ import annotations

import time

import pytest

from calmd.secrets import find_secret

UNITS = [
    # issue 12's
    "a=", "-p ", "'a'", "x:y@", "2", "--password=", "AKIA", "eyJ.", "k" * 19 + " ", "mysql -p ",
    # issue 23's and 30's: credential files, config set, prefixes; pipes, process substitutions,
    # here-documents, quoting; key material, inline code, SQL
    "grep password ~/.netrc ", "printf 'password %s' x >> .netrc ", "aws configure set ", "ghp_a1",
    "npm config set _authToken ", "a", "echo x | ", "<(", "<<-A\n\tA\n", '"-p', "$'\\x", "( ",
    "-----BEGIN RSA PRIVATE KEY----- ab", "MIIE", "auth=('a', ", "user x password '", "PDO(a, b, ",
    # issue 39's: positions, pairs, URLs, nested commands, config lines, base64, the key phrase
    "-u a -p b ", "-K 0a1b2c3d ", "input_pw x ", "gh secret set x --body y ", "login ", "--user a:b ",
    "c.pem:x ", "a:b@c ", "https://h/hooks/", "?k=", "$(", "`", "\"a b\" ", "bash -c 'x ",
    "password: ", "<password>x", "QUJD", "a/B+c", "calm-", "abcd-", "calm sync key ", "printf '%s' ",
    "x\\n", "aB3", "Zz9/", "cat <<'E'\nA=1\n",
    # the fifth round's: cookies, hashes, keys encoded again, escaped config text, selectors, pairs,
    # nested assignments, subcommands, archivers, network tools, services' URLs, prefixes
    "-b a=b; ", "Cookie: s=", "$6$a$", "$1$$2$", "{SSHA}", "LS0t", "LS0tLS0t ", "printf 'password x\\n",
    ".a.b = \"", ".a[\"b\"] |= ", "{\"name\":\"PW\",\"value\":\"", "a=[password=", "--set=a=", "x=y=",
    "set-password ", "token set ", "key s:", "-hp", "isql a b ", "discord://a/", "x://", "mediaserver",
    "SYNC_KEY=", "using ", "PWD=a;",
]  # fmt: skip


@pytest.mark.parametrize("unit", UNITS)
def test_no_rule_is_quadratic_on_a_64_kib_command(unit: str) -> None:
    """The shape alone (every rule runs: no secret ends the search early; `auth=('a', ` cost 12 s
    before a hint's `.*` was taken out), and the shape before a URL's `://` (the URL rule once
    tried a scheme at every letter: 5 s)."""
    shape = unit * (65536 // len(unit))
    for cmd in (shape[:65536], shape[: 65536 - 40] + " https://me:pw@example.com >> ~/.netrc"):
        start = time.thread_time()  # the CPU this thread spent: a busy machine's waits do not count
        find_secret(cmd)
        assert time.thread_time() - start < 1.0
