"""What the user sees: ghosts drawn in a real zsh, calm against zsh-autosuggestions, same keys.

    python bench/screen_ghosts.py [--users 8] [--commands 5] [--pace 0.12]

For each held-out user of the public histories (users the packaged model and every fit never
saw), the first `--history` commands are the history (calm: recorded in a real daemon running the
packaged model and the ghost rule as shipped, CALM_MIN_CONFIDENCE unset; zsh-autosuggestions:
read into zsh's history, its default async history strategy); then `--commands` of the commands
after them are typed key by key at `--pace` seconds a key, each line cleared (Ctrl-U, never run)
before the next, in a zsh inside tmux with only that plugin loaded. Both configurations type the
same keys; every line starts at the empty prompt (calm asks for a prediction there).

The plugins' entry points are wrapped to log, with EPOCHREALTIME, the buffer and the ghost text
(POSTDISPLAY) each time they return: the log is what zsh draws. Per keystroke (from the key to
the next one), on the buffer the key made:
- drawn: a ghost is on the screen when the next key is pressed (and on the first key of a line,
  and on the empty prompt before it);
- replaced: a ghost that was on the screen for this buffer (carried from the previous key when
  the user typed along it, or drawn after the key) was replaced by another line or taken away
  before the next key: the flicker issue 22 asks to keep at <= 2% of keystrokes; with the line
  the user went on to type (the old one, the new one) counted;
- right: the ghost on the screen at the next key is the rest of the line typed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calmd import paths  # noqa: E402
from calmd.arguments import Parser, run_tool  # noqa: E402
from calmd.shell.client import CalmClient  # noqa: E402
from calmd.training.corpus import DEFAULT_DATA, held_out, history_users, read_history  # noqa: E402
from tests.support.daemon import running_daemon  # noqa: E402
from tests.support.tmux import autosuggestions, zsh_terminal  # noqa: E402

LOG_CALM = """
zmodload zsh/datetime
_bench_log() {
  local b=${BUFFER//[$'\\n\\t']/ } g=${POSTDISPLAY//[$'\\n\\t']/ }
  print -r -- "$EPOCHREALTIME"$'\\t'"$b"$'\\t'"$g" >> {log}
}
functions -c _calm_pre_redraw _bench_pre_redraw
functions -c _calm_on_reply _bench_on_reply
functions -c _calm_restore _bench_restore
_calm_pre_redraw() { _bench_pre_redraw "$@"; local r=$?; _bench_log; return r }
_calm_on_reply() { _bench_on_reply "$@"; local r=$?; _bench_log; return r }
_calm_restore() { _bench_restore "$@"; local r=$?; _bench_log; return r }
"""
LOG_AUTO = """
zmodload zsh/datetime
_bench_log() {
  local b=${BUFFER//[$'\\n\\t']/ } g=${POSTDISPLAY//[$'\\n\\t']/ }
  print -r -- "$EPOCHREALTIME"$'\\t'"$b"$'\\t'"$g" >> {log}
}
functions -c _zsh_autosuggest_modify _bench_modify
functions -c _zsh_autosuggest_async_response _bench_response
_zsh_autosuggest_modify() { _bench_modify "$@"; local r=$?; _bench_log; return r }
_zsh_autosuggest_async_response() { _bench_response "$@"; local r=$?; _bench_log; return r }
"""


def typeable(cmd: str) -> bool:
    return 2 <= len(cmd) <= 60 and cmd.isprintable() and "\\" not in cmd


def type_lines(term: object, lines: list[str], pace: float) -> list[tuple[str, list[float]]]:
    """Type each line key by key at `pace`, then clear it; returns (line, times of its keys)."""
    typed: list[tuple[str, list[float]]] = []
    for line in lines:
        time.sleep(pace * 3)  # the empty prompt's prediction has time to come
        keys: list[float] = []
        for ch in line:
            keys.append(time.time())
            term.type(ch)  # type: ignore[attr-defined]
            time.sleep(max(0.0, pace - (time.time() - keys[-1])))
        keys.append(time.time())  # the end of the last key's interval
        term.send("C-u")  # type: ignore[attr-defined]
        typed.append((line, keys))
    time.sleep(pace * 3)
    return typed


def read_log(path: Path) -> list[tuple[float, str, str]]:
    events = []
    for row in path.read_text(errors="replace").splitlines():
        parts = row.split("\t")
        try:
            events.append((float(parts[0]), parts[1], parts[2]))
        except (ValueError, IndexError):
            continue  # a line cut by the end of the run
    return events


def analyse(
    events: list[tuple[float, str, str]], typed: list[tuple[str, list[float]]], tally: Counter[str]
) -> None:
    for line, keys in typed:
        shown = ""  # the full line on the screen (buffer + ghost) before this key
        start = keys[0] - 3 * (keys[1] - keys[0] if len(keys) > 1 else 0.12)
        before = [e for e in events if start <= e[0] < keys[0] and e[1] == ""]
        if before:
            tally["empty prompts"] += 1
            tally["empty prompts drawn"] += bool(before[-1][2])
            shown = before[-1][1] + before[-1][2] if before[-1][2] else ""
        for i in range(len(line)):
            buffer = line[: i + 1]
            lo, hi = keys[i], keys[i + 1]
            seen = [e[1] + e[2] if e[2] else "" for e in events if lo <= e[0] < hi and e[1] == buffer]
            states: list[str] = []
            if shown and len(shown) > len(buffer) and shown.startswith(buffer):
                states.append(shown)  # typed along it: still on the screen
            for s in seen:
                if not states or states[-1] != s:
                    states.append(s)
            if not states:
                states = [""]
            tally["keystrokes"] += 1
            changes = [(a, b) for a, b in itertools.pairwise(states) if a]
            if changes:
                tally["replaced"] += 1
                tally["replaced by the line typed"] += any(b == line for _, b in changes)
                tally["replaced the line typed"] += any(a == line for a, _ in changes)
            final = states[-1]
            tally["drawn"] += bool(final)
            tally["right"] += final == line
            if i == 0:
                tally["first keys"] += 1
                tally["first keys drawn"] += bool(final)
            shown = final


def run(config: str, users: list[tuple[list[str], list[str]]], pace: float) -> Counter[str]:
    tally: Counter[str] = Counter()
    for history, lines in users:
        home = Path(tempfile.mkdtemp(prefix=f"calm-screen-{config}-"))
        log = home / "ghosts.log"
        try:
            if config == "calm":
                (home / "data").mkdir(mode=0o700)
                shutil.copy(paths.packaged_weights(), home / "data" / paths.WEIGHTS)
                with running_daemon(home, engine="model", args=("--no-import",)) as daemon:
                    with CalmClient(daemon.socket) as client:
                        for cmd in history:
                            client.record(cmd, exit=0, cwd=str(home), session="earlier")
                    with zsh_terminal(home, after=LOG_CALM.replace("{log}", shlex.quote(str(log))),
                                      CALM_MIN_CONFIDENCE="") as term:  # fmt: skip
                        term.wait_for("^PROMPT>")
                        typed = type_lines(term, lines, pace)
            else:
                plugin = autosuggestions()
                if plugin is None:
                    raise SystemExit("needs zsh-autosuggestions (apt-get install zsh-autosuggestions)")
                histfile = home / "zsh_history"
                histfile.write_text("".join(f"{c}\n" for c in history))
                rc = (f"HISTSIZE=100000; SAVEHIST=0; fc -R {shlex.quote(str(histfile))}\nsource {plugin}\n"
                      + LOG_AUTO.replace("{log}", shlex.quote(str(log))))  # fmt: skip
                with zsh_terminal(home, setup=rc) as term:
                    term.wait_for("^PROMPT>")
                    typed = type_lines(term, lines, pace)
            analyse(read_log(log), typed, tally)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    return tally


PROG = "bench/screen_ghosts.py"


def main() -> None:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--users", type=int, default=8, help="held-out users")
    parser.add_argument("--history", type=int, default=300, help="commands each user has run before")
    parser.add_argument("--commands", type=int, default=5, help="commands typed per user")
    parser.add_argument("--pace", type=float, default=0.12, help="seconds per key")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    chosen: list[tuple[list[str], list[str]]] = []
    for path in history_users(args.data):
        if not held_out(path.stem):
            continue
        commands = read_history(path)
        later = [c for c in commands[args.history :] if typeable(c)]
        if len(commands) <= args.history or len(later) < args.commands:
            continue
        chosen.append((commands[: args.history], rng.sample(later, args.commands)))
        if len(chosen) >= args.users:
            break
    load = os.getloadavg()[0]
    results = {config: run(config, chosen, args.pace) for config in ("calm", "zsh-autosuggestions")}
    load = max(load, os.getloadavg()[0])
    keys = sum(len(lines) and sum(len(c) for c in lines) for _, lines in chosen)
    print(
        f"{len(chosen)} held-out users, {sum(len(x) for _, x in chosen)} commands, {keys} keys at "
        f"{args.pace * 1000:.0f} ms a key; load average up to {load:.2f}\n"
    )
    rows = [
        ("ghost drawn at the next key", "drawn", "keystrokes"),
        ("... and it is the line typed", "right", "keystrokes"),
        ("ghost on the first key of a line", "first keys drawn", "first keys"),
        ("ghost on the empty prompt", "empty prompts drawn", "empty prompts"),
        ("ghost replaced within a keystroke", "replaced", "keystrokes"),
    ]
    print(f"{'':<38}{'calm':>16}{'zsh-autosuggestions':>22}")
    for name, num, den in rows:
        cells = "".join(
            f"{t[num]:>8}/{t[den]:<5}{(t[num] / t[den] * 100 if t[den] else 0):>5.1f}%".rjust(
                16 if i == 0 else 22
            )
            for i, t in enumerate(results.values())
        )
        print(f"{name:<38}{cells}")
    for config, t in results.items():
        if t["replaced"]:
            print(
                f"{config}: of {t['replaced']} replacements, the new line was the one typed "
                f"{t['replaced by the line typed']} times, the old one {t['replaced the line typed']}"
            )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
