"""The tokenizer against the spec's golden cases, the template rules (docs/formats.md), and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmd.errors import SequenceTooLong, TemplateError, TokenError
from calmd.formats.tokenizer import (
    DEFAULT_SHELL_TEMPLATE,
    DEFAULT_SHELL_TEMPLATE_SPEC,
    SPECIAL_IDS,
    SPECIAL_NAMES,
    VOCAB_SIZE,
    HistoryEntry,
    Special,
    StopMatcher,
    apply_stop_conditions,
    atn_position,
    build_sequence,
    decode,
    decode_text,
    encode,
    frame,
    hist_frame,
    list_frame,
    parse_sequence,
    parse_stop_conditions,
    parse_template,
    special_id,
    special_name,
    to_bytes,
)

B = list  # readability: B(b"abc") -> [97, 98, 99]


def ids(text: str) -> list[int]:
    return list(text.encode())


# --------------------------------------------------------------------------- vocabulary


def test_vocabulary_table_matches_spec() -> None:
    names = "PAD BOS EOS ATN CWD GIT HIST EXIT CMD ENV COMP QUERY NEXT END WORD POS NOTE IPA DEF QUOTE BY REF"
    assert [SPECIAL_NAMES[i] for i in range(256, 278)] == names.split()
    assert VOCAB_SIZE == 320
    for name, token in SPECIAL_IDS.items():
        assert special_name(token) == name
        assert special_id(name) == token == special_id(f"<{name}>")


def test_special_lookups_reject_unknown() -> None:
    with pytest.raises(TokenError, match="not a special token"):
        special_name(255)
    with pytest.raises(TokenError, match="unknown special token name"):
        special_id("FOO")


# --------------------------------------------------------------------------- golden cases from the spec


def test_tokenize_golden_git_commit() -> None:
    tokens = encode("git commit -m fix")
    assert tokens.dtype == np.uint16
    assert tokens[:6].tolist() == [103, 105, 116, 32, 99, 111]
    assert tokens.tolist() == ids("git commit -m fix")


def test_cwd_frame_golden() -> None:
    assert frame(Special.CWD, "/home/user").tolist() == [260, *ids("/home/user"), 269]


def test_hist_exit_and_comp_next_frames() -> None:
    assert hist_frame("git diff --stat", 0).tolist() == [262, *ids("git diff --stat"), 263, 48, 269]
    assert hist_frame("make", 127).tolist() == [262, *ids("make"), 263, 49, 50, 55, 269]
    assert hist_frame("ls", None).tolist() == [262, *ids("ls"), 269]
    comp = list_frame(Special.COMP, ["commit", "checkout", "cherry-pick", "clone"])
    assert comp.tolist() == [266, *ids("commit"), 268, *ids("checkout"), 268, *ids("cherry-pick"), 268,
                             *ids("clone"), 269]  # fmt: skip


SPEC_CTX = {
    "cwd": "/home/user/lilush",
    "git": "main",
    "history": [{"cmd": "git diff --stat", "exit": 0}, {"cmd": "git status", "exit": 0}],
    "completions": ["commit", "checkout", "cherry-pick", "clone"],
    "env": "venv:myproject",
    "input": "git com",
}


def test_shell_context_window_example() -> None:
    """The spec's "Shell Context Window Format" example, token by token."""
    expected = (
        [257]
        + [260, *ids("/home/user/lilush"), 269]
        + [261, *ids("main"), 269]
        + [262, *ids("git diff --stat"), 263, *ids("0"), 269]
        + [262, *ids("git status"), 263, *ids("0"), 269]
        + [266, *ids("commit"), 268, *ids("checkout"), 268, *ids("cherry-pick"), 268, *ids("clone"), 269]
        + [265, *ids("venv:myproject"), 269]
        + [259]
        + [264, *ids("git com")]
    )
    seq = build_sequence(DEFAULT_SHELL_TEMPLATE, SPEC_CTX)
    assert seq.tolist() == expected
    training = build_sequence(DEFAULT_SHELL_TEMPLATE_SPEC, SPEC_CTX, training=True)
    assert training.tolist() == [*expected, 258]
    assert atn_position(training) == expected.index(259)


def test_minimal_template_with_only_input() -> None:
    assert build_sequence(DEFAULT_SHELL_TEMPLATE, {"input": "git com"}).tolist() == [
        257,
        259,
        264,
        *ids("git com"),
    ]


# --------------------------------------------------------------------------- encode / decode


