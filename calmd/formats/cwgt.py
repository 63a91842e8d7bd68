"""CWGT v5: the CALM weight file, byte tables in docs/formats.md, "CWGT v5".

    [48-byte header][metadata: meta_size bytes, 3 lines][EWC: fisher, anchor][weights]

Every array is `param_count` little-endian float32 values. The order of parameters inside an
array is the model's (calmd/model/mamba.py documents it); this module takes and returns an ordered
list of named arrays and concatenates them C-order, first to last.

`read_cwgt` reads the whole file into memory first, then validates the header, the metadata and
the length against param_count there. It never memory-maps: a file truncated in place while
mapped kills the reader with SIGBUS, and a hot reload must survive whatever is done to the file.
It opens without blocking and accepts only regular files (a FIFO at the weight path would
otherwise block the reader for good), at most MAX_CWGT_BYTES. Every problem raises FormatError
naming the file and the field.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import numpy.typing as npt

from calmd.atomic import UnsafeFile, atomic_write, read_regular_file
from calmd.errors import FormatError, TemplateError
from calmd.formats.tokenizer import (
    DEFAULT_SHELL_STOPS,
    DEFAULT_SHELL_TEMPLATE_SPEC,
    VOCAB_SIZE,
    StopConditions,
    Template,
    parse_stop_conditions,
    parse_template,
)

MAGIC = b"CWGT"
# The largest weight file read: mini with its EWC block is 150 MB; param_count could claim 48 GB.
MAX_CWGT_BYTES = 1 << 30
ARCH_VERSION = 5
FLAG_TIED = 1 << 0
FLAG_HAS_EWC = 1 << 1
KNOWN_FLAGS = FLAG_TIED | FLAG_HAS_EWC

# (field, struct code) in file order; offsets in docs/formats.md.
_LAYOUT = (
    ("magic", "4s"), ("arch_version", "H"), ("flags", "H"), ("vocab_size", "H"), ("d_model", "H"),
    ("n_layers", "B"), ("ffn_expand", "B"), ("expand", "B"), ("d_state", "B"), ("l_max", "H"),
    ("param_count", "I"), ("def_temperature", "H"), ("def_top_k", "H"), ("def_top_p", "H"),
    ("def_min_p", "H"), ("def_max_tokens", "H"), ("def_candidates", "B"), ("d_conv", "B"),
    ("meta_size", "I"), ("dt_rank", "B"), ("reserved", "9s"),
)  # fmt: skip
HEADER = struct.Struct("<" + "".join(code for _, code in _LAYOUT))
assert HEADER.size == 48
HEADER_FIELDS = tuple(name for name, _ in _LAYOUT)
# Offsets the spec states outright, checked against the struct layout.
assert struct.calcsize("<4sHHHHBB") == 14  # expand
assert struct.calcsize("<4sHHHHBBB") == 15  # d_state
assert struct.calcsize("<4sHHHHBBBBHIHHHHHB") == 33  # d_conv
assert struct.calcsize("<4sHHHHBBBBHIHHHHHBBI") == 38  # dt_rank

_WIDTHS = {"H": 0xFFFF, "B": 0xFF, "I": 0xFFFFFFFF}


@dataclass(frozen=True)
class CwgtHeader:
    """The 48-byte header. Generation defaults are stored x1000 (0 = unset) as in the spec."""

    d_model: int
    n_layers: int
    ffn_expand: int
    expand: int
    d_state: int
    d_conv: int
    dt_rank: int
    param_count: int
    vocab_size: int = VOCAB_SIZE
    l_max: int = 768
    flags: int = FLAG_TIED
    def_temperature: int = 0
    def_top_k: int = 0
    def_top_p: int = 0
    def_min_p: int = 0
    def_max_tokens: int = 0
    def_candidates: int = 0
    meta_size: int = 0
    arch_version: int = ARCH_VERSION

    @property
    def tied(self) -> bool:
        return bool(self.flags & FLAG_TIED)

    @property
    def has_ewc(self) -> bool:
        return bool(self.flags & FLAG_HAS_EWC)

    def pack(self) -> bytes:
        values: dict[str, int] = asdict(self)
        for name, code in _LAYOUT:
            if code in _WIDTHS and not 0 <= values[name] <= _WIDTHS[code]:
                raise ValueError(f"header field {name}={values[name]} does not fit its {code!r} slot")
        return HEADER.pack(
            *[MAGIC if n == "magic" else bytes(9) if n == "reserved" else values[n] for n in HEADER_FIELDS]
        )

    @classmethod
    def unpack(cls, raw: bytes, *, path: str | None = None) -> CwgtHeader:
        """Parse and validate; FormatError names the field that is wrong."""
        if len(raw) < HEADER.size:
            raise FormatError(
                f"file is {len(raw)} bytes, shorter than the 48-byte header", path=path, field="header"
            )
        values = dict(zip(HEADER_FIELDS, HEADER.unpack(raw[: HEADER.size]), strict=True))
        if values["magic"] != MAGIC:
            raise FormatError(f"expected b'CWGT', found {values['magic']!r}", path=path, field="magic")
        version = values["arch_version"]
        if version < ARCH_VERSION:
            raise FormatError(
                f"arch_version {version} is older than 5 and not supported", path=path, field="arch_version"
            )
        if version > ARCH_VERSION:
            raise FormatError(
                f"arch_version {version} is newer than this reader (5)", path=path, field="arch_version"
            )
        if values["flags"] & ~KNOWN_FLAGS:
            raise FormatError(f"unknown bits set in flags 0x{values['flags']:04x}", path=path, field="flags")
        if values["vocab_size"] != VOCAB_SIZE:
            raise FormatError(
                f"vocab_size {values['vocab_size']}, the tokenizer has {VOCAB_SIZE}",
                path=path,
                field="vocab_size",
            )
        for name in ("d_model", "n_layers", "expand", "d_state", "d_conv", "dt_rank", "l_max", "param_count"):
            if values[name] == 0:
                raise FormatError(f"{name} is 0", path=path, field=name)
        for name in ("def_top_p", "def_min_p"):
            if values[name] > 1000:
                raise FormatError(f"{name} {values[name]} is over 1000 (1.0)", path=path, field=name)
        if values["reserved"] != b"\0" * 9:
            raise FormatError("reserved bytes 39-47 are not zero", path=path, field="reserved")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    # Generation defaults as floats, None when unset.
    @property
    def temperature(self) -> float | None:
        return self.def_temperature / 1000 if self.def_temperature else None

    @property
    def top_p(self) -> float | None:
        return self.def_top_p / 1000 if self.def_top_p else None

    @property
    def min_p(self) -> float | None:
        return self.def_min_p / 1000 if self.def_min_p else None


@dataclass(frozen=True)
class Metadata:
    """The three metadata lines: domain, template spec, stop conditions."""

    domain: str = "shell"
    template: str = DEFAULT_SHELL_TEMPLATE_SPEC
    stops: str = DEFAULT_SHELL_STOPS

    def encode(self) -> bytes:
        for name in ("domain", "template", "stops"):
            if "\n" in getattr(self, name):
                raise ValueError(f"metadata {name} must be one line")
        parse_template(self.template)  # refuse to write a template no reader would accept
        return f"{self.domain}\n{self.template}\n{self.stops}\n".encode()

    @classmethod
    def decode(cls, raw: bytes, *, path: str | None = None) -> Metadata:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(
                f"not UTF-8 ({exc.reason} at byte {exc.start})", path=path, field="metadata"
            ) from None
        lines = text.split("\n")
        if len(lines) != 4 or lines[3] != "":
            raise FormatError(
                f"expected 3 newline-terminated lines (domain, template, stop conditions), got {text!r}",
                path=path,
                field="metadata",
            )
        meta = cls(lines[0], lines[1], lines[2])
        if not meta.domain:
            raise FormatError("domain line is empty", path=path, field="metadata.domain")
        try:
            parse_template(meta.template)
        except TemplateError as exc:
            raise FormatError(str(exc), path=path, field="metadata.template") from None
        return meta

    def parsed_template(self) -> Template:
        return parse_template(self.template)

    def stop_conditions(self) -> StopConditions:
        return parse_stop_conditions(self.stops)


@dataclass
class CwgtFile:
    """A read CWGT file. Arrays are read-only views of the bytes read (possibly unaligned: copy
    before use)."""

    path: Path
    header: CwgtHeader
    metadata: Metadata | None
    weights: npt.NDArray[np.float32]
    fisher: npt.NDArray[np.float32] | None = None
    anchor: npt.NDArray[np.float32] | None = None

    def named_arrays(
        self, shapes: Sequence[tuple[str, tuple[int, ...]]]
    ) -> list[tuple[str, npt.NDArray[np.float32]]]:
        """Split the flat weights into the model's named arrays (copies, float32, C-order)."""
        return split_flat(self.weights, shapes, path=str(self.path))

    def check_finite(self) -> None:
        """FormatError if any weight is NaN or infinite (a diverged training run)."""
        for name, arr in (("weights", self.weights), ("fisher", self.fisher), ("anchor", self.anchor)):
            if arr is None:
                continue
            bad = ~np.isfinite(arr)
            if bad.any():
                raise FormatError(
                    f"{int(bad.sum())} values are not finite (first at index {int(np.argmax(bad))})",
                    path=str(self.path),
                    field=name,
                )


