"""The CUDA path (issue 34): the model and `calm train` on a GPU against the CPU, the reference.

These run where CUDA is available (bench/gpu.sh runs them on the GPU machine: `pytest -m cuda`)
and skip elsewhere. With CALM_CUDA_TESTS_ON_CPU=1 (`bench/gpu.sh --dry-run`) they run with the
CPU in the GPU's place: every comparison is then the CPU against itself and proves little, but
every line of every test runs, so a GPU's scarce minutes are not spent finding a typo.

Tolerances, stated once:
- float32 (TF32 off, so the GPU's products are float32's): logits within 1e-4 (absolute, and
  relative to their size) of the CPU's; the scan's values and input gradients within 1e-4 of
  the reference loop's.
- bfloat16 autocast (the products in bfloat16 with float32 accumulation; the scan and the loss
  in float32): every next-byte distribution within 0.1 nats of float32's, averaged under the
  float32 probabilities (measured on the CPU with CPU autocast: at most 0.03 on the packaged
  model), and the mean loss of the supervised bytes within 1% (measured: 0.02%).
- Training: float32 steps on the GPU give the CPU's losses within 1e-3 (relative) step by step;
  bfloat16 steps stay within 0.05 nats of them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from calmd import paths
from calmd.formats.ctds import pad_sequences, write_ctds
from calmd.formats.tokenizer import DEFAULT_SHELL_TEMPLATE, atn_position, build_sequence
from calmd.model import scan
from calmd.model.checkpoint import load_model, save_model
from calmd.model.generate import Generator
from calmd.model.mamba import CalmModel, selective_scan
from calmd.training.train import TrainConfig, TrainResult, train
from tests.support.builders import scan_inputs
from tests.support.tiny_model import COMMANDS, CONTEXT


def _gpu() -> torch.device | None:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("CALM_CUDA_TESTS_ON_CPU") == "1":
        return torch.device("cpu")
    return None


GPU = _gpu()
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(GPU is None, reason="needs CUDA (CALM_CUDA_TESTS_ON_CPU=1 runs them on the CPU)"),
]
FP32 = 1e-4
BF16_NATS = 0.1  # the probability-weighted gap of one next-byte distribution
BF16_LOSS = 0.01  # relative gap of the mean supervised loss
TRAIN_FP32 = 1e-3
TRAIN_BF16_NATS = 0.05
CONTEXTS = [
    {"history": [{"cmd": "git status", "exit": 0}, {"cmd": "cd src", "exit": 0}], "cwd": "/home/u/p",
     "input": text}
    for text in ("git commit -m 'wip'", "ls -la", "docker run --rm -it ubuntu bash", "make -j8 test")
]  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def _true_float32() -> Iterator[None]:
    """cuDNN may run float32 convolutions in TF32 (10 bits of mantissa) by default: off for this
    module (its training runs included), so that float32 means float32 on both sides. (Newer
    torch versions may warn that these flags give way to `fp32_precision`: not this test's concern.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def packaged() -> CalmModel:
    """The packaged nano model: trained weights, so the logits have a trained model's range."""
    return load_model(paths.packaged_weights()).model


def batch() -> tuple[Tensor, Tensor]:
    seqs = [build_sequence(DEFAULT_SHELL_TEMPLATE, c, training=True) for c in CONTEXTS]
    tokens, mask = pad_sequences(seqs, [atn_position(s) for s in seqs])
    return torch.from_numpy(tokens), torch.from_numpy(mask)


def on_gpu(model: CalmModel) -> CalmModel:
    assert GPU is not None
    return model.to(GPU).eval()


# --------------------------------------------------------------------------- the scan


@pytest.mark.parametrize("with_state", [False, True], ids=["from zero", "from a state"])
def test_pytorch_scan_on_the_gpu_equals_the_reference_values_and_gradients(
    with_state: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunked PyTorch scan (mamba-ssm's kernel kept out) against the reference loop, across
    three chunk borders."""
    assert GPU is not None
    monkeypatch.setattr(scan, "_cuda_scan_available", lambda x: False)
    inputs = [t.to(GPU) for t in scan_inputs(2, 8, 3 * scan.SelectiveScanFn.CHUNK + 5, 4)]
    if not with_state:
        inputs[-1] = None  # type: ignore[call-overload]
    ref_in = [None if t is None else t.clone().requires_grad_(True) for t in inputs]
    fast_in = [None if t is None else t.clone().requires_grad_(True) for t in inputs]
    y_ref, h_ref = selective_scan(*ref_in, reference=True)
    y_fast, h_fast = selective_scan(*fast_in)
    torch.testing.assert_close(y_fast, y_ref, atol=FP32, rtol=FP32)
    torch.testing.assert_close(h_fast, h_ref, atol=FP32, rtol=FP32)
    g = torch.Generator().manual_seed(3)
    gy, gh = torch.randn(y_ref.shape, generator=g).to(GPU), torch.randn(h_ref.shape, generator=g).to(GPU)
    ((y_ref * gy).sum() + (h_ref * gh).sum()).backward()
    ((y_fast * gy).sum() + (h_fast * gh).sum()).backward()
    for ref, fast in zip(ref_in, fast_in, strict=True):
        if ref is not None:
            torch.testing.assert_close(fast.grad, ref.grad, atol=FP32, rtol=FP32)


@pytest.mark.skipif(not scan.mamba_ssm_importable(), reason="mamba_ssm is not installed")
def test_mamba_ssm_kernel_equals_the_pytorch_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where mamba-ssm is installed, its kernel serves the scans that start from zero."""
    assert GPU is not None
    inputs = [t.to(GPU).requires_grad_(True) for t in scan_inputs(2, 8, 70, 16)[:-1]]
    y_kernel, h_kernel = selective_scan(*inputs)
    monkeypatch.setattr(scan, "_cuda_scan_available", lambda x: False)
    y_torch, h_torch = selective_scan(*[t.detach().clone() for t in inputs])
    torch.testing.assert_close(y_kernel, y_torch, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(h_kernel, h_torch, atol=1e-3, rtol=1e-3)


# --------------------------------------------------------------------------- the model


def test_forward_on_the_gpu_equals_the_cpu_in_float32() -> None:
    tokens, _ = batch()
    cpu = packaged()
    with torch.no_grad():
        expected = cpu(tokens)
        got = on_gpu(packaged())(tokens.to(GPU)).cpu()
    scale = float(expected.abs().max())
    assert scale > 5  # a trained model's logits: the tolerance below is not met by small numbers
    torch.testing.assert_close(got, expected, atol=FP32 * scale, rtol=FP32)


def test_recurrent_step_on_the_gpu_equals_the_parallel_forward() -> None:
    """prefill of a prefix, then one step per token: the daemon's recurrence, on the GPU."""
    tokens, _ = batch()
    tokens = tokens.to(GPU)
    model = on_gpu(packaged())
    split = 20
    with torch.no_grad():
        expected = model(tokens)
        logits, state = model.prefill(tokens[:, :split])
        stepped = [logits]
        for t in range(split, tokens.shape[1]):
            step_logits, state = model.step(state, tokens[:, t])
            stepped.append(step_logits[:, None])
    got = torch.cat(stepped, dim=1)
    scale = float(expected.abs().max())
    torch.testing.assert_close(got, expected, atol=FP32 * scale, rtol=FP32)
    assert state.seen == tokens.shape[1]


def test_bfloat16_autocast_on_the_gpu_stays_near_the_cpu_float32() -> None:
    """The forward pass that training differentiates (with autograd on: without, the CPU would take
    its fused float32 kernel, which autocast does not reach)."""
    assert GPU is not None
    tokens, mask = batch()
    with torch.no_grad():
        expected = F.log_softmax(packaged()(tokens), dim=-1)
    with torch.autocast(GPU.type, dtype=torch.bfloat16):
        logits = on_gpu(packaged())(tokens.to(GPU)).detach()
    assert logits.dtype == torch.bfloat16  # the head's product ran in bfloat16
    got = F.log_softmax(logits.float(), dim=-1).cpu()
    gap = (expected.exp() * (got - expected).abs()).sum(-1)  # (B, L): nats under float32's p
    assert float(gap.max()) <= BF16_NATS

    def mean_loss(logp: Tensor) -> float:
        picked = logp[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
        return float(-(picked * mask[:, 1:]).sum() / mask[:, 1:].sum())

    assert mean_loss(got) == pytest.approx(mean_loss(expected), rel=BF16_LOSS)


# --------------------------------------------------------------------------- training


def commands_dataset(path: Path) -> Path:
    """tests/support/tiny_model.py's commands after its context, the first one three times as often."""
    seqs = [build_sequence(DEFAULT_SHELL_TEMPLATE, {**CONTEXT, "input": c}, training=True) for c in COMMANDS]
    return write_ctds(path, [*seqs, seqs[0], seqs[0]])


def run(tmp: Path, data: Path, name: str, device: str, precision: str, steps: int, lr: float) -> TrainResult:
    cfg = TrainConfig(model="new", size="nano", dataset=str(data), output=str(tmp / f"{name}.cwgt"),
                      epochs=10_000, max_steps=steps, lr=lr, batch_size=6, val_fraction=0, fisher_samples=4,
                      device=device, precision=precision, quiet=True)  # fmt: skip
    return train(cfg)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TrainResult]:
    """The same 20 steps from the same start on the CPU, and on the GPU in float32 and bfloat16;
    then a GPU run long enough to learn the commands."""
    assert GPU is not None
    tmp = tmp_path_factory.mktemp("cuda-train")
    data = commands_dataset(tmp / "commands.ctds")
    return {
        "cpu": run(tmp, data, "cpu", "cpu", "fp32", 20, 1e-3),
        "fp32": run(tmp, data, "fp32", GPU.type, "fp32", 20, 1e-3),
        "bf16": run(tmp, data, "bf16", GPU.type, "bf16", 20, 1e-3),
        "learned": run(tmp, data, "learned", GPU.type, "fp32", 150, 1e-2),
    }


def test_float32_training_steps_on_the_gpu_follow_the_cpu(trained: dict[str, TrainResult]) -> None:
    cpu, gpu = np.array(trained["cpu"].losses), np.array(trained["fp32"].losses)
    assert len(gpu) == len(cpu) == 20
    np.testing.assert_allclose(gpu, cpu, rtol=TRAIN_FP32)
    assert gpu[-1] < gpu[0]


def test_bfloat16_training_steps_on_the_gpu_stay_near_float32(trained: dict[str, TrainResult]) -> None:
    fp32, bf16 = np.array(trained["fp32"].losses), np.array(trained["bf16"].losses)
    assert np.isfinite(bf16).all()
    assert np.abs(bf16 - fp32).max() <= TRAIN_BF16_NATS
    assert bf16[-1] < bf16[0]


def test_a_model_trained_on_the_gpu_loads_and_serves_on_the_cpu(
    trained: dict[str, TrainResult], tmp_path: Path
) -> None:
    """The CWGT a GPU run wrote, on the CPU: written again from what was loaded, it is the same
    bytes (weights, metadata and EWC block); the GPU and the CPU compute the same next-byte
    distributions from it; and the CPU's beam search serves the commands it learned."""
    gpu_file = trained["learned"].output
    loaded = load_model(gpu_file, with_ewc=True)
    assert loaded.fisher is not None and loaded.anchor is not None
    again = save_model(tmp_path / "again.cwgt", loaded.model, loaded.metadata, defaults=loaded.defaults,
                       ewc=(loaded.fisher, loaded.anchor))  # fmt: skip
    assert again.read_bytes() == gpu_file.read_bytes()

    tokens, _ = batch()
    with torch.no_grad():
        on_cpu = loaded.model(tokens)
        on_device = on_gpu(load_model(gpu_file).model)(tokens.to(GPU)).cpu()
    torch.testing.assert_close(on_device, on_cpu, atol=FP32 * float(on_cpu.abs().max()), rtol=FP32)

    generator = Generator(loaded)
    for typed, expected in (("git st", "git status"), ("ma", "make test"), ("", COMMANDS[0])):
        best = list(generator.candidates({**CONTEXT, "input": typed}, 3))
        assert best and best[0].text == expected, (typed, [c.text for c in best])
