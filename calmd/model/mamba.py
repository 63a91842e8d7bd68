"""CALM: a byte-level Mamba language model, in one file that reads top to bottom.

Glossary (shapes in comments use these letters)
    B  batch size                  L  sequence length            V  vocabulary (320)
    D  d_model                     E  d_inner = expand * D       N  d_state
    K  d_conv (causal conv width)  R  dt_rank                    T  time chunk of the fast scan

Architecture: embedding (V, D) -> n_layers x [x + Mamba(RMSNorm(x)); x + FFN(RMSNorm(x)) when
ffn_expand > 0] -> RMSNorm -> LM head (the embedding matrix when tied, CWGT flag bit 0).

The mixer is Mamba (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces"), with the parameter names and shapes of `mamba_ssm.modules.mamba_simple.Mamba`
(bias=False, conv_bias=True), so weights move between this CPU path and mamba-ssm unchanged:
    in_proj.weight (2E, D)   conv1d.weight (E, 1, K)   conv1d.bias (E)   x_proj.weight (R+2N, E)
    dt_proj.weight (E, R)    dt_proj.bias (E)          A_log (E, N)      D (E)   out_proj.weight (D, E)

Selective scan, per channel e and state n:  h_t = exp(dt_t A) h_{t-1} + dt_t B_t u_t,
y_t = C_t . h_t + D u_t, then y * silu(z). `selective_scan_ref` below is that loop, with autograd
through it (slow, the reference); the fast paths it is tested against live in calmd/model/scan.py:
`SelectiveScanFn` (chunked PyTorch, a hand-written reverse scan), the fused C++ kernel, and
mamba-ssm's CUDA kernel when CUDA and mamba_ssm are both available.

Recurrent inference passes an explicit `InferenceState` (per-layer conv and SSM state) in and out
of `prefill()` and `step()`; a loop of `step()` equals the parallel `forward()` (tested).

CWGT flattening order (docs/model.md): `named_parameters()` order, i.e. embedding.weight, then
for each layer i: layers.i.norm1.weight, layers.i.mixer.{in_proj.weight, conv1d.weight,
conv1d.bias, x_proj.weight, dt_proj.weight, dt_proj.bias, A_log, D, out_proj.weight}, then (when
ffn_expand > 0) layers.i.norm2.weight, layers.i.ffn.up.weight, layers.i.ffn.down.weight; then
norm_f.weight; then lm_head.weight only when untied. Each array is flattened row-major
(calmd/model/checkpoint.py: `flatten`, `unflatten`, and the CWGT file).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from calmd.model import faststep, scan
from calmd.model.loss import supervised_nll

# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class ModelConfig:
    """Exactly the CWGT v5 header's hyper-parameters; travels inside the weight file."""

    d_model: int
    n_layers: int
    ffn_expand: int = 0
    expand: int = 2
    d_state: int = 16
    d_conv: int = 4
    dt_rank: int = 0  # 0: ceil(d_model / 16), mamba's "auto"
    vocab_size: int = 320
    l_max: int = 768
    tied: bool = True

    def __post_init__(self) -> None:
        if self.dt_rank == 0:
            object.__setattr__(self, "dt_rank", math.ceil(self.d_model / 16))
        u8, u16 = 0xFF, 0xFFFF  # the CWGT header's field widths
        widths = {"d_model": u16, "vocab_size": u16, "l_max": u16, "n_layers": u8, "ffn_expand": u8,
                  "expand": u8, "d_state": u8, "d_conv": u8, "dt_rank": u8}  # fmt: skip
        for name, limit in widths.items():
            value = getattr(self, name)
            low = 0 if name == "ffn_expand" else 1
            if not isinstance(value, int) or not low <= value <= limit:
                raise ValueError(f"model config {name}={value!r} must be an integer in {low}..{limit}")

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    def param_count(self) -> int:
        D, E, N, K, R, V = (
            self.d_model,
            self.d_inner,
            self.d_state,
            self.d_conv,
            self.dt_rank,
            self.vocab_size,
        )
        mixer = D * 2 * E + (E * K + E) + E * (R + 2 * N) + (R * E + E) + E * N + E + E * D
        ffn = (D + 2 * D * self.ffn_expand * D) if self.ffn_expand else 0
        per_layer = D + mixer + ffn
        return V * D + self.n_layers * per_layer + D + (0 if self.tied else V * D)


