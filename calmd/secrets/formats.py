"""Tokens services issue, known by their format or their prefix (AWS key ids, GitHub, GitLab,
Slack, Stripe, npm, PyPI, OpenAI, Anthropic, Google, Azure, ... and ~80 prefixes at any length).

The families are the floor set by atuin's history filter and detect-secrets' plugin list,
widened with the formats the vendors publish (docs/secrets.md). The regular expressions are
written here, not copied.
"""

from __future__ import annotations

import re

from calmd.secrets.values import ENTROPY_BITS, shannon_entropy

# (rule, needle, pattern): the pattern is only tried when the needle, a plain substring every
# match contains, is in the command (substring search runs at C speed; a regex alternation of
# seventy patterns would cost tens of microseconds per command). Word boundaries are checked after
# a match (_bounded).
TOKEN_FORMATS: tuple[tuple[str, str, str], ...] = (
    ("aws-access-key-id", "A", r"(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA)[A-Z2-7]{16}"),
    ("github-token", "gh", r"gh[pousr]_[A-Za-z0-9]{36,255}"),
    ("github-token", "github_pat_", r"github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}"),
    ("github-token", "gh1_", r"gh1_[A-Za-z0-9]{21}_[A-Za-z0-9]{59}"),
    ("github-token", "v1.", r"v1\.[0-9a-f]{40}"),
    ("gitlab-token", "gl", r"gl(?:pat|dt|rt|ptt|cbt|soat|ft|imt|agent|oas)-[A-Za-z0-9_-]{20,}"),
    ("gitlab-token", "GR1348941", r"GR1348941[A-Za-z0-9_-]{20}"),
    ("slack-token", "xox", r"xox[abposer]-(?=[0-9A-Za-z-]*\d)[0-9A-Za-z-]{10,}"),  # digits: team and user ids
    ("slack-token", "xapp-", r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+"),
    (
        "slack-webhook",
        "hooks.slack.com",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{20,}",
    ),
    ("stripe-key", "k_", r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("stripe-key", "whsec_", r"whsec_[A-Za-z0-9]{24,}"),
    ("npm-token", "npm_", r"npm_[A-Za-z0-9]{36}"),
    ("pypi-token", "pypi-AgE", r"pypi-AgE[A-Za-z0-9_-]{50,}"),
    ("openai-key", "T3BlbkFJ", r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20}T3BlbkFJ[A-Za-z0-9_-]{20,}"),
    ("openai-key", "sk-", r"sk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,}"),
    ("openai-key", "sk-", r"sk-[A-Za-z0-9]{48}"),
    ("anthropic-key", "sk-ant-", r"sk-ant-(?:api|admin)\d\d-[A-Za-z0-9_-]{80,}"),
    ("openrouter-key", "sk-or-v1-", r"sk-or-v1-[0-9a-f]{64}"),
    ("google-api-key", "AIza", r"AIza[0-9A-Za-z_-]{35}"),
    ("google-oauth", "GOCSPX-", r"GOCSPX-[A-Za-z0-9_-]{28}"),
    ("google-oauth", "ya29.", r"ya29\.[0-9A-Za-z_-]{30,}"),
    ("azure-storage-key", "AccountKey=", r"AccountKey=[A-Za-z0-9+/]{86}=="),
    ("azure-client-secret", "Q~", r"[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}"),
    ("azure-sas", "sig=", r"[?&]sig=[A-Za-z0-9%+/]{40,}"),
    ("twilio-key", "SK", r"SK[0-9a-f]{32}"),
    ("sendgrid-key", "SG.", r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),
    ("mailgun-key", "key-", r"key-[0-9a-f]{32}"),
    ("mailchimp-key", "-us", r"[0-9a-f]{32}-us\d{1,2}"),
    ("discord-token", ".", r"[MNO][A-Za-z0-9_-]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}"),
    ("discord-webhook", "/api/webhooks/", r"discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_-]{30,}"),
    ("telegram-bot-token", ":AA", r"(?:bot)?\d{8,10}:AA[A-Za-z0-9_-]{33}"),
    ("heroku-key", "HRKU-", r"HRKU-[A-Za-z0-9_-]{40,}"),
    ("digitalocean-token", "_v1_", r"do[opr]_v1_[0-9a-f]{64}"),
    ("shopify-token", "shp", r"shp(?:at|ca|pa|ss|tka)_[0-9a-fA-F]{32}"),
    ("vault-token", "hv", r"hv[sbr]\.[A-Za-z0-9_-]{24,}"),
    ("vault-token", "s.", r"s\.[A-Za-z0-9]{24}"),
    ("terraform-token", ".atlasv1.", r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,}"),
    ("doppler-token", "dp.", r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9_.-]{40,}"),
    ("databricks-token", "dapi", r"dapi[0-9a-f]{32}"),
    ("huggingface-token", "hf_", r"hf_[A-Za-z]{34}"),
    (
        "private-key-block",
        "PRIVATE KEY",
        r"-----BEGIN[A-Z ]{0,20} PRIVATE KEY(?: BLOCK)?-----(?:\\[nr]|\s)*[A-Za-z0-9+/=]{16,}",
    ),
    ("jwt", ".eyJ", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("netlify-token", "nf", r"nf[pcoub]_[0-9a-zA-Z]{36}"),
    ("pulumi-token", "pul-", r"pul-[0-9a-f]{40}"),
    ("age-secret-key", "AGE-SECRET-KEY-1", r"AGE-SECRET-KEY-1[0-9A-Z]{58}"),
    ("grafana-token", "gl", r"gl(?:sa|c)_[A-Za-z0-9_=+/-]{32,}"),
    ("linear-key", "lin_", r"lin_(?:api|oauth)_[A-Za-z0-9]{40}"),
    ("postman-key", "PMAK-", r"PMAK-[0-9a-f]{24}-[0-9a-f]{34}"),
    ("atlassian-token", "ATATT3", r"ATATT3[A-Za-z0-9_=-]{100,}"),
    ("docker-hub-token", "dckr_", r"dckr_(?:pat|oat)_[A-Za-z0-9_-]{27,}"),
    ("tailscale-key", "tskey-", r"tskey-(?:auth|api|client|scim|webhook)-[A-Za-z0-9]{6,}-[A-Za-z0-9]{20,}"),
    ("sentry-token", "sntr", r"sntr[ysu]_[A-Za-z0-9+/=_-]{40,}"),
    ("square-token", "EAAA", r"EAAA[A-Za-z0-9_-]{22,}"),
    ("square-token", "sq0", r"sq0(?:atp|csp)-[A-Za-z0-9_-]{22,}"),
    ("newrelic-key", "NR", r"NR(?:AK|AA|II|JS)-[A-Z0-9]{27}"),
    ("flyio-token", "fo1_", r"fo1_[A-Za-z0-9_-]{43}"),
    ("flyio-token", "FlyV1 ", r"FlyV1 fm\d_[A-Za-z0-9+/=_-]{40,}"),
    ("planetscale-token", "pscale_", r"pscale_(?:tkn|pw|oauth)_[A-Za-z0-9_.-]{32,}"),
    ("groq-key", "gsk_", r"gsk_[A-Za-z0-9]{48,}"),
    ("replicate-token", "r8_", r"r8_[A-Za-z0-9]{37}"),
    ("artifactory-token", "AKCp", r"AKCp[A-Za-z0-9]{69}"),
    ("alibaba-key", "LTAI", r"LTAI[A-Za-z0-9]{20}"),
    ("figma-token", "figd_", r"figd_[A-Za-z0-9_-]{40}"),
    ("supabase-token", "sbp_", r"sbp_[0-9a-f]{40}"),
    ("notion-token", "secret_", r"secret_[A-Za-z0-9]{43}"),
    ("notion-token", "ntn_", r"ntn_[A-Za-z0-9]{46}"),
    ("perplexity-key", "pplx-", r"pplx-[A-Za-z0-9]{48}"),
    ("xai-key", "xai-", r"xai-[A-Za-z0-9]{80}"),
    ("sendinblue-key", "xkeysib-", r"xkeysib-[0-9a-f]{64}-[A-Za-z0-9]{16}"),
    ("bitbucket-token", "ATBB", r"ATBB[A-Za-z0-9_=.-]{28,}"),
    ("buildkite-token", "bkua_", r"bkua_[a-f0-9]{40}"),
    ("circleci-token", "CCIPAT_", r"CCIPAT_[A-Za-z0-9]{22}_[a-f0-9]{40}"),
    ("rubygems-key", "rubygems_", r"rubygems_[0-9a-f]{48}"),
    ("dynatrace-token", "dt0c01.", r"dt0c01\.[A-Z0-9]{24}\.[A-Z0-9]{64}"),
    ("mapbox-token", "sk.eyJ", r"sk\.eyJ[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}"),
)
# needle -> [(rule, compiled pattern)]
_BY_NEEDLE: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
for _rule, _needle, _pattern in TOKEN_FORMATS:
    _BY_NEEDLE.setdefault(_needle, []).append((_rule, re.compile(_pattern)))
_WORDISH = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _bounded(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] is not part of a longer word (a token inside a longer random
    string or identifier is not the token)."""
    return (start == 0 or text[start - 1] not in _WORDISH or not text[start].isalnum()) and (
        end == len(text) or text[end] not in _WORDISH or not text[end - 1].isalnum()
    )


SHORTEST_TOKEN = 12  # the fewest characters a match of TOKEN_FORMATS has (Slack's `xapp-`; a test checks)


def token_rule(cmd: str) -> str | None:
    if len(cmd) < SHORTEST_TOKEN:
        return None
    for needle, patterns in _BY_NEEDLE.items():
        if needle not in cmd:
            continue
        for rule, pattern in patterns:
            for found in pattern.finditer(cmd):
                if _bounded(cmd, found.start(), found.end()):
                    return rule
    return None


# string is a token whatever its length (the token formats above fix lengths; a new or unusual
# length still starts with the prefix).
_TOKEN_PREFIXES = (
    "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "gldt-", "glrt-", "glptt-", "glsoat-",
    "xoxb-", "xoxp-", "xoxa-", "xoxe-", "xoxs-", "xoxr-", "xapp-", "sk_live_", "rk_live_", "sk_test_",
    "rk_test_", "whsec_", "npm_", "pypi-AgE", "sk-ant-", "sk-proj-", "sk-svcacct-", "sk-admin-", "sk-or-v1-",
    "hf_", "dckr_pat_", "dckr_oat_", "GOCSPX-", "ya29.", "shpat_", "shpss_", "shpca_", "shppa_", "dop_v1_",
    "doo_v1_", "dor_v1_", "hvs.", "hvb.", "hvr.", "lin_api_", "lin_oauth_", "PMAK-", "ATATT3", "ATBB",
    "tskey-auth-", "tskey-api-", "tskey-client-", "sntrys_", "sntryu_", "glsa_", "glc_", "pscale_tkn_",
    "pscale_pw_", "gsk_", "r8_", "figd_", "sbp_", "ntn_", "pplx-", "xai-", "xkeysib-", "bkua_", "CCIPAT_",
    "rubygems_", "fo1_", "AGE-SECRET-KEY-1", "nfp_", "HRKU-", "AKCp", "sq0atp-", "sq0csp-", "dp.pt.",
    "dp.st.", "AIza",
)  # fmt: skip
_BY_LENGTH = tuple(sorted(_TOKEN_PREFIXES, key=len, reverse=True))  # the longest that fits wins
_TOKENISH = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z0-9_.+-]{19,}")  # a prefix and 16 more, at least


def prefix_rule(cmd: str) -> str | None:
    if len(cmd) < 19:
        return None
    for found in _TOKENISH.finditer(cmd):
        word = found.group(0)
        if not word.startswith(_BY_LENGTH):
            continue
        prefix = next(p for p in _BY_LENGTH if word.startswith(p))
        body = word[len(prefix) :].rstrip(".")
        if len(body) < 16:
            continue
        digits = sum(c.isdigit() for c in body)
        mixed = any(c.isupper() for c in body) and any(c.islower() for c in body)
        generated = digits >= 2 or (mixed and (digits or len(body) >= 20))  # not a word like `mode_enabled`
        if generated and shannon_entropy(body) >= ENTROPY_BITS:
            return "token-prefix"
    return None
