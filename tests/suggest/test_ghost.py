"""The ghost rule (calmd/suggest/ghost.py): one decision for every shell, fitted on replays."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calmd.errors import FormatError
from calmd.quality.fit_ghost import fit, simulate, words_right
from calmd.suggest.calibration import Head
from calmd.suggest.ghost import (
    BUCKETS,
    HEAD_FEATURES,
    GhostRule,
    bucket,
    heads,
    packaged_rule,
    packaged_rule_path,
)


def test_buckets_are_the_empty_prompt_and_how_much_is_typed() -> None:
    assert [bucket(t) for t in ("", "g", "gi", "git", "git ", "git sta", "git stat", "git status")] == [
        "empty", "k1", "k2", "k2", "k4", "k4", "k8", "k8",
    ]  # fmt: skip


def rule(final: dict[str, float] | None = None, margin: float = 0.0) -> GhostRule:
    table = {**dict.fromkeys(BUCKETS, 0.3), **(final or {})}
    return GhostRule(table, table, margin)


def test_the_top_line_is_drawn_when_sure_enough_for_its_context() -> None:
    strict_empty = rule({"empty": 0.6})
    candidates = [("git status", 0.5, -1.0), ("git stash", 0.4, -1.5)]
    assert strict_empty.choose("git s", candidates) == 0
    assert strict_empty.choose("", candidates) is None  # the empty prompt asks for more
    assert strict_empty.choose("git s", [("git status", 0.1, -1.0)]) is None
    assert strict_empty.choose("git s", []) is None


def test_the_line_drawn_already_stays_unless_clearly_beaten() -> None:
    candidates = [("git stash", 0.5, -1.0), ("git status", 0.4, -1.6)]
    assert rule(margin=1.0).choose("git st", candidates, incumbent="git status") == 1  # 0.6 nats: kept
    assert rule(margin=0.5).choose("git st", candidates, incumbent="git status") == 0  # beaten
    # the incumbent on top stays drawn even below the threshold: it is on the screen already
    assert rule({"k4": 0.9}).choose("git st", [("git status", 0.2, -1.0)], "git status") == 0
    # a head drawn already is the incumbent of the line it starts
    heads_rule = GhostRule(dict.fromkeys(BUCKETS, 0.9), dict.fromkeys(BUCKETS, 0.9), 0.0, heads=True)
    assert heads_rule.draw("git c", [("git commit -m x", 0.2, -1.0)], "git commit ") == (0, "git commit ")
    # an incumbent the answer no longer holds is gone
    assert rule(margin=9.0).choose("git st", candidates, incumbent="git stage") == 0


def test_the_shells_threshold_replaces_every_fitted_one() -> None:
    fitted = rule({"empty": 0.9, "k1": 0.0})
    forced = fitted.overridden(0.5)
    assert set(forced.final.values()) == {0.5} and set(forced.early.values()) == {0.5}
    assert forced.margin == fitted.margin
    assert fitted.overridden(None) is fitted
    assert GhostRule.uniform(0.0).choose("", [("ls", 0.0, -9.0)]) == 0  # 0: every top line drawn


def test_heads_draw_the_words_the_candidates_agree_on() -> None:
    assert heads("docker run --rm -it alpine", "docker r") == [
        "docker run ", "docker run --rm ", "docker run --rm -it ", "docker run --rm -it alpine",
    ]  # fmt: skip
    assert heads("ls", "") == ["ls"]
    assert heads("git  log", "git") == ["git  log"]  # spaces go with the word after them
    table = dict.fromkeys(BUCKETS, 0.5)
    by_heads = GhostRule(table, table, 0.0, heads=True)
    images = [("docker run --rm -it alpine", 0.3, -1.0), ("docker run --rm -it ubuntu", 0.25, -1.2),
              ("docker ps", 0.1, -2.0)]  # fmt: skip
    # no line is sure, the words they share are: drawn up to the image name
    assert by_heads.draw("docker r", images) == (0, "docker run --rm -it ")
    assert GhostRule(table, table).draw("docker r", images) is None  # whole lines only: nothing
    assert by_heads.draw("docker r", [("docker run --rm -it alpine", 0.6, -1.0)]) == (0, images[0][0])
    assert by_heads.draw("", [("docker ps", 0.2, -1.0), ("git status", 0.2, -1.1)]) is None


def by_the_models_word() -> Head:
    """A heads' calibration that believes the model alone: sigmoid(log P(the head's words))."""
    w = np.zeros(len(HEAD_FEATURES))
    w[HEAD_FEATURES.index("log_p_words")] = 1.0
    return Head(HEAD_FEATURES, np.zeros(len(HEAD_FEATURES)), np.ones(len(HEAD_FEATURES)), w, 0.0)


def test_a_head_the_model_is_sure_of_is_drawn_when_no_line_is() -> None:
    """A new user's lines are all the model's guesses (low whole-line confidences), yet the model
    may be sure of the next word: with the heads' calibration the rule weighs a head by the
    model's own probability of its words, and draws `docker run ` alone."""
    table = dict.fromkeys(BUCKETS, 0.3)
    summed = GhostRule(table, table, 0.0, heads=True)
    calibrated = GhostRule(table, table, 0.0, heads=True, head=by_the_models_word())
    lines = [("docker run --rm -it alpine", 0.05, -3.0), ("docker run -d nginx", 0.04, -3.5)]
    model = {lines[0][0]: [-0.2, -1.5, -3.0, -6.0]}  # log P of "run ", "run --rm ", ... (heads' order)
    assert heads(lines[0][0], "docker ")[0] == "docker run "
    assert summed.draw("docker ", lines, head_logprobs=model.get) is None  # 0.09 summed: below 0.3
    assert calibrated.draw("docker ", lines, head_logprobs=model.get) == (0, "docker run ")  # sigmoid(-0.2)
    # where the model did not run (the history ranker alone) the summed confidence decides
    assert calibrated.draw("docker ", lines) is None
    sure = {lines[0][0]: [-0.1, -0.2, -0.3, -0.4]}
    assert calibrated.draw("docker ", lines, head_logprobs=sure.get) == (0, lines[0][0])
    # the line whose next word is likeliest, not the top line (`by_word`)
    chooser = replace(calibrated, by_word=True)
    words = {lines[0][0]: [-3.0, -4.0, -5.0, -6.0], lines[1][0]: [-0.1, -2.0, -3.0]}
    assert calibrated.draw("docker ", lines, head_logprobs=words.get) is None
    assert chooser.draw("docker ", lines, head_logprobs=words.get) == (1, "docker run ")
    # the next words' confidences of every line in one pass are those of each line's first head
    firsts = chooser.next_word_confidences("docker ", lines, 0, words.get)
    each = [
        chooser.head_confidences("docker ", line, lines, conf, False, 0, words[line])
        for line, conf, _ in lines
    ]
    assert firsts == pytest.approx([found[0][1] for found in each])
    # a line drawn already stays drawn while it is the top one
    assert chooser.draw("docker ", lines, "docker run --rm ", head_logprobs=words.get) == (
        0,
        "docker run --rm ",
    )
    # the shell's threshold replaces the fitted ones, the calibration stays
    assert calibrated.overridden(0.9).draw("docker ", lines, head_logprobs=sure.get) is None
    assert words_right("docker run -d nginx", "docker run ") and words_right("docker run", "docker run ")
    assert not words_right("docker runner", "docker run ")


