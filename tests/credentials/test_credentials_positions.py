"""Values in credential positions told by what surrounds them (calmd/secrets/positions.py), not
by the tool's name: a login pair's password, a short flag given a key, a keyword's positional,
a command that sets a secret, a login whose only operand is a token, `--user name:pass`, a
client certificate's passphrase. Each form holds 200 random secrets; the look-alike forms hold
the same shapes where nothing secret stands."""

from __future__ import annotations

import pytest

from calmd.secrets import find_secret
from tests.credentials.forms import flagged, missed

LOGIN_PAIRS = [
    "cqlsh {host} -u {user} -p '{secret}'",
    "rabbitmqadmin -H {host} -u {user} -p '{secret}' list queues",
    "hydra -l {user} -p '{secret}' ssh://{host}",
    "megatools ls -u {user}@example.com -p '{secret}'",
    "racadm -r {host} -u {user} -p '{secret}' getsysinfo",
    "psexec \\\\{host} -u {user} -p '{secret}' cmd.exe",
    "vsql -h {host} -U {user} -P '{secret}' -c 'select 1'",
    "influx setup -u {user} -p '{secret}' -o acme -b metrics -f",
    "cypher-shell -a neo4j://{host} -u {user} -p {b62}",
    "mongodump -u {user} -p {b36} --host {host}",
]
KEY_OPTIONS = [
    "openssl enc -aes-256-cbc -K {hex64} -iv {hex32} -in notes -out notes.enc",
    "swift -A https://{host}/auth/v1.0 -U acct:{user} -K {hex32} list",
    "nuget push pkg.nupkg -k {b36} -s https://{host}/v3/index.json",
    "nxc smb {host} -u {user} -H {hex32}:{hex32}",
    "sometool -t {b62} --endpoint https://{host}",
    "aescrypt -e -k {b64key} backup.tar",
]
TOOL_FLAGS = [  # short flags whose meaning is secret to their tool (snmp, PuTTY)
    "snmpwalk -v3 -u {user} -l authPriv -a SHA -A '{secret}' -x AES -X '{secret}' {host}",
    "snmpget -v2c -c '{secret}x' {host} sysName.0",
    "plink -batch -pw '{secret}' {user}@{host} uptime",
    "pscp -P 2222 -pw '{secret}' build.zip {user}@{host}:/srv/",
]
KEYWORDS = [
    "pdftk in.pdf input_pw '{secret}' output out.pdf",
    "pdftk in.pdf output locked.pdf owner_pw '{secret}' encrypt_128bit",
    "consul kv put app/{user}/db_password '{secret}'",
    "etcdctl put /config/{user}/api_token {b62}",
    "defaults write com.{user}.app Password '{secret}'",
    "gsettings set org.{user}.mail password '{secret}'",
    "rclone config create r2 s3 provider Other secret_access_key '{secret}'",
    "redis-cli -h {host} SET session_signing_key {hex64}",
    "sc.exe config svc obj= corp\\{user} password= '{secret}'",
]
SECRET_SETTING = [
    "gh secret set DEPLOY_URL --body '{secret}' --repo acme/{user}",
    "az keyvault secret set --vault-name kv --name {user} --value '{secret}'",
    "security add-generic-password -a {user} -s relay -w '{secret}'",
    "aws ssm put-parameter --name /app/{user} --type SecureString --value '{secret}'",
    "fly secrets set RELAY_{user}='{secret}'",
    "doppler secrets set HOOK='{secret}' --project shop",
    "dotnet user-secrets set \"Db:Password\" '{secret}'",
    "pulumi config set --secret {user}Password '{secret}'",
    "pulumi config set --secret {user}:apiKey {b62} --stack prod",
    "pulumi -C infra config set --secret {user}Token {b36}",
]
SOLE_TOKENS = [
    "wandb login {hex40}",
    "snyk auth {b36}",
    "ngrok authtoken {b62}",
    "cloudflared service install {jwtish}",
    "cachix authtoken {b62}",
    "vault operator unseal {b64key}",
    "bw unlock '{secret}x1'",
]
# A subcommand whose own name says it sets a secret, a secret's noun and a setting verb before
# the value, a token (or a UUID) after an auth, login or token verb (issue 39's fifth round).
SECRET_SUBCOMMANDS = [
    "grafana-cli admin reset-admin-password '{secret}'",
    "grafana cli admin reset-admin-password {b62}",
    "zulipctl set-password {user} '{secret}'",
    "myapp change-secret webhook '{secret}'",
    "appctl passwd-set {user} '{secret}'",
    "ceph dashboard ac-user-set-password {user} '{secret}'",
    "raspi-config nonint do_wifi_ssid_passphrase {user}-net '{secret}'",
    "kubeadm token create {bootstrap}",
    "toolx token set {b62}",
    "acme-cli login {uuid}",
    "snyk auth {uuid}",
    "exo auth login {b36}",
    "doppler secrets set {user} '{secret}' --project shop",
    "rpk security user create {user} -p '{secret}' --mechanism SCRAM-SHA-256",
    "influx user create -n {user} -p '{secret}' -o acme",
]
PAIRS = [
    "etcdctl --user {user}:'{secret}' get /config",
    "curl --proxy-user {user}:'{secret}' -x http://{host}:3128 https://example.com",
    "tool --creds={user}:'{secret}' sync",
    "curl -E client.pem:'{secret}' https://{host}/v1/health",
    "curl --cert ops.p12:'{secret}' --cert-type P12 https://{host}/",
    "wget --certificate=id.pfx:'{secret}' https://{host}/report.csv",
]


