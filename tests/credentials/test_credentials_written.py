"""Secrets written into files and config lines (calmd/secrets/written.py, named.py,
randomness.py): a credential file's line (issue 23), private key material printed piece by
piece (issue 30), and, wherever they are written (issue 39), a config line whose key says
secret (`password: x`, `PrivateKey = x`, `<password>x</password>`, a JAAS string), base64 of
`user:password`, a line of random base64 (a key), a JSON key file."""

from __future__ import annotations

import pytest

from calmd.secrets import find_secret
from tests.credentials.forms import flagged, missed

CREDENTIAL_FILE_FORMS = [
    "echo 'machine {host} login {user} password {secret}' >> ~/.netrc",
    "echo 'machine {host} login {user} password {secret}' | tee -a $HOME/.netrc",
    "printf 'machine %s login %s password %s\\n' {host} {user} '{secret}' >> ~/.netrc",
    "echo 'aws_secret_access_key = {secret}' >> ~/.aws/credentials",
    "printf '[{user}]\\naws_secret_access_key={secret}\\n' >> ~/.aws/credentials",
    "echo '{host}:5432:app:{user}:{secret}' >> ~/.pgpass",
    "echo 'https://{user}:{url_secret}@{host}' >> ~/.git-credentials",  # URL-encoded, as git stores it
    "echo '//{host}/:_authToken={secret}' >> ~/.npmrc",
    "printf '[pypi]\\nusername = {user}\\npassword = {secret}\\n' > ~/.pypirc",
    'echo \'{{"auths":{{"{host}":{{"auth":"{secret}"}}}}}}\' > ~/.docker/config.json',
]
CONFIG_LINE_FORMS = [
    "echo 'password: {secret}' >> config/{user}.yml",
    "echo 'db_password = \"{pair_secret}\"' >> settings.toml",
    "printf 'api_secret = \"%s\"\\n' '{secret}' >> app.ini",
    "echo '<password>{pair_secret}</password>' >> ~/.m2/{user}.xml",
    'echo \'{{"client_secret": "{code_secret}"}}\' > oauth.json',
    "echo 'PrivateKey = {b64key}' >> /etc/wireguard/wg0.conf",
    "printf '[Interface]\\nPrivateKey = {b64key}\\n' > wg1.conf",
    "kafka-console-producer --producer-property 'sasl.jaas.config=org.apache.kafka.common.security."
    'plain.PlainLoginModule required username="{user}" password="{dq_secret}";\' --topic t',
    'spark-submit --conf "spark.hadoop.fs.s3a.secret.key={b62}" job.py',
    "docker run -e 'JAVA_OPTS=-Dkeystore.password={pair_secret} -Xmx1g' app:latest",
    "cat > .env <<'EOF'\nDB_PASSWORD={secret}\nEOF",
    "cat <<EOF | kubectl apply -f -\nkind: Secret\nstringData:\n  password: {pair_secret}\nEOF",
]
# Config text written with `\n` escapes (printf, `echo -e`, ANSI-C quoting): `keyword value`
# lines (msmtp, netrc, fetchmail) and `name=value` lines among others (issue 39's fifth round).
ESCAPED_CONFIG_FORMS = [
    "printf 'account default\\nhost {host}\\nuser {user}\\npassword {code_secret}\\n' > ~/.msmtprc",
    'echo -e "[client]\\nuser={user}\\npass={dq_secret}\\n" > ~/.my.cnf.d/{user}.cnf',
    "printf 'machine {host}\\nlogin {user}\\npassword {code_secret}\\n' >> ~/.authinfo",
    "echo -e 'host={host}\\nport=5432\\npassword={code_secret}' > /etc/{user}/db.conf",
    "printf '[remote]\\ntype = webdav\\nuser = {user}\\npass = {code_secret}\\n' > rclone.conf",
    "echo $'smtp_user={user}\\nsmtp_pass={ansi_secret}' > .mailrc",
    "printf 'set imap_user={user}\\nset imap_pass={code_secret}\\n' >> ~/.muttrc",
    "printf 'poll {host} protocol imap\\n  user {user} pass {code_secret}\\n' > ~/.fetchmailrc",
    "printf '%s\\n' 'account {user}' 'host {host}' 'password {code_secret}' > ~/.msmtprc",
    "printf 'defaults\\nauth on\\nuser {user}\\npassword {code_secret}\\n' | tee ~/.msmtprc",
]
ENCODED_FORMS = [
    "echo '{b64pair}' > /etc/{user}/basic.auth",
    'echo "Authorization: Basic {b64pair}" >> headers.txt',
    "echo '{b64key}' > /etc/{user}/aes.key",
    "echo {b64key} >> ~/.ssh/id_{user}",
]


@pytest.mark.parametrize(
    "form", CREDENTIAL_FILE_FORMS + CONFIG_LINE_FORMS + ESCAPED_CONFIG_FORMS + ENCODED_FORMS
)
def test_200_random_secrets_written_into_files_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


