"""Graph tests use the session fixtures of tests/conftest.py (compiled tiny models, SmolLM2)."""
