"""The fused C++ inference step and prefill (calmd/model/faststep.py, csrc/step.cpp) against the
eager step and the parallel path.

`CalmModel.step_eager` and the parallel prefill (what runs with autograd, or with the fused
kernel switched off) are the references. Every size the toolbox makes (nano, micro, mini: mini
has the FFN), batch 1, 6 and 12, from states a prefill left, over many steps; odd shapes that
exercise the kernel's padding; the beam search's row gather; a loop of fused steps and the fused
prefill against the parallel forward, across the kernel's chunks of positions; when the packed
weights must be packed again; what the fallback does."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from calmd.model import fastscan, faststep
from calmd.model.mamba import SIZES, CalmModel, InferenceState, ModelConfig
from tests.support.tools import need

ROOT = Path(__file__).resolve().parents[2]

# d_model not a multiple of 8, an untied head, an FFN, d_conv 3, dt_rank 2, d_state 3: every
# packed matrix has padding columns and the products run their narrow column blocks.
ODD = ModelConfig(d_model=20, n_layers=2, ffn_expand=3, expand=3, d_state=3, d_conv=3, dt_rank=2, tied=False)


@pytest.fixture(autouse=True)
def _kernel() -> Iterator[None]:
    """These tests are about the kernel: where g++ is, it must have been built."""
    if fastscan.library() is None:
        need("g++")  # then CI fails here rather than skip the kernel's tests
        pytest.skip(f"the C++ kernels are not available here: {fastscan.unavailable_reason()}")
    assert faststep.use_fused
    yield
    faststep.use_fused = True


def random_model(cfg: ModelConfig, seed: int) -> CalmModel:
    """Initialised as `calm init` does, then every parameter moved off its initial value (D = 1,
    norms = 1, A_log = log(1..N) would hide a wrong index), in eval mode (packed)."""
    torch.manual_seed(seed)
    model = CalmModel(cfg)
    model.init_weights(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Equal to 1e-5 of the tensor's scale: both sides sum in float32 in different orders, so
    mini's 384- and 768-wide products (values up to ~4) differ by ~1e-5 in absolute terms."""
    scale = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want, atol=1e-5 * scale, rtol=1e-5, msg=lambda m: f"{what}: {m}")


def assert_states_close(a: InferenceState, b: InferenceState) -> None:
    assert a.seen == b.seen
    assert_close(a.conv, b.conv, "conv state")
    assert_close(a.ssm, b.ssm, "SSM state")


def parallel_prefill(
    model: CalmModel, tokens: torch.Tensor, state: InferenceState | None = None
) -> tuple[torch.Tensor, InferenceState]:
    """The reference: the parallel path (the fused kernel off), as training runs it."""
    faststep.use_fused = False
    try:
        with torch.inference_mode():
            return model.prefill(tokens, state)
    finally:
        faststep.use_fused = True


def run_both(model: CalmModel, start: InferenceState, tokens: torch.Tensor) -> None:
    """Step `tokens` (B, T) from `start` with the fused and the eager step; same logits, states."""
    fused, eager = start.clone(), start.clone()
    with torch.inference_mode():
        for t in range(tokens.shape[1]):
            f_logits, fused = model.step(fused, tokens[:, t])
            e_logits, eager = model.step_eager(eager, tokens[:, t])
            assert_close(f_logits, e_logits, f"step {t}")
            assert_states_close(fused, eager)


@pytest.mark.parametrize("batch", [1, 6, 12])
@pytest.mark.parametrize("size", ["nano", "micro", "mini"])
def test_fused_step_equals_eager_step_from_a_prefill(size: str, batch: int) -> None:
    model = random_model(SIZES[size], seed=batch)
    assert model._packed is not None  # eval() packed the weights
    gen = torch.Generator().manual_seed(len(size) * 100 + batch)
    _, start = parallel_prefill(model, torch.randint(0, 320, (batch, 17), generator=gen))
    steps = 8 if size == "mini" else 40
    run_both(model, start, torch.randint(0, 320, (batch, steps), generator=gen))


def test_odd_shapes_exercise_the_padding() -> None:
    model = random_model(ODD, seed=3)
    gen = torch.Generator().manual_seed(3)
    _, start = parallel_prefill(model, torch.randint(0, 320, (5, 7), generator=gen))
    run_both(model, start, torch.randint(0, 320, (5, 25), generator=gen))


