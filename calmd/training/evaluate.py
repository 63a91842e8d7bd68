"""Evaluation: `calm evaluate`, and the API the daemon's background trainer uses to compare models.

Metrics, on the supervised tokens of each sequence (everything after ATN: CMD, the command's
bytes, EOS):
    loss            mean negative log-likelihood per supervised token, in nats;
    bits_per_byte   the total NLL in bits divided by the number of command bytes (so the cost
                    of the CMD marker and of EOS is charged to the bytes, as usual for byte models);
    exact match@k   the context, CMD and the first k bytes of the command are given; greedy
                    decoding (argmax at every step) continues until EOS, a stop condition of the
                    model's metadata (`| ; && ||`: a suggestion is one pipeline stage) or a length
                    cap. It counts as a match when its bytes equal what the stop conditions leave
                    of the true rest of the command (with `raw=True`: the whole rest). Sequences
                    whose command is shorter than k are left out of that k's count.

Greedy decoding uses the recurrent API: one prefill of the context per sequence, the states for
the k-byte prefixes by continuing it, then all (sequence, k) rows of a group stepped as one batch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from calmd.errors import CalmError
from calmd.formats.ctds import CtdsReader, pad_sequences
from calmd.formats.tokenizer import (
    BYTE_TOKENS,
    Special,
    StopConditions,
    StopMatcher,
    apply_stop_conditions,
    atn_position,
)
from calmd.model.checkpoint import load_model
from calmd.model.loss import supervised_nll
from calmd.model.mamba import CalmModel, InferenceState

KS = (0, 1, 2, 4, 8)


@dataclass(frozen=True)
class ExactMatch:
    k: int  # command bytes given
    correct: int
    total: int  # sequences whose command has at least k bytes

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")


@dataclass(frozen=True)
class EvalResult:
    sequences: int
    tokens: int  # supervised tokens
    command_bytes: int
    loss: float  # nats per supervised token
    bits_per_byte: float
    exact: tuple[ExactMatch, ...]  # one per k, in increasing k
    raw: bool  # exact match ignored the stop conditions

    def accuracy(self, k: int) -> float:
        return next(e.accuracy for e in self.exact if e.k == k)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exact"] = {
            str(e.k): {"correct": e.correct, "total": e.total, "accuracy": e.accuracy if e.total else None}
            for e in self.exact
        }
        return d


@dataclass(frozen=True)
class Comparison:
    """Two models on the same held-out sequences (the daemon keeps `new` only if it is better)."""

    old: EvalResult
    new: EvalResult

    @property
    def improved(self) -> bool:
        return self.new.loss < self.old.loss


# --------------------------------------------------------------------------- data


def _command_start(seq: npt.NDArray[np.integer], atn: int) -> int:
    """Index of the command's first byte: after ATN and, in the shell template, the CMD marker."""
    return atn + 2 if atn + 1 < len(seq) and seq[atn + 1] == Special.CMD else atn + 1


def _command_bytes(seq: npt.NDArray[np.integer], start: int) -> list[int]:
    out = []
    for tok in seq[start:].tolist():
        if tok >= BYTE_TOKENS:
            break
        out.append(tok)
    return out


def load_sequences(reader: CtdsReader, *, limit: int = 0, seed: int = 0) -> list[npt.NDArray[np.uint16]]:
    """All sequences of a CTDS file in file order, or a seeded random sample of `limit`."""
    rows = np.arange(reader.count())
    if limit and limit < rows.size:
        rows = np.sort(np.random.default_rng(seed).choice(rows.size, size=limit, replace=False))
    return [reader.sequence(int(r)) for r in rows]


# --------------------------------------------------------------------------- metrics


