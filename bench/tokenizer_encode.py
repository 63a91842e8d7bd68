"""Tokenizer encode throughput, against a bare np.frombuffer copy of the same bytes in the same run.

Goal (issue 2): >= 1 GB/s, and within 2x of the bare copy. Input: the public shell histories of
../shared/data/histories (or synthetic shell-like text when absent), repeated to --mb megabytes.

    python bench/tokenizer_encode.py [--mb 64] [--repeat 15]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from calmd.arguments import Parser, run_tool
from calmd.formats.tokenizer import decode, encode

HISTORIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "histories" / "users"


def corpus(megabytes: int) -> bytes:
    files = sorted(HISTORIES.glob("*.txt")) if HISTORIES.is_dir() else []
    seed = b"".join(f.read_bytes() for f in files) or b"git status\nls -la\ncd ~/src && make -j2\n" * 1000
    reps = -(-megabytes * 1_000_000 // len(seed))
    return (seed * reps)[: megabytes * 1_000_000]


def best_seconds(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """Best time of each function, run interleaved so that both see the same machine load."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


PROG = "bench/tokenizer_encode.py"


def main() -> dict[str, float]:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    data = corpus(args.mb)
    text = data.decode("utf-8", "surrogateescape")
    assert decode(encode(data)) == data
    copy_s, bytes_s, str_s = best_seconds(
        [lambda: np.frombuffer(data, dtype=np.uint8).copy(), lambda: encode(data), lambda: encode(text)],
        args.repeat,
    )
    (decode_s,) = best_seconds([lambda: decode(encode(data))], max(3, args.repeat // 3))
    n = len(data) / 1e9
    results = {
        "bytes_gb": n,
        "copy_gbps": n / copy_s,
        "encode_bytes_gbps": n / bytes_s,
        "encode_str_gbps": n / str_s,
        "encode_to_copy_ratio": bytes_s / copy_s,
        "encode_decode_gbps": n / decode_s,
    }
    print(f"tokenizer encode, {len(data) / 1e6:.0f} MB of shell history, best of {args.repeat}")
    print(f"  bare np.frombuffer copy   {results['copy_gbps']:7.2f} GB/s")
    print(
        f"  encode(bytes)             {results['encode_bytes_gbps']:7.2f} GB/s   "
        f"{results['encode_to_copy_ratio']:.2f}x the copy's time (goal <= 2x, >= 1 GB/s)"
    )
    print(f"  encode(str) incl. UTF-8   {results['encode_str_gbps']:7.2f} GB/s")
    print(f"  encode + decode           {results['encode_decode_gbps']:7.2f} GB/s")
    ok = results["encode_bytes_gbps"] >= 1.0 and results["encode_to_copy_ratio"] <= 2.0
    print(f"  goal met: {ok}")
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
