"""Phi-3 (`Phi3ForCausalLM`, GGUF `phi3`): a Llama decoder whose q|k|v and gate|up are stored fused
(qkv_proj / attn_qkv, gate_up_proj / ffn_up). Each part is read as the rows it holds, in the tensor's
own form (GGUF blocks stay blocks), and runs as the Llama parts do.

Against transformers on the same files, bound as in test_parity_tiny.py: 1e-4 + 2e-6 * max|logit|.
The config.json model has Phi-3-mini-4k's kind of `sliding_window` (every layer; 9 here, so the
50-token prompt reaches past it); the GGUF file carries none, as llama.cpp runs Phi-3. The control:
gate and up read from the wrong halves of gate_up must fail the bound.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from crucible.core.errors import UnsupportedModelError
from crucible.reference import Reference
from graphs.config import config_from_hf
from graphs.generate import full_logits, incremental_logits
from graphs.model import CrucibleModel
from tests.support.tiny_models import TINY_PHI3, write_gguf, write_hf

WINDOWED = dataclasses.replace(TINY_PHI3, sliding_window=9)


def _bound(reference_logits: np.ndarray) -> float:
    return 1e-4 + 2e-6 * float(np.abs(reference_logits).max())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("phi3")
    return {"hf": write_hf(WINDOWED, root / "hf"), "gguf": write_gguf(TINY_PHI3, root / "phi3.gguf", "Q8_0")}


def _ids() -> list[int]:
    return np.random.default_rng(17).integers(3, TINY_PHI3.vocab_size, 50).tolist()


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_phi3_matches_transformers(files: dict[str, Path], form: str) -> None:
    model = CrucibleModel(str(files[form]))
    assert model.config.arch == "phi3"
    assert model.config.sliding_window == (9 if form == "hf" else 0)
    layer = model.weights.layers[0]
    assert [lin.n_out for lin in layer.qkv] == [(3 + 2) * 64]  # q|k|v back as one matmul
    assert [lin.qtype for lin in layer.gate_up] == (["f32"] if form == "hf" else ["q8_0"])
    ids = _ids()
    ours, theirs = full_logits(model, ids), Reference(files[form]).logits(ids)
    assert np.abs(ours - theirs).max() <= _bound(theirs)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert np.abs(incremental_logits(model, ids, 30) - theirs[29:]).max() <= _bound(theirs)
    assert model.provenance["hot_path_fallbacks"] == []


def test_control_gate_and_up_swapped_must_fail(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import graphs.weights as weights

    real = weights.fused_rows
    swap = {"gate": "up", "up": "gate"}
    monkeypatch.setattr(weights, "fused_rows", lambda cfg, key: real(cfg, swap.get(key, key)))
    ids = _ids()
    ours, theirs = full_logits(CrucibleModel(str(files["hf"])), ids), Reference(files["hf"]).logits(ids)
    assert np.abs(ours - theirs).max() > 100 * _bound(theirs)


@pytest.mark.parametrize("fields,match", [
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "longrope"),
    ({"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
    ({"hidden_act": "gelu"}, "activation"),
])
def test_phi3_variants_beyond_the_decoder_are_refused(tmp_path: Path, fields: dict, match: str) -> None:
    raw = {"architectures": ["Phi3ForCausalLM"], "vocab_size": 10, "hidden_size": 128, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 2, **fields}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedModelError, match=match):
        config_from_hf(tmp_path)


def test_gguf_with_separate_q_k_v_reads_the_same(files: dict[str, Path], tmp_path: Path) -> None:
    """llama.cpp also reads phi3 files whose attention keeps attn_q, attn_k and attn_v apart: the same
    rows give the same logits."""
    import gguf

    reader = gguf.GGUFReader(str(files["gguf"]))
    writer = gguf.GGUFWriter(str(tmp_path / "split.gguf"), "phi3")
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        writer.add_key_value(key, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    q, kv = 3 * 64, 64
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.name.endswith("attn_qkv.weight"):
            base = t.name[: -len("attn_qkv.weight")]
            for part, rows in (("attn_q", slice(0, q)), ("attn_k", slice(q, q + kv)), ("attn_v", slice(q + kv, None))):
                writer.add_tensor(f"{base}{part}.weight", np.ascontiguousarray(data[rows]), raw_dtype=t.tensor_type)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ids = _ids()
    split = CrucibleModel(str(tmp_path / "split.gguf"))
    assert [lin.n_out for lin in split.weights.layers[0].qkv] == [(3 + 2) * 64]
    assert np.array_equal(full_logits(split, ids), full_logits(CrucibleModel(str(files["gguf"])), ids))
