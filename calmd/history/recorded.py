"""What a record carries besides its command line: the ENV text and the COMP items of the
context it was typed in (the store keeps them for the datasets, calmd/suggest/frames.py builds
them for the model), cleaned and bounded here, where they are stored.
"""

from __future__ import annotations

import os

from calmd.secrets import find_secret

COMP_ITEMS = 6  # items per COMP frame: each costs ~8 tokens of prefill per keystroke (the spec caps 15)
ENV_MAX_BYTES = 64
_GENERIC_VENV = frozenset({".venv", "venv", "env", ".env", "virtualenv", ".virtualenv"})


def short_env(virtual_env: str = "", conda_env: str = "") -> str:
    """The ENV frame's text: `venv:NAME` for an active virtualenv (NAME its directory, or the
    project's for a generic `.venv`), `conda:NAME` for a conda env other than `base`, joined by a
    space; empty when neither is active."""
    parts: list[str] = []
    venv = virtual_env.rstrip("/")
    if venv:
        head, name = os.path.split(venv)
        if name in _GENERIC_VENV and os.path.basename(head):
            name = os.path.basename(head)
        parts.append(f"venv:{name}")
    if conda_env and conda_env != "base":
        parts.append(f"conda:{os.path.basename(conda_env.rstrip('/'))}")
    return clean_env(" ".join(parts))


def clean_env(env: str) -> str:
    """An ENV value as stored and framed: one line, at most `ENV_MAX_BYTES`, never a credential."""
    env = " ".join(env.split())
    env = env.encode("utf-8", "surrogatepass")[:ENV_MAX_BYTES].decode("utf-8", "ignore")
    return "" if not env or find_secret(env) is not None else env
