"""CWGT v5: the header byte by byte, round trips with and without EWC, and every rejection."""

from __future__ import annotations

import os
import stat
import struct
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calmd.errors import FormatError
from calmd.formats.cwgt import (
    FLAG_HAS_EWC,
    FLAG_TIED,
    MAX_CWGT_BYTES,
    CwgtHeader,
    Metadata,
    read_cwgt,
    split_flat,
    write_cwgt,
)
from tests.support.waiting import HANG_S

META = Metadata(
    "shell", "BOS;CWD:cwd;GIT:git;HIST:history;COMP:completions;ENV:env;ATN;CMD:input", "| ; && ||"
)
HEADER = CwgtHeader(
    d_model=128, n_layers=4, ffn_expand=2, expand=2, d_state=16, d_conv=4, dt_rank=8, param_count=6,
    def_temperature=800, def_top_k=40, def_top_p=950, def_min_p=50, def_max_tokens=64, def_candidates=5,
)  # fmt: skip
ARRAYS = [("a", np.arange(4, dtype=np.float32).reshape(2, 2)), ("b", np.array([0.5, -2.0], dtype=np.float32))]


def test_header_field_by_field() -> None:
    meta_size = len(META.encode())
    expected = b"".join(
        [
            b"CWGT",  # 0 magic
            (5).to_bytes(2, "little"),  # 4 arch_version
            (1).to_bytes(2, "little"),  # 6 flags: tied
            (320).to_bytes(2, "little"),  # 8 vocab_size
            (128).to_bytes(2, "little"),  # 10 d_model
            bytes([4, 2, 2, 16]),  # 12 n_layers, 13 ffn_expand, 14 expand, 15 d_state
            (768).to_bytes(2, "little"),  # 16 l_max
            (6).to_bytes(4, "little"),  # 18 param_count
            (800).to_bytes(2, "little"),  # 22 def_temperature
            (40).to_bytes(2, "little"),  # 24 def_top_k
            (950).to_bytes(2, "little"),  # 26 def_top_p
            (50).to_bytes(2, "little"),  # 28 def_min_p
            (64).to_bytes(2, "little"),  # 30 def_max_tokens
            bytes([5, 4]),  # 32 def_candidates, 33 d_conv
            meta_size.to_bytes(4, "little"),  # 34 meta_size
            bytes([8]),  # 38 dt_rank
            bytes(9),  # 39-47 reserved
        ]
    )
    assert len(expected) == 48
    assert replace(HEADER, meta_size=meta_size).pack() == expected
    assert CwgtHeader.unpack(expected) == replace(HEADER, meta_size=meta_size)


def test_file_layout_byte_for_byte(tmp_path: Path) -> None:
    path = write_cwgt(tmp_path / "m.cwgt", HEADER, ARRAYS, META)
    raw = path.read_bytes()
    meta = META.encode()
    assert (
        meta == b"shell\nBOS;CWD:cwd;GIT:git;HIST:history;COMP:completions;ENV:env;ATN;CMD:input\n| ; && ||\n"
    )
    assert raw[48 : 48 + len(meta)] == meta
    assert raw[48 + len(meta) :] == struct.pack("<6f", 0, 1, 2, 3, 0.5, -2.0)
    assert struct.unpack_from("<I", raw, 34)[0] == len(meta)


def test_round_trip_named_arrays(tmp_path: Path) -> None:
    f = read_cwgt(write_cwgt(tmp_path / "m.cwgt", HEADER, ARRAYS, META))
    assert f.header.param_count == 6 and f.header.tied and not f.header.has_ewc
    assert f.metadata == META
    assert f.metadata.parsed_template().items[0].token == 257
    assert f.metadata.stop_conditions().patterns == (b"|", b";", b"&&", b"||")
    # read into memory, not mapped: what happens to the file afterwards cannot reach the arrays
    assert not isinstance(f.weights, np.memmap) and not f.weights.flags.writeable
    (tmp_path / "m.cwgt").write_bytes(b"")
    np.testing.assert_array_equal(f.weights, [0, 1, 2, 3, 0.5, -2])
    named = f.named_arrays([("a", (2, 2)), ("b", (2,))])
    assert [n for n, _ in named] == ["a", "b"]
    for (_, got), (_, want) in zip(named, ARRAYS, strict=True):
        np.testing.assert_array_equal(got, want)
    assert f.header.temperature == 0.8 and f.header.top_p == 0.95 and f.header.min_p == 0.05
    with pytest.raises(FormatError, match="the model needs 5 parameters, the file holds 6"):
        f.named_arrays([("a", (5,))])


