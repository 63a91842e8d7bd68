"""The fused C++ scan: how it is built, cached and refused; threads; the fallback to PyTorch.
(Its values and gradients against the reference loop are tested in test_model.py.)"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from calmd.model import fastscan
from calmd.model.mamba import selective_scan
from calmd.model.scan import SelectiveScanFn
from tests.support.builders import scan_inputs

ROOT = Path(__file__).resolve().parents[2]
CXX = shutil.which("g++")
needs_cxx = pytest.mark.needs("g++")


@needs_cxx
def test_the_kernel_is_built_where_a_compiler_is() -> None:
    assert fastscan.library() is not None, fastscan.unavailable_reason()


@needs_cxx
@pytest.mark.slow  # a g++ build or a training
def test_build_is_cached_and_reused(tmp_path: Path) -> None:
    assert CXX is not None
    first = fastscan.build(CXX, tmp_path)
    stamp = first.stat().st_mtime_ns
    second = fastscan.build(CXX, tmp_path)
    assert second == first and second.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left behind
    assert first.name.startswith("calm-scan-") and first.suffix == ".so"


def test_a_failing_compiler_raises_with_its_message(tmp_path: Path) -> None:
    fake = tmp_path / "fake-g++"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo fake 1.0; exit 0; }\necho "no space left" >&2\nexit 1\n'
    )
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="no space left"):
        fastscan.build(str(fake), tmp_path / "cache")
    assert not any((tmp_path / "cache").glob("*.so"))


def _in_fresh_python(code: str, **env: str) -> str:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


TRAIN_ONE_STEP = """
import torch
from calmd.model import fastscan
from calmd.model.mamba import CalmModel, ModelConfig
model = CalmModel(ModelConfig(d_model=16, n_layers=1, ffn_expand=0, expand=2, d_state=4, d_conv=4))
tokens = torch.randint(0, 256, (2, 12))
loss = model.loss(tokens, torch.ones_like(tokens, dtype=torch.bool))
loss.backward()
print(fastscan.library() is None, "|", fastscan.unavailable_reason(), "|", float(loss))
"""


@pytest.mark.parametrize(
    ("env", "reason"),
    [({"CALM_NO_CPP_SCAN": "1"}, "CALM_NO_CPP_SCAN"), ({"CXX": "/nonexistent/g++"}, "nonexistent")],
)
@pytest.mark.slow  # a g++ build or a training
def test_without_the_kernel_training_falls_back_to_pytorch(
    tmp_path: Path, env: dict[str, str], reason: str
) -> None:
    out = _in_fresh_python(TRAIN_ONE_STEP, CALM_CACHE=str(tmp_path), **env)
    missing, why, loss = (part.strip() for part in out.split("|"))
    assert missing == "True" and reason in why
    assert math.isfinite(float(loss))  # and a training step ran on the PyTorch scan
    assert not any(tmp_path.glob("*.so"))


@needs_cxx
@pytest.mark.slow  # a g++ build or a training
def test_cache_dir_follows_calm_cache(tmp_path: Path) -> None:
    _in_fresh_python(TRAIN_ONE_STEP, CALM_CACHE=str(tmp_path))
    assert len(list(tmp_path.glob("calm-scan-*.so"))) == 1


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_threads_split_the_work_without_changing_the_result(dtype: torch.dtype) -> None:
    u, delta, A, B, C, D, _, h0 = scan_inputs(5, 7, 23, 16, dtype=dtype, seed=4)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            inputs = [t.clone().requires_grad_(True) for t in (u, delta, A, B, C, D, h0)]
            y, h = fastscan.CppScanFn.apply(*inputs)
            (y.square().sum() + h.sum()).backward()
            results.append([y.detach(), h.detach(), *(t.grad for t in inputs)])
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@needs_cxx
def test_kernel_equals_the_pytorch_fast_path_at_training_shape() -> None:
    """A nano layer's shape (d_inner 256, d_state 16) over 64 steps: both fast paths agree."""
    inputs = scan_inputs(4, 256, 64, 16, seed=7)
    u, delta, A, B, C, D, _, h0 = inputs
    ins_cpp = [t.clone().requires_grad_(True) for t in (u, delta, A, B, C, D, h0)]
    ins_torch = [t.clone().requires_grad_(True) for t in (u, delta, A, B, C, D, h0)]
    y1, h1 = fastscan.CppScanFn.apply(*ins_cpp)
    y2, h2 = SelectiveScanFn.apply(*ins_torch)
    torch.testing.assert_close(y1, y2, atol=1e-4, rtol=1e-4)
    (y1.sum() + h1.sum()).backward()
    (y2.sum() + h2.sum()).backward()
    for a, b in zip(ins_cpp, ins_torch, strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, atol=2e-3, rtol=1e-3)


@needs_cxx
def test_inference_mode_and_non_contiguous_inputs() -> None:
    """The model hands the scan a transposed delta; prefill runs under inference_mode."""
    u, delta, A, B, C, D, z, h0 = scan_inputs(2, 8, 30, 4, seed=2)
    delta_t = delta.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not delta_t.is_contiguous()
    with torch.inference_mode():
        y, h = selective_scan(u, delta_t, A, B, C, D, z, h0)
    y_ref, h_ref = selective_scan(u, delta, A, B, C, D, z, h0, reference=True)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, h_ref, atol=1e-5, rtol=1e-5)
