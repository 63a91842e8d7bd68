"""The fused C++ kernels: the selective scan (calmd/model/csrc/scan.cpp) and the whole-model
inference step (csrc/step.cpp, driven by calmd/model/faststep.py), built on first use into one
library and called through ctypes; the library also walks the learned rankers' trees
(csrc/forest.cpp, for calmd/suggest/forest.py).

Why ctypes and plain C++ rather than a torch extension: the kernel needs no torch or Python
headers, so it builds in a second or two with the system's g++ and needs neither ninja nor the
Python development headers. The library is cached in `paths.cache_dir()` under a name that
hashes the sources, the flags, the compiler and the CPU's feature flags (it is built with
-march=native, so a home directory shared with another CPU gets its own build). Building writes a
temporary file and renames it, so concurrent first uses never load half a library.

`library()` returns None when the kernel cannot be had (no g++, a failed build,
CALM_NO_CPP_SCAN=1); callers then use the PyTorch fast path in calmd/model/scan.py. The reason is
kept in `unavailable_reason()` and logged once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from calmd import paths

log = logging.getLogger(__name__)

ABI_VERSION = 3  # 2: the library holds calm_step_f32 (csrc/step.cpp) too; 3: calm_forest_f64 (forest.cpp)
SOURCES = ("scan.cpp", "step.cpp", "forest.cpp")
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-fPIC", "-std=c++17"]
# -ffast-math only when compiling: linking with it would add crtfastmath.o, which turns on
# flush-to-zero for the whole process (torch included) when the library loads.
LINK_FLAGS = ["-shared", "-pthread", "-lmvec", "-lm"]

use_cpp = True  # benchmarks and tests switch it off to measure the PyTorch path beside it
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_reason = ""


def sources() -> dict[str, bytes]:
    csrc = resources.files("calmd.model").joinpath("csrc")
    return {name: csrc.joinpath(name).read_bytes() for name in SOURCES}


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return ""


def _compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()[0] if out.stdout else ""


def build(cxx: str, out_dir: Path) -> Path:
    """Compile the kernels into `out_dir` (unless already there); returns the library's path.
    Raises RuntimeError with the compiler's message when the build fails."""
    srcs = sources()
    parts = [" ".join(COMPILE_FLAGS + LINK_FLAGS), _compiler_version(cxx), _cpu_flags()]
    blobs = [b for name, src in srcs.items() for b in (name.encode(), src)]
    key = hashlib.sha256(b"\0".join([*blobs, *(p.encode() for p in parts)])).hexdigest()[:16]
    target = out_dir / f"calm-scan-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        objects = []
        for name, src in srcs.items():
            cpp, obj = Path(tmp) / name, Path(tmp) / f"{name}.o"
            cpp.write_bytes(src)
            _compile([cxx, *COMPILE_FLAGS, "-c", str(cpp), "-o", str(obj)])
            objects.append(str(obj))
        lib = Path(tmp) / "calm.so"
        _compile([cxx, *objects, "-o", str(lib), *LINK_FLAGS])
        with open(lib, "rb") as f:
            os.fsync(f.fileno())
        os.replace(lib, target)
    return target


