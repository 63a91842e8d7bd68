"""`calmd serve`, `status`, `stop`, `complete` and `install-systemd`: the daemon, run and asked."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calmd import paths
from calmd.arguments import Flags, Parser, add_flags, config_from, number, whole
from calmd.cli.common import connect, new_console
from calmd.daemon.config import ServerConfig
from calmd.errors import CalmError
from calmd.visible import json_text, visible, visible_value

if TYPE_CHECKING:
    from calmd.daemon.service import Engine
    from calmd.shell.client import CalmClient


# `calmd serve`'s flags for ServerConfig's fields: their defaults are the dataclass's
SERVE_FLAGS: Flags = {
    "train_threshold": (("--train-threshold",), {"type": whole(0, 10**9), "metavar": "N",
                        "help": "new commands before a background training run (0: only on request)"}),
    "train_max_load": (("--train-max-load",), {"type": number(0, 10**6), "metavar": "LOAD",
                       "help": "start a run automatically only while the 1-minute load average per core "
                       "is below this"}),
    "train_check_interval_s": (("--train-check-interval",), {"type": number(0, 86400), "metavar": "SECONDS",
                               "help": "seconds between due checks for a background run, besides those at "
                               "start, after the first-start import and on record (0: none)"}),
    "max_connections": (("--max-connections",), {"type": whole(0, 65536), "metavar": "N",
                        "help": "concurrent clients; more are refused with an error (0: 256, fewer under a "
                        "low fd limit)"}),
    "reply_timeout_s": (("--reply-timeout",), {"type": number(0, 86400, above=True), "metavar": "SECONDS",
                        "help": "close a client that leaves 256 KiB of replies unread this long"}),
    "graceful_timeout": (("--graceful-timeout",), {"type": number(0, 3600, above=True), "metavar": "SECONDS",
                         "help": "SIGTERM/SIGINT to exit, at most: in-flight answers, the run's stop"}),
}  # fmt: skip


def cmd_serve(args: argparse.Namespace, engine_loader: Callable[[Path], Engine] | None = None) -> int:
    """`calmd serve`. `engine_loader` replaces the model for tests (tests/support/serve_scripted.py)."""
    import logging

    from calmd.daemon.server import run_server

    if engine_loader is None:  # the model's engine: torch and the model (1.5 s of imports) only here
        from calmd.suggest.engine import load_engine

        engine_loader = load_engine

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    config = config_from(
        ServerConfig, args, SERVE_FLAGS,
        socket_path=Path(args.socket) if args.socket else paths.socket_path(),
        data_dir=paths.data_dir(),
        weights_path=Path(args.model) if args.model else paths.weights_path(),
        import_shell_history=not args.no_import,
        train_args=tuple(args.train_arg or ()),
        prefetch=not args.no_prefetch,
        hangup_stops=_in_a_terminal(),
    )  # fmt: skip
    return run_server(config, engine_loader)


def _in_a_terminal() -> bool:
    """Whether `calmd serve` was typed at a prompt (its standard input is the terminal): then
    closing the terminal (SIGHUP) stops it, like any program started there. Under systemd, from
    CALM_AUTOSTART or under nohup, stdin is no terminal and SIGHUP reloads the weights."""
    try:
        return os.isatty(0)
    except OSError:
        return False


def cmd_status(args: argparse.Namespace) -> int:
    from calmd.shell.client import DaemonNotRunning

    try:
        with connect(args) as client:
            status = client.status()["status"]
    except DaemonNotRunning as exc:
        if args.json:
            print(json_text({"running": False, "error": str(exc)}))
        else:
            print(f"calmd is not running ({visible(str(exc))})", file=sys.stderr)
        return 3
    if args.json:
        print(json_text({"running": True, **status}, indent=2))
        return 0
    from calmd.cli.status_view import status_table

    new_console(args.no_color).print(status_table(status))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from calmd.shell.client import DaemonNotRunning, stop_daemon

    try:
        pid, stopped = stop_daemon(Path(args.socket) if args.socket else None, timeout=args.timeout)
    except DaemonNotRunning as exc:
        print(f"calmd is not running ({exc})", file=sys.stderr)
        return 3
    if not stopped:
        print(f"calmd (pid {pid}) did not stop within {args.timeout:g} s", file=sys.stderr)
        return 1
    print(f"calmd (pid {pid}) stopped")
    return 0


def cmd_train_now(args: argparse.Namespace) -> int:
    """`calmd train` (and `calm train --now`): ask the daemon for a background run now, whatever
    the load and the count of new commands, and follow it to its end: its progress, then its
    result. A run already in progress is followed instead. Exit 0 when the run finished (swapped
    in or not), 1 when it failed or was stopped, 3 when no daemon runs."""
    from calmd.shell.client import CalmClient, DaemonNotRunning

    sock, timeout = getattr(args, "socket", None), getattr(args, "timeout", 10.0)
    try:
        with CalmClient(Path(sock) if sock else None, timeout=timeout) as client:
            answer = client.train()
            pid = answer.get("pid")
            if answer.get("started"):
                print(f"training run started (pid {pid})", flush=True)
            elif answer.get("reason") == "a training run is in progress" or pid:
                print(
                    f"{visible_value(answer.get('reason'))}{f' (pid {pid})' if pid else ''}: following it",
                    flush=True,
                )
            else:
                raise CalmError(f"the daemon started no training run: {visible_value(answer.get('reason'))}")
            return _follow_training(client, pid)
    except DaemonNotRunning as exc:
        print(f"calmd is not running ({exc}); start it with `calmd serve`", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("stopped following; the run goes on (`calmd status` shows it)", file=sys.stderr)
        return 130
    except ConnectionError:
        raise CalmError(
            "calmd went away while the run was followed (it stops its run); `calmd status` tells how "
            "it ended once the daemon is back"
        ) from None


def _follow_training(client: CalmClient, pid: int | None, poll_s: float = 0.25) -> int:
    """Poll `status` until the run `pid` (the first run seen, without one) has ended; print each
    new stage and step, then the result."""
    from calmd.cli.status_view import progress_words

    shown: tuple[object, ...] = ()
    deadline = time.monotonic() + 60  # to see a run that is being started at all
    while True:
        training = client.status()["status"]["training"]
        live = training.get("pid")
        if live is not None and pid is None:
            pid = live
        if live is not None and live == pid:
            progress = training.get("progress") or {}
            stage = (training.get("state"), progress.get("step"))
            if stage != shown:
                shown = stage
                words = f": {progress_words(progress)}" if "step" in progress else ""
                print(f"{visible_value(training.get('state'))}{words}", flush=True)
        elif pid is not None or time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    last = training.get("last_result") or {}
    if pid is None or not last:
        raise CalmError("the training run ended without a result; `calmd status` and training.log say more")
    result = f"{visible_value(last.get('state'))}: {visible_value(last.get('reason'))}"
    for line in result_lines(result, _terminal_width()):  # escapes hold no space: never wrapped inside
        print(line)
    return 0 if last.get("state") == "done" else 1


def _terminal_width() -> int | None:
    """The terminal's columns when stdout is one (None for a pipe: a line a program reads whole)."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def result_lines(text: str, width: int | None) -> list[str]:
    """A run's result for a terminal `width` wide: each clause (the model's, the ranker's: `; `)
    on its own line, wrapped between words. The terminal cut the one long line anywhere, a
    continuation starting with a space ("the result line wraps with a leading space"). For a
    pipe (`width` None), the one line a script reads."""
    if width is None:
        return [text]
    wrap = textwrap.TextWrapper(max(20, width - 1), break_long_words=False, break_on_hyphens=False)
    return [line for clause in text.split("; ") for line in wrap.wrap(clause)]


