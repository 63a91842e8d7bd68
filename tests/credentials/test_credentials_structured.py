"""Secrets in structured values given on the command line (calmd/secrets/named.py, positions.py):
structured-data edits that assign a literal to a secret-named key (jq/yq/gojq selectors, dasel's
`-v`, toml-cli, crudini, `--set-string=a.password=x`, `--helm-set`, Kubernetes' name/value env
pairs and JSON patches, CloudFormation's ParameterKey/ParameterValue), a password inside a
bracketed or nested value (Kafka's SCRAM configs, `{password: x}`, HCL maps, mount options), and
ODBC/ADO/JDBC connection strings (`PWD=`, `Password=`, braced values) while the shell's own
`PWD=` stays stored. Each form holds 200 random secrets; the look-alikes read, compare or
reference instead."""

from __future__ import annotations

import pytest

from calmd.secrets import find_secret
from tests.credentials.forms import flagged, missed

STRUCTURED_EDITS = [
    "yq -i '.database.password = \"{code_secret}\"' {user}.yaml",
    "jq '.auth.token = \"{b62}\"' settings.json > out.json",
    "yq e '.spec.secureJsonData.password = \"{code_secret}\"' -i datasource.yaml",
    "dasel put -f config.toml -t string -v '{secret}' '.database.password'",
    "toml set --toml-path app.toml db.password '{secret}'",
    'kubectl patch secret {user} -p \'{{"stringData":{{"password":"{code_secret}"}}}}\'',
    "helm upgrade {user} ./chart --set-string=db.password={pair_secret}",
    "argocd app set {user} --helm-set postgresql.auth.password={pair_secret}",
    'kubectl patch deploy {user} -p \'{{"spec":{{"template":{{"spec":{{"containers":[{{"name":"api",'
    '"env":[{{"name":"DB_PASSWORD","value":"{code_secret}"}}]}}]}}}}}}}}\'',
    "aws cloudformation create-stack --stack-name {user} --template-body file://t.yml"
    " --parameters ParameterKey=MasterUserPassword,ParameterValue={pair_secret}",
    "kubectl patch secret {user} --type json"
    ' -p \'[{{"op":"replace","path":"/data/password","value":"{b64key}"}}]\'',
    "crudini --set /etc/{user}.ini database password '{secret}'",
    "yq w -i values.yaml redis.auth.password '{secret}'",
    'gojq \'.credentials["api-key"] |= "{b62}"\' c.json',
    "git config --global sendemail.smtpPass '{secret}'",
    "npm config set //{host}/:_password '{secret}'",
    "plutil -replace Password -string '{secret}' ~/Library/Preferences/com.{user}.app.plist",
]
BRACKETED = [
    "kafka-configs --bootstrap-server {host}:9092 --alter --add-config"
    " 'SCRAM-SHA-256=[password={pair_secret}],SCRAM-SHA-512=[iterations=8192,password={pair_secret}]'"
    " --entity-type users --entity-name {user}",
    "kafka-configs.sh --alter --add-config SCRAM-SHA-512=[password={pair_secret}] --entity-type users"
    " --entity-name {user}",
    "kcat -b {host}:9093 -X sasl.mechanisms=SCRAM-SHA-256 -X sasl.username={user}"
    " -X sasl.password={pair_secret} -L",
    "some-tool --config '{{user: {user}, password: {pair_secret}}}'",
    'mytool --db "{{host={host},user={user},password={pair_secret}}}"',
    'terraform apply -var \'db={{user="{user}",password="{code_secret}"}}\'',
    "kafka-console-producer --producer-property 'sasl.jaas.config=org.apache.kafka.common.security.scram."
    'ScramLoginModule required username="{user}" password="{code_secret}";\' --topic t',
    "mount -t cifs //{host}/share /mnt -o 'username={user},password={pair_secret},vers=3.0'",
    'tool --auth \'{{"user":"{user}","pass":"{code_secret}"}}\'',
]
CONNECTION_STRINGS = [
    'isql -v -k "DSN={user};UID=sa;PWD={pair_secret}"',
    "sqlcmd -S {host} -Q 'select 1' -C \"Server=tcp:{host},1433;Database=shop;User ID={user};"
    'Password={pair_secret};Encrypt=True"',
    "python -c \"import pyodbc; pyodbc.connect('DRIVER={{ODBC Driver 18 for SQL Server}};SERVER={host};"
    "UID={user};PWD={pair_secret}')\"",
    "dotnet run -- --conn 'Data Source={host};Initial Catalog=shop;User Id=sa;Pwd={{{pair_secret};x}}'",
    "java -jar app.jar --url 'jdbc:sqlserver://{host}:1433;databaseName=shop;user=sa;password={pair_secret};'",
    'export CONN="Driver={{PostgreSQL Unicode}};Server={host};Port=5432;Uid={user};Pwd={pair_secret};"',
    "`Server={host};Database=app;User Id={user};Password={pair_secret};`",
    "Invoke-Sqlcmd -ConnectionString 'Server={host};Database=app;UID={user};PWD={pair_secret}'"
    " -Query 'select 1'",
]


