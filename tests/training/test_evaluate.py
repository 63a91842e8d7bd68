"""`calm evaluate`: loss, bits per byte, greedy exact match (batched decoding against a naive
loop), the stop-condition semantics, the Python API and the CLI's output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from calmd.cli import calm_main
from calmd.formats.ctds import CtdsReader, pad_sequences
from calmd.formats.tokenizer import BYTE_TOKENS, Special, StopMatcher, atn_position, parse_stop_conditions
from calmd.model.checkpoint import load_model
from calmd.model.mamba import CalmModel, ModelConfig
from calmd.training.evaluate import (
    compare,
    evaluate,
    expected_completion,
    greedy_matches,
    load_sequences,
    sequence_loss,
)
from calmd.training.train import TrainConfig, train
from tests.support.builders import TASK_A, TASK_B, dataset, sequences, tiny_model_file

STOPS = parse_stop_conditions("| ; && ||")
# A task whose commands hold stop conditions, so that "up to a stop condition" matters.
TASK_C = [("/w", "make && make install"), ("/w", "cat log | grep err"), ("/w", "cd ..; ls")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(untrained model, trained model, dataset): a tiny model that learned most of the tasks."""
    tmp = tmp_path_factory.mktemp("eval")
    data = dataset(tmp / "d.ctds", TASK_A + TASK_B + TASK_C, n=80, seed=4)
    start = tiny_model_file(tmp / "start.cwgt")
    out = tmp / "trained.cwgt"
    cfg = TrainConfig(model=str(start), dataset=str(data), output=str(out), epochs=5, lr=1e-2, batch_size=8,
                      threads=1, fisher_samples=0, quiet=True)  # fmt: skip
    train(cfg)
    return start, out, data


def naive_greedy(model: CalmModel, seq: np.ndarray, k: int, raw: bool) -> bool:
    """The reference: a full forward pass per generated token, no states, no batching."""
    atn = int(np.flatnonzero(seq == Special.ATN)[0])
    cmd_start = atn + 2
    end = int(np.flatnonzero(seq == Special.EOS)[0])
    cmd = seq[cmd_start:end].tolist()
    expected = expected_completion(cmd, k, STOPS, raw=raw)
    tokens = seq[: cmd_start + k].astype(np.int64).tolist()
    matcher = StopMatcher(STOPS, raw=raw)
    longest = 0 if raw else 2
    allowed = torch.full((model.cfg.vocab_size,), -math.inf)
    allowed[:BYTE_TOKENS] = 0.0
    allowed[Special.EOS] = 0.0
    for _ in range(len(expected) + longest + 1):
        with torch.no_grad():
            tok = int((model(torch.tensor([tokens]))[0, -1] + allowed).argmax())
        tokens.append(tok)
        if matcher.feed(tok):
            return bytes(matcher.output) == expected
    return False


def test_expected_completion_applies_stop_conditions_to_the_rest_only() -> None:
    cmd = list(b"make -C src && make install")
    assert expected_completion(cmd, 0, STOPS) == b"make -C src "
    assert expected_completion(cmd, 4, STOPS) == b" -C src "
    assert expected_completion(cmd, 13, STOPS) == b"& make install"  # the first & was typed
    assert expected_completion(cmd, 0, STOPS, raw=True) == b"make -C src && make install"
    assert expected_completion(list(b"ls"), 2, STOPS) == b""  # nothing left: EOS at once


@pytest.mark.parametrize("raw", [False, True])
def test_batched_greedy_decoding_equals_a_naive_loop(trained: tuple[Path, Path, Path], raw: bool) -> None:
    _, model_path, data = trained
    model = load_model(model_path).model
    with CtdsReader(data) as reader:
        seqs = load_sequences(reader, limit=12, seed=1)
    got = greedy_matches(model, seqs, stops=STOPS, raw=raw, group=5)
    want = [(i, k, naive_greedy(model, s, k, raw)) for i, s in enumerate(seqs) for k in (0, 1, 2, 4, 8)
            if k <= len(s) - int(np.flatnonzero(s == Special.ATN)[0]) - 3]  # fmt: skip
    assert sorted(got) == sorted(want)
    flags = [ok for _, _, ok in got]
    assert any(flags) and not all(flags)  # a meaningful comparison: hits and misses


def test_loss_and_bits_per_byte(trained: tuple[Path, Path, Path]) -> None:
    start, model_path, data = trained
    model = load_model(model_path).model
    with CtdsReader(data) as reader:
        seqs = load_sequences(reader)
    result = evaluate(model, seqs, stops=STOPS)
    nll, tokens, cmd_bytes = sequence_loss(model, seqs, batch_size=1)  # no padding at all
    assert result.tokens == tokens and result.command_bytes == cmd_bytes
    assert result.loss == pytest.approx(nll / tokens, rel=1e-5)  # padding changed nothing
    assert result.bits_per_byte == pytest.approx(nll / math.log(2) / cmd_bytes, rel=1e-5)
    assert cmd_bytes == sum(int(np.flatnonzero(s == Special.EOS)[0]) - int(np.flatnonzero(s == 259)[0]) - 2
                            for s in seqs)  # fmt: skip
    assert [e.k for e in result.exact] == [0, 1, 2, 4, 8]
    assert result.accuracy(8) > 0.5 and result.exact[0].total == len(seqs)
    comparison = compare(load_model(start).model, model, seqs, stops=STOPS)
    assert comparison.improved and comparison.new == result
    assert comparison.old.accuracy(0) < result.accuracy(0)


def test_cli_text_and_json(trained: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, model_path, data = trained
    assert calm_main(["evaluate", "-m", str(model_path), "-d", str(data), "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "nats per supervised token" in text and "bits per byte" in text and "k=8" in text
    assert calm_main(["evaluate", "-m", str(model_path), "-d", str(data), "--limit", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sequences"] == 10 and report["dataset_sequences"] == 80
    assert set(report["exact"]) == {"0", "1", "2", "4", "8"}
    assert 0 <= report["exact"]["0"]["accuracy"] <= 1 and report["raw"] is False
    # the same sample for the same seed
    assert calm_main(["evaluate", "-m", str(model_path), "-d", str(data), "--limit", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == report


def test_cli_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = dataset(tmp_path / "d.ctds", TASK_A, n=4)
    model = tiny_model_file(tmp_path / "m.cwgt")
    short = tiny_model_file(tmp_path / "short.cwgt", cfg=ModelConfig(d_model=16, n_layers=1, l_max=16))
    for argv, message in [
        (["-m", str(tmp_path / "none.cwgt"), "-d", str(data)], "none.cwgt: model not found"),
        (["-m", str(model), "-d", str(tmp_path / "none.ctds")], "none.ctds: dataset not found"),
        (["-m", str(data), "-d", str(data)], "d.ctds: magic"),
        (["-m", str(short), "-d", str(data)], "tokens, over the model's l_max 16"),
    ]:
        assert calm_main(["evaluate", *argv]) == 1
        assert message in capsys.readouterr().err


def test_sequences_built_in_memory_work_too() -> None:
    model = CalmModel(ModelConfig(d_model=16, n_layers=1))
    seqs = sequences(TASK_B, 3)
    result = evaluate(model, seqs, ks=(0, 2))
    assert result.sequences == 3 and [e.k for e in result.exact] == [0, 2]
    # nats per supervised token over the three: the model's own batch loss of the same sequences
    tokens, mask = pad_sequences(seqs, [atn_position(s) for s in seqs])
    with torch.no_grad():
        expected = float(model.loss(torch.from_numpy(tokens), torch.from_numpy(mask)))
    assert result.loss == pytest.approx(expected, rel=1e-5)
