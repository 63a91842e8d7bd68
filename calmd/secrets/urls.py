"""Secrets in URLs and in `user:pass@host` forms without a scheme.

- userinfo: `scheme://user:pass@host`, `scheme://:pass@host`, and a userinfo that is only a
  token (`https://<40 hex>@git.example.com/...`; a plain user name is no secret);
- `user:pass@host` as database shells and `mysqlsh --uri` take it, with no scheme;
- the query: a value under a name that says secret, and a random-looking value under any name
  that does not say what it is (`?access=...`, `?k=...`; not `?v=`, `?id=`, `?list=`);
- the path: a random-looking segment after one that says key, token or hook (a webhook's token,
  `/with/key/...`, `/hooks/...`), or anywhere in a URL whose host says hook.
"""

from __future__ import annotations

import re
from urllib.parse import unquote as url_unquote

from calmd.secrets.formats import prefix_rule
from calmd.secrets.names import name_kind, name_words
from calmd.secrets.values import generated, is_placeholder, is_uuid, looks_random, shannon_entropy

# (a scheme starts where no scheme character precedes it: tried at every `a` of a long run of
# letters, it cost quadratic time, 5 s for 64 KiB)
URL_CREDENTIALS = re.compile(
    r"""(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://([^\s/:@'"]*):([^\s/@'"]+)@[^\s'"]"""
)
_FORMAT = re.compile(r"%(?:\(\w+\)s|\{\w*\}|-?[sdv])")  # a format's `%s`, `%(password)s`: no secret yet
_TOKEN_USERINFO = re.compile(r"""(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://([^\s/:@'"?#]{16,})@[^\s'"]""")
# `user:pass@host[:port][/db]`: a word that is no URL (no `://` before it)
_BARE_PAIR = re.compile(
    r"""(?<![\w.+/:@%-])([A-Za-z_][\w.\\-]{0,63}):([^\s/@'":\\\[\](){}<>|;&`]{1,128})@([A-Za-z0-9][\w.-]*)"""
)
_VERSION = re.compile(r"v?\d+(?:[.-]\d+)*(?:[.-]?[a-z]+\d*)?")
_NO_SCHEME_USERS = frozenset({"mailto", "sip", "sips", "xmpp", "tel", "urn", "news", "data", "git", "ssh"})
_URL_SAFE = re.compile(r"[A-Za-z0-9._~+/=-]+")  # what a key in a query is written with
QUERY_PARAM = re.compile(r"""[?&;]([A-Za-z_][A-Za-z0-9_.-]*)=([^&\s'"#]+)""")
_URL = re.compile(r"""(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://([^\s/'"?#]+)(/[^\s'"?#]*)?""")
# Query names that say what an identifier is (a video, a list, a page, a commit), or carry no
# secret (a page's size, a time): their values may look random.
_ID_NAMES = frozenset({"v", "id", "ids", "list", "ref", "rev", "sha", "commit", "hash", "digest", "uuid",
                       "guid", "q", "query", "search", "page", "t", "ts", "time", "s", "f", "from", "to",
                       "lang", "hl", "format", "name", "file", "filename", "path", "dir", "tag", "branch",
                       "version", "build", "run", "job", "pr", "issue", "item", "product", "video",
                       "playlist", "channel", "index", "start", "end", "limit", "offset", "sort", "order",
                       "utm", "fbclid", "gclid", "msclkid", "cache", "cb", "nonce", "state", "r", "src",
                       "dl", "raw", "download", "resize", "w", "h", "width", "height", "size", "type",
                       "mode", "view", "usp", "uid", "user", "username", "email", "pickcode", "key_id",
                       "keyid", "kid", "redirect", "redirect_uri", "callback", "return", "next", "url",
                       "uri", "client_id", "scope", "response_type", "share", "ab_channel", "feature",
                       "pp", "si", "igsh", "bvid"})  # fmt: skip
_SECRET_SEGMENTS = frozenset({"key", "keys", "token", "tokens", "secret", "secrets", "hook", "hooks",
                              "webhook", "webhooks", "apikey", "api-key", "auth", "bot", "trigger",
                              "incomingwebhook", "services", "callback", "notify", "push"})  # fmt: skip


