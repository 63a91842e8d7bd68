"""Private key material in a line, however it is written: a PEM header with key-like base64
after it, base64 that decodes to the start of a private key (its DER, `openssh-key-v1`), PuTTY's
`Private-Lines:`, and a whole PEM block base64-encoded again (`LS0tLS1CRUdJTi...`, as keys are
passed through environment variables, CI secrets and pipes to `base64 -d`), its header found
however the encoded text is cut into pieces.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re

from calmd.secrets.values import decodes_to_text, mixes

# A private key printed piece by piece (`printf '%s\n' '-----BEGIN ... PRIVATE KEY-----' 'MIIE...'`,
# `echo 'b3BlbnNzaC1rZXktdjE...' >> id_ed25519`): the header with key-like base64 anywhere after
# it, or a base64 run that decodes to the start of a private key (a DER structure opening with a
# version number, as PKCS#1, PKCS#8 and SEC1 keys do, not certificates or public keys; OpenSSH's
# `openssh-key-v1`), or PuTTY's `Private-Lines:`.
_PEM_HEADER = re.compile(
    r"-----BEGIN[A-Z0-9 ]{0,30} PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File|Private-Lines:"
)
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/=_.-])[A-Za-z0-9+/]{16,}={0,2}")
_KEY_START = re.compile(
    r"(?<![A-Za-z0-9+/=_.-])(?:M[A-P][A-Za-z0-9+/]{14,}|b3BlbnNzaC1rZXktdjE[A-Za-z0-9+/]*)"
)


def _decodes_to_private_key(word: str) -> bool:
    head = word[: len(word) // 4 * 4][:24]
    try:
        raw = base64.b64decode(head, validate=True)
    except (binascii.Error, ValueError):
        return False
    if raw.startswith(b"openssh-key-v1"):
        return True
    if len(raw) < 8 or raw[0] != 0x30:
        return False
    at = {0x81: 3, 0x82: 4, 0x83: 5}.get(raw[1], 2 if raw[1] < 0x80 else 0)
    # version 0 or 1, then the key's first part: an INTEGER (RSA, DSA), an AlgorithmIdentifier
    # (PKCS#8) or an OCTET STRING (SEC1 EC keys)
    return at > 0 and raw[at : at + 3] in (b"\x02\x01\x00", b"\x02\x01\x01") and raw[at + 3 : at + 4] in (
        b"\x02", b"\x30", b"\x04",
    )  # fmt: skip


def key_material_rule(cmd: str) -> str | None:
    if "M" in cmd or "b3Blbn" in cmd:
        for found in _KEY_START.finditer(cmd):
            if _decodes_to_private_key(found.group(0)):
                return "private-key-material"
    if "PRIVATE KEY" in cmd or "PuTTY" in cmd or "Private-Lines" in cmd:
        header = _PEM_HEADER.search(cmd)
        if header:
            for found in itertools.islice(_BASE64_RUN.finditer(cmd, header.end()), 64):
                word = found.group(0).rstrip("=")
                has_all, change = mixes(word)
                if has_all and change >= 0.4 and not decodes_to_text(found.group(0)):
                    return "private-key-material"
    return None


# --------------------------------------------------------------------------- a PEM block in base64

# base64 of any text holding `-----` holds `LS0t` (the encoding of `---`): five dashes cover an
# aligned group of three at every offset. The runs around it are decoded, with the pieces after
# it joined (`"LS0tLS1CRUdJTiBPUEVO" "U1NIIFBSSVZB..."`, words of an `echo`, lines cut by `\n`),
# at each of the four offsets a piece cut anywhere may start at.
_DASHES = "LS0t"
_RUN = re.compile(r"[A-Za-z0-9+/]{4,}")


def _named(text: str, found: re.Match[str]) -> bool:
    """A variable's name before its value (`KEYPART1=`), not base64 before its padding: one case."""
    word = found.group(0)
    return text[found.end() : found.end() + 1] == "=" and (word.isupper() or word.islower())


_ENCODED_HEAD = 320  # characters decoded from each candidate: a header is in its first ~60
_BEGIN = re.compile(rb"-----BEGIN ([A-Z0-9 ]{0,40})")
_PRIVATE_TYPES = ("RSA PRIVATE KEY", "EC PRIVATE KEY", "DSA PRIVATE KEY", "OPENSSH PRIVATE KEY",
                  "PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "PGP PRIVATE KEY BLOCK",
                  "ANY PRIVATE KEY")  # fmt: skip
_PUBLIC_TYPES = ("RSA PUBLIC KEY", "PUBLIC KEY", "CERTIFICATE", "CERTIFICATE REQUEST",
                 "NEW CERTIFICATE REQUEST", "PGP PUBLIC KEY BLOCK", "PGP SIGNATURE", "PGP MESSAGE",
                 "PGP SIGNED MESSAGE", "X509 CRL",
                 "EC PARAMETERS", "DH PARAMETERS", "TRUSTED CERTIFICATE", "PKCS7", "CMS",
                 "SSH2 PUBLIC KEY")  # fmt: skip


def _private_header(decoded: bytes) -> bool:
    """A decoded text holding a private key's PEM header, whole or cut by the end of the piece
    (`-----BEGIN OPENSSH PRIV`: a prefix of a private key's type and of no public one's)."""
    for found in _BEGIN.finditer(decoded):
        kind = found.group(1).decode("ascii")
        if "PRIVATE" in kind:
            return True
        if found.end() == len(decoded) and len(kind) >= 2:  # cut where the piece ends
            stem = kind.rstrip()
            if any(t.startswith(stem) for t in _PRIVATE_TYPES) and not any(
                t.startswith(stem) for t in _PUBLIC_TYPES
            ):
                return True
    return False


def _decoded(text: str) -> list[bytes]:
    """`text` decoded from each of the four offsets a piece of base64 may start at."""
    out = []
    for offset in range(4):
        chunk = text[offset : offset + _ENCODED_HEAD]
        chunk = chunk[: len(chunk) // 4 * 4]
        if len(chunk) >= 8:
            try:
                out.append(base64.b64decode(chunk, validate=True))
            except (binascii.Error, ValueError):
                continue
    return out


def encoded_key_rule(cmd: str) -> str | None:
    """A private key's PEM block base64-encoded (`echo LS0tLS1CRUdJTiBPUEVOU1NIIFBSSVZBVEUg... |
    base64 -d > id_ed25519`, `export KEY_B64=...`), found by its header."""
    if _DASHES not in cmd:
        return None
    text = cmd.replace("\\n", "  ")  # `\n` escapes end pieces
    # pieces of 8+ characters (`echo` and a variable's name are no piece of a key)
    runs = [
        found
        for found in itertools.islice(_RUN.finditer(text), 4096)
        if len(found.group(0)) >= 8 and not _named(text, found)
    ]
    for k, run in enumerate(runs):
        if _DASHES not in run.group(0):
            continue
        # this piece, and this piece with the ones after it (a key cut into words or lines)
        joined = "".join(r.group(0) for r in runs[k : k + 16])[: _ENCODED_HEAD + 4]
        for candidate in (run.group(0), joined):
            if any(_private_header(decoded) for decoded in _decoded(candidate)):
                return "private-key-material"
    return None
