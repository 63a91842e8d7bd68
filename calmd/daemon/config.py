"""`calmd serve`'s configuration: a frozen dataclass whose defaults are the flags' (calmd/cli/daemon.py
SERVE_FLAGS takes them from here). Light to import: the CLI builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calmd import paths
from calmd.suggest.context import HISTORY_FRAMES


@dataclass(frozen=True)
class ServerConfig:
    socket_path: Path = field(default_factory=paths.socket_path)
    data_dir: Path = field(default_factory=paths.data_dir)
    weights_path: Path = field(default_factory=paths.weights_path)
    reload_debounce_ms: int = 300
    # history frames put in the model's context when the client sends none
    history_context: int = HISTORY_FRAMES
    import_shell_history: bool = True  # import ~/.bash_history and ~/.zsh_history on first start
    train_threshold: int = 200  # new commands before a background run; 0: only on request
    # start automatically only while the 1-minute load average per core is below this
    train_max_load: float = 1.0
    # seconds between two due checks besides those at start, after an import and on record; 0: none
    train_check_interval_s: float = 60.0
    # extra `python -m calmd.training.background` arguments (tests shorten runs)
    train_args: tuple[str, ...] = ()
    max_connections: int = 0  # concurrent clients; 0: DEFAULT_MAX_CONNECTIONS within the fd limit
    reply_timeout_s: float = 10.0  # a client that leaves REPLY_BUFFER_HIGH unread this long is closed
    graceful_timeout: float = 5.0  # SIGTERM to exit, at most (in-flight answers, the trainer's stop)
    fallback_weights: Path = field(default_factory=paths.packaged_weights)  # when the user's do not load
    prefetch: bool = True  # after a record, prepare the session's next empty prompt (its context's state)
    # SIGHUP stops the daemon, as the terminal it runs in closes (`calmd serve` typed at a prompt),
    # instead of reloading the weights (systemd's `reload`, a daemon started in the background)
    hangup_stops: bool = False
