"""The default model's recipe: corpus from ../shared/data, training, and the packaged weight file.

    python -m calmd.training.recipe [--data ../shared/data] [--steps 4800] [--output calmd/data/default.cwgt]
    python -m calmd.training.recipe --corpus CORPUS.ctds --epochs N --batch-size B ...   (bench/gpu.py)

1. Corpus (calmd/data/DEFAULT_MODEL.md records the last): every tldr example (CC-BY 4.0, tldr-pages;
   placeholders filled, alternatives resolved, two variants each) and the public histories of
   the *training* users (each command with its preceding five as context, scrubbed of names,
   hosts and addresses, at most three times per distinct command per user). Every example
   carries a COMP frame (and ENV where a history activated one) built by calmd/suggest/frames.py
   from what the earlier commands created or named (calmd/training/corpus.py). One user in five
   (by a hash of the id, `held_out()`) is kept out of the corpus: `calm replay` reports its
   quality on them, users the model has never seen.
2. Training: a new nano model with `calm train`'s loop (calmd/training/train.py), cosine schedule.
   The run saves its state to `<work>/train.ckpt` every 200 steps; `--resume` continues an
   interrupted run from there (the corpus is rebuilt only when missing: it is deterministic) and
   gives the same model as one uninterrupted run of the same steps. `--corpus` trains on a corpus
   this recipe built before (on a machine without the data: the GPU run of bench/gpu.py), its
   counts read from the stamp beside it; `--epochs`, `--batch-size` and `--precision` scale the
   run up there, where the defaults are the packaged model's.
3. The result is written atomically to the package (`calmd/data/default.cwgt`) with a provenance
   note next to it (`calmd/data/DEFAULT_MODEL.md`): the corpus counts, the seed, the time taken.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

from calmd import paths
from calmd.arguments import Parser, number, run_tool, whole
from calmd.atomic import atomic_write, parse_json
from calmd.errors import CalmError, SequenceTooLong
from calmd.formats.ctds import CtdsWriter
from calmd.formats.cwgt import read_cwgt
from calmd.formats.tokenizer import DEFAULT_SHELL_TEMPLATE, MAX_FRAME_ITEMS, Example, build_sequence
from calmd.suggest.context import HISTORY_FRAMES
from calmd.training.corpus import (
    DEFAULT_DATA,
    check_data,
    comp_sources,
    held_out,
    history_examples,
    history_users,
    read_history,
    tldr_examples,
)

PROG = "python -m calmd.training.recipe"


def corpus_examples(
    data: Path,
    *,
    seed: int = 0,
    tldr_variants: int = 2,
    history_frames: int = HISTORY_FRAMES,
    max_dup: int = 3,
) -> Iterator[Example]:
    """tldr examples, then the training users' history examples (each with its `history_frames`
    preceding commands, each distinct command a target at most `max_dup` times), in a seeded
    shuffled order; all with COMP (and ENV where a history
    activates one) built as the daemon builds them."""
    sources = comp_sources(data / "tldr")
    examples: list[Example] = list(
        tldr_examples(data / "tldr", seed=seed, variants=tldr_variants, sources=sources)
    )
    for path in history_users(data):
        if not held_out(path.stem):
            examples.extend(history_examples(read_history(path), context=history_frames, names=[path.stem],
                                             sources=sources, max_dup=max_dup))  # fmt: skip
    random.Random(seed).shuffle(examples)
    yield from examples


def build_corpus(
    data: Path,
    out: Path,
    *,
    seed: int = 0,
    l_max: int = 768,
    history_frames: int = HISTORY_FRAMES,
    max_dup: int = 3,
) -> dict[str, int]:
    """Write the corpus as CTDS; returns counts (sequences, skipped, tokens, and the history users:
    all of them and those trained on), what the provenance note says of it."""
    users = history_users(data)
    counts = {"sequences": 0, "skipped_too_long": 0, "tokens": 0, "users": len(users),
              "trained_users": sum(not held_out(p.stem) for p in users), "history_frames": history_frames,
              "max_dup": max_dup}  # fmt: skip
    with CtdsWriter(out) as writer:
        for ex in corpus_examples(data, seed=seed, history_frames=history_frames, max_dup=max_dup):
            try:
                seq = build_sequence(DEFAULT_SHELL_TEMPLATE, ex.context(), l_max=l_max, training=True)
            except SequenceTooLong:
                counts["skipped_too_long"] += 1
                continue
            writer.add(seq)
            counts["sequences"] += 1
            counts["tokens"] += int(seq.size)
    return counts


def write_corpus(
    data: Path, corpus: Path, *, seed: int = 0, history_frames: int = HISTORY_FRAMES, max_dup: int = 3
) -> dict[str, int]:
    """`build_corpus`, with its counts in the stamp beside it (`corpus` with .json), which
    `--corpus` and `--resume` read instead of building it again."""
    counts = build_corpus(data, corpus, seed=seed, history_frames=history_frames, max_dup=max_dup)
    with atomic_write(corpus.with_suffix(".json")) as f:
        f.write(json.dumps(counts).encode())
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--work", type=Path, default=Path("build/recipe"), help="scratch folder")
    parser.add_argument("--output", type=Path, default=paths.packaged_weights())
    parser.add_argument("--corpus", type=Path,
                        help="train on this corpus, built by the recipe before (its stamp, the same name "
                        "with .json, beside it) instead of building one from --data")  # fmt: skip
    parser.add_argument(
        "--steps",
        type=whole(1, 10**9),
        default=4800,
        help="optimizer steps of --batch-size sequences, at most --epochs epochs (default 4800: the whole "
        "corpus once, 4725 steps, about 22 min on 2 cores)",
    )
    parser.add_argument(
        "--epochs", type=whole(1, 100_000), default=1, help="passes over the corpus (default 1)"
    )
    parser.add_argument(
        "--batch-size", type=whole(1, 65536), default=32, help="sequences per step (default 32)"
    )
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: autocast, for a GPU (calm train --precision; default fp32)")  # fmt: skip
    parser.add_argument(
        "--steps-minutes-cap",
        type=number(0, 10**6),
        default=0.0,
        help="stop earlier if the steps take longer than this many minutes (default 0: never; a cap "
        "makes the model depend on the machine's speed: its state is saved, and --resume finishes it)",
    )
    parser.add_argument("--size", default="nano", choices=("nano", "micro", "mini"))
    parser.add_argument("--history-frames", type=whole(0, MAX_FRAME_ITEMS), default=HISTORY_FRAMES,
                        help=f"past commands in a history example's context (default {HISTORY_FRAMES}; "
                        f"the template keeps {MAX_FRAME_ITEMS} at most)")  # fmt: skip
    parser.add_argument("--max-dup", type=whole(1, 10**6), default=3,
                        help="uses of one distinct command as a target, per user (default 3)")  # fmt: skip
    parser.add_argument("--from", dest="start", type=Path, metavar="MODEL",
                        help="fine-tune these weights (with their EWC block) instead of training a new "
                        "model")  # fmt: skip
    parser.add_argument("--lr", type=number(1e-7, 1.0), default=None,
                        help="peak learning rate of the cosine schedule (default 3e-3, 1e-3 with "
                        "--from)")  # fmt: skip
    parser.add_argument("--val-fraction", type=number(0, 0.5), default=0.01,
                        help="share of the corpus held out for validation (default 0.01)")  # fmt: skip
    parser.add_argument("--seed", type=whole(0, 2**32 - 1), default=0)
    parser.add_argument("--threads", type=whole(1, 1024), default=2)
    parser.add_argument("--resume", action="store_true",
                        help="continue the run interrupted in --work (same options)")  # fmt: skip
    args = parser.parse_args(argv)

    from calmd.training.train import TrainConfig, train

    corpus = args.corpus or args.work / "corpus.ctds"
    stamp = corpus.with_suffix(".json")
    if args.corpus and not (corpus.is_file() and stamp.is_file()):
        raise CalmError(f"--corpus {corpus}: needs the corpus and its stamp {stamp.name} beside it")
    if not (args.corpus or (args.resume and corpus.exists())):
        check_data(args.data)
    if args.start is not None:
        read_cwgt(args.start)  # a bad file named before the corpus is built
    started = time.time()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.corpus or (args.resume and corpus.exists() and stamp.exists()):
        counts = parse_json(stamp.read_bytes(), stamp)  # FormatError (one line) for a broken stamp
        built = (counts.get("history_frames", HISTORY_FRAMES), counts.get("max_dup", 3))  # older stamps
        if built != (args.history_frames, args.max_dup):
            raise CalmError(f"{stamp}: the corpus was built with --history-frames {built[0]} --max-dup "
                            f"{built[1]}: give those, or another --work")  # fmt: skip
        print(f"corpus: reusing {corpus}")
    else:
        counts = write_corpus(args.data, corpus, seed=args.seed, history_frames=args.history_frames,
                              max_dup=args.max_dup)  # fmt: skip
    print(f"corpus: {counts['sequences']:,} sequences, {counts['tokens']:,} tokens "
          f"({counts['skipped_too_long']} too long) in {time.time() - started:.0f} s")  # fmt: skip
    lr = args.lr if args.lr is not None else (1e-3 if args.start is not None else 3e-3)
    cfg = TrainConfig(
        model=str(args.start) if args.start is not None else "new", size=args.size, dataset=str(corpus),
        output=str(args.output), epochs=args.epochs, lr=lr, lr_schedule="cosine", batch_size=args.batch_size,
        seed=args.seed, threads=args.threads,
        val_fraction=args.val_fraction, max_steps=args.steps, max_minutes=args.steps_minutes_cap, force=True,
        checkpoint=str(args.work / "train.ckpt"), resume=args.resume, precision=args.precision,
    )  # fmt: skip
    result = train(cfg)
    elapsed = time.time() - started
    write_provenance(args, counts, result.summary().replace("\n", "; "), elapsed, result.seconds)
    print(f"wrote {args.output} in {elapsed / 60:.1f} min")
    return 0


def write_provenance(
    args: argparse.Namespace, counts: dict[str, int], summary: str, elapsed: float, step_seconds: float
) -> None:
    if "users" in counts:
        n_users, trained_on = counts["users"], counts["trained_users"]
    else:  # a stamp written before it counted them
        users = history_users(args.data)
        n_users, trained_on = len(users), sum(not held_out(p.stem) for p in users)
    command = f"python -m calmd.training.recipe --steps {args.steps} --seed {args.seed} --size {args.size}"
    command += f" --threads {args.threads}"  # the thread count changes the float sums, so the bits
    scaled = {"--epochs": (args.epochs, 1), "--batch-size": (args.batch_size, 32),
              "--precision": (args.precision, "fp32"),
              "--history-frames": (args.history_frames, HISTORY_FRAMES), "--max-dup": (args.max_dup, 3),
              "--lr": (args.lr, None), "--from": (args.start, None),
              "--val-fraction": (args.val_fraction, 0.01)}  # fmt: skip
    command += "".join(f" {flag} {value}" for flag, (value, default) in scaled.items() if value != default)
    if args.steps_minutes_cap:  # where the cap ended the run, the steps it made are in the summary
        command += f" --steps-minutes-cap {args.steps_minutes_cap:g}"
    # A resumed run's wall time covers only its last invocation: the steps' own time is summed
    # across invocations by the training state, so that is the figure to read.
    took = (
        f"finished with --resume; the optimizer steps took {step_seconds / 60:.1f} minutes in all"
        if args.resume
        else f"in {elapsed / 60:.1f} minutes"
    )
    text = f"""# The packaged default model

Built by `{command}`
({took}, on {machine()}).

- Corpus: {counts["sequences"]:,} sequences, {counts["tokens"]:,} tokens.
- tldr-pages examples (https://github.com/tldr-pages/tldr), CC-BY 4.0, (c) the tldr-pages
  contributors; placeholders filled and option alternatives resolved by calmd/training/corpus.py.
- Public shell histories of {trained_on} of the {n_users} users of shared/data/histories
  (their repositories are listed in that folder's manifest.tsv), scrubbed of personal names,
  hosts and addresses. The other {n_users - trained_on} users are held out for `calm replay`.
- Every example carries a COMP frame (completion candidates, calmd/suggest/frames.py) built from
  the files and directories earlier commands created or named (calmd/suggest/reconstruct.py),
  and ENV where a history activated a virtualenv or conda env.

Training: {summary}
"""
    with atomic_write(args.output.parent / "DEFAULT_MODEL.md") as f:  # beside the weights, like them
        f.write(text.encode())


def machine() -> str:
    """What the steps ran on, for the note: the GPU train() picks when there is one."""
    import torch

    if torch.cuda.is_available():
        return f"one {torch.cuda.get_device_name(0)} GPU"
    return f"a {os.cpu_count()}-core CPU"


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
