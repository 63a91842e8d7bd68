"""The fused inference step (calmd/model/csrc/step.cpp): the whole model, one token per row, one call.

Why: `CalmModel.step_eager` is about 15 small torch ops per layer; at the daemon's sizes (nano,
1-12 beam rows) their dispatch costs far more than their arithmetic, and a keystroke runs ~20
steps. The C++ step does the same arithmetic in one ctypes call (docs/model.md, "Recurrent
inference"; figures in docs/performance.md).

`pack(cfg, params)` makes the contiguous float32 copies the kernel reads: every matrix
transposed to (in, out) with `out` padded to a multiple of 8 floats, `A = -exp(A_log)`, the conv
filter as (K, E). A pack remembers each parameter's version counter, so `PackedWeights.fresh`
tells whether a weight was written to since (an optimizer step, `load_named_arrays`); CalmModel
checks it at every step (about 5 us for nano's 42 parameters) and packs again then, and drops
the pack when the module is converted (`.to()`, `.double()`).

The kernel is built and loaded with the selective scan by calmd/model/fastscan.py:
`CALM_NO_CPP_SCAN=1`, no compiler or a failed build leave `available()` False and the model on
its eager step. `use_fused = False` switches it off in-process (benchmarks, tests).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from calmd.model import fastscan

if TYPE_CHECKING:
    from calmd.model.mamba import ModelConfig

use_fused = True  # benchmarks and tests switch it off to run the eager step beside it

LANES = 8  # the kernel's vector width in floats: packed matrices' columns are padded to it
PANEL = 4 * LANES  # the columns of a panel of a packed matrix (step.cpp's kPanel)
# The per-layer pointer table, in step.cpp's LayerField order.
LAYER_FIELDS = ("norm1", "in_proj", "conv", "conv_bias", "x_proj", "dt_proj", "dt_bias", "A", "D",
                "out_proj", "norm2", "ffn_up", "ffn_down")  # fmt: skip


def available() -> bool:
    return use_fused and fastscan.library() is not None


@dataclass
class PackedWeights:
    """The kernel's copies of one model's weights, and what they were copied from."""

    tensors: list[Tensor]  # keeps the copies alive: `table` points into them
    table: ctypes.Array[ctypes.c_void_p]
    dims: ctypes.Array[ctypes.c_int64]  # d_model, n_layers, d_inner, d_state, d_conv, dt_rank, vocab, ffn
    tracked: list[Tensor]  # the parameters packed (those with a version counter)
    versions: list[int]  # their version counters when packed
    n_layers: int
    d_conv: int
    d_inner: int
    d_state: int
    vocab: int

    def fresh(self) -> bool:
        """True while no packed parameter was written to since packing (in-place writes move a
        tensor's version counter; tensors made under inference_mode have none and are not
        tracked: they can only be written to inside inference_mode)."""
        return [p._version for p in self.tracked] == self.versions


def supports(params: Mapping[str, Tensor]) -> bool:
    """Whether the kernel can run this model: CPU float32 parameters, and the library built."""
    return available() and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params.values())


def _transposed(weight: Tensor) -> Tensor:
    """(out, in) -> (in, out padded to LANES), padding columns zero, stored as panels of PANEL
    columns: each panel's (in, PANEL) block contiguous, the last one narrower (step.cpp reads a
    panel front to back)."""
    out, inp = weight.shape
    padded = torch.zeros(inp, -(-out // LANES) * LANES, dtype=torch.float32)
    padded[:, :out] = weight.detach().t()
    return torch.cat([padded[:, o : o + PANEL].reshape(-1) for o in range(0, padded.shape[1], PANEL)])


def _copy(t: Tensor) -> Tensor:
    return t.detach().to(torch.float32).contiguous().clone()


@torch.no_grad()
def pack(cfg: ModelConfig, params: Mapping[str, Tensor]) -> PackedWeights:
    """Copy the parameters (CalmModel.named_parameters(), CWGT names) into the kernel's layout."""
    tensors: list[Tensor | None] = []
    embedding = params["embedding.weight"]
    head = params["embedding.weight"] if cfg.tied else params["lm_head.weight"]
    tensors += [_copy(embedding), _transposed(head), _copy(params["norm_f.weight"])]
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        m = p + "mixer."
        conv = params[m + "conv1d.weight"]  # (E, 1, K)
        layer: dict[str, Tensor | None] = {
            "norm1": _copy(params[p + "norm1.weight"]),
            "in_proj": _transposed(params[m + "in_proj.weight"]),
            "conv": _copy(conv[:, 0].t()),  # (K, E)
            "conv_bias": _copy(params[m + "conv1d.bias"]),
            "x_proj": _transposed(params[m + "x_proj.weight"]),
            "dt_proj": _transposed(params[m + "dt_proj.weight"]),
            "dt_bias": _copy(params[m + "dt_proj.bias"]),
            "A": _copy(-torch.exp(params[m + "A_log"].float())),  # as Mamba.step computes it
            "D": _copy(params[m + "D"]),
            "out_proj": _transposed(params[m + "out_proj.weight"]),
            "norm2": None,
            "ffn_up": None,
            "ffn_down": None,
        }
        if cfg.ffn_expand:
            layer["norm2"] = _copy(params[p + "norm2.weight"])
            layer["ffn_up"] = _transposed(params[p + "ffn.up.weight"])
            layer["ffn_down"] = _transposed(params[p + "ffn.down.weight"])
        tensors += [layer[name] for name in LAYER_FIELDS]
    table = (ctypes.c_void_p * len(tensors))(*[None if t is None else t.data_ptr() for t in tensors])
    hidden = cfg.ffn_expand * cfg.d_model
    dims = (ctypes.c_int64 * 8)(cfg.d_model, cfg.n_layers, cfg.d_inner, cfg.d_state, cfg.d_conv,
                                cfg.dt_rank, cfg.vocab_size, hidden)  # fmt: skip
    tracked = [p for p in params.values() if not p.is_inference()]
    return PackedWeights(
        [t for t in tensors if t is not None], table, dims, tracked, [p._version for p in tracked],
        cfg.n_layers, cfg.d_conv, cfg.d_inner, cfg.d_state, cfg.vocab_size,
    )  # fmt: skip


