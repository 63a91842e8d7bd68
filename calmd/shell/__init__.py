"""The shells' side: the per-shell helper and the `calmd init` hooks (zsh, bash, fish), the small
socket client, `calm search`'s terminal UI and `calm history`/`calm stats` (no torch).
"""
