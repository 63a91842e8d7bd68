"""Data-parallel training under `torchrun --nproc_per_node N`: this process's place (`Dist`), the
process group it joins (gloo on CPU, nccl on GPU), the model's DistributedDataParallel wrapper.

How the ranks share a batch, and why N ranks follow one process's trajectory, is the training
loop's story (calmd/training/train.py's docstring, "Data-parallel training").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Dist:
    """This process's place under torchrun (rank 0 of 1 without it)."""

    rank: int = 0
    world: int = 1
    local_world: int = 1
    owned: bool = False  # init_distributed created the process group (and `finish` destroys it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, value: Tensor) -> Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(value)
        return value

    def wrap(self, model: nn.Module) -> Callable[[Tensor], Tensor]:
        """The module a step runs: the model, or under torchrun its DistributedDataParallel
        wrapper (which broadcasts rank 0's weights, then all-reduces every backward's gradients)."""
        if self.world <= 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)

    def finish(self) -> None:
        """Wait for every rank (rank 0 writes the file), then leave a group this process made."""
        if self.world > 1:
            torch.distributed.barrier()
            if self.owned:
                torch.distributed.destroy_process_group()


def init_distributed(device: torch.device) -> Dist:
    """Join the process group torchrun describes in the environment (WORLD_SIZE, RANK, ...)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return Dist(dist.get_rank(), dist.get_world_size(), local, owned)
