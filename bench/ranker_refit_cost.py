"""The history ranker's refit in a background run: its time, on real histories, in one run.

The stage a run does before the model's fine-tune (calmd/training/background.py
`refit_user_ranker`): the ranking examples gathered from the store (the newest 2,000 commands ask
their queries, the older ones only fill the history), the refit (60 full-batch Adam steps), the
write of ranker.json. Timed on the --users largest held-out histories of
../shared/data/histories (each in a store of its own), and on --big commands of them concatenated
(the daemon's index bound is 50,000): the time grows with the history only through the commands
that merely fill it. torch is imported before the clock starts, as a run imports it for the
model anyway. One thread, as the run has.

    python bench/ranker_refit_cost.py [--users 3] [--big 50000]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from calmd import paths
from calmd.arguments import Parser, run_tool
from calmd.history.store import HistoryStore
from calmd.suggest.ranker import packaged_ranker
from calmd.training.background import write_ranker
from calmd.training.corpus import held_out, read_history
from calmd.training.ranker_refit import examples_from_store, refit_ranker

HISTORIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "histories" / "users"


def timed(name: str, commands: list[str]) -> None:
    base = packaged_ranker()
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        store = HistoryStore(data / paths.HISTORY)
        for i, cmd in enumerate(commands):
            store.record(cmd, exit=0, session="s", ts=1000 + i)
        start = time.perf_counter()
        gathered = examples_from_store(store, base)  # what refit_user_ranker does, step by step
        gather_s = time.perf_counter() - start
        start = time.perf_counter()
        fitted = refit_ranker(gathered.examples, base)
        refit_s = time.perf_counter() - start
        start = time.perf_counter()
        write_ranker(fitted, data / paths.RANKER)
        write_s = time.perf_counter() - start
        store.close()
    used = fitted.info.get("refit", {}).get("examples", 0)
    total = gather_s + refit_s + write_s
    print(f"| {name} | {len(commands):,} | {used:,} | {gather_s:.1f} | {refit_s:.1f} | "
          f"{write_s * 1000:.0f} ms | {total:.1f} |", flush=True)  # fmt: skip


PROG = "bench/ranker_refit_cost.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=3, help="the largest held-out histories timed")
    parser.add_argument("--big", type=int, default=50_000, help="commands of the concatenated history")
    args = parser.parse_args()
    import torch  # what a run has imported already

    torch.set_num_threads(1)
    files = sorted((p for p in HISTORIES.glob("*.txt") if held_out(p.stem)), key=lambda p: -p.stat().st_size)
    if not files:
        raise SystemExit(f"no histories under {HISTORIES}")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| history | commands | examples refitted on | gather s | refit s | write | stage s |")
    print("|---|---|---|---|---|---|---|")
    for path in files[: args.users]:
        timed(path.stem, read_history(path))
    everything = [c for p in sorted(HISTORIES.glob("*.txt")) for c in read_history(p)]
    timed("all users, concatenated", everything[-args.big :])
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
