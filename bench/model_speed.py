"""Model speed on this machine, each figure next to its reference measured in the same run.

    python bench/model_speed.py [--quick] [--only train|step|candidates|keystroke]

1. Training tokens/s for nano (batch 32 x 256, 2 threads): the fused C++ scan and the chunked
   PyTorch scan against the plain-loop reference scan (goal >= 15k tokens/s).
2. Recurrent step latency (ms per step, batch 1, 6 and 12, 1 thread) for each size: the eager
   step (the reference), its TorchScript trace and the fused C++ step (calmd/model/faststep.py),
   in interleaved rounds so that all three see the same load; then prefill of 26 tokens (what
   a keystroke's new COMP frame typically costs) and of 768 (a whole context) through the
   parallel path and the fused kernel, interleaved likewise.
3. Five candidates of about 30 bytes for nano from a cached context (goal <= 20 ms median):
   beam search with the fused step and with the eager step, alternating request by request.
4. A keystroke: a new user (empty history) types `git commit -m wip` in a real folder, ten
   times, through two ModelEngines with the packaged model, one with the fused step and one
   without, keystroke by keystroke alternately (in-process: what bench/latency.py's "in-process
   engine" does, without the socket); p50 and p90 of each and their ratio.
The machine's load average is printed with each part: the machine is shared, prefer the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.formats.cwgt import Metadata
from calmd.model import fastscan, faststep
from calmd.model.checkpoint import GenerationDefaults, LoadedModel, header_for
from calmd.model.generate import Generator
from calmd.model.mamba import SIZES, CalmModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import pct, real_cwd  # a sibling script, not a package


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


def load() -> str:
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def step_speed(quick: bool) -> None:
    torch.set_num_threads(1)
    fused_ok = faststep.available()
    print(f"\n## recurrent inference, 1 thread, ms per step ({load()})")
    if not fused_ok:
        print(f"(no fused step: {fastscan.unavailable_reason()})")
    print(f"{'size':<7}{'params':>11}{'batch':>6}{'eager':>9}{'traced':>9}{'fused':>9}{'eager/fused':>13}")
    rounds, repeat = (3, 20) if quick else (7, 40)
    prefills = []
    for size in ("nano", "micro", "mini"):
        model = CalmModel(SIZES[size]).eval()
        model.trace_step()
        traced_step = model._traced_step
        with torch.inference_mode():
            _, start = model.prefill(torch.randint(0, 256, (1, 64)))  # a state a context left
            for batch in (1, 6, 12):
                state, token = start.expand(batch), torch.randint(0, 256, (batch,))
                ways: dict[str, Callable[[], object]] = {
                    "eager": lambda m=model, s=state, t=token: m.step_eager(s, t),
                    "traced": lambda m=model, s=state, t=token: m.step(s, t),
                }
                if fused_ok:
                    ways["fused"] = lambda m=model, s=state, t=token: m.step(s, t)
                big = size == "mini"
                times = interleaved(ways, max(2, rounds // 2) if big else rounds,
                                    repeat // 4 if big else repeat, model, traced_step)  # fmt: skip
                med = {name: statistics.median(t) * 1000 for name, t in times.items()}
                fused = f"{med['fused']:>9.3f}{med['eager'] / med['fused']:>12.1f}x" if fused_ok else ""
                params = f"{SIZES[size].param_count():>11,}" if batch == 1 else " " * 11
                name = size if batch == 1 else ""
                print(f"{name:<7}{params}{batch:>6}{med['eager']:>9.3f}{med['traced']:>9.3f}{fused}")
            for length in (26, 768):
                ctx = torch.randint(0, 256, (1, length))
                ways = {"parallel": lambda m=model, c=ctx, s=start: m.prefill(c, s)}
                if fused_ok:
                    ways["fused"] = lambda m=model, c=ctx, s=start: m.prefill(c, s)
                n = 10 if length < 100 else (2 if size == "nano" else 1)
                times = interleaved(ways, 2 if quick else 4, n, model, None)
                medians = {way: statistics.median(t) * 1000 for way, t in times.items()}
                prefills.append((size, length, medians))
    print(f"\nprefill after a 64-token context, 1 thread, ms ({load()})")
    print(f"{'size':<7}{'tokens':>7}{'parallel':>10}{'fused':>9}{'parallel/fused':>16}")
    for size, length, med in prefills:
        fused = f"{med['fused']:>9.2f}{med['parallel'] / med['fused']:>15.1f}x" if fused_ok else ""
        print(f"{size:<7}{length:>7}{med['parallel']:>10.2f}{fused}")


def interleaved(
    ways: dict[str, Callable[[], object]], rounds: int, repeat: int, model: CalmModel, traced: object
) -> dict[str, list[float]]:
    """Each way timed `repeat` times per round, the ways in turn, so that all see the same load.
    "traced" runs with the model's trace on, "eager"/"parallel" with the fused kernel off."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            model._traced_step = traced if name == "traced" else None
            faststep.use_fused = name not in ("eager", "parallel")
            times[name] += timed(fn, repeat, warmup=1)
    model._traced_step = None
    faststep.use_fused = True
    return times