@pytest.mark.parametrize("cfg", [SIZES["nano"], ODD], ids=["nano", "odd"])
def test_a_loop_of_fused_steps_equals_the_parallel_forward(cfg: ModelConfig) -> None:
    model = random_model(cfg, seed=4)
    tokens = torch.randint(0, 320, (3, 48), generator=torch.Generator().manual_seed(4))
    full, whole = parallel_prefill(model, tokens)  # (3, 48, V)
    with torch.inference_mode():
        for split in (0, 1, 20, 47):
            if split:
                pre, state = parallel_prefill(model, tokens[:, :split])
                logits = [pre]
            else:
                state, logits = model.empty_state(3), []
            for t in range(split, tokens.shape[1]):
                out, state = model.step(state, tokens[:, t])
                logits.append(out[:, None])
            torch.testing.assert_close(torch.cat(logits, 1), full, atol=1e-4, rtol=1e-4)
            assert state.seen == whole.seen
            torch.testing.assert_close(state.ssm, whole.ssm, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(state.conv, whole.conv, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("size", "batch", "length"),
    # the kernel runs 256 positions at a time (256 // batch tokens per row): 300 and 50 cross it
    [("nano", 1, 300), ("nano", 6, 50), ("nano", 12, 3), ("micro", 2, 40), ("mini", 1, 20)],
)
def test_fused_prefill_equals_the_parallel_path(size: str, batch: int, length: int) -> None:
    model = random_model(SIZES[size], seed=length)
    gen = torch.Generator().manual_seed(length)
    context, tokens = (torch.randint(0, 320, (batch, n), generator=gen) for n in (9, length))
    _, start = parallel_prefill(model, context)
    for state in (None, start):
        want_logits, want = parallel_prefill(model, tokens, state)
        with torch.inference_mode():
            got_logits, got = model.prefill(tokens, state)
        assert_close(got_logits, want_logits, "logits")
        assert got.seen == want.seen == length + (0 if state is None else 9)
        assert_close(got.conv, want.conv, "conv state")
        assert_close(got.ssm, want.ssm, "SSM state")


def test_odd_shapes_prefill_and_the_reference_scan_keeps_the_parallel_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = random_model(ODD, seed=13)
    tokens = torch.randint(0, 320, (3, 30), generator=torch.Generator().manual_seed(13))
    want, _ = parallel_prefill(model, tokens)
    with torch.inference_mode():
        got, _ = model.prefill(tokens)
        assert_close(got, want, "logits")
        with pytest.raises(IndexError, match="token 320 outside"):
            model.prefill(torch.tensor([[1, 2, 320]]))
        model.set_reference_scan(True)  # a test of the reference scan must run it

        def no_fused_prefill(*args: object) -> None:
            raise AssertionError("the fused prefill ran with the reference scan on")

        monkeypatch.setattr(faststep, "prefill", no_fused_prefill)
        reference, _ = model.prefill(tokens)
    assert_close(reference, want, "logits")


def test_the_step_leaves_its_input_state_alone() -> None:
    model = random_model(SIZES["nano"], seed=5)
    with torch.inference_mode():
        _, state = model.prefill(torch.randint(0, 320, (2, 9)))
        before = state.clone()
        model.prefill(torch.tensor([[5, 6], [7, 8]]), state)
        model.step(state, torch.tensor([65, 66]))
    assert torch.equal(state.conv, before.conv) and torch.equal(state.ssm, before.ssm)


def test_rows_gather_the_beams_in_the_same_call() -> None:
    """step(state, token, rows) == step(state.select(rows), token): the beam search's reordering."""
    model = random_model(SIZES["nano"], seed=6)
    rows, tokens = [4, 0, 0, 2, 5, 1, 4], torch.tensor([10, 200, 300, 32, 65, 0, 255])
    with torch.inference_mode():
        _, state = model.prefill(torch.randint(0, 320, (6, 11)))
        gathered_logits, gathered = model.step(state, tokens, rows)
        selected_logits, selected = model.step(state.select(rows), tokens)
        eager_logits, eager = model.step_eager(state.select(rows), tokens)
    assert torch.equal(gathered_logits, selected_logits)
    assert torch.equal(gathered.conv, selected.conv) and torch.equal(gathered.ssm, selected.ssm)
    assert_close(gathered_logits, eager_logits)
    assert_states_close(gathered, eager)
    with torch.no_grad():  # and the eager fallback takes `rows` too
        faststep.use_fused = False
        fallback_logits, _ = model.step(state, tokens, rows)
    torch.testing.assert_close(fallback_logits, eager_logits, atol=0, rtol=0)


def test_bad_tokens_and_rows_raise_like_the_embedding_does() -> None:
    model = random_model(SIZES["nano"], seed=7)
    state = model.empty_state(2)
    with torch.inference_mode():
        with pytest.raises(IndexError, match="token 320 outside the vocabulary"):
            model.step(state, torch.tensor([1, 320]))
        with pytest.raises(IndexError, match="source row 2 outside 2 rows"):
            model.step(state, torch.tensor([1, 2]), [0, 2])
        with pytest.raises(IndexError):
            model.step_eager(state, torch.tensor([1, 320]))  # what the eager step does


def test_changed_weights_are_packed_again() -> None:
    model = random_model(SIZES["nano"], seed=8)
    tokens = torch.randint(0, 320, (2, 3))
    first = model._packed
    assert first is not None and first.fresh()
    with torch.no_grad():  # an in-place update, as an optimizer step makes
        model.layers[1].mixer.out_proj.weight.mul_(1.5)  # type: ignore[union-attr]
    assert not first.fresh()
    run_both(model, model.empty_state(2), tokens)
    assert model._packed is not first and model._packed is not None and model._packed.fresh()
    other = random_model(SIZES["nano"], seed=9)
    model.load_named_arrays(other.to_named_arrays())  # what a hot reload into this object would do
    with torch.inference_mode():
        got, _ = model.step(model.empty_state(2), tokens[:, 0])
        want, _ = other.step_eager(other.empty_state(2), tokens[:, 0])
    assert_close(got, want)
    model.train()
    assert model._packed is None  # training drops the copies; eval() makes them again
    model.eval()
    assert model._packed is not None


def test_a_rows_result_does_not_depend_on_the_batch_it_runs_in() -> None:
    """Bit for bit: the kernel blocks rows by 3, and each block shape does the same multiply-adds
    (so a beam's score does not change with the beams beside it)."""
    model = random_model(SIZES["nano"], seed=12)
    with torch.inference_mode():
        _, state = model.prefill(torch.randint(0, 320, (7, 4)))
        tokens = torch.tensor([3, 1, 4, 1, 5, 9, 2])
        logits, after = model.step(state, tokens)
        for row in range(7):
            alone, alone_state = model.step(state.select([row]), tokens[row : row + 1])
            assert torch.equal(alone[0], logits[row])
            assert torch.equal(alone_state.ssm[:, 0], after.ssm[:, row])
            assert torch.equal(alone_state.conv[:, 0], after.conv[:, row])


def test_rows_are_split_over_threads_above_16_rows_with_the_same_result() -> None:
    model = random_model(SIZES["nano"], seed=10)
    gen = torch.Generator().manual_seed(10)
    _, state = parallel_prefill(model, torch.randint(0, 320, (40, 5), generator=gen))
    tokens = torch.randint(0, 320, (40, 3), generator=gen)
    results = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            results.append((*model.step(state, tokens[:, 0]), *model.prefill(tokens, state)))
    for step_logits, step_state, logits, after in results[1:]:
        assert torch.equal(step_logits, results[0][0]) and torch.equal(logits, results[0][2])
        assert torch.equal(step_state.ssm, results[0][1].ssm) and torch.equal(after.ssm, results[0][3].ssm)
        assert torch.equal(after.conv, results[0][3].conv)
    run_both(model, state, tokens)


def test_autograd_float64_and_the_switch_take_the_eager_step() -> None:
    model = random_model(SIZES["nano"], seed=11)
    token = torch.tensor([1, 2])
    logits, _ = model.step(model.empty_state(2), token)  # grad enabled: the eager step, differentiable
    assert logits.requires_grad
    logits.sum().backward()
    assert model.embedding.weight.grad is not None
    double = random_model(SIZES["nano"], seed=11).double()
    with torch.inference_mode():
        assert double._fused_weights() is None
        out, _ = double.step(double.empty_state(2), token)
    assert out.dtype == torch.float64
    faststep.use_fused = False
    with torch.inference_mode():
        assert model._fused_weights() is None
        model.step(model.empty_state(2), token)


STEP_WITHOUT_KERNEL = """
import torch
from calmd.model import fastscan
from calmd.model.mamba import SIZES, CalmModel
model = CalmModel(SIZES["nano"]).eval()
with torch.inference_mode():
    _, state = model.prefill(torch.tensor([[1, 2, 3]]))
    fused_or_not, _ = model.step(state, torch.tensor([4]))
    eager, _ = model.step_eager(state, torch.tensor([4]))
print(fastscan.library() is None, model._packed is None, torch.equal(fused_or_not, eager))
"""


@pytest.mark.slow  # a g++ build in a subprocess
def test_without_the_kernel_the_eager_step_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CALM_CACHE": str(tmp_path), "CALM_NO_CPP_SCAN": "1"}
    done = subprocess.run([sys.executable, "-c", STEP_WITHOUT_KERNEL], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]
