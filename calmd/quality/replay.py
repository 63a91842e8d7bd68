"""`calm replay`: replay shell histories through the daemon's pipeline and score the suggestions.

For each history file (one user), in order: a fresh history store; every command is recorded
after it has been predicted, so a prediction only sees the past. At sampled positions (after a
warm-up) the next command is asked for given its first k characters (k = 0, 1, 2, 4, 8; k = 0
means "predict the next command" on an empty prompt, k only when the command is longer than k):
top-1 and top-5 exact matches of the whole command line, and the share of queries whose command
line had been run before (`seen_before`, the most a pure history lookup can score). Keystrokes
saved: the simulated users of calmd/quality/typist.py type some of the sampled commands out,
with the same policy for every system (whole lines, word by word, and with only the ghosts a
shell draws). Every state a user visits is a prefix of the command, and the replay asks the
engine once per prefix (cached per command typed out).

The replay is four modules: this one samples the positions and drives the systems over each
history; calmd/quality/systems.py holds the systems compared, calmd/quality/typist.py the typing
simulation, calmd/quality/tally.py what is counted and calmd/quality/report.py what is printed
(calmd/quality/search_replay.py is `--search`).

The candidates come from the same code the daemon runs: the context is built as the server builds
it (the store's latest commands of the session), ranked by `ModelEngine.complete` with its history
proposals; the baselines (zsh-autosuggestions' `history` and `match_prev_cmd`, a fish-like most
frequent match) answer the same queries from the same past. With training (`--with-training`),
every `--train-every` replayed commands the background run of calmd/training/background.py fine-
tunes the user's weights on the store so far and swaps them in when not worse, as the daemon does
(this costs about half a minute per run on one core); `--refit ranker` refits the history ranker
on the user's commands so far instead (calmd/training/ranker_refit.py, seconds), `--refit both`
does both. With training, `calmd:packaged` (the model and ranker as packaged, never trained)
answers the same queries on the same store, and the figures are kept per stretch of commands
between two runs: the learning curve (calmd/quality/report.py `format_curve`). Histories carry no
timestamps: command i is replayed at `ts = start + 60 i` (one command a minute), which is what the
recency signal sees.

`--ranker history|model` replays one part of the mixture alone (calmd.suggest.engine.PARTS: the
history ranker without the model, the model without the history's proposals), for the ablation
of docs/quality.md. `--jobs N` replays N users at once, each in a spawned process (the figures
are the same as one after the other).

With `--comp`, a second calmd system, `calmd+comp`, answers the same queries with the COMP and ENV
frames filled as the daemon fills them (calmd/suggest/frames.py), from a reconstruction of the
user's disk (calmd/suggest/reconstruct.py: the files and folders the earlier commands created or
named, never those of the command being predicted) and, for the first word, the packaged
vocabulary's commands in place of the shell's PATH. What the reconstruction cannot know is in its
docstring and in docs/quality.md; the disk check (demoting missing paths) is not replayed, as the
reconstruction cannot tell a missing file from one no command named.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.quality.anchor import ANCHOR_SYSTEM, Anchor, packaged_anchor
from calmd.quality.systems import (
    BASELINES,
    COMP_SYSTEM,
    PACKAGED_SYSTEM,
    SESSION,
    Ours,
    PastOnly,
    Rows,
    comp_frames,
    stand_in_path,
)
from calmd.quality.tally import KS, Tally
from calmd.quality.typist import Request, Suggest, keys_whole_line, keys_with_ghosts, keys_word_by_word
from calmd.suggest.context import HISTORY_FRAMES
from calmd.suggest.reconstruct import Reconstruction
from calmd.training.corpus import read_history

REFITS = ("model", "ranker", "both")  # what a training run of the replay refits (`--refit`)


@dataclass
class ReplayConfig:
    model: Path
    positions: int = 40  # sampled prediction positions per user
    warmup: int = 50  # commands replayed before the first sampled position
    seed: int = 0
    typing_positions: int = 15  # of the sampled positions, how many are typed out for keystrokes
    weights: dict[str, float] = field(default_factory=dict)  # RankWeights overrides, to measure ideas
    train_every: int = 0  # with training: a background run after every N replayed commands (0: never)
    min_confidence: float | None = None  # one threshold in place of the ghost rule's (CALM_MIN_CONFIDENCE)
    models: dict[str, Path] = field(default_factory=dict)  # several models: system name -> weights
    comp: bool = False  # also replay each model with COMP and ENV from the reconstructed disk
    ranker: str = "mixture"  # which predictors rank (calmd.suggest.engine.PARTS): the ablations
    refit: str = "model"  # what a training run refits (REFITS): the model, the history ranker, both
    jobs: int = 1  # users replayed at once, each in a process of its own
    first: int = 0  # only each user's first N commands, from an empty history (no warm-up): a new user
    anchor: bool = True  # replay the anchor (calmd/quality/anchor.py): off where only calmd is wanted
    reranker: Path | None = None  # a reranker file (calmd/suggest/rerank.py) in place of the packaged one
    history_frames: int = (
        HISTORY_FRAMES  # past commands in the model's context (calm replay --history-frames)
    )

    def systems(self) -> dict[str, Path]:
        """The calmd systems replayed: "calmd" for the one model, else one per model."""
        return dict(self.models) if self.models else {"calmd": self.model}

    def comp_systems(self) -> dict[str, str]:
        """With `comp`: each calmd system's twin that sees COMP (`calmd+comp`, `calmd:<name>+comp`)
        -> the system whose engine it shares."""
        if not self.comp:
            return {}
        return {(COMP_SYSTEM if s == "calmd" else f"{s}+comp"): s for s in self.systems()}

    def all_systems(self) -> list[str]:
        packaged = [PACKAGED_SYSTEM] if self.train_every else []
        anchor = [ANCHOR_SYSTEM] if self.anchor_ranker() is not None else []
        return [*self.systems(), *packaged, *self.comp_systems(), *anchor, *BASELINES]

    def anchor_ranker(self) -> Anchor | None:
        """The anchor replayed beside calmd (`anchor`, when the package has one fitted)."""
        return packaged_anchor() if self.anchor else None


def replay_user(
    path: Path, cfg: ReplayConfig, engine_factory: Any, rows: Rows | None = None,
    states: list[dict[str, Any]] | None = None,
) -> dict[str, Tally]:  # fmt: skip
    """Replay one user's history; with `rows`, also collect the engine's suggestions and early
    proposals with their calibration features; with `states`, every prefix of each typed-out
    command as the first calmd system answers it (`Ours.states`). With several models
    (`cfg.models`), each answers every query in turn, on the same store (its own engine and
    caches). With training, `PACKAGED_SYSTEM` (the model and ranker as packaged, never trained)
    answers the same queries, and each tally's `curve` holds the stretches between runs."""
    commands = read_history(path)
    warmup = cfg.warmup
    if cfg.first:  # a new user: the replay starts from an empty history
        commands, warmup = commands[: cfg.first], 0
    models = cfg.systems()
    systems = cfg.all_systems()
    stretches: list[dict[str, Tally]] = [{s: Tally() for s in systems}]
    if len(commands) <= warmup:
        return stretches[0]
    rng = random.Random(f"{cfg.seed}:{path.stem}")
    candidates_pos = list(range(warmup, len(commands)))
    sampled = sorted(rng.sample(candidates_pos, min(cfg.positions, len(candidates_pos))))
    typed_out = set(rng.sample(sampled, min(cfg.typing_positions, len(sampled))))
    with tempfile.TemporaryDirectory(prefix="calm-replay-") as tmp:
        store = HistoryStore(paths.history_path(Path(tmp)))
        ours: dict[str, Ours] = {}
        weights = paths.weights_path(Path(tmp))
        tallies = stretches[0]
        engines = dict(models)
        if cfg.train_every:  # its own copy: the learner's runs replace `weights`
            engines[PACKAGED_SYSTEM] = next(iter(models.values()))
        for n, (system, model) in enumerate(engines.items()):
            copy = weights if n == 0 else Path(tmp) / f"model{n}.cwgt"
            shutil.copyfile(model, copy)
            engine = engine_factory(copy)
            engine.attach_history(store)
            ours[system] = Ours(system, engine, store, tallies[system], rows if n == 0 else None,
                                cfg.min_confidence, history_frames=cfg.history_frames)  # fmt: skip
        disk = Reconstruction() if cfg.comp else None
        if disk is not None:
            path_commands = stand_in_path()
            for twin, system in cfg.comp_systems().items():
                engine = ours[system].engine

                def frames(prefix: str, engine: Any = engine, disk: Reconstruction = disk) -> dict[str, Any]:
                    return comp_frames(prefix, disk, path_commands, engine)

                ours[twin] = Ours(twin, engine, store, tallies[twin], None, cfg.min_confidence, frames,
                                  history_frames=cfg.history_frames)  # fmt: skip
        learner = next(iter(models))  # with training there is one model: the calmd that learns
        examples = None
        if cfg.train_every and cfg.refit in ("ranker", "both"):
            from calmd.training.ranker_refit import RankerExamples, refit_ranker

            base_ranker = ours[learner].engine.ranker
            examples = RankerExamples(base_ranker)
        past = PastOnly(cfg.anchor_ranker())
        start_ts = time.time() - 60 * len(commands)
        sampled_set = set(sampled)
        for i, cmd in enumerate(commands):
            if i in sampled_set:
                seen_before = cmd in past.counts
                for k in KS:
                    if k > 0 and len(cmd) <= k:
                        continue
                    prefix = cmd[:k]
                    answers: dict[str, list[str]] = {}
                    for system, one in ours.items():
                        got = one.timed(prefix, 5, cmd)
                        answers[system] = [text for text, _, _ in got.candidates]
                        first = got.candidates[0] if got.candidates else ("", 0.0, False)
                        tallies[system].tops[k].append((first[1], first[0] == cmd, first[2]))
                    for system in past.systems:
                        answers[system] = past.suggest(system, prefix)
                    for system, texts in answers.items():
                        t = tallies[system]
                        t.queries[k] += 1
                        t.seen[k] += seen_before
                        t.top1[k] += bool(texts) and texts[0] == cmd
                        t.top5[k] += cmd in texts[:5]
                if i in typed_out:
                    if states is not None:
                        collector = next(iter(ours.values()))
                        collector.cache.clear()
                        states.append({"user": path.stem, **collector.states(cmd)})
                    for system, one in ours.items():
                        one.cache.clear()  # the store is the same while one command is typed out
                        one.target = cmd
                        type_out(tallies[system], cmd, one.accepted, one.drawn)
                    for system in past.systems:
                        type_out(tallies[system], cmd, past.top1(system))
            store.record(cmd, exit=0, session=SESSION, ts=start_ts + 60 * i)  # no exit codes in the files
            past.add(cmd)
            if examples is not None:
                examples.add(cmd, SESSION)
            if disk is not None:
                disk.add(cmd)
            if cfg.train_every and (i + 1) % cfg.train_every == 0 and sampled and i < sampled[-1]:
                # what the daemon does in real use: fine-tune on the history so far, swap if not worse
                learning = engine = ours[learner].engine
                if cfg.refit in ("model", "both"):
                    from calmd.training.background import RunOptions, run

                    # the model alone: the ranker's refit is the replay's own (`--refit ranker`)
                    result = run(RunOptions(Path(tmp), weights, threads=1, max_minutes=5, refit_ranker=False))
                    if result.get("swapped"):
                        engine = engine_factory(weights)
                        engine.attach_history(store)
                        tallies[learner].swaps += 1
                if examples is not None:  # the history ranker refitted on the user's commands so far
                    engine.ranker = refit_ranker(examples.examples, base_ranker)
                for one in ours.values():  # the learner and its COMP twin
                    if one.engine is learning:
                        one.engine = engine
                tallies[learner].runs += 1
                tallies = {s: Tally() for s in systems}  # the next stretch of the learning curve
                stretches.append(tallies)
                for system, one in ours.items():
                    one.tally = tallies[system]
        store.close()
    totals = {s: Tally() for s in systems}
    for stretch in stretches:
        for system, t in stretch.items():
            totals[system].add(t)
    if cfg.train_every:
        for system in systems:
            totals[system].curve = [stretch[system] for stretch in stretches]
    return totals


