"""`calm train`: the loss and its mask, the CLI a user runs, errors, atomic output, EWC and DDP.

Tiny models (d_model 32, one layer) written with save_model and fine-tuned through `--model PATH`
keep every run at a second or less; `--model new` is exercised once with nano and two steps.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import stat
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from calmd.cli import calm_main
from calmd.errors import CalmError
from calmd.formats.ctds import CtdsReader, pad_sequences, write_ctds
from calmd.formats.cwgt import Metadata, read_cwgt
from calmd.formats.tokenizer import (
    DEFAULT_SHELL_STOPS,
    DEFAULT_SHELL_TEMPLATE,
    DEFAULT_SHELL_TEMPLATE_SPEC,
    build_sequence,
)
from calmd.model.checkpoint import flatten, load_model
from calmd.model.loss import supervised_nll
from calmd.model.mamba import SIZES, CalmModel, ModelConfig
from calmd.training.commands import TRAIN_FLAGS
from calmd.training.evaluate import sequence_loss
from calmd.training.plot import check_available, write_loss_plot
from calmd.training.train import TrainConfig, train
from tests.support.builders import TASK_A, TASK_B, TINY, dataset, sequences, tiny_model_file
from tests.support.waiting import HANG_S

BIN = Path(sys.executable).parent


def dataset_loss(model_path: Path, data: Path) -> float:
    model = load_model(model_path).model
    with CtdsReader(data) as reader:
        seqs = [reader.sequence(i) for i in range(reader.count())]
    nll, tokens, _ = sequence_loss(model, seqs)
    return nll / tokens


def calm(*argv: str) -> int:
    return calm_main(list(argv))


QUICK = ("--threads", "1", "--fisher-samples", "8", "-q")


# --------------------------------------------------------------------------- the loss


def test_loss_covers_only_tokens_after_atn_and_ignores_padding() -> None:
    model = CalmModel(TINY)
    model.init_weights(3)
    seqs = sequences(TASK_A + TASK_B, 5, seed=1)
    atns = [int(np.flatnonzero(s == 259)[0]) for s in seqs]
    tokens, mask = map(torch.from_numpy, pad_sequences(seqs, atns))
    wide = map(torch.from_numpy, pad_sequences(seqs, atns, pad_to=tokens.shape[1] + 37))
    with torch.no_grad():
        batched = float(supervised_nll(model, tokens, mask))
        padded = float(supervised_nll(model, *wide))
        # by hand: one sequence at a time, no padding, cross entropy of the command part only
        manual = 0.0
        for seq, atn in zip(seqs, atns, strict=True):
            t = torch.from_numpy(seq.astype(np.int64))
            logp = torch.log_softmax(model(t[None, :-1])[0], -1)  # (L-1, V)
            manual -= float(sum(logp[p - 1, t[p]] for p in range(atn + 1, len(seq))))
    assert batched == pytest.approx(manual, rel=1e-5)
    assert padded == pytest.approx(manual, rel=1e-5)
    assert int(mask.sum()) == sum(len(s) - a - 1 for s, a in zip(seqs, atns, strict=True))


def test_every_train_config_field_has_one_flag() -> None:
    from dataclasses import fields

    assert list(TRAIN_FLAGS) == [f.name for f in fields(TrainConfig)]


# --------------------------------------------------------------------------- the CLI


def test_training_lowers_the_loss_and_keeps_the_metadata(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = dataset(tmp_path / "a.ctds", TASK_A + TASK_B, n=60)
    meta = Metadata("shell", DEFAULT_SHELL_TEMPLATE_SPEC, "|")  # not the default stops: must survive
    start = tiny_model_file(tmp_path / "start.cwgt", meta=meta)
    out = tmp_path / "out.cwgt"
    argv = ["train", "--model", str(start), "-d", str(data), "-o", str(out), "--lr", "3e-3"]
    assert calm(*argv, "--epochs", "4", "--batch-size", "8", "--threads", "1", "--fisher-samples", "8") == 0
    printed = capsys.readouterr().out
    assert "tokens/s" in printed and "validation" in printed and f"wrote {out}" in printed
    before, after = dataset_loss(start, data), dataset_loss(out, data)
    assert after < 0.7 * before, (before, after)
    loaded = load_model(out, with_ewc=True)
    assert loaded.metadata == meta
    assert loaded.fisher is not None and loaded.anchor is not None
    assert np.array_equal(loaded.anchor, flatten(loaded.model))  # the anchor is the trained weights
    assert (loaded.fisher >= 0).all() and loaded.fisher.max() > 0
    assert start.read_bytes() != out.read_bytes() and load_model(start).metadata == meta


def test_new_model_gets_the_shell_metadata_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = dataset(tmp_path / "a.ctds", TASK_A, n=8)
    out = tmp_path / "new.cwgt"
    argv = ["train", "--model", "new", "--size", "nano", "-d", str(data), "-o", str(out), "--max-steps", "2"]
    assert calm(*argv, "--batch-size", "4", *QUICK) == 0
    assert capsys.readouterr().out == ""  # --quiet
    f = read_cwgt(out)
    assert f.metadata == Metadata("shell", DEFAULT_SHELL_TEMPLATE_SPEC, DEFAULT_SHELL_STOPS)
    assert f.header.has_ewc and f.header.d_model == SIZES["nano"].d_model
    before = out.read_bytes()
    assert calm(*argv, *QUICK) == 1
    assert "exists; pass --force" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert calm(*argv, "--seed", "1", "--force", *QUICK) == 0
    assert out.read_bytes() != before


def test_optimizers_and_schedules_run(tmp_path: Path) -> None:
    data = dataset(tmp_path / "a.ctds", TASK_A, n=12)
    start = tiny_model_file(tmp_path / "start.cwgt")
    for i, opts in enumerate(
        [("--optimizer", "sgd", "--lr", "0.1"), ("--optimizer", "adam", "--lr-schedule", "cosine")]
    ):
        out = tmp_path / f"o{i}.cwgt"
        assert (
            calm("train", "-m", str(start), "-d", str(data), "-o", str(out), *opts, "--epochs", "1", *QUICK)
            == 0
        )
        assert not np.array_equal(flatten(load_model(out).model), flatten(load_model(start).model))


def test_bad_inputs_name_the_file_and_leave_the_output_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good_data = dataset(tmp_path / "a.ctds", TASK_A, n=8)
    model = tiny_model_file(tmp_path / "m.cwgt")
    out = tiny_model_file(tmp_path / "out.cwgt", seed=5)
    original = out.read_bytes()
    corrupt = tmp_path / "corrupt.ctds"
    corrupt.write_bytes(b"CTDX" + good_data.read_bytes()[4:])
    broken_model = tmp_path / "broken.cwgt"
    broken_model.write_bytes(model.read_bytes()[:-10])
    short = tiny_model_file(tmp_path / "short.cwgt", cfg=ModelConfig(d_model=32, n_layers=1, l_max=16))
    cases = [
        (model, tmp_path / "missing.ctds", "missing.ctds: dataset not found"),
        (model, corrupt, "corrupt.ctds: magic: expected b'CTDS'"),
        (tmp_path / "nope.cwgt", good_data, "nope.cwgt: model not found"),
        (broken_model, good_data, "broken.cwgt: param_count"),
        (short, good_data, "over the model's l_max 16"),
    ]
    for model_path, data_path, message in cases:
        assert calm("train", "-m", str(model_path), "-d", str(data_path), "-o", str(out), *QUICK) == 1
        err = capsys.readouterr().err
        assert message in err, err
        assert out.read_bytes() == original
    with pytest.raises(SystemExit) as usage:  # checked before anything runs, as a usage error
        calm("train", "-m", str(model), "-d", str(good_data), "--epochs", "0")
    assert usage.value.code == 2
    assert "argument --epochs: 0 is out of range: give 1 to 100000" in capsys.readouterr().err


def test_an_interrupted_run_leaves_the_output_intact(tmp_path: Path) -> None:
    data = dataset(tmp_path / "a.ctds", TASK_A, n=40)
    out = tiny_model_file(tmp_path / "out.cwgt")
    original = out.read_bytes()

    def interrupt(step: int, loss: float) -> None:
        if step == 3:
            raise KeyboardInterrupt

    cfg = TrainConfig(model=str(out), dataset=str(data), batch_size=4, threads=1, quiet=True)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=interrupt)
    assert out.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ctds", "out.cwgt"]  # no temp file left


def test_a_run_resumed_from_its_checkpoint_gives_the_same_model(tmp_path: Path) -> None:
    """Stopped at step 5 of 11 (past the epoch boundary at 5, between checkpoints 3 and 6), then
    resumed: the same weights, losses and validation losses as one uninterrupted run."""
    data = dataset(tmp_path / "a.ctds", TASK_A + TASK_B, n=40)
    start = tiny_model_file(tmp_path / "start.cwgt")

    def config(name: str, **kw: object) -> TrainConfig:
        return TrainConfig(model=str(start), dataset=str(data), output=str(tmp_path / f"{name}.cwgt"),
                           batch_size=8, epochs=3, max_steps=11, lr=3e-3, lr_schedule="cosine", threads=1,
                           fisher_samples=4, val_fraction=0.1, quiet=True,
                           checkpoint=str(tmp_path / f"{name}.ckpt"), checkpoint_every=3, **kw)  # type: ignore[arg-type]  # fmt: skip

    whole = train(config("whole"))

    def stop_at_5(step: int, loss: float) -> None:
        if step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config("parts"), on_step=stop_at_5)
    assert not (tmp_path / "parts.cwgt").exists()
    seen: list[int] = []
    resumed = train(config("parts", resume=True), on_step=lambda step, loss: seen.append(step))
    assert seen == [4, 5, 6, 7, 8, 9, 10, 11]  # from the checkpoint at step 3
    assert resumed.losses == whole.losses and resumed.val_losses == whole.val_losses
    a, b = (
        load_model(tmp_path / "whole.cwgt", with_ewc=True),
        load_model(tmp_path / "parts.cwgt", with_ewc=True),
    )
    assert np.array_equal(flatten(a.model), flatten(b.model))
    assert a.fisher is not None and b.fisher is not None and np.array_equal(a.fisher, b.fisher)
    assert stat.S_IMODE((tmp_path / "parts.ckpt").stat().st_mode) == 0o600


def test_resume_refuses_other_settings_and_broken_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = dataset(tmp_path / "a.ctds", TASK_A, n=16)
    start = tiny_model_file(tmp_path / "start.cwgt")
    ckpt, out = tmp_path / "run.ckpt", tmp_path / "out.cwgt"
    argv = ["train", "-m", str(start), "-d", str(data), "-o", str(out), "--checkpoint", str(ckpt)]
    assert calm(*argv, "--max-steps", "2", "--batch-size", "4", *QUICK) == 0 and ckpt.exists()
    assert calm(*argv, "--max-steps", "2", "--batch-size", "8", "--resume", *QUICK) == 1
    assert "saved by a run with batch size 4, this run has 8" in capsys.readouterr().err
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    assert calm(*argv, "--max-steps", "2", "--batch-size", "4", "--resume", *QUICK) == 1
    assert f"{ckpt}: cannot resume from it" in capsys.readouterr().err
    assert calm(*argv[:-2], "--resume", *QUICK) == 1
    assert "--resume needs --checkpoint" in capsys.readouterr().err


def test_bfloat16_autocast_trains_near_float32_and_resumes_only_in_bfloat16(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--precision bf16 (autocast: the products in bfloat16, the scan and the loss in float32)
    follows the float32 run closely without being it; its checkpoint is not continued in float32.
    (tests/model/test_cuda.py holds the same on a GPU.)"""
    data = dataset(tmp_path / "a.ctds", TASK_A + TASK_B, n=24)
    start = tiny_model_file(tmp_path / "start.cwgt")

    def losses(precision: str) -> np.ndarray:
        cfg = TrainConfig(model=str(start), dataset=str(data), output=str(tmp_path / f"{precision}.cwgt"),
                          batch_size=8, epochs=4, lr=3e-3, threads=1, fisher_samples=4, val_fraction=0,
                          precision=precision, quiet=True)  # fmt: skip
        return np.array(train(cfg).losses)

    fp32, bf16 = losses("fp32"), losses("bf16")
    assert len(bf16) == len(fp32) == 12 and np.isfinite(bf16).all()
    assert not np.array_equal(bf16, fp32)  # autocast reached the products
    assert np.abs(bf16 - fp32).max() < 0.05
    assert bf16[-1] < bf16[0]
    ckpt, out = tmp_path / "run.ckpt", tmp_path / "out.cwgt"
    argv = ["train", "-m", str(start), "-d", str(data), "-o", str(out), "--checkpoint", str(ckpt),
            "--max-steps", "2"]  # fmt: skip
    assert calm(*argv, "--precision", "bf16", *QUICK) == 0
    assert calm(*argv, "--resume", *QUICK) == 1
    assert "saved by a run with precision bf16, this run has fp32" in capsys.readouterr().err
    assert calm(*argv, "--precision", "bf16", "--resume", *QUICK) == 0
    # a checkpoint saved before --precision existed names none: it was float32, and resumes so
    assert calm(*argv, *QUICK) == 0
    blob = torch.load(ckpt, weights_only=True)
    del blob["key"]["precision"]
    torch.save(blob, ckpt)
    assert calm(*argv, "--resume", *QUICK) == 0


