"""Importing history files: memory and time, whatever the file (issue 23, docs/performance.md).

    python bench/import_history.py [--big-gib 2] [--cli-mib 256] [--whole-mib 64] [--skip-dense]
                                   [--fish-mib 16] [--fish-big-mib 64] [--only fish]

1. The daemon's first start (`calmd serve`, the packaged model) with a --big-gib sparse
   ~/.bash_history (a hole of NULs, as a crash leaves one), and with a dense text one of the same
   size (real commands of the public histories, repeated): seconds to `ready`, seconds until the
   first-start import is over (refused, or the newest 16 MiB read), and the peak resident memory
   (VmHWM) less that of the same daemon started without a history file, in the same run.
2. `calm import` of a --cli-mib text history with the default bound (the newest 16 MiB), and of
   a --whole-mib one read whole (`--max-mib` its size): peak memory (ru_maxrss) less that of
   `calm import` of a 1 MiB file, the time, and the commands stored per second.

3. fish's history (issue 30): `calm import` of a --fish-mib file of short entries (`- cmd: ls`,
   no `when`: 1.8 million of them in 16 MiB), of one with a `when` per entry, of a --fish-big-mib
   one with the default bound and read whole: peak memory less that of `calm import` of a 1 MiB
   fish file; and the daemon's first start with the short-entry file as fish_history, against
   the same daemon without one.

The files are written under a temporary folder and removed (the dense ones take disk space, not
memory: the page cache may hold them).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, Report, daemon, scratch
from calmd.arguments import Parser, run_tool
from calmd.shell.client import CalmClient
from tests.support.daemon import daemon_env

HISTORIES = ROOT.parent / "shared" / "data" / "histories" / "users"
MIB = 1 << 20


def text_block() -> bytes:
    """About 4 MiB of real command lines (the public histories), to repeat."""
    lines: list[bytes] = []
    size = 0
    for path in sorted(HISTORIES.glob("*.txt")):
        for line in path.read_bytes().splitlines():
            if line.strip():
                lines.append(line)
                size += len(line) + 1
        if size > 4 * MIB:
            break
    if not lines:
        lines = [b"git status", b"ls -la", b"make test", b"cd ~/src/project && git pull"]
    return b"\n".join(lines) + b"\n"


def write_dense(path: Path, size: int) -> None:
    block = text_block()
    with open(path, "wb") as f:
        written = 0
        while written < size:
            chunk = block[: size - written]
            f.write(chunk)
            written += len(chunk)


def write_sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.write(b"ls -la\ngit status\n")
        f.truncate(size)


FISH_SHORT = [b"ls", b"l", b"cd", b"gs", b"vi", b"ll", b"pwd", b"top", b"fg", b"cd .."]


def write_fish(path: Path, size: int, *, when: bool = False) -> int:
    """A fish history of about `size` bytes: short commands (`- cmd: ls`, 9 to 13 bytes an
    entry), with `  when: <epoch>` after each when `when`. Returns the number of entries."""
    entries = 0
    with open(path, "wb") as f:
        written = 0
        block: list[bytes] = []
        while written < size:
            entry = b"- cmd: " + FISH_SHORT[entries % len(FISH_SHORT)] + b"\n"
            if when:
                entry += b"  when: %d\n" % (1_700_000_000 + entries // 3)
            block.append(entry)
            written += len(entry)
            entries += 1
            if len(block) >= 65536:
                f.write(b"".join(block))
                block.clear()
        f.write(b"".join(block))
    return entries


def env_for(home: Path) -> dict[str, str]:
    """`calm`'s environment in `home`: the daemon's (tests/support/daemon.py), this tree on the path."""
    return {**daemon_env(home), "PYTHONPATH": str(ROOT)}


def peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def daemon_start(home: Path) -> tuple[float, float, int, dict[str, object]]:
    """(seconds to ready, seconds until the import is over, peak KiB, the status's import, with
    `slowest_ms`: the slowest of the completions asked every 0.2 s while it ran)."""
    env = {"XDG_DATA_HOME": str(home / ".local" / "share")}
    with daemon(home=home, args=("--train-threshold", "0"), env=env) as d:
        slowest = 0.0
        with CalmClient(d.socket, timeout=120) as client:
            while True:
                status = client.status()["status"]
                if not status["history"]["import"]["running"]:
                    break
                asked = time.perf_counter()
                list(client.complete("git st", n=3, session="bench"))  # a keystroke meanwhile
                slowest = max(slowest, time.perf_counter() - asked)
                time.sleep(0.2)  # the pace of what is measured: a keystroke every 0.2 s
            done = time.monotonic() - d.started_at
            peak = peak_kib(d.proc.pid)
            imported = {**status["history"]["import"], "commands": status["history"]["commands"],
                        "slowest_ms": round(slowest * 1e3)}  # fmt: skip
    return d.start_s, done, peak, imported


def calm_import(home: Path, path: Path, *extra: str) -> tuple[float, int, str]:
    """(seconds, peak KiB of the `calm import` process, its output) in a fresh data dir. The
    process reports its own ru_maxrss as it exits (a child's, seen from here, is the largest of
    all children so far)."""
    shutil.rmtree(home / "data", ignore_errors=True)
    code = (
        "import atexit, resource, sys\n"
        "atexit.register(lambda: print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
        "file=sys.stderr))\n"
        "from calmd.cli import calm_main\n"
        "sys.exit(calm_main(sys.argv[1:]))\n"
    )
    argv = [sys.executable, "-c", code, "import", str(path), *extra]
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env_for(home), capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    peak = int(out.stderr.split("PEAK_KIB", 1)[1].split()[0])
    return seconds, peak, out.stdout


def mb(kib: int) -> str:
    return f"{kib / 1024:.0f} MB"


PROG = "bench/import_history.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big-gib", type=float, default=2.0, help="the daemon's history files (2 GiB)")
    parser.add_argument("--cli-mib", type=int, default=256, help="calm import's file (256 MiB)")
    parser.add_argument("--whole-mib", type=int, default=64, help="a file calm import reads whole (64 MiB)")
    parser.add_argument("--skip-dense", action="store_true", help="no dense big file (saves disk and time)")
    parser.add_argument("--fish-mib", type=int, default=16, help="fish's short-entry history (16 MiB)")
    parser.add_argument("--fish-big-mib", type=int, default=64, help="a bigger fish history (64 MiB)")
    parser.add_argument("--only", choices=["bash", "fish"], help="one part of the bench")
    args = parser.parse_args()
    report = Report("importing history files: memory and time")
    with scratch("calm-import-bench-") as work:
        if args.only != "fish":
            bash_part(args, work)
        if args.only != "bash":
            fish_part(args, work)
    report.machine()


def fish_part(args: argparse.Namespace, work: Path) -> None:
    print("calm import of fish histories (peak less that of a 1 MiB fish file's import)")
    cli_home = work / "fish-cli"
    cli_home.mkdir()
    small = work / "small_fish_history"
    write_fish(small, MIB)
    t_small, peak_small, _ = calm_import(cli_home, small)
    print(f"  1 MiB file:                        {t_small:.1f} s, peak {mb(peak_small)}")
    runs = [(f"{args.fish_mib} MiB, short entries", args.fish_mib, False, ()),
            (f"{args.fish_mib} MiB, with `when`", args.fish_mib, True, ()),
            (f"{args.fish_big_mib} MiB, default bound", args.fish_big_mib, False, ()),
            (f"{args.fish_big_mib} MiB read whole", args.fish_big_mib, False,
             ("--max-mib", str(args.fish_big_mib)))]  # fmt: skip
    for label, size, when, extra in runs:
        path = work / "fish_history"
        entries = write_fish(path, size * MIB, when=when)
        seconds, peak, out = calm_import(cli_home, path, *extra)
        stored = int(out.split(": ", 1)[1].split(" commands", 1)[0])
        print(f"  {label + ':':<34} {entries:,} entries, {seconds:.1f} s, {stored:,} stored, "
              f"peak {mb(peak)}: +{mb(peak - peak_small)} over the 1 MiB file")  # fmt: skip
        path.unlink()
    print(f"\ndaemon first start (calmd serve, packaged model) with a {args.fish_mib} MiB fish_history")
    base_home = work / "fish-none"
    base_home.mkdir()
    _, done0, peak0, _ = daemon_start(base_home)
    print(f"  no history file:   import over {done0:.2f} s, peak {mb(peak0)}")
    home = work / "fish-daemon"
    (home / ".local" / "share" / "fish").mkdir(parents=True)
    write_fish(home / ".local" / "share" / "fish" / "fish_history", args.fish_mib * MIB)
    _, done, peak, imported = daemon_start(home)
    print(f"  short-entry fish:  import over {done:.2f} s, peak {mb(peak)} (+{mb(peak - peak0)} over no "
          f"history); {imported['commands']:,} commands; the slowest completion while it ran: "
          f"{imported['slowest_ms']} ms")  # fmt: skip


def bash_part(args: argparse.Namespace, work: Path) -> None:
    big = int(args.big_gib * (1 << 30))
    print(f"daemon first start (calmd serve, packaged model); history files of {args.big_gib:g} GiB")
    base_home = work / "none"
    base_home.mkdir()
    ready0, done0, peak0, _ = daemon_start(base_home)
    print(f"  no history file:   ready {ready0:.2f} s, import over {done0:.2f} s, peak {mb(peak0)}")
    cases = [("sparse", write_sparse)] + ([] if args.skip_dense else [("dense text", write_dense)])
    for name, write in cases:
        home = work / name.replace(" ", "-")
        home.mkdir()
        write(home / ".bash_history", big)
        ready, done, peak, imported = daemon_start(home)
        print(f"  {name + ':':<18} ready {ready:.2f} s, import over {done:.2f} s, peak {mb(peak)} "
              f"(+{mb(peak - peak0)} over no history, {ready / ready0:.2f}x its time to ready); "
              f"{imported['commands']:,} commands, refused {imported['refused']}")  # fmt: skip
        shutil.rmtree(home)

    print(f"\ncalm import of a {args.cli_mib} MiB text history (bound: the newest 16 MiB by default)")
    small = work / "small_history"
    write_dense(small, MIB)
    cli_home = work / "cli"
    cli_home.mkdir()
    t_small, peak_small, _ = calm_import(cli_home, small)
    print(f"  1 MiB file:            {t_small:.1f} s, peak {mb(peak_small)}")
    file = work / "big_history"
    write_dense(file, args.cli_mib * MIB)
    whole = work / "whole_history"
    write_dense(whole, args.whole_mib * MIB)
    runs = [(f"{args.cli_mib} MiB, default bound", file, ()),
            (f"{args.whole_mib} MiB read whole", whole, ("--max-mib", str(args.whole_mib)))]  # fmt: skip
    for label, path, extra in runs:
        seconds, peak, out = calm_import(cli_home, path, *extra)
        stored = int(out.split(": ", 1)[1].split(" commands", 1)[0])
        print(f"  {label + ':':<28} {seconds:.1f} s, {stored:,} commands ({stored / seconds:,.0f}/s), "
              f"peak {mb(peak)}: +{mb(peak - peak_small)} over the 1 MiB file, "
              f"{peak * 1024 / path.stat().st_size:.2f}x the file")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(run_tool(PROG, main))
