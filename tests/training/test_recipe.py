"""`python -m calmd.training.recipe` on a small data folder of the shared layout: an interrupted run
continued with --resume writes the same model as an uninterrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calmd.arguments import run_tool
from calmd.training import recipe, train

pytestmark = pytest.mark.slow  # a real daemon (or training) per test: `pytest -m "not slow"` skips them

PAGE = """# {name}

> A tool.

- Do the thing:

`{name} --verbose {{{{path/to/file}}}}`

- Do the other thing:

`{name} -n {{{{count}}}} {{{{path/to/dir}}}}`
"""


def data_folder(root: Path) -> Path:
    for name in ("frob", "zork", "quux"):
        page = root / "tldr" / "common" / f"{name}.md"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(PAGE.format(name=name))
    users = root / "histories" / "users"
    users.mkdir(parents=True)
    for user in ("alice", "bob", "carol"):
        (users / f"{user}.txt").write_text("\n".join(f"make target{i} -j{i % 4}" for i in range(90)))
    return root


@pytest.fixture(autouse=True)
def few_fisher_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe's training with its Fisher estimate on 8 sequences, not 128: the estimate was half
    of these tests' CPU, and what they check (a resumed run's bytes, the corpus, the note) is the same
    whatever its size; the whole run and the resumed one estimate it on the same 8 (the seed's)."""
    real_train = train.train

    def few(cfg: Any, **kw: Any) -> Any:
        return real_train(cfg.__class__(**{**cfg.__dict__, "fisher_samples": 8}), **kw)

    monkeypatch.setattr(train, "train", few)


def test_an_interrupted_recipe_resumes_to_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = data_folder(tmp_path / "data")

    def run(name: str, *extra: str) -> Path:
        out = tmp_path / name / "model.cwgt"
        argv = ["--data", str(data), "--work", str(tmp_path / name / "work"), "--output", str(out),
                "--steps", "6", "--threads", "1", *extra]  # fmt: skip
        assert recipe.main(argv) == 0
        return out

    whole = run("whole")
    recipe_training = train.train  # few_fisher_sequences
    calls: list[int] = []

    def stopped_at_step_3(cfg: Any, **kw: Any) -> Any:
        def on_step(step: int, loss: float) -> None:
            calls.append(step)
            if not cfg.resume and step == 3:
                raise KeyboardInterrupt

        return recipe_training(cfg.__class__(**{**cfg.__dict__, "checkpoint_every": 2}), on_step=on_step)

    monkeypatch.setattr(train, "train", stopped_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run("parts")
    corpus = tmp_path / "parts" / "work" / "corpus.ctds"
    built = corpus.stat().st_mtime_ns
    assert not (tmp_path / "parts" / "model.cwgt").exists()
    parts = run("parts", "--resume")
    assert calls == [1, 2, 3, 3, 4, 5, 6]  # resumed from the checkpoint at step 2
    assert corpus.stat().st_mtime_ns == built  # the deterministic corpus is not rebuilt
    assert parts.read_bytes() == whole.read_bytes()
    # The provenance says how to rebuild it, threads included, and does not pass the resumed
    # invocation's wall time off as the run's.
    note = (parts.parent / "DEFAULT_MODEL.md").read_text()
    assert "python -m calmd.training.recipe --steps 6 --seed 0 --size nano --threads 1" in note
    assert "finished with --resume; the optimizer steps took" in note
    assert "finished with --resume" not in (whole.parent / "DEFAULT_MODEL.md").read_text()


def test_a_corpus_built_before_trains_without_the_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--corpus: what the GPU machine runs (bench/gpu.py), which has the corpus but not the data;
    --epochs and --batch-size scale the run, and the note says so."""
    data = data_folder(tmp_path / "data")
    corpus = tmp_path / "carried" / "corpus.ctds"
    corpus.parent.mkdir()
    counts = recipe.write_corpus(data, corpus)
    assert counts["users"] == 3 and counts["sequences"] > 0
    out = tmp_path / "model" / "model.cwgt"
    argv = ["--corpus", str(corpus), "--data", str(tmp_path / "nowhere"), "--work", str(tmp_path / "work"),
            "--output", str(out), "--steps", "4", "--epochs", "3", "--batch-size", "8",
            "--threads", "1"]  # fmt: skip
    assert recipe.main(argv) == 0
    assert "corpus: reusing" in capsys.readouterr().out
    assert not (tmp_path / "work" / "corpus.ctds").exists()
    note = (out.parent / "DEFAULT_MODEL.md").read_text()
    assert "--steps 4 --seed 0 --size nano --threads 1 --epochs 3 --batch-size 8`" in note
    assert f"Public shell histories of {counts['trained_users']} of the 3 users" in note
    assert "4 steps" in note
    corpus.with_suffix(".json").unlink()
    assert run_tool(recipe.PROG, lambda: recipe.main([*argv, "--output", str(tmp_path / "other.cwgt")])) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"{recipe.PROG}: error: --corpus {corpus}: needs the corpus and its stamp")
    assert not (tmp_path / "other.cwgt").exists()
