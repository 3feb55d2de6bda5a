"""Model weights from Hugging Face safetensors or GGUF, in the form our kernels consume.

Float weights take one of two forms (``FloatForm``), chosen by the graph's dtype:
- "f32": float32 arrays (MAX runs CPU graphs in float32; bf16 files are widened exactly).
- "bf16": bfloat16, kept as raw bytes ([rows, 2 * K] uint8, qtype "bf16") so bf16 files are never
  widened; float32 tensors are rounded to bf16. The GPU bf16 graph reads them through crucible.matmul
  (as bf16 tensors) and through crucible.embedding / crucible.qmatmul (as bytes).
GGUF F16, BF16 and the block formats of GGUF_QTYPES stay as their raw bytes ([rows, row_bytes] uint8)
and feed crucible.qmatmul / crucible.embedding directly, so the loaded model stays near its file size.
Any other tensor type is rejected by name. Norms and biases are float32 arrays (the graph casts them).

q/k/v are fused into one [(Hq + 2 Hkv) * D, H] projection and gate/up into one [2 I, H] projection
(rows concatenated; for block formats that is a concatenation of byte rows), so a layer runs 4
matmuls instead of 7.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from crucible.core.bf16 import bf16_bits, bf16_to_f32
from crucible.core.gguf_meta import open_gguf
from crucible.core.registry import ModelSource
from graphs.config import ModelConfig, UnsupportedModelError
from graphs.safetensors_file import RawTensor, array_of, read_safetensors

FloatForm = Literal["f32", "bf16"]

GGUF_QTYPES = {"F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0",
               "Q5_1": "q5_1", "Q2_K": "q2_k", "Q3_K": "q3_k", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k",
               "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs"}


@dataclass(frozen=True)
class Linear:
    """A linear layer's weight in kernel form.

    Attributes:
        qtype: "f32" (data [N, K] float32) or a byte format: "bf16", "f16" or a block format
            (data [N, row_bytes] uint8).
        data: The weight.
        n_out: N.
        k_in: K.
        bias: [N] float32 or None.
    """

    qtype: str
    data: np.ndarray
    n_out: int
    k_in: int
    bias: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + (self.bias.nbytes if self.bias is not None else 0))


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer. Neighbouring parts of qkv and gate_up that share a tensor type are stacked
    into one weight; a GGUF that mixes types (llama.cpp's K-quant presets do) keeps one per run of a
    type. The graph runs two bias-free GGUF-block parts of one activation form as one crucible.qmatmul2
    (gate and up: one crucible.mlp with down), others as separate ops."""

    attn_norm: np.ndarray
    qkv: tuple[Linear, ...]  # (q|k|v,), (q|k, v), (q, k|v) or (q, k, v)
    o_proj: Linear
    ffn_norm: np.ndarray
    gate_up: tuple[Linear, ...]  # (gate|up fused,) or (gate, up)
    down: Linear
    q_norm: np.ndarray | None = None  # [D] per-head RMSNorm of q and k before rope (Qwen3, Gemma 3)
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None  # [H] norms of the attention and MLP outputs (Gemma 3)
    post_ffn_norm: np.ndarray | None = None

    def norms(self) -> tuple[np.ndarray, ...]:
        """Every norm weight the layer has."""
        return tuple(n for n in (self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm, self.post_attn_norm,
                                 self.post_ffn_norm) if n is not None)


@dataclass(frozen=True)
class ModelWeights:
    """All weights; `embedding` doubles as lm_head when the model ties them."""

    embedding: Linear
    layers: tuple[LayerWeights, ...]
    final_norm: np.ndarray
    lm_head: Linear

    @property
    def nbytes(self) -> int:
        total = self.embedding.nbytes + self.final_norm.nbytes
        if self.lm_head is not self.embedding:
            total += self.lm_head.nbytes
        for layer in self.layers:
            total += sum(n.nbytes for n in layer.norms())
            total += sum(lin.nbytes for lin in (*layer.qkv, layer.o_proj, *layer.gate_up, layer.down))
        return total


def _stack(parts: list[Linear]) -> Linear:
    """The parts (one type) stacked along N as one Linear, biases too (zeros for a part without)."""
    if len(parts) == 1:
        return parts[0]
    biases = [p.bias for p in parts]
    bias = None
    if any(b is not None for b in biases):
        bias = np.concatenate([b if b is not None else np.zeros(p.n_out, np.float32)
                               for b, p in zip(biases, parts)]).astype(np.float32)
    return Linear(parts[0].qtype, np.ascontiguousarray(np.concatenate([p.data for p in parts], axis=0)),
                  sum(p.n_out for p in parts), parts[0].k_in, bias)


def _fuse(parts: list[Linear]) -> tuple[Linear, ...]:
    """Each run of neighbouring parts that share a type stacked along N into one Linear: q|k|v of one
    type is one matmul, q|k + v (llama.cpp's presets often give v its own type) two. Mixed block
    formats cannot share one matmul, and dequantizing would break "stays quantized"."""
    runs: list[list[Linear]] = []
    for p in parts:
        if runs and runs[-1][0].qtype == p.qtype:
            runs[-1].append(p)
        else:
            runs.append([p])
    return tuple(_stack(run) for run in runs)