SIZES: dict[str, ModelConfig] = {
    # nano: the keystroke model; latency figures in docs/performance.md
    "nano": ModelConfig(d_model=128, n_layers=4, ffn_expand=0, expand=2, d_state=16, d_conv=4),
    "micro": ModelConfig(d_model=256, n_layers=6, ffn_expand=0, expand=2, d_state=16, d_conv=4),
    "mini": ModelConfig(d_model=384, n_layers=8, ffn_expand=2, expand=2, d_state=16, d_conv=4),
}

# --------------------------------------------------------------------------- selective scan


def selective_scan_ref(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, z: Tensor | None = None,
    h0: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The reference: a loop over time, autograd through it.

    u, delta (B, E, L) with delta already softplus'ed; A (E, N); B, C (B, N, L); D (E);
    z (B, E, L) or None; h0 (B, E, N) or None. Returns y (B, E, L) and the last state (B, E, N).
    """
    batch, channels, length = u.shape
    h = u.new_zeros(batch, channels, A.shape[1]) if h0 is None else h0
    ys = []
    for t in range(length):
        dA = torch.exp(delta[:, :, t, None] * A)  # (B, E, N)
        dBu = delta[:, :, t, None] * B[:, None, :, t] * u[:, :, t, None]  # (B, E, N)
        h = dA * h + dBu
        ys.append((h * C[:, None, :, t]).sum(-1))  # (B, E)
    y = torch.stack(ys, dim=-1) + D[None, :, None] * u  # (B, E, L)
    if z is not None:
        y = y * F.silu(z)
    return y, h


def selective_scan(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, z: Tensor | None = None,
    h0: Tensor | None = None, *, reference: bool = False,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The reference loop, or the fastest path the input can take (calmd/model/scan.py: mamba-ssm's
    CUDA kernel, the fused C++ kernel, the chunked PyTorch Function). Same results.

    The scan runs in the inputs' widest floating type, float32 at least, with autocast off: under
    autocast (`calm train --precision bf16`) u, B, C and z come in bfloat16 and delta in float32,
    and a bfloat16 state (8 bits of mantissa) would lose the sum over time within a few dozen
    steps; mamba-ssm's kernel accumulates in float32 too. y and the last state go back in u's type."""
    dtype, given = torch.float32, u.dtype
    for t in (u, delta, A, B, C, D, z, h0):
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    with torch.autocast(u.device.type, enabled=False):
        u, delta, A, B, C, D = (t.to(dtype) for t in (u, delta, A, B, C, D))
        z = None if z is None else z.to(dtype)
        h0 = None if h0 is None else h0.to(dtype)
        if reference:
            y, h = selective_scan_ref(u, delta, A, B, C, D, z, h0)
        else:
            y, h = scan.fast_scan(u, delta, A, B, C, D, z, h0)
    return y.to(given), h.to(given)


# --------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@dataclass
class LayerState:
    conv: Tensor  # (B, K, E): the last K inputs of the causal conv, oldest first (time-major, so
    #               a step shifts whole rows instead of striding over a width-K last axis)
    ssm: Tensor  # (B, E, N)


class InferenceState:
    """The recurrent state of every layer after `seen` tokens; passed into and returned by
    prefill/step. Stacked over layers, so that the fused step (calmd/model/faststep.py) reads it
    as two contiguous buffers and a beam search reorders it with two index_selects:
    conv (n_layers, B, K, E), ssm (n_layers, B, E, N)."""

    __slots__ = ("conv", "seen", "ssm")

    def __init__(self, conv: Tensor, ssm: Tensor, seen: int = 0) -> None:
        assert conv.dim() == 4 and ssm.dim() == 4, "stacked states: (n_layers, B, ...)"
        self.conv = conv
        self.ssm = ssm
        self.seen = seen

    @staticmethod
    def from_layers(layers: Sequence[LayerState], seen: int) -> InferenceState:
        conv, ssm = torch.stack([s.conv for s in layers]), torch.stack([s.ssm for s in layers])
        return InferenceState(conv, ssm, seen)

    @property
    def layers(self) -> list[LayerState]:
        """Per-layer views (writing to one writes to this state)."""
        return [LayerState(self.conv[i], self.ssm[i]) for i in range(self.conv.shape[0])]

    @property
    def batch(self) -> int:
        return self.conv.shape[1]

    def clone(self) -> InferenceState:
        return InferenceState(self.conv.clone(), self.ssm.clone(), self.seen)

    def expand(self, n: int) -> InferenceState:
        """Repeat a batch-1 state to n rows (one per candidate)."""
        assert self.batch == 1, "expand() repeats a single row"
        conv, ssm = self.conv.expand(-1, n, -1, -1), self.ssm.expand(-1, n, -1, -1)
        return InferenceState(conv.contiguous(), ssm.contiguous(), self.seen)

    def select(self, rows: Tensor | Sequence[int]) -> InferenceState:
        """Gather rows (beam search reorders candidates)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        return InferenceState(self.conv.index_select(1, index), self.ssm.index_select(1, index), self.seen)


class Mamba(nn.Module):
    """The selective SSM mixer; names and shapes as mamba_ssm.modules.mamba_simple.Mamba."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D, E, N, K, R = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.d_conv, cfg.dt_rank
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = E, N, K, R
        self.in_proj = nn.Linear(D, 2 * E, bias=False)
        self.conv1d = nn.Conv1d(E, E, kernel_size=K, groups=E, padding=K - 1, bias=True)
        self.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, E, bias=True)
        self.A_log = nn.Parameter(torch.empty(E, N))
        self.D = nn.Parameter(torch.empty(E))
        self.out_proj = nn.Linear(E, D, bias=False)
        self.reference_scan = False  # tests and benchmarks switch to the slow loop

    def forward(self, x: Tensor, state: LayerState | None = None) -> tuple[Tensor, LayerState]:
        """x (B, L, D) -> (B, L, D), continuing from `state` when given; returns the new state."""
        xz = self.in_proj(x).transpose(1, 2)  # (B, 2E, L)
        xs, z = xz.chunk(2, dim=1)  # (B, E, L) each
        if state is None:
            conv_in = F.pad(xs, (self.d_conv - 1, 0))  # (B, E, L+K-1)
        else:
            conv_in = torch.cat([state.conv[:, 1:].transpose(1, 2), xs], dim=2)  # K-1 previous inputs first
        new_conv = conv_in[:, :, -self.d_conv :].transpose(1, 2).contiguous()  # last K inputs (B, K, E)
        xc = F.silu(F.conv1d(conv_in, self.conv1d.weight, self.conv1d.bias, groups=self.d_inner))  # (B, E, L)
        dt, Bm, Cm = self.x_proj(xc.transpose(1, 2)).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt)).transpose(1, 2)  # (B, E, L)
        A = -torch.exp(self.A_log.float())  # (E, N)
        h0 = None if state is None else state.ssm
        y, h = selective_scan(
            xc, delta, A, Bm.transpose(1, 2).contiguous(), Cm.transpose(1, 2).contiguous(), self.D.float(), z,
            h0, reference=self.reference_scan,
        )  # fmt: skip
        return self.out_proj(y.transpose(1, 2)), LayerState(new_conv, h)

    def step(self, x: Tensor, state: LayerState) -> tuple[Tensor, LayerState]:
        """One token: x (B, D) -> (B, D). Same arithmetic as forward, without the time axis."""
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # (B, E) each
        conv = torch.cat([state.conv[:, 1:], xs[:, None]], dim=1)  # (B, K, E)
        assert self.conv1d.bias is not None
        xc = F.silu((conv * self.conv1d.weight[:, 0].t()).sum(1) + self.conv1d.bias)  # (B, E)
        dt, Bm, Cm = self.x_proj(xc).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))  # (B, E)
        A = -torch.exp(self.A_log.float())  # (E, N)
        dA = torch.exp(delta[:, :, None] * A)  # (B, E, N)
        # the outer product dt*x (x) B as a batched matmul: broadcasting addcmul was 7x slower
        h = torch.baddbmm(dA * state.ssm, (delta * xc)[:, :, None], Bm[:, None, :])  # (B, E, N)
        y = torch.bmm(h, Cm[:, :, None])[:, :, 0] + self.D * xc  # (B, E)
        y = y * F.silu(z)
        return self.out_proj(y), LayerState(conv, h)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, expand: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, expand * d_model, bias=False)
        self.down = nn.Linear(expand * d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.d_model)
        self.mixer = Mamba(cfg)
        self.norm2 = RMSNorm(cfg.d_model) if cfg.ffn_expand else None
        self.ffn = FeedForward(cfg.d_model, cfg.ffn_expand) if cfg.ffn_expand else None

    def forward(self, x: Tensor, state: LayerState | None = None) -> tuple[Tensor, LayerState]:
        mixed, new_state = self.mixer(self.norm1(x), state)
        x = x + mixed
        if self.ffn is not None and self.norm2 is not None:
            x = x + self.ffn(self.norm2(x))
        return x, new_state

    def step(self, x: Tensor, state: LayerState) -> tuple[Tensor, LayerState]:
        mixed, new_state = self.mixer.step(self.norm1(x), state)
        x = x + mixed
        if self.ffn is not None and self.norm2 is not None:
            x = x + self.ffn(self.norm2(x))
        return x, new_state


