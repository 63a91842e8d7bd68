"""The engines: what replicates the folder between machines. Syncthing, a cloud drive, NFS or
rsync need nothing from calmd (it only writes its own files and reads the others': docs/sync.md
says how to set each up); a git remote (`calm sync --git REMOTE`) is driven from here, at each
turn."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

GIT_TIMEOUT_S = 120.0


def git_sync(folder: Path, remote: str, name: str, *, push: bool = True) -> str:
    """Commit the folder and pull and push it (`calm sync --git REMOTE`): '' when it went well,
    else what git said (one line). Each machine changes only its own files, so merges never
    conflict. git talks to the remote (over SSH, as the user set it up); calmd does not. Without
    `push`, only what the remote holds is brought in (`calm sync --folder`, before it looks at the
    other machines' shares)."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    base = ["git", "-C", str(folder), "-c", "user.name=calm sync", "-c", f"user.email={name}@calm-sync",
            "-c", "commit.gpgsign=false"]  # fmt: skip

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, env=env, timeout=GIT_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)  # fmt: skip

    try:
        if not (folder / ".git").exists():
            git("init", "-q", "-b", "calm-sync")
        remotes = git("remote").stdout.split()
        if "calm" not in remotes:
            git("remote", "add", "calm", remote)
        elif git("remote", "get-url", "calm").stdout.strip() != remote:
            git("remote", "set-url", "calm", remote)
        git("add", "-A", "--", ".")
        if git("diff", "--cached", "--quiet").returncode:
            git("commit", "-q", "-m", f"calm sync: {name}")
        for _ in range(3):
            fetched = git("fetch", "-q", "calm")
            if fetched.returncode:
                return _git_error("fetch", fetched)
            if git("rev-parse", "-q", "--verify", "calm/calm-sync").returncode == 0:
                merged = git("merge", "-q", "--no-edit", "--allow-unrelated-histories", "-m",
                             f"calm sync: {name}", "calm/calm-sync")  # fmt: skip
                if merged.returncode:
                    git("merge", "--abort")
                    return _git_error("merge", merged)
            if not push:
                return ""
            pushed = git("push", "-q", "calm", "HEAD:calm-sync")
            if pushed.returncode == 0:
                return ""
        return _git_error("push", pushed)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"git: {exc}"


def _git_error(step: str, done: subprocess.CompletedProcess[str]) -> str:
    said = " ".join((done.stderr or done.stdout).split())[:300]
    return f"git {step} failed: {said or f'exit {done.returncode}'}"
