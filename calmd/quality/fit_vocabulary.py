"""Build the vocabulary of known subcommands and flags (calmd/suggest/filters.py) from the tldr
pages and the public histories of the training users:

    python -m calmd.quality.fit_vocabulary [--data ../shared/data]
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from calmd.arguments import Parser, run_tool
from calmd.atomic import atomic_write
from calmd.suggest.filters import Vocabulary, entries, packaged_vocabulary_path, segments, split_words
from calmd.training.corpus import (
    DEFAULT_DATA,
    fill_placeholders,
    held_out,
    history_users,
    iter_tldr_pages,
    read_history,
)

PROG = "python -m calmd.quality.fit_vocabulary"

MIN_USES = 20  # a command (or command + subcommand) judged needs this many uses in the corpus
MIN_SOURCES = 2  # users (tldr counts as one) that must have typed a token for it to be known
SUBCOMMAND_COVER = 0.9  # share of the next plain words that must be known to judge subcommands
TYPO_EDITS = 2  # a long token this many edits from a far more common one is a slip, not a word
TYPO_RATIO = 10  # ... far more common: used this many times as often

# --------------------------------------------------------------------------- building


def build(sources: Iterable[tuple[str, Iterable[str]]]) -> Vocabulary:
    """The vocabulary from (source name, commands) pairs; the source "tldr" vouches alone."""
    token_uses: defaultdict[str, Counter[str]] = defaultdict(Counter)
    token_sources: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    for source, commands in sources:
        for cmd in commands:
            for _, segment in segments(split_words(cmd)):
                for key, token, _ in entries(segment):
                    token_uses[key][token] += 1
                    token_sources[(key, token)].add(source)

    def vouched(key: str, token: str) -> bool:
        who = token_sources[(key, token)]
        return "tldr" in who or len(who) >= MIN_SOURCES

    known: dict[str, frozenset[str]] = {}
    judged: set[str] = set()
    heads = token_uses.pop("", Counter())
    for head, count in heads.items():  # every common command is judged on dots and flags
        if count >= MIN_USES:
            token_uses[f"{head} ."].update()
            token_uses[f"{head} -"].update()
    for key, tokens_seen in token_uses.items():
        count = sum(tokens_seen.values())
        if key.endswith((" .", " -")) and " " not in key[:-2]:  # wherever the command is common
            count = max(count, heads[key[:-2]])
        if count < MIN_USES:
            continue
        slips: set[str] = set()
        if not key.endswith((" -", " .")):  # flags differ by one letter by design (-l, -t)
            slips = typos(tokens_seen, {t for t in tokens_seen if "tldr" in token_sources[(key, t)]})
        tokens = frozenset(t for t in tokens_seen if vouched(key, t) and t not in slips)
        covered = sum(n for t, n in tokens_seen.items() if t in tokens) / max(1, sum(tokens_seen.values()))
        # flags and dots: judged wherever the command is common; subcommands: where they cover
        if key.endswith((" -", " .")) or (tokens and covered >= SUBCOMMAND_COVER):
            judged.add(key)
            if tokens:
                known[key] = tokens
    return Vocabulary(known, frozenset(judged))


def typos(uses: Counter[str], trusted: set[str]) -> set[str]:
    """Tokens that look like slips of a much more common one (`statu`, `barnch`, `cehckout` for
    git's `status`, `branch`, `checkout`): two users making the same slip is common enough, so
    a token within one edit (two from 7 characters on) of a token used TYPO_RATIO times as often
    is not vouched for. Short tokens (`am`, `co`, `rm`) and tldr's are never slips."""
    common = sorted(uses, key=uses.__getitem__, reverse=True)
    slips: set[str] = set()
    for token, n in uses.items():
        if token in trusted or len(token) <= 4:
            continue
        limit = 1 if len(token) <= 6 else TYPO_EDITS
        for other in common:
            if uses[other] < TYPO_RATIO * n:
                break
            if abs(len(other) - len(token)) <= limit and edits(token, other, limit) <= limit:
                slips.add(token)
                break
    return slips


def edits(a: str, b: str, limit: int) -> int:
    """Optimal string alignment distance (insertions, deletions, substitutions, adjacent swaps),
    or limit + 1 as soon as it must exceed `limit`."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        if min(row) > limit:
            return limit + 1
        prev2, prev = prev, row
    return prev[-1]


def main(argv: list[str] | None = None) -> int:
    import random
    import sys

    parser = Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--output", type=Path, default=packaged_vocabulary_path())
    args = parser.parse_args(argv)
    started = time.monotonic()
    rng = random.Random(0)
    tldr = [
        fill_placeholders(ex.command, rng) for ex in iter_tldr_pages(args.data / "tldr") for _ in range(2)
    ]
    users = [p for p in history_users(args.data) if not held_out(p.stem)]
    if not users:
        parser.error(f"no histories under {args.data / 'histories' / 'users'}")
    sources: list[tuple[str, Iterable[str]]] = [("tldr", tldr)]
    sources += [(p.stem, read_history(p)) for p in users]
    vocab = build(sources)
    vocab.info = {
        "command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
        "tldr_examples": len(tldr),
        "training_users": len(users),
        "keys": len(vocab.known),
        "tokens": sum(len(v) for v in vocab.known.values()),
    }
    with atomic_write(args.output, mode=0o644) as out:
        out.write((json.dumps(vocab.to_json(), separators=(",", ":")) + "\n").encode())
    print(f"{len(vocab.judged)} keys judged, {vocab.info['tokens']} known tokens, from {len(tldr)} tldr "
          f"examples and {len(users)} users in {time.monotonic() - started:.1f} s")  # fmt: skip
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