def test_decode_skips_specials_and_rejects_bad_ids() -> None:
    assert decode([257, 260, 104, 105, 269, 259]) == b"hi"
    with pytest.raises(TokenError, match=r"300 at position 1 is reserved"):
        decode([104, 300])
    with pytest.raises(TokenError, match=r"320 at position 0 is out of range"):
        decode([320])
    with pytest.raises(TokenError, match=r"-1 at position 2 is out of range"):
        decode(np.array([1, 2, -1]))
    with pytest.raises(TokenError, match="integers"):
        decode(np.array([1.5]))


@given(st.binary(max_size=512))
def test_encode_decode_round_trip_any_bytes(raw: bytes) -> None:
    tokens = encode(raw)
    assert tokens.dtype == np.uint16 and tokens.size == len(raw)
    assert decode(tokens) == raw
    # str path: invalid UTF-8 survives as surrogate escapes
    text = raw.decode("utf-8", "surrogateescape")
    assert encode(text).tolist() == tokens.tolist()
    assert decode_text(tokens) == text


def test_c0_controls_and_invalid_utf8() -> None:
    raw = bytes(range(32)) + b"\xff\xfe\xc3"
    assert encode(raw).tolist() == list(raw)
    assert decode(encode(raw)) == raw


# --------------------------------------------------------------------------- templates


def test_parse_template_round_trip_and_errors() -> None:
    assert str(parse_template(DEFAULT_SHELL_TEMPLATE_SPEC)) == DEFAULT_SHELL_TEMPLATE_SPEC
    bad = {
        "": "empty",
        "BOS;FOO:x;ATN;CMD:input": "unknown token name 'FOO'",
        "BOS;CMD:input": "ATN must appear exactly once",
        "BOS;ATN;ATN;CMD:input": "ATN must appear exactly once",
        "BOS;ATN;CMD:input;CWD:cwd": "CMD must be the last item",
        "BOS;CWD;ATN;CMD:input": "frame CWD needs a field",
        "BOS;ATN:x;CMD:input": "ATN is not a frame token",
        "BOS;CWD:cwd;GIT:cwd;ATN;CMD:input": "used twice",
        "BOS;CWD:9x;ATN;CMD:input": "bad field name",
    }
    for spec, message in bad.items():
        with pytest.raises(TemplateError, match=message):
            parse_template(spec)


def test_template_order_is_followed_not_hard_coded() -> None:
    tpl = parse_template("BOS;ENV:env;CWD:cwd;ATN;CMD:input")
    seq = build_sequence(tpl, {"cwd": "/a", "env": "e", "git": "ignored", "input": "x"})
    assert seq.tolist() == [257, 265, *ids("e"), 269, 260, *ids("/a"), 269, 259, 264, *ids("x")]


def test_empty_fields_are_omitted() -> None:
    seq = build_sequence(DEFAULT_SHELL_TEMPLATE, {"cwd": "", "git": None, "history": [], "completions": [],
                                                   "input": ""})  # fmt: skip
    assert seq.tolist() == [257, 259, 264]


def test_history_cap_keeps_newest_fifteen() -> None:
    history = [{"cmd": f"c{i}", "exit": i} for i in range(20)]
    example = parse_sequence(build_sequence(DEFAULT_SHELL_TEMPLATE, {"history": history, "input": ""}))
    assert [e.cmd for e in example.fields["history"]] == [f"c{i}" for i in range(5, 20)]


def test_completion_cap_keeps_first_fifteen() -> None:
    comps = [f"o{i}" for i in range(20)]
    example = parse_sequence(build_sequence(DEFAULT_SHELL_TEMPLATE, {"completions": comps, "input": ""}))
    assert example.fields["completions"] == comps[:15]


def test_history_accepts_strings_and_entries_and_rejects_junk() -> None:
    seq = build_sequence(DEFAULT_SHELL_TEMPLATE, {"history": ["ls", HistoryEntry("pwd", 1)], "input": ""})
    assert parse_sequence(seq).fields["history"] == [HistoryEntry("ls"), HistoryEntry("pwd", 1)]
    with pytest.raises(TemplateError, match="history"):
        build_sequence(DEFAULT_SHELL_TEMPLATE, {"history": "ls", "input": ""})
    with pytest.raises(TemplateError, match="exit must be an integer"):
        build_sequence(DEFAULT_SHELL_TEMPLATE, {"history": [{"cmd": "ls", "exit": "0"}], "input": ""})
    with pytest.raises(TemplateError, match="must be a string"):
        build_sequence(DEFAULT_SHELL_TEMPLATE, {"cwd": 5, "input": ""})


# --------------------------------------------------------------------------- l_max truncation


def _len(ctx: dict, l_max: int | None = None, training: bool = False) -> int:
    return build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, l_max=l_max, training=training).size


