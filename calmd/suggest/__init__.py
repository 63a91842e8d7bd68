"""Suggestion: what a keystroke gets, for the daemon, the training and the replay alike.

The context rule and its frames (context.py, frames.py: which past commands, which COMP and ENV
items the model sees), the disk they are read from (disk.py; reconstruct.py for a replayed
history), the history ranker (ranking.py), the filters (filters.py), the confidence calibration
(calibration.py), the ghost rule (ghost.py), the history search's index and ranking (search.py),
and the engine that ranks the model's lines and the history's in one mixture (engine.py).
Nothing here imports the daemon or training: they use it.
"""
