"""The supervised loss: what `calm train` minimises and `calm evaluate` reports, one function so
the two can never disagree (a model's `loss()` is its mean).

A CTDS sequence is `context frames, ATN, CMD, command bytes, EOS`; only the tokens after ATN are
targets (the CTDS loss mask), so the model learns to complete commands, never to write contexts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor


def supervised_nll(module: Callable[[Tensor], Tensor], tokens: Tensor, mask: Tensor) -> Tensor:
    """Summed next-token NLL (nats) over the supervised targets: the training loss, and evaluation's.

    tokens (B, L); mask (B, L) bool, True where token t is a target (the CTDS loss mask: every
    token after ATN). Position t-1 predicts token t. `module` maps tokens (B, L-1) to logits
    (B, L-1, V): the model, or its DistributedDataParallel wrapper.
    """
    logits = module(tokens[:, :-1])  # (B, L-1, V)
    losses = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none"
    )
    return (losses * mask[:, 1:].reshape(-1)).sum()
