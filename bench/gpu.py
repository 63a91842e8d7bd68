"""The GPU run of issue 34: the CUDA path proven, and a default model trained with real compute.

A GPU machine (one H100 or H200, PyTorch with CUDA installed, no network) is lent now and then for
about 15 minutes in all, its start included. Everything it needs is prepared here on the CPU and
carried there, so that its minutes go to the GPU work alone.

Here, on the CPU:
    python bench/gpu.py prepare [--data ../shared/data]
        .gpu/ (ignored by git; the run tool's `carry` takes it along): the recipe's corpus, built
        from the shared data (the GPU machine has none) and gzip'd, and wheels of what the package
        needs besides torch, for the device's Python (3.12), downloaded with pip.
    bash bench/gpu.sh --dry-run [--out DIR]
        every device step below on this CPU at toy size (tests/bench/test_gpu_script.py runs it).

On the GPU machine, from a copy of the working tree (the run tool; docs/model.md has the call):
    bash bench/gpu.sh [--size nano] [--batch-size 256] [--train-minutes 7] [--budget 560]
Each step under its own time limit, the whole within --budget seconds, the summary rewritten
after each step so that a run cut short still says what it did:
 1. machine: python, torch, the GPU, nvcc, whether mamba_ssm imports. Not a CUDA torch: stop.
 2. setup: the corpus unpacked and checked; the carried wheels installed (pip --no-index
    --no-deps --target) for the modules the machine's python lacks, never torch.
 3. tests: `pytest -m cuda tests/model/test_cuda.py tests/model/test_model.py`.
 4. plan: a few dozen training steps of the size, timed (mamba-ssm's kernel and the PyTorch scan,
    where mamba_ssm imports), to choose the steps that fit --train-minutes.
 5. train: the recipe (`python -m calmd.training.recipe --corpus ...`) with those steps; its
    checkpoint is turned into $OUT/partial.cwgt every --export-every seconds, so that a run cut
    short still brings weights back; at the end, default.cwgt (with its EWC block) and the
    recipe's DEFAULT_MODEL.md. A file over 15 MiB comes back in parts (the tool's limit is 16).
 6. $OUT/summary.json: each step's status, seconds and figures; $OUT/gpu.log: everything printed.

Here again:
    python bench/gpu.py collect DIR [--to build/gpu]
        the weights from DIR (the files the run brought back): joined, their sha256 checked,
        loaded on the CPU and written again byte for byte the same, served (candidates).
    python bench/gpu.py compare FILE [--data ../shared/data]
        `calm replay --held-out` of FILE against the packaged model (keys saved, ghosts), and their
        keystroke latency through the real daemon (bench/model_latency.py), side by side.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CARRIED = ROOT / ".gpu"  # ignored by git: it travels only as the run tool's `carry`
WHEELS = CARRIED / "wheels"
CORPUS_GZ = CARRIED / "corpus.ctds.gz"
MANIFEST = CARRIED / "manifest.json"
DEVICE_PYTHON = "3.12"  # the GPU machine's python3 (its torch is 2.11+cu130)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
# What the package and its CUDA tests import besides torch and numpy (both on the machine): pip
# downloads these and what they need, at the versions of this checkout's environment.
REQUIREMENTS = (
    "msgpack",
    "platformdirs",
    "watchfiles",
    "uvloop",
    "rich",
    "pytest",
    "pytest-xdist",
    "hypothesis",
)
PART = 15 * 2**20  # the run tool brings back files of at most 16 MiB, 8 files, 64 MiB in all
SITE = Path(tempfile.gettempdir()) / "calm-gpu-site"  # where missing modules are installed there


# --------------------------------------------------------------------------- small helpers


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(2**20):
            digest.update(block)
    return digest.hexdigest()


def top_level(wheel: Path) -> list[str]:
    """The importable names a wheel installs (its top-level packages and modules)."""
    names = set()
    for entry in zipfile.ZipFile(wheel).namelist():
        head = entry.split("/", 1)[0]
        if head.endswith((".dist-info", ".data")):
            continue
        if "/" in entry or head.endswith(".py"):
            names.add(head.removesuffix(".py"))
    return sorted(n for n in names if n.isidentifier())


class Log:
    """Everything the run prints, to stdout and to OUT/gpu.log."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf-8", errors="replace")
        self.lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self.lock:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            sys.stdout.flush()
            self.file.write(text if text.endswith("\n") else text + "\n")
            self.file.flush()