# Phi-3 stores q|k|v as one tensor and gate|up as another (HF qkv_proj / gate_up_proj, GGUF attn_qkv /
# ffn_up): each part is a block of rows of it, read as its own Linear (_fuse stacks q|k|v back).
FUSED_PARTS = {"q": "qkv", "k": "qkv", "v": "qkv", "gate": "gate_up", "up": "gate_up"}


def fused_rows(cfg: ModelConfig, key: str) -> tuple[int, int]:
    """Rows [start, stop) of part `key` (q, k, v, gate or up) in its fused tensor."""
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    return {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv), "gate": (0, inter),
            "up": (inter, 2 * inter)}[key]


def fused_part(whole: Linear, cfg: ModelConfig, key: str) -> Linear:
    """Part `key` of its fused tensor: its rows (output features), in the tensor's own form (a row of
    GGUF blocks stands alone)."""
    start, stop = fused_rows(cfg, key)
    hd = cfg.head_dim
    total = (cfg.num_heads + 2 * cfg.num_kv_heads) * hd if FUSED_PARTS[key] == "qkv" else 2 * cfg.intermediate_size
    if whole.n_out != total:
        raise UnsupportedModelError(f"fused {FUSED_PARTS[key]} weight has {whole.n_out} rows; the config needs {total}")
    bias = None if whole.bias is None else whole.bias[start:stop]
    return Linear(whole.qtype, np.ascontiguousarray(whole.data[start:stop]), stop - start, whole.k_in, bias)


def last_read(read):
    """read(layer, name), remembering its last result: Phi-3's q, k and v (gate and up) are asked for one
    after another and come from one fused tensor, which is then read and converted once, not per part."""
    return functools.lru_cache(maxsize=1)(read)


def _assemble(cfg: ModelConfig, get, get_linear) -> ModelWeights:
    layers = []
    for i in range(cfg.num_layers):
        q, k, v = (get_linear(i, name) for name in ("q", "k", "v"))
        layers.append(LayerWeights(
            attn_norm=get(i, "attn_norm"),
            qkv=_fuse([q, k, v]),
            o_proj=get_linear(i, "o"),
            ffn_norm=get(i, "ffn_norm"),
            gate_up=_fuse([get_linear(i, "gate"), get_linear(i, "up")]),
            down=get_linear(i, "down"),
            q_norm=get(i, "q_norm") if cfg.qk_norm else None,
            k_norm=get(i, "k_norm") if cfg.qk_norm else None,
            post_attn_norm=get(i, "post_attn_norm") if cfg.post_norms else None,
            post_ffn_norm=get(i, "post_ffn_norm") if cfg.post_norms else None,
        ))
    embedding = get_linear(None, "embed")
    lm_head = embedding if cfg.tie_word_embeddings else get_linear(None, "lm_head")
    return ModelWeights(embedding, tuple(layers), get(None, "final_norm"), lm_head)


_HF_NAMES = {
    "attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
    "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
}
# Gemma 3 norms its branches' outputs: post_attention_layernorm follows attention there (in Llama it is
# the MLP's pre-norm), and its norms scale by 1 + w, so w + 1 is what our rmsnorm gets.
_HF_GEMMA3_NAMES = {**_HF_NAMES, "ffn_norm": "pre_feedforward_layernorm.weight",
                    "post_attn_norm": "post_attention_layernorm.weight",
                    "post_ffn_norm": "post_feedforward_layernorm.weight"}
_HF_PHI3_NAMES = {**_HF_NAMES, "qkv": "self_attn.qkv_proj", "gate_up": "mlp.gate_up_proj"}


def float_linear(w: np.ndarray, form: FloatForm, bias: np.ndarray | None = None,
                 bf16_bits_given: bool = False) -> Linear:
    """A float weight [N, K] in the asked form.

    Args:
        w: float values, or uint16 bfloat16 bits when bf16_bits_given.
        form: "f32" (float32 array) or "bf16" (raw bf16 bytes, qtype "bf16").
        bias: [N] float32 or None.
        bf16_bits_given: w holds bf16 bits (a bf16 file), kept as they are in "bf16" form.
    """
    n_out, k_in = (int(d) for d in w.shape)
    if form == "f32":
        data = bf16_to_f32(w) if bf16_bits_given else np.array(w, dtype=np.float32)
        return Linear("f32", np.ascontiguousarray(data), n_out, k_in, bias)
    bits = np.array(w, dtype=np.uint16) if bf16_bits_given else bf16_bits(w)
    return Linear("bf16", np.ascontiguousarray(bits).view(np.uint8).reshape(n_out, 2 * k_in), n_out, k_in, bias)