def cmd_complete(args: argparse.Namespace) -> int:
    from calmd.protocol import MAX_INPUT_BYTES, wire_text
    from calmd.shell.client import DaemonError, DaemonNotRunning

    if len(args.text.encode("utf-8", "surrogateescape")) > MAX_INPUT_BYTES:
        raise CalmError(f"TEXT is longer than {MAX_INPUT_BYTES} bytes, what a line may hold: give its end")
    # bytes that are not UTF-8 (a shell passes them as they are) as U+FFFD: the store's rule
    text, session = wire_text(args.text), wire_text(args.session)
    history = [{"cmd": wire_text(h), "exit": 0} for h in args.history] if args.history else None
    cwd, git = wire_text(args.cwd or _cwd()), None if args.git is None else wire_text(args.git)
    try:
        with connect(args) as client:
            ctx: dict[str, Any] = {"cwd": cwd, "git": git, "history": history}
            # asked as the zsh hook asks (the early line first; a multi-line entry too), so the
            # daemon's ghost rule shows what a shell draws: with --scores, the drawn line is marked
            # `ghost`. Printed escaped, never raw: `\n`, `\e` ...
            for message in client.complete(text, n=args.n, session=session, early=True,
                                           multiline=True, **ctx):  # fmt: skip
                if "early" in message and args.scores:
                    drawn = "ghost" if message.get("ghost") else "     "
                    early = visible(str(message["early"]))
                    print(f"   early  {message.get('confidence', 0):5.3f}  {drawn}  {early}")
                elif "candidate" in message:
                    drawn = "ghost" if message.get("ghost") else "     "
                    text = visible(str(message["candidate"]))
                    print(
                        f"{message['score']:8.3f}  {message.get('confidence', 0):5.3f}  {drawn}  {text}"
                        if args.scores
                        else text
                    )
                elif args.scores:
                    print(
                        f"done in {message['ms']:.1f} ms"
                        + (" (cancelled)" if message.get("cancelled") else "")
                    )
    except DaemonNotRunning as exc:
        print(f"calmd is not running ({exc})", file=sys.stderr)
        return 3
    except DaemonError as exc:
        raise CalmError(f"the daemon refused the request: {exc}") from None
    return 0


