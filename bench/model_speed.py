"""Model speed on this machine, each figure next to its reference measured in the same run.

    python bench/model_speed.py [--quick]

1. Training tokens/s for nano (batch 32 x 256, 2 threads): the fused C++ scan and the chunked
   PyTorch scan against the plain-loop reference scan (goal >= 15k tokens/s).
2. Recurrent step latency (ms per byte, batch 1 and 8, 1 thread) for each size: traced against
   eager; prefill of 768 tokens.
3. Five candidates of about 30 bytes for nano from a cached context (goal <= 20 ms median):
   beam search with the traced step, and the same with the eager step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from calmd.formats.cwgt import Metadata
from calmd.model import fastscan
from calmd.model.checkpoint import GenerationDefaults, LoadedModel, header_for
from calmd.model.generate import Generator
from calmd.model.mamba import SIZES, CalmModel


def timed(fn: Callable[[], object], repeat: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def train_speed(quick: bool) -> None:
    torch.set_num_threads(2)
    model = CalmModel(SIZES["nano"])
    batch, length = 32, 256
    tokens = torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def one_step() -> None:
        loss = model.loss(tokens, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()

    rates = {}
    cpp = fastscan.library() is not None
    paths = [("fused C++ scan", True, False)] if cpp else []
    paths += [("PyTorch chunked", False, False), ("reference loop", False, True)]
    for name, use_cpp, ref in paths:
        fastscan.use_cpp = use_cpp
        model.set_reference_scan(ref)
        times = timed(one_step, 1 if (quick or ref) else 3, warmup=1)
        rates[name] = batch * (length - 1) / min(times)
    fastscan.use_cpp = True
    model.set_reference_scan(False)
    print("\n## training, nano, batch 32 x 256, 2 threads (forward + backward + AdamW)")
    if not cpp:
        print(f"(no fused C++ scan: {fastscan.unavailable_reason()})")
    print(f"{'scan':<18}{'tokens/s':>12}{'x reference':>13}")
    for name, rate in rates.items():
        print(f"{name:<18}{rate:>12,.0f}{rate / rates['reference loop']:>12.1f}x")
    best = max(rates.values())
    print(f"fastest: {best:,.0f} tokens/s, {best / rates['PyTorch chunked']:.1f}x the PyTorch chunked scan; "
          f"goal 15,000 tokens/s")  # fmt: skip


def step_speed(quick: bool) -> None:
    torch.set_num_threads(1)
    print("\n## recurrent inference, 1 thread (ms)")
    print(f"{'size':<7}{'params':>11}{'eager b1':>10}{'traced b1':>10}{'eager b8':>10}"
          f"{'traced b8':>10}{'prefill 768':>13}")  # fmt: skip
    repeat = 50 if quick else 200
    for size in ("nano", "micro", "mini"):
        model = CalmModel(SIZES[size]).eval()
        model.trace_step()
        row = []
        with torch.inference_mode():
            for batch in (1, 8):
                state, token = model.empty_state(batch), torch.zeros(batch, dtype=torch.long)
                eager = statistics.median(timed(lambda m=model, s=state, t=token: m.step_eager(s, t), repeat))
                traced = statistics.median(timed(lambda m=model, s=state, t=token: m.step(s, t), repeat))
                row += [eager, traced]
            ctx = torch.randint(0, 256, (1, 768))
            prefill = statistics.median(
                timed(lambda m=model, c=ctx: m.prefill(c), 3 if quick else 5, warmup=1)
            )
        cells = "".join(f"{v * 1000:>10.3f}" for v in row)
        print(f"{size:<7}{SIZES[size].param_count():>11,}{cells}{prefill * 1000:>13.1f}")


def candidate_speed(quick: bool) -> None:
    torch.set_num_threads(1)
    model = CalmModel(SIZES["nano"])
    model.init_weights(0)
    loaded = LoadedModel(Path("bench"), model, header_for(model.cfg), Metadata(), GenerationDefaults())
    ctx = {"cwd": "/home/user/project", "git": "main", "input": "git c",
           "history": [{"cmd": f"git commit -m 'change {i}'", "exit": 0} for i in range(5)]}  # fmt: skip
    # A random model never ends a command early: every request runs all 30 steps with the full
    # beam, the worst case for a trained model (which ends most candidates sooner).
    print("\n## five candidates of 30 bytes, nano, cached context, 1 thread (ms)")
    print(f"{'step':<8}{'median':>9}{'p90':>9}")
    results = {}
    for traced in (True, False):
        gen = Generator(loaded, trace=traced)
        gen.prepare(ctx, "bench")  # cache the context, as typing does
        times = timed(lambda g=gen: list(g.candidates(ctx, 5, session="bench", max_tokens=30)),
                      20 if quick else 60)  # fmt: skip
        results[traced] = times
        name = "traced" if traced else "eager"
        p90 = sorted(times)[int(0.9 * len(times))]
        print(f"{name:<8}{statistics.median(times) * 1000:>9.1f}{p90 * 1000:>9.1f}")
    ratio = statistics.median(results[False]) / statistics.median(results[True])
    print(f"traced is {ratio:.2f}x faster; goal <= 20 ms median")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--only", choices=["train", "step", "candidates"])
    args = parser.parse_args()
    if args.only in (None, "train"):
        train_speed(args.quick)
    if args.only in (None, "step"):
        step_speed(args.quick)
    if args.only in (None, "candidates"):
        candidate_speed(args.quick)


if __name__ == "__main__":
    main()
