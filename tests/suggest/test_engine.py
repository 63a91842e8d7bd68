"""The completion engine with the packaged model, ranker, vocabulary and calibration: what it
suggests, what it never suggests, and the confidence it gives."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from calmd import paths
from calmd.history.store import HistoryStore
from calmd.model.generate import Candidate
from calmd.suggest.context import recent_context
from calmd.suggest.engine import ModelEngine, RankWeights, Suggestion
from calmd.suggest.ghost import GhostRule
from tests.support.builders import month_old_history
from tests.support.tiny_model import CONTEXT


@pytest.fixture(scope="module")
def engine() -> ModelEngine:
    return ModelEngine(paths.packaged_weights())


def ask(engine: ModelEngine, store: HistoryStore, typed: str, n: int = 5, **ctx: object) -> list[Suggestion]:
    engine.attach_history(store)
    history = [{"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, "s")]
    return list(engine.complete({"input": typed, "history": history, **ctx}, n, "s", threading.Event()))


def texts(got: list[Suggestion]) -> list[str]:
    return [s.text for s in got]


def record(store: HistoryStore, *lines: tuple[str, int | None], ts: float | None = None) -> None:
    for i, (cmd, code) in enumerate(lines):
        store.record(cmd, exit=code, session="s", ts=None if ts is None else ts + i)


def test_a_typo_that_was_not_found_is_demoted_below_what_succeeded(
    engine: ModelEngine, store: HistoryStore
) -> None:
    record(store, ("git status", 0), ("ls", 0), *[("gti status", 127)] * 4)
    got = ask(engine, store, "g")
    assert got[0].text == "git status"
    assert "gti status" not in texts(got)[:4]
    for typed in ("gt", "gti"):
        got = ask(engine, store, typed)
        # the name was never found: no line of it is sent, whatever follows it (nor for Shift-Tab)
        assert not any(s.text.startswith("gti ") for s in got), (typed, texts(got))


def test_a_command_that_never_succeeded_is_no_empty_prompt_prediction(
    engine: ModelEngine, store: HistoryStore
) -> None:
    record(store, ("make", 0), ("ls", 0), *[("(exit 3)", 3)] * 6)
    got = ask(engine, store, "")
    assert "(exit 3)" not in texts(got)
    assert "make" in texts(got)


def test_nothing_is_invented_after_a_complete_command(engine: ModelEngine, store: HistoryStore) -> None:
    record(store, ("git status", 0), ('git commit -m "fix login redirect"', 0), ("ls", 0))
    assert ask(engine, store, "git status") == []  # no ` -a`, no ` -l`
    assert ask(engine, store, 'git commit -m "fix login redirect"') == []  # no ` --no-verify`
    record(store, ("git status -s", 0))
    assert texts(ask(engine, store, "git status")) == ["git status -s"]  # the user's own continuation
    # with a space after it, the user asks for more: the model may propose arguments again
    assert ask(engine, store, "git status ")


def test_the_models_end_of_line_makes_an_input_complete_too(
    engine: ModelEngine, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `df -h` was never run here, but the packaged model is sure nothing follows it
    assert engine.generator.end_probability({"input": "df -h", "history": []}) >= 0.5
    assert ask(engine, store, "df -h") == []
    # and it is the model's end of line that decides: unsure, the same engine offers continuations
    real = engine.generator.end_probability
    monkeypatch.setattr(engine.generator, "end_probability", lambda *a, **kw: min(real(*a, **kw), 0.1))
    assert ask(engine, store, "df -h", cwd="/elsewhere")  # another context: not the answer above


def test_junk_lines_are_never_candidates(engine: ModelEngine, store: HistoryStore) -> None:
    record(store, ('git commit -m "fix main', 0), ("git commit -m wip", 0), ("ls", 0))
    got = texts(ask(engine, store, "git c", n=8))
    assert got and all(line.count('"') % 2 == 0 for line in got)  # the unbalanced line never
    assert "git commit -m wip" in got
    engine.attach_history(store)
    judge = engine._judge("", {"cwd": "/home/u/src/api-server"}, engine._history_side("", {}, "s"), False)
    engine.home = "/home/u"
    assert judge("awk '{print ${PASSWORD}") is None
    assert judge("git stash status") is None and judge("systemctl restics") is None
    assert judge("kubectl ~/src/api-server") is None and judge("tar -xzf .") is None
    assert judge("git stash pop") == 0.0 and judge("kubectl get pods") == 0.0
    # the user's own line is theirs, unless it is half a command (say a beam reproduces it from
    # out of the pool); the history side's proposals were judged already
    assert judge("git commit -m wip") == 0.0 and judge('git commit -m "fix main') is None


def test_todays_arguments_outrank_a_month_old_imports(
    engine: ModelEngine, store: HistoryStore, tmp_path: Path
) -> None:
    (tmp_path / ".zsh_history").write_text(month_old_history())
    store.import_file(tmp_path / ".zsh_history")  # 20 x `ssh oldhost`, 8 x `ssh build01`, a month ago
    today = ["cd ~/work", "ssh newhost", "ls", "git status", "ssh newhost", "vim todo", "make", "ls"]
    record(store, *[(cmd, 0) for cmd in today], ts=time.time() - 600)
    for typed in ("ssh ", "ss"):
        assert ask(engine, store, typed)[0].text == "ssh newhost", typed
    # by counts and distances alone (no clock), the month-old host wins: what the issue saw
    engine.weights = RankWeights(recent_boost=0.0)
    try:
        assert ask(engine, store, "ssh ")[0].text == "ssh oldhost"
    finally:
        engine.weights = RankWeights()


def test_early_is_the_histories_best_proposal(engine: ModelEngine, store: HistoryStore) -> None:
    engine.attach_history(store)
    assert engine.early({"input": "git", "history": []}, "s") is None  # nothing recorded yet
    for _ in range(20):
        record(store, ("vim main.c", 0), ("make", 0), ("./main", 0))
    history = [{"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, "s")]
    early = engine.early({"input": "", "history": history}, "s")
    assert early is not None and early[0] == "vim main.c" and 0.5 < early[1] <= 1.0


def test_confidence_is_high_for_the_users_loop_and_low_for_a_guess(
    engine: ModelEngine, store: HistoryStore
) -> None:
    got = ask(engine, store, "")  # no history at all: a pure guess
    assert got and all(0.0 <= s.confidence < 0.3 for s in got)
    seen: list[float] = []
    for _ in range(4):
        for _ in range(5):
            record(store, ("vim main.c", 0), ("make", 0), ("./main", 0), ("ls", 0))
        got = ask(engine, store, "")
        assert got[0].text == "vim main.c" and all(s.confidence <= got[0].confidence for s in got)
        seen.append(got[0].confidence)
    assert seen == sorted(seen) and seen[0] < 0.5 <= seen[-1]  # the more the loop repeats, the surer
    typed = ask(engine, store, "v")[0]
    assert typed.text == "vim main.c" and typed.confidence > seen[-1]  # a typed letter narrows it down


# --------------------------------------------------------------------------- the mixture's ranking


@pytest.fixture
def tiny_engine(tiny_weights: Path) -> ModelEngine:
    """The tiny model of tests/support/tiny_model.py: it knows `git status`, `git stash pop`, ..."""
    return ModelEngine(tiny_weights)


def merged(
    engine: ModelEngine, ctx: dict[str, object], n: int, *, extra: list[tuple[str, float]] | None = None,
    judge: Callable[[str], float | None] = lambda text: 0.0,
) -> list[Candidate]:  # fmt: skip
    """The engine's ranking of history proposals (`extra`) and beams, with no history share (lam
    0: a beam's mixture score is its log-probability)."""
    ctx = {**CONTEXT, **ctx}
    search = engine.generator.beam_search(ctx, width=max(engine.generator.beam_width, n))
    return list(engine.ranked(search, extra or [], judge, n, 0.0, threading.Event()))