@pytest.mark.slow  # seconds of CPU: the whole suite runs it, not the quick loop
def test_calm_init_then_calm_train_fits_a_few_commands(tmp_path: Path) -> None:
    """The specification's workflow: a file from `calm init` holds untrained weights and is trained
    at a new model's learning rate (1e-3), not fine-tuned at 1e-4 (which fits nothing in 40 steps)."""
    model = tmp_path / "m.cwgt"
    assert calm("init", "-o", str(model)) == 0
    commands = ["git status", "make test", "docker compose up -d"]
    data = write_ctds(tmp_path / "t.ctds", [build_sequence(DEFAULT_SHELL_TEMPLATE, {"cwd": "/home/u/proj",
                      "input": c}, training=True) for c in commands])  # fmt: skip
    assert calm("train", "-m", str(model), "-d", str(data), "--epochs", "40", *QUICK) == 0
    from calmd.model.generate import Generator

    gen = Generator(load_model(model), trace=False)
    for typed, expected in [("git", "git status"), ("mak", "make test"), ("dock", "docker compose up -d")]:
        best = next(iter(gen.candidates({"cwd": "/home/u/proj", "input": typed}, 1)))
        assert best.text == expected, (typed, best.text)


def test_lr_schedules() -> None:
    from calmd.training.train import lr_at

    constant = TrainConfig(lr_schedule="constant")
    assert [lr_at(constant, 0.01, s, 100) for s in (0, 50, 99)] == [0.01, 0.01, 0.01]
    cosine = TrainConfig(lr_schedule="cosine")
    lrs = [lr_at(cosine, 0.01, s, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(0.005) and lrs[1] == pytest.approx(0.01)  # 2% warm-up: 2 steps
    assert all(a >= b for a, b in itertools.pairwise(lrs[1:]))  # then it only falls
    assert lrs[50] == pytest.approx(0.01 * 0.5 * (1 + math.cos(math.pi * 48 / 98)))
    assert lrs[-1] < 1e-5 and lr_at(cosine, 0.01, 100, 100) == pytest.approx(0.0)


@pytest.mark.slow  # seconds of CPU: the whole suite runs it, not the quick loop
def test_loss_curve_png_and_svg(tmp_path: Path) -> None:
    losses, val, lrs = [3.0, 2.5, 2.0, 1.2, 1.1], [(3, 1.9), (5, 1.3)], [1e-3, 2e-3, 2e-3, 1e-3, 5e-4]
    png = tmp_path / "loss.png"
    write_loss_plot(png, losses, val, lrs)
    raw = png.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", raw[16:24]) == (800, 450)
    svg = tmp_path / "loss.svg"
    write_loss_plot(svg, losses, val, lrs)
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for label in ("training loss", "held-out loss", "learning rate", "step", "nats per supervised token"):
        assert label in text, label  # axis titles and the legend, as text in the SVG
    assert stat.S_IMODE(svg.stat().st_mode) == 0o600  # written as every calm file is


def test_plot_without_matplotlib_says_how_to_install_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(CalmError, match=r"pip install 'calmd\[plot\]'"):
        check_available()
    data = dataset(tmp_path / "d.ctds", TASK_A)
    start = tiny_model_file(tmp_path / "start.cwgt")
    cfg = TrainConfig(model=str(start), dataset=str(data), output=str(tmp_path / "m.cwgt"),
                      plot=str(tmp_path / "p.png"), batch_size=4, threads=1, quiet=True)  # fmt: skip
    started: list[int] = []
    with pytest.raises(CalmError, match="matplotlib"):
        train(cfg, on_step=lambda step, loss: started.append(step))
    assert started == [] and not (tmp_path / "m.cwgt").exists()  # refused before any step


# --------------------------------------------------------------------------- EWC


def test_ewc_keeps_the_first_task(tmp_path: Path) -> None:
    """Train on A, then on the disjoint B with and without EWC: with it, A's loss rises less."""
    data_a = dataset(tmp_path / "a.ctds", TASK_A, n=48, seed=1)
    data_b = dataset(tmp_path / "b.ctds", TASK_B, n=48, seed=2)
    start = tiny_model_file(tmp_path / "start.cwgt")
    model_a = tmp_path / "a.cwgt"
    common = ("--threads", "1", "-q", "--batch-size", "8", "--val-fraction", "0")
    assert calm("train", "-m", str(start), "-d", str(data_a), "-o", str(model_a), "--lr", "1e-2",
                "--epochs", "6", "--fisher-samples", "48", *common) == 0  # fmt: skip
    assert read_cwgt(model_a).header.has_ewc
    losses = {}
    for lam in ("0", "1000"):
        out = tmp_path / f"b{lam}.cwgt"
        assert calm("train", "-m", str(model_a), "-d", str(data_b), "-o", str(out), "--lr", "1e-2",
                    "--epochs", "3", "--ewc-lambda", lam, "--fisher-samples", "0", *common) == 0  # fmt: skip
        losses[lam] = (dataset_loss(out, data_a), dataset_loss(out, data_b))
    base = dataset_loss(model_a, data_a)
    rise_plain, rise_ewc = losses["0"][0] - base, losses["1000"][0] - base
    assert rise_plain > 0.5, (base, losses)  # plain fine-tuning forgets A
    assert rise_ewc < 0.5 * rise_plain, (base, losses)
    assert losses["1000"][1] < 0.3 * dataset_loss(model_a, data_b)  # and B was still learned


def test_fisher_of_a_fine_tuned_model_is_gamma_old_plus_new(tmp_path: Path) -> None:
    data = dataset(tmp_path / "a.ctds", TASK_A, n=16)
    first = tmp_path / "first.cwgt"
    assert calm("train", "-m", str(tiny_model_file(tmp_path / "s.cwgt")), "-d", str(data), "-o", str(first),
                "--epochs", "1", *QUICK) == 0  # fmt: skip
    old = load_model(first, with_ewc=True).fisher
    assert old is not None
    fishers = {}
    for gamma in ("0", "0.5"):
        out = tmp_path / f"g{gamma}.cwgt"
        assert calm("train", "-m", str(first), "-d", str(data), "-o", str(out), "--epochs", "1",
                    "--ewc-gamma", gamma, *QUICK) == 0  # fmt: skip
        fishers[gamma] = load_model(out, with_ewc=True).fisher
    new, combined = fishers["0"], fishers["0.5"]
    assert new is not None and combined is not None
    np.testing.assert_allclose(combined, 0.5 * old + new, rtol=1e-5, atol=1e-12)


# --------------------------------------------------------------------------- data parallel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_ranks_equal_one_process_with_the_same_global_batch(tmp_path: Path) -> None:
    """Each rank reads half of every global batch; DDP averages the gradients. If a rank read the
    whole batch, the same half, or normalised by its own token count, the weights would differ."""
    data = dataset(tmp_path / "a.ctds", TASK_A + TASK_B, n=30, seed=3)
    start = tiny_model_file(tmp_path / "start.cwgt")
    # plain SGD without clipping: the step is proportional to the gradient (Adam would hide its scale)
    args = ["train", "-m", str(start), "-d", str(data), "--epochs", "2", "--batch-size", "7",
            "--threads", "1", "--optimizer", "sgd", "--lr", "0.5", "--grad-clip", "0",
            "--fisher-samples", "6", "-q"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp_out = tmp_path / "ddp.cwgt"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
         str(BIN / "calm"), *args, "-o", str(ddp_out)],
        capture_output=True, text=True, env=env, timeout=HANG_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    single_out = tmp_path / "single.cwgt"
    assert calm(*args, "-o", str(single_out)) == 0
    ddp, single = load_model(ddp_out, with_ewc=True), load_model(single_out, with_ewc=True)
    moved = np.abs(flatten(single.model) - flatten(load_model(start).model)).max()
    assert moved > 1e-2  # training did change the weights
    np.testing.assert_allclose(flatten(ddp.model), flatten(single.model), atol=1e-5, rtol=0)
    assert ddp.fisher is not None and single.fisher is not None
    np.testing.assert_allclose(ddp.fisher, single.fisher, rtol=1e-3, atol=1e-9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ctds", "ddp.cwgt", "single.cwgt", "start.cwgt"]
