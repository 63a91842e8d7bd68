"""CTDS: the CALM training data set, a memory-mapped file of token sequences.

Layout (all integers little-endian; byte tables in docs/formats.md, "CTDS"):

    offset 0       magic          4 bytes  b"CTDS"
    offset 4       vocab_version  uint32   0 (byte-level tokenizer)
    offset 8       count          uint32   number of sequences
    offset 12      max_len        uint16   longest sequence
    offset 14      lengths        count x uint16
    14 + 2*count   cmd_positions  count x uint16   0-indexed ATN position per sequence
    14 + 4*count   tokens         sum(lengths) x uint16

`CtdsReader` maps the file and reads only the two small per-sequence arrays on open (to check every
length against the file size); token data is touched when a batch asks for it.
`CtdsWriter` streams sequences to a spill file, so memory holds 4 bytes per sequence and no
tokens, then assembles the final file in a temp file and renames it into place.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import numpy.typing as npt

from calmd.atomic import atomic_write
from calmd.errors import FormatError
from calmd.formats.tokenizer import NUM_SPECIALS, SPECIAL_BASE, Special, TokenArray

if TYPE_CHECKING:
    pass

MAGIC = b"CTDS"
HEADER = struct.Struct("<4sIIH")
assert HEADER.size == 14
MAX_SEQUENCE_LEN = 0xFFFF  # lengths are uint16
MAX_COUNT = 0xFFFFFFFF
VALID_ID_LIMIT = SPECIAL_BASE + NUM_SPECIALS  # ids 278-319 are reserved and never stored


class CtdsReader:
    """A validated, memory-mapped CTDS file.

    `batch(index, size)` follows the Lua API: the 0-indexed batch `index` of `size` sequences in
    the current order (file order until `shuffle(seed)` permutes an index array).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        where = str(self.path)
        try:
            file_size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(HEADER.size)
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror}", path=where) from exc
        if len(head) < HEADER.size:
            raise FormatError(
                f"file is {file_size} bytes, shorter than the 14-byte header", path=where, field="header"
            )
        magic, self.vocab_version, count, self.max_len = HEADER.unpack(head)
        if magic != MAGIC:
            raise FormatError(f"expected b'CTDS', found {magic!r}", path=where, field="magic")
        arrays_end = HEADER.size + 4 * count
        if arrays_end > file_size:
            raise FormatError(
                f"count {count} needs {arrays_end} bytes of header and per-sequence arrays, "
                f"the file has {file_size}",
                path=where,
                field="count",
            )
        self._count = count
        self._data_offset = arrays_end
        if count:
            meta = np.memmap(self.path, dtype="<u2", mode="r", offset=HEADER.size, shape=(2 * count,))
            self.lengths: npt.NDArray[np.uint16] = np.asarray(meta[:count])
            self.cmd_positions: npt.NDArray[np.uint16] = np.asarray(meta[count:])
        else:
            self.lengths = np.zeros(0, dtype="<u2")
            self.cmd_positions = np.zeros(0, dtype="<u2")
        total = int(self.lengths.sum(dtype=np.int64))
        expected = arrays_end + 2 * total
        if expected != file_size:
            what = "past the end of" if expected > file_size else "shorter than"
            raise FormatError(
                f"lengths add up to {total} tokens ending at byte {expected}, "
                f"{what} the file ({file_size} bytes)",
                path=where,
                field="lengths",
            )
        if count:
            longest = int(self.lengths.max())
            if longest > self.max_len:
                i = int(np.argmax(self.lengths))
                raise FormatError(
                    f"sequence {i} has length {longest}, over max_len {self.max_len}",
                    path=where,
                    field="lengths",
                )
            bad = self.cmd_positions >= self.lengths
            if bad.any():
                i = int(np.argmax(bad))
                raise FormatError(
                    f"sequence {i}: cmd_position {int(self.cmd_positions[i])} is not inside its "
                    f"{int(self.lengths[i])} tokens",
                    path=where,
                    field="cmd_positions",
                )
            self.tokens: npt.NDArray[np.uint16] = (
                np.memmap(self.path, dtype="<u2", mode="r", offset=arrays_end, shape=(total,))
                if total
                else np.zeros(0, dtype="<u2")
            )
        else:
            self.tokens = np.zeros(0, dtype="<u2")
        self._offsets: npt.NDArray[np.int64] | None = None  # computed on first batch
        self.order: npt.NDArray[np.int64] = np.arange(count, dtype=np.int64)

    # -- the Lua API ---------------------------------------------------------------------------

    def count(self) -> int:
        return self._count

    def __len__(self) -> int:
        return self._count

    def shuffle(self, seed: int | None = None) -> None:
        """Permute the iteration order (an index array; the data is not touched)."""
        self.order = np.random.default_rng(seed).permutation(self._count)

    # num_batches and batch: the specification's dataset API (`ds:batch(0, 32)`), mirrored for
    # its users; calmd's own training reads `padded_rows`.
    def num_batches(self, size: int) -> int:
        return -(-self._count // size)

    def batch(self, index: int, size: int) -> tuple[list[TokenArray], npt.NDArray[np.int64]]:
        """The 0-indexed batch `index`: (sequences, cmd_positions). The last batch may be short."""
        rows = self._batch_rows(index, size)
        return [self.sequence(int(r)) for r in rows], self.cmd_positions[rows].astype(np.int64)

    def close(self) -> None:
        # Dropping the references unmaps the file once no batch view still uses it.
        self.tokens = np.zeros(0, dtype="<u2")

    def __enter__(self) -> CtdsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- access ----------------------------------------------------------------------------------

    def offsets(self) -> npt.NDArray[np.int64]:
        if self._offsets is None:
            offsets = np.zeros(self._count + 1, dtype=np.int64)
            np.cumsum(self.lengths, out=offsets[1:])
            self._offsets = offsets
        return self._offsets

    def sequence(self, i: int) -> TokenArray:
        """Sequence `i` in file order, validated: ids in 0-277 and ATN at its cmd_position."""
        if not 0 <= i < self._count:
            raise IndexError(f"sequence {i} out of range 0..{self._count - 1}")
        offsets = self.offsets()
        seq = np.asarray(self.tokens[offsets[i] : offsets[i + 1]])
        self._check(i, seq)
        return seq

    def _check(self, i: int, seq: npt.NDArray[np.integer]) -> None:
        if seq.size and int(seq.max()) >= VALID_ID_LIMIT:
            pos = int(np.argmax(seq >= VALID_ID_LIMIT))
            raise FormatError(
                f"sequence {i} holds invalid token id {int(seq[pos])} at position {pos}",
                path=str(self.path),
                field="tokens",
            )
        cmd = int(self.cmd_positions[i])
        if seq[cmd] != Special.ATN:
            raise FormatError(
                f"sequence {i}: token at cmd_position {cmd} is {int(seq[cmd])}, not ATN (259)",
                path=str(self.path),
                field="cmd_positions",
            )

    def _batch_rows(self, index: int, size: int) -> npt.NDArray[np.int64]:
        if size < 1:
            raise ValueError(f"batch size must be >= 1, got {size}")
        start = index * size
        if index < 0 or start >= self._count:
            raise IndexError(f"batch {index} of size {size} is past the {self._count} sequences")
        return self.order[start : start + size]

    def padded_batch(
        self, index: int, size: int, *, pad_to: int | None = None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        """Batch `index` (of `size` sequences, in `order`) as `padded_rows` gives it."""
        return self.padded_rows(self._batch_rows(index, size), pad_to=pad_to)

    def padded_rows(
        self, rows: npt.NDArray[np.int64], *, pad_to: int | None = None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        """Sequences `rows` as arrays: tokens (B, L) padded with PAD, loss mask (B, L), lengths (B,).

        The mask is True on every token after ATN (CMD marker, command bytes, EOS) and False on
        the context and the padding: it marks the *targets* the loss supervises, position t being
        predicted from positions < t. L is the longest sequence of the batch, or `pad_to`.
        `pad_sequences` applies the same rule to sequences held in memory.
        """
        rows = np.asarray(rows, dtype=np.int64)
        offsets = self.offsets()
        lengths = self.lengths[rows].astype(np.int64)
        width = int(lengths.max()) if pad_to is None else pad_to
        if pad_to is not None and int(lengths.max()) > pad_to:
            raise ValueError(f"pad_to {pad_to} is shorter than the longest sequence {int(lengths.max())}")
        # Gather all rows with one fancy index: column j of row b reads token offsets[b]+j, clamped
        # into the row (the clamped cells are overwritten with PAD by the mask below).
        cols = np.arange(width, dtype=np.int64)
        inside = cols[None, :] < lengths[:, None]  # (B, L)
        starts = offsets[rows]
        flat = starts[:, None] + np.minimum(cols[None, :], np.maximum(lengths[:, None] - 1, 0))
        tokens = np.where(inside, self.tokens[flat], np.int64(Special.PAD)).astype(np.int64)
        cmd = self.cmd_positions[rows].astype(np.int64)
        atn_ok = bool((tokens[np.arange(rows.size), cmd] == Special.ATN).all())
        if not atn_ok or int(tokens.max(initial=0)) >= VALID_ID_LIMIT:
            for b, r in enumerate(rows):  # slow path, only to name the bad sequence
                self._check(int(r), tokens[b, : lengths[b]])
        mask = inside & (cols[None, :] > cmd[:, None])
        return tokens, mask, lengths


def pad_sequences(
    seqs: Sequence[npt.NDArray[np.integer]], cmd_positions: Sequence[int], *, pad_to: int | None = None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """In-memory sequences -> tokens (B, L) int64 padded with PAD, and the loss mask (B, L): the
    rule of `CtdsReader.padded_rows` (True on every real token after its ATN)."""
    lengths = [len(s) for s in seqs]
    width = max(lengths, default=1) if pad_to is None else pad_to
    if width < max(lengths, default=0):
        raise ValueError(f"pad_to {pad_to} is shorter than the longest sequence {max(lengths)}")
    tokens = np.full((len(seqs), width), int(Special.PAD), dtype=np.int64)  # (B, L)
    mask = np.zeros((len(seqs), width), dtype=np.bool_)  # (B, L)
    for b, (seq, cmd) in enumerate(zip(seqs, cmd_positions, strict=True)):
        tokens[b, : len(seq)] = seq
        mask[b, cmd + 1 : len(seq)] = True
    return tokens, mask


class CtdsWriter:
    """Streams sequences into a CTDS file, atomically.

    Tokens go to a spill file as they arrive (memory holds 4 bytes per sequence); `close()` writes
    header, lengths and cmd_positions, copies the spill after them, fsyncs and renames over `path`.
    An exception inside `with` (or `abort()`) removes the temp files and leaves `path` untouched.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lengths: list[int] = []
        self._cmd_positions: list[int] = []
        self._max_len = 0
        fd, spill = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tokens", dir=self.path.parent)
        self._spill_path = Path(spill)
        self._spill: BinaryIO | None = os.fdopen(fd, "wb")

    def __len__(self) -> int:
        return len(self._lengths)

    @property
    def max_len(self) -> int:
        return self._max_len

    def add(self, seq: npt.ArrayLike, cmd_position: int | None = None) -> None:
        """Append one sequence. `cmd_position` defaults to its single ATN token's position."""
        assert self._spill is not None, "add() after close()"
        arr = np.asarray(seq)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError("a sequence must be a non-empty 1-D array of token ids")
        if int(arr.min()) < 0 or int(arr.max()) >= VALID_ID_LIMIT:
            raise ValueError(f"sequence {len(self)} holds token ids outside 0-{VALID_ID_LIMIT - 1}")
        if arr.size > MAX_SEQUENCE_LEN:
            raise ValueError(f"sequence {len(self)} has {arr.size} tokens; CTDS lengths are uint16")
        atn = np.flatnonzero(arr == Special.ATN)
        if cmd_position is None:
            if atn.size != 1:
                raise ValueError(f"sequence {len(self)} must hold exactly one ATN, found {atn.size}")
            cmd_position = int(atn[0])
        elif not (0 <= cmd_position < arr.size and arr[cmd_position] == Special.ATN):
            raise ValueError(f"sequence {len(self)}: cmd_position {cmd_position} is not an ATN token")
        if len(self._lengths) >= MAX_COUNT:
            raise ValueError("CTDS count is uint32: too many sequences")
        self._spill.write(arr.astype("<u2", copy=False).tobytes())
        self._lengths.append(int(arr.size))
        self._cmd_positions.append(cmd_position)
        self._max_len = max(self._max_len, int(arr.size))

    def add_all(self, sequences: Iterable[npt.ArrayLike]) -> None:
        for seq in sequences:
            self.add(seq)

    def close(self) -> Path:
        """Finish the file: write it under a temp name, fsync, rename over `path`."""
        assert self._spill is not None, "close() twice"
        spill, self._spill = self._spill, None
        spill.close()
        try:
            with atomic_write(self.path) as out:
                out.write(HEADER.pack(MAGIC, 0, len(self._lengths), self._max_len))
                out.write(np.asarray(self._lengths, dtype="<u2").tobytes())
                out.write(np.asarray(self._cmd_positions, dtype="<u2").tobytes())
                with open(self._spill_path, "rb") as src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
        finally:
            self._spill_path.unlink(missing_ok=True)
        return self.path

    def abort(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None
        self._spill_path.unlink(missing_ok=True)

    def __enter__(self) -> CtdsWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_ctds(path: str | os.PathLike[str], sequences: Iterable[npt.ArrayLike]) -> Path:
    """Write all `sequences` (each holding one ATN) to `path` atomically."""
    with CtdsWriter(path) as writer:
        writer.add_all(sequences)
    return writer.path