def test_extra_candidates_are_ranked_with_the_beams_and_deduplicated(tiny_engine: ModelEngine) -> None:
    ctx = {"input": "git st"}
    cands = merged(tiny_engine, ctx, 3, extra=[("git stage all", 5.0), ("git status", 10.0)])
    assert [c.text for c in cands][:2] == ["git status", "git stage all"]
    assert cands[0].logprob == 10.0
    assert [c.text for c in cands].count("git status") == 1


def test_a_judge_drops_or_demotes_what_the_beams_finish(tiny_engine: ModelEngine) -> None:
    ctx = {"input": "git st"}
    plain = merged(tiny_engine, ctx, 2)
    assert [c.text for c in plain] == ["git status", "git stash pop"]
    dropped = [
        c.text for c in merged(tiny_engine, ctx, 2, judge=lambda t: None if t == "git status" else 0.0)
    ]
    assert dropped[0] == "git stash pop" and "git status" not in dropped
    demoted = merged(tiny_engine, ctx, 2, judge=lambda t: -3.0 if t == "git status" else 0.0)
    assert [c.text for c in demoted] == ["git stash pop", "git status"]
    assert demoted[1].logprob == pytest.approx(plain[0].logprob - 3.0, abs=1e-4)


def test_the_search_stops_after_the_drop_budget_of_junk_lines(tiny_engine: ModelEngine) -> None:
    ctx = {"input": "git st"}
    unbounded: list[str] = []
    tiny_engine.drop_budget = 10_000
    assert merged(tiny_engine, ctx, 1, judge=lambda t: unbounded.append(t)) == []  # everything dropped
    bounded: list[str] = []
    tiny_engine.drop_budget = 2
    assert merged(tiny_engine, ctx, 1, judge=lambda t: bounded.append(t)) == []
    assert 2 <= len(bounded) < len(unbounded)  # it stopped at the end of the step of the second drop
    assert bounded == unbounded[: len(bounded)]