# --------------------------------------------------------------------------- the language model


class CalmModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model)
        self.lm_head = None if cfg.tied else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._traced_step: Any = None  # see trace_step()
        self._packed: faststep.PackedWeights | None = None  # the fused step's weights, see pack_weights()
        self._reference_scan = False  # see set_reference_scan()
        self.init_weights(0)

    # -- initialisation (mamba_ssm's Mamba.__init__ and _init_weights) -----------------------------

    @torch.no_grad()
    def init_weights(
        self, seed: int = 0, *, dt_min: float = 1e-3, dt_max: float = 0.1, dt_floor: float = 1e-4
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        cfg = self.cfg
        nn.init.normal_(self.embedding.weight, std=0.02, generator=gen)
        for block in self.layers:
            assert isinstance(block, Block)
            m = block.mixer
            for lin in (m.in_proj, m.x_proj, m.out_proj):
                bound = 1 / math.sqrt(lin.in_features)
                nn.init.uniform_(lin.weight, -bound, bound, generator=gen)
            bound = 1 / math.sqrt(cfg.d_conv)
            nn.init.uniform_(m.conv1d.weight, -bound, bound, generator=gen)
            assert m.conv1d.bias is not None
            nn.init.uniform_(m.conv1d.bias, -bound, bound, generator=gen)
            dt_std = cfg.dt_rank**-0.5
            nn.init.uniform_(m.dt_proj.weight, -dt_std, dt_std, generator=gen)
            # dt_proj.bias = softplus^-1(dt), dt log-uniform in [dt_min, dt_max]
            dt = torch.exp(torch.rand(cfg.d_inner, generator=gen) * (math.log(dt_max) - math.log(dt_min))
                           + math.log(dt_min)).clamp(min=dt_floor)  # fmt: skip
            m.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            m.A_log.copy_(
                torch.log(torch.arange(1, cfg.d_state + 1, dtype=torch.float32)).repeat(cfg.d_inner, 1)
            )
            m.D.fill_(1.0)
            # GPT-2 style: scale the residual-writing projection by 1/sqrt(n_layers)
            m.out_proj.weight.mul_(1 / math.sqrt(cfg.n_layers))
            if block.ffn is not None:
                nn.init.normal_(block.ffn.up.weight, std=0.02, generator=gen)
                nn.init.normal_(block.ffn.down.weight, std=0.02 / math.sqrt(cfg.n_layers), generator=gen)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=0.02, generator=gen)

    def set_reference_scan(self, on: bool) -> None:
        self._reference_scan = on  # prefill then runs the parallel path too, never the fused one
        for block in self.layers:
            assert isinstance(block, Block)
            block.mixer.reference_scan = on

    # -- parallel path ---------------------------------------------------------------------------

    def _head(self, x: Tensor) -> Tensor:
        x = self.norm_f(x)
        return x @ self.embedding.weight.t() if self.lm_head is None else self.lm_head(x)  # (..., V)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, L) int64 -> logits (B, L, V)."""
        logits, _ = self.prefill(tokens)
        return logits

    def prefill(self, tokens: Tensor, state: InferenceState | None = None) -> tuple[Tensor, InferenceState]:
        """Run `tokens` (B, L) through the model, continuing from `state` when given. Returns
        logits (B, L, V) and the state after the last token.

        Without autograd, on the CPU, the fused C++ kernel of `step` does it (calmd/model/
        faststep.py: all positions' products together, the conv and scan in order; measured
        1.4x the parallel path at 768 tokens, 3.7x at 26, docs/performance.md); otherwise the
        parallel path below, which training differentiates."""
        if not torch.is_grad_enabled() and tokens.shape[1] and not self._reference_scan:
            packed = self._fused_weights()
            if packed is not None and tokens.device.type == "cpu":
                start = self.empty_state(tokens.shape[0]) if state is None else state
                logits, conv, ssm = faststep.prefill(packed, start.conv, start.ssm, tokens)
                return logits, InferenceState(conv, ssm, start.seen + tokens.shape[1])
        x = self.embedding(tokens)  # (B, L, D)
        new_layers = []
        for i, block in enumerate(self.layers):
            x, layer_state = block(x, None if state is None else state.layers[i])
            new_layers.append(layer_state)
        seen = (0 if state is None else state.seen) + tokens.shape[1]
        return self._head(x), InferenceState.from_layers(new_layers, seen)

    def loss(self, tokens: Tensor, loss_mask: Tensor) -> Tensor:
        """Mean next-token cross entropy over the supervised targets (calmd/model/loss.py)."""
        return supervised_nll(self, tokens, loss_mask) / loss_mask[:, 1:].sum().clamp(min=1)

    # -- recurrent path --------------------------------------------------------------------------

    def empty_state(self, batch: int = 1) -> InferenceState:
        cfg, weight = self.cfg, self.embedding.weight
        L, E, K, N = cfg.n_layers, cfg.d_inner, cfg.d_conv, cfg.d_state
        return InferenceState(weight.new_zeros(L, batch, K, E), weight.new_zeros(L, batch, E, N), 0)

    def step(
        self, state: InferenceState, token: Tensor, rows: Tensor | Sequence[int] | None = None
    ) -> tuple[Tensor, InferenceState]:
        """One token per row: token (B,) -> logits (B, V) and the state after it. `state` is not
        modified. With `rows`, row b continues row rows[b] of `state`: the same as
        `step(state.select(rows), token)`, which the fused step does in the same call.

        Without autograd the fused C++ step runs (calmd/model/faststep.py: CPU float32 and the
        library built), or the TorchScript trace when `trace_step()` asked for it; otherwise, and
        as the reference, `step_eager`."""
        if not torch.is_grad_enabled():
            if self._traced_step is not None:
                if rows is not None:
                    state = state.select(rows)
                flat = [t for s in state.layers for t in (s.conv, s.ssm)]
                logits, *out = self._traced_step(token, *flat)
                layers = [LayerState(out[2 * i], out[2 * i + 1]) for i in range(self.cfg.n_layers)]
                return logits, InferenceState.from_layers(layers, state.seen + 1)
            packed = self._fused_weights()
            if packed is not None and state.conv.device.type == "cpu":
                index = None if rows is None else torch.as_tensor(rows, dtype=torch.long)
                logits, conv, ssm = faststep.step(packed, state.conv, state.ssm, token, index)
                return logits, InferenceState(conv, ssm, state.seen + 1)
        if rows is not None:
            state = state.select(rows)
        return self.step_eager(state, token)

    def _fused_weights(self) -> faststep.PackedWeights | None:
        """The fused step's packed weights: packed at eval(), packed again when a parameter was
        written to since (its version counter moved) or the module converted; None when the
        kernel cannot run this model (no library, CUDA, float64, CALM_NO_CPP_SCAN,
        faststep.use_fused off)."""
        packed = self._packed
        if packed is not None and faststep.use_fused and packed.fresh():
            return packed
        return self.pack_weights()

    def pack_weights(self) -> faststep.PackedWeights | None:
        """(Re)pack the weights for the fused step; done by eval(), and by a step after the
        weights changed. Returns None, dropping any old pack, when the kernel cannot run."""
        weight = self.embedding.weight  # a quick no for CUDA and float64 models, at every step
        if not faststep.available() or weight.device.type != "cpu" or weight.dtype != torch.float32:
            self._packed = None
            return None
        params = dict(self.named_parameters())
        self._packed = faststep.pack(self.cfg, params) if faststep.supports(params) else None
        return self._packed

    def _apply(self, fn: Any, recurse: bool = True) -> CalmModel:
        """.to(), .double(), .cuda() and friends replace the parameters' storage: pack again."""
        super()._apply(fn, recurse)
        self._packed = None
        return self

    def train(self, mode: bool = True) -> CalmModel:
        """eval() packs the fused step's weights now rather than at the first keystroke; train()
        drops them (an optimizer is about to change the weights)."""
        super().train(mode)
        if mode:
            self._packed = None
        else:
            self.pack_weights()
        return self

    @torch.no_grad()
    def trace_step(self) -> None:
        """Make `step` a frozen TorchScript trace of `step_eager` (halves its per-token overhead
        at batch 1, docs/performance.md). Weights are baked in: loading new ones drops the trace.
        Used only without autograd; tested against `step_eager`."""
        self.eval()
        n_layers = self.cfg.n_layers

        model = self

        class _FlatStep(nn.Module):
            def forward(self, token: Tensor, *flat: Tensor) -> tuple[Tensor, ...]:
                layers = [LayerState(flat[2 * i], flat[2 * i + 1]) for i in range(n_layers)]
                logits, new = model.step_eager(InferenceState.from_layers(layers, 0), token)
                return (logits, *[t for i in range(n_layers) for t in (new.conv[i], new.ssm[i])])

        example = self.empty_state(2)
        flat = [t for s in example.layers for t in (s.conv, s.ssm)]
        wanted = {name: p.requires_grad for name, p in self.named_parameters()}
        try:
            self.requires_grad_(False)  # the trace bakes the weights in as constants
            with warnings.catch_warnings():
                # torch 2.13 marks torch.jit deprecated; measured: torch.compile gives the same
                # per-step time after 5-17 s of warm-up, the trace takes 0.1-0.6 s (performance.md)
                warnings.simplefilter("ignore", DeprecationWarning)
                traced = torch.jit.trace(_FlatStep(), (torch.zeros(2, dtype=torch.long), *flat))
                self._traced_step = torch.jit.freeze(traced.eval())
        finally:
            for name, p in self.named_parameters():
                p.requires_grad_(wanted[name])

    def step_eager(self, state: InferenceState, token: Tensor) -> tuple[Tensor, InferenceState]:
        x = self.embedding(token)  # (B, D)
        new_layers = []
        for i, block in enumerate(self.layers):
            assert isinstance(block, Block)
            x, new_state = block.step(x, LayerState(state.conv[i], state.ssm[i]))
            new_layers.append(new_state)
        return self._head(x), InferenceState.from_layers(new_layers, state.seen + 1)

    # -- CWGT flattening --------------------------------------------------------------------------

    def to_named_arrays(self) -> list[tuple[str, npt.NDArray[np.float32]]]:
        """Parameters in CWGT order (module docstring), float32, C-contiguous."""
        return [
            (name, p.detach().cpu().float().contiguous().numpy().copy())
            for name, p in self.named_parameters()
        ]

    @torch.no_grad()
    def load_named_arrays(self, arrays: list[tuple[str, npt.NDArray[np.float32]]]) -> None:
        self._traced_step = None  # it holds the old weights (the fused step's pack sees the copy_)
        params = dict(self.named_parameters())
        names = [name for name, _ in arrays]
        if names != list(params):
            missing = set(params) - set(names)
            extra = set(names) - set(params)
            raise ValueError(f"parameter names differ: missing {sorted(missing)}, unexpected {sorted(extra)}")
        for name, array in arrays:
            p = params[name]
            if tuple(array.shape) != tuple(p.shape):
                raise ValueError(
                    f"parameter {name}: shape {tuple(array.shape)}, the model needs {tuple(p.shape)}"
                )
            p.copy_(torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)))
