"""Float weights in bf16 form (the GPU's bf16 graph) and the torch-free safetensors reader.

A bf16 safetensors file must reach the graph bit for bit (its bytes are never widened and rounded
back), float32 files round to the nearest bf16, and the float32 form widens bf16 exactly. Checked
against torch's own bf16 conversion. Runs on the CPU: only the bf16 graph itself needs a GPU
(tests/graphs/test_gpu_model_compile.py compiles it).
"""

from __future__ import annotations

import numpy as np
import pytest

from crucible.core.bf16 import bf16_bits, bf16_to_f32
from crucible.core.registry import resolve_model
from graphs.config import load_config
from graphs.model import ModelOptions
from graphs.safetensors_file import read_safetensors
from graphs.weights import load_weights


def _torch_tensors(folder) -> dict:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_the_reader_matches_torch_on_a_bf16_file(tiny_models) -> None:
    import torch

    folder = tiny_models["qwen2"].hf_bf16
    ours = read_safetensors(folder / "model.safetensors")
    theirs = _torch_tensors(folder)
    assert set(ours) == set(theirs)
    for name, t in theirs.items():
        assert ours[name].dtype == "BF16" and t.dtype == torch.bfloat16
        assert np.array_equal(ours[name].array, t.view(torch.int16).numpy().view(np.uint16)), name


@pytest.mark.parametrize("form", ["f32", "bf16"])
def test_bf16_files_load_exactly_in_either_form(tiny_models, form: str) -> None:
    import torch

    folder = tiny_models["qwen2"].hf_bf16
    source = resolve_model(str(folder))
    w = load_weights(source, load_config(source), form)
    q_proj = _torch_tensors(folder)["model.layers.0.self_attn.q_proj.weight"]
    lin = w.layers[0].qkv[0]
    assert lin.qtype == form and lin.bias is not None  # Qwen2: q/k/v biases stay float32
    n = q_proj.shape[0]
    if form == "bf16":
        bits = lin.data.view(np.uint16)[:n]  # [N, 2K] bytes -> [N, K] bits, q's rows first
        assert np.array_equal(bits, q_proj.view(torch.int16).numpy().view(np.uint16))
    else:
        assert np.array_equal(lin.data[:n], q_proj.float().numpy())


def test_float32_files_round_to_nearest_bf16(tiny_models) -> None:
    files = tiny_models["llama"]
    source = resolve_model(str(files.hf))
    f32 = load_weights(source, load_config(source), "f32")
    bf16 = load_weights(source, load_config(source), "bf16")
    a, b = f32.layers[1].down, bf16.layers[1].down
    assert b.qtype == "bf16" and b.data.shape == (a.n_out, 2 * a.k_in) and b.data.dtype == np.uint8
    import torch

    widened = bf16_to_f32(b.data.view(np.uint16))
    assert np.array_equal(widened, torch.from_numpy(a.data).to(torch.bfloat16).float().numpy())
    # Control: truncating instead of rounding changes some values, so the check above can fail.
    truncated = bf16_to_f32((a.data.view(np.uint32) >> 16).astype(np.uint16))
    assert not np.array_equal(widened, truncated)
    assert np.abs(widened - a.data).max() <= np.abs(a.data).max() * 2.0 ** -8


def test_bf16_bits_round_ties_to_even() -> None:
    # 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1).
    halfway = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -2.5], dtype=np.float32)
    assert bf16_to_f32(bf16_bits(halfway)).tolist() == [1.0, 1 + 2.0 ** -6, -2.5]


def test_model_options_resolve_the_dtype() -> None:
    assert ModelOptions().compute_dtype == "float32"
    assert ModelOptions(device="gpu").compute_dtype == "bfloat16"
    assert ModelOptions(device="gpu", dtype="float32").compute_dtype == "float32"
    with pytest.raises(ValueError, match="GPU only"):
        ModelOptions(dtype="bfloat16")
    with pytest.raises(ValueError, match="dtype must be"):
        ModelOptions(dtype="fp8")


def test_nan_and_inf_survive_the_rounding() -> None:
    bits = np.array([0x7F800001, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0x7F7FFFFF], dtype=np.uint32)
    out = bf16_to_f32(bf16_bits(bits.view(np.float32)))
    assert np.isnan(out[0]) and np.isnan(out[1]) and np.signbit(out[1])
    assert out[2] == np.inf and out[3] == -np.inf and out[4] == np.inf  # the largest float32 rounds up


def test_malformed_safetensors_are_named_errors(tmp_path) -> None:
    import json
    import struct

    from graphs.config import UnsupportedModelError

    def write(name: str, header: object, body: bytes = b"") -> object:
        blob = json.dumps(header).encode()
        path = tmp_path / name
        path.write_bytes(struct.pack("<Q", len(blob)) + blob + body)
        return path

    (tmp_path / "empty.safetensors").write_bytes(b"")
    with pytest.raises(UnsupportedModelError, match="not a safetensors file"):
        read_safetensors(tmp_path / "empty.safetensors")
    with pytest.raises(UnsupportedModelError, match="unreadable"):
        read_safetensors(write("list.safetensors", [1, 2]))
    short = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    with pytest.raises(UnsupportedModelError, match="byte range"):
        read_safetensors(write("short.safetensors", short, b"\0" * 8))
    odd = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "fp8": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [8, 10]}}
    tensors = read_safetensors(write("odd.safetensors", odd, b"\0" * 10))
    assert tensors["w"].array.tolist() == [0.0, 0.0] and tensors["fp8"].array is None  # unread until used
