"""How well the model orders past lines (calmd/quality/past_order.py), and the longer history
context it is measured with: the replay's `history_frames` reaches the model and not the history
ranker, the recipe builds and fine-tunes on a corpus of longer contexts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from calmd import paths
from calmd.arguments import run_tool
from calmd.formats.ctds import CtdsReader
from calmd.formats.tokenizer import parse_sequence
from calmd.quality.fit_reranker import Collected
from calmd.quality.past_order import main, past_order
from calmd.suggest.rerank import LP_MISSING, RERANK_FEATURES
from calmd.training import recipe
from calmd.training.corpus import held_out

COL = {name: i for i, name in enumerate(RERANK_FEATURES)}
WEEK = ["vim main.c", "make", "./main", "git status", "git add main.c", "git commit -m wip", "ls -la"]


def query(*lines: dict[str, float]) -> np.ndarray:
    x = np.zeros((len(lines), len(RERANK_FEATURES)), dtype=np.float32)
    for row, values in zip(x, lines, strict=True):
        for name, value in values.items():
            row[COL[name]] = value
    return x


def collected(queries: list[tuple[np.ndarray, int, int]]) -> Collected:
    xs = [x for x, _, _ in queries]
    targets, ks = np.array([t for _, t, _ in queries]), np.array([k for _, _, k in queries])
    return Collected(np.concatenate(xs), np.array([len(x) for x in xs]), targets, ks,
                     np.zeros(len(xs), dtype=np.int64), ["u"])  # fmt: skip


def test_the_light_cap_of_history_frames_is_the_templates() -> None:
    from calmd.formats.tokenizer import MAX_FRAME_ITEMS
    from calmd.suggest.context import MAX_HISTORY_FRAMES

    assert MAX_HISTORY_FRAMES == MAX_FRAME_ITEMS  # `calm replay --history-frames` reads the light one


def test_only_the_scored_history_lines_that_hold_the_users_count() -> None:
    scored_past = {"scored": 1.0}
    rows = collected([
        # the model prefers the other past line; P_hist and the mixture the user's
        (query({**scored_past, "p_hist": 0.6, "lp": -3.0, "mixture": -0.5},
               {**scored_past, "p_hist": 0.3, "lp": -1.0, "mixture": -1.5}), 0, 0),
        # the user's line is the model's alone (no P_hist): not a past line, not counted
        (query({**scored_past, "p_hist": 0.6, "lp": -3.0}, {"scored": 1.0, "lp": -1.0}), 1, 0),
        # the line the model did not score is out of the pool, though P_hist likes it best
        (query({"p_hist": 0.9, "lp": LP_MISSING}, {**scored_past, "p_hist": 0.05, "lp": -0.5},
               {**scored_past, "p_hist": 0.04, "lp": -2.0}), 1, 1),
        (query({"p_hist": 0.9, "lp": LP_MISSING}, {**scored_past, "p_hist": 0.05, "lp": -0.5}), 0, 1),
        (query({**scored_past, "p_hist": 0.5, "lp": -0.5}), -1, 1),  # the user's line is not among them
    ])  # fmt: skip
    found = past_order(rows)
    assert found.queries == {0: 1, 1: 1}
    assert (found.share("model", 0), found.share("p_hist", 0), found.share("mixture", 0)) == (0.0, 1.0, 1.0)
    assert (found.share("model", 1), found.share("p_hist", 1)) == (1.0, 1.0)


@pytest.mark.slow
def test_more_frames_reach_the_model_and_not_the_history_ranker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert held_out("heidi") and not held_out("alice")
    users = tmp_path / "data" / "histories" / "users"
    users.mkdir(parents=True)
    for name in ("alice", "heidi"):  # a training user (the popular lines), a held-out one (measured)
        (users / f"{name}.txt").write_text("\n".join(WEEK * 12) + "\n")
    found: dict[int, Collected] = {}
    for frames in (4, 12):
        rows = tmp_path / f"rows{frames}.npz"
        argv = ["--data", str(tmp_path / "data"), "--history-frames", str(frames), "--rows", str(rows)]
        assert main(argv) == 0
        table = capsys.readouterr().out
        assert "| model |" in table and "| p_hist |" in table and "of 1 held-out users" in table
        found[frames] = Collected.load(rows)
    four, twelve = found[4], found[12]
    assert len(four.sizes) == len(twelve.sizes) > 0  # the same positions
    hist = [COL[f] for f in RERANK_FEATURES[: COL["p_hist_rank"] + 1]]
    moved = 0
    for (x4, _, k4), (x12, _, k12) in zip(four.queries(), twelve.queries(), strict=True):
        assert k4 == k12
        past = int((x4[:, COL["p_hist"]] > 0).sum())  # the history's proposals come first, by P_hist
        assert np.array_equal(x4[:past, hist], x12[:past, hist])  # the history ranker reads the last four
        both = (x4[:past, COL["scored"]] > 0) & (x12[:past, COL["scored"]] > 0)
        moved += int(np.any(np.abs(x4[:past][both, COL["lp"]] - x12[:past][both, COL["lp"]]) > 1e-3))
    assert moved > len(four.sizes) // 2  # the model saw more: its log-probabilities moved
    # a loop of seven lines: P_hist puts the next line first
    assert past_order(twelve).share("p_hist", 0) > 0.5
    with pytest.raises(SystemExit):
        main([*argv[:-2], "--history-frames", "16"])  # over the template's cap
    assert "--history-frames" in capsys.readouterr().err


@pytest.mark.slow
def test_the_recipe_fine_tunes_on_longer_contexts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    users = data / "histories" / "users"
    users.mkdir(parents=True)
    page = data / "tldr" / "common" / "frob.md"
    page.parent.mkdir(parents=True)
    page.write_text("# frob\n\n> A tool.\n\n- Do it:\n\n`frob --verbose {{path/to/file}}`\n")
    (users / "alice.txt").write_text("\n".join(WEEK * 6) + "\n")
    work, out = tmp_path / "work", tmp_path / "model" / "model.cwgt"
    argv = ["--data", str(data), "--work", str(work), "--output", str(out), "--steps", "2", "--threads", "1",
            "--from", str(paths.packaged_weights()), "--history-frames", "9", "--max-dup", "2"]  # fmt: skip
    assert recipe.main(argv) == 0
    reader = CtdsReader(work / "corpus.ctds")
    examples = [parse_sequence(reader.sequence(i)) for i in range(len(reader))]
    frames = [len(ex.fields.get("history", [])) for ex in examples]
    assert max(frames) == 9  # up to nine past commands, not the default five
    targets = Counter(ex.cmd for ex in examples if ex.fields.get("history"))
    assert set(targets) == set(WEEK) and max(targets.values()) == 2
    note = (out.parent / "DEFAULT_MODEL.md").read_text()
    assert f"--history-frames 9 --max-dup 2 --from {paths.packaged_weights()}`" in note
    assert "EWC: penalty" in note  # a fine-tune, against the packaged model's Fisher
    code = run_tool(recipe.PROG, lambda: recipe.main([*argv[:-4], "--resume"]))
    assert code == 1
    assert "the corpus was built with --history-frames 9 --max-dup 2" in capsys.readouterr().err