def type_out(tally: Tally, cmd: str, suggest: Suggest, drawn: Request | None = None) -> None:
    """The simulated users type `cmd` out with `suggest`'s top suggestions, and again with only
    the ghosts a shell draws: `drawn` answers a request as calmd's zsh client sends them
    (`keys_with_ghosts`); without it the system draws its top suggestion at every key (the
    baselines)."""
    if not cmd:
        return
    tally.typed += 1
    tally.chars += len(cmd)
    keys = keys_whole_line(cmd, suggest)
    tally.keys_lines += keys
    tally.saved += 1 - keys / len(cmd)
    if drawn is None:  # the baselines draw their top suggestion at every state: one user
        words = words_drawn = keys_with_ghosts(cmd, lambda typed, _shown: suggest(typed), True, tally.screen)
        keys_drawn = keys
    else:
        words = keys_word_by_word(cmd, suggest)
        keys_drawn = keys_with_ghosts(cmd, drawn, False)
        words_drawn = keys_with_ghosts(cmd, drawn, True, tally.screen)
    tally.keys_words += words
    tally.keys_lines_drawn += keys_drawn
    tally.saved_drawn += 1 - keys_drawn / len(cmd)
    tally.keys_words_drawn += words_drawn


def collect_rows(files: Sequence[Path], cfg: ReplayConfig, calibrator: Any) -> Rows:
    """Calibration rows from replaying `files` (calmd/suggest/calibration.py fits on them)."""
    from calmd.suggest.engine import ModelEngine, RankWeights

    rows = Rows()
    started = time.monotonic()
    for n, path in enumerate(files, 1):
        replay_user(
            path, cfg, lambda w: ModelEngine(w, RankWeights(**cfg.weights), calibrator=calibrator), rows
        )
        elapsed = time.monotonic() - started
        print(f"[{n}/{len(files)}] {path.stem}: {len(rows.candidate)} rows, {elapsed:.0f} s", flush=True)
    return rows


