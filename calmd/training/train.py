"""Training: `calm train`, next-byte prediction on the command part of CTDS sequences.

Glossary (shapes in comments)
    B  sequences in a batch (on this rank)     L  padded length of the batch     V  vocabulary (320)

Loss. A CTDS sequence is `context frames, ATN, CMD, command bytes, EOS`. Only the tokens after
ATN are targets (the CTDS loss mask): the model learns to complete commands, never to generate
contexts. The loss of a step is the mean negative log-likelihood per supervised token of the
whole (global) batch; padding is neither input that matters (the model is causal and pads come
last) nor target.

Data-parallel training. Under `torchrun --nproc_per_node N` every rank draws the same shuffled
global batch of `batch_size` sequences and reads its own shard of it (rows rank, rank + N, ...)
from the memory-mapped CTDS; DistributedDataParallel all-reduces the gradients (gloo on CPU,
nccl on GPU). Each rank scales its summed loss by N / (supervised tokens of the global batch), so
the averaged gradient is exactly the single-process gradient of the same global batch: N ranks
and one process follow the same trajectory up to float rounding (tested). Rank 0 writes the file.

EWC. A run that starts from a file carrying a Fisher adds `ewc_lambda / 2 * sum F (theta -
anchor)^2` to its loss, and every run stores the Fisher of its own training sequences (combined
with the input's) beside the weights it wrote: calmd/training/ewc.py says what F is and why.

The rest of a run lives beside this module: the rows and batch order (batches.py), the process
group under torchrun (distributed.py), the checkpoint that --resume continues (checkpoints.py).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from calmd import paths
from calmd.errors import CalmError
from calmd.formats.ctds import CtdsReader, pad_sequences
from calmd.formats.cwgt import Metadata
from calmd.formats.tokenizer import Special
from calmd.model.checkpoint import GenerationDefaults, flatten, load_model, save_model
from calmd.model.loss import supervised_nll
from calmd.model.mamba import SIZES, CalmModel
from calmd.training import optim
from calmd.training.batches import bucketed_order, read_rows, supervised_counts
from calmd.training.checkpoints import RunState, load_checkpoint, save_checkpoint
from calmd.training.distributed import Dist, init_distributed
from calmd.training.ewc import combined_fisher, estimate_fisher, ewc_penalty, split_like
from calmd.training.plot import check_available, write_loss_plot

OPTIMIZERS = ("adam", "adamw", "sgd")
PRECISIONS = ("fp32", "bf16")
DEFAULT_LR_NEW = 1e-3  # from random weights
DEFAULT_LR_FINETUNE = 1e-4  # continuing a trained model


@dataclass(frozen=True)
class TrainConfig:
    """Every option of `calm train`, one `--kebab-case` flag per field (calmd/training/commands.py)."""

    model: str | None = None  # "new", or a CWGT path to fine-tune; None: the user's weights
    size: str = "nano"  # architecture of a new model (calmd.model.mamba.SIZES)
    dataset: str | None = None  # CTDS file; None: paths.dataset_path()
    output: str | None = None  # None: the input model's path (in place), or the user's weights
    epochs: int = 3
    lr: float | None = None  # None: 1e-3 for a new model, 1e-4 when fine-tuning
    lr_schedule: str = "constant"  # constant | cosine (linear warm-up over 2% of the steps, then cosine to 0)
    optimizer: str = "adamw"  # adam | adamw | sgd (momentum 0.9)
    weight_decay: float = 0.01  # on weight matrices and the embedding only
    batch_size: int = 16  # sequences per optimizer step, over all ranks
    seed: int = 0
    grad_clip: float = 1.0  # max gradient norm; 0 disables clipping
    val_fraction: float = 0.05  # sequences held out for the validation loss
    threads: int = 0  # torch threads; 0: torch's default (cores / local ranks under torchrun)
    ewc_lambda: float = 100.0  # EWC strength when the input carries a Fisher (docs/training.md); 0: off
    ewc_gamma: float = 0.5  # weight of the input model's Fisher in the new one
    fisher_samples: int = 128  # sequences for the Fisher estimate; 0: store no EWC block
    max_steps: int = 0  # stop after this many optimizer steps; 0: run all epochs
    max_minutes: float = 0.0  # wall-clock budget for the optimizer steps; 0: none
    plot: str | None = None  # draw the loss curve here: PNG, or SVG for a name ending in .svg (matplotlib)
    checkpoint: str | None = None  # the run's state (weights, optimizer, batch order, step) is saved here
    checkpoint_every: int = 200  # optimizer steps between checkpoints (and one when the run stops)
    resume: bool = False  # continue the run saved in --checkpoint: the same model as one uninterrupted run
    device: str = "auto"  # auto | cpu | cuda
    # fp32 | bf16: autocast, the matrix products and the conv in bfloat16 (a GPU's fast path), the
    # weights, the optimizer, the scan's recurrence (calmd/model/mamba.py) and the loss in float32
    precision: str = "fp32"
    force: bool = False  # let a new model replace an existing output file
    quiet: bool = False  # no progress bar, no summary

    def __post_init__(self) -> None:
        checks = [
            (self.size in SIZES, f"--size must be one of {', '.join(SIZES)}"),
            (self.optimizer in OPTIMIZERS, f"--optimizer must be one of {', '.join(OPTIMIZERS)}"),
            (self.epochs >= 1, "--epochs must be >= 1"),
            (self.lr is None or self.lr > 0, "--lr must be > 0"),
            (self.weight_decay >= 0, "--weight-decay must be >= 0"),
            (self.batch_size >= 1, "--batch-size must be >= 1"),
            (self.grad_clip >= 0, "--grad-clip must be >= 0"),
            (0 <= self.val_fraction < 1, "--val-fraction must be in [0, 1)"),
            (self.threads >= 0, "--threads must be >= 0"),
            (self.ewc_lambda >= 0, "--ewc-lambda must be >= 0"),
            (0 <= self.ewc_gamma <= 1, "--ewc-gamma must be in [0, 1]"),
            (self.fisher_samples >= 0, "--fisher-samples must be >= 0"),
            (self.max_steps >= 0, "--max-steps must be >= 0"),
            (self.max_minutes >= 0, "--max-minutes must be >= 0"),
            (self.lr_schedule in ("constant", "cosine"), "--lr-schedule must be constant or cosine"),
            (self.device in ("auto", "cpu", "cuda"), "--device must be auto, cpu or cuda"),
            (self.precision in PRECISIONS, f"--precision must be one of {', '.join(PRECISIONS)}"),
            (self.checkpoint_every >= 1, "--checkpoint-every must be >= 1"),
            (not self.resume or bool(self.checkpoint), "--resume needs --checkpoint PATH"),
        ]
        for ok, message in checks:
            if not ok:
                raise CalmError(message)


@dataclass(frozen=True)
class TrainResult:
    output: Path
    steps: int
    epochs: float  # passes over the training set actually run
    tokens: int  # real (non-pad) tokens through the model, all ranks: the throughput measure
    supervised_tokens: int  # targets the loss saw (tokens after ATN), all ranks
    seconds: float  # the optimizer steps, without validation and the Fisher estimate
    train_loss: float  # mean per supervised token over the last epoch's steps (or fewer)
    val_loss: float | None  # on the held-out sequences, after the run
    val_sequences: int
    fisher_sequences: int  # 0: no EWC block was written
    ewc_lambda: float  # the penalty's strength, 0 when no penalty was applied
    losses: tuple[float, ...] = field(repr=False, default=())  # per step
    val_losses: tuple[tuple[int, float], ...] = ()  # (step, loss) after each epoch

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def summary(self) -> str:
        """The end-of-run report `calm train` prints."""
        val = (
            f", validation {self.val_loss:.4f} ({self.val_sequences} held-out sequences)"
            if self.val_loss is not None
            else ", no validation set"
        )
        lines = [
            f"{self.steps} steps ({self.epochs:.2f} epochs), {self.tokens:,} tokens "
            f"({self.supervised_tokens:,} supervised) in {self.seconds:.1f} s "
            f"({self.tokens_per_second:,.0f} tokens/s)",
            f"loss: train {self.train_loss:.4f}{val}",
        ]
        if self.ewc_lambda:
            lines.append(f"EWC: penalty lambda {self.ewc_lambda:g} against the input model's Fisher")
        if self.fisher_sequences:
            lines.append(
                f"EWC: Fisher estimated on {self.fisher_sequences} sequences, stored with the weights"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- setup


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise CalmError("--device cuda: no CUDA device is available")
    return torch.device(name)


@dataclass
class _Start:
    model: CalmModel
    metadata: Metadata
    defaults: GenerationDefaults
    fisher: npt.NDArray[np.float32] | None
    anchor: npt.NDArray[np.float32] | None
    new: bool
    source: Path | None
    trained: bool  # False for random weights: `--model new`, or a file `calm init` wrote


def _start(cfg: TrainConfig) -> _Start:
    if cfg.model == "new":
        model = CalmModel(SIZES[cfg.size])
        model.init_weights(cfg.seed)
        return _Start(model, Metadata(), GenerationDefaults(), None, None, True, None, False)
    path = Path(cfg.model) if cfg.model else paths.weights_path()
    if not path.exists():
        hint = "" if cfg.model else " (run `calm init` first, or pass --model new)"
        raise CalmError(f"{path}: model not found{hint}")
    loaded = load_model(path, with_ewc=True)
    # Every `calm train` run stores an EWC block (unless --fisher-samples 0); `calm init` writes
    # none. A file without one holds weights nobody trained: it gets a new model's learning rate.
    trained = loaded.fisher is not None
    return _Start(
        loaded.model, loaded.metadata, loaded.defaults, loaded.fisher, loaded.anchor, False, path, trained
    )


def _output(cfg: TrainConfig, start: _Start) -> Path:
    if cfg.output is not None:
        out = Path(cfg.output)
    elif start.source is not None:
        out = start.source  # fine-tune in place: the daemon hot-reloads it
    else:
        out = paths.weights_path()
    if start.new and out.exists() and not cfg.force:
        raise CalmError(f"{out} exists; pass --force to replace it with a new model (or choose -o)")
    return out


def _open_dataset(cfg: TrainConfig, l_max: int) -> CtdsReader:
    path = Path(cfg.dataset) if cfg.dataset else paths.dataset_path()
    if not path.exists():
        raise CalmError(f"{path}: dataset not found (build one with `calm dataset`)")
    reader = CtdsReader(path)  # FormatError names the file and field
    if reader.count() == 0:
        raise CalmError(f"{path}: the dataset holds no sequences")
    longest = int(reader.lengths.max())
    if longest > l_max:
        i = int(np.argmax(reader.lengths))
        raise CalmError(
            f"{path}: sequence {i} has {longest} tokens, over the model's l_max {l_max} "
            f"(rebuild the dataset with `calm dataset --l-max {l_max}`)"
        )
    return reader


def _optimizer(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Weight decay on weight matrices and the embedding; never on norms, biases, A_log or D
    (mamba_ssm's `_no_weight_decay`)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith("A_log")]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.endswith("A_log"))]
    groups: list[dict[str, Any]] = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    # calmd/training/optim.py: torch.optim's, without the 1.9 s import of torch's compiler
    if cfg.optimizer == "adam":
        return optim.Adam(groups, lr=lr)
    if cfg.optimizer == "adamw":
        return optim.AdamW(groups, lr=lr)
    return optim.SGD(groups, lr=lr, momentum=0.9)


def _split(n: int, cfg: TrainConfig) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(train rows, validation rows), the same on every rank (seeded)."""
    perm = np.random.default_rng(cfg.seed).permutation(n).astype(np.int64)
    n_val = min(round(n * cfg.val_fraction), n - 1) if cfg.val_fraction > 0 else 0
    if cfg.val_fraction > 0 and n_val == 0 and n >= 10:
        n_val = 1
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


