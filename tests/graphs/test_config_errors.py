"""Configs from HF and GGUF, and clear errors for what Crucible does not run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crucible.core.registry import resolve_model
from tests.support.tiny_models import TINY_LLAMA, write_gguf, write_hf
from graphs.config import UnsupportedModelError, load_config
from graphs.weights import load_weights


def test_hf_and_gguf_configs_agree(tiny_models) -> None:
    files = tiny_models["qwen2"]
    hf = load_config(resolve_model(files.hf))
    gg = load_config(resolve_model(files.gguf["Q4_0"]))
    for field in ("arch", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "tie_word_embeddings", "qkv_bias"):
        assert getattr(hf, field) == getattr(gg, field), field
    assert hf.rope_theta == pytest.approx(gg.rope_theta)
    assert not hf.rope_interleaved and not gg.rope_interleaved  # Qwen2 GGUF keeps NeoX rotary
    assert load_config(resolve_model(tiny_models["llama"].gguf["F32"])).rope_interleaved


def test_unknown_architecture_is_named(tmp_path) -> None:
    folder = write_hf(TINY_LLAMA, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        load_config(resolve_model(folder))


def test_unsupported_gguf_tensor_type_is_named(tmp_path) -> None:
    import gguf

    path = write_gguf(TINY_LLAMA, tmp_path / "m.gguf", "Q4_0")
    # Rewrite one projection as MXFP4, a type Crucible does not read (raw bytes of the right size: 17
    # bytes per 32 values).
    reader = gguf.GGUFReader(str(path))
    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        writer.add_key_value(key, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    for t in reader.tensors:
        if t.name == "blk.0.ffn_down.weight":
            k_in, n_out = (int(d) for d in t.shape[:2])
            raw = np.zeros((n_out, k_in // 32 * 17), np.uint8)
            writer.add_tensor(t.name, raw, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    src = resolve_model(tmp_path / "k.gguf")
    with pytest.raises(UnsupportedModelError, match="MXFP4"):
        load_weights(src, load_config(src))


def test_gguf_rope_frequency_factors_of_the_wrong_length_are_refused(tmp_path) -> None:
    """rope_freqs.weight (Llama 3.1/3.2 scaling) is applied (tests/graphs/test_llama31_rope.py); one that
    does not give a factor per rotary pair is refused by name rather than misapplied."""
    import gguf

    src = gguf.GGUFReader(str(write_gguf(TINY_LLAMA, tmp_path / "m.gguf", "F32")))
    out = tmp_path / "with-freqs.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        w.add_key_value(key, f.contents(), f.types[0], f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("rope_freqs.weight", np.ones(TINY_LLAMA.head_dim // 2 + 1, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        load_config(resolve_model(out))


def test_gemma3_gguf_without_sliding_window_is_refused(tmp_path) -> None:
    """Without the key every layer would run globally with the global rope base: refused by name."""
    import dataclasses

    from tests.support.tiny_models import TINY_GEMMA3, write_gguf

    path = write_gguf(dataclasses.replace(TINY_GEMMA3, sliding_window=0), tmp_path / "no-window.gguf", "F32")
    with pytest.raises(UnsupportedModelError, match="sliding_window"):
        load_config(resolve_model(str(path)))
