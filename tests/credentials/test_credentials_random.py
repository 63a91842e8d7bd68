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


# A generated value behind a readable prefix (`mediaserverXk9...`): the prefix's words lowered the
# share of class changes the whole was judged by, and half of such values went through.
PREFIXED = [
    "./run.sh --mode fast mediaserver{b62}",
    "sync-tool --target nas homeassistant{b62}",
    "deploy.sh prod Photos{b62}",
]
# `*_KEY` names whose qualifier says neither secret nor a thing (issue 39's fifth round): a
# generated value is a key whatever the qualifier.
UNNAMED_KEYS = [
    "export {user}_SYNC_KEY={b36}",
    "MEDIA_SYNC_KEY={user}-{b36} ./sync.sh",
    "export BACKUP_ENCRYPT_KEY={b62}",
    "REPLICATION_KEY=prod_{b62} ./replicate",
    "export SOMETHING_SYNC_KEY=abc1{b36}",
    "docker run -e RELAY_KEY={hex64} {user}/relay",
    "STREAM_INGEST_KEY=ingest-{b36} ./ingest",
]


@pytest.mark.parametrize("form", PREFIXED)
def test_200_random_tokens_behind_a_readable_prefix_are_caught(form: str) -> None:
    through = missed([form])
    # base62 with no upper case, or runs of one class left after the prefix: ~3-5%
    assert len(through) <= 12, through[:5]


@pytest.mark.parametrize("form", UNNAMED_KEYS)
def test_200_generated_values_of_keys_of_any_qualifier_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


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
    # `*_KEY` names of things, and prefixes before words
    "export CACHE_KEY=node-modules-v2-linux-{hex32}",
    "export PRIMARY_KEY=id",
    "export SORT_KEY=created_at",
    "export SSH_KEY=~/.ssh/id_{user}",
    "BUILD_CACHE_KEY=deps-v3-ubuntu-22.04-python3.11 make",
    "export S3_OBJECT_KEY=backups/{user}/db.sql.gz",
    "export KMS_KEY={uuid}",
    "export TRANSLATION_KEY=checkout.button.{user}",
    "export PARTITION_KEY={user}-{hex32}",
    "export REDIS_KEY=session:{user}:42",
    "export SYNC_KEY_FILE=/run/{user}.key",
    "export SYNC_KEY=$(cat /run/{user}.key)",
    "./gradlew :app:testDebugUnitTestKotlinCompilationForAndroidVariant2",
    "ipfs get ipfs://QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG",
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
