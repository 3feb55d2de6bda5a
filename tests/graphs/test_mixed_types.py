"""GGUF files that mix tensor types, as llama.cpp's presets write them: q, k and v of three types run as
separate matmuls and are concatenated, gate and up of two types run with down as one crucible.mlp
(qmatmul2's two-type gated pass, then down), equal types stay fused, and F16 norms are read. The model must match transformers on
the same file (which dequantizes each tensor).

Bound as in test_parity_tiny.py (the same dequantized weights on both sides): 1e-4 + 2e-6 * max|logit|.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from crucible.reference import Reference
from graphs.generate import full_logits
from graphs.model import CrucibleModel
from tests.support.tiny_models import TINY_LLAMA, write_gguf

MIXED = {"q_proj": "Q8_0", "v_proj": "F16", "up_proj": "Q4_1", "input_layernorm": "F16"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(TINY_LLAMA, tmp_path_factory.mktemp("mixed") / "mixed.gguf", "Q4_0", overrides=MIXED)


def test_mixed_types_match_transformers(mixed: Path) -> None:
    model = CrucibleModel(str(mixed))
    layer = model.weights.layers[0]
    assert [lin.qtype for lin in layer.qkv] == ["q8_0", "q4_0", "f16"]  # three matmuls
    assert [lin.qtype for lin in layer.gate_up] == ["q4_0", "q4_1"]
    assert model.provenance["ops"]["crucible:crucible.mlp"] == TINY_LLAMA.num_layers  # gate, up, down
    assert [lin.qtype for lin in (layer.o_proj, layer.down)] == ["q4_0", "q4_0"]
    ids = np.random.default_rng(5).integers(3, TINY_LLAMA.vocab_size, 60).tolist()
    ours, theirs = full_logits(model, ids), Reference(mixed).logits(ids)
    assert np.abs(ours - theirs).max() <= 1e-4 + 2e-6 * float(np.abs(theirs).max())
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert model.provenance["hot_path_fallbacks"] == []
    assert "Q8_0 2" in model.inventory.line() and "F16" in model.inventory.line()


def test_control_the_parts_in_the_wrong_order_must_fail(mixed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the separate q, k, v outputs were concatenated in another order, the bound must catch it."""
    import graphs.llama as llama

    real = llama._project_parts

    def swapped(x, name, parts, binder, act, fuse=True):
        return real(x, name, parts[::-1] if len(parts) > 1 else parts, binder, act, fuse)

    monkeypatch.setattr(llama, "_project_parts", swapped)
    ids = np.random.default_rng(5).integers(3, TINY_LLAMA.vocab_size, 60).tolist()
    ours, theirs = full_logits(CrucibleModel(str(mixed)), ids), Reference(mixed).logits(ids)
    assert np.abs(ours - theirs).max() > 100 * (1e-4 + 2e-6 * float(np.abs(theirs).max()))
