"""Random-looking tokens anywhere in a command, judged by shape and entropy
(calmd/secrets/randomness.py), and the identifiers that look random and are not secret, told
apart by their context: commit hashes after git verbs, digests, UUIDs, checksums, container and
pod names, content ids, public keys, integrity strings, CamelCase names, base64 of text; an
OpenPGP key's id where a key is chosen, and public keys by their format (values.public_key)."""

from __future__ import annotations

import pytest

from tests.credentials.forms import flagged, missed

RANDOM_ANYWHERE = [
    "./bin/seed-admin --org acme {b62}x9Q",
    "deploy.sh prod {b62}Zq7",
    "echo '{b64key}' > /etc/{user}/aes.key",
    "curl -H 'X-Custom: {b62}Qx4' https://{host}/",
    "echo {b64pair} > ~/.config/{user}/basic.auth",
]


@pytest.mark.parametrize("form", RANDOM_ANYWHERE)
def test_200_random_tokens_anywhere_are_caught(form: str) -> None:
    through = missed([form])
    assert len(through) <= 2, through[:5]  # mixed-case base62 that reads as words: ~1% (docs/secrets.md)


IDS = [
    "git show --stat {hex40}",
    "git cherry-pick -m 1 {hex40}",
    "git revert {hex40} --no-edit",
    "git checkout -b hotfix {hex40}",
    "git log -p {hex32}..{hex32} -- src/",
    "git rebase -i {hex40}",
    "git diff-tree --no-commit-id -r {hex40}",
    "echo '{hex64}  node-v20.tar.xz' | sha256sum -c -",
    "echo {hex32} app.iso | md5sum --check",
    "docker pull alpine@sha256:{hex64}",
    "podman inspect quay.io/acme/{user}@sha256:{hex64}",
    "docker logs -f --tail 50 {hex64}",
    "docker exec -it {hex32} sh",
    "journalctl -b {hex32} --no-pager",
    "kubectl logs -f deploy-{user}-6b8f9d7c5-q2kx7 -c api",
    "kubectl describe rs web-frontend-7c9d8b6f54",
    "curl https://{host}/v2/orders/7e1d9c3b-5a2f-4e8d-b6c0-9f1e3d5a7b2c/items",
    "cat /nix/store/{b36}-openssl-3.0.13/bin/c_rehash",
    "ipfs pin add QmT5NvUtoM5nWFfrQdVrFtvGfKFmG7AHE8P34isapyhCxX",
    "npm install --integrity sha512-{b64key}",
    "./gradlew :core:compileReleaseUnitTestKotlinWithJavacForDebugVariant2",
    "java -cp app.jar com.acme.billing.InvoiceReconciliationServiceImpl2",
    "echo 'VGhlIHF1aWNrIGJyb3duIGZveCBqdW1wcyBvdmVy' | base64 -d",
    "echo {hex64} >> hashes.txt",
    "mv {hex32} AsistensiSkuy",
    "cd ~/Library/Developer/Xcode/DerivedData/AcmeApp-bxkqzfmhgtjcpeamkzwzpxyahogw",
]


@pytest.mark.parametrize("form", IDS)
def test_identifiers_that_look_random_are_kept_by_their_context(form: str) -> None:
    assert not flagged([form])


# A key's public name where a key is chosen, the keys a signature is verified with; and, beside
# them, the secrets of the same shapes and formats.
KEY_NAMES = [
    "git config --global user.signingkey {keyid}",
    "git -c user.signingkey={fingerprint}! commit -S -m wip",
    "export GPG_SIGNING_KEY={fingerprint}",
    "gpg --default-key {keyid} --armor --detach-sign dist/{user}.tar.gz",
    "gpg -u 0x{fingerprint} --clearsign notes.md",
    "gpg --armor --export-secret-subkeys {keyid}! > {user}-subkeys.asc",
    "gpg --passwd {fingerprint}",
    "minisign -Vm {user}.tar.xz -P {edpub}",
    "signify -V -P {edpub} -m SHA256 -x SHA256.sig",
    "nix build .#{user} --option trusted-public-keys '{nixpub}'",
    "cachix use {user} --public-key {nixpub}",
]
SECRETS_OF_THOSE_SHAPES = [
    "gpg --batch --pinentry-mode loopback --passphrase {keyid} -c {user}.tar",
    "git config --global hub.oauthtoken {hex40}",
    "echo '{edsec}' > ~/.minisign/{user}.key",
    "echo '{nixsec}' > /etc/nix/{user}-cache.sec",
]


@pytest.mark.parametrize("form", KEY_NAMES)
def test_key_ids_and_public_keys_are_kept(form: str) -> None:
    assert not flagged([form])


@pytest.mark.parametrize("form", SECRETS_OF_THOSE_SHAPES)
def test_200_random_secrets_of_those_shapes_are_caught(form: str) -> None:
    through = missed([form])
    assert len(through) <= 1, through[:5]  # base64 whose piece before a `/` reads as a word: ~0.5%
