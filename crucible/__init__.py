"""Crucible: LLM inference on Modular MAX with our own Mojo kernels on the hot path."""

__version__ = "0.1.0"
