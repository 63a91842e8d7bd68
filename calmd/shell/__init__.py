"""The shells' side: the per-shell helper and the `calmd init` hooks, and the small socket client (no
torch).
"""
