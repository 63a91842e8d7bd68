"""The history: the SQLite store of executed commands (store.py; its schema and migrations in
schema.py, what a record is made of in recorded.py), the history files it imports (formats.py,
imports.py, fish.py, coverage.py: what the hooks recorded already) and its read-only queries
(query/). The credential detector that keeps secrets out of it is calmd/secrets/.
"""
