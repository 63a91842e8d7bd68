"""Generation: beam candidates, scoring, the prefix cache, sampling filters, stop conditions."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from calmd import paths
from calmd.formats.cwgt import Metadata
from calmd.formats.tokenizer import Special, StopMatcher
from calmd.model import faststep
from calmd.model.checkpoint import GenerationDefaults, LoadedModel, header_for, load_model
from calmd.model.generate import Candidate, Generator, SamplingOptions, _Prefix, filter_logits
from calmd.model.mamba import CalmModel
from tests.support.tiny_model import CONTEXT


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


def test_a_new_comp_frame_restarts_from_the_state_before_it(trained: LoadedModel) -> None:
    cached = Generator(trained)
    steps = [("g", ["git"]), ("gi", ["git", "gitk"]), ("git", ["git"]), ("git s", ["status", "stash"]),
             ("git s", ["status"]), ("gi", ["git", "gitk"])]  # fmt: skip
    for typed, comp in steps:
        ctx = {**CTX, "input": typed, "completions": comp}
        fresh = Generator(trained, trace=False)
        a = [(c.text, round(c.logprob, 4)) for c in cached.candidates(ctx, 2, session="s")]
        b = [(c.text, round(c.logprob, 4)) for c in fresh.candidates(ctx, 2, session="s")]
        assert a == b, typed
    # every keystroke after the first reused a cached state: the one before COMP when COMP changed
    assert cached.cache.misses == 1 and cached.cache.hits == len(steps) - 1
    stems = [e for e in cached.cache._entries["s"] if Special.COMP not in e.tokens.tolist()]
    assert stems and stems[0].tokens[-1] != Special.CMD


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


def plain_beam_steps(gen: Generator, start: _Prefix, typed: str, width: int, max_tokens: int,
                     prune_at: int) -> list[tuple[list[Candidate], float]]:  # fmt: skip
    """The beam search written plainly, as the reference for BeamSearch's shortcuts (the row
    gather inside the fused step, matchers forked only for kept or finishing hypotheses): each
    step forks a matcher for every one of the 2 * width best continuations, keeps the first
    `width` that do not finish, copies their states with `select` and runs the eager step.
    After step `prune_at` (when not 0) it drops the beams 2 nats below the best, as
    BeamSearch.prune does."""
    state, logits = start.state, start.logits[None]
    matchers, scores, seen, out = [StopMatcher(gen.stops)], [0.0], set(), []
    for step in range(1, max_tokens + 1):
        logp = torch.log_softmax(logits.float(), -1).masked_fill(gen._forbidden, -math.inf)
        total = (torch.tensor(scores)[:, None] + logp).reshape(-1)
        top = torch.topk(total, min(2 * width, total.numel()))
        finished, rows, tokens, kept, forks = [], [], [], [], []
        for score, index in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            if score == -math.inf:
                break
            row, token = divmod(index, logp.shape[1])
            fork = matchers[row].copy()
            if fork.feed(token):
                text = (typed + bytes(fork.output).decode("utf-8", "replace")).rstrip()
                if text and text != typed.rstrip() and text not in seen:
                    seen.add(text)
                    finished.append(Candidate(text, score, step))
            elif len(rows) < width:
                rows, tokens, kept, forks = rows + [row], tokens + [token], kept + [score], forks + [fork]
        if step == prune_at and kept:
            live = [i for i, s in enumerate(kept) if s > kept[0] - 2.0]
            rows, tokens = [rows[i] for i in live], [tokens[i] for i in live]
            kept, forks = [kept[i] for i in live], [forks[i] for i in live]
        out.append((finished, kept[0] if kept else -math.inf))
        if not kept:
            break
        matchers, scores = forks, kept
        with torch.inference_mode():
            logits, state = gen.model.step_eager(state.select(rows), torch.tensor(tokens))
    return out


# Searches pruned after their fourth step, and (STOPPED_OUTSIDE) searches where, after step 12, a
# line finishes at a stop condition (`|`, `;`, `&&`) in a hypothesis the full beam does not keep
# (found by trying a hundred inputs; BeamSearch forks no matcher for the others).
PRUNED_INPUTS = ["", "g", "git ", "git c", "git commit -m ", "ls -", "cd ", "docker run -", "tar x"]
STOPPED_OUTSIDE = ["grep", "echo", "echo hi ", "cat ~/.bash_history"]


@pytest.mark.slow  # hundreds of searches on the packaged model
@pytest.mark.parametrize("fused", [True, False], ids=["fused step", "eager step"])
def test_beam_search_on_the_packaged_model_equals_the_plain_one(fused: bool) -> None:
    """Every step's finished lines (text, tokens; log-probabilities to 1e-4: the fused step sums
    in another order than the eager one) and bound, with a prune in the middle, for inputs of a
    real folder and of an unknown one."""
    assert faststep.use_fused
    gen = Generator(load_model(paths.packaged_weights()))
    history = [{"cmd": c, "exit": 0} for c in ("git status", "ls -la", "cd src", "make test")]
    try:
        faststep.use_fused = fused
        assert (gen.model._fused_weights() is not None) == (fused and faststep.available())
        for typed in PRUNED_INPUTS + STOPPED_OUTSIDE:
            prune_at = 4 if typed in PRUNED_INPUTS else 0
            for ctx in (
                {"cwd": "/home/u/src/proj", "history": history, "input": typed},
                {"cwd": "/x", "input": typed},
            ):
                start, _ = gen.prepare(ctx, "s")
                want = plain_beam_steps(gen, start, typed, 6, 30, prune_at)
                search = gen.beam_search(ctx, start=start, width=6, max_tokens=30)
                got = []
                while not search.exhausted:
                    finished = search.step()
                    if search.steps == prune_at and search.scores:
                        search.prune(search.scores[0] - 2.0)
                    got.append((finished, search.bound))
                assert len(got) == len(want), typed
                for (g_fin, g_bound), (w_fin, w_bound) in zip(got, want, strict=True):
                    assert [(c.text, c.tokens) for c in g_fin] == [(c.text, c.tokens) for c in w_fin], typed
                    assert [c.logprob for c in g_fin] == pytest.approx([c.logprob for c in w_fin], abs=1e-4)
                    assert g_bound == pytest.approx(w_bound, abs=1e-4)
    finally:
        faststep.use_fused = True
