"""Shared pieces of the API-feature tests: bounded tools a random model completes quickly, and the
reference log-probabilities of a token sequence (one full prefill of the model itself)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Small integer and enum arguments: a random-weight model finishes a call in a few dozen tokens.
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Adds two digits", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["C", "F"]}}, "required": ["unit"],
        "additionalProperties": False}}},
]


def reference_logprobs(model, token_ids: Sequence[int]) -> np.ndarray:
    """[n, vocab] float64 log-softmax of one full prefill's logits: row i predicts token i + 1."""
    from graphs.generate import full_logits

    z = full_logits(model, token_ids).astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))