@pytest.mark.parametrize("form", STRUCTURED_EDITS + BRACKETED + CONNECTION_STRINGS)
def test_200_random_secrets_in_structured_values_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


HARMLESS = [
    "yq '.database.password' {user}.yaml",
    "jq '.[] | select(.password == \"x\")' users.json",
    "yq -i '.database.host = \"{host}\"' config.yaml",
    "jq '.auth.token = env.TOKEN' settings.json",
    'if [ "$password" = "{user}" ]; then echo ok; fi',
    "yq -i '.database.password = strenv(DB_PASSWORD)' config.yaml",
    'kubectl patch deploy {user} -p \'{{"spec":{{"template":{{"spec":{{"containers":[{{"name":"api",'
    '"env":[{{"name":"DB_HOST","value":"{host}"}}]}}]}}}}}}}}\'',
    "aws cloudformation deploy --stack-name {user}"
    " --parameter-overrides ParameterKey=InstanceType,ParameterValue=t3",
    "jq '.db.password = $pw' --arg pw \"$DB_PW\" c.json",
    "dasel put -f config.toml -t string -v \"$PW\" '.database.password'",
    "dasel -f config.toml '.database.password'",
    "yq -i '.auth.password_file = \"/run/secrets/{user}\"' c.yaml",
    "kafka-configs --bootstrap-server {host}:9092 --describe --entity-type users --entity-name {user}",
    "tool --config '{{user: {user}, password: $PW}}'",
    "kafka-configs --alter --add-config 'SCRAM-SHA-256=[iterations=8192]' --entity-type users",
    "mount -t cifs //{host}/share /mnt -o credentials=/etc/{user}.cred,vers=3.0",
    'terraform apply -var \'db={{user="{user}",password_file="/run/pw"}}\'',
    "PWD=/srv/{user} make build",
    "PWD=build make",
    "OLDPWD=/tmp cd -",
    'cd "$PWD/src"',
    "export PWD=/home/{user}",
    'sqlcmd -S {host} -C "Server={host};Database=shop;Trusted_Connection=yes;"',
    'isql -v -k "DSN={user};UID=sa;PWD=$DB_PW"',
    "dotnet run -- --conn 'Server={host};Database=app;User Id=sa;Pwd={{your_password}}'",
    "env PWD=$HOME/{user} ./run.sh",
]


@pytest.mark.parametrize("form", HARMLESS)
def test_reads_comparisons_and_references_are_kept(form: str) -> None:
    assert not flagged([form])


def test_the_rules_name_the_place() -> None:
    assert find_secret("yq -i '.db.password = \"Qx7-Lantern\"' c.yaml") == "config-secret"
    assert find_secret("isql -k 'DSN=x;UID=sa;PWD=Ledger5Fig'") == "password-argument"
