"""A CALM model as a CWGT v5 file: the glue between calmd/model/mamba.py and calmd/formats/cwgt.py.

The header carries the model's hyper-parameters (ModelConfig travels inside its artifact) and the
generation defaults; the metadata carries domain, template and stop conditions; the flat weight
array holds the model's parameters in `CalmModel.to_named_arrays()` order (docs/model.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from calmd import paths
from calmd.atomic import keep_copy
from calmd.errors import FormatError
from calmd.formats.cwgt import FLAG_TIED, CwgtHeader, Metadata, read_cwgt, write_cwgt
from calmd.model.mamba import CalmModel, ModelConfig


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults stored in the header (x1000 fixed point for the floats, 0 = unset)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    max_tokens: int = 64
    candidates: int = 5

    @classmethod
    def from_header(cls, h: CwgtHeader) -> GenerationDefaults:
        """Header values, with this class's defaults where the header says unset."""
        base = cls()
        return cls(
            temperature=h.temperature if h.temperature is not None else base.temperature,
            top_k=h.def_top_k or base.top_k,
            top_p=h.top_p if h.top_p is not None else base.top_p,
            min_p=h.min_p if h.min_p is not None else base.min_p,
            max_tokens=h.def_max_tokens or base.max_tokens,
            candidates=h.def_candidates or base.candidates,
        )


def config_from_header(h: CwgtHeader) -> ModelConfig:
    return ModelConfig(
        vocab_size=h.vocab_size,
        d_model=h.d_model,
        n_layers=h.n_layers,
        ffn_expand=h.ffn_expand,
        expand=h.expand,
        d_state=h.d_state,
        d_conv=h.d_conv,
        dt_rank=h.dt_rank,
        l_max=h.l_max,
        tied=h.tied,
    )


def header_for(cfg: ModelConfig, defaults: GenerationDefaults | None = None) -> CwgtHeader:
    d = defaults or GenerationDefaults()
    return CwgtHeader(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        ffn_expand=cfg.ffn_expand,
        expand=cfg.expand,
        d_state=cfg.d_state,
        d_conv=cfg.d_conv,
        dt_rank=cfg.dt_rank,
        l_max=cfg.l_max,
        param_count=cfg.param_count(),
        flags=FLAG_TIED if cfg.tied else 0,
        def_temperature=round(d.temperature * 1000),
        def_top_k=d.top_k,
        def_top_p=round(d.top_p * 1000),
        def_min_p=round(d.min_p * 1000),
        def_max_tokens=d.max_tokens,
        def_candidates=d.candidates,
    )


def save_model(
    path: str | os.PathLike[str],
    model: CalmModel,
    metadata: Metadata | None = None,
    *,
    defaults: GenerationDefaults | None = None,
    ewc: tuple[npt.ArrayLike, npt.ArrayLike] | None = None,
) -> Path:
    """Write `model` atomically as CWGT v5; `ewc` is (fisher diagonal, anchor weights), flat.
    A `shell.cwgt` it replaces (weights a daemon serves: `calm train` in place, `calm init -o ...
    --force`) is kept as `shell.prev.cwgt` first, so that `calm rollback` undoes the change."""
    arrays = model.to_named_arrays()
    target = Path(path)
    if target.name == paths.WEIGHTS and target.is_file():
        keep_copy(target, paths.prev_weights_path(target))
    return write_cwgt(target, header_for(model.cfg, defaults), arrays, metadata or Metadata(), ewc=ewc)


@dataclass
class LoadedModel:
    path: Path
    model: CalmModel
    header: CwgtHeader
    metadata: Metadata
    defaults: GenerationDefaults
    fisher: npt.NDArray[np.float32] | None = None
    anchor: npt.NDArray[np.float32] | None = None


def load_model(path: str | os.PathLike[str], *, with_ewc: bool = False) -> LoadedModel:
    """Read, validate and build the model. FormatError when the header's architecture disagrees
    with param_count, the weights are not finite, or there is no metadata (the template is
    needed to build inputs)."""
    f = read_cwgt(path)
    where = str(f.path)
    try:
        cfg = config_from_header(f.header)
    except ValueError as exc:
        raise FormatError(str(exc), path=where, field="header") from None
    if cfg.param_count() != f.header.param_count:
        raise FormatError(
            f"the architecture in the header needs {cfg.param_count()} parameters, "
            f"param_count says {f.header.param_count}",
            path=where,
            field="param_count",
        )
    if f.metadata is None:
        raise FormatError(
            "no metadata: the template and stop conditions are required", path=where, field="meta_size"
        )
    f.check_finite()
    model = CalmModel(cfg)
    shapes = [(name, tuple(a.shape)) for name, a in model.to_named_arrays()]
    model.load_named_arrays(f.named_arrays(shapes))
    model.eval()
    fisher = anchor = None
    if with_ewc and f.fisher is not None and f.anchor is not None:
        fisher, anchor = np.array(f.fisher, dtype=np.float32), np.array(f.anchor, dtype=np.float32)
    return LoadedModel(
        f.path, model, f.header, f.metadata, GenerationDefaults.from_header(f.header), fisher, anchor
    )


def flatten(model: CalmModel) -> npt.NDArray[np.float32]:
    return np.concatenate([a.ravel() for _, a in model.to_named_arrays()])


def unflatten(cfg: ModelConfig, flat: npt.NDArray[np.float32]) -> CalmModel:
    model = CalmModel(cfg)
    shapes = [(name, p.shape) for name, p in model.named_parameters()]
    total = sum(int(np.prod(s)) for _, s in shapes)
    if flat.size != total:
        raise ValueError(f"flat array has {flat.size} values, the model needs {total}")
    arrays, offset = [], 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        arrays.append((name, np.asarray(flat[offset : offset + n], dtype=np.float32).reshape(tuple(shape))))
        offset += n
    model.load_named_arrays(arrays)
    return model
