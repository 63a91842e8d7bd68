"""Confidence: the calibration's fit, its file, and the command that rebuilds it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calmd.errors import FormatError
from calmd.quality.fit_calibration import fit_head, isotonic, main, reliability
from calmd.suggest.calibration import (
    EARLY_FEATURES,
    FEATURES,
    Calibrator,
    candidate_row,
    packaged_calibrator,
)
from calmd.training.corpus import held_out


def test_fit_head_gives_probabilities_that_mean_what_they_say() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, 2))
    truth = 1 / (1 + np.exp(-(2.0 * x[:, 0] - 1.0)))  # only the first signal matters
    y = (rng.random(20000) < truth).astype(np.float64)
    head = fit_head(("a", "b"), x, y)
    assert abs(head.w[0]) > 10 * abs(head.w[1])
    test = rng.normal(size=(20000, 2))
    p = head.probabilities(test)
    right = (rng.random(20000) < 1 / (1 + np.exp(-(2.0 * test[:, 0] - 1.0)))).astype(np.float64)
    for b in reliability(p, right):
        if b["n"] > 500:
            assert abs(b["confidence"] - b["right"]) < 0.05, b


def test_isotonic_map_is_monotonic_and_fixes_a_bent_scale() -> None:
    rng = np.random.default_rng(1)
    p = rng.random(50000)
    y = (rng.random(50000) < p**2).astype(np.float64)  # the score says p, the truth is p**2
    kx, ky = isotonic(p, y)
    assert kx[0] == 0.0 and kx[-1] == 1.0 and (np.diff(kx) > 0).all() and (np.diff(ky) >= 0).all()
    assert np.interp(0.5, kx, ky) == pytest.approx(0.25, abs=0.03)
    assert np.interp(0.9, kx, ky) == pytest.approx(0.81, abs=0.03)


def test_calibrator_file_round_trip_and_errors(tmp_path: Path) -> None:
    cal = packaged_calibrator()
    again = Calibrator.from_json(json.loads(json.dumps(cal.to_json())))
    row = candidate_row(log_p=-1.0, p_hist=0.4, top_p_hist=0.4, model_only=False, carry=False, rank=0, k=3,
                        p_end=0.01, input_run_before=False, count=5, history=300)  # fmt: skip
    assert len(row) == len(FEATURES)
    assert again.candidate.probability(row) == pytest.approx(cal.candidate.probability(row), abs=1e-4)
    data = cal.to_json()
    with pytest.raises(FormatError, match="not a calm-calibration"):
        Calibrator.from_json({**data, "format": "x"})
    with pytest.raises(FormatError, match="features differ"):
        Calibrator.from_json({**data, "early": {**data["early"], "features": ["p_hist"]}})
    with pytest.raises(FormatError, match="knots"):
        Calibrator.from_json({**data, "candidate": {**data["candidate"], "knots_y": [0.5, 0.1]}})
    with pytest.raises(FormatError, match="finite"):
        Calibrator.from_json(
            {**data, "candidate": {**data["candidate"], "w": [float("nan")] * len(FEATURES)}}
        )
    bad = tmp_path / "c.json"
    bad.write_text("[")
    with pytest.raises(FormatError, match="cannot read"):
        Calibrator.load(bad)


def test_packaged_calibration_was_fitted_on_the_training_users_only() -> None:
    cal = packaged_calibrator()
    assert cal.info["training_users"] == 89 and cal.info["candidate_rows"] > 50000
    assert len(cal.early.w) == len(EARLY_FEATURES)
    # more history probability, more confidence; a model-only guess on an empty prompt, little
    sure = candidate_row(log_p=-0.2, p_hist=0.9, top_p_hist=0.9, model_only=False, carry=False, rank=0, k=4,
                         p_end=0.0, input_run_before=False, count=30, history=2000)  # fmt: skip
    guess = candidate_row(log_p=-6.0, p_hist=0.0, top_p_hist=0.1, model_only=True, carry=False, rank=0, k=0,
                          p_end=0.0, input_run_before=False, count=0, history=2000)  # fmt: skip
    assert cal.candidate.probability(sure) > 0.7 > 0.1 > cal.candidate.probability(guess)


def test_the_fitting_command_writes_a_loadable_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    users = tmp_path / "data" / "histories" / "users"
    users.mkdir(parents=True)
    names = [f"user{i}" for i in range(40) if not held_out(f"user{i}")][:2]
    loop = ["vim main.c", "make", "./main", "git status", "ls", "git diff", "git commit -m wip"]
    for i, name in enumerate(names):
        (users / f"{name}.txt").write_text("\n".join((loop * 20)[i:]) + "\n")
    out = tmp_path / "calibration.json"
    assert main(["--data", str(tmp_path / "data"), "--output", str(out), "--positions", "4"]) == 0
    cal = Calibrator.load(out)
    assert cal.info["training_users"] == 2 and cal.info["candidate_rows"] > 0
    assert "wrote" in capsys.readouterr().out
