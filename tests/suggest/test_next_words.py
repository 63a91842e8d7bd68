"""The model's probability of a line's next words (calmd/suggest/next_words.py): what the ghost
rule weighs a head by."""

from __future__ import annotations

import math
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import torch.nn.functional as F

from calmd import paths
from calmd.formats.tokenizer import Special
from calmd.history.store import HistoryStore
from calmd.model.checkpoint import LoadedModel, load_model
from calmd.model.generate import Generator
from calmd.suggest.engine import ModelEngine
from calmd.suggest.ghost import heads, packaged_rule
from calmd.suggest.index_catch_up import warm_sync
from calmd.suggest.next_words import NextWords
from tests.support.tiny_model import CONTEXT


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


def test_only_a_young_history_asks_the_model_for_a_heads_words(tmp_path: Path) -> None:
    """The keystroke's next-word scoring is the young rules' (fewer than 100 commands): with no
    history the engine scores the drawn line's next words; with 120 commands the grown rule
    weighs heads by the summed confidence and runs no model for it."""
    engine = ModelEngine(paths.packaged_weights())
    assert packaged_rule().at(0).head is not None and packaged_rule().head is None
    ask = {"input": "kill ", "cwd": str(tmp_path)}  # (git outside a repository: nothing is drawable)
    with closing(HistoryStore(tmp_path / "new.sqlite3")) as empty:
        engine.attach_history(empty)
        list(engine.complete(ask, 5, "new", threading.Event()))
    assert engine.next_words.prefills == 1
    with closing(HistoryStore(tmp_path / "grown.sqlite3")) as grown:
        for i in range(120):
            grown.record(["git status", "make test", f"vim notes{i % 7}.md"][i % 3], exit=0, session="s")
        engine.attach_history(grown)
        assert engine.index is not None
        warm_sync(engine.index, grown)
        assert len(engine.index) >= 100
        got = list(engine.complete(ask, 5, "grown", threading.Event()))
    assert got and engine.next_words.prefills == 1
