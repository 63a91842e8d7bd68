"""The model: recurrent step == parallel forward, fast scan == reference scan, CWGT round trips."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from calmd.errors import FormatError
from calmd.formats.cwgt import Metadata, read_cwgt
from calmd.model import fastscan, faststep
from calmd.model.checkpoint import flatten, load_model, save_model, unflatten
from calmd.model.mamba import SIZES, CalmModel, ModelConfig, selective_scan
from calmd.model.scan import SelectiveScanFn
from tests.support.builders import scan_inputs
from tests.support.tools import need

TINY = ModelConfig(d_model=16, n_layers=2, ffn_expand=2, expand=2, d_state=4, d_conv=4)


def tiny_model(cfg: ModelConfig = TINY, seed: int = 1) -> CalmModel:
    torch.manual_seed(seed)
    model = CalmModel(cfg)
    model.init_weights(seed)
    # A non-trivial D, conv and norm so that every parameter influences the output.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


# --------------------------------------------------------------------------- the scan


@pytest.fixture(params=["cpp", "torch"])
def scan_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each fast path in turn: the fused C++ kernel (calmd/model/fastscan.py), the chunked PyTorch one."""
    if request.param == "torch":
        monkeypatch.setattr(fastscan, "use_cpp", False)
    elif fastscan.library() is None:
        need("g++")  # then CI fails here rather than skip the kernel's tests
        pytest.skip(f"the C++ scan is not available here: {fastscan.unavailable_reason()}")
    return str(request.param)


@pytest.mark.parametrize(
    ("batch", "length", "n"),
    # lengths inside one chunk, at its border, and across two and more (SelectiveScanFn.CHUNK)
    [
        (2, 1, 4),
        (2, 5, 4),
        (3, SelectiveScanFn.CHUNK, 16),
        (2, 2 * SelectiveScanFn.CHUNK + 5, 4),
        (1, 3 * SelectiveScanFn.CHUNK - 1, 5),
    ],
)
def test_fast_scan_equals_reference_values_and_gradients(
    scan_impl: str, batch: int, length: int, n: int
) -> None:
    inputs = scan_inputs(batch, 6, length, n)
    ref_in = [t.clone().requires_grad_(True) for t in inputs]
    fast_in = [t.clone().requires_grad_(True) for t in inputs]
    y_ref, h_ref = selective_scan(*ref_in, reference=True)
    y_fast, h_fast = selective_scan(*fast_in)
    torch.testing.assert_close(y_fast, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_fast, h_ref, atol=1e-5, rtol=1e-5)
    g = torch.Generator().manual_seed(3)
    gy, gh = torch.randn(y_ref.shape, generator=g), torch.randn(h_ref.shape, generator=g)
    ((y_ref * gy).sum() + (h_ref * gh).sum()).backward()
    ((y_fast * gy).sum() + (h_fast * gh).sum()).backward()
    names = ["u", "delta", "A", "B", "C", "D", "z", "h0"]
    for name, a, b in zip(names, fast_in, ref_in, strict=True):
        assert a.grad is not None and b.grad is not None, name
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_fast_scan_passes_gradcheck_in_float64(scan_impl: str) -> None:
    inputs = [t.requires_grad_(True) for t in scan_inputs(1, 3, 19, 2, dtype=torch.float64)]
    assert torch.autograd.gradcheck(lambda *xs: selective_scan(*xs), inputs, eps=1e-6, atol=1e-5)


# --------------------------------------------------------------------------- recurrent == parallel


