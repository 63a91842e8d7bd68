"""Does a model read the COMP frame? `python bench/comp_probe.py [WEIGHTS ...]` (default: the packaged model).

1. For eight typed inputs whose COMP frame holds the file or folder the user meant (`vim no` with
   `notes.md`, `cd b` with `build/`, ...), the model alone (no history proposals, no engine) is
   asked for its top line and scored on the meant line, once without the frame and once with it.
   It prints the mean rise of that line's log-probability the frame brings and how often it
   turns the top line into the meant one.
2. Does it know where a line ends, with COMP or without? At 25 commands of each held-out user
   (needs ../shared/data), typed out whole, with 5 history frames: the probability of the end of
   line with no COMP frame (an alias, a shell that sent no PATH, a slow disk) and with COMP as the
   daemon serves a word typed on: computed when the word is begun and kept while an item still
   extends it (calmd/daemon/comp_state.py). The tldr page names and the vocabulary stand in for PATH.
docs/quality.md ("COMP") quotes the figures.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import torch

from calmd import paths
from calmd.arguments import run_tool
from calmd.model.checkpoint import load_model
from calmd.model.generate import Generator
from calmd.suggest.frames import context_frames, served_completions
from calmd.training.corpus import DEFAULT_DATA, comp_sources, held_out, history_users

# (typed input, COMP items as the daemon would list them, the meant line, the history before it)
CASES: list[tuple[str, list[str], str, list[tuple[str, int | None]]]] = [
    ("vim no", ["notes.md"], "vim notes.md", [("mkdir build", 0)]),
    ("cd b", ["build/"], "cd build", [("mkdir build", 0)]),
    ("cat re", ["requirements.txt", "README.md"], "cat requirements.txt", [("ls", 0)]),
    ("python tr", ["train.py", "tree.py"], "python train.py", [("ls", 0)]),
    ("source .v", [".venv/"], "source .venv/bin/activate", [("python3 -m venv .venv", 0)]),
    ("cd sr", ["src/"], "cd src", [("git clone https://example.org/x.git", 0), ("cd x", 0)]),
    ("less lo", ["logfile-2024.txt"], "less logfile-2024.txt", [("ls", 0)]),
    ("vim ma", ["main.rs", "Makefile"], "vim main.rs", [("cargo init", 0)]),
]


def probe(weights: Path) -> tuple[float, int]:
    """(mean log-prob rise of the meant line with COMP, cases whose top line becomes it)."""
    generator = Generator(load_model(weights))
    rises: list[float] = []
    turned = 0
    for typed, items, meant, history in CASES:
        tops: list[str] = []
        scores: list[float] = []
        for comp in ([], items):
            ctx = {**context_frames(cwd="~/proj", history=history, completions=comp), "input": typed}
            tops.append(next(iter(generator.candidates(ctx, 1))).text)
            scores.append(generator.score(ctx, meant))
        rises.append(scores[1] - scores[0])
        turned += tops[1] == meant and tops[0] != meant
        print(f"  {typed!r:12} top without COMP {tops[0]!r:22} with {tops[1]!r:22} "
              f"log P({meant!r}) {scores[0]:6.2f} -> {scores[1]:6.2f}")  # fmt: skip
    return sum(rises) / len(rises), turned


def held_out_lines(data: Path, per_user: int = 25) -> list[tuple[list[tuple[str, int | None]], str]]:
    """(5 history frames, the command) at `per_user` seeded positions of each held-out user."""
    rng = random.Random(0)
    samples: list[tuple[list[tuple[str, int | None]], str]] = []
    for user in history_users(data):
        if not held_out(user.stem):
            continue
        lines = [line.strip() for line in user.read_text(errors="replace").splitlines() if line.strip()]
        for _ in range(per_user):
            i = rng.randrange(1, len(lines))
            samples.append(([(c, None) for c in lines[max(0, i - 5) : i]], lines[i]))
    return samples


def end_of_line(weights: Path, data: Path) -> None:
    generator = Generator(load_model(weights))
    sources = comp_sources(data / "tldr")
    samples = held_out_lines(data)
    for name, served in (("no COMP", False), ("COMP as served", True)):
        p_end: list[float] = []
        one_word: list[float] = []
        for history, cmd in samples:
            comp = []
            if served:
                comp = served_completions(cmd, commands=sources.commands, followers=sources.followers)
            p = generator.end_probability({**context_frames(history=history, completions=comp), "input": cmd})
            p_end.append(p)
            if " " not in cmd:
                one_word.append(p)
        log = sum(math.log(max(p, 1e-9)) for p in p_end) / len(p_end)
        print(f"  end of line, {name:24} mean P {sum(p_end) / len(p_end):.3f}, mean log P {log:.3f}, "
              f"one-word commands {sum(one_word) / max(len(one_word), 1):.3f} "
              f"({len(p_end)} lines, {len(one_word)} of one word)")  # fmt: skip


PROG = "bench/comp_probe.py"


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)  # as the daemon infers; and two threads beside a training crawl
    for weights in [Path(a) for a in argv] or [paths.packaged_weights()]:
        print(weights)
        rise, turned = probe(weights)
        print(f"  COMP raises the meant line by {rise:+.2f} nats on average; "
              f"the top line becomes it in {turned} of {len(CASES)}")  # fmt: skip
        if (DEFAULT_DATA / "histories").is_dir():
            end_of_line(weights, DEFAULT_DATA)
        else:
            print(f"  (no {DEFAULT_DATA}: the end-of-line part needs the shared data)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(lambda: main(sys.argv[1:]))))
