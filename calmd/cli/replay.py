"""`calm replay`: shell histories replayed, suggestions scored against the peers (calmd/quality/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from calmd import paths
from calmd.arguments import Parser, whole
from calmd.cli.common import probability
from calmd.errors import CalmError
from calmd.suggest.context import HISTORY_FRAMES, MAX_HISTORY_FRAMES
from calmd.visible import visible


def cmd_replay(args: argparse.Namespace) -> int:
    from calmd.history.formats import check_history_file
    from calmd.quality import replay, report

    files = replay.expand(args.files)
    for file in files:
        check_history_file(file)  # a missing file, a folder, binary data: one line, before any work
    if args.held_out:
        from calmd.training.corpus import held_out

        files = [f for f in files if held_out(f.stem)]
    if not files:
        raise CalmError("no history files to replay")
    models = [Path(m) for m in args.model or []]
    from calmd.formats.cwgt import read_cwgt

    for m in models:
        if not m.is_file():
            raise CalmError(f"-m {m}: no such weight file")
        read_cwgt(m)  # a file that is no CWGT: said now, not after the warm-up
    if args.reranker:
        from calmd.suggest.rerank import Reranker

        Reranker.load(Path(args.reranker))  # a file that is no reranker: said now, not after the warm-up
    if len(models) > 1 and args.with_training:
        raise CalmError("--with-training replays one model at a time")
    if args.search:
        return replay_search(files, args)
    model = models[0] if models else paths.serving_weights()
    from calmd.suggest.engine import RankWeights

    weights = RankWeights.overrides(args.weights or [])
    cfg = replay.ReplayConfig(model=model, positions=args.positions, warmup=args.warmup, seed=args.seed,
                              typing_positions=args.typing, weights=weights,
                              train_every=args.train_every if args.with_training else 0,
                              comp=args.comp, min_confidence=args.min_confidence,
                              models=replay.model_names(models) if len(models) > 1 else {},
                              ranker=args.ranker, refit=args.refit, jobs=args.jobs,
                              first=args.first, history_frames=args.history_frames,
                              reranker=Path(args.reranker) if args.reranker else None)  # fmt: skip
    result = replay.replay(files, cfg, progress=not args.quiet)
    print(report.format_table(result))
    if args.json:
        report.write_json(result, Path(args.json))
        print(f"wrote {visible(args.json)}")
    return 0


def replay_search(files: list[Path], args: argparse.Namespace) -> int:
    """`calm replay --search`: the history search's ranking against recency and frequency."""
    from calmd.quality import replay, report, search_replay

    cfg = replay.ReplayConfig(model=Path(), positions=args.positions, warmup=args.warmup, seed=args.seed)
    result = search_replay.replay_search(files, cfg, progress=not args.quiet)
    print(search_replay.format_search_table(result))
    if args.json:
        report.write_json(result, Path(args.json))
        print(f"wrote {visible(args.json)}")
    return 0


def add_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """replay"""
    p = sub.add_parser("replay", help="replay shell histories and score suggestions against baselines")
    p.add_argument("files", nargs="+", metavar="HISTORY", help="bash/zsh history files, or folders of *.txt")
    p.add_argument("-m", "--model", metavar="FILE.cwgt", action="append",
                   help="weights (default: yours, else the packaged); several -m compare the models in one "
                   "run, each answering every query, with its latency")  # fmt: skip
    p.add_argument(
        "--positions", type=whole(1, 100_000), default=40, help="sampled positions per user (default 40)"
    )
    p.add_argument(
        "--typing", type=whole(0, 100_000), default=15, help="positions typed out for keystrokes saved"
    )
    p.add_argument(
        "--warmup", type=whole(0, 10**6), default=50, help="commands replayed before sampling starts"
    )
    p.add_argument(
        "--seed", type=whole(0, 2**32 - 1), default=0, help="the positions' sampling seed (default 0)"
    )
    p.add_argument("--first", type=whole(0, 10**6), default=0, metavar="N",
                   help="a new user's experience: only each user's first N commands, from an empty history "
                   "(no warm-up; the positions are sampled among them)")  # fmt: skip
    p.add_argument("--held-out", action="store_true", help="only the users the default model never saw")
    p.add_argument(
        "--with-training",
        action="store_true",
        help="let background training happen during the replay, as in real use",
    )
    p.add_argument(
        "--train-every",
        type=whole(1, 10**6),
        default=500,
        metavar="N",
        help="with --with-training: a training run after every N commands (default 500)",
    )
    p.add_argument(
        "--weight",
        dest="weights",
        action="append",
        metavar="NAME=VALUE",
        help="override a ranking weight (calmd.suggest.engine.RankWeights), to measure an idea",
    )
    p.add_argument(
        "--comp",
        action="store_true",
        help="also replay calmd+comp: COMP/ENV from the files the earlier commands created or named",
    )
    p.add_argument("--min-confidence", type=probability, metavar="P",
                   help="draw a ghost at this confidence or more, in place of the fitted ghost rule "
                   "(as the shells' CALM_MIN_CONFIDENCE)")  # fmt: skip
    p.add_argument("--ranker", choices=("mixture", "history", "model"), default="mixture",
                   help="which predictors rank: the daemon's mixture (default), or one of its parts alone "
                   "(history: the history ranker, no model; model: the model's beams, no history "
                   "proposals)")  # fmt: skip
    p.add_argument("--reranker", metavar="FILE.json",
                   help="order the answers with this reranker (python -m calmd.quality.fit_reranker --output "
                   "FILE.json), to measure it; default: the packaged one, when there is one")  # fmt: skip
    p.add_argument("--history-frames", type=whole(0, MAX_HISTORY_FRAMES), default=HISTORY_FRAMES, metavar="N",
                   help=f"past commands in the model's context (default {HISTORY_FRAMES}, the daemon's; the "
                   f"template keeps {MAX_HISTORY_FRAMES} at most)")  # fmt: skip
    p.add_argument("--refit", choices=("model", "ranker", "both"), default="model",
                   help="with --with-training: what a run refits: the model (the background fine-tuning, "
                   "default), the history ranker on the user's commands (seconds), or both")  # fmt: skip
    p.add_argument("--jobs", type=whole(1, 64), default=1, metavar="N",
                   help="replay N users at once, each in a process of its own (default 1)")  # fmt: skip
    p.add_argument("--search", action="store_true",
                   help="replay history searches instead (Ctrl-R: the first word or a fragment of a "
                   "command run before) and rank the right line: calmd, recency, frequency")  # fmt: skip
    p.add_argument("--json", metavar="OUT", help="write the full result as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no line per user while it runs")
    p.set_defaults(func=cmd_replay)