def load_hf_weights(folder: Path, cfg: ModelConfig, form: FloatForm = "f32") -> ModelWeights:
    """Reads every *.safetensors file of the folder (fp32, fp16 or bf16; no torch needed).

    Args:
        folder: The HF model folder.
        cfg: Its config.
        form: The float form of the linear weights (see the module docstring).
    """
    tensors: dict[str, RawTensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(read_safetensors(path))

    def raw(name: str) -> RawTensor:
        if name not in tensors:
            raise UnsupportedModelError(f"weight {name!r} is missing from {folder}")
        t = tensors[name]
        return RawTensor(t.dtype, array_of(name, t, folder))

    def as_f32(t: RawTensor) -> np.ndarray:
        return np.ascontiguousarray(bf16_to_f32(t.array) if t.dtype == "BF16" else np.array(t.array, dtype=np.float32))

    names = {"gemma3": _HF_GEMMA3_NAMES, "phi3": _HF_PHI3_NAMES}.get(cfg.arch, _HF_NAMES)

    def get(layer: int | None, key: str) -> np.ndarray:
        w = as_f32(raw("model.norm.weight" if layer is None else f"model.layers.{layer}.{names[key]}"))
        return (w + np.float32(1.0)).astype(np.float32) if cfg.arch == "gemma3" else w

    def linear(name: str, bias: str | None) -> Linear:
        t = raw(name)
        b = as_f32(raw(bias)) if bias is not None and bias in tensors else None
        return float_linear(t.array, form, b, bf16_bits_given=t.dtype == "BF16")

    fused_whole = last_read(lambda layer, name: get_linear(layer, name))

    def get_linear(layer: int | None, key: str) -> Linear:
        if layer is None:
            return linear("model.embed_tokens.weight" if key == "embed" else "lm_head.weight", None)
        if cfg.arch == "phi3" and key in FUSED_PARTS:
            return fused_part(fused_whole(layer, FUSED_PARTS[key]), cfg, key)
        prefix = f"model.layers.{layer}.{names[key]}"
        return linear(prefix + ".weight", prefix + ".bias")

    return _assemble(cfg, get, get_linear)


_GGUF_NAMES = {
    "attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v",
    "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down",
    "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
    # Gemma 3; llama.cpp's converter stores its norms as w + 1 already.
    "post_attn_norm": "post_attention_norm", "post_ffn_norm": "post_ffw_norm",
    # Phi-3's fused tensors (ffn_up holds gate|up there).
    "qkv": "attn_qkv", "gate_up": "ffn_up",
}


def load_gguf_weights(path: Path, cfg: ModelConfig, form: FloatForm = "f32") -> ModelWeights:
    """Reads GGUF tensors; block formats stay raw bytes (memory-mapped by gguf.GGUFReader), F32 linears
    take the float form asked for."""
    reader = open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}

    def take(name: str):
        if name not in tensors:
            raise UnsupportedModelError(f"tensor {name!r} is missing from {path}")
        return tensors[name]

    def as_float(name: str) -> np.ndarray:
        # norms and biases: a few KB a layer, read as float32 whether stored F32 or F16
        t = take(name)
        if t.tensor_type.name not in ("F32", "F16"):
            raise UnsupportedModelError(f"tensor {name} has type {t.tensor_type.name}; norms must be F32 or F16")
        return np.asarray(t.data).astype(np.float32).reshape(-1)

    def get(layer: int | None, key: str) -> np.ndarray:
        return as_float("output_norm.weight" if layer is None else f"blk.{layer}.{_GGUF_NAMES[key]}.weight")

    def linear_from(name: str, bias_name: str | None) -> Linear:
        t = take(name)
        kind = t.tensor_type.name
        k_in, n_out = (int(d) for d in t.shape[:2])  # GGUF lists dims innermost first
        bias = as_float(bias_name) if bias_name and bias_name in tensors else None
        if kind == "F32":
            return float_linear(np.asarray(t.data, dtype=np.float32).reshape(n_out, k_in), form, bias)
        if kind in GGUF_QTYPES:
            qtype = GGUF_QTYPES[kind]
            data = np.ascontiguousarray(np.asarray(t.data).view(np.uint8).reshape(n_out, -1))
        else:
            raise UnsupportedModelError(
                f"tensor {name} has GGUF type {kind}, which Crucible does not support "
                f"(supported: F32, {', '.join(GGUF_QTYPES)})")
        return Linear(qtype, data, n_out, k_in, bias)

    fused_whole = last_read(lambda layer, name: get_linear(layer, name))

    def get_linear(layer: int | None, key: str) -> Linear:
        if layer is None:
            return linear_from("token_embd.weight" if key == "embed" else "output.weight", None)
        fused = FUSED_PARTS.get(key)
        # llama.cpp also reads a phi3 file with separate attn_q / attn_k / attn_v.
        if cfg.arch == "phi3" and fused and f"blk.{layer}.{_GGUF_NAMES[fused]}.weight" in tensors:
            return fused_part(fused_whole(layer, fused), cfg, key)
        base = f"blk.{layer}.{_GGUF_NAMES[key]}"
        return linear_from(base + ".weight", base + ".bias")

    return _assemble(cfg, get, get_linear)


def load_weights(source: ModelSource, cfg: ModelConfig, form: FloatForm = "f32") -> ModelWeights:
    """Weights of a resolved model source in kernel form, float linears in `form`."""
    if source.format == "hf":
        return load_hf_weights(source.path, cfg, form)
    return load_gguf_weights(source.path, cfg, form)