def step(
    packed: PackedWeights, conv: Tensor, ssm: Tensor, token: Tensor, rows: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """One token per row through the whole model: logits (B, V), the new conv (L, B, K, E) and
    SSM (L, B, E, N) states. conv and ssm are the stacked states of `InferenceState`; row b of
    the result continues row `rows[b]` of them (all rows in order when None). Inputs are not
    modified. Raises IndexError for a token outside the vocabulary or a row outside the state."""
    return _run(packed, conv, ssm, token.reshape(-1, 1), rows, last_only=True)


def prefill(
    packed: PackedWeights, conv: Tensor, ssm: Tensor, tokens: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Every row of `tokens` (B, T) through the model from the states conv, ssm (as `step`):
    logits (B, T, V) and the states after the last token. The products of all B * T positions
    run together (as the parallel forward's matmuls do); the conv and the scan walk the tokens
    of each row in order."""
    return _run(packed, conv, ssm, tokens, None, last_only=False)


def _run(
    packed: PackedWeights, conv: Tensor, ssm: Tensor, tokens: Tensor, rows: Tensor | None, *, last_only: bool
) -> tuple[Tensor, Tensor, Tensor]:
    lib = fastscan.library()
    assert lib is not None, "faststep without the library: check supports() first"
    conv = conv.contiguous() if conv.dtype == torch.float32 else conv.float().contiguous()
    ssm = ssm.contiguous() if ssm.dtype == torch.float32 else ssm.float().contiguous()
    if tokens.dtype != torch.int64 or not tokens.is_contiguous():
        tokens = tokens.to(torch.int64).contiguous()
    batch_in = conv.shape[1]
    batch, length = tokens.shape
    if rows is not None:
        rows = rows.to(torch.int64).contiguous() if rows.dtype != torch.int64 else rows.contiguous()
        assert rows.shape == (batch,), "one source row per token"
    else:
        assert batch == batch_in, f"{batch} rows of tokens for a state of {batch_in} rows"
    n_layers, K, E, N = packed.n_layers, packed.d_conv, packed.d_inner, packed.d_state
    assert conv.shape == (n_layers, batch_in, K, E) and ssm.shape == (n_layers, batch_in, E, N)
    new_conv = torch.empty((n_layers, batch, K, E), dtype=torch.float32)
    new_ssm = torch.empty((n_layers, batch, E, N), dtype=torch.float32)
    shape = (batch, packed.vocab) if last_only else (batch, length, packed.vocab)
    logits = torch.empty(shape, dtype=torch.float32)
    failed = lib.calm_step_f32(
        packed.dims, packed.table, tokens.data_ptr(), length, None if rows is None else rows.data_ptr(),
        conv.data_ptr(), ssm.data_ptr(), batch_in, new_conv.data_ptr(), new_ssm.data_ptr(),
        logits.data_ptr(), last_only, batch, torch.get_num_threads(),
    )  # fmt: skip
    if failed:
        row = -1 - failed
        bad = [int(t) for t in tokens[row] if not 0 <= int(t) < packed.vocab]
        if bad:
            raise IndexError(f"row {row}: token {bad[0]} outside the vocabulary of {packed.vocab}")
        assert rows is not None
        raise IndexError(f"row {row}: source row {int(rows[row])} outside {batch_in} rows")
    return logits, new_conv, new_ssm
