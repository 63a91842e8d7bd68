"""The history: the SQLite store of executed commands, the credential detector that keeps secrets out
of it, its read-only queries, the history files it imports (bash, zsh, fish).
"""
