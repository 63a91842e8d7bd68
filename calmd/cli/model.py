"""`calm init`, `calm train`, `calm evaluate`, `calm generate` and `calm rollback`: the model's weights."""

from __future__ import annotations

import argparse
from pathlib import Path

from calmd import paths
from calmd.arguments import Parser, number, whole
from calmd.cli.daemon import cmd_train_now
from calmd.errors import CalmError
from calmd.training import (
    commands as training_commands,  # imports nothing heavy (torch is imported by the handlers)
)


def cmd_init(args: argparse.Namespace) -> int:
    from calmd.formats.cwgt import Metadata
    from calmd.model.checkpoint import GenerationDefaults, save_model
    from calmd.model.mamba import SIZES, CalmModel

    if not args.output:
        raise CalmError(
            "calm init writes random weights: give the new file with -o FILE (the weights the daemon "
            f"serves, {paths.weights_path()}, are replaced only by -o that path --force)"
        )
    out = Path(args.output)
    if out.is_dir():
        raise CalmError(f"-o {out}: a folder; give the weight file to write, e.g. {out / 'my.cwgt'}")
    if out.exists() and not args.force:
        raise CalmError(f"{out} exists; pass --force to replace it (its weights would be lost)")
    cfg = SIZES[args.size]
    model = CalmModel(cfg)
    model.init_weights(args.seed)
    kept = out.name == paths.WEIGHTS and out.is_file()
    save_model(out, model, Metadata(), defaults=GenerationDefaults())
    print(f"wrote {out}: {args.size}, {cfg.param_count():,} parameters, {out.stat().st_size:,} bytes")
    if kept:
        prev = paths.prev_weights_path(out)
        print(f"the weights it replaced are in {prev}: `calm rollback` brings them back")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from calmd.model.checkpoint import load_model
    from calmd.model.generate import Generator, SamplingOptions
    from calmd.visible import visible

    model_path = Path(args.model) if args.model else paths.serving_weights()
    loaded = load_model(model_path)
    gen = Generator(loaded, trace=False)
    ctx: dict[str, object] = {"input": args.input}
    if args.cwd:
        ctx["cwd"] = args.cwd
    if args.git:
        ctx["git"] = args.git
    if args.env:
        ctx["env"] = args.env
    if args.history:
        ctx["history"] = [{"cmd": c, "exit": 0} for c in args.history]
    if args.sample:
        opts = SamplingOptions(args.temperature, args.top_k, args.top_p, args.min_p, args.max_tokens)
        cands = gen.sample(ctx, args.n, options=opts, seed=args.seed, raw=args.raw)
        cands.sort(key=lambda c: c.logprob, reverse=True)
    else:
        cands = list(gen.candidates(ctx, args.n, max_tokens=args.max_tokens, raw=args.raw))
    for cand in cands:  # what a model writes may hold any byte: printed escaped (calmd/visible.py)
        print(f"{cand.logprob:8.3f}  {visible(cand.text)}" if args.scores else visible(cand.text))
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from calmd.training.background import rollback

    weights = Path(args.weights) if args.weights else paths.weights_path()
    for done in rollback(weights):
        print(done)
    print("the daemon reloads them; `calm rollback` again undoes this")
    return 0


def cmd_calm_train(args: argparse.Namespace) -> int:
    """`calm train`: a model on a dataset; with --now, the daemon's background run (`calmd train`)."""
    if not args.now:
        return int(training_commands.cmd_train(args))
    given = [name for name in training_commands.TRAIN_FLAGS if getattr(args, name) is not None]
    if given:
        flags = ", ".join(training_commands.TRAIN_FLAGS[name][0][0] for name in given)
        raise CalmError(f"--now asks the daemon for its background run, which takes no {flags}: drop them")
    return cmd_train_now(args)