def test_round_trip_with_ewc_block(tmp_path: Path) -> None:
    fisher, anchor = np.full(6, 0.25, np.float32), np.linspace(-1, 1, 6, dtype=np.float32)
    path = write_cwgt(tmp_path / "e.cwgt", HEADER, ARRAYS, META, ewc=(fisher, anchor))
    f = read_cwgt(path)
    assert f.header.flags == FLAG_TIED | FLAG_HAS_EWC
    np.testing.assert_array_equal(f.fisher, fisher)
    np.testing.assert_array_equal(f.anchor, anchor)
    np.testing.assert_array_equal(f.weights, [0, 1, 2, 3, 0.5, -2])
    raw = path.read_bytes()
    start = 48 + len(META.encode())
    assert raw[start : start + 24] == fisher.tobytes()  # fisher, then anchor, then weights
    assert raw[start + 24 : start + 48] == anchor.tobytes()
    with pytest.raises(ValueError, match="EWC fisher has 2 values"):
        write_cwgt(tmp_path / "x.cwgt", HEADER, ARRAYS, META, ewc=(np.zeros(2), anchor))


def test_no_metadata_is_allowed_by_spec(tmp_path: Path) -> None:
    f = read_cwgt(write_cwgt(tmp_path / "m.cwgt", HEADER, ARRAYS, None))
    assert f.metadata is None and f.header.meta_size == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    weights=st.lists(st.floats(-(2.0**100), 2.0**100, width=32), min_size=1, max_size=50),
    ewc=st.booleans(),
    tied=st.booleans(),
    domain=st.text(
        st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), min_size=1, max_size=8
    ),
    stops=st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=8),
    d_model=st.integers(1, 0xFFFF),
    d_state=st.integers(1, 0xFF),
)
def test_write_read_property(tmp_path: Path, weights, ewc, tied, domain, stops, d_model, d_state) -> None:  # type: ignore[no-untyped-def]
    flat = np.array(weights, dtype=np.float32)
    header = replace(HEADER, d_model=d_model, d_state=d_state, flags=FLAG_TIED if tied else 0)
    meta = Metadata(domain, META.template, stops)
    pair = (flat * 2, flat - 1) if ewc else None
    f = read_cwgt(write_cwgt(tmp_path / "p.cwgt", header, flat, meta, ewc=pair))
    assert f.header == replace(header, param_count=flat.size, meta_size=len(meta.encode()),
                               flags=header.flags | (FLAG_HAS_EWC if ewc else 0))  # fmt: skip
    assert f.metadata == meta
    np.testing.assert_array_equal(f.weights, flat)
    if pair:
        np.testing.assert_array_equal(f.fisher, pair[0])
        np.testing.assert_array_equal(f.anchor, pair[1])


# --------------------------------------------------------------------------- rejections


def good_file(tmp_path: Path) -> bytes:
    return write_cwgt(tmp_path / "good.cwgt", HEADER, ARRAYS, META).read_bytes()


