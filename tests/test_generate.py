"""Generation: beam candidates, scoring, the prefix cache, sampling filters, stop conditions."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from calmd.formats.cwgt import Metadata
from calmd.formats.tokenizer import Special
from calmd.model.checkpoint import GenerationDefaults, LoadedModel, header_for, load_model
from calmd.model.generate import Generator, SamplingOptions, filter_logits
from calmd.model.mamba import CalmModel
from tests.tiny_model import CONTEXT


def as_loaded(model: CalmModel) -> LoadedModel:
    return LoadedModel(Path("test"), model, header_for(model.cfg), Metadata(), GenerationDefaults())


@pytest.fixture(scope="module")
def trained(tiny_weights: Path) -> LoadedModel:
    """The session's tiny model (conftest.py): it has learned four commands after `cd proj`."""
    return load_model(tiny_weights)


CTX = CONTEXT


def test_candidates_complete_the_learned_commands_best_first(trained: LoadedModel) -> None:
    gen = Generator(trained)
    cands = list(gen.candidates({**CTX, "input": "git st"}, 3))
    texts = [c.text for c in cands]
    assert texts[:2] == ["git status", "git stash pop"]
    assert all(a.logprob >= b.logprob for a, b in itertools.pairwise(cands))
    assert len(set(texts)) == len(texts)


def test_empty_input_predicts_the_next_command(trained: LoadedModel) -> None:
    gen = Generator(trained)
    texts = [c.text for c in gen.candidates({**CTX, "input": ""}, 4)]
    assert texts[0] == "git status"
    assert set(texts) <= {"git status", "git stash pop", "ls -la", "make test"} | set(texts[4:])


def test_stop_condition_ends_a_candidate_at_the_pipe_unless_raw(trained: LoadedModel) -> None:
    gen = Generator(trained)
    assert [c.text for c in gen.candidates({**CTX, "input": "ls"}, 1)] == ["ls -la"]
    assert [c.text for c in gen.candidates({**CTX, "input": "ls"}, 1, raw=True)] == ["ls -la | grep x"]


def test_candidate_logprob_equals_the_score_of_its_text(trained: LoadedModel) -> None:
    gen = Generator(trained)
    ctx = {**CTX, "input": "git st"}
    for cand in gen.candidates(ctx, 2, raw=True):
        assert gen.score(ctx, cand.text) == pytest.approx(cand.logprob, abs=1e-4)


def test_score_many_ranks_learned_commands_and_rejects_other_prefixes(trained: LoadedModel) -> None:
    gen = Generator(trained)
    ctx = {**CTX, "input": "git"}
    good, other, wrong = gen.score_many(ctx, ["git status", "git sxyzzy", "make test"])
    assert good > other + 5
    assert wrong == -math.inf


def test_the_traced_step_gives_the_answers_of_the_eager_one(trained: LoadedModel, tiny_weights: Path) -> None:
    """The daemon runs eager steps (engine.py says why); `trace=True` is an option of the API."""
    traced, eager = Generator(load_model(tiny_weights), trace=True), Generator(trained)  # own copies
    assert traced.model._traced_step is not None
    for typed in ["", "git ", "mak"]:
        ctx = {**CTX, "input": typed}
        a = [(c.text, round(c.logprob, 4)) for c in traced.candidates(ctx, 3, session="s")]
        b = [(c.text, round(c.logprob, 4)) for c in eager.candidates(ctx, 3, session="s")]
        assert a == b, typed


def test_prefix_cache_gives_the_same_answers_as_a_fresh_generator(trained: LoadedModel) -> None:
    cached = Generator(trained)
    for typed in ["", "g", "gi", "git", "git ", "git s", "gi", "git sta"]:  # includes a backspace
        ctx = {**CTX, "input": typed}
        fresh = Generator(trained)
        a = [(c.text, round(c.logprob, 4)) for c in cached.candidates(ctx, 2, session="s")]
        b = [(c.text, round(c.logprob, 4)) for c in fresh.candidates(ctx, 2, session="s")]
        assert a == b, typed
    assert cached.cache.hits >= 6  # one byte typed: the previous state was extended


def test_a_beam_search_driven_step_by_step_bounds_and_prunes(trained: LoadedModel) -> None:
    gen = Generator(trained)
    search = gen.beam_search({**CTX, "input": "git st"}, width=4)
    finished = []
    bounds = []
    while not search.exhausted:
        finished += search.step()
        bounds.append(search.bound)
    assert all(a >= b for a, b in itertools.pairwise(bounds))  # log-probabilities only fall
    texts = [c.text for c in finished]
    assert "git status" in texts and "git stash pop" in texts and len(texts) == len(set(texts))
    pruned = gen.beam_search({**CTX, "input": "git st"}, width=4)
    pruned.step()
    pruned.prune(math.inf)  # nothing live can beat +inf: every beam goes
    assert pruned.exhausted and pruned.bound == -math.inf


def test_end_probability_says_whether_the_input_is_a_whole_command(trained: LoadedModel) -> None:
    gen = Generator(trained)
    assert gen.end_probability({**CTX, "input": "git status"}) > 0.9
    assert gen.end_probability({**CTX, "input": "git st"}) < 0.1
    assert gen.end_probability({**CTX, "input": "make"}) < 0.5  # `make test` follows


def test_sampling_is_seeded_and_greedy_at_temperature_zero(trained: LoadedModel) -> None:
    gen = Generator(trained)
    ctx = {**CTX, "input": "git st"}
    greedy = gen.sample(ctx, 2, options=SamplingOptions(temperature=0))
    assert [c.text for c in greedy] == ["git status", "git status"]
    a = gen.sample(ctx, 4, options=SamplingOptions(temperature=2.0, top_k=0, top_p=1.0, min_p=0), seed=3)
    b = gen.sample(ctx, 4, options=SamplingOptions(temperature=2.0, top_k=0, top_p=1.0, min_p=0), seed=3)
    assert [c.text for c in a] == [c.text for c in b]


def test_filters_keep_what_they_should() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    kept = lambda **kw: (filter_logits(logits, SamplingOptions(**{**base, **kw})) > -math.inf)[0].tolist()  # noqa: E731
    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.7) == [True, True, False, False]  # 0.5 < 0.7, 0.8 crosses: kept
    assert kept(top_p=0.5) == [True, False, False, False]
    assert kept(min_p=0.2) == [True, True, True, False]  # 0.05 < 0.2 * 0.5
    assert kept(temperature=0) == [True, False, False, False]
    assert kept() == [True, True, True, True]


def test_max_tokens_bounds_generation(trained: LoadedModel) -> None:
    gen = Generator(trained)
    cands = gen.sample({**CTX, "input": "git st"}, 1, options=SamplingOptions(max_tokens=2, temperature=0))
    assert cands[0].tokens <= 2 and cands[0].text == "git stat"


def test_the_input_is_built_from_the_weight_files_template(trained: LoadedModel) -> None:
    meta = Metadata(template="BOS;CWD:cwd;ATN;CMD:input")
    custom = LoadedModel(Path("t"), trained.model, trained.header, meta, trained.defaults)
    ctx = {**CTX, "cwd": "/p", "input": "ls"}
    seq = Generator(custom).sequence(ctx)
    assert Special.HIST not in seq and Special.CWD in seq
    assert Special.HIST in Generator(trained).sequence(ctx)