def test_typing_through_a_word_at_once_continues_the_answer_as_a_search_would(
    engine: ModelEngine, store: HistoryStore
) -> None:
    record(store, ("git commit -m 'first draft'", 0), ("make test", 0), ("git status", 0))
    engine.attach_history(store)
    fresh = ModelEngine(paths.packaged_weights(), RankWeights(typing_through=0))
    fresh.attach_history(store)
    history = [{"cmd": "make test", "exit": 0}, {"cmd": "git status", "exit": 0}]  # the client's, fixed

    def complete(e: ModelEngine, typed: str, session: str = "s") -> list[Suggestion]:
        return list(e.complete({"input": typed, "history": history}, 5, session, threading.Event()))

    before = dict(searched=engine.searches, through=engine.reused)
    line = complete(engine, "git c")[0].text
    assert line.startswith("git c") and " " in line[len("git c") :]
    # a whole word accepted at once (forward-word): several bytes beyond the last input
    word_end = line.index(" ", len("git c") + 1) + 1
    typed = line[:word_end]
    got = complete(engine, typed)
    assert engine.reused == before["through"] + 1 and engine.searches == before["searched"] + 1
    searched = complete(fresh, typed, "t")
    assert got[0].text == searched[0].text == line
    assert got[0].score == pytest.approx(searched[0].score, abs=1e-3)
    assert got[0].confidence == pytest.approx(searched[0].confidence, abs=2e-3)
    # a command recorded meanwhile by another shell: the same context, but a new history (its
    # proposals and counts changed): a search again
    store.record("ls", exit=0, session="other")
    complete(engine, typed + line[word_end : word_end + 1])
    assert engine.searches == before["searched"] + 2 and engine.reused == before["through"] + 1


