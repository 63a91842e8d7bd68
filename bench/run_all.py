"""Run every benchmark of bench/ in turn: `python bench/run_all.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["tokenizer_encode.py", "ctds_open.py", "ranker_cost.py"]

if __name__ == "__main__":
    failed = 0
    for name in BENCHMARKS:
        print(f"\n=== {name}", flush=True)
        failed += subprocess.call([sys.executable, str(HERE / name)]) != 0
    sys.exit(1 if failed else 0)
