"""Run every benchmark of bench/ in turn, with its defaults: `python bench/run_all.py [NAME ...]`.

Each benchmark prints its figures and the ratios measured in the same run; docs/performance.md
and docs/quality.md say which figure comes from which. Names select some (`latency stress`);
`--list` prints them. The whole set takes about 20 minutes on a 2-core machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# ab_latency and heavy_jobs compare two checkouts (--baseline PATH): run them by hand; gpu is the GPU
# run's driver (bench/gpu.sh) and harness what the benches share, not benchmarks.
BY_HAND = ("run_all", "ab_latency", "heavy_jobs", "gpu", "harness")
BENCHMARKS = sorted(p.stem for p in HERE.glob("*.py") if p.stem not in BY_HAND)

if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["--list"]:
        print("\n".join(BENCHMARKS))
        sys.exit(0)
    unknown = [a for a in args if a not in BENCHMARKS]
    if unknown:
        # the tools' usage error (calmd/arguments.py): one line, exit 2; stdlib only, for any python
        print(f"bench/run_all.py: error: unknown benchmark(s): {', '.join(unknown)}; known: "
              f"{', '.join(BENCHMARKS)}", file=sys.stderr)  # fmt: skip
        sys.exit(2)
    failed = []
    for name in args or BENCHMARKS:
        print(f"\n=== {name}", flush=True)
        if subprocess.call([sys.executable, str(HERE / f"{name}.py")]) != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    sys.exit(1 if failed else 0)