def patch(raw: bytes, offset: int, fmt: str, value: object) -> bytes:
    out = bytearray(raw)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def with_meta(raw: bytes, meta: bytes) -> bytes:
    old = struct.unpack_from("<I", raw, 34)[0]
    return patch(raw[:48], 34, "<I", len(meta)) + meta + raw[48 + old :]


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda r: r[:40], "header", "shorter than the 48-byte header"),
        (lambda r: b"CWGX" + r[4:], "magic", "expected b'CWGT'"),
        (lambda r: patch(r, 4, "<H", 4), "arch_version", "arch_version 4 is older than 5"),
        (lambda r: patch(r, 4, "<H", 6), "arch_version", "newer than this reader"),
        (lambda r: patch(r, 6, "<H", 0x10), "flags", "unknown bits"),
        (lambda r: patch(r, 8, "<H", 256), "vocab_size", "vocab_size 256"),
        (lambda r: patch(r, 10, "<H", 0), "d_model", "d_model is 0"),
        (lambda r: patch(r, 38, "<B", 0), "dt_rank", "dt_rank is 0"),
        (lambda r: patch(r, 26, "<H", 1001), "def_top_p", "over 1000"),
        (lambda r: patch(r, 40, "<B", 1), "reserved", "not zero"),
        (lambda r: patch(r, 18, "<I", 7), "param_count", "param_count 7 with meta_size"),
        (lambda r: r[:-1], "param_count", "the file has"),
        (lambda r: r + b"\0\0\0\0", "param_count", "the file has"),
        (
            lambda r: patch(r, 6, "<H", FLAG_TIED | FLAG_HAS_EWC),
            "param_count",
            r"\(header \+ metadata \+ ewc",
        ),
        (lambda r: patch(r, 34, "<I", 10**6), "meta_size", "runs past the end"),
        (
            lambda r: with_meta(r, b"shell\nBOS;ATN;CMD:input\n"),
            "metadata",
            "expected 3 newline-terminated lines",
        ),
        (lambda r: with_meta(r, b"shell\nBOS;ATN;CMD:input\n|\nextra\n"), "metadata", "3 newline-terminated"),
        (lambda r: with_meta(r, b"shell\nBOS;ATN;CMD:input\n|"), "metadata", "3 newline-terminated"),
        (lambda r: with_meta(r, b"\xffshell\nBOS;ATN;CMD:input\n|\n"), "metadata", "not UTF-8"),
        (lambda r: with_meta(r, b"\nBOS;ATN;CMD:input\n|\n"), "metadata.domain", "domain line is empty"),
        (lambda r: with_meta(r, b"shell\nBOS;CMD:input\n|\n"), "metadata.template", "ATN must appear"),
    ],
)
def test_rejections_name_the_field(tmp_path: Path, mutate, field: str, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.cwgt"
    path.write_bytes(mutate(good_file(tmp_path)))
    with pytest.raises(FormatError, match=message) as info:
        read_cwgt(path)
    assert info.value.field == field
    assert str(path) in str(info.value)


def test_non_finite_weights_are_reported(tmp_path: Path) -> None:
    arrays = [("a", np.array([1.0, np.nan, np.inf], dtype=np.float32))]
    f = read_cwgt(write_cwgt(tmp_path / "nan.cwgt", HEADER, arrays, META))
    with pytest.raises(FormatError, match="2 values are not finite \\(first at index 1\\)") as info:
        f.check_finite()
    assert info.value.field == "weights"


def test_writer_refuses_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_layers=300"):
        write_cwgt(tmp_path / "x.cwgt", replace(HEADER, n_layers=300), ARRAYS, META)
    with pytest.raises(ValueError, match="one line"):
        write_cwgt(tmp_path / "x.cwgt", HEADER, ARRAYS, Metadata("a\nb"))
    assert not (tmp_path / "x.cwgt").exists()
    assert list(tmp_path.iterdir()) == []  # no temp files left behind


def test_writer_replaces_atomically(tmp_path: Path) -> None:
    path = write_cwgt(tmp_path / "m.cwgt", HEADER, ARRAYS, META)
    inode = path.stat().st_ino
    write_cwgt(path, HEADER, [("a", np.zeros(6, np.float32))], META)
    assert path.stat().st_ino != inode  # a new file renamed over the old one, not rewritten in place
    np.testing.assert_array_equal(read_cwgt(path).weights, np.zeros(6))


def test_split_flat_shapes() -> None:
    flat = np.arange(10, dtype=np.float32)
    parts = split_flat(flat, [("x", (2, 3)), ("y", (4,))])
    assert parts[0][1].shape == (2, 3) and parts[1][1].tolist() == [6, 7, 8, 9]


def test_reader_refuses_what_is_not_a_regular_file_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.cwgt"
    os.mkfifo(fifo)  # nobody writes: a blocking open would wait forever
    outcome: list[BaseException] = []

    def read() -> None:
        with pytest.raises(FormatError) as info:
            read_cwgt(fifo)
        outcome.append(info.value)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(timeout=HANG_S)
    assert not reader.is_alive(), "read_cwgt blocked on a FIFO"
    assert "not a regular file (a FIFO)" in str(outcome[0])
    with pytest.raises(FormatError, match="not a regular file \\(a folder\\)"):
        read_cwgt(tmp_path)
    with pytest.raises(FormatError, match="cannot read: No such file"):
        read_cwgt(tmp_path / "missing.cwgt")


def test_reader_bounds_the_size_before_reading(tmp_path: Path) -> None:
    huge = tmp_path / "huge.cwgt"
    with open(huge, "wb") as f:
        f.truncate(MAX_CWGT_BYTES + 1)  # sparse: costs no disk, would cost 1 GiB of memory
    with pytest.raises(FormatError, match=f"{MAX_CWGT_BYTES + 1} bytes, over the limit") as info:
        read_cwgt(huge)
    assert info.value.field == "file"


def test_written_weights_are_private(tmp_path: Path) -> None:
    path = write_cwgt(tmp_path / "m.cwgt", HEADER, ARRAYS, META)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
