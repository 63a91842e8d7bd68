"""Session cookies given to HTTP tools (calmd/secrets/cookies.py): curl's `-b`/`--cookie` (alone,
attached, at the end of a cluster), a `Cookie:` header however it is passed, other tools'
`--cookie`, with the session ids of Java, PHP, ASP.NET, Express, Laravel, GitLab, Rails, or a
random value under any name. Each form holds 200 random ids; the look-alikes hold cookie files,
settings, expansions and placeholders where the ids stood."""

from __future__ import annotations

import pytest

from calmd.secrets import find_secret
from tests.credentials.forms import flagged, missed

COOKIES = [
    "curl -b 'JSESSIONID={HEX32}' https://{host}/admin",
    'curl --cookie "PHPSESSID={b36}" https://{host}/cart',
    "curl -H 'Cookie: ASP.NET_SessionId={b36}' https://{host}/",
    "wget --header='Cookie: sessionid={b36}' https://{host}/export.csv",
    "http GET https://{host}/me Cookie:session={b62}",
    "curl -sb 'lang=en; connect.sid=s%3A{b62}.{b62}' https://{host}/",
    "sqlmap -u 'http://{host}/item.php?id=1' --cookie='PHPSESSID={b36}; security=low' --batch",
    "ffuf -u https://{host}/FUZZ -w words.txt -b 'laravel_session={b64key}'",
    "curl --cookie=_gitlab_session={hex32} https://{host}/api/v4/user",
    "curl -b 'theme=dark; remember_user_token={b62}' https://{host}/",
    "xh https://{host}/api Cookie:'_shop_session={b62}'",
    "curl -b 'AWSALB={b64key}' https://{host}/",
    "wfuzz -c -z file,users.txt -b 'sid={hex40}' https://{host}/api/FUZZ",
    'curl -s -b"PHPSESSID={b36}" https://{host}/',
]


@pytest.mark.parametrize("form", COOKIES)
def test_200_random_session_cookies_are_caught(form: str) -> None:
    through = missed([form])
    assert not through, through[:5]


HARMLESS = [
    "curl -b cookies.txt https://{host}/",
    "curl -c /tmp/{user}.jar -b /tmp/{user}.jar https://{host}/login",
    "curl -b 'lang=en; theme=dark' https://{host}/",
    'curl --cookie "$COOKIE" https://{host}/',
    "curl -H 'Cookie: consent=yes' https://{host}/",
    "git checkout -b {user}/session-cookies",
    "curl -b 'cookieconsent_status=dismiss; tz=Europe/Berlin' https://{host}/",
    "sqlmap -u 'http://{host}/item.php?id=1' --cookie='security=low' --batch",
    'curl -b "session=$(cat /tmp/{user}.sid)" https://{host}/',
    "wget -b https://{host}/big.iso",
    "curl -b 'PHPSESSID=<your-session-id>' https://{host}/",
    "curl -H 'Cookie: session=$SESSION' https://{host}/",
    "grep -i cookie /var/log/nginx/{user}.log",
    "curl -b @cookies.txt https://{host}/",
    "curl -b 'locale=fr; _ga=GA1.2.{digits}.1700000000' https://{host}/",
]


@pytest.mark.parametrize("form", HARMLESS)
def test_cookie_files_settings_and_references_are_kept(form: str) -> None:
    assert not flagged([form])


def test_the_rule_names_the_cookie() -> None:
    assert find_secret("curl -b 'PHPSESSID=q7v2k9m4n1p8r3s6t0u5w2x9y4' https://x") == "session-cookie"