def test_the_users_own_lines_and_a_young_history_have_their_own_thresholds() -> None:
    strict, lax = dict.fromkeys(BUCKETS, 0.8), dict.fromkeys(BUCKETS, 0.1)
    young = GhostRule(strict, strict, 0.0, heads=True)
    rule = GhostRule(strict, strict, 0.0, True, known=lax, young=100, young_rule=young)
    line = ("make test", 0.3, -1.0)
    assert rule.draw("ma", [(*line, True)]) == (0, "make test")  # the user ran it: their table
    assert rule.draw("ma", [(*line, False)]) is None  # the model's line: the strict one
    assert rule.draw("ma", [(*line, True)], history=99) is None  # a new user: the young rule
    assert rule.draws_early("ma", 0.5) is False and rule.at(100) is rule and rule.at(99) is young
    # a newborn history (a few commands) has a rule of its own inside the young one
    newborn = GhostRule(lax, lax, 0.0, heads=True)
    tiered = GhostRule(strict, strict, 0.0, True, young=100, young_rule=GhostRule(strict, strict, 0.0, True,
                       young=10, young_rule=newborn))  # fmt: skip
    assert tiered.at(9) is newborn and tiered.at(10) is tiered.young_rule and tiered.at(100) is tiered
    assert tiered.draw("ma", [(*line, False)], history=3) == (0, "make test")
    assert tiered.draw("ma", [(*line, False)], history=30) is None
    again = GhostRule.from_json(json.loads(json.dumps(tiered.to_json())))
    assert again == tiered and again.at(9) == newborn
    with pytest.raises(FormatError, match=r"young\.young\.below: 100 is not below 100"):
        GhostRule.from_json({**tiered.to_json(), "young": {**tiered.to_json()["young"], "young": {
            **newborn.to_json(), "below": 100}}}, "ghost.json")  # fmt: skip