def candidate_speed(quick: bool) -> None:
    torch.set_num_threads(1)
    model = CalmModel(SIZES["nano"])
    model.init_weights(0)
    loaded = LoadedModel(Path("bench"), model, header_for(model.cfg), Metadata(), GenerationDefaults())
    ctx = {"cwd": "/home/user/project", "git": "main", "input": "git c",
           "history": [{"cmd": f"git commit -m 'change {i}'", "exit": 0} for i in range(5)]}  # fmt: skip
    # A random model never ends a command early: every request runs all 30 steps with the full
    # beam, the worst case for a trained model (which ends most candidates sooner).
    print(f"\n## five candidates of 30 bytes, nano, cached context, 1 thread, ms ({load()})")
    gen = Generator(loaded)
    gen.prepare(ctx, "bench")  # cache the context, as typing does
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(20 if quick else 60):  # fused and eager alternately, request by request
        for fused in (True, False):
            faststep.use_fused = fused
            times[fused] += timed(
                lambda g=gen: list(g.candidates(ctx, 5, session="bench", max_tokens=30)), 1, 0
            )
    faststep.use_fused = True
    print(f"{'step':<8}{'median':>9}{'p90':>9}")
    for fused in (True, False):
        print(f"{'fused' if fused else 'eager':<8}{statistics.median(times[fused]) * 1000:>9.1f}"
              f"{pct(times[fused], 0.9) * 1000:>9.1f}")  # fmt: skip
    ratio = statistics.median(times[False]) / statistics.median(times[True])
    print(f"the fused step is {ratio:.2f}x faster; goal <= 20 ms median ({load()})")


def keystroke_speed(quick: bool) -> None:
    """What /work/notes/prof/newuser.py profiled: every keystroke of `git commit -m wip` in a
    real folder with COMP, for a user with no history, each round a new session."""
    from calmd.daemon.comp_state import SessionComp
    from calmd.history.store import HistoryStore
    from calmd.suggest.disk import Disk
    from calmd.suggest.engine import ModelEngine

    rounds = 4 if quick else 10
    line = "git commit -m wip"
    print(f"\n## a new user types `{line}` in a real folder, {rounds} rounds, in-process ms ({load()})")
    with tempfile.TemporaryDirectory() as tmp:
        cwd = str(real_cwd(Path(tmp)))
        sides = {}
        for fused in (True, False):
            engine = ModelEngine(paths.packaged_weights())
            engine.attach_history(HistoryStore(Path(tmp) / f"history-{fused}.sqlite3"))
            disk = Disk()
            engine.attach_disk(disk)
            sides[fused] = (engine, SessionComp(disk))
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds + 1):  # round 0 warms up (first model run, the folder's listing)
            for fused in (True, False):
                sides[fused][1].set_path(f"s{r}", os.environ.get("PATH", ""))
            for i in range(len(line) + 1):
                ctx = {"input": line[:i], "cwd": cwd}
                for fused in (True, False) if i % 2 else (False, True):  # alternately first
                    engine, frames = sides[fused]
                    faststep.use_fused = fused
                    one = dict(ctx)
                    t0 = time.perf_counter()
                    frames.fill(one, f"s{r}", engine.followers)
                    list(engine.complete(one, 5, f"s{r}", threading.Event()))
                    if r:
                        times[fused].append(time.perf_counter() - t0)
        faststep.use_fused = True
    print(f"{'step':<8}{'p50':>8}{'p90':>8}{'max':>8}{'keystrokes':>12}")
    for fused in (True, False):
        t = times[fused]
        print(f"{'fused' if fused else 'eager':<8}{pct(t, 0.5) * 1000:>8.1f}{pct(t, 0.9) * 1000:>8.1f}"
              f"{max(t) * 1000:>8.1f}{len(t):>12}")  # fmt: skip
    print(
        f"eager / fused: p50 {pct(times[False], 0.5) / pct(times[True], 0.5):.2f}x, "
        f"p90 {pct(times[False], 0.9) / pct(times[True], 0.9):.2f}x; budget 15 ms p50, 25 ms p90 ({load()})"
    )


PROG = "bench/model_speed.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--only", choices=["train", "step", "candidates", "keystroke"])
    args = parser.parse_args()
    if args.only in (None, "train"):
        train_speed(args.quick)
    if args.only in (None, "step"):
        step_speed(args.quick)
    if args.only in (None, "candidates"):
        candidate_speed(args.quick)
    if args.only in (None, "keystroke"):
        keystroke_speed(args.quick)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
