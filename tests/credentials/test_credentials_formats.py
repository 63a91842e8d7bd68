"""Tokens services issue (calmd/secrets/formats.py): a known prefix at any length."""

from __future__ import annotations

import random
import string

import pytest

from calmd.secrets import find_secret
from calmd.secrets.formats import SHORTEST_TOKEN, TOKEN_FORMATS
from tests.credentials.forms import RNG_SEED, random_word

PREFIXES = ["github_pat_", "ghp_", "glpat-", "sk-ant-api03-", "hf_", "npm_", "dckr_pat_"]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_known_token_prefixes_at_any_length(prefix: str) -> None:
    rng = random.Random(RNG_SEED)
    alphabet = string.ascii_letters + string.digits
    for length in (16, 17, 23, 29, 41, 64, 93, 130):
        body = random_word(rng, alphabet, length, length)
        if not any(c.isdigit() for c in body):
            body = body[:-2] + "42"
        assert find_secret(f"export TOKEN_FOR_CI={prefix}{body}") is not None, (prefix, length)
        assert find_secret(f"git push https://x:{prefix}{body}@git.example.com/r.git") is not None


def test_a_token_inside_a_longer_word_is_not_the_token() -> None:
    token = "ghp_" + "a1B2c3D4e5f6" * 3
    assert find_secret(f"echo {token}") == "github-token"
    assert find_secret(f"echo x{token}") != "github-token"
    assert find_secret("ls AKIAUJZDEGXDNCF32EPF") == "aws-access-key-id"
    assert find_secret("ls AKIAUJZDEGXDNCF32EPFX") is None  # 21 characters: not an access key id


def test_no_token_format_matches_fewer_characters_than_the_rule_skips() -> None:
    """token_rule skips a line shorter than SHORTEST_TOKEN (half the lines of a history are): no
    format may match one."""
    from re import _parser  # the widths of a pattern's matches

    assert min(_parser.parse(pattern).getwidth()[0] for _, _, pattern in TOKEN_FORMATS) == SHORTEST_TOKEN
