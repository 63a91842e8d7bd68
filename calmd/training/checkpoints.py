"""A training run's checkpoint (`calm train --checkpoint PATH`, `--resume`): the weights, the
optimizer, the batch order and the step, so that a run killed or out of time continues to the same
model as one uninterrupted run (tested). The file is torch's (weights_only on load); a key of the
run's settings (calmd/training/train.py `_run_key`) must match, or the resume is refused with the
first setting that differs named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from calmd.atomic import atomic_write
from calmd.errors import CalmError

CHECKPOINT_VERSION = 1


@dataclass
class RunState:
    """What a run has done so far: everything besides the weights and the optimizer that the rest
    of the run, or a run resumed from its checkpoint, needs."""

    step: int = 0  # optimizer steps done
    losses: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)  # supervised targets per step
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    tokens_seen: int = 0
    seconds: float = 0.0  # spent in optimizer steps by earlier invocations
    order: npt.NDArray[np.int64] | None = None  # the current epoch's batch order
    rng: dict[str, Any] | None = None  # the batch-order generator's state after drawing `order`


def save_checkpoint(
    path: Path, key: dict[str, str], state: RunState, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """The run's state, written atomically (0600): a kill while saving leaves the previous one."""
    assert state.order is not None and state.rng is not None
    blob = {
        "version": CHECKPOINT_VERSION,
        "key": key,
        "step": state.step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "losses": torch.tensor(state.losses, dtype=torch.float64),
        "step_tokens": torch.tensor(state.step_tokens, dtype=torch.int64),
        "val_losses": [(int(s), float(v)) for s, v in state.val_losses],
        "tokens_seen": state.tokens_seen,
        "seconds": state.seconds,
        "order": torch.from_numpy(state.order),
        "rng": json.dumps(state.rng),  # PCG64's 128-bit integers, as text
    }
    with atomic_write(path) as f:
        torch.save(blob, f)


def load_checkpoint(
    path: Path, key: dict[str, str], model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> RunState:
    """Restore a run saved by `save_checkpoint` into `model` and `optimizer`; CalmError when the
    file is not a checkpoint or was saved by a run with other settings (the first one is named)."""
    if not path.is_file():
        raise CalmError(f"{path}: no checkpoint to resume from (a run with --checkpoint writes one)")
    try:
        blob = torch.load(path, map_location=device, weights_only=True)
        if not isinstance(blob, dict) or blob.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"not a version-{CHECKPOINT_VERSION} calm training checkpoint")
        saved_key = {"precision": "fp32", **blob["key"]}  # saved before --precision: all were fp32
        for name, value in key.items():
            if saved_key.get(name) != value:
                raise CalmError(
                    f"{path}: saved by a run with {name} {saved_key.get(name)}, this run has {value}: "
                    "resume with the same settings, or start over without --resume"
                )
        model.load_state_dict(blob["model"])
        optimizer.load_state_dict(blob["optimizer"])
        return RunState(
            step=int(blob["step"]),
            losses=[float(x) for x in blob["losses"].tolist()],
            step_tokens=[int(x) for x in blob["step_tokens"].tolist()],
            val_losses=[(int(s), float(v)) for s, v in blob["val_losses"]],
            tokens_seen=int(blob["tokens_seen"]),
            seconds=float(blob["seconds"]),
            order=blob["order"].cpu().numpy().astype(np.int64),
            rng=json.loads(blob["rng"]),
        )
    except CalmError:
        raise
    except Exception as exc:  # a truncated or foreign file: name it, never a traceback
        raise CalmError(f"{path}: cannot resume from it: {type(exc).__name__}: {exc}") from exc