def test_a_rule_round_trips_and_a_bad_file_is_a_clear_error(tmp_path: Path) -> None:
    fitted = GhostRule(dict.fromkeys(BUCKETS, 0.1), dict.fromkeys(BUCKETS, 0.2), 1.5, info={"fitted_on": "x"})
    assert GhostRule.from_json(json.loads(json.dumps(fitted.to_json()))) == fitted
    young = GhostRule(dict.fromkeys(BUCKETS, 0.3), dict.fromkeys(BUCKETS, 0.4), 0.0, True)
    full = GhostRule(dict.fromkeys(BUCKETS, 0.1), dict.fromkeys(BUCKETS, 0.2), 0.0, True,
                     dict.fromkeys(BUCKETS, 0.05), 100, young)  # fmt: skip
    again = GhostRule.from_json(json.loads(json.dumps(full.to_json())))
    assert again == full and again.young_rule == young and again.known == full.known
    # the heads' calibration is written once and shared by the young rule
    model_word = by_the_models_word()
    calibrated = GhostRule(full.final, full.early, 0.0, True, full.known, 100, young, head=model_word)
    data = json.loads(json.dumps(calibrated.to_json()))
    assert "head" in data and "head" not in data["young"]
    again = GhostRule.from_json(data)
    assert again.head is not None and again.young_rule is not None and again.young_rule.head is not None
    assert again.head.to_json() == model_word.to_json() == again.young_rule.head.to_json()
    with pytest.raises(FormatError, match=r"ghost\.json: head: features differ .*fit_ghost refits"):
        GhostRule.from_json({**data, "head": {**data["head"], "features": ["log_p"]}}, "ghost.json")
    with pytest.raises(FormatError, match=r"ghost\.json: young.below: -1 is negative"):
        GhostRule.from_json({**full.to_json(), "young": {**young.to_json(), "below": -1}}, "ghost.json")
    with pytest.raises(FormatError, match="heads"):
        GhostRule.from_json({**full.to_json(), "heads": "yes"}, "ghost.json")
    with pytest.raises(FormatError, match=r"ghost\.json: not a ghost rule"):
        GhostRule.from_json({"final": {"empty": 0.1}}, "ghost.json")
    with pytest.raises(FormatError, match="not a ghost rule"):
        GhostRule.from_json({"final": dict.fromkeys(BUCKETS, "x"), "early": {}}, "ghost.json")


def test_the_packaged_rule_is_fitted_and_says_how() -> None:
    assert packaged_rule_path().exists(), "python -m calmd.quality.fit_ghost writes it"
    packaged = packaged_rule()
    assert packaged.info["command"].startswith("python -m calmd.quality.fit_ghost")
    assert packaged.heads and packaged.young and packaged.young_rule is not None
    tables = [packaged.final, packaged.early, packaged.known or {}, packaged.young_rule.final]
    assert all(0.0 <= t <= 1.01 for table in tables for t in table.values())
    # fitted to beat the peer on both axes on the training users (the held-out figures: docs/quality.md)
    for fitted in packaged.info["training"].values():
        assert fitted["saved_words"] > fitted["peer_saved_words"]
        assert fitted["wrong_states"] <= fitted["peer_wrong_states"] + packaged.info["bar"]["tolerance"]


def states(cmd: str, lines: dict[int, list[tuple[str, float, float]]], early: str | None = None) -> dict:
    """A typed-out command as fit_ghost collects it: per prefix, the candidates best first."""
    return {
        "user": "u", "cmd": cmd,
        "states": [{"early": [early, 0.9] if early else None, "cands": [list(c) for c in lines.get(i, [])]}
                   for i in range(len(cmd))],
    }  # fmt: skip


def test_the_simulated_user_takes_words_and_lines_of_what_is_drawn() -> None:
    # the empty prompt proposes the command with a wrong message: "git ", "commit ", "-m " taken
    wrong = ("git commit -m fix", 0.2, -2.0)
    item = states("git commit -m wip", {i: [wrong] for i in range(15)})  # while it extends the line
    drawn_always = simulate([item], GhostRule.uniform(0.0))
    assert drawn_always.keys == 3 + 3 and drawn_always.chars == 17  # three words, then w, i, p typed
    never = simulate([item], GhostRule.uniform(0.5))
    assert never.keys == 17 and never.wrong == dict.fromkeys(BUCKETS, 0)
    assert drawn_always.wrong["k8"] == 1  # "w" typed past the wrong message (then it no longer fits)


def test_the_fit_draws_where_drawing_pays() -> None:
    # right lines at low confidence after one character: drawing them saves keys; wrong lines on
    # the empty prompt at the same confidence: drawing them is only noise
    items = [
        states(f"make target{i}", {0: [(f"ls -la{i}", 0.05, -3.0)], 1: [(f"make target{i}", 0.05, -3.0)]})
        for i in range(20)
    ]
    rule, outcome = fit(items, 0.3)
    assert rule.final["k1"] <= 0.05 < rule.final["empty"]
    assert outcome.saved == pytest.approx(1 - 2 * 20 / sum(len(i["cmd"]) for i in items))
