"""The history: the SQLite store of executed commands, the credential detector that keeps secrets out
of it.
"""
