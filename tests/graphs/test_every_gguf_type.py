"""One tiny model whose tensors use every GGUF type Crucible reads besides the conftest's whole-file
types (F32, F16, Q8_0, Q4_0, Q4_1): Q5_0, Q5_1, BF16, the K-quants Q2_K..Q6_K and IQ4_NL / IQ4_XS, the tied
embedding and output in Q4_K. It must match transformers on the same file, which decodes each tensor with gguf-py.

Qwen2's widths fit the K-quants' 256-value super-blocks (hidden 256) except the MLP's 544, so
ffn_down takes a 32-value format, as llama.cpp's presets do for such rows. Bound as in
test_parity_tiny.py (the same decoded weights on both sides): 1e-4 + 2e-6 * max|logit|.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from crucible.reference import Reference
from graphs.generate import full_logits
from graphs.model import CrucibleModel
from tests.support.tiny_models import EVERY_TYPE_OVERRIDES as TYPES
from tests.support.tiny_models import TINY_QWEN2, write_gguf


@pytest.fixture(scope="module")
def every_type(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(TINY_QWEN2, tmp_path_factory.mktemp("every") / "every-type.gguf", "Q8_0", overrides=TYPES)


def test_every_type_matches_transformers(every_type: Path) -> None:
    model = CrucibleModel(str(every_type))
    l0, l1 = model.weights.layers
    assert [lin.qtype for lin in l0.qkv] == ["q2_k", "q3_k", "q4_k"]
    assert [lin.qtype for lin in l0.gate_up] == ["q6_k", "q5_0"]
    assert [lin.qtype for lin in l1.gate_up] == ["bf16", "q5_0"]
    assert (l0.o_proj.qtype, l0.down.qtype) == ("q5_k", "q5_1")
    assert [lin.qtype for lin in l1.qkv] == ["iq4_xs", "q3_k", "q4_k"] and l1.down.qtype == "iq4_nl"
    assert model.weights.embedding.qtype == "q4_k" and model.weights.lm_head is model.weights.embedding
    ids = np.random.default_rng(9).integers(3, TINY_QWEN2.vocab_size, 70).tolist()
    ours, theirs = full_logits(model, ids), Reference(every_type).logits(ids)
    assert np.abs(ours - theirs).max() <= 1e-4 + 2e-6 * float(np.abs(theirs).max())
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert model.provenance["hot_path_fallbacks"] == []
    line = model.inventory.line()
    assert all(t in line for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "BF16", "IQ4_NL", "IQ4_XS")), line


def test_int8_activations_name_the_types_they_skip(every_type: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--activations q8 runs int8 x for the GGUF block formats only: the load line and provenance name
    the rest. (The options are swapped on a loaded model: the list reads the weights, not the graph.)"""
    from dataclasses import replace

    model = CrucibleModel(str(every_type))
    assert model.float_activation_types() == [] and "--activations" not in model.load_line()
    monkeypatch.setattr(model, "options", replace(model.options, activations="q8"))
    expected = ["BF16", "IQ4_NL", "IQ4_XS"]
    assert model.float_activation_types() == expected
    assert model.provenance["float_activation_types"] == expected
    assert "the BF16" in model.load_line()
