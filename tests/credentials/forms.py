"""What the credential tests share: the corpus files, and random values for the forms each
family's tests probe (200 random secrets per form, the way an outside probe does)."""

from __future__ import annotations

import base64
import hashlib
import random
import string
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import quote

from calmd.secrets import find_secret

DATA = Path(__file__).resolve().parent.parent / "data" / "secrets"
RNG_SEED = 39
ROUNDS = 200
# What password generators draw from (a quote is left out: it would end the shell word).
PASSWORD_CHARS = string.ascii_letters + string.digits + "!#$%&()*+,-./:;<=>?@[]^_{|}~"
# What a code literal may hold inside shell and code quotes both; what double quotes keep literal.
CODE_CHARS = string.ascii_letters + string.digits + "!#%&()*+,-./:;<=>?@[]^_{|}~"
DQ_CHARS = string.ascii_letters + string.digits + "!#%&()*+,-./:;<=>?@[]^_{|}~'"
# What may stand where a URL's userinfo ends at `@` or a tag's `<`: no `@/:<>` and no quote.
PAIR_CHARS = string.ascii_letters + string.digits + "!#%*+-._~"
ANSI_ESCAPES = {"!": "\\x21", "'": "\\'", "\\": "\\\\", "$": "\\x24", "\n": "\\n"}
BASE36 = string.ascii_lowercase + string.digits
BASE62 = string.ascii_letters + string.digits


def load(name: str) -> list[tuple[str, str]]:
    """CLASS<TAB>COMMAND rows of tests/data/secrets/NAME (# comments)."""
    rows = []
    for line in (DATA / name).read_text().splitlines():
        if line and not line.startswith("#"):
            kind, _, cmd = line.partition("\t")
            rows.append((kind, cmd))
    return rows