def _compile(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()[-2000:]}")


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    if lib.calm_scan_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{path}: ABI version {lib.calm_scan_abi_version()}, expected {ABI_VERSION}")
    i64, c_int, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    for suffix in ("f32", "f64"):
        fwd = getattr(lib, f"calm_scan_forward_{suffix}")
        fwd.argtypes = [ptr] * 9 + [i64] * 4 + [c_int]
        fwd.restype = None
        bwd = getattr(lib, f"calm_scan_backward_{suffix}")
        bwd.argtypes = [ptr] * 16 + [i64] * 4 + [c_int]
        bwd.restype = None
    step = lib.calm_step_f32  # csrc/step.cpp; faststep.py calls it
    step.argtypes = [ptr] * 3 + [i64] + [ptr] * 3 + [i64] + [ptr] * 3 + [c_int, i64, c_int]
    step.restype = c_int
    forest = lib.calm_forest_f64  # csrc/forest.cpp; calmd/suggest/forest.py calls it
    forest.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, i64, ptr]
    forest.restype = None
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel, building it on first use; None when it cannot be had (see module doc)."""
    global _lib, _tried, _reason
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        try:
            if os.environ.get("CALM_NO_CPP_SCAN"):
                raise RuntimeError("CALM_NO_CPP_SCAN is set")
            cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
            if not cxx:
                raise RuntimeError("no C++ compiler (g++) on PATH")
            _lib = _load(build(cxx, paths.cache_dir()))
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
            _reason = str(exc)
            log.info("fused C++ scan unavailable, using the PyTorch scan: %s", _reason)
        _tried = True
    return _lib


def unavailable_reason() -> str:
    library()
    return _reason


def _p(t: Tensor) -> int:
    return t.data_ptr()


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def supports(u: Tensor) -> bool:
    """Whether the kernel can run on tensors like `u` (CPU, float32/float64) and is available."""
    return use_cpp and u.device.type == "cpu" and u.dtype in _SUFFIX and library() is not None


class CppScanFn(torch.autograd.Function):
    """Same contract as scan.SelectiveScanFn: (u, delta, A, B, C, D, h0) -> (y, last state),
    with B and C as (batch, N, L). Saves only the inputs; the backward recomputes the states."""

    @staticmethod
    def forward(
        ctx: Any, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, h0: Tensor
    ) -> tuple[Tensor, Tensor]:
        lib = library()
        assert lib is not None and u.dtype in _SUFFIX
        dtype = u.dtype
        batch, channels, length = u.shape
        n_state = A.shape[1]
        u, delta = u.contiguous(), delta.to(dtype).contiguous()
        A, D, h0 = A.to(dtype).contiguous(), D.to(dtype).contiguous(), h0.to(dtype).contiguous()
        Bt = B.to(dtype).transpose(1, 2).contiguous()  # (batch, L, N)
        Ct = C.to(dtype).transpose(1, 2).contiguous()
        y = torch.empty_like(u)
        h_last = torch.empty_like(h0)
        getattr(lib, f"calm_scan_forward_{_SUFFIX[dtype]}")(
            _p(u), _p(delta), _p(A), _p(Bt), _p(Ct), _p(D), _p(h0), _p(y), _p(h_last),
            batch, channels, length, n_state, torch.get_num_threads(),
        )  # fmt: skip
        ctx.save_for_backward(u, delta, A, Bt, Ct, D, h0)
        return y, h_last

    @staticmethod
    def backward(ctx: Any, gy: Tensor, gh_last: Tensor) -> tuple[Tensor | None, ...]:
        lib = library()
        assert lib is not None
        u, delta, A, Bt, Ct, D, h0 = ctx.saved_tensors
        batch, channels, length = u.shape
        n_state = A.shape[1]
        gy = gy.to(u.dtype).contiguous()
        gh_last = torch.zeros_like(h0) if gh_last is None else gh_last.to(u.dtype).contiguous()
        gu, gdelta = torch.empty_like(u), torch.empty_like(u)
        gA, gD, gh0 = torch.empty_like(A), torch.empty_like(D), torch.empty_like(h0)
        gBt, gCt = torch.empty_like(Bt), torch.empty_like(Ct)
        getattr(lib, f"calm_scan_backward_{_SUFFIX[u.dtype]}")(
            _p(u), _p(delta), _p(A), _p(Bt), _p(Ct), _p(D), _p(h0), _p(gy), _p(gh_last),
            _p(gu), _p(gdelta), _p(gA), _p(gBt), _p(gCt), _p(gD), _p(gh0),
            batch, channels, length, n_state, torch.get_num_threads(),
        )  # fmt: skip
        return gu, gdelta, gA, gBt.transpose(1, 2), gCt.transpose(1, 2), gD, gh0
