"""calmd/training/optim.py: torch.optim's optimizers to the bit (torch.optim is the reference
path), their state dicts interchangeable with torch's (checkpoints written before load), and no
import of torch._dynamo in a process that trains."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from calmd.training import optim
from tests.support.waiting import HANG_S

CASES = [
    (optim.Adam, torch.optim.Adam, {"lr": 3e-3}),
    (optim.AdamW, torch.optim.AdamW, {"lr": 3e-3}),
    (optim.SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
]


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _groups(model: torch.nn.Module) -> list[dict[str, object]]:
    """As calm train groups them: decay on matrices, none on biases."""
    return [
        {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    data = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 7, generator=data)
        y = torch.randn(32, 3, generator=data)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_the_same_bits_as_torch_optim(ours: type, theirs: type, kwargs: dict[str, float]) -> None:
    assert ours.step is not theirs.step  # the plain step is in use (torch 2.13, as pinned)
    a, b = _model(1), _model(1)
    opt_a, opt_b = ours(_groups(a), **kwargs), theirs(_groups(b), **kwargs)
    _train(a, opt_a, 25, seed=2)
    _train(b, opt_b, 25, seed=2)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not torch.equal(next(a.parameters()), next(_model(1).parameters()))  # it trained
    # a checkpoint's optimizer state goes both ways, and training goes on the same
    opt_b2 = theirs(_groups(b), **kwargs)
    opt_b2.load_state_dict(opt_a.state_dict())
    opt_a2 = ours(_groups(a), **kwargs)
    opt_a2.load_state_dict(opt_b.state_dict())
    _train(a, opt_a2, 5, seed=3)
    _train(b, opt_b2, 5, seed=3)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_closure_is_evaluated_with_gradients() -> None:
    model = _model(4)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 7), torch.randn(8, 3)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    first = opt.step(closure)
    assert first.grad_fn is not None  # the closure ran with gradients, inside a no_grad step
    for _ in range(20):
        last = opt.step(closure)
    assert last.item() < first.item()


def test_a_process_that_trains_never_imports_torchs_compiler() -> None:
    """Optimizer steps, zero_grad, a state dict saved and loaded, and the ranker's refit: the
    1.9 s import of torch._dynamo stays out (it would be in sys.modules)."""
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        import torch
        from calmd.training import optim
        from calmd.training.ranker_refit import Example, RefitOptions, refit_ranker
        from calmd.suggest.ranker import packaged_ranker

        model = torch.nn.Linear(4, 2)
        for cls in (optim.Adam, optim.AdamW, optim.SGD):
            opt = cls(model.parameters(), lr=0.01)
            model(torch.ones(4)).sum().backward()
            opt.step()
            opt.zero_grad()
            opt.load_state_dict(opt.state_dict())
        base = packaged_ranker()
        rng = np.random.default_rng(0)
        examples = [Example(rng.normal(size=(5, len(base.mean))), int(i % 5)) for i in range(120)]
        fitted = refit_ranker(examples, base, RefitOptions(steps=3))
        assert fitted is not base
        print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_S)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "no dynamo"


def test_without_torchs_wrapper_the_stock_step_stays() -> None:
    """Another torch, whose step is not wrapped as 2.13's is: nothing is replaced. (torch's own
    class is found through the hook wrapper an instance puts around it.)"""

    class Plain(torch.optim.SGD):
        def step(self, closure: object = None) -> None:  # type: ignore[override]
            return None

    assert optim._raw_step(Plain) is None
    torch.optim.SGD(_model(0).parameters(), lr=0.1)  # wraps SGD.step in its profiling hook
    assert optim._raw_step(torch.optim.SGD) is vars(torch.optim.SGD)["step"].__wrapped__.__wrapped__