def random_word(rng: random.Random, alphabet: str, low: int, high: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def random_password(rng: random.Random, alphabet: str = PASSWORD_CHARS) -> str:
    secret = random_word(rng, alphabet, 6, 32)
    return secret if secret.strip() else secret + "x"


def generated(rng: random.Random, alphabet: str, length: int) -> str:
    """A generated key: `length` characters of `alphabet` with a digit and a letter among them."""
    while True:
        word = random_word(rng, alphabet, length, length)
        if any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
            return word


def values(rng: random.Random) -> dict[str, str]:
    """One random value of each kind a form may ask for."""
    user = random_word(rng, string.ascii_lowercase, 3, 8)
    secret = random_password(rng)
    pair_secret = random_password(rng, PAIR_CHARS)
    drawn = {
        "host": random_word(rng, string.ascii_lowercase, 3, 10) + ".example.org",
        "user": user,
        "secret": secret,
        "pair_secret": pair_secret,
        "url_secret": quote(secret, safe=""),
        "code_secret": random_password(rng, CODE_CHARS),
        "dq_secret": random_password(rng, DQ_CHARS),
        "ansi_secret": "".join(ANSI_ESCAPES.get(c, c) for c in random_password(rng, PASSWORD_CHARS + "'\\")),
        "hex32": generated(rng, "0123456789abcdef", 32),
        "hex40": generated(rng, "0123456789abcdef", 40),
        "hex64": generated(rng, "0123456789abcdef", 64),
        "b36": generated(rng, BASE36, rng.randint(24, 40)),
        "b62": generated(rng, BASE62, rng.randint(20, 40)),
        "b64key": base64.b64encode(rng.randbytes(32)).decode(),
        "b64pair": base64.b64encode(f"{user}:{pair_secret}".encode()).decode(),
        "jwtish": "eyJ"
        + base64.urlsafe_b64encode(f'{{"a":"{rng.randbytes(12).hex()}","t":"{user}"}}'.encode())
        .decode()
        .rstrip("=")[3:],
    }
    return {**drawn, **keys(user, drawn), **derived(drawn)}


def keys(user: str, drawn: dict[str, str]) -> dict[str, str]:
    """An OpenPGP key's id and fingerprint, the public and secret keys of minisign's and Nix's
    formats (docs/secrets.md), made of values drawn already (a new draw would change every form's
    values)."""
    key, hex40, hex64 = base64.b64decode(drawn["b64key"]), drawn["hex40"], drawn["hex64"]
    return {
        "keyid": hex64[:16].upper(),
        "fingerprint": hex40.upper(),
        "edpub": base64.b64encode(b"Ed" + bytes.fromhex(hex64[:16]) + key).decode(),
        "edsec": base64.b64encode(b"EdScB2" + bytes.fromhex(hex64 + hex40) + key * 3).decode(),
        "nixpub": f"{user}.example.org-1:" + base64.b64encode(key).decode(),
        "nixsec": f"{user}.example.org-1:" + base64.b64encode(bytes.fromhex(hex64) + key).decode(),
    }


def _crypt64(raw: bytes) -> str:
    """crypt(3)'s alphabet (`./0-9A-Za-z`) as base64 with `.` for `+`, unpadded."""
    return base64.b64encode(raw).decode().rstrip("=").replace("+", ".")


_PEM_TYPES = (
    "OPENSSH PRIVATE KEY",
    "RSA PRIVATE KEY",
    "PRIVATE KEY",
    "EC PRIVATE KEY",
    "ENCRYPTED PRIVATE KEY",
)


def _pem(kind: str, body: bytes) -> str:
    lines = base64.b64encode(body).decode()
    wrapped = "\n".join(lines[k : k + 64] for k in range(0, len(lines), 64))
    return f"-----BEGIN {kind}-----\n{wrapped}\n-----END {kind}-----\n"


def derived(drawn: dict[str, str]) -> dict[str, str]:
    """Values made from those drawn already, by hashing them (a new draw would change every
    form's values): password hashes in crypt(3)'s formats, a PEM private key base64-encoded
    (whole, cut in two at a varying place, wrapped with `\\n` escapes, after a newline), a
    certificate's and a public key's PEM encoded the same way, UUIDs, session ids, webhook ids."""
    seed = hashlib.sha512(drawn["b64key"].encode()).digest()
    more = hashlib.sha512(seed).digest()
    hex32 = drawn["hex32"]
    key = _pem(_PEM_TYPES[seed[0] % len(_PEM_TYPES)], seed + more + seed[::-1])
    pem_b64 = base64.b64encode(key.encode()).decode()
    cut = 10 + seed[1] % 40
    salt = _crypt64(seed[:6])
    b64 = base64.b64encode
    return {
        "md5crypt": f"$1${salt}${_crypt64(more)[:22]}",
        "apr1": f"$apr1${salt}${_crypt64(more[1:])[:22]}",
        "sha256crypt": f"$5$rounds=5000${salt}${_crypt64(more)[:43]}",
        "sha512crypt": f"$6${salt}${_crypt64(seed + more)[:86]}",
        "bcrypt": f"$2b$12${_crypt64(seed)[:22]}{_crypt64(more)[:31]}",
        "yescrypt": f"$y$j9T${_crypt64(seed[:16])[:22]}${_crypt64(more)[:43]}",
        "argon2": "$argon2id$v=19$m=65536,t=3,p=4$"
        + b64(seed[:16]).decode().rstrip("=")
        + "$"
        + b64(more[:32]).decode().rstrip("="),
        "ldap_ssha": "{SSHA}" + b64(seed[:24]).decode(),
        "django_hash": f"pbkdf2_sha256$600000${_crypt64(seed[:9])}${b64(more[:32]).decode()}",
        "pem_b64": pem_b64,
        "pem_head": pem_b64[:cut],
        "pem_tail": pem_b64[cut:],
        "pem_lines": "\\n".join(pem_b64[k : k + 76] for k in range(0, len(pem_b64), 76)),
        "pem_nl_b64": b64(("\n" + key).encode()).decode(),
        "cert_b64": b64(_pem("CERTIFICATE", seed + more).encode()).decode(),
        "pub_b64": b64(_pem("PUBLIC KEY", more + seed).encode()).decode(),
        "uuid": f"{hex32[:8]}-{hex32[8:12]}-4{hex32[13:16]}-a{hex32[17:20]}-{hex32[20:]}",
        "HEX32": hex32.upper(),
        "bootstrap": f"{drawn['b36'][:6]}.{drawn['b36'][6:22]}",
        "digits": str(int(hex32[:15], 16))[:18],
        "b64url": base64.urlsafe_b64encode(seed + more).decode()[:68],
        "b36u": drawn["b36"][:8].upper(),
        "extension_id": "".join(chr(ord("a") + b % 16) for b in seed[:32]),
    }


def missed(forms: Iterable[str], rounds: int = ROUNDS, seed: int = RNG_SEED,
           detect: Callable[[str], str | None] = find_secret) -> list[str]:  # fmt: skip
    """The commands of `forms` (filled with random values, `rounds` times) the detector lets
    through."""
    rng = random.Random(seed)
    through = []
    for form in forms:
        for _ in range(rounds):
            cmd = form.format(**values(rng))
            if detect(cmd) is None:
                through.append(cmd)
    return through


def flagged(forms: Iterable[str], rounds: int = 20, seed: int = RNG_SEED) -> list[tuple[str, str]]:
    """The commands of `forms` (filled with random values) the detector flags, with its rule."""
    rng = random.Random(seed)
    dropped = []
    for form in forms:
        for _ in range(rounds):
            cmd = form.format(**values(rng))
            rule = find_secret(cmd)
            if rule is not None:
                dropped.append((cmd, rule))
    return dropped
