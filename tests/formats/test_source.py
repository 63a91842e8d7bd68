"""The training-source text format: the spec's three blocks, round trips, and errors with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmd.errors import FormatError
from calmd.formats.source import format_example, format_text, iter_file, parse_text, write_text
from calmd.formats.tokenizer import (
    DEFAULT_SHELL_TEMPLATE,
    Example,
    HistoryEntry,
    atn_position,
    build_sequence,
    parse_sequence,
    parse_template,
)

# The three example blocks of the CALM dataset specification, verbatim (docs/formats.md).
SPEC_BLOCKS = """\
<CWD>/home/user/lilush
<GIT>main
<HIST>git diff --stat<EXIT>0
<HIST>git status<EXIT>0
<COMP>commit<NEXT>checkout<NEXT>cherry-pick<NEXT>clone
<CMD>git commit -m "fix tokenizer"

<CWD>/var/log
<CMD>files_matching log kat -m

<CWD>/home/user
<HIST>make -C src/litls<EXIT>0
<HIST>make -C src/litls<EXIT>2
<CMD>make -C src/litls clean && make -C src/litls
"""


def ids(text: str) -> list[int]:
    return list(text.encode())


def test_spec_blocks_become_expected_sequences() -> None:
    examples = parse_text(SPEC_BLOCKS)
    seqs = [build_sequence(DEFAULT_SHELL_TEMPLATE, e.context(), training=True) for e in examples]
    first = (
        [257, 260, *ids("/home/user/lilush"), 269, 261, *ids("main"), 269]
        + [262, *ids("git diff --stat"), 263, 48, 269, 262, *ids("git status"), 263, 48, 269]
        + [266, *ids("commit"), 268, *ids("checkout"), 268, *ids("cherry-pick"), 268, *ids("clone"), 269]
        + [259, 264, *ids('git commit -m "fix tokenizer"'), 258]
    )
    second = [257, 260, *ids("/var/log"), 269, 259, 264, *ids("files_matching log kat -m"), 258]
    third = (
        [257, 260, *ids("/home/user"), 269]
        + [262, *ids("make -C src/litls"), 263, 48, 269, 262, *ids("make -C src/litls"), 263, 50, 269]
        + [259, 264, *ids("make -C src/litls clean && make -C src/litls"), 258]
    )
    assert [s.tolist() for s in seqs] == [first, second, third]
    assert [atn_position(s) for s in seqs] == [first.index(259), 11, third.index(259)]
    assert [atn_position(s) for s in seqs] == [94, 11, 55]


def test_text_sequences_text_round_trip() -> None:
    examples = parse_text(SPEC_BLOCKS)
    back = [
        parse_sequence(build_sequence(DEFAULT_SHELL_TEMPLATE, e.context(), training=True)) for e in examples
    ]
    assert back == examples
    assert format_text(back) == SPEC_BLOCKS


def test_file_round_trip_and_blank_line_variants(tmp_path: Path) -> None:
    messy = "\n\n" + SPEC_BLOCKS.replace("\n\n", "\n  \n\n").replace("\n", "\r\n") + "\n\n"
    (tmp_path / "messy.txt").write_bytes(messy.encode())
    examples = list(iter_file(tmp_path / "messy.txt"))
    assert examples == parse_text(SPEC_BLOCKS)
    write_text(tmp_path / "clean.txt", examples)
    assert (tmp_path / "clean.txt").read_text() == SPEC_BLOCKS


def test_trailing_spaces_and_negative_exit_kept() -> None:
    (ex,) = parse_text("<HIST>false <EXIT>-1\n<HIST>ls\n<CMD>echo hi  \n")
    assert ex.fields["history"] == [HistoryEntry("false ", -1), HistoryEntry("ls", None)]
    assert ex.cmd == "echo hi  "


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("<CWD>/x\n<FOO>y\n<CMD>z\n", 2, "unknown frame <FOO>"),
        ("<CWD>/x\nls -la\n", 2, "expected a line starting with a frame name"),
        ("<CMD>a\n\n<CWD>/x\n<WORD>w\n<CMD>b\n", 4, "frame <WORD> is not part of the template"),
        ("<CWD>/x\n<GIT>main\n", 1, "has no <CMD> line"),
        ("<CMD>a\n<CMD>b\n", 2, "a second <CMD>"),
        ("<CWD>/a\n<CWD>/b\n<CMD>c\n", 2, "<CWD> given twice"),
        ("<HIST>ls<EXIT>zero\n<CMD>c\n", 1, "<EXIT> must be followed by an integer"),
        ("<HIST>ls<NEXT>x\n<CMD>c\n", 1, "holds a frame marker"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = tmp_path / "train.txt"
    path.write_text(text)
    with pytest.raises(FormatError, match=message) as info:
        list(iter_file(path))
    assert info.value.field == f"line {line}"
    assert str(info.value).startswith(f"{path}: line {line}: ")


def test_custom_template_maps_frames_to_its_fields() -> None:
    tpl = parse_template("BOS;QUERY:question;ATN;CMD:input")
    (ex,) = parse_text("<QUERY>what port does redis use\n<CMD>echo 6379\n", tpl)
    assert ex.fields == {"question": "what port does redis use"}
    with pytest.raises(FormatError, match="not part of the template"):
        parse_text("<CWD>/x\n<CMD>y\n", tpl)


def test_writer_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError, match="line break"):
        format_example(Example({}, "echo a\necho b"))
    with pytest.raises(ValueError, match="<NEXT>"):
        format_example(Example({"completions": ["a<NEXT>b"]}, "x"))
    with pytest.raises(ValueError, match="<EXIT>"):
        format_example(Example({"history": [HistoryEntry("a<EXIT>1", 0)]}, "x"))


line_text = st.text(
    st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20
).filter(lambda s: "<" not in s)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.builds(
            lambda cwd, git, hist, comps, env, cmd: Example(
                {
                    k: v
                    for k, v in {
                        "cwd": cwd,
                        "git": git,
                        "history": hist,
                        "completions": comps,
                        "env": env,
                    }.items()
                    if v
                },
                cmd,
            ),
            line_text.filter(lambda s: s.strip() != ""),
            line_text.filter(lambda s: s.strip() != ""),
            st.lists(
                st.builds(HistoryEntry, line_text, st.one_of(st.none(), st.integers(-3, 255))), max_size=4
            ),
            st.lists(line_text, min_size=2, max_size=4),
            line_text.filter(lambda s: s.strip() != ""),
            line_text,
        ),
        max_size=5,
    )
)
def test_round_trip_property(examples: list[Example]) -> None:
    text = format_text(examples)
    parsed = parse_text(text)
    assert parsed == examples
    seqs = [build_sequence(DEFAULT_SHELL_TEMPLATE, e.context(), training=True, l_max=None) for e in parsed]
    assert [parse_sequence(s) for s in seqs] == examples
