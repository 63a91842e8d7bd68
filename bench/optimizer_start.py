"""What torch.optim's first steps cost a process that trains, against calmd/training/optim.py's
optimizers (the same numbers, no import of torch._dynamo), in the same run.

    python bench/optimizer_start.py [--rounds 5]

Each round starts two fresh Python processes, interleaved: both import torch, build a
nano-sized set of parameters, and take three AdamW steps with a state dict saved and loaded,
one with torch.optim.AdamW and one with calmd's. Prints, per variant, the median wall time of
the optimizer part (the import of torch is the same for both and not counted), the peak RSS of
the process, and the ratios new / stock. Every background run, `calm train` and ranker refit
pays this once.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from calmd.arguments import Parser, run_tool

SCRIPT = """
import json, resource, sys, time
import torch
from calmd.training import optim
t0 = time.perf_counter()
params = [torch.nn.Parameter(torch.randn(320, 128)), torch.nn.Parameter(torch.randn(128))]
cls = torch.optim.AdamW if sys.argv[1] == "stock" else optim.AdamW
opt = cls(params, lr=1e-3)
for _ in range(3):
    (params[0].sum() + params[1].sum()).backward()
    opt.step()
    opt.zero_grad()
opt.load_state_dict(opt.state_dict())
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"s": time.perf_counter() - t0, "rss_mb": rss_mb, "dynamo": "torch._dynamo" in sys.modules}))
"""


def once(variant: str) -> dict[str, float]:
    run = subprocess.run([sys.executable, "-c", SCRIPT, variant], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)  # type: ignore[no-any-return]


PROG = "bench/optimizer_start.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    seen: dict[str, list[dict[str, float]]] = {"stock": [], "calmd": []}
    for _ in range(args.rounds):
        for variant in seen:
            seen[variant].append(once(variant))
    med = {v: {k: statistics.median(r[k] for r in rows) for k in ("s", "rss_mb")} for v, rows in seen.items()}
    for v, rows in seen.items():
        dynamo = "imports torch._dynamo" if all(r["dynamo"] for r in rows) else "no torch._dynamo"
        print(f"{v:6s} optimizer start {med[v]['s']:.3f} s   peak RSS {med[v]['rss_mb']:.0f} MB   ({dynamo})")
    print(f"calmd / stock: time {med['calmd']['s'] / med['stock']['s']:.3f}x, "
          f"peak RSS {med['calmd']['rss_mb'] / med['stock']['rss_mb']:.3f}x "
          f"({med['calmd']['rss_mb'] - med['stock']['rss_mb']:+.0f} MB), {args.rounds} rounds")  # fmt: skip


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
