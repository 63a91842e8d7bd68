"""Keystroke benchmark for the zsh hook, side by side with zsh-autosuggestions (history strategy).

    python bench/shell_keystroke.py [--rounds 2] [--engine scripted|model] [--baseline DIR]

Each configuration runs in its own zsh inside tmux (no rc file but the plugin): plain zsh (the
baseline), calm, and zsh-autosuggestions in its default async mode and in sync mode. The same
commands are in both histories; every command is typed key by key. calm runs against a real
daemon: with `--engine scripted` (the default) the scripted engine of the tests, whose answers are
history prefix matches, so the model's own latency is left out; with `--engine model` the packaged
model, as a user has it, where the first key of a line depends on the daemon's early answer (the
history's best line, sent before the model runs). calm runs with CALM_MIN_CONFIDENCE=0: what is
measured is how fast the expected line shows, not whether it is sure enough to be shown. With
--baseline DIR (a checkout of another commit: `git archive <commit> | tar -x -C DIR`), calm is run
a second time against that checkout's daemon (this tree's hook and helper), and the configurations
take turns round by round (the order rotating), so that all see the same load.

Measured per keystroke:
- latency: from `send-keys` to the expected suggestion on screen, polled through a tmux control
  client (`capture-pane` every ~0.2 ms, no process per poll). "first" is the first key of a line
  (the suggestion must be fetched); "next" the following keys (typed ahead of the suggestion).
- hook: wall time inside the plugin's own functions, EPOCHREALTIME around them (calm:
  _calm_pre_redraw + _calm_on_reply; zsh-autosuggestions: _zsh_autosuggest_modify, which includes
  the original self-insert, + _zsh_autosuggest_async_response).
- shell CPU: user+system time of the zsh process (/proc) minus plain zsh's, and CPU of processes
  it forked and reaped (autosuggestions' async mode forks once per key) or of calm's helper.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calmd.arguments import Parser, run_tool  # noqa: E402
from calmd.shell.client import CalmClient  # noqa: E402
from tests.support.daemon import running_daemon  # noqa: E402
from tests.support.tmux import PROMPT, autosuggestions, init_script, shell_env  # noqa: E402

COMMANDS = [
    "git status --short",
    "ls -la /var/log",
    "docker ps -a",
    "make test",
    "python -m pytest -q",
    "cargo build --release",
    "kubectl get pods -A",
    "npm run dev",
    "ssh deploy@example.org",
    "tar xzf archive.tar.gz",
    "echo hello world",
    "find . -name x.py",
    "rsync -av src/ dst/",
    "journalctl -u calmd -f",
    "vim README.md",
]
DIM = "\x1b[90m"
TICK = os.sysconf("SC_CLK_TCK")

CALM_WRAP = """
functions -c _calm_pre_redraw _bench_pre_redraw
functions -c _calm_on_reply _bench_on_reply
_calm_pre_redraw() { local t=$EPOCHREALTIME; _bench_pre_redraw "$@"; (( _BENCH_T += EPOCHREALTIME - t )) }
_calm_on_reply() { local t=$EPOCHREALTIME; _bench_on_reply "$@"; (( _BENCH_T += EPOCHREALTIME - t )) }
"""
AUTO_WRAP = """
functions -c _zsh_autosuggest_modify _bench_modify
functions -c _zsh_autosuggest_async_response _bench_response
_zsh_autosuggest_modify() {
  local t=$EPOCHREALTIME r; _bench_modify "$@"; r=$?; (( _BENCH_T += EPOCHREALTIME - t )); return r
}
_zsh_autosuggest_async_response() {
  local t=$EPOCHREALTIME; _bench_response "$@"; (( _BENCH_T += EPOCHREALTIME - t ))
}
"""


class Control:
    """A tmux control-mode client: commands in, replies out, without a process per command."""

    def __init__(self, server: str) -> None:
        self.proc = subprocess.Popen(
            ["tmux", "-L", server, "-C", "attach", "-t", "t"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )  # fmt: skip
        self.replies: queue.Queue[list[str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.replies.get(timeout=10)  # the attach itself is answered first

    def _read(self) -> None:
        assert self.proc.stdout is not None
        block: list[str] | None = None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("%begin"):
                block = []
            elif line.startswith(("%end", "%error")) and block is not None:
                self.replies.put(block)
                block = None
            elif block is not None:
                block.append(line)

    def command(self, cmd: str) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.replies.get(timeout=10)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@dataclass
class Result:
    name: str
    first: list[float] = field(default_factory=list)  # ms
    next: list[float] = field(default_factory=list)
    keys: int = 0
    hook_ms: float = 0.0
    cpu_ms: float = 0.0
    child_cpu_ms: float = 0.0
    missed: int = 0

    def merge(self, other: Result) -> None:
        """Another round of the same configuration (the per-key averages weighted by keys)."""
        n, m = self.keys + self.missed, other.keys + other.missed
        for name in ("hook_ms", "cpu_ms", "child_cpu_ms"):
            setattr(self, name, (getattr(self, name) * n + getattr(other, name) * m) / max(n + m, 1))
        self.first += other.first
        self.next += other.next
        self.keys += other.keys
        self.missed += other.missed


def cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children) CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / TICK
    children = (int(fields[13]) + int(fields[14])) / TICK
    return own, children


def helper_pids(shell_pid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == shell_pid and b"shell-helper" in cmdline:
            pids.append(int(entry.name))
    return pids


def run_config(
    name: str, home: Path, rc: str, ghost: bool, rounds: int, env: dict[str, str], think: float = 0.0
) -> Result:
    zdot = home / f"zdot-{name.replace(' ', '-').replace('(', '').replace(')', '')}"
    zdot.mkdir(exist_ok=True)
    histfile = home / "zsh_history"
    (zdot / ".zshrc").write_text(
        f"PS1={shlex.quote(PROMPT)}\nRPS1=\nunsetopt PROMPT_SP\nHISTFILE={histfile}\nSAVEHIST=1000\n"
        f"HISTSIZE=1000\nfc -R\ntypeset -gF _BENCH_T=0\nzmodload zsh/datetime\n{rc}\n"
    )
    server = f"calm-bench-{os.getpid()}-{zdot.name}"
    full_env = dict(env, ZDOTDIR=str(zdot))
    tmux = ["tmux", "-L", server, "-f", "/dev/null"]
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "120", "-y", "40", "-s", "t", "-c", str(home),
         "env", "-i", *(f"{k}={v}" for k, v in full_env.items()), "zsh", "-d", "-i"],
        check=True,
    )  # fmt: skip
    ctl = Control(server)
    result = Result(name)
    try:
        shell_pid = int(ctl.command("display-message -p -t t '#{pane_pid}'")[0])

        def line() -> str:
            y = int(ctl.command("display-message -p -t t '#{cursor_y}'")[0])
            return ctl.command(f"capture-pane -p -e -t t -S {y} -E {y}")[0]

        def wait(expect: str, timeout: float = 2.0) -> bool:
            deadline = time.perf_counter() + timeout
            expect = expect.rstrip()
            while time.perf_counter() < deadline:
                if expect in line():
                    return True
            return False

        wait(PROMPT.rstrip(), timeout=10)
        time.sleep(0.5)  # let the helper start and connect
        cpu0, child0 = cpu(shell_pid)
        helpers = helper_pids(shell_pid)
        helper0 = sum(sum(cpu(p)) for p in helpers)
        for _ in range(rounds):
            for cmd in COMMANDS:
                ctl.command("send-keys -t t C-u")
                wait(PROMPT.rstrip())
                time.sleep(think)  # a user's pause before the first key of a line
                for i, ch in enumerate(cmd[:-1]):
                    typed, rest = cmd[: i + 1], cmd[i + 1 :]
                    expect = f"{typed}{DIM}{rest}" if ghost else typed
                    start = time.perf_counter()
                    ctl.command(f"send-keys -t t -l -- {shlex.quote(ch)}")
                    if not wait(expect):
                        result.missed += 1
                        continue
                    ms = (time.perf_counter() - start) * 1e3
                    (result.first if i == 0 else result.next).append(ms)
                    result.keys += 1
        cpu1, child1 = cpu(shell_pid)
        helper1 = sum(sum(cpu(p)) for p in helpers if Path(f"/proc/{p}").exists())
        n = max(result.keys + result.missed, 1)
        result.cpu_ms = (cpu1 - cpu0) * 1e3 / n
        result.child_cpu_ms = ((child1 - child0) + (helper1 - helper0)) * 1e3 / n
        out = home / f"hook-{server}.txt"
        ctl.command("send-keys -t t C-u")
        ctl.command(f"send-keys -t t -l -- {shlex.quote(f' print -r -- $_BENCH_T > {out}')}")
        ctl.command("send-keys -t t Enter")
        deadline = time.monotonic() + 5
        while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.01)
        result.hook_ms = float(out.read_text().strip() or 0) * 1e3 / n
    finally:
        ctl.close()
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    return result


def fmt(values: list[float], q: float) -> str:
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))]:.2f}"


@contextlib.contextmanager
def baseline_daemon(tree: Path | None, home: Path, model: bool) -> Iterator[Path | None]:
    """`calmd serve` of another checkout (`tree`), the packaged model (or, without --engine model,
    the tests' scripted engine of that checkout) in a HOME of its own, started and stopped by the
    tests' starter (tests/support/daemon.py, as bench/harness.py's daemons); its socket."""
    if tree is None:
        yield None
        return
    home.mkdir()
    scripted = (
        sys.executable,
        "-c",
        "from tests.support.serve_scripted import main; raise SystemExit(main())",
        "serve",
    )
    with running_daemon(home, engine="model", tree=tree.resolve(), weights=not model,
                        command=None if model else scripted,
                        args=("--no-import", "--train-threshold", "0")) as other:  # fmt: skip
        yield other.socket


def daemon_figures(socket: Path) -> str:
    """What `calmd status` says of the keystrokes it answered (first line out, `done`)."""
    with CalmClient(socket) as client:
        lat = client.status()["status"]["latency_ms"]
    said = [f"{what} p{q} {lat[f'{what}_p{q}']:.2f}" for what in ("first", "done") for q in (50, 90)
            if isinstance(lat.get(f"{what}_p{q}"), float)]  # fmt: skip
    return ", ".join(said) + " ms" if said else "none"


PROG = "bench/shell_keystroke.py"


def main() -> int:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="times each command is typed")
    parser.add_argument(
        "--engine", choices=("scripted", "model"), default="scripted", help="calm's daemon engine"
    )
    parser.add_argument(
        "--think", type=float, default=0.0, metavar="S",
        help="seconds between the start of a line and its first key (a user's pause; 0: at once)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", type=Path, metavar="DIR", help="another checkout's daemon, beside this one"
    )
    args = parser.parse_args()
    plugin = autosuggestions()
    with tempfile.TemporaryDirectory(prefix="calm-bench-") as tmp:
        home = Path(tmp)
        (home / "zsh_history").write_text("".join(c + "\n" for c in COMMANDS))
        model = args.engine == "model"  # the packaged model, or the scripted engine of the tests
        with (
            running_daemon(home, engine="model" if model else "scripted", weights=not model) as daemon,
            baseline_daemon(args.baseline, home / "baseline", model) as other,
        ):
            env = shell_env(home, CALM_MIN_CONFIDENCE="0")
            for socket in (daemon.socket, other):
                if socket is None:
                    continue
                with CalmClient(socket) as client:
                    for cmd in COMMANDS:
                        client.record(cmd, exit=0, session="bench")
            script = init_script("zsh", home)
            calm_rc = f'eval "$(< {script})"\n{CALM_WRAP}'
            configs = [("plain zsh", "", False, env), ("calm", calm_rc, True, env)]
            if other is not None:
                configs.append(("calm (baseline)", calm_rc, True, {**env, "CALMD_SOCKET": str(other)}))
            if plugin is not None:
                auto = f"source {plugin}\nZSH_AUTOSUGGEST_STRATEGY=(history)\n"
                configs.append(("autosuggestions async", auto + AUTO_WRAP, True, env))
                configs.append(
                    (
                        "autosuggestions sync",
                        auto + "unset ZSH_AUTOSUGGEST_USE_ASYNC\n" + AUTO_WRAP,
                        True,
                        env,
                    )
                )
            merged: dict[str, Result] = {}
            for turn in range(args.rounds):
                k = turn % len(configs)
                for name, rc, ghost, config_env in configs[k:] + configs[:k]:  # the order rotates
                    got = run_config(name, home, rc, ghost, 1, config_env, args.think)
                    if name in merged:
                        merged[name].merge(got)
                    else:
                        merged[name] = got
            results = [merged[name] for name, *_ in configs]
            daemons = [("calm", daemon.socket), ("calm (baseline)", other)]
            own = {name: daemon_figures(socket) for name, socket in daemons if socket is not None}
    base = results[0]
    print(f"zsh keystroke benchmark ({args.engine} engine, think {args.think:g} s, "
          f"load {os.getloadavg()[0]:.2f}): {len(COMMANDS)} "
          f"commands x {args.rounds} rounds, {sum(len(c) - 1 for c in COMMANDS) * args.rounds} keys per "
          "configuration")  # fmt: skip
    head = (
        f"{'configuration':24} {'first p50':>9} {'first p90':>9} {'next p50':>8} {'next p90':>8} "
        f"{'hook ms':>8} {'shell CPU':>9} {'other CPU':>9} {'missed':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        extra = r.cpu_ms - base.cpu_ms
        print(
            f"{r.name:24} {fmt(r.first, 0.5):>9} {fmt(r.first, 0.9):>9} {fmt(r.next, 0.5):>8} "
            f"{fmt(r.next, 0.9):>8} {r.hook_ms:8.3f} {extra:9.3f} {r.child_cpu_ms:9.3f} {r.missed:6d}"
        )
    print("latencies in ms from key to suggestion on screen; hook, shell CPU (above plain zsh) and other CPU")
    print("(forked children, or calm's helper) in ms per keystroke")
    for name, figures in own.items():
        print(f"{name}: the daemon's own figures (calmd status, every request of the run, in the daemon): "
              f"{figures}")  # fmt: skip
    calm = next((r for r in results if r.name == "calm"), None)
    for r in results:
        if (
            calm is None
            or not r.name.startswith(("autosuggestions", "calm ("))
            or not calm.first
            or not r.first
        ):
            continue
        print(
            f"ratio {r.name} / calm: first-key latency p50 "
            f"{statistics.median(r.first) / statistics.median(calm.first):.2f}x, hook time "
            f"{r.hook_ms / calm.hook_ms if calm.hook_ms else float('nan'):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