def _cwd() -> str:
    """The current folder, or none when it is gone (removed under the shell)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def cmd_install_systemd(args: argparse.Namespace) -> int:
    import shutil

    from calmd.cli.systemd import install_units, user_manager_problem

    target = Path(args.dir).expanduser() if args.dir else paths.systemd_units_dir()
    if target.exists() and not target.is_dir():
        raise CalmError(f"--dir {target}: not a folder; give the folder for the unit files")
    calmd_bin = shutil.which("calmd") or str(Path(sys.argv[0]).resolve())
    for path in install_units(target, calmd_bin, ("--no-import",) if args.no_import else ()):
        print(f"wrote {path}")
    problem = user_manager_problem()
    if problem is not None:
        # `systemctl --user` would fail ("Failed to connect to bus"): say so, not "enable with".
        raise CalmError(
            f"the units are written, but they cannot be enabled here: {problem}. Start the daemon "
            "with `calmd serve` (or CALM_AUTOSTART=1 in your shell), or log in with a systemd user "
            "session (`loginctl enable-linger $USER`) and run `systemctl --user daemon-reload && "
            "systemctl --user enable --now calmd.socket`"
        )
    print("enable with:\n  systemctl --user daemon-reload\n  systemctl --user enable --now calmd.socket")
    print("or, without socket activation:\n  systemctl --user enable --now calmd.service")
    return 0


def add_parsers(sub: argparse._SubParsersAction[Parser]) -> None:
    """serve, status, stop, complete, install-systemd (calmd)"""
    p = sub.add_parser(
        "serve", help="run the daemon in the foreground",
        description="Run the daemon in the foreground of this terminal (it stops with it: Ctrl-C, or "
        "closing the terminal); `calmd install-systemd` runs it as a systemd user service instead. Its "
        "first start imports your shells' history files in the background (--no-import: not now).",
    )  # fmt: skip
    p.add_argument("--socket", metavar="PATH", default=argparse.SUPPRESS, help="socket path")
    p.add_argument("--model", metavar="FILE.cwgt", help=f"weights (default {paths.weights_path()})")
    p.add_argument(
        "--no-import", action="store_true",
        help="do not import ~/.bash_history, ~/.zsh_history and fish's history at this start (a start "
        "without it imports them)",
    )  # fmt: skip
    p.add_argument(
        "--no-prefetch",
        action="store_true",
        help="do not prepare a session's next line after each record (to measure what it saves)",
    )
    add_flags(p, ServerConfig, SERVE_FLAGS)
    p.add_argument(
        "--train-arg",
        action="append",
        metavar="ARG",
        help="extra argument for the training process (python -m calmd.training.background --help)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="log at debug level")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser(
        "status", help="show the daemon's state (exit 3 when none runs)",
        description="Show what the running daemon serves and does: the model and ranker in use, "
        "latency, the history and its import, the search index, sync, the next training run and why "
        "it waits, the disk, the socket. Exit 3 when no daemon answers.",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser(
        "stop", help="stop the daemon gracefully",
        description="Ask the running daemon to stop: it finishes the answers in flight and stops a "
        "training run, then exits; this waits up to --timeout seconds for it. Exit 3 when none runs. "
        "Under systemd, the socket unit would start it again at the next request: stop both units "
        "instead (systemctl --user stop calmd.socket calmd.service).",
    )  # fmt: skip
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser(
        "train", help="start a background training run now and follow it to its result",
        description="Ask the daemon for a training run on your history now, whatever the load and the "
        "count of new commands (or follow the one in progress), print its steps and time left, then "
        "its result: held-out loss before and after, swapped in or not. Exit 0 when it finished, 1 "
        "when it failed or was stopped, 3 when no daemon runs. Ctrl-C stops following, not the run.",
    )  # fmt: skip
    p.set_defaults(func=cmd_train_now)
    p = sub.add_parser("complete", help="print streamed candidates for TEXT (a debugging client)")
    p.add_argument("text", metavar="TEXT", help="what the user typed so far")
    p.add_argument("-n", type=whole(0, 32), default=5, help="candidates, 0 to 32 (default 5)")
    p.add_argument("--cwd", help="the shell's folder (default: none)")
    p.add_argument("--git", help="the git branch (default: none)")
    p.add_argument("--session", default="calmd-complete", help="the session asking (default calmd-complete)")
    p.add_argument("--history", nargs="*", metavar="CMD", help="context commands (default: the store's)")
    p.add_argument("--scores", action="store_true", help="show scores and timing")
    p.set_defaults(func=cmd_complete)
    p = sub.add_parser(
        "install-systemd", help="copy the user units to ~/.config/systemd/user",
        description="Write calmd.socket and calmd.service into the user unit folder, the service "
        "running this calmd, and say how to enable them. They need a systemd user session; without "
        "one (a container, a plain SSH login) start the daemon with `calmd serve`.",
    )  # fmt: skip
    p.add_argument("--dir", metavar="DIR", help="unit folder (default ~/.config/systemd/user)")
    p.add_argument("--no-import", action="store_true",
                   help="the daemon imports no shell's history file (calmd serve --no-import)")  # fmt: skip
    p.set_defaults(func=cmd_install_systemd)