@torch.no_grad()
def sequence_loss(
    model: CalmModel, seqs: Sequence[npt.NDArray[np.integer]], *, batch_size: int = 32
) -> tuple[float, int, int]:
    """(summed NLL in nats, supervised tokens, command bytes) over `seqs`."""
    device = next(model.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # similar lengths: less padding
    total, tokens, cmd_bytes = 0.0, 0, 0
    for start in range(0, len(order), batch_size):
        batch = [seqs[i] for i in order[start : start + batch_size]]
        atns = [atn_position(s) for s in batch]
        toks, mask = map(torch.from_numpy, pad_sequences(batch, atns))
        total += float(supervised_nll(model, toks.to(device), mask.to(device)).double())
        tokens += int(mask[:, 1:].sum())
        cmd_bytes += sum(
            len(_command_bytes(s, _command_start(s, a))) for s, a in zip(batch, atns, strict=True)
        )
    return total, tokens, cmd_bytes


def expected_completion(cmd: Sequence[int], k: int, stops: StopConditions, *, raw: bool = False) -> bytes:
    """What a perfect suggestion after the first k bytes of `cmd` holds: the rest of the command,
    cut at the first stop condition (a pattern in the typed part does not count)."""
    return apply_stop_conditions([*cmd[k:], int(Special.EOS)], stops, raw=raw)


@dataclass
class _Row:
    """One greedy completion in flight: sequence, k, the expected bytes and the matcher."""

    index: int  # of the sequence
    k: int
    expected: bytes
    matcher: StopMatcher
    limit: int  # generated tokens allowed
    generated: int = 0
    done: bool = False
    correct: bool = False


def _cat_states(states: Sequence[InferenceState]) -> InferenceState:
    return InferenceState(torch.cat([s.conv for s in states], 1), torch.cat([s.ssm for s in states], 1), 0)


@torch.no_grad()
def greedy_matches(
    model: CalmModel,
    seqs: Sequence[npt.NDArray[np.integer]],
    *,
    ks: Sequence[int] = KS,
    stops: StopConditions | None = None,
    raw: bool = False,
    group: int = 32,
) -> list[tuple[int, int, bool]]:
    """(sequence index, k, exact match) of the greedy completion after k command bytes, for every
    sequence and every k up to its command's length. Rows of `group` sequences decode together;
    a row stops early once its settled output (bytes no stop pattern can roll back any more)
    leaves the expected bytes."""
    device = next(model.parameters()).device
    stops = stops or StopConditions()
    longest = max((len(p) for p in stops.patterns), default=0) if not raw else 0
    ks = sorted(set(ks))
    forbidden = torch.ones(model.cfg.vocab_size, dtype=torch.bool, device=device)
    forbidden[:BYTE_TOKENS] = False
    forbidden[Special.EOS] = False
    results: list[tuple[int, int, bool]] = []
    for g0 in range(0, len(seqs), group):
        rows: list[_Row] = []
        states: list[InferenceState] = []
        first: list[torch.Tensor] = []
        for index in range(g0, min(g0 + group, len(seqs))):
            seq = np.asarray(seqs[index], dtype=np.int64)
            cmd_start = _command_start(seq, atn_position(seq))
            cmd = _command_bytes(seq, cmd_start)
            logits, state = model.prefill(torch.from_numpy(seq[:cmd_start])[None].to(device))
            given = 0
            for k in ks:
                if k > len(cmd):
                    break
                if k > given:
                    logits, state = model.prefill(torch.tensor([cmd[given:k]], device=device), state)
                    given = k
                expected = expected_completion(cmd, k, stops, raw=raw)
                rows.append(
                    _Row(index, k, expected, StopMatcher(stops, raw=raw), len(expected) + longest + 1)
                )
                states.append(state)
                first.append(logits[0, -1])
        if not rows:
            continue
        state = _cat_states(states)
        logits = torch.stack(first)  # (rows, V)
        active = list(range(len(rows)))
        while active:
            # inside a command only bytes and EOS may follow (as in calmd.model.generate)
            next_tokens = logits.masked_fill(forbidden, float("-inf")).argmax(-1)  # (rows,)
            still: list[int] = []
            keep: list[int] = []
            for pos, (i, tok) in enumerate(zip(active, next_tokens.tolist(), strict=True)):
                row = rows[i]
                row.generated += 1
                stopped = row.matcher.feed(int(tok))
                out = bytes(row.matcher.output)
                settled = out[: max(len(out) - longest, 0)]  # bytes no stop pattern can roll back
                if stopped:
                    row.done, row.correct = True, out == row.expected
                elif row.generated >= row.limit or not row.expected.startswith(settled):
                    row.done = True
                else:
                    still.append(i)
                    keep.append(pos)
            if not still:
                break
            if len(keep) < len(active):
                state = state.select(keep)
                next_tokens = next_tokens[keep]
            logits, state = model.step(state, next_tokens)
            active = still
        results.extend((row.index, row.k, row.correct) for row in rows)
    return results


def greedy_exact_match(
    model: CalmModel,
    seqs: Sequence[npt.NDArray[np.integer]],
    *,
    ks: Sequence[int] = KS,
    stops: StopConditions | None = None,
    raw: bool = False,
    group: int = 32,
) -> tuple[ExactMatch, ...]:
    """Exact-match counts of greedy completions after k command bytes, for each k."""
    results = greedy_matches(model, seqs, ks=ks, stops=stops, raw=raw, group=group)
    return tuple(
        ExactMatch(k, sum(ok for _, kk, ok in results if kk == k), sum(kk == k for _, kk, _ in results))
        for k in sorted(set(ks))
    )


def evaluate(
    model: CalmModel,
    seqs: Sequence[npt.NDArray[np.integer]],
    *,
    stops: StopConditions | None = None,
    raw: bool = False,
    ks: Sequence[int] = KS,
    batch_size: int = 32,
) -> EvalResult:
    """Loss, bits per byte and exact match@k of `model` on token sequences (each with one ATN,
    e.g. from `load_sequences` or built with `build_sequence(..., training=True)`). `stops`: the
    model's stop conditions (`loaded.metadata.stop_conditions()`)."""
    if not seqs:
        raise CalmError("nothing to evaluate: no sequences")
    was_training = model.training
    model.eval()
    try:
        nll, tokens, cmd_bytes = sequence_loss(model, seqs, batch_size=batch_size)
        exact = greedy_exact_match(model, seqs, ks=ks, stops=stops, raw=raw, group=batch_size)
    finally:
        model.train(was_training)
    return EvalResult(
        sequences=len(seqs),
        tokens=tokens,
        command_bytes=cmd_bytes,
        loss=nll / max(tokens, 1),
        bits_per_byte=nll / math.log(2) / max(cmd_bytes, 1),
        exact=exact,
        raw=raw,
    )


def compare(
    old: CalmModel, new: CalmModel, seqs: Sequence[npt.NDArray[np.integer]], **kwargs: Any
) -> Comparison:
    """Both models on the same sequences (keyword arguments as for `evaluate`)."""
    return Comparison(evaluate(old, seqs, **kwargs), evaluate(new, seqs, **kwargs))


def evaluate_files(
    model_path: str | os.PathLike[str],
    dataset_path: str | os.PathLike[str],
    *,
    limit: int = 0,
    seed: int = 0,
    raw: bool = False,
    batch_size: int = 32,
) -> tuple[EvalResult, int]:
    """`calm evaluate`: load both files, check lengths against l_max, evaluate. Returns the result
    and the dataset's sequence count."""
    model_path, dataset_path = Path(model_path), Path(dataset_path)
    if not model_path.exists():
        raise CalmError(f"{model_path}: model not found")
    if not dataset_path.exists():
        raise CalmError(f"{dataset_path}: dataset not found")
    loaded = load_model(model_path)
    reader = CtdsReader(dataset_path)
    l_max = loaded.model.cfg.l_max
    if reader.count() and int(reader.lengths.max()) > l_max:
        i = int(np.argmax(reader.lengths))
        raise CalmError(
            f"{dataset_path}: sequence {i} has {int(reader.lengths[i])} tokens, "
            f"over the model's l_max {l_max}"
        )
    seqs = load_sequences(reader, limit=limit, seed=seed)
    result = evaluate(
        loaded.model, seqs, stops=loaded.metadata.stop_conditions(), raw=raw, batch_size=batch_size
    )
    return result, reader.count()


def format_result(result: EvalResult, *, model: Path, dataset: Path, total: int) -> str:
    sample = (
        f"{result.sequences:,} of {total:,} sequences" if result.sequences < total else f"{total:,} sequences"
    )
    how = "whole commands" if result.raw else "up to a stop condition"
    lines = [
        f"model          {model}",
        f"dataset        {dataset} ({sample})",
        f"loss           {result.loss:.4f} nats per supervised token ({result.tokens:,} tokens)",
        f"bits per byte  {result.bits_per_byte:.4f} ({result.command_bytes:,} command bytes)",
        f"exact match    greedy completion after k typed bytes, {how}:",
    ]
    for e in result.exact:
        pct = f"{100 * e.accuracy:5.1f}%" if e.total else "    -"
        lines.append(f"  k={e.k:<2} {pct}  ({e.correct}/{e.total})")
    return "\n".join(lines)
