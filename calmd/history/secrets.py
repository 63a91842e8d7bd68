"""The credential detector moved to its own package, calmd/secrets/ (issue 39): this name stays
for the modules that still import it from here (the sync code)."""

from calmd.secrets import DETECTOR_VERSION, find_secret, forget_command

__all__ = ["DETECTOR_VERSION", "find_secret", "forget_command"]