WRITTEN_HARMLESS = [
    'echo "hello {user}" > file.txt',
    "echo 'export PATH=\"$HOME/.local/bin:$PATH\"' >> ~/.bashrc",
    "echo 'password: ${{DB_PASSWORD}}' >> config/{user}.yml",
    'printf \'db_password = "%s"\\n\' "$DB_PW" >> app.ini',
    "echo '<password>${{env.REPO_PASS}}</password>' >> settings.xml",
    'echo \'{{"client_secret": ""}}\' > oauth.json',
    "echo 'PasswordAuthentication no' | sudo tee -a /etc/ssh/sshd_config",
    'echo "Authorization: Bearer $TOKEN" >> headers.txt',
    "echo 'machine {host} login {user}' >> ~/.netrc",
    "grep password ~/.netrc",
    "echo 'aGVsbG8gd29ybGQgZnJvbSBjYWxt' | base64 -d",
    "echo '{hex64}' >> hashes.txt",
    "echo {hex32} > flag.txt",
    "echo 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl {user}'"
    " >> authorized_keys",
    "python3 -c \"import getpass; pw = getpass.getpass('Password: ')\"",
    "git commit -m 'password: reset flow, see docs'",
    "cat <<EOF | kubectl apply -f -\nkind: Secret\nstringData:\n  password: $DB_PW\nEOF",
    # config text with `\n` escapes and nothing secret in it
    "printf 'account default\\nhost {host}\\npasswordeval \"pass show mail/{user}\"\\n' > ~/.msmtprc",
    'echo -e "user={user}\\npassword=$DB_PASSWORD\\n" > cfg',
    "printf 'line one\\nthe password reset flow for {user}\\n' > notes.txt",
    "printf 'host {host}\\nuser {user}\\ntls on\\n' > ~/.msmtprc",
    "echo -e 'password required\\nretry 3' > /etc/{user}.conf",
    "printf 'auth on\\nuser {user}\\npasswordeval gpg -d pw.gpg\\n' >> ~/.msmtprc",
    "printf 'machine {host}\\nlogin {user}\\npassword %s\\n' \"$PW\" >> ~/.authinfo",
    "printf 'username={user}\\npassword=%s\\n' \"$SMB_PW\" > ~/.smbcredentials",
]


@pytest.mark.parametrize("form", WRITTEN_HARMLESS)
def test_what_is_written_without_a_secret_is_kept(form: str) -> None:
    assert not flagged([form])


def test_a_here_document_into_a_credential_file_is_caught() -> None:
    """A multi-line entry, as the shells' history files now keep it (docs/history.md)."""
    cmd = "cat >> ~/.netrc <<EOF\nmachine backup.example.com\nlogin nightly\npassword R7v@q!2mZ\nEOF"
    assert find_secret(cmd) == "credential-file:netrc"
    assert find_secret("cat >> ~/.netrc <<EOF\nmachine backup.example.com\nlogin nightly\nEOF") is None


def test_a_json_key_file_is_caught() -> None:
    key = (
        'echo \'{"type":"service_account","private_key_id":"3f7a0c4e8b2d","private_key":"-----BEGIN '
        "PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC3+MVJBVZvenmQ"
        "\\n-----END PRIVATE KEY-----\\n\"}' > sa.json"
    )
    assert find_secret(key) is not None
    assert find_secret('echo \'{"type":"service_account","project_id":"acme-prod"}\' > sa.json') is None


def test_key_material_printed_line_by_line_is_caught_and_public_keys_are_not() -> None:
    """A private key's first base64 line decodes to a DER structure with a version number (or
    `openssh-key-v1`); a certificate's or a public key's does not. Generated keys, used nowhere."""
    private = [
        "MIIEpAIBAAKCAQEArlKgi3XCUK+kKMrdhqf2qn3rwyIvNwo78sDiU/4kVHZqMLYy",  # PKCS#1 RSA
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC3+MVJBVZvenmQ",  # PKCS#8 RSA
        "MHcCAQEEICMz78TCs2KT20zAGwEZDkqoiaXKHz7/Zb/o/Ur+shLToAoGCCqGSM49",  # SEC1 P-256
        "MC4CAQAwBQYDK2VwBCIEIBGElStLqXkK5b+ThiqmT64LnQsSZRvaKcpB9jk5aAxH",  # PKCS#8 Ed25519
        "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",  # OpenSSH
    ]
    public = [
        "MIIC+TCCAeGgAwIBAgIUWkdoorWyvcVLQwdep1s9AaMOdpgwDQYJKoZIhvcNAQEL",  # a certificate
        "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAzlCqYJFea3SJ80HNbrZ6",  # a public key
    ]
    for line in private:
        for form in ("echo '{}' >> key.pem", 'printf "%s\\n" "{}" >> k', "echo {} | tee -a ~/.ssh/id"):
            assert find_secret(form.format(line)) == "private-key-material", (form, line)
    for line in public:
        assert find_secret(f"echo '{line}' >> ca.pem") is None, line
    header = "'-----BEGIN EC PRIVATE KEY-----'"
    body = "'x9KcacSQ8lcBlAupYzNbvICjVRuin84HlVqnaX0d2FupDUdqeyaHTboKVpEW/bBh'"
    assert find_secret(f"printf '%s\\n' {header} {body} > ec.pem") is not None
    assert find_secret(f"echo {header} > ec.pem; echo {body} >> ec.pem") is not None
    assert find_secret(f"echo {header} > ec.pem") is None  # the header alone holds no key
    assert find_secret("grep -c 'BEGIN RSA PRIVATE KEY' /etc/ssl/private/server2024.key") is None


def test_the_rules_say_what_was_written() -> None:
    assert find_secret("echo 'password: Thistle-Bay7' >> config/secrets.yml") == "config-secret"
    assert find_secret("echo 'b3BzOkJyaWNrLUxhbXA4OQ==' > /etc/app/basic.auth") == "basic-auth-base64"
    assert find_secret("echo 'kLm2Pz8Xq4Rt7Vw1Nb5Hc9Jd3Gf6Sa0Ye2Ui4Oo8Pk/+Zq=' > k") == "random-string"