@pytest.mark.parametrize("fused", [True, False], ids=["fused step", "eager step"])
def test_prefill_then_steps_equal_forward_at_every_split(
    fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fused C++ kernel (calmd/model/faststep.py: the step and the prefill) and with the
    eager step and parallel prefill; `forward` is the parallel path (with autograd) in both."""
    if fused and fastscan.library() is None:
        need("g++")
        pytest.skip(f"the C++ kernels are not available here: {fastscan.unavailable_reason()}")
    monkeypatch.setattr(faststep, "use_fused", fused)
    model = tiny_model()
    assert (model._fused_weights() is not None) == fused
    tokens = torch.randint(0, 320, (1, 24), generator=torch.Generator().manual_seed(5))
    full = model(tokens)[0].detach()  # (L, V)
    with torch.no_grad():
        for split in range(tokens.shape[1] + 1):
            logits = []
            if split:
                pre, state = model.prefill(tokens[:, :split])
                logits.append(pre[0])
            else:
                state = model.empty_state(1)
            for t in range(split, tokens.shape[1]):
                out, state = model.step(state, tokens[:, t])
                logits.append(out)  # (1, V)
            got = torch.cat(logits)  # (L, V)
            assert got.shape == full.shape
            assert (got - full).abs().max().item() <= 1e-4, f"split at {split}"
            assert state.seen == tokens.shape[1]


def test_prefill_in_pieces_equals_one_prefill() -> None:
    model = tiny_model()
    tokens = torch.randint(0, 320, (2, 30), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        whole, s_whole = model.prefill(tokens)
        a, s = model.prefill(tokens[:, :11])
        b, s = model.prefill(tokens[:, 11:], s)
    assert torch.allclose(torch.cat([a, b], 1), whole, atol=1e-5)
    for x, y in zip(s.layers, s_whole.layers, strict=True):
        assert torch.allclose(x.ssm, y.ssm, atol=1e-5) and torch.allclose(x.conv, y.conv, atol=1e-6)


def test_batched_step_equals_rows_stepped_alone_and_clone_is_independent() -> None:
    model = tiny_model()
    ctx = torch.randint(0, 320, (1, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        _, state = model.prefill(ctx)
        batched = state.expand(3)
        nxt = torch.tensor([10, 200, 300])
        logits, after = model.step(batched, nxt)
        for row in range(3):
            alone, _ = model.step(state.clone(), nxt[row : row + 1])
            assert torch.allclose(logits[row], alone[0], atol=1e-5)
        picked = after.select([2, 0])
        assert torch.equal(picked.layers[0].ssm[0], after.layers[0].ssm[2])
        copy = state.clone()
        copy.layers[0].ssm.add_(1.0)
        assert not torch.equal(copy.layers[0].ssm, state.layers[0].ssm)


def test_reference_scan_model_equals_fast_model(scan_impl: str) -> None:
    model = tiny_model()
    tokens = torch.randint(0, 320, (2, 40), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    fast_loss = model.loss(tokens, mask)
    fast_loss.backward()
    fast_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.set_reference_scan(True)
    ref_loss = model.loss(tokens, mask)
    ref_loss.backward()
    assert abs(fast_loss.item() - ref_loss.item()) < 1e-5
    for name, p in model.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(fast_grads[name], p.grad, atol=1e-5, rtol=1e-4)


def test_loss_ignores_unsupervised_positions() -> None:
    model = tiny_model()
    a = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(9))
    mask = torch.zeros_like(a, dtype=torch.bool)
    mask[:, 12:] = True
    b = a.clone()
    b[:, 12:] = (b[:, 12:] + 1) % 256  # change only supervised targets...
    c = a.clone()
    c[:, 15:] = 0
    # ...the loss changes; padding appended after a masked-out tail does not change it
    assert model.loss(a, mask).item() != pytest.approx(model.loss(b, mask).item())
    padded = torch.cat([a, torch.zeros(1, 7, dtype=a.dtype)], 1)
    pmask = torch.cat([mask, torch.zeros(1, 7, dtype=torch.bool)], 1)
    assert model.loss(padded, pmask).item() == pytest.approx(model.loss(a, mask).item(), abs=1e-6)
    assert math.isfinite(model.loss(c, mask).item())


# --------------------------------------------------------------------------- names, sizes, files


def test_mixer_parameter_names_and_shapes_match_mamba_simple() -> None:
    cfg = SIZES["nano"]
    model = CalmModel(cfg)
    E, D, N, K, R = cfg.d_inner, cfg.d_model, cfg.d_state, cfg.d_conv, cfg.dt_rank
    expected = {
        "in_proj.weight": (2 * E, D),
        "conv1d.weight": (E, 1, K),
        "conv1d.bias": (E,),
        "x_proj.weight": (R + 2 * N, E),
        "dt_proj.weight": (E, R),
        "dt_proj.bias": (E,),
        "A_log": (E, N),
        "D": (E,),
        "out_proj.weight": (D, E),
    }
    mixer = {name: tuple(p.shape) for name, p in model.layers[0].mixer.named_parameters()}  # type: ignore[union-attr]
    assert mixer == expected


@pytest.mark.parametrize("size", sorted(SIZES))
def test_param_count_matches_the_module(size: str) -> None:
    cfg = SIZES[size]
    model = CalmModel(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.param_count()


def test_untied_head_is_counted_and_flattened_last() -> None:
    cfg = ModelConfig(d_model=16, n_layers=1, d_state=4, tied=False)
    model = CalmModel(cfg)
    names = [n for n, _ in model.to_named_arrays()]
    assert names[0] == "embedding.weight" and names[-2:] == ["norm_f.weight", "lm_head.weight"]
    assert flatten(model).size == cfg.param_count()


def test_flatten_unflatten_round_trip() -> None:
    model = tiny_model()
    again = unflatten(TINY, flatten(model))
    tokens = torch.randint(0, 320, (1, 12))
    with torch.no_grad():
        assert torch.equal(model(tokens), again(tokens))
    with pytest.raises(ValueError, match="needs"):
        unflatten(TINY, flatten(model)[:-1])


def test_config_rejects_values_the_header_cannot_hold() -> None:
    with pytest.raises(ValueError, match="d_model"):
        ModelConfig(d_model=70000, n_layers=1)
    with pytest.raises(ValueError, match="n_layers"):
        ModelConfig(d_model=16, n_layers=0)
    assert ModelConfig(d_model=100, n_layers=1).dt_rank == 7  # ceil(100/16), mamba's "auto"


def test_save_load_gives_identical_logits(tmp_path: Path) -> None:
    model = tiny_model()
    path = save_model(tmp_path / "m.cwgt", model, Metadata(domain="shell"))
    loaded = load_model(path)
    assert loaded.model.cfg == model.cfg
    assert read_cwgt(path).header.param_count == TINY.param_count()
    tokens = torch.randint(0, 320, (2, 33))
    with torch.no_grad():
        assert torch.equal(model(tokens), loaded.model(tokens))


def test_load_rejects_a_header_that_disagrees_with_param_count(tmp_path: Path) -> None:
    model = tiny_model()
    path = save_model(tmp_path / "m.cwgt", model, Metadata(domain="shell"))
    raw = bytearray(path.read_bytes())
    # d_state (u8 at offset 15, docs/formats.md): another value needs another parameter count
    assert raw[15] == TINY.d_state
    raw[15] = 5
    bad = tmp_path / "bad.cwgt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(FormatError) as info:
        load_model(bad)
    assert info.value.field == "param_count"


def test_load_rejects_non_finite_weights(tmp_path: Path) -> None:
    model = tiny_model()
    with torch.no_grad():
        model.norm_f.weight[3] = float("nan")
    path = save_model(tmp_path / "nan.cwgt", model, Metadata(domain="shell"))
    with pytest.raises(FormatError, match=r"finite|NaN|nan"):
        load_model(path)


def test_init_weights_is_seeded_and_follows_mamba() -> None:
    a, b = CalmModel(TINY), CalmModel(TINY)
    a.init_weights(3)
    b.init_weights(3)
    assert np.array_equal(flatten(a), flatten(b))
    b.init_weights(4)
    assert not np.array_equal(flatten(a), flatten(b))
    mixer = a.layers[0].mixer  # type: ignore[union-attr]
    A = -torch.exp(mixer.A_log)
    assert torch.allclose(A[0], -torch.arange(1, TINY.d_state + 1, dtype=torch.float32))
    dt = torch.nn.functional.softplus(mixer.dt_proj.bias)
    assert dt.min().item() >= 1e-4 - 1e-7 and dt.max().item() <= 0.1 + 1e-6


def test_traced_step_equals_eager_step_and_is_dropped_with_new_weights() -> None:
    model = tiny_model()
    tokens = torch.randint(0, 320, (3, 6), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        _, start = model.prefill(tokens[:, :3])
        eager_state, traced_state = start.clone(), start.clone()
        model.trace_step()
        assert model._traced_step is not None
        for t in range(3, 6):  # batch 3, though the trace was recorded at batch 2
            e_logits, eager_state = model.step_eager(eager_state, tokens[:, t])
            t_logits, traced_state = model.step(traced_state, tokens[:, t])
            assert torch.allclose(e_logits, t_logits, atol=1e-5)
        assert all(p.requires_grad for p in model.parameters())
        model.load_named_arrays(tiny_model(seed=2).to_named_arrays())
    assert model._traced_step is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (and mamba_ssm for its kernel)")
def test_cuda_scan_equals_reference() -> None:
    u, delta, A, B, C, D, z, _ = [t.cuda() for t in scan_inputs(2, 8, 40, 4)]
    # no initial state: mamba-ssm's kernel takes none
    y_ref, h_ref = selective_scan(u, delta, A, B, C, D, z, reference=True)
    y_fast, h_fast = selective_scan(u, delta, A, B, C, D, z)
    torch.testing.assert_close(y_fast, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h_fast, h_ref, atol=1e-4, rtol=1e-4)
