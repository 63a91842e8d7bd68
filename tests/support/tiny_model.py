"""A tiny CALM model that learns a handful of commands in a few seconds, for tests that need a
model with predictable answers (generation, the engine, the daemon with its real engine)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from calmd.formats.cwgt import Metadata
from calmd.formats.tokenizer import DEFAULT_SHELL_TEMPLATE, atn_position, build_sequence
from calmd.model.checkpoint import save_model
from calmd.model.mamba import CalmModel, ModelConfig

TINY = ModelConfig(d_model=32, n_layers=2, d_state=8)
COMMANDS = ("git status", "git stash pop", "ls -la | grep x", "make test")
OTHER_COMMANDS = ("make install", "git status")  # conftest.py's other_tiny_weights
CONTEXT = {"history": [{"cmd": "cd proj", "exit": 0}]}


def train_tiny(commands: Sequence[str] = COMMANDS, *, favourite: int = 0, steps: int = 250) -> CalmModel:
    """Learn `commands` after CONTEXT; commands[favourite] is seen three times as often."""
    torch.manual_seed(0)
    model = CalmModel(TINY)
    model.init_weights(0)
    seqs = [build_sequence(DEFAULT_SHELL_TEMPLATE, {**CONTEXT, "input": c}, training=True) for c in commands]
    seqs += [seqs[favourite]] * 2
    width = max(s.size for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : s.size] = torch.from_numpy(s.astype("int64"))
        mask[i, atn_position(s) + 1 : s.size] = True
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model.loss(tokens, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1, loss.item()
    return model.eval()


def save_tiny(path: Path, model: CalmModel | None = None) -> Path:
    return save_model(path, model or train_tiny(), Metadata())
