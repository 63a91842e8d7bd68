"""The loss curve of `calm train --plot`: a PNG written with zlib and struct, no imaging library."""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from calmd.atomic import atomic_write

# 3x5 glyphs for tick labels, one string of 15 pixels (rows top to bottom) per character.
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    "e": "000111111100111", " ": "000000000000000",
}  # fmt: skip


def _png(width: int, height: int, rgb: npt.NDArray[np.uint8]) -> bytes:
    """Encode an (H, W, 3) uint8 image as a PNG (zlib + struct, no imaging library)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(height))  # filter 0 per scanline
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def _text(img: npt.NDArray[np.uint8], x: int, y: int, text: str, scale: int = 2) -> None:
    for i, ch in enumerate(text):
        bits = _GLYPHS.get(ch, _GLYPHS[" "])
        for r in range(5):
            for c in range(3):
                if bits[r * 3 + c] == "1":
                    x0, y0 = x + (i * 4 + c) * scale, y + r * scale
                    img[y0 : y0 + scale, x0 : x0 + scale] = 0


def _line(
    img: npt.NDArray[np.uint8], x0: float, y0: float, x1: float, y1: float, color: tuple[int, ...]
) -> None:
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.rint(np.linspace(x0, x1, n + 1)).astype(int)
    ys = np.rint(np.linspace(y0, y1, n + 1)).astype(int)
    ok = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
    img[ys[ok], xs[ok]] = color
    img[np.minimum(ys[ok] + 1, img.shape[0] - 1), xs[ok]] = color  # 2 px thick


def write_loss_png(
    path: Path,
    losses: Sequence[float],
    val: Sequence[tuple[int, float]],
    *,
    width: int = 640,
    height: int = 360,
) -> None:
    """Train loss per step (blue) and validation loss per epoch (orange dots), with the y range
    and the step count written on the axes. Written atomically."""
    img = np.full((height, width, 3), 255, dtype=np.uint8)  # (H, W, 3)
    left, right, top, bottom = 70, width - 20, 20, height - 40
    values = [*losses, *(v for _, v in val)]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    steps = max(len(losses), 1)
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):  # grid and y labels
        y = bottom - frac * (bottom - top)
        img[int(y), left:right] = 225
        _text(img, 4, int(y) - 5, f"{lo + frac * (hi - lo):.3g}")
    img[top:bottom, left] = 0
    img[bottom, left:right] = 0
    _text(img, left, bottom + 10, "0")
    label = str(steps)
    _text(img, right - len(label) * 8, bottom + 10, label)

    def xy(step: float, value: float) -> tuple[float, float]:
        return (left + (step / steps) * (right - left), bottom - (value - lo) / (hi - lo) * (bottom - top))

    points = [xy(i + 1, v) for i, v in enumerate(losses)]
    if len(points) == 1:
        points.append(points[0])
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        _line(img, x0, y0, x1, y1, (31, 119, 180))
    for s, v in val:
        x, y = xy(s, v)
        img[max(int(y) - 3, 0) : int(y) + 4, max(int(x) - 3, 0) : int(x) + 4] = (255, 127, 14)
    with atomic_write(path) as f:
        f.write(_png(width, height, img))