def split_flat(
    flat: npt.NDArray[np.float32], shapes: Sequence[tuple[str, tuple[int, ...]]], *, path: str | None = None
) -> list[tuple[str, npt.NDArray[np.float32]]]:
    total = sum(int(np.prod(shape)) for _, shape in shapes)
    if total != flat.size:
        raise FormatError(
            f"the model needs {total} parameters, the file holds {flat.size}", path=path, field="param_count"
        )
    out: list[tuple[str, npt.NDArray[np.float32]]] = []
    offset = 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        out.append((name, np.array(flat[offset : offset + n], dtype=np.float32).reshape(shape)))
        offset += n
    return out


def flatten(arrays: Sequence[tuple[str, npt.ArrayLike]] | npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Ordered named arrays (or one flat array) -> one flat little-endian float32 array."""
    if isinstance(arrays, list | tuple) and arrays and isinstance(arrays[0], tuple):
        names = [name for name, _ in arrays]
        assert len(set(names)) == len(names), "duplicate parameter names"
        parts = [np.ascontiguousarray(a, dtype="<f4").ravel() for _, a in arrays]
        return np.concatenate(parts) if parts else np.zeros(0, dtype="<f4")
    return np.ascontiguousarray(arrays, dtype="<f4").ravel()


def write_cwgt(
    path: str | os.PathLike[str],
    header: CwgtHeader,
    weights: Sequence[tuple[str, npt.ArrayLike]] | npt.ArrayLike,
    metadata: Metadata | None = None,
    *,
    ewc: tuple[npt.ArrayLike, npt.ArrayLike] | None = None,
) -> Path:
    """Write a CWGT v5 file atomically. `param_count`, `meta_size` and the EWC flag are set from
    the arguments; the rest of `header` is written as given. `ewc` is (fisher, anchor)."""
    flat = flatten(weights)
    meta = metadata.encode() if metadata is not None else b""
    flags = header.flags & ~FLAG_HAS_EWC
    ewc_arrays: list[npt.NDArray[np.float32]] = []
    if ewc is not None:
        flags |= FLAG_HAS_EWC
        for name, arr in zip(("fisher", "anchor"), ewc, strict=True):
            a = flatten(arr)
            if a.size != flat.size:
                raise ValueError(f"EWC {name} has {a.size} values, the weights {flat.size}")
            ewc_arrays.append(a)
    final = CwgtHeader(**{**asdict(header), "param_count": flat.size, "meta_size": len(meta), "flags": flags})
    packed = final.pack()
    with atomic_write(path) as out:
        out.write(packed)
        out.write(meta)
        for arr in ewc_arrays:
            out.write(arr.tobytes())
        out.write(flat.tobytes())
    return Path(path)


def read_cwgt(path: str | os.PathLike[str]) -> CwgtFile:
    """Read a CWGT v5 file into memory (calmd.atomic.read_regular_file) and validate it."""
    p = Path(path)
    where = str(p)
    try:
        raw = read_regular_file(p, limit=MAX_CWGT_BYTES)
    except UnsafeFile as exc:
        raise FormatError(exc.strerror or str(exc), path=where, field="file") from None
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror}", path=where) from exc
    size = len(raw)
    header = CwgtHeader.unpack(bytes(raw[: HEADER.size]), path=where)
    meta_raw = bytes(raw[HEADER.size : HEADER.size + header.meta_size])
    n_arrays = 3 if header.has_ewc else 1
    expected = HEADER.size + header.meta_size + 4 * header.param_count * n_arrays
    if len(meta_raw) < header.meta_size:
        raise FormatError(
            f"meta_size {header.meta_size} runs past the end of the file ({size} bytes)",
            path=where,
            field="meta_size",
        )
    if size != expected:
        what = "ewc + weights" if header.has_ewc else "weights"
        raise FormatError(
            f"param_count {header.param_count} with meta_size {header.meta_size} means {expected} bytes "
            f"(header + metadata + {what}), the file has {size}",
            path=where,
            field="param_count",
        )
    metadata = Metadata.decode(meta_raw, path=where) if header.meta_size else None
    offset = HEADER.size + header.meta_size
    count = header.param_count

    def array(index: int) -> npt.NDArray[np.float32]:
        arr = np.frombuffer(raw, dtype="<f4", count=count, offset=offset + 4 * count * index)
        arr.setflags(write=False)
        return arr

    if header.has_ewc:
        return CwgtFile(p, header, metadata, array(2), fisher=array(0), anchor=array(1))
    return CwgtFile(p, header, metadata, array(0))
