"""Llama 3.1/3.2 RoPE scaling from GGUF: llama.cpp writes it as the tensor rope_freqs.weight (frequency
divisors), and the GGUF model must match transformers on the HF folder, whose config.json carries the
same scaling as rope_scaling, at positions past the original context (64 here) where the scaling acts.

Bounds as in test_parity_tiny.py: the same float32 weights on both sides, so a few fp32 ulps per op,
1e-4 + 2e-6 * max|logit|, and the same top-1 everywhere. The control shows the comparison can fail:
transformers without the scaling differs from transformers with it by far more than the bound.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crucible.core.registry import resolve_model
from crucible.reference import Reference
from graphs.config import load_config
from graphs.generate import full_logits
from graphs.model import CrucibleModel
from tests.support.tiny_models import TINY_LLAMA31, write_gguf, write_hf


@pytest.fixture(scope="module")
def llama31(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("llama31")
    return write_hf(TINY_LLAMA31, root / "hf"), write_gguf(TINY_LLAMA31, root / "m.gguf", "F32")


def _ids(n: int) -> list[int]:
    return np.random.default_rng(3).integers(3, TINY_LLAMA31.vocab_size, n).tolist()


def test_rope_freqs_are_read_as_llama_cpp_wrote_them(llama31) -> None:
    hf, gguf = llama31
    from_gguf, from_hf = load_config(resolve_model(str(gguf))), load_config(resolve_model(str(hf)))
    assert from_gguf.rope_freq_factors is not None and from_hf.rope_scaling is not None
    assert max(from_gguf.rope_freq_factors) == 8.0 and min(from_gguf.rope_freq_factors) == 1.0
    # the two forms give the same frequencies: llama.cpp's divisors and transformers' llama3 formula
    np.testing.assert_allclose(from_gguf.inv_freq(), from_hf.inv_freq(), rtol=1e-6)


def test_gguf_with_rope_freqs_matches_transformers_past_the_original_context(llama31) -> None:
    hf, gguf = llama31
    ids = _ids(200)
    ours, theirs = full_logits(CrucibleModel(str(gguf)), ids), Reference(hf).logits(ids)
    bound = 1e-4 + 2e-6 * float(np.abs(theirs).max())
    assert np.abs(ours - theirs).max() <= bound
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_control_without_the_scaling_the_logits_differ(llama31, tmp_path: Path) -> None:
    hf, _ = llama31
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in hf.iterdir():
        (plain / f.name).write_bytes(f.read_bytes())
    config = json.loads((hf / "config.json").read_text())
    del config["rope_scaling"]
    (plain / "config.json").write_text(json.dumps(config))
    ids = _ids(200)
    scaled, unscaled = Reference(hf).logits(ids), Reference(plain).logits(ids)
    bound = 1e-4 + 2e-6 * float(np.abs(scaled).max())
    assert np.abs(scaled - unscaled).max() > 100 * bound
    assert (scaled.argmax(-1) != unscaled.argmax(-1)).any()
