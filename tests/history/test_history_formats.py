"""History files as the shells write them, read entry by entry (calmd/history/formats.py): bash
with timestamps, zsh's extended format, its continuations and metafied bytes. The imports that
store them: tests/history/test_import.py, tests/history/test_history.py."""

from __future__ import annotations

from calmd.history.formats import detect_format, parse_history, unmetafy


def test_parse_bash_with_timestamps() -> None:
    raw = b"ls\n#1700000000\ngit status\n#1700000100\nmake -j2\n"
    assert list(parse_history(raw, "bash")) == [(None, "ls"), (1700000000.0, "git status"),
                                                 (1700000100.0, "make -j2")]  # fmt: skip
    assert detect_format(raw) == "bash"


def test_parse_zsh_extended_multiline_and_metafied() -> None:
    raw = (
        b": 1700000000:0;git status\n"
        b": 1700000005:3;for f in *; do\\\n  echo $f\\\ndone\n"
        b": 1700000009:0;echo caf\x83\xe3\n"  # metafied byte: 0x83 then 0xC3 ^ 0x20
        b": 1700000010:0;ls\n"
    )
    entries = list(parse_history(raw, "zsh"))
    assert detect_format(raw) == "zsh"
    assert entries[0] == (1700000000.0, "git status")
    assert entries[1] == (1700000005.0, "for f in *; do\n  echo $f\ndone")
    assert entries[2][1].encode("utf-8", "surrogateescape") == b"echo caf\xc3"
    assert entries[3] == (1700000010.0, "ls")
    assert unmetafy(b"a\x83\xa9b") == b"a\x89b"
