"""Does a model read the COMP frame? `python bench/comp_probe.py [WEIGHTS ...]` (default: the packaged model).

For eight typed inputs whose COMP frame holds the file or folder the user meant (`vim no` with
`notes.md`, `cd b` with `build/`, ...), the model alone (no history proposals, no engine) is asked
for its top line and scored on the meant line, once without the frame and once with it. It
prints, per model, the mean rise of that line's log-probability the frame brings and how often
it turns the top line into the meant one. docs/quality.md ("COMP") quotes the figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

from calmd import paths
from calmd.history.frames import context_frames
from calmd.model.checkpoint import load_model
from calmd.model.generate import Generator

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


def main(argv: list[str]) -> int:
    for weights in [Path(a) for a in argv] or [paths.packaged_weights()]:
        print(weights)
        rise, turned = probe(weights)
        print(f"  COMP raises the meant line by {rise:+.2f} nats on average; "
              f"the top line becomes it in {turned} of {len(CASES)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
