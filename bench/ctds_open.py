"""CTDS: open time against file size, and batch assembly throughput, measured in one run.

Goals (issue 2): opening a 1 GB dataset takes about as long as opening a small one (the tokens
are memory-mapped, only the per-sequence arrays are read), and assembling padded batches with
their loss masks runs at >= 50M tokens/s.

    python bench/ctds_open.py [--dir DIR] [--sizes-mb 16,128,1024] [--batch 32]
"""

from __future__ import annotations

import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from calmd.arguments import Parser, run_tool
from calmd.formats.ctds import CtdsReader
from calmd.formats.tokenizer import Special


def synth_dataset(path: Path, megabytes: int, seed: int = 0) -> int:
    """A valid CTDS file of about `megabytes` MB: sequences of 40-300 tokens shaped like the shell
    template (BOS, context bytes, ATN, CMD, command bytes, EOS). Written with numpy directly, so
    building the 1 GB file takes seconds."""
    rng = np.random.default_rng(seed)
    count = megabytes * 1_000_000 // (2 * 172)  # mean length 170 tokens + 4 bytes of metadata
    lengths = rng.integers(40, 301, size=count).astype(np.uint16)
    cmd_positions = (lengths * rng.uniform(0.5, 0.85, size=count)).astype(np.uint16)
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(32, 127, size=int(offsets[-1]), dtype=np.uint16)
    tokens[offsets[:-1]] = Special.BOS
    tokens[offsets[:-1] + cmd_positions] = Special.ATN
    tokens[offsets[:-1] + cmd_positions + 1] = Special.CMD
    tokens[offsets[1:] - 1] = Special.EOS
    with open(path, "wb") as f:
        f.write(struct.pack("<4sIIH", b"CTDS", 0, count, int(lengths.max())))
        lengths.astype("<u2").tofile(f)
        cmd_positions.astype("<u2").tofile(f)
        tokens.astype("<u2").tofile(f)
    return path.stat().st_size


def time_open(path: Path, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        ds = CtdsReader(path)
        best = min(best, time.perf_counter() - start)
        ds.close()
    return best


PROG = "bench/ctds_open.py"


def main() -> dict[str, float]:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to write the test files (default: a temp dir, removed after)")
    parser.add_argument("--sizes-mb", default="16,128,1024")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=400)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print("CTDS open time (best of 7; tokens memory-mapped, per-sequence arrays read and checked)")
        opens = []
        for mb in sizes:
            path = Path(tmp) / f"ds{mb}.ctds"
            size = synth_dataset(path, mb)
            seconds = time_open(path)
            opens.append(seconds)
            results[f"open_ms_{mb}mb"] = seconds * 1e3
            print(f"  {size / 1e6:8.0f} MB   open {seconds * 1e3:7.2f} ms")
        largest = Path(tmp) / f"ds{sizes[-1]}.ctds"
        start = time.perf_counter()
        np.fromfile(largest, dtype=np.uint8)
        read_s = time.perf_counter() - start
        results["read_whole_largest_ms"] = read_s * 1e3
        results["open_largest_over_smallest"] = opens[-1] / opens[0]
        print(
            f"  reading the {sizes[-1]} MB file instead (np.fromfile, page cache warm): {read_s * 1e3:.0f} ms"
        )
        ratio, scale = opens[-1] / opens[0], sizes[-1] / sizes[0]
        print(f"  open({sizes[-1]} MB) / open({sizes[0]} MB) = {ratio:.1f}x for {scale:.0f}x the bytes")
        print(f"  open is {read_s / opens[-1]:.0f}x faster than reading the file")

        ds = CtdsReader(largest)
        ds.shuffle(seed=1)
        n_batches = min(args.batches, ds.num_batches(args.batch))
        ds.padded_batch(0, args.batch)  # offsets computed once, outside the timing
        start = time.perf_counter()
        real = padded = 0
        for b in range(n_batches):
            tokens, _, lengths = ds.padded_batch(b, args.batch)
            real += int(lengths.sum())
            padded += tokens.size
        seconds = time.perf_counter() - start
        results["batch_tokens_per_s"] = real / seconds
        results["batch_padded_tokens_per_s"] = padded / seconds
        print(f"batch assembly (shuffled, batch {args.batch}, tokens + loss mask, {n_batches} batches)")
        print(
            f"  {real / seconds / 1e6:.1f}M tokens/s ({padded / seconds / 1e6:.1f}M padded cells/s); "
            "goal >= 50M"
        )
        ds.close()
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