def test_truncation_drops_oldest_history_first() -> None:
    ctx = dict(SPEC_CTX, history=[{"cmd": f"command number {i}", "exit": 0} for i in range(10)])
    full = _len(ctx, None)
    seq = build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, l_max=full - 1)
    kept = parse_sequence(seq).fields
    assert [e.cmd for e in kept["history"]] == [f"command number {i}" for i in range(1, 10)]
    assert kept["completions"] == SPEC_CTX["completions"]  # untouched while history suffices
    assert seq.size <= full - 1


def test_truncation_order_history_then_completions_then_cwd_then_rest() -> None:
    ctx = dict(SPEC_CTX, cwd="/home/user/" + "deep/" * 10 + "dir")
    no_hist = _len(dict(ctx, history=[]))
    # just under: all history gone, completions cut from the end
    ex = parse_sequence(build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, l_max=no_hist - 3))
    assert "history" not in ex.fields
    assert ex.fields["completions"] == ["commit", "checkout", "cherry-pick"]
    # no completions left: the cwd loses its left part, keeps its right part
    no_comp = _len(dict(ctx, history=[], completions=[]))
    ex = parse_sequence(build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, l_max=no_comp - 10))
    assert "completions" not in ex.fields
    assert ctx["cwd"].endswith(ex.fields["cwd"]) and len(ex.fields["cwd"]) == len(ctx["cwd"]) - 10
    assert ex.fields["git"] == "main" and ex.fields["env"] == "venv:myproject"
    # smaller still: cwd gone, then env (last optional frame) before git
    minimal = _len({"input": ctx["input"], "git": "main"})
    ex = parse_sequence(build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, l_max=minimal))
    assert ex.fields == {"git": "main"} and ex.cmd == "git com"


def test_truncation_never_drops_the_command() -> None:
    long_input = "x" * 50
    seq = build_sequence(DEFAULT_SHELL_TEMPLATE, dict(SPEC_CTX, input=long_input), l_max=20)
    assert seq.size == 20
    assert seq[:3].tolist() == [257, 259, 264]
    assert decode(seq) == b"x" * 17  # newest bytes of the input kept
    with pytest.raises(SequenceTooLong):
        build_sequence(DEFAULT_SHELL_TEMPLATE, dict(SPEC_CTX, input=long_input), l_max=20, training=True)


def test_cwd_truncation_keeps_utf8_whole() -> None:
    ctx = {"cwd": "/home/ü" * 4, "input": "ls"}
    full = _len(ctx)
    for cut in range(1, 20):
        ex = parse_sequence(build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, l_max=full - cut))
        cwd = ex.fields.get("cwd", "")
        cwd.encode("utf-8")  # no surrogate escapes: a whole character boundary
        assert ctx["cwd"].endswith(cwd)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.text(max_size=30), st.one_of(st.none(), st.integers(-5, 300))), max_size=20),
    st.lists(st.text(min_size=1, max_size=12), max_size=20),
    st.text(max_size=60),
    st.text(max_size=40),
    st.integers(8, 400),
)
def test_truncation_properties(history, comps, cwd, cmd, l_max) -> None:  # type: ignore[no-untyped-def]
    ctx = {"history": [{"cmd": c, "exit": e} for c, e in history], "completions": comps, "cwd": cwd,
           "git": "main", "input": cmd}  # fmt: skip
    seq = build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, l_max=l_max)
    assert seq.size <= l_max
    ex = parse_sequence(seq)
    full_cmd = cmd.encode("utf-8", "surrogateescape")
    assert full_cmd.endswith(ex.cmd.encode("utf-8", "surrogateescape"))
    kept = [(e.cmd, e.exit) for e in ex.fields.get("history", [])]
    assert kept == [(c, e) for c, e in history][-15:][len(history[-15:]) - len(kept) :]  # a newest suffix
    assert ex.fields.get("completions", []) == comps[:15][: len(ex.fields.get("completions", []))]
    if _len(ctx) <= l_max:
        assert seq.tolist() == build_sequence(DEFAULT_SHELL_TEMPLATE, ctx, l_max=None).tolist()


# --------------------------------------------------------------------------- parse_sequence


def test_parse_sequence_rejects_malformed() -> None:
    with pytest.raises(TokenError, match="not closed"):
        parse_sequence([257, 260, 97])
    with pytest.raises(TokenError, match="unexpected <ATN> inside a frame"):
        parse_sequence([257, 260, 97, 259])
    with pytest.raises(TokenError, match="outside any frame"):
        parse_sequence([97])
    with pytest.raises(TokenError, match="not a frame of the template"):
        parse_sequence([270, 97, 269])