def _url_credentials(text: str) -> str | None:
    for found in URL_CREDENTIALS.finditer(text):
        password = found.group(2)
        if (
            not password.startswith(("$", "{"))
            and not _FORMAT.match(password)
            and not is_placeholder(password)
        ):
            return "url-credentials"  # (`https://<user>:<token>@host` is documentation)
    for found in _TOKEN_USERINFO.finditer(text):
        user = url_unquote(found.group(1))
        if not user.startswith(("$", "{", "<")) and (_secret_looking(user) or prefix_rule(user)):
            return "url-credentials"  # a token for a user name: `https://<token>@github.com/...`
    return None


def _bare_pairs(text: str) -> str | None:
    for found in _BARE_PAIR.finditer(text):
        user, password, host = found.groups()
        if (
            user.lower() in _NO_SCHEME_USERS
            or password.startswith(("$", "{", "<"))
            or _FORMAT.match(password)
        ):
            continue
        if host.startswith(("sha256", "sha512", "sha1")) or password.isdigit() or is_placeholder(password):
            continue  # `image:tag@sha256:...`; `host:5432@...`
        if _VERSION.fullmatch(password):
            continue  # a version: `node:20.1@...`, `pkg:1.2.3@...`
        if password in ("latest", "stable", "main", "master", "edge", "lts", "alpine", "slim"):
            continue
        return "url-credentials"
    return None


def _query(text: str) -> str | None:
    for found in QUERY_PARAM.finditer(text):
        name, raw = found.group(1), found.group(2)
        value = url_unquote(raw).strip("\\")
        if raw.startswith(("$", "{")) or _FORMAT.match(raw) or is_placeholder(value):
            continue
        if value.startswith(("/", "~/")) and value.count("/") >= 2:
            continue  # a key's file: `nix copy --to 's3://cache?secret-key=/etc/nix/key.sec'`
        kind = name_kind(name, bare_key=True)
        if kind and (kind == "password" or looks_random(value)):
            return "url-query-secret"
        words = name_words(name)
        unnamed = kind is None and words and words[-1] not in _ID_NAMES and words[0] not in _ID_NAMES
        if unnamed and _URL_SAFE.fullmatch(value) and not is_uuid(value) and _secret_looking(value):
            return "url-query-secret"  # a key under a name that does not say so
    return None


def _secret_looking(value: str, mixed_len: int = 20) -> bool:
    """Random enough to be a key where a key may stand: 20+ characters of mixed-case base62
    that does not read as words or has the entropy of random text, or 24+ of hex or base36."""
    core = value.strip("=")
    mixed = core.lower() != core and core.upper() != core
    if mixed and len(core) >= mixed_len and core.isalnum() and shannon_entropy(core) >= 3.8:
        return True
    return generated(core, min_len=mixed_len if mixed else 24)


def _path_tokens(text: str) -> str | None:
    for found in _URL.finditer(text):
        host, path = found.group(1).lower(), found.group(2)
        if not path:
            continue
        segments = [url_unquote(s) for s in path.split("/") if s]
        hooked = "hook" in host
        for k, segment in enumerate(segments):
            before = {s.lower() for s in segments[max(0, k - 3) : k]}
            if not (hooked or before & _SECRET_SEGMENTS) or is_uuid(segment) or segment.isdigit():
                continue
            if "." in segment and k == len(segments) - 1:
                continue  # a file name: `.../hooks/deploy.sh`
            if _secret_looking(segment, mixed_len=16):
                return "url-path-token"
    return None