def add_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """init, train, evaluate, generate, rollback"""
    p = sub.add_parser(
        "init", help="write a randomly initialised model (CWGT v5, shell metadata)",
        usage="%(prog)s [-h] -o PATH [--size {nano,micro,mini}] [--seed SEED] [--force]",
        description="Write a new model with random weights to PATH, for `calm train` to train. It "
        f"never writes the weights the daemon serves ({paths.WEIGHTS}) unless -o names them and "
        "--force is given; those it replaces are kept for `calm rollback`.",
    )  # fmt: skip
    p.add_argument("--size", choices=["nano", "micro", "mini"], default="nano",
                   help="nano (0.5M parameters, the keystroke's), micro or mini (default nano)")  # fmt: skip
    # required, but checked by cmd_init, which says why in one line (not argparse's usage error)
    p.add_argument("-o", "--output", metavar="PATH", help="the new weight file (required)")
    p.add_argument("--seed", type=whole(0, 2**32 - 1), default=0, help="random seed (default 0)")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser(
        "train",
        help="train or fine-tune a model on a CTDS dataset (also under torchrun)",
        description="Train on the command part of each sequence (tokens after ATN). Runs unchanged "
        "under `torchrun --nproc_per_node N`; --batch-size is then the global batch.",
    )
    for flags, kwargs in training_commands.TRAIN_FLAGS.values():  # one per TrainConfig field
        p.add_argument(*flags, **{"default": None, **kwargs})
    p.add_argument("--now", action="store_true",
                   help="ask the running daemon for a background run on your history now and follow it "
                   "(as `calmd train`)")  # fmt: skip
    p.set_defaults(func=cmd_calm_train)

    p = sub.add_parser("evaluate", help="loss, bits per byte and greedy exact-match accuracy on a dataset")
    p.add_argument(
        "-m", "--model", type=Path, metavar="MODEL", help="weights (default: yours, else the packaged model)"
    )
    p.add_argument(
        "-d", "--dataset", type=Path, metavar="DATASET", help=f"CTDS file ({paths.dataset_path()})"
    )
    p.add_argument(
        "--limit", "-n", type=whole(0, 10**9), default=0, metavar="N", help="a random sample of N sequences"
    )
    p.add_argument("--seed", type=whole(0, 2**32 - 1), default=0, help="for the --limit sample (default 0)")
    p.add_argument("--raw", action="store_true", help="match whole commands, ignoring the stop conditions")
    p.add_argument(
        "--batch-size", type=whole(1, 4096), default=32, help="sequences per forward pass (default 32)"
    )
    p.add_argument("--threads", type=whole(0, 1024), default=0, help="torch threads, 0 = default")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=training_commands.cmd_evaluate)

    p = sub.add_parser("generate", help="print completions of a context, best first")
    p.add_argument("-m", "--model", metavar="FILE.cwgt", help="weights (default: yours, else the packaged)")
    p.add_argument("--input", "-i", default="", help="what the user typed so far")
    p.add_argument("--cwd", help="the shell's folder")
    p.add_argument("--git", help="git branch")
    p.add_argument("--env", help="environment note (e.g. venv:proj)")
    p.add_argument("--history", nargs="*", metavar="CMD", help="previous commands, oldest first")
    p.add_argument("-n", type=whole(1, 32), default=5, help="candidates, 1 to 32 (default 5)")
    p.add_argument("--raw", action="store_true", help="ignore the stop conditions (EOS only)")
    p.add_argument("--sample", action="store_true", help="sample instead of beam search")
    p.add_argument("--temperature", type=number(0, 100), help="sampling temperature (default: the header's)")
    p.add_argument(
        "--top-k",
        type=whole(0, 320),
        help="with --sample: the K likeliest bytes only (default: the header's)",
    )
    p.add_argument(
        "--top-p", type=number(0, 1), help="with --sample: nucleus sampling (default: the header's)"
    )
    p.add_argument(
        "--min-p", type=number(0, 1), help="with --sample: drop bytes under P times the likeliest's"
    )
    p.add_argument(
        "--max-tokens", type=whole(1, 768), help="the longest completion, in tokens (default: the header's)"
    )
    p.add_argument("--seed", type=whole(0, 2**32 - 1), help="sampling seed")
    p.add_argument("--scores", action="store_true", help="print each candidate's log-probability")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("rollback", help="restore the weights and ranker a background training run replaced")
    p.add_argument(
        "--weights", metavar="FILE.cwgt",
        help=f"the weights to roll back, and the ranker beside them (default {paths.weights_path()})",
    )  # fmt: skip
    p.set_defaults(func=cmd_rollback)
