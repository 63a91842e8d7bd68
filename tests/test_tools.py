"""tests/support/tools.py: a missing program skips a test on a developer's machine and fails it in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tools import need, need_root, shared_data


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


def test_the_shared_data_is_found_or_its_absence_fails_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "histories" / "users").mkdir(parents=True)
    monkeypatch.setenv("CALM_SHARED_DATA", str(tmp_path))
    assert shared_data("histories", "users") == tmp_path / "histories" / "users"
    monkeypatch.setattr("tests.support.tools.SHARED_DATA_PLACES", ())
    monkeypatch.delenv("CALM_SHARED_DATA")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs the shared data"):
        shared_data("tldr")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must not skip"):
        shared_data("tldr")


def test_root_only_tests_fail_in_ci_when_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.getuid", lambda: 1000)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root to mount"):
        need_root("to mount")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI runs as root"):
        need_root("to mount")
    monkeypatch.setattr("os.getuid", lambda: 0)
    need_root("to mount")  # root: nothing to say