def test_a_backspace_back_to_an_input_answered_before_searches_nothing(
    engine: ModelEngine, store: HistoryStore
) -> None:
    record(store, ("git commit -m 'first draft'", 0), ("git status", 0))
    engine.attach_history(store)
    history = [{"cmd": "git status", "exit": 0}]

    def complete(typed: str) -> list[tuple[str, float, float]]:
        got = engine.complete({"input": typed, "history": history}, 5, "s", threading.Event())
        return [(s.text, round(s.score, 4), s.confidence) for s in got]

    first = complete("git c")
    complete("git cx")  # a typo: nothing continues it, a search
    searches, reused = engine.searches, engine.reused
    assert complete("git c") == first  # the backspace: the earlier answer, as it was
    assert (engine.searches, engine.reused) == (searches, reused + 1)
    # more than `n` asked for than that answer held: a search
    list(engine.complete({"input": "git c", "history": history}, 8, "s", threading.Event()))
    assert engine.searches == searches + 1


def test_a_line_that_failed_every_time_is_never_sent(engine: ModelEngine, store: HistoryStore) -> None:
    record(store, ("git pull", 0), *[("git push origin feature/login", 128)] * 5, ("ls", 0))
    for typed in ("", "g", "git p", "git push", "git push origin f"):
        assert "git push origin feature/login" not in texts(ask(engine, store, typed)), typed


