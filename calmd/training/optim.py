"""torch.optim's Adam, AdamW and SGD, without their import of torch._dynamo.

torch 2.13 imports its compiler, torch._dynamo, the first time an optimizer takes a step
(`Optimizer.step` is wrapped by `_use_grad_for_differentiable`, which imports it to place a
graph break) and the first time four of its methods run (`state_dict`, `load_state_dict`,
`zero_grad`, `add_param_group`, wrapped by `torch._disable_dynamo`, which imports it to
exclude them from compilation). calmd never compiles, and that import costs every process
that trains 1.9 s and 71 MB (measured on the reference machine: docs/performance.md,
"Training processes"): each background run, `calm train`, the ranker's refit.

Here, `step` is the optimizer's own update run under `torch.no_grad()`, which is what the
wrapper does for an optimizer that is not `differentiable` when nothing is being compiled; the
four methods get the form the wrapper would have cached for them (themselves: "disabled"
only matters under torch.compile). The numbers are torch.optim's to the bit, and no
torch._dynamo is imported: tests/training/test_optim.py holds both. Where torch's internals are not what
this expects (another torch version), the stock behaviour stays: slower to start, the same
numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# torch.optim.Optimizer's methods that torch._disable_dynamo wraps (torch/_compile.py)
_DISABLE_WRAPPED = ("state_dict", "load_state_dict", "zero_grad", "add_param_group")


def _preset_dynamo_disable() -> None:
    """Give each wrapped method the cached "disabled" form the wrapper looks up before it
    imports torch._dynamo (`fn.__dynamo_disable`); a method not wrapped so is left as it is."""
    for name in _DISABLE_WRAPPED:
        wrapper = vars(torch.optim.Optimizer).get(name)
        raw = getattr(wrapper, "__wrapped__", None)
        code = getattr(wrapper, "__code__", None)
        if raw is None or code is None or not code.co_filename.endswith("_compile.py"):
            continue
        if getattr(raw, "__dynamo_disable", None) is None:
            setattr(raw, "__dynamo_disable", raw)  # what torch._dynamo.disable(fn) runs outside a compile


def _raw_step(cls: type[torch.optim.Optimizer]) -> Callable[..., Any] | None:
    """The update under `_use_grad_for_differentiable`, or None where step is not so wrapped.
    (Once an instance of `cls` exists, torch has put its profiling hook around that wrapper.)"""
    step: Any = cls.step
    while step is not None:
        code = getattr(step, "__code__", None)
        if code is not None and code.co_name == "_use_grad":
            return getattr(step, "__wrapped__", None)
        step = getattr(step, "__wrapped__", None)
    return None


_preset_dynamo_disable()
_ADAM_STEP = _raw_step(torch.optim.Adam)
_ADAMW_STEP = _raw_step(torch.optim.AdamW)
_SGD_STEP = _raw_step(torch.optim.SGD)


def _step(optimizer: torch.optim.Optimizer, raw: Callable[..., Any] | None, closure: Any) -> Any:
    # `differentiable` optimizers need the graph the wrapper keeps: calmd never makes one
    assert not optimizer.defaults.get("differentiable"), "a differentiable optimizer needs torch's step"
    assert raw is not None
    with torch.no_grad():
        return raw(optimizer, closure)


class Adam(torch.optim.Adam):
    if _ADAM_STEP is not None:

        def step(self, closure: Any = None) -> Any:
            return _step(self, _ADAM_STEP, closure)


class AdamW(torch.optim.AdamW):
    if _ADAMW_STEP is not None:

        def step(self, closure: Any = None) -> Any:
            return _step(self, _ADAMW_STEP, closure)


class SGD(torch.optim.SGD):
    if _SGD_STEP is not None:

        def step(self, closure: Any = None) -> Any:
            return _step(self, _SGD_STEP, closure)