def run_logged(
    argv: list[str], env: dict[str, str], timeout: float, log: Log, *,
    while_running: Callable[[], None] | None = None,
) -> tuple[int | None, float, str]:  # fmt: skip
    """Run `argv` with its output streamed into the log; killed (its process group) at `timeout`
    seconds. Returns (exit status, None when killed; seconds; the last 4,000 characters)."""
    started = time.monotonic()
    log(f"$ {' '.join(argv)}   (limit {timeout:.0f} s)")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)  # fmt: skip
    tail: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line)
            tail.append(line)
            del tail[:-200]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    status: int | None = None
    while True:
        try:
            status = proc.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() - started > timeout:
                os.killpg(proc.pid, 9)
                proc.wait()
                log(f"killed after {timeout:.0f} s")
                break
            if while_running is not None:
                while_running()
    reader.join(timeout=10)
    return status, time.monotonic() - started, "".join(tail)[-4000:]


def publish(src: Path, out: Path, name: str) -> dict[str, Any]:
    """Copy `src` into `out` as `name`, in parts of PART bytes when it is larger."""
    for old in out.glob(f"{name}*"):
        old.unlink()
    size = src.stat().st_size
    if size <= PART:
        shutil.copyfile(src, out / name)
        parts = [name]
    else:
        parts = []
        with src.open("rb") as f:
            while chunk := f.read(PART):
                parts.append(f"{name}.part{len(parts)}")
                (out / parts[-1]).write_bytes(chunk)
    return {"bytes": size, "sha256": sha256(src), "parts": parts}


# --------------------------------------------------------------------------- prepare (here)


def prepare(args: argparse.Namespace) -> int:
    CARRIED.mkdir(exist_ok=True)
    manifest: dict[str, Any] = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    if not args.skip_corpus:
        from calmd.training.corpus import DEFAULT_DATA, check_data
        from calmd.training.recipe import write_corpus

        data = Path(args.data) if args.data else DEFAULT_DATA
        check_data(data)  # the recipe's one-line error for a folder that is not the shared data
        with tempfile.TemporaryDirectory() as tmp:
            corpus = Path(tmp) / "corpus.ctds"
            started = time.monotonic()
            counts = write_corpus(data, corpus, seed=0)
            with corpus.open("rb") as src, gzip.open(CORPUS_GZ, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 2**20)
            shutil.copyfile(corpus.with_suffix(".json"), CARRIED / "corpus.json")
            manifest["corpus"] = {"sha256": sha256(corpus), "bytes": corpus.stat().st_size, "seed": 0,
                                  "gzip_bytes": CORPUS_GZ.stat().st_size, **counts}  # fmt: skip
        print(f"corpus: {counts['sequences']:,} sequences, {counts['tokens']:,} tokens in "
              f"{time.monotonic() - started:.0f} s; {CORPUS_GZ} "
              f"{CORPUS_GZ.stat().st_size / 1e6:.1f} MB")  # fmt: skip
    if not args.skip_wheels:
        from importlib.metadata import version

        shutil.rmtree(WHEELS, ignore_errors=True)
        pins = [f"{name}=={version(name)}" for name in REQUIREMENTS]
        argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
                args.python, "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS],
                "-d", str(WHEELS), *pins]  # fmt: skip
        subprocess.run(argv, check=True)
        wheels = sorted(WHEELS.glob("*.whl"))
        manifest["wheels"] = {"python": args.python, "files": [w.name for w in wheels]}
        print(f"wheels: {len(wheels)} in {WHEELS}, {sum(w.stat().st_size for w in wheels) / 1e6:.1f} MB")
    MANIFEST.write_text(json.dumps(manifest, indent=1))
    total = sum(p.stat().st_size for p in CARRIED.rglob("*") if p.is_file())
    print(f"{CARRIED}: {total / 1e6:.1f} MB to carry (the working tree and what it carries: 64 MiB at most)")
    return 0


# --------------------------------------------------------------------------- the device run


