"""Secrets in URLs and in `user:pass@host` without a scheme (calmd/secrets/urls.py): userinfo,
a userinfo that is only a token, database shells' `user:pass@host`, a query value under any
name when it looks like a key, a webhook's token in the path. Each form holds 200 random
values; the look-alikes are URLs whose random-looking parts are ids."""

from __future__ import annotations

import pytest

from calmd.secrets import find_secret
from tests.credentials.forms import flagged, missed

SECRET_URLS = [
    "psql postgresql://{user}:{url_secret}@{host}:5432/app",
    "git push https://{user}:{url_secret}@{host}/acme/api.git",
    "git clone https://{hex40}@{host}/team/api.git",
    "git remote set-url origin https://{b62}@{host}/ops/infra.git",
    "mysqlsh --uri {user}:{pair_secret}@{host}:3306",
    "mongosh {user}:{pair_secret}@{host}:27017/admin",
    "curl 'https://{host}/v1/export?format=csv&access={b62}'",
    "curl 'https://{host}/ingest?k={hex40}'",
    "wget 'https://{host}/build.tar.gz?expires=1735689600&signature={b62}'",
    "curl 'https://{host}/api?password={url_secret}'",
    'curl -X POST https://{host}/hooks/{b36} -d \'{{"text":"hi"}}\'',
    'curl -d \'{{"text":"ok"}}\' https://{host}/api/webhooks/123456789/{b62}',
    "curl https://{host}/trigger/door/with/key/{b62}",
    "curl -X POST https://hooks.{host}/services/T01/B02/{b62}",
]


# Notification services' URLs in schemes of their own, as apprise and shoutrrr spell them: the
# account's tokens are pieces of the host or path (issue 39's fifth round).
SERVICE_URLS = [
    "apprise -b done 'discord://{digits}/{b64url}'",
    "apprise -t hi 'tgram://{digits}:{b62}/-100123456'",
    "apprise 'slack://T{b36u}/B{b36u}/{b62}/#general'",
    "apprise 'pover://{b62}@{b62}'",
    "apprise 'gotify://{host}/{b62}'",
    "apprise 'pbul://o.{b62}'",
    "apprise 'prowl://{hex40}'",
    "apprise 'mmost://{host}/{b36}'",
    "shoutrrr send -u 'pushover://shoutrrr:{b62}@{b62}/' -m hi",
    "apprise 'zulip://bot@{user}/{b62}'",
    "apprise 'msteams://{uuid}@{uuid}/{hex32}/{uuid}'",
    "apprise 'lametric://{hex64}@{host}'",
    "apprise 'join://{hex32}/{user}'",
    "apprise -vv 'ntfys://{host}/{user}?token=tk_{b62}'",
    "docker run -e APPRISE_URLS='rocket://{user}@{host}/{b62}' caronc/apprise",
]


@pytest.mark.parametrize("form", SERVICE_URLS)
def test_200_random_tokens_in_service_urls_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


HARMLESS_SERVICE_URLS = [
    "git clone git://git.{host}/pub/scm/{user}.git",
    "skopeo copy docker://{user}/app@sha256:{hex64} oci:app",
    "ipfs get ipfs://bafybei{b36}",
    "open 'slack://channel?team=T{b36u}&id=C{b36u}'",
    "xdg-open 'x-github-client://openRepo/https://{host}/{user}/app'",
    "open 'notion://www.notion.so/{user}/Roadmap-{hex32}'",
    "apprise 'discord://$DISCORD_ID/$DISCORD_TOKEN'",
    "open 'obsidian://open?vault=Notes&file=Daily%2F2024-01-01'",
    "nix copy --to 's3://{user}-cache?region=eu-west-1' ./result",
    "open 'steam://rungameid/{digits}'",
    "code --open-url 'vscode://file/home/{user}/src/app.py:10'",
    "apprise -vv 'json://{host}/notify'",
    "apprise 'gotify://{host}/$GOTIFY_TOKEN'",
    "chromium 'chrome-extension://{extension_id}/options.html'",
    "apprise 'mailto://{host}?to={user}@example.com'",
    "open 'zotero://select/items/0_{b36u}'",
    "apprise 'tgram://{{bot_token}}/{{chat_id}}'",
    "apprise 'msteams://{uuid}@{uuid}/'",
    "open 'discord://discord.com/channels/{digits}/{digits}'",
]


@pytest.mark.parametrize("form", HARMLESS_SERVICE_URLS)
def test_urls_of_public_schemes_and_ids_are_kept(form: str) -> None:
    assert not flagged([form])


@pytest.mark.parametrize("form", SECRET_URLS)
def test_200_random_secrets_in_urls_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


HARMLESS_URLS = [
    "git clone https://{user}@bitbucket.org/acme/site.git",
    "git clone git@github.com:acme/{user}.git",
    "scp build.tar.gz {user}@{host}:/srv/releases/",
    "ssh -L 5432:db.internal:5432 {user}@{host}",
    "docker pull node:20.11@sha256:{hex64}",
    'echo "$USER:$PASS@$HOST"',
    "psql postgresql://{user}@{host}:5432/app",
    "git clone https://<user>:<token>@{host}/acme/api.git",
    "mpv 'https://www.youtube.com/watch?v=Xk3dL9pQ2mZ&list=PL{b62}'",
    "curl 'https://{host}/items?id={hex32}&page=2'",
    "wget 'https://{host}/app.js?v={hex40}'",
    "curl 'https://{host}/search?q=how+to+rotate+a+password'",
    "open 'https://docs.google.com/spreadsheets/d/1{b62}/edit?usp=sharing'",
    "curl 'https://{host}/callback?state={b62}&scope=read'",
    "curl 'https://{host}/api?token=$TOKEN'",
    "curl https://api.github.com/repos/acme/{user}/hooks/41234567",
    "wget https://raw.githubusercontent.com/acme/tools/{hex40}/install.sh",
    "curl -L https://github.com/acme/api/archive/{hex40}.tar.gz",
    "git clone https://gist.github.com/{hex32}.git",
    "curl https://{host}/services/api/v1/status",
    "curl https://{host}/hooks/deploy.sh -o deploy.sh",
    "curl https://{host}/static/{hex32}/capture.pcap",
    "wget https://{host}/prod/modules/{hex32}/payments.log?t=4132",
    "curl -s '{host}/grep?p=magnet:\\?xt=urn:btih:[a-zA-Z0-9]*'",
]


@pytest.mark.parametrize("form", HARMLESS_URLS)
def test_urls_whose_random_parts_are_ids_are_kept(form: str) -> None:
    assert not flagged([form])


def test_the_url_rules_say_where_the_secret_was() -> None:
    assert (
        find_secret("git clone https://3e9f1a7c5b2d8e4f6a0c9b1d3e5f7a9c2b4d6e8f@code.example.com/a.git")
        == "url-credentials"
    )
    assert find_secret("mysqlsh --uri ops:Cobble-Stone4@db:3306") == "url-credentials"
    assert find_secret("curl 'https://x.example/a?access=7kQ2mZ9xLp4Rv8Tn3Wb6'") == "url-query-secret"
    assert find_secret("curl https://x.example/hooks/qz7k2m9x4p8r3t6w1n5b0vc8yd") == "url-path-token"