# --------------------------------------------------------------------------- stop conditions


SHELL_STOPS = parse_stop_conditions("| ; && ||")


def test_parse_stop_conditions() -> None:
    assert SHELL_STOPS.patterns == (b"|", b";", b"&&", b"||")
    assert str(SHELL_STOPS) == "| ; && ||"
    assert parse_stop_conditions("  ").patterns == ()


def test_stop_single_byte() -> None:
    assert apply_stop_conditions(ids("ls -la | grep x"), SHELL_STOPS) == b"ls -la "
    assert apply_stop_conditions(ids("cd /; ls"), SHELL_STOPS) == b"cd /"


def test_stop_multi_byte_rolls_back_first_byte() -> None:
    matcher = StopMatcher(SHELL_STOPS)
    for t in ids("make &"):
        assert not matcher.feed(t)
    assert bytes(matcher.output) == b"make &"  # a lone & is a background job, not a stop
    assert matcher.feed(ord("&"))
    assert bytes(matcher.output) == b"make "  # the first & rolled back


def test_eos_and_pad_always_stop_even_raw() -> None:
    for raw in (False, True):
        assert apply_stop_conditions([*ids("ls"), Special.EOS, *ids("x")], SHELL_STOPS, raw=raw) == b"ls"
        assert apply_stop_conditions([*ids("ls"), Special.PAD], SHELL_STOPS, raw=raw) == b"ls"
    assert apply_stop_conditions(ids("a | b && c"), SHELL_STOPS, raw=True) == b"a | b && c"


def test_special_token_breaks_byte_adjacency() -> None:
    assert apply_stop_conditions([38, Special.NEXT, 38, 97], SHELL_STOPS) == b"&&a"


def reference_stop(tokens: list[int], patterns: tuple[bytes, ...]) -> bytes:
    """Brute force: find the first position where EOS/PAD appears or some pattern ends within a run
    of bytes; output every byte before it, minus the pattern."""
    out = bytearray()
    run_start = 0  # index in `out` where the current byte run began
    for tok in tokens:
        if tok in (Special.EOS, Special.PAD):
            return bytes(out)
        if tok >= 256:
            run_start = len(out)
            continue
        out.append(tok)
        run = bytes(out[run_start:])
        hits = [p for p in patterns if run.endswith(p)]
        if hits:
            first = next(p for p in patterns if p in hits)
            return bytes(out[: len(out) - len(first)])
    return bytes(out)


@settings(max_examples=300)
@given(
    st.lists(st.one_of(st.sampled_from(ids("&|;ab ")), st.sampled_from([256, 258, 268])), max_size=40),
    st.lists(
        st.binary(min_size=1, max_size=3).filter(lambda b: b.strip() == b and b" " not in b),
        min_size=0,
        max_size=4,
    ),
)
def test_stop_matcher_matches_brute_force(tokens: list[int], patterns: list[bytes]) -> None:
    conds = parse_stop_conditions(" ".join(p.decode("latin-1") for p in patterns))
    conds_patterns = tuple(p.decode("latin-1").encode("utf-8") for p in patterns)
    expected = reference_stop(tokens, tuple(dict.fromkeys(conds_patterns)))
    assert apply_stop_conditions(tokens, conds) == expected


@settings(max_examples=300)
@given(
    st.lists(st.one_of(st.sampled_from(ids("&|;ab ")), st.sampled_from([256, 258, 268])), max_size=40),
    st.lists(st.binary(min_size=1, max_size=3).filter(lambda b: b" " not in b), min_size=0, max_size=4),
)
def test_stops_at_foretells_feed_without_feeding(tokens: list[int], patterns: list[bytes]) -> None:
    """The beam search asks `stops_at` before forking a matcher it may not keep."""
    matcher = StopMatcher(parse_stop_conditions(" ".join(p.decode("latin-1") for p in patterns)))
    for token in tokens:
        before = (bytes(matcher.output), matcher._run, matcher.stopped)
        foretold = matcher.stops_at(token)
        assert (bytes(matcher.output), matcher._run, matcher.stopped) == before
        assert matcher.feed(token) == foretold
        if foretold:
            break


def test_stop_conditions_are_separated_by_spaces_only() -> None:
    """The specification's metadata line 3 is space-separated: a pattern may hold the other
    whitespace characters (the property test above found \\x1c and \\xa0 split apart)."""
    conds = parse_stop_conditions("a\x1cb |  c\xa0d \x85")
    assert conds.patterns == (to_bytes("a\x1cb"), b"|", to_bytes("c\xa0d"), to_bytes("\x85"))