class Run:
    """The device run's state: where it writes, its deadline, its summary."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.work = Path(args.work)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = Log(self.out / "gpu.log")
        self.deadline = time.monotonic() + args.budget
        self.python = sys.executable
        self.summary: dict[str, Any] = {"dry_run": args.dry_run,
                                        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                        "options": {k: v for k, v in vars(args).items() if k != "func"},
                                        "steps": {}, "files": {}}  # fmt: skip
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SITE), os.environ.get("PYTHONPATH", "")])
        if args.dry_run:  # the CPU, even on a machine with a GPU
            self.env.update({"CUDA_VISIBLE_DEVICES": "", "CALM_CUDA_TESTS_ON_CPU": "1"})

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1))

    def step(self, name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        self.log(f"\n=== {name} ({self.left():.0f} s left of the budget)")
        started = time.monotonic()
        try:
            result = body()
        except Exception as exc:  # a step's failure is recorded, and the run goes on where it can
            result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        result["seconds"] = round(time.monotonic() - started, 1)
        self.summary["steps"][name] = result
        self.log(f"=== {name}: {result.get('status')} in {result['seconds']} s")
        self.save()
        return result

    def python_json(self, *argv: str, timeout: float = 120) -> Any:
        """Run the run's python on `argv` (code after -c, or this script and a helper's arguments)
        in the run's environment; what it printed last, as JSON."""
        done = subprocess.run([self.python, *argv], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
        return json.loads(done.stdout.strip().splitlines()[-1])

    # -- 1. machine

    def machine(self) -> dict[str, Any]:
        info = self.python_json("-c", MACHINE_PROBE)
        nvcc = shutil.which("nvcc")
        if nvcc:
            lines = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.splitlines()
            info["nvcc"] = lines[-1] if lines else nvcc
        info["cpu_cores"] = os.cpu_count()
        self.log(json.dumps(info))
        if not self.args.dry_run and not info["cuda"]:
            return {"status": "failed", "error": "this python's torch sees no CUDA device", **info}
        return {"status": "ok", **info}

    # -- 2. setup

    def setup(self) -> dict[str, Any]:
        result: dict[str, Any] = {"status": "ok"}
        corpus = self.work / "corpus.ctds"
        if CORPUS_GZ.exists():  # the dry run checks it too, and trains on a toy corpus
            manifest = json.loads(MANIFEST.read_text())
            carried = self.work / "carried.ctds" if self.args.dry_run else corpus
            with gzip.open(CORPUS_GZ, "rb") as src, carried.open("wb") as dst:
                shutil.copyfileobj(src, dst, 2**20)
            if sha256(carried) != manifest["corpus"]["sha256"]:
                raise RuntimeError(f"{CORPUS_GZ}: unpacked, its sha256 differs from {MANIFEST}'s")
            shutil.copyfile(CARRIED / "corpus.json", carried.with_suffix(".json"))
            result["corpus"] = {k: manifest["corpus"][k] for k in ("sequences", "tokens", "sha256")}
        elif not self.args.dry_run:
            raise RuntimeError(f"no {CORPUS_GZ}: run `python bench/gpu.py prepare` before, and carry .gpu")
        if self.args.dry_run:
            counts = self.python_json("bench/gpu.py", "toy-corpus", str(self.work))
            result["trained_on"] = {"toy corpus (the dry run)": counts}
        result["wheels"] = self.install_wheels()
        checked = self.python_json(
            "-c",
            "import json, calmd.training.train, calmd.model.generate, calmd.training.recipe, msgpack, "
            "platformdirs, pytest; import torch; print(json.dumps({'calmd': 'imports'}))",
        )
        result.update(checked)
        return result

    def install_wheels(self) -> dict[str, Any]:
        wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
        if not wheels:
            return {"carried": 0, "note": f"no {WHEELS} (python bench/gpu.py prepare)"}
        tops = {w: top_level(w) for w in wheels}
        names = sorted({n for ns in tops.values() for n in ns})
        missing = set(self.python_json(
            "-c", "import importlib.util, json, sys; "
            f"print(json.dumps([n for n in {names!r} if importlib.util.find_spec(n) is None]))"
        ))  # fmt: skip
        needed = [w for w, ns in tops.items() if any(n in missing for n in ns)]
        result: dict[str, Any] = {"carried": len(wheels), "installed": [w.name for w in needed]}
        pip = [self.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check"]  # fmt: skip
        env = {**self.env, "PIP_CONFIG_FILE": os.devnull}  # our wheels only, whatever pip.conf says
        if self.args.dry_run:
            # Not this CPU's python: check that pip finds, in the carried wheels alone, everything
            # the device's python needs to install them all.
            argv = [*pip, "--dry-run", "--ignore-installed", "--only-binary=:all:", "--python-version",
                    DEVICE_PYTHON, "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS],
                    "--find-links", str(WHEELS), *[str(w) for w in wheels]]  # fmt: skip
            argv.remove("--no-deps")  # the check is that their dependencies are all there
            with tempfile.TemporaryDirectory() as nowhere:  # pip wants a --target for foreign tags
                done = subprocess.run([*argv, "--target", nowhere], env=env, capture_output=True, text=True,
                                      timeout=120)  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"the carried wheels do not install on python {DEVICE_PYTHON}: "
                                   f"{done.stderr.strip()[-500:]}")  # fmt: skip
            result["checked_for_python"] = DEVICE_PYTHON
            result["installed"] = []
        elif needed:
            # one at a time: a wheel that does not fit this python (not 3.12) leaves the others be,
            # and the import check after says whether what is missing matters
            SITE.mkdir(parents=True, exist_ok=True)
            result["installed"], result["not_installed"] = [], []
            for wheel in needed:
                done = subprocess.run([*pip, "--target", str(SITE), str(wheel)], env=env, capture_output=True,
                                      text=True, timeout=120)  # fmt: skip
                result["installed" if done.returncode == 0 else "not_installed"].append(wheel.name)
                if done.returncode != 0:
                    self.log(f"{wheel.name}: {done.stderr.strip()[-300:]}")
        self.log(f"wheels: {len(wheels)} carried, installed {result['installed'] or 'none (all present)'}")
        return result

    # -- 3. tests

    def tests(self) -> dict[str, Any]:
        argv = [self.python, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
                "tests/model/test_cuda.py", "tests/model/test_model.py"]  # fmt: skip
        # none of the machine's pytest plugins (benchmark, cov, timeout...): a warning one of them
        # raises at start would fail every test under the project's filterwarnings = error
        env = {**self.env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        status, _, tail = run_logged(argv, env, min(self.args.tests_timeout, self.left() - 60), self.log)
        counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}
        ok = status == 0 and counts.get("passed", 0) > 0
        return {
            "status": "ok" if ok else ("timeout" if status is None else "failed"),
            "exit": status,
            **counts,
        }

    # -- 4. plan

    def plan(self) -> dict[str, Any]:
        args = self.args
        out = self.work / "plan.json"
        argv = [self.python, "bench/gpu.py", "time-steps", "--corpus", str(self.work / "corpus.ctds"),
                "--size", args.size, "--batch-size", str(args.batch_size), "--precision", args.precision,
                "--steps", str(args.plan_steps), "--threads", str(args.threads),
                "--json", str(out)]  # fmt: skip
        status, _, _ = run_logged(argv, self.env, min(args.plan_timeout, self.left() - 60), self.log)
        if status != 0:
            return {"status": "timeout" if status is None else "failed", "exit": status}
        timed = json.loads(out.read_text())
        per_step = timed["served"]["seconds_per_step"]
        # Left for the steps: the budget less the recipe's start, its validation, Fisher and saving
        # (about 40 s at nano's size on a GPU) and the publishing after it.
        train_s = min(60 * args.train_minutes, self.left() - args.reserve)
        steps = int(0.92 * train_s / per_step) if train_s > 0 else 0
        rows = timed["train_rows"]
        epochs = max(1, -(-steps * args.batch_size // rows))
        return {"status": "ok" if steps > 0 else "no time left", **timed, "train_seconds": round(train_s),
                "steps": steps, "epochs": epochs,
                "tokens_planned": round(steps * timed["tokens_per_step"])}  # fmt: skip

    # -- 5. train

    def train(self, plan: dict[str, Any]) -> dict[str, Any]:
        args = self.args
        model_dir = self.work / "model"
        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir()
        output = model_dir / "default.cwgt"
        checkpoint = self.work / "train.ckpt"
        checkpoint.unlink(missing_ok=True)  # an earlier run's, on a machine still warm: not this one's
        minutes = round(plan["train_seconds"] / 60, 2)
        argv = [self.python, "-m", "calmd.training.recipe", "--corpus", str(self.work / "corpus.ctds"),
                "--work", str(self.work), "--output", str(output), "--size", args.size,
                "--steps", str(plan["steps"]), "--epochs", str(plan["epochs"]),
                "--batch-size", str(args.batch_size), "--precision", args.precision,
                "--threads", str(args.threads), "--steps-minutes-cap", str(minutes)]  # fmt: skip
        exported: dict[str, Any] = {"mtime": 0.0, "at": 0.0}

        def export_checkpoint() -> None:
            """The latest checkpoint's weights into OUT/partial.cwgt, every --export-every seconds."""
            if not checkpoint.exists() or time.monotonic() - exported["at"] < args.export_every:
                return
            mtime = checkpoint.stat().st_mtime
            if mtime == exported["mtime"]:
                return
            partial = self.work / "partial.cwgt"
            exported.update(mtime=mtime, at=time.monotonic())
            try:
                step = self.python_json("bench/gpu.py", "export", str(checkpoint), str(partial), "--size",
                                        args.size)["step"]  # fmt: skip
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                self.log(f"partial weights: {exc}")
                return
            self.summary["files"]["partial.cwgt"] = {
                **publish(partial, self.out, "partial.cwgt"),
                "step": step,
            }
            self.save()
            self.log(f"partial weights of step {step} in {self.out / 'partial.cwgt'}")

        limit = min(plan["train_seconds"] + args.reserve - 15, self.left() - 15)
        status, seconds, _ = run_logged(argv, self.env, limit, self.log, while_running=export_checkpoint)
        outcome = "ok" if status == 0 else ("timeout" if status is None else "failed")
        result: dict[str, Any] = {"status": outcome, "exit": status, "command": " ".join(argv[1:])}
        if status == 0 and output.exists():
            self.summary["files"]["default.cwgt"] = publish(output, self.out, "default.cwgt")
            note = (model_dir / "DEFAULT_MODEL.md").read_text()
            (self.out / "DEFAULT_MODEL.md").write_text(note)
            self.summary["files"].pop("partial.cwgt", None)
            for old in self.out.glob("partial.cwgt*"):
                old.unlink()
            result.update(training_figures(note))
        else:
            exported["at"] = 0.0  # whatever the last checkpoint holds, now
            export_checkpoint()
        result["wall_seconds"] = round(seconds, 1)
        return result

    def device(self) -> int:
        args = self.args
        machine = self.step("machine", self.machine)
        if machine["status"] != "ok":
            return 1
        setup = self.step("setup", self.setup)
        if setup["status"] != "ok":
            return 1
        failed = False
        if not args.no_tests:
            failed |= self.step("tests", self.tests)["status"] != "ok"
        if not args.no_train:
            plan = self.step("plan", self.plan)
            if plan["status"] == "ok":
                failed |= self.step("train", lambda: self.train(plan))["status"] != "ok"
            else:
                failed = True
        self.summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self.save()
        self.log(f"\nsummary: {self.out / 'summary.json'}; files: {', '.join(sorted(self.summary['files']))}")
        return 1 if failed else 0


def training_figures(note: str) -> dict[str, Any]:
    """Steps, epochs, tokens, tokens/s and losses from the "Training:" line of the recipe's note
    (`TrainResult.summary()`)."""
    figures: dict[str, Any] = {}
    run = re.search(
        r"(\d+) steps \(([\d.]+) epochs\), ([\d,]+) tokens .*? in ([\d.]+) s \(([\d,]+) tokens/s\)", note
    )
    if run:
        figures.update(steps=int(run[1]), epochs=float(run[2]), tokens=int(run[3].replace(",", "")),
                       step_seconds=float(run[4]),
                       tokens_per_second=int(run[5].replace(",", "")))  # fmt: skip
    losses = re.search(r"loss: train ([\d.]+), validation ([\d.]+)", note)
    if losses:
        figures.update(train_loss=float(losses[1]), validation_loss=float(losses[2]))
    return figures


# Before the setup: nothing of calmd, which needs modules only the carried wheels may bring.
MACHINE_PROBE = """
import json, platform, torch
try:
    import mamba_ssm
    has_mamba = True
except ImportError:
    has_mamba = False
cuda = torch.cuda.is_available()
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": cuda,
        "torch_cuda": torch.version.cuda, "mamba_ssm": has_mamba}
if cuda:
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, capability=f"{p.major}.{p.minor}",
                gpu_memory_gib=round(p.total_memory / 2**30, 1))
print(json.dumps(info))
"""


def device(args: argparse.Namespace) -> int:
    if args.dry_run:  # toy sizes: seconds, not minutes
        for name, value in DRY_RUN.items():
            if getattr(args, name) == DEVICE_DEFAULTS[name]:
                setattr(args, name, value)
    if args.out is None:
        args.out = os.environ.get("OUT") or str(
            ROOT / "build" / "gpu" / ("dry-run" if args.dry_run else "out")
        )
    if args.work is None:
        args.work = str(Path(tempfile.gettempdir()) / ("calm-gpu-dry-run" if args.dry_run else "calm-gpu"))
    return Run(args).device()


DEVICE_DEFAULTS: dict[str, Any] = {"size": "nano", "batch_size": 256, "threads": 2, "train_minutes": 7.0,
                                   "budget": 560.0, "plan_steps": 40, "export_every": 60.0, "reserve": 60.0,
                                   "tests_timeout": 240.0, "plan_timeout": 90.0}  # fmt: skip
DRY_RUN: dict[str, Any] = {"batch_size": 4, "threads": 1, "train_minutes": 0.15, "budget": 600.0,
                           "plan_steps": 8, "export_every": 0.0, "reserve": 120.0}  # fmt: skip


# --------------------------------------------------------------------------- the device's helpers


def time_steps(args: argparse.Namespace) -> int:
    """Time `--steps` training steps on the corpus (after 5 of warm-up): with mamba-ssm's kernel
    where it imports on CUDA, and with the PyTorch scan. `served` is the path the training takes."""
    import numpy as np
    import torch

    from calmd.formats.ctds import CtdsReader
    from calmd.model import scan
    from calmd.training.train import TrainConfig, _split, train

    paths = ["pytorch"]
    if torch.cuda.is_available() and scan.mamba_ssm_importable():
        paths.insert(0, "mamba_ssm")
    dispatch = scan._cuda_scan_available
    timed: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            scan._cuda_scan_available = dispatch if path == "mamba_ssm" else (lambda x: False)  # type: ignore[assignment]
            stamps: list[float] = []
            cfg = TrainConfig(model="new", size=args.size, dataset=args.corpus, output=f"{tmp}/{path}.cwgt",
                              epochs=100_000, max_steps=args.steps, lr=3e-3, lr_schedule="cosine",
                              batch_size=args.batch_size, val_fraction=0, fisher_samples=0,
                              threads=args.threads, precision=args.precision, force=True,
                              quiet=True)  # fmt: skip
            result = train(cfg, on_step=lambda step, loss, stamps=stamps: stamps.append(time.perf_counter()))
            intervals = np.diff(stamps)[min(5, len(stamps) - 2) :]
            timed[path] = {"seconds_per_step": float(intervals.mean()), "steps_timed": len(intervals),
                           "tokens_per_second": round(result.tokens_per_second)}  # fmt: skip
            timed["tokens_per_step"] = result.tokens / result.steps
    scan._cuda_scan_available = dispatch  # type: ignore[assignment]
    timed["served"] = timed[paths[0]] | {"path": paths[0]}
    with CtdsReader(args.corpus) as reader:
        cfg = TrainConfig(val_fraction=0.01)  # the recipe's split
        timed["train_rows"] = int(_split(reader.count(), cfg)[0].size)
    Path(args.json).write_text(json.dumps(timed))
    print(json.dumps(timed))
    return 0


def export(args: argparse.Namespace) -> int:
    """A training checkpoint's weights as a CWGT (no EWC block: the run's end estimates that)."""
    import torch

    from calmd.formats.cwgt import Metadata
    from calmd.model.checkpoint import GenerationDefaults, save_model
    from calmd.model.mamba import SIZES, CalmModel

    blob = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    model = CalmModel(SIZES[args.size])
    model.load_state_dict(blob["model"])
    save_model(args.output, model, Metadata(), defaults=GenerationDefaults())  # what a new model gets
    print(json.dumps({"step": int(blob["step"])}))
    return 0


TOY_COMMANDS = ["git status", "git add -A", "git commit -m 'wip'", "git push origin main", "ls -la",
                "make test", "cd src", "vim README.md", "docker ps -a", "python3 -m pytest -q"]  # fmt: skip


def toy_data(root: Path) -> Path:
    """A data folder of the shared layout at toy size: three tldr pages; users of whom the first
    three that `held_out` keeps out are held out, and three more trained on."""
    from calmd.training.corpus import held_out

    for name in ("frob", "zork", "quux"):
        page = root / "tldr" / "common" / f"{name}.md"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(
            f"# {name}\n\n> A tool.\n\n- Do the thing:\n\n`{name} --verbose {{{{path/to/file}}}}`\n"
        )
    users = root / "histories" / "users"
    users.mkdir(parents=True, exist_ok=True)
    kept = {True: 0, False: 0}
    for i in range(100):
        name = f"user{i:02d}"
        if kept[held_out(name)] == 3:
            continue
        kept[held_out(name)] += 1
        lines = [TOY_COMMANDS[(i + 3 * j + j // 7) % len(TOY_COMMANDS)] for j in range(120)]
        (users / f"{name}.txt").write_text("\n".join(lines) + "\n")
    return root


def toy_corpus(args: argparse.Namespace) -> int:
    from calmd.training.recipe import write_corpus

    work = Path(args.work)
    counts = write_corpus(toy_data(work / "toy-data"), work / "corpus.ctds")
    print(json.dumps(counts))
    return 0


# --------------------------------------------------------------------------- collect and compare (here)


def collect(args: argparse.Namespace) -> int:
    """Join the weights DIR holds, check them, load them on the CPU, write them again, serve them."""
    from calmd.model.checkpoint import load_model, save_model
    from calmd.model.generate import Generator

    source = Path(args.dir)
    summary = json.loads((source / "summary.json").read_text())
    files = summary.get("files", {})
    name = "default.cwgt" if "default.cwgt" in files else "partial.cwgt" if "partial.cwgt" in files else None
    if name is None:
        raise SystemExit(f"{source}: the run brought back no weights (summary.json lists none)")
    to = Path(args.to)
    to.mkdir(parents=True, exist_ok=True)
    target = to / name
    with target.open("wb") as f:
        for part in files[name]["parts"]:
            f.write((source / part).read_bytes())
    if sha256(target) != files[name]["sha256"]:
        raise SystemExit(
            f"{target}: its sha256 is not the one the run recorded: a part is missing or damaged"
        )
    loaded = load_model(target, with_ewc=True)
    ewc = (loaded.fisher, loaded.anchor) if loaded.fisher is not None and loaded.anchor is not None else None
    again = save_model(
        to / f"{name}.resaved", loaded.model, loaded.metadata, defaults=loaded.defaults, ewc=ewc
    )
    same = again.read_bytes() == target.read_bytes()
    again.unlink()
    if not same:
        raise SystemExit(f"{target}: loaded on the CPU and written again, it is not the same bytes")
    if (source / "DEFAULT_MODEL.md").exists():
        shutil.copyfile(source / "DEFAULT_MODEL.md", to / "DEFAULT_MODEL.md")
    generator = Generator(loaded)
    history = [{"cmd": "cd ~/project", "exit": 0}, {"cmd": "git status", "exit": 0}]
    print(f"{target}: sha256 as recorded, {loaded.model.cfg.param_count():,} parameters"
          f"{', with its EWC block' if ewc else ''}; loaded on the CPU and written again: "
          "the same bytes")  # fmt: skip
    for typed in ("", "git c", "ls "):
        best = [c.text for c in generator.candidates({"history": history, "input": typed}, 3)]
        print(f"  served on the CPU, after `git status`, typed {typed!r}: {best}")
    print(f"next: python bench/gpu.py compare {target}")
    return 0


REPLAY_FIGURES = [
    ("top-1 k=0", lambda t: t["top1"]["0"]),
    ("top-1 k=2", lambda t: t["top1"]["2"]),
    ("keys saved, whole line", lambda t: t.get("keystrokes_saved_lines")),
    ("keys saved, word by word", lambda t: t.get("keystrokes_saved_words")),
    ("keys saved, drawn ghosts, words", lambda t: t.get("keystrokes_saved_words_drawn")),
    ("states showing a wrong ghost", lambda t: t.get("wrong")),
    ("ghosts replaced within a key", lambda t: (t.get("ghosts") or {}).get("replaced_share")),
]


def compare(args: argparse.Namespace) -> int:
    """The held-out replay and the keystroke latency of FILE against the packaged model."""
    from calmd import paths

    out = Path(args.to)
    out.mkdir(parents=True, exist_ok=True)
    # the replay names a model by its file's name: these two say which is which
    candidate, packaged = out / "candidate.cwgt", out / "packaged.cwgt"
    if Path(args.file).resolve() != candidate.resolve():
        shutil.copyfile(args.file, candidate)
    shutil.copyfile(paths.packaged_weights(), packaged)
    replay_json = out / "replay.json"
    from calmd.training.corpus import DEFAULT_DATA

    users = (Path(args.data) if args.data else DEFAULT_DATA) / "histories" / "users"
    calm = [sys.executable, "-c", "from calmd.cli import calm_main; raise SystemExit(calm_main())"]
    argv = [*calm, "replay", str(users), "--held-out", "-m", str(packaged), "-m", str(candidate),
            "--json", str(replay_json), "--quiet", "--positions", str(args.positions),
            "--typing", str(args.typing), "--warmup", str(args.warmup)]  # fmt: skip
    print("$", " ".join(argv[3:]), flush=True)
    subprocess.run(argv, cwd=ROOT, check=True)
    totals = json.loads(replay_json.read_text())["totals"]
    systems = [s for s in totals if s.startswith("calmd")]
    print(f"\n{'':<34}" + "".join(f"{s:>24}" for s in systems))
    for label, figure in REPLAY_FIGURES:
        values = []
        for s in systems:
            try:
                value = figure(totals[s])
            except (KeyError, TypeError):
                value = None
            values.append("-" if value is None else f"{value * 100:.1f}%")
        print(f"{label:<34}" + "".join(f"{v:>24}" for v in values))
    latency = [sys.executable, str(ROOT / "bench" / "model_latency.py"), "--model", f"candidate={candidate}",
               "--rounds", str(args.rounds)]  # fmt: skip
    print("\n$", " ".join(latency[1:]), flush=True)
    subprocess.run(latency, cwd=ROOT, check=True)
    return 0


# --------------------------------------------------------------------------- the command line


PROG = "bench/gpu.py"


def main() -> int:
    from calmd.arguments import Parser

    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(required=True)
    p = sub.add_parser("prepare", help="here: the corpus and the wheels into .gpu/")
    p.add_argument("--data", help="the shared data folder (default: the recipe's, ../shared/data)")
    p.add_argument("--python", default=DEVICE_PYTHON, help="the device's python version (3.12)")
    p.add_argument("--skip-corpus", action="store_true")
    p.add_argument("--skip-wheels", action="store_true")
    p.set_defaults(func=prepare)
    p = sub.add_parser("device", help="on the GPU machine (bench/gpu.sh): the run, into --out")
    p.add_argument("--dry-run", action="store_true", help="every step on this CPU at toy size")
    p.add_argument("--out", help="where the files to bring back go (default: $OUT)")
    p.add_argument("--work", help="scratch folder (default: a folder in /tmp)")
    p.add_argument("--size", choices=("nano", "micro"), help="mini's weights with their EWC block (150 MB) "
                   "do not fit through the run tool's 64 MiB")  # fmt: skip
    p.add_argument("--batch-size", type=int)
    p.add_argument("--threads", type=int, help="torch's CPU threads (the recipe's --threads)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--train-minutes", type=float, help="for the training steps")
    p.add_argument("--budget", type=float, help="seconds for the whole run")
    p.add_argument("--plan-steps", type=int, help="steps timed to plan the run")
    p.add_argument("--export-every", type=float, help="seconds between partial weights")
    p.add_argument("--reserve", type=float, help="seconds kept for the recipe's end and publishing")
    p.add_argument("--tests-timeout", type=float)
    p.add_argument("--plan-timeout", type=float)
    p.add_argument("--no-tests", action="store_true", help="skip the CUDA tests")
    p.add_argument("--no-train", action="store_true", help="skip the plan and the training")
    p.set_defaults(func=device, **DEVICE_DEFAULTS)
    p = sub.add_parser("collect", help="here: the weights from the run's files, checked")
    p.add_argument("dir")
    p.add_argument("--to", default=str(ROOT / "build" / "gpu"))
    p.set_defaults(func=collect)
    p = sub.add_parser("compare", help="here: replay and keystroke latency against the packaged model")
    p.add_argument("file")
    p.add_argument("--data", help="the shared data folder (default: ../shared/data)")
    p.add_argument("--to", default=str(ROOT / "build" / "gpu"))
    p.add_argument("--positions", type=int, default=40)
    p.add_argument("--typing", type=int, default=15)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5, help="bench/model_latency.py's")
    p.set_defaults(func=compare)
    # the device run's own steps, each in a process of its own
    p = sub.add_parser("time-steps")
    for flag in ("--corpus", "--size", "--precision", "--json"):
        p.add_argument(flag, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.set_defaults(func=time_steps)
    p = sub.add_parser("export")
    p.add_argument("checkpoint")
    p.add_argument("output")
    p.add_argument("--size", required=True)
    p.set_defaults(func=export)
    p = sub.add_parser("toy-corpus")
    p.add_argument("work")
    p.set_defaults(func=toy_corpus)
    args = parser.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    # the device's python has no calmd installed (its steps get the tree on PYTHONPATH): the tree's,
    # after what is installed, for the tools' one error line
    sys.path.append(str(ROOT))
    from calmd.arguments import run_tool

    raise SystemExit(run_tool(PROG, main))
