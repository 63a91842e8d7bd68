"""tests/tools.py: a missing program skips a test on a developer's machine and fails it in CI."""

from __future__ import annotations

import pytest

from tests.tools import need


def test_a_missing_program_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs calm-no-such-program"):
        need("sh", "calm-no-such-program")


def test_a_missing_program_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must not skip"):
        need("calm-no-such-program")


def test_present_programs_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    need("sh")  # would raise if it were treated as missing
