"""Elastic weight consolidation: what keeps a fine-tuned model from forgetting what it knew.

EWC (Kirkpatrick et al. 2017, "Overcoming catastrophic forgetting in neural networks"). After a
run, the Fisher diagonal is estimated on a sample of the training sequences as the empirical
Fisher of the per-token loss,

    F = mean over sampled sequences s of (d/dtheta sum_t nll_st)^2 / T_s      (T_s: supervised tokens)

which is the curvature of the mean per-token loss if token gradients are uncorrelated, so that
`1/2 sum F (theta - theta*)^2` predicts (Laplace approximation) how much the old per-token loss
rises when the weights move from theta*. It is stored with the anchor theta* (the trained
weights) in the CWGT EWC block, both flat in `flatten(model)` order (calmd/model/checkpoint.py).
The next run that starts from that file adds `ewc_lambda / 2 * sum F (theta - anchor)^2` to its
loss.

Combining Fishers. A model that already carries a Fisher F_old is fine-tuned to new weights
theta'; its file then stores the anchor theta' and

    F = ewc_gamma * F_old + F_new                                      (online EWC, Schwarz et al. 2018)

The sum keeps the importance of every task seen so far (gamma = 1 is the plain sum: all past
tasks weigh alike and the model stiffens with every run); with gamma < 1 older tasks fade
geometrically and F stays bounded (<= max F / (1 - gamma)), which suits a daemon that retrains on
the user's recent history again and again. The default gamma is 0.5.

Shapes: P, the number of the model's parameters (CWGT param_count); the Fisher and the anchor are
flat (P,) arrays, split into one tensor per parameter for the penalty.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from calmd.formats.ctds import CtdsReader
from calmd.model.loss import supervised_nll
from calmd.model.mamba import CalmModel
from calmd.training.batches import read_rows
from calmd.training.distributed import Dist


def split_like(model: nn.Module, flat: npt.NDArray[np.float32], device: torch.device) -> list[Tensor]:
    """A flat array in `flatten(model)` order -> one tensor per parameter."""
    out, offset = [], 0
    for p in model.parameters():
        n = p.numel()
        out.append(
            torch.from_numpy(np.array(flat[offset : offset + n], dtype=np.float32)).view_as(p).to(device)
        )
        offset += n
    assert offset == flat.size, (offset, flat.size)
    return out


def ewc_penalty(model: nn.Module, fisher: list[Tensor], anchor: list[Tensor]) -> Tensor:
    """sum F (theta - theta*)^2 over all parameters (without the lambda / 2)."""
    total = torch.zeros((), device=fisher[0].device)
    for p, f, a in zip(model.parameters(), fisher, anchor, strict=True):
        total = total + (f * (p - a).pow(2)).sum()
    return total


def estimate_fisher(
    model: CalmModel, reader: CtdsReader, rows: npt.NDArray[np.int64], dist: Dist, device: torch.device
) -> tuple[npt.NDArray[np.float32], int]:
    """Empirical Fisher diagonal of the per-token loss (module docstring), flat, from `rows`
    (each rank takes its share). One backward pass per sequence: per-sequence gradients are what
    the Fisher squares, a batch gradient would square their sum."""
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    mine = rows[dist.rank :: dist.world]
    for r in mine:
        tokens, mask = read_rows(reader, np.array([r]))
        nll = supervised_nll(model, tokens.to(device), mask.to(device))
        count = max(int(mask.sum()), 1)
        grads = torch.autograd.grad(nll, params)
        for acc, g in zip(total, grads, strict=True):
            acc.add_(g.pow(2), alpha=1.0 / count)
    flat = torch.cat([t.reshape(-1) for t in total])
    n = torch.tensor([float(len(mine))], device=device)
    flat, n = dist.all_sum(flat), dist.all_sum(n)
    count = int(n.item())
    return (flat / max(count, 1)).cpu().numpy().astype(np.float32), count


def combined_fisher(
    old: npt.NDArray[np.float32] | None, new: npt.NDArray[np.float32], gamma: float
) -> npt.NDArray[np.float32]:
    """The Fisher a fine-tuned model stores: `gamma * F_old + F_new` (online EWC, above)."""
    return new if old is None else (gamma * old + new).astype(np.float32)
