"""`calm train` and `calm evaluate`: their flags (one per TrainConfig field) and handlers.

calmd/cli/model.py registers them; the `calm` CLI builds its parser on every run, so this module
imports nothing heavy: torch and the training code are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from calmd import paths
from calmd.arguments import number, whole

# Flags of `calm train`, one per TrainConfig field (checked by a test): field -> (flags, kwargs).
TRAIN_FLAGS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "model": (("-m", "--model"), {"metavar": "new|PATH",
              "help": "'new' (random weights) or a model to fine-tune (default: your weights)"}),
    "size": (("--size",), {"choices": ["nano", "micro", "mini"], "help": "size of a new model (nano)"}),
    "dataset": (("-d", "--dataset"), {"metavar": "DATASET", "help": "CTDS file (yours)"}),
    "output": (("-o", "--output"), {"metavar": "OUT",
               "help": "where to write the model (default: the input model, in place)"}),
    "epochs": (("--epochs",), {"type": whole(1, 100_000), "help": "passes over the training set (3)"}),
    "lr": (("--lr",), {"type": number(0, 10, above=True),
           "help": "learning rate (1e-3 untrained, 1e-4 fine-tuning)"}),
    "lr_schedule": (("--lr-schedule",), {"choices": ["constant", "cosine"],
                    "help": "constant, or cosine with a 2%% warm-up (constant)"}),
    "optimizer": (("--optimizer",), {"choices": ["adam", "adamw", "sgd"], "help": "adamw"}),
    "weight_decay": (("--weight-decay",), {"type": number(0, 10), "help": "on weight matrices (0.01)"}),
    "batch_size": (("--batch-size",), {"type": whole(1, 65536),
                   "help": "sequences per step, all ranks (16)"}),
    "seed": (("--seed",), {"type": whole(0, 2**32 - 1), "help": "initialisation, split, shuffling (0)"}),
    "grad_clip": (("--grad-clip",), {"type": number(0, 10**6), "help": "max gradient norm, 0 = off (1.0)"}),
    "val_fraction": (("--val-fraction",), {"type": number(0, 0.99), "help": "held-out share (0.05)"}),
    "threads": (("--threads",), {"type": whole(0, 1024), "help": "torch threads, 0 = default"}),
    "ewc_lambda": (("--ewc-lambda",), {"type": number(0, 10**9),
                   "help": "EWC strength against the input model's Fisher, 0 = off (100)"}),
    "ewc_gamma": (("--ewc-gamma",), {"type": number(0, 1),
                  "help": "weight of the input model's Fisher in the stored one (0.5)"}),
    "fisher_samples": (("--fisher-samples",), {"type": whole(0, 1_000_000),
                       "help": "sequences for the Fisher estimate, 0 = store none (128)"}),
    "max_steps": (("--max-steps",), {"type": whole(0, 10**9),
                  "help": "stop after N optimizer steps, 0 = all epochs"}),
    "max_minutes": (("--max-minutes",), {"type": number(0, 10**6), "help": "wall-clock budget, 0 = none"}),
    "plot": (("--plot",), {"metavar": "FILE", "help": "draw the loss curve (training, held-out, "
             "learning rate) as a PNG, or an SVG for FILE.svg; needs pip install 'calmd[plot]'"}),
    "checkpoint": (("--checkpoint",), {"metavar": "PATH", "help": "save the run's state here every "
                   "--checkpoint-every steps and when --max-minutes ends it (for --resume)"}),
    "checkpoint_every": (("--checkpoint-every",), {"type": whole(1, 10**9),
                         "help": "steps between checkpoints (200)"}),
    "resume": (("--resume",), {"action": "store_true", "default": None,
               "help": "continue the run saved in --checkpoint (same settings): the same model as "
               "one uninterrupted run"}),
    "device": (("--device",), {"choices": ["auto", "cpu", "cuda"], "help": "auto"}),
    "precision": (("--precision",), {"choices": ["fp32", "bf16"], "help": "fp32, or bf16 autocast "
                  "(matrix products in bfloat16; weights, scan and loss in float32)"}),
    "force": (("--force",), {"action": "store_true", "default": None,
              "help": "let --model new replace an existing output file"}),
    "quiet": (("-q", "--quiet"), {"action": "store_true", "default": None, "help": "no output"}),
}  # fmt: skip


def cmd_train(args: argparse.Namespace) -> int:
    from calmd.training.train import TrainConfig, train

    given = {name: getattr(args, name) for name in TRAIN_FLAGS if getattr(args, name) is not None}
    cfg = TrainConfig(**given)
    result = train(cfg)
    if not cfg.quiet and os.environ.get("RANK", "0") == "0":
        print(result.summary())
        if cfg.plot:
            print(f"loss curve: {cfg.plot}")
        print(f"wrote {result.output}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # A torchrun rank leaves without the interpreter's teardown: gloo's threads outlive
        # destroy_process_group() and, finalised with the interpreter, abort the process now
        # and then ("terminate called without an active exception", 1 run in 6-12 here), which
        # torchrun reports as a failed run. The weights are written (atomically) and flushed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from calmd.errors import CalmError
    from calmd.training.evaluate import evaluate_files, format_result

    if args.limit < 0:
        raise CalmError("--limit must be >= 0")
    if args.batch_size < 1:
        raise CalmError("--batch-size must be >= 1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model = args.model or paths.serving_weights()  # yours, else the packaged model (as `calm generate`)
    dataset = args.dataset or paths.dataset_path()
    result, total = evaluate_files(
        model, dataset, limit=args.limit, seed=args.seed, raw=args.raw, batch_size=args.batch_size
    )
    if args.json:
        json.dump({"model": str(model), "dataset": str(dataset), "dataset_sequences": total,
                   **result.to_dict()}, sys.stdout, indent=2)  # fmt: skip
        print()
    else:
        print(format_result(result, model=model, dataset=dataset, total=total))
    return 0
