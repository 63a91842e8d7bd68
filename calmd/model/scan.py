"""The selective scan's fast paths, and which one runs (calmd/model/mamba.py holds the model and
the reference loop, `selective_scan_ref`, that every path here is tested against).

- mamba-ssm's CUDA kernel: CUDA tensors, mamba_ssm installed, and no initial state (its kernel
  cannot take one);
- the fused C++ kernel (`fastscan.CppScanFn`, csrc/scan.cpp): CPU, when calmd/model/fastscan.py
  could build it;
- `SelectiveScanFn`: the PyTorch fast path, a custom autograd Function that runs the recurrence
  in time chunks (only (B, E, T, N) tensors, never (B, E, L, N)) and a hand-written reverse scan.

Shapes as in mamba.py's glossary: B batch, E d_inner, N d_state, L length, T a chunk of time.
`fast_scan` takes what `mamba.selective_scan` gives it: every input in one floating type, float32
at least, autocast off.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from calmd.model import fastscan


def _chunk_inputs(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, start: int, stop: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Time-major slices of one chunk: d, uc (T, B, E); Bt (T, B, N); dA, dBu (T, B, E, N)."""
    d = delta[:, :, start:stop].permute(2, 0, 1)  # (T, B, E)
    uc = u[:, :, start:stop].permute(2, 0, 1)  # (T, B, E)
    Bt = B[:, :, start:stop].permute(2, 0, 1)  # (T, B, N)
    dA = torch.exp(d[..., None] * A)  # (T, B, E, N)
    dBu = (d * uc)[..., None] * Bt[:, :, None, :]  # (T, B, E, N)
    return d, uc, Bt, dA, dBu


def _chunk_states(dA: Tensor, dBu: Tensor, h: Tensor) -> Tensor:
    """Run h_t = dA_t * h_{t-1} + dBu_t over one chunk; all states (T, B, E, N). Time-major, so
    each step reads and writes contiguous (B, E, N) blocks."""
    states = torch.empty_like(dBu)
    for t in range(dA.shape[0]):
        h = torch.addcmul(dBu[t], dA[t], h, out=states[t])
    return states


class SelectiveScanFn(torch.autograd.Function):
    """The CPU fast path: chunked recurrence forward, hand-written reverse scan backward.

    Saves only the inputs and the state at each chunk boundary; the backward pass recomputes a
    chunk's states from its boundary, then walks it backwards. Memory is O(T B E N) per chunk;
    sums over the state dimension are contractions (einsum -> batched matmul).
    """

    CHUNK = 16  # measured: 8-32 within a few percent; 16 keeps chunk tensors in L3 for nano

    @staticmethod
    def forward(
        ctx: Any, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
    ) -> tuple[Tensor, Tensor]:
        length = u.shape[2]
        chunk = SelectiveScanFn.CHUNK
        y = torch.empty_like(u)  # (B, E, L)
        h = h0
        boundaries = []
        for start in range(0, length, chunk):
            stop = min(start + chunk, length)
            _, _, _, dA, dBu = _chunk_inputs(u, delta, A, B, start, stop)
            boundaries.append(h)
            states = _chunk_states(dA, dBu, h)  # (T, B, E, N)
            y[:, :, start:stop] = torch.einsum("tben,bnt->bet", states, C[:, :, start:stop])
            h = states[-1]
        y = y + D[None, :, None] * u
        ctx.save_for_backward(u, delta, A, B, C, D, torch.stack(boundaries) if boundaries else h0[None])
        return y, h.clone()

    @staticmethod
    def backward(ctx: Any, gy: Tensor, gh_last: Tensor) -> tuple[Tensor | None, ...]:
        u, delta, A, B, C, D, boundaries = ctx.saved_tensors
        length = u.shape[2]
        chunk = SelectiveScanFn.CHUNK
        gu = gy * D[None, :, None]  # (B, E, L)
        gD = (gy * u).sum(dim=(0, 2))  # (E)
        gdelta = torch.empty_like(delta)
        gB = torch.empty_like(B)
        gC = torch.empty_like(C)
        gA = torch.zeros_like(A)
        g = gh_last.clone()  # dL/dh_t, carried backwards through time   (B, E, N)
        next_dA: Tensor | None = None  # dA of the step after the current one
        starts = list(range(0, length, chunk))
        for index in reversed(range(len(starts))):
            start = starts[index]
            stop = min(start + chunk, length)
            d, uc, Bt, dA, dBu = _chunk_inputs(u, delta, A, B, start, stop)
            h_start = boundaries[index]  # (B, E, N)
            states = _chunk_states(dA, dBu, h_start)  # (T, B, E, N)
            gyc = gy[:, :, start:stop].permute(2, 0, 1)  # (T, B, E)
            Ct = C[:, :, start:stop].permute(2, 0, 1)  # (T, B, N)
            gh = gyc[..., None] * Ct[:, :, None, :]  # dL/dh_t through y_t   (T, B, E, N)
            gC[:, :, start:stop] = torch.einsum("tben,tbe->bnt", states, gyc)
            # reverse scan, in place: gh_t += dA_{t+1} * gh_{t+1}
            for t in reversed(range(stop - start)):
                if next_dA is not None:
                    torch.addcmul(gh[t], next_dA, g, out=gh[t])
                else:
                    gh[t] += g
                g = gh[t]
                next_dA = dA[t]
            # dL/d(dt A) = gh_t * h_{t-1} * dA_t, with h_{t-1} the previous state (h_start first)
            g_dA = gh * dA
            g_dA[1:] *= states[:-1]
            g_dA[0] *= h_start
            gA += torch.einsum("tben,tbe->en", g_dA, d)
            gB_dot = torch.einsum("tben,tbn->tbe", gh, Bt)  # sum_n gh * B   (T, B, E)
            gdelta[:, :, start:stop] = (torch.einsum("tben,en->tbe", g_dA, A) + gB_dot * uc).permute(1, 2, 0)
            gu[:, :, start:stop] += (gB_dot * d).permute(1, 2, 0)
            gB[:, :, start:stop] = torch.einsum("tben,tbe->bnt", gh, d * uc)
        gh0 = g * next_dA if next_dA is not None else g
        return gu, gdelta, gA, gB, gC, gD, gh0


def fast_scan(
    u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, z: Tensor | None,
    h0: Tensor | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The fastest path this input can take: mamba-ssm's CUDA kernel, the fused C++ kernel, or
    `SelectiveScanFn`; the same results as the reference. Returns y (B, E, L), the last state
    (B, E, N)."""
    if h0 is None and _cuda_scan_available(u):
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

        y, last = selective_scan_fn(u, delta, A, B.contiguous(), C.contiguous(), D, z=z,
                                    return_last_state=True)  # fmt: skip
        return y, last
    if h0 is None:
        h0 = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    if fastscan.supports(u):  # mamba.selective_scan gave every input u's type
        y, h = fastscan.CppScanFn.apply(u, delta, A, B, C, D, h0)  # the fused kernel, when built
    else:
        y, h = SelectiveScanFn.apply(u, delta, A, B, C, D, h0)
    if z is not None:
        y = y * F.silu(z)
    return y, h


def _cuda_scan_available(x: Tensor) -> bool:
    return x.is_cuda and mamba_ssm_importable()


@functools.cache
def mamba_ssm_importable() -> bool:
    """Asked once: a failed import is not cached by Python, and every layer of every step asks."""
    try:
        import mamba_ssm  # noqa: F401  (only imported on a CUDA device)
    except ImportError:
        return False
    return True