# Schemes whose URLs name public things (pages, repositories, buckets, content ids, images by
# digest, extensions, apps' deep links) or carry a credential only in their userinfo (databases,
# mail): their random-looking segments are ids. Any other scheme (`discord://`, `tgram://`,
# `pover://`, `gotify://`: a notification service's, as apprise and shoutrrr spell them) is a
# service's address whose segments are the account's tokens.
_PUBLIC_SCHEMES = frozenset({
    "http", "https", "ftp", "ftps", "ws", "wss", "file", "git", "ssh", "sftp", "scp", "rsync", "svn", "hg",
    "bzr", "s3", "s3a", "s3n", "gs", "gcs", "az", "abfs", "abfss", "wasb", "wasbs", "adl", "hdfs", "webhdfs",
    "ipfs", "ipns", "ar", "dat", "hyper", "magnet", "bzz", "docker", "docker-image", "docker-archive",
    "docker-daemon", "oci", "oci-archive", "containers-storage", "nix", "chrome", "chrome-extension",
    "moz-extension", "extension", "edge", "about", "vscode", "vscode-insiders", "cursor", "jetbrains", "idea",
    "smb", "cifs", "nfs", "afp", "dav", "davs", "webdav", "rtsp", "rtmp", "rtmps", "srt", "udp", "tcp",
    "tls", "unix", "ldap", "ldaps", "steam", "spotify", "zoommtg", "zoomus", "notion", "obsidian", "things",
    "bear", "message", "x-devonthink-item", "at", "did", "npm", "jar", "zip", "data", "blob", "content",
    "android-app", "intent", "market", "itms-apps", "itms-services", "geo", "tg", "github-mac",
    "x-github-client", "sourcetree", "gitkraken", "github-windows", "mongodb", "mongodb+srv", "postgres",
    "postgresql", "mysql", "mariadb", "redis", "rediss", "amqp", "amqps", "mqtt", "mqtts", "kafka", "nats",
    "sqlite", "jdbc", "gopher", "irc", "ircs", "xmpp", "sip", "news", "nntp", "telnet", "vnc", "rdp",
    "spice", "qemu", "qemu+ssh", "lxd", "consul", "etcd", "zk", "tor", "ipp", "ipps", "smtp", "smtps",
    "imap", "imaps", "pop3", "pop3s", "mailto", "gemini", "dns", "stun", "turn", "webcal", "feed", "rss",
    "bitcoin", "ethereum", "lightning", "nostr", "matrix", "slack", "discord", "msteams", "element",
    "onenote", "evernote", "figma", "raycast", "alfred", "shortcuts", "x-apple-reminderkit", "fb", "twitter",
})  # fmt: skip
# Apprise's and shoutrrr's spellings of services also named by deep links (`slack://channel?team=`,
# `discord://discord.com/channels/ID/ID`, `msteams://`, `matrix://`): their paths hold tokens
# when a segment is one; a deep link's ids are in its query or are digits.
_SERVICE_SCHEMES = frozenset({"slack", "discord", "msteams", "matrix", "element"})
_URL_SCHEME = re.compile(r"""(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*)://([^\s'"?#]+)""")
_ID_SEGMENTS = frozenset({"commit", "commits", "tree", "blob", "rev", "sha", "tag", "tags", "releases",
                          "channels", "items", "item", "id"})  # fmt: skip


def _service_tokens(text: str) -> str | None:
    """A service's URL in a scheme of its own (`discord://ID/TOKEN`, `tgram://BOT:TOKEN/CHAT`,
    `slack://T/B/X`, `pbul://TOKEN`, `gotify://host/TOKEN`): a random-looking piece of its host
    or path is the account's token. Digits, UUIDs, words, a digest (`@sha256:...`) are ids."""
    for found in _URL_SCHEME.finditer(text):
        scheme = found.group(1).lower()
        if scheme not in _SERVICE_SCHEMES and all(part in _PUBLIC_SCHEMES for part in scheme.split("+")):
            continue  # (and a compound of public ones: pip's `git+https://...@COMMIT`, `svn+ssh://`)
        pieces = [url_unquote(p) for p in re.split(r"[/@:]", found.group(2)) if p]
        for k, piece in enumerate(pieces[:16]):
            if (k and pieces[k - 1].lower() in _ID_SEGMENTS) or piece.startswith(("sha256", "sha512")):
                continue
            if piece.startswith(("$", "{", "<", "%")) or is_uuid(piece) or piece.isdigit():
                continue
            labels = piece.split(".") if "." in piece else [piece]
            if any(_service_token(label.lstrip("+#-")) for label in labels):
                return "url-service-token"
    return None


_HEX_TOKEN = re.compile(r"[0-9a-fA-F]{32,}")


def _service_token(label: str) -> bool:
    """A service's token: random-looking, or 32+ hex digits (an API key in hex; a service's
    address holds no commit hash or digest)."""
    if _HEX_TOKEN.fullmatch(label):
        return shannon_entropy(label) >= 3.0
    return _secret_looking(label, mixed_len=16)


URL_HINT = re.compile(r"://|@")


def url_rule(text: str) -> str | None:
    """(Only for a line holding `://` or `@`.)"""
    if "@" in text:
        rule = _bare_pairs(text)
        if rule:
            return rule
    if "://" not in text:
        return None
    return _url_credentials(text) or _query(text) or _path_tokens(text) or _service_tokens(text)
