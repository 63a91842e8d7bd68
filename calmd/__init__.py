"""calmd: a local, private shell assistant built on CALM, a byte-level Mamba language model."""

__version__ = "0.1.0"