def replay_file(path: Path, cfg: ReplayConfig) -> dict[str, Tally]:
    """One user replayed with the daemon's engine (`cfg.ranker`'s parts, `cfg.weights`): what a
    worker of `replay` runs, in this process or another."""
    from calmd.suggest.calibration import packaged_calibration_path, packaged_calibrator, uncalibrated
    from calmd.suggest.engine import ModelEngine, RankWeights
    from calmd.suggest.rerank import Reranker

    # a checkout that has not fitted its calibration yet still replays (every confidence 0.5)
    calibrator = packaged_calibrator() if packaged_calibration_path().exists() else uncalibrated()
    weights = RankWeights(**cfg.weights)
    reranker = Reranker.load(cfg.reranker) if cfg.reranker is not None else True
    return replay_user(
        path,
        cfg,
        lambda w: ModelEngine(w, weights, calibrator=calibrator, parts=cfg.ranker, reranker=reranker),
    )


def replayed(files: Sequence[Path], cfg: ReplayConfig) -> Iterator[tuple[Path, dict[str, Tally]]]:
    """Each user's tallies as they come: one after the other, or with `cfg.jobs` > 1 that many
    users at once, each in a process of its own (spawned: a forked torch can deadlock), in the
    order they finish."""
    if cfg.jobs <= 1 or len(files) <= 1:
        for path in files:
            yield path, replay_file(path, cfg)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(cfg.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        running = {pool.submit(replay_file, path, cfg): path for path in files}
        for done in as_completed(running):
            yield running[done], done.result()


def replay(files: Sequence[Path], cfg: ReplayConfig, *, progress: bool = True) -> dict[str, Any]:
    systems = cfg.all_systems()
    per_user_tallies: dict[Path, dict[str, Tally]] = {}
    started = time.monotonic()
    for n, (path, tallies) in enumerate(replayed(files, cfg), 1):
        per_user_tallies[path] = tallies
        if progress:
            top1 = tallies[systems[0]].to_json()["top1"]
            user = " ".join(f"k{k}={v:.2f}" for k, v in top1.items() if v is not None)
            print(f"[{n}/{len(files)}] {path.stem}: {time.monotonic() - started:.0f} s, {systems[0]} top-1 "
                  f"{user}", flush=True)  # fmt: skip
    totals = {s: Tally() for s in systems}
    per_user: dict[str, Any] = {}
    for path in files:  # in the files' order, whichever finished first
        tallies = per_user_tallies[path]
        per_user[path.stem] = {s: t.to_json() for s, t in tallies.items()}
        for s, t in tallies.items():
            totals[s].add(t)
    return {
        "model": str(cfg.model),
        "models": {s: str(m) for s, m in cfg.systems().items()},
        "users": len(files),
        "positions_per_user": cfg.positions,
        **({"first": cfg.first} if cfg.first else {}),
        "seed": cfg.seed,
        "weights": cfg.weights,
        "ranker": cfg.ranker,
        **({"train_every": cfg.train_every, "refit": cfg.refit} if cfg.train_every else {}),
        "totals": {s: t.to_json() for s, t in totals.items()},
        "per_user": per_user,
    }


def model_names(models: Sequence[Path]) -> dict[str, Path]:
    """System names for several models: "calmd:<name>", the name being the folder of a file
    named generically (`weights.cwgt`, `model.cwgt`, `shell.cwgt`: /work/models/<name>/model.cwgt)
    or else the file's stem, made unique."""
    out: dict[str, Path] = {}
    for model in models:
        generic = model.stem in ("weights", "model", "shell") and model.parent.name
        name = model.parent.name if generic else model.stem
        system, n = f"calmd:{name}", 2
        while system in out:
            system, n = f"calmd:{name}-{n}", n + 1
        out[system] = model
    return out


def expand(files: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for name in files:
        p = Path(name)
        out.extend(sorted(p.glob("*.txt")) if p.is_dir() else [p])
    return out
