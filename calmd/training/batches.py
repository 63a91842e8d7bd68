"""What a training step reads from a CTDS dataset: the rows as tensors, how many targets they hold,
and the order the batches come in. Shapes: B sequences, L the padded length of the batch.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from calmd.formats.ctds import CtdsReader


def supervised_counts(reader: CtdsReader, rows: npt.NDArray[np.int64]) -> int:
    """Supervised targets of `rows`: every token after ATN."""
    return int((reader.lengths[rows].astype(np.int64) - reader.cmd_positions[rows] - 1).sum())


def read_rows(reader: CtdsReader, rows: npt.NDArray[np.int64]) -> tuple[Tensor, Tensor]:
    """Tokens (B, L) and loss mask (B, L) of `rows`, validated (ids and the ATN position)."""
    tokens, mask, _ = reader.padded_rows(rows)
    return torch.from_numpy(tokens), torch.from_numpy(mask)


def bucketed_order(
    lengths: npt.NDArray[np.integer], rows: npt.NDArray[np.int64], batch: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """`rows` shuffled, sorted by length inside windows of 64 batches, cut into batches, and the
    batches shuffled: batches of similar lengths (little padding) in random order."""
    rows = rng.permutation(rows)
    window = 64 * batch
    parts = [rows[i : i + window] for i in range(0, rows.size, window)]
    ordered = np.concatenate([p[np.argsort(lengths[p], kind="stable")] for p in parts])
    batches = [ordered[i : i + batch] for i in range(0, ordered.size, batch)]
    return np.concatenate([batches[i] for i in rng.permutation(len(batches))])
