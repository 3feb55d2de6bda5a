"""The tiny test models: deterministic, and their HF and GGUF forms agree in transformers."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.reference import Reference
from tests.support.tiny_models import (
    GGUF_WEIGHT_TYPES,
    TINY_LLAMA,
    make_weights,
    quantize_roundtrip,
    write_gguf,
    write_hf,
)

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]

# Logit bounds against the original float weights, per GGUF weight type. Logits here are O(5-20); the
# error is the weights' rounding error carried through two layers: none for F32, ~1e-3 relative for F16,
# ~1e-2 for Q8_0 (8-bit), ~1e-1 for the 4-bit types. The exact check is the round-trip one below.
FLOAT_BOUNDS = {"F32": 0.0, "F16": 0.1, "Q8_0": 2.0, "Q4_0": 20.0, "Q4_1": 20.0}
# F32 is exact up to corrcoef's own rounding (0.9999999999999999 on an AMD host).
MIN_CORRELATION = {"F32": 1.0 - 1e-12, "F16": 0.99999, "Q8_0": 0.9995, "Q4_0": 0.97, "Q4_1": 0.97}


def test_weights_are_deterministic() -> None:
    a, b = make_weights(TINY_LLAMA), make_weights(TINY_LLAMA)
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_gguf_files_are_byte_identical_across_writes(tmp_path) -> None:
    p1 = write_gguf(TINY_LLAMA, tmp_path / "a.gguf", "Q4_1")
    p2 = write_gguf(TINY_LLAMA, tmp_path / "b.gguf", "Q4_1")
    assert p1.read_bytes() == p2.read_bytes()
    assert not list(tmp_path.glob("*.tmp"))


def test_gguf_holds_the_requested_block_types(tiny_models) -> None:
    import gguf

    for arch, files in tiny_models.items():
        for wtype, path in files.gguf.items():
            reader = gguf.GGUFReader(str(path))
            types = {t.name: t.tensor_type.name for t in reader.tensors}
            assert types["blk.0.ffn_down.weight"] == wtype
            assert types["token_embd.weight"] == wtype
            assert types["blk.0.attn_norm.weight"] == "F32"
            assert ("blk.0.attn_q.bias" in types) == files.spec.qkv_bias
            assert ("output.weight" in types) == (not files.spec.tie_word_embeddings)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_hf_and_gguf_forms_agree_in_transformers(tiny_models, tmp_path, arch: str) -> None:
    files = tiny_models[arch]
    ref = Reference(files.hf)
    ids = ref.chat_prompt_ids(PROMPT)
    assert ids[0] == 1 and len(ids) > 10  # <|im_start|> then the templated prompt
    base = ref.logits(ids)
    assert base.shape == (len(ids), files.spec.vocab_size)

    bf16 = Reference(files.hf_bf16).logits(ids)
    # bf16 storage keeps 8 mantissa bits: the same order of error as F16-with-less-precision.
    assert np.abs(bf16 - base).max() < 0.5

    for wtype in GGUF_WEIGHT_TYPES:
        gref = Reference(files.gguf[wtype])
        assert gref.chat_prompt_ids(PROMPT) == ids, "GGUF tokenizer must tokenize like the HF one"
        logits = gref.logits(ids)
        # Exact twin: the HF folder holding the gguf package's dequantization of the same weights.
        twin = write_hf(files.spec, tmp_path / f"{arch}-{wtype}",
                        weights=quantize_roundtrip(make_weights(files.spec), wtype))
        np.testing.assert_allclose(logits, Reference(twin).logits(ids), rtol=0, atol=1e-4)
        # Against the original float weights: within the type's quantization error.
        err = np.abs(logits - base).max()
        assert err <= FLOAT_BOUNDS[wtype] + 1e-5, (wtype, err)
        assert np.corrcoef(logits.ravel(), base.ravel())[0, 1] >= MIN_CORRELATION[wtype]