@pytest.mark.parametrize("form", LOGIN_PAIRS + KEY_OPTIONS + TOOL_FLAGS + KEYWORDS + SECRET_SETTING
                         + SOLE_TOKENS + SECRET_SUBCOMMANDS + PAIRS)  # fmt: skip
def test_200_random_secrets_in_credential_positions_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


# The same positions with nothing secret in them.
HARMLESS = [
    "psql -h {host} -U {user} -p 5433 app",
    "pg_dump -h {host} -p 5440 -U {user} -d shop",
    "ssh -l {user} -p 2222 {host}",
    "sudo -u {user} psql -p 5433 -c 'select 1'",
    "docker compose -p shop exec -u {user} web php artisan migrate",
    "mysql -u {user} -p shop",
    "docker compose exec db mysql -u {user} -p appdb",
    "python -u train.py -p configs/{user}.yaml",
    "systemctl --user show -p MainPID --value {user}.service",
    "ps -u {user} -p 1234,5678 -o pid,cmd",
    "sqlmap -u 'http://{host}/a.php?id=1' -p id --batch",
    'cqlsh {host} -u {user} -p "$CASSANDRA_PW"',
    "hydra -l {user} -P /usr/share/wordlists/rockyou.txt ssh://{host}",
    'openssl enc -aes-256-cbc -K "$KEY" -iv "$IV" -in a -out b',
    "git rebase -i {hex40}",
    "docker rm -f {hex64}",
    "journalctl -b {hex32} --no-pager",
    "gpg -k {hex40}",
    "snmpwalk -v2c -c public {host} system",
    "grep -rn password src/{user}/",
    "bw get password {host}",
    "consul kv get app/{user}/db_password",
    "consul kv put app/{user}/replicas 3",
    "defaults write com.{user}.app AppleShowAllFiles -bool true",
    "htpasswd -c /etc/nginx/.htpasswd {user}",
    "cp /etc/passwd /tmp/passwd.bak",
    "gh secret set DEPLOY_TOKEN < token.txt",
    "gh secret list --repo acme/{user}",
    "az keyvault secret show --vault-name kv --name {user}",
    "aws ssm get-parameter --name /app/{user} --with-decryption",
    "security find-generic-password -a {user} -s relay -w",
    "kubectl create secret generic {user} --from-file=./config.env",
    "pulumi config set --secret {user}Password",  # it prompts for the value
    "pulumi config set --secret {user}:apiKey --stack prod",
    'pulumi config set --secret {user}Token "$TOKEN"',
    "vercel env add {user}_DB_PASSWORD production",
    "git config --global credential.helper store",
    "wandb login",
    "npm install --save-dev typescript-language-server",
    "sudo apt-get install software-properties-common",
    "zerotier-cli join 8056c2e21c000001",
    "gcloud auth login {user}@example.com",
    "brew install acme-corp/tap/acme-cli",
    "curl --user {user} https://{host}/private/",
    'docker run --rm -u 1000:1000 -v "$PWD":/src node:20 npm ci',
    "docker exec -u www-data:www-data app php artisan cache:clear",
    'curl -u "$API_USER:$API_PASS" https://{host}/',
    "curl --cert client.pem --key client.key https://{host}/",
    "docker run -v ./certs/ca.pem:/etc/ssl/ca.pem:ro nginx",
    # subcommands that say secret, given no secret
    "grafana-cli admin reset-admin-password",
    "myapp change-password {user}",
    "gh auth token",
    "npm token revoke {hex32}",
    "railway link {uuid}",
    "docker swarm join-token worker",
    "appctl get-password {user}",
    "kubeadm token list",
    "kubeadm token delete {bootstrap}",
    "zulipctl set-password {user}",
    'gitea admin user change-password --username {user} --password "$PW"',
    "tool token set --from-file /run/{user}.token",
    "netlify link --id {uuid}",
    "gh secret set DEPLOY_TOKEN --repo acme/{user}",
    "docker secret create {user}_db_pass ./db_pass.txt",
    "keyring set smtp {user}",
]


@pytest.mark.parametrize("form", HARMLESS)
def test_the_same_positions_without_a_secret_are_kept(form: str) -> None:
    assert not flagged([form])


def test_the_rules_name_the_position() -> None:
    assert find_secret("cqlsh db -u cassandra -p Basalt77") == "login-password"
    assert find_secret("openssl enc -K " + "0a1b2c3d" * 8 + " -in a") == "key-option"
    assert find_secret("pdftk a.pdf input_pw Cashew-Tide3 output b.pdf") == "keyword-password"
    assert find_secret("gh secret set X --body 'https://x.example/run'") == "secret-setting"
    assert find_secret("wandb login " + "9f8e7d6c5b" * 4) == "login-token"
    assert find_secret("etcdctl --user root:Pylon-Sage7 get /") == "user-password-pair"
    assert find_secret("curl -E c.pem:Quartz-6 https://x") == "certificate-passphrase"
