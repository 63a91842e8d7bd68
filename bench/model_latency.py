"""Keystroke latency of several weight files through the real daemon, side by side.

    python bench/model_latency.py [--sizes nano,micro,mini] [--model NAME=FILE.cwgt ...] [--rounds 3]

One `calmd serve` of this tree per model, each in its own scratch HOME with the file as the
user's weights; then bench/new_user.py's new user types `git commit -m wip` in a real folder
`--rounds` times (each a new session, every request as the zsh hook sends it), every keystroke
going to each daemon in turn, the order rotating, so that all see the same machine state.
Client side, request -> `done`, ms, p50 and p90 of the search-answered keystrokes (those the
daemon searched for; typing through answers the others) and of every keystroke.

`--sizes` adds a seeded random model of each size (`calm init --size S`): a random model's beams
never end early, so it is the worst case of its size; the packaged model (trained nano) is always
measured beside them as the yardstick of what training changes. `--model` adds trained files, e.g.
a model brought back from the GPU (bench/gpu.py) against the packaged one. The budget is
<= 15 ms p50 and <= 25 ms p90 per search-answered keystroke (issue 22, at a load under 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import real_cwd
from new_user import HERE, LINE, Daemon, report

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.formats.cwgt import Metadata
from calmd.model.checkpoint import GenerationDefaults, save_model
from calmd.model.mamba import SIZES, CalmModel

BUDGET_P50, BUDGET_P90 = 15.0, 25.0


def random_model(size: str, folder: Path) -> Path:
    """What `calm init --size SIZE --seed 0` writes."""
    model = CalmModel(SIZES[size])
    model.init_weights(0)
    return save_model(folder / f"{size}-random.cwgt", model, Metadata(), defaults=GenerationDefaults())


def named_model(spec: str) -> tuple[str, Path]:
    name, sep, file = spec.partition("=")
    if not sep or not name or not Path(file).is_file():
        raise argparse.ArgumentTypeError(f"--model {spec}: give NAME=FILE.cwgt with an existing file")
    return name, Path(file)


PROG = "bench/model_latency.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="", help="comma-separated sizes to add with random weights")
    parser.add_argument("--model", type=named_model, action="append", default=[], metavar="NAME=FILE",
                        help="a weight file to add (repeatable)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="times the line is typed (default 3)")
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)}; known: {', '.join(SIZES)}")
    scratch = Path(tempfile.mkdtemp(prefix="calmd-sizes-"))
    models = {"packaged": paths.packaged_weights(), **dict(args.model)}
    models.update({f"{s} random": random_model(s, scratch) for s in sizes})
    megabytes = {name: file.stat().st_size / 1e6 for name, file in models.items()}
    load = os.getloadavg()[0]
    daemons: dict[str, Daemon] = {}
    times: dict[str, list[tuple[float, bool]]] = {name: [] for name in models}
    try:
        for name, file in models.items():
            daemons[name] = Daemon(HERE, file)
        cwd = str(real_cwd(scratch))
        order = list(daemons)
        for r in range(args.rounds):
            for d in daemons.values():
                d.drawn = ""
            for i in range(len(LINE) + 1):
                order = order[1:] + order[:1]  # each daemon first in turn
                for name in order:
                    times[name].append(daemons[name].keystroke(LINE[:i], f"new{r}", cwd, first=i == 0))
    finally:
        for d in daemons.values():
            d.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    load = max(load, os.getloadavg()[0])
    print(f"`{LINE}` typed {args.rounds} times in a real folder, each a new session; request -> done, "
          f"ms; load average up to {load:.2f} on {os.cpu_count()} cores\n")  # fmt: skip
    for name, file in models.items():
        print(f"{name}: {file.name}, {megabytes[name]:.1f} MB")
    print(f"\n{'':<16}{'search-answered':>24}{'every keystroke':>26}")
    print(f"{'':<16}{'p50':>9}{'p90':>9}{'n':>6}{'p50':>11}{'p90':>9}{'n':>6}")
    verdicts = []
    for name in models:
        p50, p90 = report(name, times[name])
        ok = p50 <= BUDGET_P50 and p90 <= BUDGET_P90
        verdicts.append(f"{name}: {'within' if ok else 'over'} the budget")
    print(f"\nbudget: search-answered p50 <= {BUDGET_P50:g} ms, p90 <= {BUDGET_P90:g} ms (at a load under 1)")
    print("; ".join(verdicts))


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
