"""The model's probability of a line's next words (calmd/suggest/next_words.py): what the ghost
rule weighs a head by."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch.nn.functional as F

from calmd.formats.tokenizer import Special
from calmd.model.checkpoint import LoadedModel, load_model
from calmd.model.generate import Generator
from calmd.suggest.ghost import heads
from calmd.suggest.next_words import NextWords
from tests.tiny_model import CONTEXT


@pytest.fixture(scope="module")
def trained(tiny_weights: Path) -> LoadedModel:
    """The session's tiny model (conftest.py): it has learned four commands after `cd proj`."""
    return load_model(tiny_weights)


def word_end(gen: Generator, ctx: dict[str, Any], typed: str) -> float:
    """log P(a space or the end of the line | the context, `typed`), from a state of its own."""
    start, _ = gen.prepare({**ctx, "input": typed}, "other")
    logp = F.log_softmax(start.logits.float(), dim=-1)
    return float(logp[[ord(" "), Special.EOS]].logsumexp(0))


def test_a_heads_words_have_the_models_probability(trained: LoadedModel) -> None:
    """log P(the head's words, then a word end): the bytes past the input as the model scores
    them, and a space or the line's end after them."""
    gen = Generator(trained)
    words = NextWords(gen)
    ctx = {**CONTEXT, "input": "git "}
    start, _ = gen.prepare(ctx, "s")
    line = "git stash pop"
    assert heads(line, "git ") == ["git stash ", "git stash pop"]
    got = words.head_logprobs("s", ctx, start, line)
    want = [gen.continuation_logprob(start, "stash") + word_end(gen, ctx, "git stash"),
            gen.continuation_logprob(start, "stash pop") + word_end(gen, ctx, "git stash pop")]  # fmt: skip
    assert got == pytest.approx(want, abs=1e-3)
    assert got[0] > got[1]  # the first word is surer than the first two
    assert got[0] > math.log(0.2)  # the model learned `git stash pop` after `cd proj`: it is sure of `stash`
    assert words.head_logprobs("s", ctx, start, "git ") == []  # nothing past the input: no head


def test_typing_along_the_line_costs_no_model_run(trained: LoadedModel) -> None:
    """The next keystroke along the same line takes its bytes' scores from the last one (less what
    the typed bytes took), as a fresh scoring gives them; another context scores afresh."""
    gen = Generator(trained)
    words = NextWords(gen)
    line = "git stash pop"
    ctx = {**CONTEXT, "input": "git "}
    words.head_logprobs("s", ctx, gen.prepare(ctx, "s")[0], line)
    along = {**CONTEXT, "input": "git st"}
    start, _ = gen.prepare(along, "s")
    got = words.head_logprobs("s", along, start, line)
    assert words.prefills == 1
    fresh = NextWords(gen).head_logprobs("s", along, start, line)
    assert got == pytest.approx(fresh, abs=1e-3)
    elsewhere = {**along, "cwd": "/elsewhere"}
    words.head_logprobs("s", elsewhere, gen.prepare(elsewhere, "s")[0], line)
    assert words.prefills == 2


def test_a_long_line_is_scored_again_once_typed_far_along(trained: LoadedModel) -> None:
    """Bytes are scored `MAX_BYTES` past the input (the keystroke's cost): typing along a long line
    reuses them while enough are left past the cursor, then scores afresh from there."""
    gen = Generator(trained)
    words = NextWords(gen)
    line = "git stash pop --index && git status --short --branch"
    for typed in ("git ", "git stash ", "git stash pop --index "):
        ctx = {**CONTEXT, "input": typed}
        start, _ = gen.prepare(ctx, "s")
        got = words.head_logprobs("s", ctx, start, line)
        fresh = NextWords(gen).head_logprobs("s", ctx, start, line)
        assert math.isfinite(got[0]) and len(got) == len(fresh) == len(heads(line, typed))
        assert [g for g in got if math.isfinite(g)] == pytest.approx(
            fresh[: sum(map(math.isfinite, got))], abs=1e-3
        )
        assert all(not math.isfinite(f) for f in fresh[sum(map(math.isfinite, fresh)) :])  # past MAX_BYTES
    assert words.prefills == 2  # "git stash " is 6 bytes along the first scoring; the third 18: afresh