def ask_in(engine: ModelEngine, store: HistoryStore, typed: str, **ctx: object) -> list[Suggestion]:
    engine.attach_history(store)
    history = [{"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, "s")]
    found = engine.complete({"input": typed, "history": history, **ctx}, 5, "s", threading.Event())
    return list(found)


def test_a_line_is_drawn_only_where_it_belongs(
    engine: ModelEngine, store: HistoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The branch a line names and ran on, and whether the shell is in a repository at all, are
    part of the context: `git push origin feature/login` is not drawn on master nor outside any
    repository, and sinks below the lines that belong there."""
    monkeypatch.setattr(engine, "ghost", GhostRule.uniform(0.0))  # draw every top line that may be
    repo, elsewhere = tmp_path / "app", tmp_path / "notes"
    repo.mkdir()
    elsewhere.mkdir()
    store.record("git pull", exit=0, cwd=str(repo), git="master", session="s")
    for _ in range(6):
        store.record("git push origin feature/login", exit=0, cwd=str(repo), git="feature/login", session="s")
    store.record("ls", exit=0, cwd=str(repo), git="master", session="s")
    on_feature = ask_in(engine, store, "git pu", cwd=str(repo), git="feature/login")
    assert on_feature[0].text == "git push origin feature/login" and on_feature[0].ghost
    on_master = ask_in(engine, store, "git pu", cwd=str(repo), git="master")
    assert on_master[0].text == "git pull"
    pushed = [s for s in on_master if s.text == "git push origin feature/login"]  # demoted out, or:
    assert all(not p.ghost and p.confidence == 0.0 and p.score < on_master[0].score - 20 for p in pushed)
    # outside any repository: no git line is drawn, the user's or the model's
    outside = ask_in(engine, store, "git ", cwd=str(elsewhere))
    assert outside and not any(s.ghost for s in outside if not s.text.startswith(("git clone", "git init")))
    # the replay's histories say no cwd: nothing is judged
    assert ask_in(engine, store, "git pu")[0].text == "git push origin feature/login"


def test_one_line_is_drawn_at_most_and_it_comes_first(
    engine: ModelEngine, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(store, ("git status", 0), ("git stash", 0), ("git status", 0), ("ls", 0))
    monkeypatch.setattr(engine, "ghost", GhostRule.uniform(0.0))
    got = ask(engine, store, "git st")
    assert [s.ghost for s in got] == [True] + [False] * (len(got) - 1)
    monkeypatch.setattr(engine, "ghost", GhostRule.uniform(1.0))  # nothing is that sure
    assert not any(s.ghost for s in ask(engine, store, "git st"))
    # the shell's CALM_MIN_CONFIDENCE replaces the rule: 0 draws the top line
    engine.attach_history(store)
    history = [{"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, "s")]
    forced = list(engine.complete({"input": "git st", "history": history}, 5, "s", threading.Event(),
                                  min_confidence=0.0))  # fmt: skip
    assert forced[0].ghost


def test_the_line_on_the_screen_stays_unless_clearly_beaten(
    engine: ModelEngine, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell says which line it draws (the user typed along it): with a wide margin it stays
    and comes first; with none, the best line replaces it."""
    record(store, *[("git status", 0)] * 5, ("git stash", 0), ("ls", 0))
    engine.attach_history(store)
    history = [{"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, "s")]

    def answer(drawn: str) -> list[Suggestion]:
        ctx = {"input": "git sta", "history": history}
        return list(engine.complete(ctx, 5, "s", threading.Event(), drawn=drawn))

    monkeypatch.setattr(engine, "ghost", GhostRule.uniform(0.0, margin=0.0))
    best = answer("")[0]
    other = next(s.text for s in answer("") if s.text != best.text)
    assert answer(other)[0].text == best.text  # beaten: replaced
    monkeypatch.setattr(engine, "ghost", GhostRule.uniform(0.0, margin=50.0))
    kept = answer(other)
    assert kept[0].text == other and kept[0].ghost
    assert best.text in texts(kept) and len(kept) == len(set(texts(kept)))  # sent once each
    early: list[tuple[str, float, bool]] = []
    ctx = {"input": "git sta", "history": history}
    list(engine.complete(ctx, 5, "s", threading.Event(), lambda *e: early.append(e), drawn=other))
    assert early and (early[0][2] is False or early[0][0] == other)  # no early line over the drawn one


def test_the_search_stops_soon_after_its_best_line_is_final(
    engine: ModelEngine, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RankWeights.tail_steps: once the line to draw is final the search goes on a few steps for
    the others (Shift-Tab's), then sends what it has: the drawn line is the same, sooner."""
    record(store, ("git status", 0), ("make test", 0), ("ls -la", 0))
    engine.attach_history(store)
    history = [{"cmd": r.cmd, "exit": r.exit} for r in recent_context(store, "s")]
    steps: list[int] = []
    real_step = engine.generator.model.step

    def counted(*args: object, **kwargs: object) -> object:
        steps.append(1)
        return real_step(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.generator.model, "step", counted)
    saved = 0
    for typed in ("", "g", "docker ", "tar x", "python3 -m "):
        found = {}
        for tail in (0, 4):
            monkeypatch.setattr(engine, "weights", RankWeights(tail_steps=tail, typing_through=0))
            steps.clear()
            ctx = {"input": typed, "history": history}
            got = list(engine.complete(ctx, 5, f"t{tail}", threading.Event()))
            found[tail] = (got[0].text, round(got[0].score, 4), len(steps), len(got))
        assert found[4][:2] == found[0][:2], typed  # the same line first, with the same score
        assert found[4][2] <= found[0][2] and found[4][3] >= 1, (typed, found)
        saved += found[0][2] - found[4][2]
    assert saved > 0  # steps the tail did not take


# --------------------------------------------------------------------------- the mixture's parts


class NoModel:
    """Stands in for the generator of an engine that must not run the model."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the model was asked ({name})")


def test_each_part_alone_proposes_only_its_own_lines(tiny_weights: Path, store: HistoryStore) -> None:
    # the user's own line, which the tiny model never learnt; the model's `git status`, never run
    record(store, *[("cd proj", 0), ("git stage --all", 0)] * 3, ("cd proj", 0))
    mixture = texts(ask(ModelEngine(tiny_weights), store, "git st"))
    assert "git stage --all" in mixture and "git status" in mixture

    history = ModelEngine(tiny_weights, parts="history")
    history.generator = NoModel()  # type: ignore[assignment]  # no model runs at all
    got = ask(history, store, "git st")
    # the one past line that extends the input, then its head carrying the previous line's word over
    assert texts(got) == ["git stage --all", "git stage proj"]
    assert got[0].ghost and got[0].confidence > 0  # drawn and calibrated as the mixture's lines are

    model = texts(ask(ModelEngine(tiny_weights, parts="model"), store, "git st"))
    assert "git status" in model
    assert "git stage --all" not in model  # no line comes from the history's counts
    # nor on the empty prompt, where the history's best is what followed `cd proj` every time
    assert "git stage --all" not in texts(ask(ModelEngine(tiny_weights, parts="model"), store, ""))
