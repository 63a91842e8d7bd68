"""CTDS: byte-exact layout, round trips, batches with loss masks, and every kind of bad file."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calmd.errors import FormatError
from calmd.formats.ctds import CtdsReader, CtdsWriter, pad_sequences, write_ctds
from calmd.formats.tokenizer import Special

# BOS ATN CMD "ls" EOS  and  BOS CWD "/" END ATN CMD "pwd" EOS
SEQ_A = [257, 259, 264, 108, 115, 258]
SEQ_B = [257, 260, 47, 269, 259, 264, 112, 119, 100, 258]

# Written by hand from the CTDS byte table (docs/formats.md), little-endian throughout.
GOLDEN = bytes.fromhex(
    "43544453"  # "CTDS"
    "00000000"  # vocab_version 0
    "02000000"  # count 2
    "0a00"  # max_len 10
    "0600" "0a00"  # lengths 6, 10
    "0100" "0400"  # cmd_positions 1, 4
    "0101" "0301" "0801" "6c00" "7300" "0201"  # SEQ_A
    "0101" "0401" "2f00" "0d01" "0301" "0801" "7000" "7700" "6400" "0201"  # SEQ_B
)  # fmt: skip


def test_writer_matches_hand_computed_file(tmp_path: Path) -> None:
    path = write_ctds(tmp_path / "two.ctds", [SEQ_A, SEQ_B])
    assert path.read_bytes() == GOLDEN


def test_reader_reads_hand_computed_file(tmp_path: Path) -> None:
    path = tmp_path / "golden.ctds"
    path.write_bytes(GOLDEN)
    ds = CtdsReader(path)
    assert ds.count() == len(ds) == 2 and ds.max_len == 10 and ds.vocab_version == 0
    seqs, cmd = ds.batch(0, 32)
    assert [s.tolist() for s in seqs] == [SEQ_A, SEQ_B]
    assert cmd.tolist() == [1, 4]


def test_batches_follow_lua_api_and_shuffle_order(tmp_path: Path) -> None:
    sequences = [[257, 259, 264, *([97 + i] * (i + 1)), 258] for i in range(10)]
    ds = CtdsReader(write_ctds(tmp_path / "ten.ctds", sequences))
    assert ds.num_batches(4) == 3
    assert [s.tolist() for s in ds.batch(2, 4)[0]] == sequences[8:]  # last batch is short
    with pytest.raises(IndexError):
        ds.batch(3, 4)
    ds.shuffle(seed=7)
    order = ds.order.tolist()
    assert sorted(order) == list(range(10)) and order != list(range(10))
    got = [s.tolist() for b in range(3) for s in ds.batch(b, 4)[0]]
    assert got == [sequences[i] for i in order]
    ds2 = CtdsReader(tmp_path / "ten.ctds")
    ds2.shuffle(seed=7)
    assert ds2.order.tolist() == order  # same seed, same order


def test_padded_batch_and_loss_mask(tmp_path: Path) -> None:
    ds = CtdsReader(write_ctds(tmp_path / "two.ctds", [SEQ_A, SEQ_B]))
    tokens, mask, lengths = ds.padded_batch(0, 2)
    assert tokens.shape == mask.shape == (2, 10)
    assert tokens[0].tolist() == SEQ_A + [Special.PAD] * 4
    assert tokens[1].tolist() == SEQ_B
    assert lengths.tolist() == [6, 10]
    # supervised: every token after ATN (CMD, command bytes, EOS), never context or padding
    assert mask[0].tolist() == [False, False, True, True, True, True, False, False, False, False]
    assert mask[1].tolist() == [False] * 5 + [True] * 5
    t, m, _ = ds.padded_batch(0, 2, pad_to=12)
    assert t.shape == (2, 12) and int(m.sum()) == 9
    assert t[0, -1] == Special.PAD
    # the in-memory rule and the reader's agree, row order included
    rows = np.array([1, 0])
    t2, m2, _ = ds.padded_rows(rows)
    p2, pm2 = pad_sequences([np.array(SEQ_B), np.array(SEQ_A)], [4, 1])
    assert (t2 == p2).all() and (m2 == pm2).all()
    with pytest.raises(ValueError, match="pad_to"):
        ds.padded_batch(0, 2, pad_to=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 258).filter(lambda t: t != Special.ATN), max_size=20),
            st.lists(st.integers(0, 277).filter(lambda t: t != Special.ATN), max_size=20),
        ),
        max_size=12,
    )
)
def test_write_read_round_trip(tmp_path: Path, parts: list[tuple[list[int], list[int]]]) -> None:
    sequences = [[*before, Special.ATN, *after] for before, after in parts]
    path = write_ctds(tmp_path / "rt.ctds", sequences)
    ds = CtdsReader(path)
    assert ds.count() == len(sequences)
    assert ds.max_len == max((len(s) for s in sequences), default=0)
    for i, seq in enumerate(sequences):
        assert ds.sequence(i).tolist() == seq
        assert int(ds.cmd_positions[i]) == seq.index(Special.ATN)
    if sequences:
        tokens, mask, _ = ds.padded_batch(0, len(sequences))
        for b, seq in enumerate(sequences):
            atn = seq.index(Special.ATN)
            assert tokens[b, : len(seq)].tolist() == seq
            assert mask[b].nonzero()[0].tolist() == list(range(atn + 1, len(seq)))


# --------------------------------------------------------------------------- writer behaviour


def test_writer_is_atomic_and_leaves_nothing_on_error(tmp_path: Path) -> None:
    path = tmp_path / "data.ctds"
    write_ctds(path, [SEQ_A])
    before = path.read_bytes()
    with pytest.raises(RuntimeError), CtdsWriter(path) as writer:
        writer.add(SEQ_B)
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == before  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.ctds"]  # no temp or spill left


def test_writer_rejects_bad_sequences(tmp_path: Path) -> None:
    with CtdsWriter(tmp_path / "x.ctds") as w:
        with pytest.raises(ValueError, match="exactly one ATN"):
            w.add([257, 264, 97])
        with pytest.raises(ValueError, match="outside 0-277"):
            w.add([257, 259, 300])
        with pytest.raises(ValueError, match="not an ATN"):
            w.add(SEQ_A, cmd_position=0)
        with pytest.raises(ValueError, match="uint16"):
            w.add([259] + [97] * 70000)
        w.add(SEQ_A)
    assert CtdsReader(tmp_path / "x.ctds").count() == 1


def test_empty_dataset(tmp_path: Path) -> None:
    ds = CtdsReader(write_ctds(tmp_path / "empty.ctds", []))
    assert ds.count() == 0 and ds.max_len == 0
    with pytest.raises(IndexError):
        ds.batch(0, 1)


def test_open_maps_tokens_lazily(tmp_path: Path) -> None:
    """Tokens are a memory map: a sparse 64 MiB token area opens without being read."""
    count, length = 512, 65535
    path = tmp_path / "big.ctds"
    with open(path, "wb") as f:
        f.write(struct.pack("<4sIIH", b"CTDS", 0, count, length))
        f.write(np.full(count, length, dtype="<u2").tobytes())
        f.write(np.zeros(count, dtype="<u2").tobytes())
        f.truncate(14 + 4 * count + 2 * count * length)  # a hole: no blocks on disk
    ds = CtdsReader(path)
    assert isinstance(ds.tokens, np.memmap)
    assert os.stat(path).st_blocks * 512 < 1 << 20  # still sparse: nothing was written or read in
    assert ds.count() == count


# --------------------------------------------------------------------------- bad files


def corrupt(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "bad.ctds"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (b"", "header", "shorter than the 14-byte header"),
        (GOLDEN[:10], "header", "shorter than the 14-byte header"),
        (b"CTDX" + GOLDEN[4:], "magic", "expected b'CTDS'"),
        (GOLDEN[:8] + struct.pack("<I", 1000) + GOLDEN[12:], "count", "count 1000 needs 4014 bytes"),
        (GOLDEN[:-2], "lengths", "past the end of the file"),
        (GOLDEN + b"\0\0", "lengths", "shorter than the file"),
        (
            GOLDEN[:12] + struct.pack("<H", 6) + GOLDEN[14:],
            "lengths",
            "sequence 1 has length 10, over max_len 6",
        ),
        (GOLDEN[:18] + struct.pack("<H", 6) + GOLDEN[20:], "cmd_positions", "not inside its 6 tokens"),
    ],
)
def test_bad_files_name_the_field(tmp_path: Path, data: bytes, field: str, message: str) -> None:
    path = corrupt(tmp_path, data)
    with pytest.raises(FormatError, match=message) as info:
        CtdsReader(path)
    assert info.value.field == field
    assert str(path) in str(info.value)


def test_bad_tokens_are_caught_on_access(tmp_path: Path) -> None:
    data = bytearray(GOLDEN)
    data[22:24] = struct.pack("<H", 300)  # first token of SEQ_A
    ds = CtdsReader(corrupt(tmp_path, bytes(data)))
    with pytest.raises(FormatError, match="sequence 0 holds invalid token id 300"):
        ds.batch(0, 2)
    with pytest.raises(FormatError, match="sequence 0 holds invalid token id 300"):
        ds.padded_batch(0, 2)
    data = bytearray(GOLDEN)
    data[18:20] = struct.pack("<H", 2)  # cmd_position of SEQ_A points at CMD, not ATN
    ds = CtdsReader(corrupt(tmp_path, bytes(data)))
    with pytest.raises(FormatError, match="not ATN"):
        ds.padded_batch(0, 2)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="cannot read"):
        CtdsReader(tmp_path / "nope.ctds")
