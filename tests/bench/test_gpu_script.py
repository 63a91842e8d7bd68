"""bench/gpu.sh --dry-run: the GPU run of issue 34, every step on the CPU at toy size, so that the
script a GPU machine runs for its few minutes keeps working; then its weights collected and
compared as they would be after a real run (bench/gpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calmd.model.checkpoint import load_model

pytestmark = pytest.mark.slow  # minutes: a nested pytest, training runs, daemons

ROOT = Path(__file__).resolve().parents[2]
TRAIN_MINUTES = 0.05


def gpu_py(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "bench/gpu.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """(its $OUT, its work folder, its summary)"""
    tmp = tmp_path_factory.mktemp("gpu-dry-run")
    out, work = tmp / "out", tmp / "work"
    env = {**os.environ, "CALM_GPU_PYTHON": sys.executable}
    # 3 s of training steps, not the dry run's 9: a third of its CPU went to them, and what comes
    # back (weights, checkpoint, note) is the same after a few steps as after a hundred
    argv = ["bash", "bench/gpu.sh", "--dry-run", "--out", str(out), "--work", str(work), "--train-minutes",
            str(TRAIN_MINUTES)]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return out, work, json.loads((out / "summary.json").read_text())


def test_the_dry_run_makes_every_step_and_brings_back_its_weights(dry_run: tuple[Path, Path, dict]) -> None:
    out, work, summary = dry_run
    steps = summary["steps"]
    assert {name: step["status"] for name, step in steps.items()} == dict.fromkeys(
        ["machine", "setup", "tests", "plan", "train"], "ok"
    )
    assert steps["machine"]["cuda"] is False  # the CPU, even where a GPU is
    assert steps["tests"]["passed"] >= 8  # tests/model/test_cuda.py, run on the CPU
    assert steps["plan"]["steps"] >= 1 and steps["plan"]["served"]["path"] == "pytorch"
    assert 1 <= steps["train"]["steps"] <= steps["plan"]["steps"]
    assert steps["train"]["validation_loss"] > 0
    # What comes back: the weights (not the partial ones, once the final ones are there), the
    # recipe's note saying how they were made, the log; all within the run tool's limits.
    files = sorted(p.name for p in out.iterdir())
    assert files == ["DEFAULT_MODEL.md", "default.cwgt", "gpu.log", "summary.json"]
    assert all(p.stat().st_size < 16 * 2**20 for p in out.iterdir())
    assert (out / "default.cwgt").read_bytes() == (work / "model" / "default.cwgt").read_bytes()
    note = (out / "DEFAULT_MODEL.md").read_text()
    plan = steps["plan"]
    cap = f"--steps-minutes-cap {TRAIN_MINUTES:g}"
    assert (f"python -m calmd.training.recipe --steps {plan['steps']} --seed 0 --size nano --threads 1 "
            f"--epochs {plan['epochs']} --batch-size 4 {cap}`") in note  # fmt: skip
    assert f"on a {os.cpu_count()}-core CPU" in note
    assert load_model(out / "default.cwgt", with_ewc=True).fisher is not None


def test_a_checkpoint_exports_the_weights_the_run_ends_with(
    dry_run: tuple[Path, Path, dict], tmp_path: Path
) -> None:
    """What partial.cwgt holds while the run goes on: the last checkpoint's weights, here the
    final ones."""
    _, work, summary = dry_run
    done = gpu_py("export", str(work / "train.ckpt"), str(tmp_path / "partial.cwgt"), "--size", "nano")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["step"] == summary["steps"]["train"]["steps"]
    exported = load_model(tmp_path / "partial.cwgt").model.to_named_arrays()
    final = load_model(work / "model" / "default.cwgt").model.to_named_arrays()
    assert [n for n, _ in exported] == [n for n, _ in final]
    assert all((a == b).all() for (_, a), (_, b) in zip(exported, final, strict=True))


def test_collect_joins_checks_and_serves_the_weights(
    dry_run: tuple[Path, Path, dict], tmp_path: Path
) -> None:
    out, work, _ = dry_run
    done = gpu_py("collect", str(out), "--to", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded on the CPU and written again: the same bytes" in done.stdout
    assert "served on the CPU" in done.stdout
    assert (tmp_path / "default.cwgt").read_bytes() == (work / "model" / "default.cwgt").read_bytes()
    # a part lost on the way is said, not passed off
    summary = json.loads((out / "summary.json").read_text())
    summary["files"]["default.cwgt"]["sha256"] = "0" * 64
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "summary.json").write_text(json.dumps(summary))
    (damaged / "default.cwgt").write_bytes((out / "default.cwgt").read_bytes())
    done = gpu_py("collect", str(damaged), "--to", str(tmp_path / "again"))
    assert done.returncode != 0 and "sha256 is not the one the run recorded" in done.stderr


def test_compare_replays_and_times_the_model_beside_the_packaged_one(
    dry_run: tuple[Path, Path, dict], tmp_path: Path
) -> None:
    _, work, _ = dry_run
    model = work / "model" / "default.cwgt"
    done = gpu_py("compare", str(model), "--data", str(work / "toy-data"), "--to", str(tmp_path),
                  "--positions", "3", "--typing", "1", "--warmup", "10", "--rounds", "1")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "keys saved, drawn ghosts, words" in done.stdout
    totals = json.loads((tmp_path / "replay.json").read_text())["totals"]
    assert {"calmd:packaged", "calmd:candidate"} <= set(totals)
    assert "candidate" in done.stdout and "packaged" in done.stdout  # the latency, side by side
    assert "search-answered" in done.stdout