@torch.no_grad()
def validation_loss(
    model: CalmModel, reader: CtdsReader, rows: npt.NDArray[np.int64], batch_size: int, dist: Dist,
    device: torch.device,
) -> float | None:  # fmt: skip
    """Mean NLL per supervised token over `rows` (each rank its share, summed over ranks)."""
    if rows.size == 0:
        return None
    mine = rows[dist.rank :: dist.world]
    mine = mine[np.argsort(reader.lengths[mine], kind="stable")]  # similar lengths: less padding
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for start in range(0, mine.size, batch_size):
        chunk = mine[start : start + batch_size]
        tokens, mask = read_rows(reader, chunk)
        total[0] += supervised_nll(model, tokens.to(device), mask.to(device)).double()
        total[1] += int(mask[:, 1:].sum())
    total = dist.all_sum(total)
    return float(total[0] / total[1].clamp(min=1))


# --------------------------------------------------------------------------- the run


class _Progress:
    """A rich progress bar (loss, tokens/s, ETA) on rank 0, or nothing."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.bar: Any = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("[bold]train[/] epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TextColumn("{task.fields[tps]:>8,.0f} tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.task = self.bar.add_task("train", total=total, epoch=1, loss=float("nan"), tps=0.0)
        self.bar.start()

    def update(self, **fields: Any) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, **fields)

    def skip(self, steps: int) -> None:
        """Steps a resumed run did before (counted done, not timed)."""
        if self.bar is not None and steps:
            self.bar.update(self.task, completed=steps)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def lr_at(cfg: TrainConfig, lr: float, step: int, total: int) -> float:
    if cfg.lr_schedule == "constant":
        return lr
    warm = max(1, total // 50)
    if step < warm:
        return lr * (step + 1) / warm
    return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


def _run_key(
    cfg: TrainConfig, start: _Start, reader: CtdsReader, lr: float, total_steps: int, world: int
) -> dict[str, str]:
    """What a saved run and the run that continues it must share (calmd/training/checkpoints.py):
    the same start, data, batches and schedule give the same model as one uninterrupted run."""
    return {
        "start": f"new {cfg.size} seed {cfg.seed}" if start.source is None else str(start.source.resolve()),
        "dataset": str(Path(reader.path).resolve()),
        "dataset sequences": str(reader.count()),
        "dataset bytes": str(os.path.getsize(reader.path)),
        "seed": str(cfg.seed),
        "batch size": str(cfg.batch_size),
        "epochs": str(cfg.epochs),
        "lr": repr(lr),
        "lr schedule": cfg.lr_schedule,
        "optimizer": cfg.optimizer,
        "weight decay": repr(cfg.weight_decay),
        "grad clip": repr(cfg.grad_clip),
        "validation fraction": repr(cfg.val_fraction),
        "EWC lambda": repr(cfg.ewc_lambda),
        "total steps": str(total_steps),
        "ranks": str(world),
        "precision": cfg.precision,
    }


def planned_steps(train_rows: int, cfg: TrainConfig) -> int:
    """Optimizer steps a run of `train_rows` training sequences makes, unless its time budget
    ends it first (the background run's progress shows it as the total)."""
    total = -(-train_rows // cfg.batch_size) * cfg.epochs
    return min(total, cfg.max_steps) if cfg.max_steps else total


def train(cfg: TrainConfig, *, on_step: Callable[[int, float], None] | None = None) -> TrainResult:
    """Run `calm train` (also as one rank under torchrun) and write the model atomically (rank
    0). `on_step(step, loss)` is called after every optimizer step. With `cfg.checkpoint` the run's
    state is saved every `checkpoint_every` steps and when the time budget ends it; `cfg.resume`
    continues such a run, and gives the same model as one uninterrupted run of the same steps."""
    if cfg.plot:
        check_available()  # before the training, not after it: how to install matplotlib
    device = _device(cfg.device)
    dist = init_distributed(device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    elif dist.local_world > 1 and device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.local_world))
    torch.manual_seed(cfg.seed)

    start = _start(cfg)
    out = _output(cfg, start)
    model = start.model.to(device)
    reader = _open_dataset(cfg, model.cfg.l_max)
    train_rows, val_rows = _split(reader.count(), cfg)
    if train_rows.size == 0:
        raise CalmError(f"{reader.path}: no sequences left for training after the validation split")
    lr = cfg.lr or (DEFAULT_LR_FINETUNE if start.trained else DEFAULT_LR_NEW)

    ewc: tuple[list[Tensor], list[Tensor]] | None = None
    if cfg.ewc_lambda > 0 and start.fisher is not None and start.anchor is not None:
        ewc = split_like(model, start.fisher, device), split_like(model, start.anchor, device)

    per_epoch = -(-train_rows.size // cfg.batch_size)
    total_steps = planned_steps(train_rows.size, cfg)
    optimizer = _optimizer(cfg, model, lr)
    checkpoint = Path(cfg.checkpoint) if cfg.checkpoint else None
    key = _run_key(cfg, start, reader, lr, total_steps, dist.world)
    rng = np.random.default_rng([cfg.seed, 1])  # the same batch order on every rank
    run = RunState()
    if cfg.resume:
        assert checkpoint is not None  # TrainConfig checks it
        run = load_checkpoint(checkpoint, key, model, optimizer, device)
        assert run.rng is not None
        rng.bit_generator.state = run.rng

    model.train()
    wrapped = dist.wrap(model)  # DistributedDataParallel under torchrun: broadcasts rank 0's weights
    deadline = time.monotonic() + 60 * cfg.max_minutes if cfg.max_minutes else math.inf
    params = list(model.parameters())
    progress = _Progress(dist.main and not cfg.quiet, total_steps)
    progress.skip(run.step)
    t0 = time.perf_counter()
    out_of_time = False
    try:
        for step in range(run.step, total_steps):
            epoch, b = divmod(step, per_epoch)
            if out_of_time:
                break
            if b == 0 or run.order is None:
                run.order = bucketed_order(reader.lengths, train_rows, cfg.batch_size, rng)
                run.rng = dict(rng.bit_generator.state)
            rows = run.order[b * cfg.batch_size : (b + 1) * cfg.batch_size]  # the global batch
            global_count = max(supervised_counts(reader, rows), 1)
            mine = rows[dist.rank :: dist.world]
            if mine.size:
                tokens, mask = read_rows(reader, mine)
            else:  # a short last batch: this rank still joins the all-reduce, with nothing to learn
                tokens, mask = map(
                    torch.from_numpy, pad_sequences([np.array([Special.PAD, Special.PAD])], [1])
                )
            for group in optimizer.param_groups:
                group["lr"] = lr_at(cfg, lr, step, total_steps)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
                nll = supervised_nll(wrapped, tokens.to(device), mask.to(device))
            loss = nll * (dist.world / global_count)
            if ewc is not None:
                loss = loss + cfg.ewc_lambda / 2 * ewc_penalty(model, *ewc)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            optimizer.step()

            # one small all-reduce: the global loss, and whether any rank ran out of time
            late = float(time.monotonic() >= deadline)
            shared = dist.all_sum(torch.tensor([float(nll.detach()), late], dtype=torch.float64))
            value = float(shared[0]) / global_count
            out_of_time = bool(shared[1] > 0)
            if not math.isfinite(value):
                raise CalmError(f"training diverged at step {step + 1} (loss {value}); nothing written")
            run.step = step + 1
            run.losses.append(value)
            run.step_tokens.append(global_count)
            run.tokens_seen += int(reader.lengths[rows].astype(np.int64).sum())
            elapsed = time.perf_counter() - t0
            progress.update(
                epoch=epoch + 1, loss=value, tps=run.tokens_seen / max(run.seconds + elapsed, 1e-9)
            )
            if b == per_epoch - 1 or step == total_steps - 1 or out_of_time:
                model.eval()
                val = validation_loss(model, reader, val_rows, cfg.batch_size, dist, device)
                model.train()
                if val is not None:
                    run.val_losses.append((step + 1, val))
            if (
                checkpoint is not None
                and dist.main
                and (run.step % cfg.checkpoint_every == 0 or run.step == total_steps or out_of_time)
            ):
                saved_seconds, run.seconds = run.seconds, run.seconds + time.perf_counter() - t0
                save_checkpoint(checkpoint, key, run, model, optimizer)
                run.seconds = saved_seconds
            if on_step is not None:
                on_step(step + 1, value)
    finally:
        progress.close()
    seconds = run.seconds + time.perf_counter() - t0
    model.eval()

    fisher_flat: npt.NDArray[np.float32] | None = None
    fisher_count = 0
    if cfg.fisher_samples:
        sample = np.random.default_rng([cfg.seed, 2]).permutation(train_rows)[: cfg.fisher_samples]
        fisher_flat, fisher_count = estimate_fisher(model, reader, np.sort(sample), dist, device)
        fisher_flat = combined_fisher(start.fisher, fisher_flat, cfg.ewc_gamma)

    losses, step_tokens = run.losses, run.step_tokens
    last = min(per_epoch, len(losses))
    recent = np.asarray(step_tokens[-last:], dtype=np.float64)
    result = TrainResult(
        output=out,
        steps=len(losses),
        epochs=len(losses) / per_epoch,
        tokens=run.tokens_seen,
        supervised_tokens=int(sum(step_tokens)),
        seconds=seconds,
        train_loss=float(np.dot(losses[-last:], recent) / recent.sum()) if last else math.nan,
        val_loss=run.val_losses[-1][1] if run.val_losses else None,
        val_sequences=int(val_rows.size),
        fisher_sequences=fisher_count,
        ewc_lambda=cfg.ewc_lambda if ewc is not None else 0.0,
        losses=tuple(losses),
        val_losses=tuple(run.val_losses),
    )
    if dist.main:
        ewc_block = (fisher_flat, flatten(model)) if fisher_flat is not None else None
        save_model(out, model, start.metadata, defaults=start.defaults, ewc=ewc_block)  # atomic
        if cfg.plot:
            lrs = [lr_at(cfg, lr, s, total_steps) for s in range(len(result.losses))]
            write_loss_plot(Path(cfg.plot), result.losses, result.val_losses, lrs,
                            title=f"calm train: {out.name}")  # fmt: skip
    dist.finish()
    return result
