"""What calm's setup line costs a shell at start, beside plain shells and zsh-autosuggestions.

    python bench/shell_startup.py [--runs 20]

Each configuration starts an interactive shell on a pseudo-terminal (zsh -d with its own ZDOTDIR,
or bash --rcfile) and measures the time from the fork to the first prompt on the terminal: the
rc file, the first precmd (where calm starts its helper: a FIFO, a process substitution) and
zle's line-init. Then it types `exit`. Configurations are interleaved run by run, so that all see
the same machine, and each is compared with the plain shell of the same run (medians).

- zsh / bash: nothing but the prompt.
- calm (setup line): the line docs/shells.md gives (tests.support.tmux.SETUP_LINES), with the hook file
  present, as after the first start: zsh sources it, bash evals `cat`'s output.
- calm (eval calmd init): `eval "$(calmd init zsh)"`, which starts Python every time.
- zsh-autosuggestions: `source .../zsh-autosuggestions.zsh` (its widgets are bound at the first
  precmd, also inside the measured time).

calm's helper (Python) starts in the background at the first prompt; the shell does not wait for
it, but on a busy machine it competes for the CPU with the next run, so each run waits for the
previous one's helper to be gone.
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calmd import paths  # noqa: E402
from calmd.arguments import Parser, run_tool  # noqa: E402
from tests.support.tmux import SETUP_LINES, autosuggestions  # noqa: E402

PROMPT = b"READY> "
CALMD = Path(sys.executable).parent / "calmd"


def to_prompt(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from the fork to the prompt; the shell is made to exit afterwards."""
    start = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(argv[0], argv, env)
    seen = b""
    elapsed = None
    try:
        deadline = start + 30
        while elapsed is None:
            if time.perf_counter() > deadline:
                raise SystemExit(f"no prompt from {argv}: {seen[-300:]!r}")
            if select.select([fd], [], [], 1)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    raise SystemExit(f"{argv} ended before its prompt: {seen[-300:]!r}") from None
                if PROMPT in seen:
                    elapsed = time.perf_counter() - start
        os.write(fd, b"exit\n")
        while True:  # read until the terminal closes, so the shell never blocks on output
            try:
                if not os.read(fd, 65536):
                    break
            except OSError:
                break
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    return elapsed


def helpers_gone(data: Path, timeout: float = 10.0) -> None:
    """Wait until no calm helper of this bench (its environment names our data dir) runs."""
    mark = f"CALM_HOME={data}".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = False
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                if b"shell-helper" in cmdline and mark in (proc / "environ").read_bytes():
                    alive = True
                    break
            except OSError:
                continue
        if not alive:
            return
        time.sleep(0.02)


PROG = "bench/shell_startup.py"


def main() -> int:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="calm-startup-") as tmp:
        home = Path(tmp)
        data = home / "data"
        run = home / "run"
        run.mkdir(mode=0o700)
        env = {
            "HOME": str(home), "TERM": "xterm-256color", "PATH": f"{CALMD.parent}:/usr/bin:/bin",
            "CALM_HOME": str(data), "XDG_RUNTIME_DIR": str(run), "CALMD_SOCKET": str(run / paths.SOCKET),
            "PYTHONPATH": str(ROOT), "LANG": os.environ.get("LANG", "C.UTF-8"),
        }  # fmt: skip
        for shell in ("zsh", "bash"):  # the hook files, as the first start through the setup line leaves them
            subprocess.run([str(CALMD), "init", shell], env=env, check=True, capture_output=True)
        configs: dict[str, tuple[list[str], str]] = {}

        def zsh(name: str, rc: str) -> None:
            zdot = home / f"zdot-{len(configs)}"
            zdot.mkdir()
            prompt = shlex.quote(PROMPT.decode())
            (zdot / ".zshrc").write_text(f"PS1={prompt}\nRPS1=\nunsetopt PROMPT_SP\n{rc}\n")
            configs[name] = (["/usr/bin/env", f"ZDOTDIR={zdot}", "zsh", "-d", "-i"], "zsh")

        def bash(name: str, rc: str) -> None:
            path = home / f"bashrc-{len(configs)}"
            path.write_text(f"PS1={shlex.quote(PROMPT.decode())}\n{rc}\n")
            configs[name] = (["/usr/bin/env", "bash", "--noprofile", "--rcfile", str(path), "-i"], "bash")

        zsh("zsh", "")
        zsh("zsh + calm (setup line)", SETUP_LINES["zsh"])
        zsh("zsh + calm (eval calmd init)", 'eval "$(calmd init zsh)"')
        plugin = autosuggestions()
        if plugin is not None:
            zsh("zsh + zsh-autosuggestions", f"source {plugin}")
        bash("bash", "")
        bash("bash + calm (setup line)", SETUP_LINES["bash"])
        bash("bash + calm (eval calmd init)", 'eval "$(calmd init bash)"')

        times: dict[str, list[float]] = {name: [] for name in configs}
        for argv, _ in configs.values():  # warm the page cache
            to_prompt(argv, env)
            helpers_gone(data)
        for _ in range(args.runs):
            for name, (argv, _) in configs.items():
                times[name].append(to_prompt(argv, env) * 1e3)
                helpers_gone(data)
    load = os.getloadavg()
    print(f"shell start to first prompt, {args.runs} runs each, interleaved (load {load[0]:.2f})")
    print(f"{'configuration':32} {'median ms':>9} {'p90 ms':>7} {'over plain':>10}")
    base = {shell: statistics.median(times[shell]) for shell in ("zsh", "bash")}
    for name, (_, shell) in configs.items():
        values = sorted(times[name])
        median = statistics.median(values)
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        over = f"{median - base[shell]:+.1f}" if name != shell else "-"
        print(f"{name:32} {median:9.1f} {p90:7.1f} {over:>10}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
