"""Gemma 3's linear rope scaling of its global layers (the 4B and larger models: factor 8), on a tiny
Gemma 3 in its HF form against transformers, and read from GGUF metadata as llama.cpp writes it.

transformers' GGUF reader drops `gemma3.rope.scaling.*`, so the GGUF form is checked for the config it
yields (the factor reaches the global layers' frequencies only), not against transformers' logits.
Bound as tests/graphs/test_parity_tiny.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from crucible.core.registry import resolve_model
from graphs.config import load_config
from graphs.generate import full_logits
from tests.support.tiny_models import TINY_GEMMA3, write_gguf, write_hf

SCALED = dataclasses.replace(TINY_GEMMA3, rope_linear=8.0)


def test_linear_rope_scaling_matches_transformers(tmp_path) -> None:
    from crucible.reference import Reference
    from graphs.model import CrucibleModel

    folder = write_hf(SCALED, tmp_path / "gemma3-linear")
    ref = Reference(folder)
    ids = ref.chat_prompt_ids([{"role": "user", "content": "What is the capital of France? Answer briefly."}])
    ids = ids + ids[1:]
    ours, theirs = full_logits(CrucibleModel(str(folder)), ids), ref.logits(ids)
    assert np.abs(ours - theirs).max() <= 1e-4 + 2e-6 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    # Control: the unscaled model's logits are far from these (the factor is not a no-op here).
    plain = Reference(write_hf(TINY_GEMMA3, tmp_path / "gemma3-plain")).logits(ids)
    assert np.abs(plain - theirs).max() > 100 * (1e-4 + 2e-6 * np.abs(theirs).max())


def test_gguf_linear_scaling_reaches_global_layers_only(tmp_path) -> None:
    cfg = load_config(resolve_model(write_gguf(SCALED, tmp_path / "scaled.gguf", "F32")))
    base = load_config(resolve_model(write_gguf(TINY_GEMMA3, tmp_path / "plain.gguf", "F32")))
    assert cfg.rope_linear_factor == 8.0
    np.testing.assert_array_equal(cfg.inv_freq(), (base.inv_freq() / np.float32(8.0)).astype(np.float32))
    np.testing.assert_array_equal(cfg.inv_freq(local=True), base.inv_freq(local=True))
