"""Tiny random-weight Llama-family models, written as Hugging Face folders and as GGUF files.

Tests generate these once per session; they are deterministic (seeded numpy) and small enough that the
transformers reference and our graphs run them in milliseconds, yet shaped like real models: GQA,
head_dim 64, K and N that are multiples of the GGUF block size (32) but not of larger tiles, and an odd
vocabulary size.

Variants:
- ``TINY_LLAMA``: Llama (untied lm_head, GQA 3, no biases).
- ``TINY_LLAMA31``: the same shape with Llama 3.1 RoPE scaling (rope_freqs.weight in GGUF).
- ``TINY_QWEN2``: Qwen2 (q/k/v biases, tied embeddings, GQA 2).
- ``TINY_QWEN3``: Qwen3 (per-head q/k RMSNorm, no biases, tied embeddings, head_dim 128 on a 192-wide model).
- ``TINY_GEMMA3``: Gemma 3 (scaled embedding, 1 + w norms before and after attention and the MLP, q/k
  norms, GeGLU, head_dim 256, six layers: five in a 16-token sliding window with rope base 10000, the
  sixth global with base 1e6, as llama.cpp's fixed pattern of six has it).

GGUF files follow llama.cpp's converter: for the ``llama`` architecture the q/k projection rows are
permuted to the interleaved rotary layout (transformers undoes it on load; our graphs use interleaved
rope on GGUF Llama weights instead); ``qwen2`` keeps the half-split layout; ``gemma3`` norms are stored
as w + 1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from tests.support.tiny_tokenizer import (
    BOS_TOKEN,
    CHAT_TEMPLATE,
    EOS_TOKEN,
    SPECIAL_TOKENS,
    TinyTokenizerSpec,
    build_tokenizer,
    merges_of,
    vocab_in_id_order,
)

Arch = Literal["llama", "qwen2", "qwen3", "gemma3", "phi3"]
# GGUF tensor types the conftest writes every tiny model in; norms and biases are always F32.
GGUF_WEIGHT_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
# Further types write_gguf writes, for single tensors (overrides) or whole files. gguf-py encodes the
# 32-value linear formats and BF16; the K-quants and IQ4 formats it only decodes, so their tensors are
# random valid blocks scaled to the float weight's spread (a tiny model's weights are random anyway, and
# the reference decodes the same bytes).
GGUF_MORE_TYPES = ("BF16", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
# write_gguf overrides giving TINY_QWEN2 every type of GGUF_MORE_TYPES (first matching fragment wins:
# layer 1's gate is BF16, layer 0's Q6_K); its MLP's 544 columns take 32-value formats in ffn_down.
EVERY_TYPE_OVERRIDES = {
    "layers.1.self_attn.q_proj": "IQ4_XS", "layers.1.mlp.down_proj": "IQ4_NL",
    "q_proj": "Q2_K", "k_proj": "Q3_K", "v_proj": "Q4_K", "o_proj": "Q5_K",
    "layers.1.mlp.gate_proj": "BF16", "gate_proj": "Q6_K", "up_proj": "Q5_0", "down_proj": "Q5_1",
    "embed_tokens": "Q4_K",
}
# Types written as random valid blocks (random_blocks_like).
GGUF_RANDOM_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
# A type write_gguf can write (gguf-py encodes it) that Crucible does not load: tests of the error.
GGUF_UNSUPPORTED_TYPES = ("MXFP4",)
GGUF_BLOCK = 32


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape and seed of a tiny model.

    Attributes:
        arch: ``"llama"``, ``"qwen2"`` or ``"qwen3"``.
        vocab_size: Tokenizer and embedding rows (odd on purpose: not a tile multiple).
        hidden_size: Model width; a multiple of 32 so GGUF blocks tile every row.
        intermediate_size: MLP width; a multiple of 32.
        num_layers: Decoder layers.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (GQA when fewer than num_heads).
        rope_theta: Rotary base.
        rms_norm_eps: RMSNorm epsilon.
        max_position_embeddings: Context length.
        tie_word_embeddings: lm_head shares the embedding matrix.
        qkv_bias: q/k/v projections have biases (Qwen2).
        seed: numpy seed for the weights.
        head_dim_override: Head width when it is not hidden_size / num_heads (Qwen3's is its own).
        llama3_rope: Llama 3.1-style frequency scaling (factor, low_freq_factor, high_freq_factor,
            original_max_position_embeddings), or None: in config.json as rope_scaling, in GGUF as the
            rope_freqs.weight tensor llama.cpp's converter writes.
        sliding_window: The attention window, 0 for none. Gemma 3: layers with (i + 1) % 6 != 0 use it.
            Llama: written as a Mistral config (every layer). Qwen2 / Qwen3: `use_sliding_window` with
            `max_window_layers` 1 (every layer but the first). config.json only; a GGUF file carries it
            for Gemma 3 alone, as llama.cpp reads it.
        query_pre_attn_scalar: Gemma 3's score scale is its ** -0.5. Only config.json carries it: a GGUF
            file scales by head_dim ** -0.5, as llama.cpp and transformers read one.
        rope_linear: Gemma 3's linear rope scaling factor of the global layers (4B and up: 8), or None.
    """

    arch: Arch
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    seed: int
    llama3_rope: tuple[float, float, float, int] | None = None
    head_dim_override: int | None = None
    sliding_window: int = 0
    query_pre_attn_scalar: int | None = None
    rope_linear: float | None = None

    def __post_init__(self) -> None:
        if self.head_dim_override is None and self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        for name in ("hidden_size", "intermediate_size"):
            if getattr(self, name) % GGUF_BLOCK:
                raise ValueError(f"{name} must be a multiple of {GGUF_BLOCK} for GGUF block formats")

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads

    @property
    def name(self) -> str:
        return f"tiny-{self.arch}" + ("-llama3-rope" if self.llama3_rope else "") + (
            f"-window{self.sliding_window}" if self.sliding_window and self.arch != "gemma3" else "")

    def rope_freq_factors(self) -> np.ndarray:
        """[D/2] float32 rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py computes it (LlamaModel)."""
        factor, low, high, old_ctx = self.llama3_rope
        d = self.head_dim
        freqs = 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        out = []
        for freq in freqs:
            wavelen = 2 * math.pi / float(freq)
            if wavelen < high_wavelen:
                out.append(1.0)
            elif wavelen > low_wavelen:
                out.append(factor)
            else:
                smooth = (old_ctx / wavelen - low) / (high - low)
                out.append(1 / ((1 - smooth) / factor + smooth))
        return np.array(out, dtype=np.float32)


TINY_LLAMA = TinyModelSpec(
    arch="llama", vocab_size=397, hidden_size=192, intermediate_size=416, num_layers=2,
    num_heads=3, num_kv_heads=1, rope_theta=10000.0, rms_norm_eps=1e-5,
    max_position_embeddings=1024, tie_word_embeddings=False, qkv_bias=False, seed=1234,
)
# Llama 3.1-style: frequencies scaled past an original context of 64 positions (factor 8).
TINY_LLAMA31 = TinyModelSpec(
    arch="llama", vocab_size=397, hidden_size=192, intermediate_size=416, num_layers=2,
    num_heads=3, num_kv_heads=1, rope_theta=10000.0, rms_norm_eps=1e-5,
    max_position_embeddings=1024, tie_word_embeddings=False, qkv_bias=False, seed=31,
    llama3_rope=(8.0, 1.0, 4.0, 64),
)
TINY_QWEN2 = TinyModelSpec(
    arch="qwen2", vocab_size=411, hidden_size=256, intermediate_size=544, num_layers=2,
    num_heads=4, num_kv_heads=2, rope_theta=1000000.0, rms_norm_eps=1e-6,
    max_position_embeddings=1024, tie_word_embeddings=True, qkv_bias=True, seed=4321,
)
# Qwen3: q/k heads RMS-normalized before rope, no biases, tied embeddings, and a head width (128) that
# is not hidden / heads (as Qwen3-0.6B: 1024 wide, 16 heads of 128).
TINY_QWEN3 = TinyModelSpec(
    arch="qwen3", vocab_size=389, hidden_size=192, intermediate_size=416, num_layers=2,
    num_heads=2, num_kv_heads=1, rope_theta=1000000.0, rms_norm_eps=1e-6,
    max_position_embeddings=1024, tie_word_embeddings=True, qkv_bias=False, seed=3333,
    head_dim_override=128,
)
# Phi-3: a Llama decoder whose q|k|v and gate|up are fused tensors (qkv_proj, gate_up_proj).
TINY_PHI3 = TinyModelSpec(
    arch="phi3", vocab_size=403, hidden_size=192, intermediate_size=352, num_layers=2,
    num_heads=3, num_kv_heads=1, rope_theta=10000.0, rms_norm_eps=1e-5,
    max_position_embeddings=1024, tie_word_embeddings=False, qkv_bias=False, seed=3434,
)
# Gemma 3 at head_dim 256 (as Gemma 3 270M: 640 wide, 4 heads of 256, 1 kv head). A query scale of its
# own (192 ** -0.5, not 256 ** -0.5) in the HF form; the window is shorter than the test prompts.
TINY_GEMMA3 = TinyModelSpec(
    arch="gemma3", vocab_size=401, hidden_size=128, intermediate_size=224, num_layers=6,
    num_heads=2, num_kv_heads=1, rope_theta=1000000.0, rms_norm_eps=1e-6,
    max_position_embeddings=1024, tie_word_embeddings=True, qkv_bias=False, seed=2703,
    head_dim_override=256, sliding_window=16, query_pre_attn_scalar=192,
)


def make_weights(spec: TinyModelSpec) -> dict[str, np.ndarray]:
    """Draws the model's weights, keyed by Hugging Face tensor name.

    Linear weights are scaled by 1/sqrt(fan_in) so activations stay O(1) through the layers and logits
    have clear top-1 margins (the parity tests compare argmaxes).

    Args:
        spec: The tiny model's shape and seed.

    Returns:
        float32 arrays; linear weights in the nn.Linear layout [out_features, in_features].
    """
    rng = np.random.default_rng(spec.seed)
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_out, kv_out = spec.num_heads * hd, spec.num_kv_heads * hd

    def linear(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        # Gemma's norms scale by 1 + w, so its stored weights sit around 0.
        return ((0.0 if spec.arch == "gemma3" else 1.0) + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((spec.vocab_size, h)).astype(np.float32),
    }
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = linear(q_out, h)
        w[p + "self_attn.k_proj.weight"] = linear(kv_out, h)
        w[p + "self_attn.v_proj.weight"] = linear(kv_out, h)
        if spec.arch in ("qwen3", "gemma3"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        if spec.qkv_bias:
            w[p + "self_attn.q_proj.bias"] = (0.1 * rng.standard_normal(q_out)).astype(np.float32)
            w[p + "self_attn.k_proj.bias"] = (0.1 * rng.standard_normal(kv_out)).astype(np.float32)
            w[p + "self_attn.v_proj.bias"] = (0.1 * rng.standard_normal(kv_out)).astype(np.float32)
        w[p + "self_attn.o_proj.weight"] = linear(h, q_out)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        if spec.arch == "gemma3":
            w[p + "pre_feedforward_layernorm.weight"] = norm(h)
            w[p + "post_feedforward_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = linear(i, h)
        w[p + "mlp.up_proj.weight"] = linear(i, h)
        w[p + "mlp.down_proj.weight"] = linear(h, i)
    w["model.norm.weight"] = norm(h)
    if not spec.tie_word_embeddings:
        w["lm_head.weight"] = linear(spec.vocab_size, h)
    return w


def _hf_config(spec: TinyModelSpec) -> dict:
    common = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "bos_token_id": SPECIAL_TOKENS.index(BOS_TOKEN),
        "eos_token_id": SPECIAL_TOKENS.index(EOS_TOKEN),
        "torch_dtype": "float32",
    }
    if spec.llama3_rope is not None:
        factor, low, high, old_ctx = spec.llama3_rope
        common["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                  "high_freq_factor": high, "original_max_position_embeddings": old_ctx}
    if spec.arch == "phi3":
        return {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "pad_token_id": common["eos_token_id"],
                "sliding_window": spec.sliding_window or None, **common}
    if spec.arch == "llama" and spec.sliding_window:
        return {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "sliding_window": spec.sliding_window, **common}
    if spec.arch == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "attention_bias": False, "mlp_bias": False, **common}
    window = {"use_sliding_window": bool(spec.sliding_window), "sliding_window": spec.sliding_window or None,
              "max_window_layers": 1}
    if spec.arch == "gemma3":
        common.pop("rope_theta")
        common.pop("hidden_act")
        return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": spec.query_pre_attn_scalar,
                "sliding_window": spec.sliding_window, "layer_types": _gemma3_layer_types(spec),
                "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": spec.rope_theta}
                                    if spec.rope_linear is None else
                                    {"rope_type": "linear", "factor": spec.rope_linear, "rope_theta": spec.rope_theta},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                "final_logit_softcapping": None, "attn_logit_softcapping": None, **common}
    if spec.arch == "qwen3":
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
                **window, **common}
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **window, **common}


def _gemma3_layer_types(spec: TinyModelSpec) -> list[str]:
    # llama.cpp's gemma3 pattern (and transformers' default): every sixth layer is global.
    return ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(spec.num_layers)]


def quantize_roundtrip(weights: dict[str, np.ndarray], weight_type: str) -> dict[str, np.ndarray]:
    """Returns the weights as a GGUF file of ``weight_type`` holds them, decoded back to float32.

    Uses the ``gguf`` package's reference quantizer and dequantizer on the same tensors ``write_gguf``
    quantizes (2-D weights), so an HF folder written from the result is the float twin of that GGUF file.
    """
    import gguf

    known = GGUF_WEIGHT_TYPES + GGUF_MORE_TYPES + GGUF_UNSUPPORTED_TYPES
    if weight_type not in known:
        raise ValueError(f"weight_type must be one of {known}, got {weight_type!r}")
    out = {}
    for name, w in weights.items():
        if w.ndim == 1 or weight_type == "F32":
            out[name] = w
        elif weight_type == "F16":
            out[name] = w.astype(np.float16).astype(np.float32)
        else:
            qtype = gguf.GGMLQuantizationType[weight_type]
            out[name] = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).astype(np.float32)
    return out


def write_hf(
    spec: TinyModelSpec,
    folder: Path,
    dtype: Literal["float32", "bfloat16"] = "float32",
    weights: dict[str, np.ndarray] | None = None,
) -> Path:
    """Writes the model as a Hugging Face folder (config, safetensors, tokenizer, chat template).

    Args:
        spec: The tiny model.
        folder: Destination folder (created).
        dtype: Storage dtype of the safetensors weights.
        weights: Weights to write instead of ``make_weights(spec)`` (e.g. a quantization round trip).

    Returns:
        The folder.
    """
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    weights = make_weights(spec) if weights is None else weights
    if spec.arch == "phi3":
        weights = fuse_phi3(weights)
    if dtype == "bfloat16":
        # numpy has no bfloat16; torch (a test dependency, like this module's users) writes it.
        import torch
        from safetensors.torch import save_file as save_torch

        tensors = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in weights.items()}
        save_torch(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = _hf_config(spec)
    config["torch_dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({
        "bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
    }, indent=2))

    tok = build_tokenizer(TinyTokenizerSpec(spec.vocab_size))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": spec.max_position_embeddings,
    }, indent=2))
    return folder


def fuse_phi3(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights under Phi-3's names: q|k|v rows as self_attn.qkv_proj, gate|up rows as
    mlp.gate_up_proj (Phi3MLP chunks gate first)."""
    out = dict(weights)
    for name in [n for n in weights if n.endswith("self_attn.q_proj.weight")]:
        p = name[: -len("self_attn.q_proj.weight")]
        out[p + "self_attn.qkv_proj.weight"] = np.concatenate(
            [out.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"], axis=0)
        out[p + "mlp.gate_up_proj.weight"] = np.concatenate(
            [out.pop(p + "mlp.gate_proj.weight"), out.pop(p + "mlp.up_proj.weight")], axis=0)
    return out


def _permute_for_gguf_llama(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf `permute`: half-split rotary rows -> interleaved pairs.
    return (w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _gguf_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")  # model.layers.{i}.{module...}.{weight|bias}
    layer, module, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
    table = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
        "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",  # Phi-3's fused tensors
    }
    if arch == "gemma3":  # llama.cpp's Gemma 3 names: its post_attention_layernorm norms the attention output
        table.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    return f"blk.{layer}.{table[module]}.{suffix}"


def random_blocks_like(w: np.ndarray, wtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random valid `wtype` blocks [N, bytes] for a float weight w [N, K] (K a multiple of the block),
    their d (and dmin) set so the decoded values have w's standard deviation."""
    import gguf

    from crucible.conformance.naive import HALF_OFFSETS, dequantize, random_blocks

    qtype = wtype.lower()
    n, k = w.shape
    block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[wtype]]
    blocks = random_blocks(n, k, qtype, rng).reshape(n, k // block, -1)
    halves = HALF_OFFSETS[qtype]
    unit = dequantize(_set_halves(blocks, halves, 1.0).reshape(n, -1), qtype, n, k)
    scale = float(np.std(w)) / max(float(np.std(unit)), 1e-30)
    return _set_halves(blocks, halves, scale).reshape(n, -1)


def _set_halves(blocks: np.ndarray, at: tuple[int, ...], value: float) -> np.ndarray:
    out = blocks.copy()
    for i in at:
        out[..., i:i + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return out


def _add_bpe_vocab(writer, vocab_size: int) -> None:
    # The tiny byte-level BPE tokenizer with the ChatML template (tokenizer.ggml.model "gpt2").
    tok = build_tokenizer(TinyTokenizerSpec(vocab_size))
    tokens = vocab_in_id_order(tok)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])  # 3 = control token
    writer.add_token_merges(merges_of(tok))
    writer.add_bos_token_id(SPECIAL_TOKENS.index(BOS_TOKEN))
    writer.add_eos_token_id(SPECIAL_TOKENS.index(EOS_TOKEN))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)



SPM_CONTROL = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>")


def spm_vocab(vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    """A Gemma-style SentencePiece vocabulary of exactly vocab_size pieces: (tokens, scores, types).

    Control tokens, the 256 <0xNN> byte tokens, every printable ASCII character (space as "▁"), then the
    tiny BPE tokenizer's merged pieces in merge order until the size is reached. Scores are negative
    ranks, as in Gemma 3's GGUF; every merged piece splits into two earlier pieces, so BPE reaches it.
    """
    tokens = list(SPM_CONTROL) + [f"<0x{b:02X}>" for b in range(256)]
    types = [3] * len(SPM_CONTROL) + [6] * 256
    tokens += [("▁" if c == " " else c) for c in map(chr, range(32, 127))]
    types += [1] * (len(tokens) - len(types))
    seen = set(tokens)
    bpe = build_tokenizer(TinyTokenizerSpec(401))
    for piece in vocab_in_id_order(bpe)[len(SPECIAL_TOKENS) + 256:]:  # merged pieces, in merge order
        if len(tokens) >= vocab_size:
            break
        text = bpe.decode([bpe.token_to_id(piece)]).replace(" ", "▁")
        if text not in seen and any(text[:k] in seen and text[k:] in seen for k in range(1, len(text))):
            tokens.append(text)
            types.append(1)
            seen.add(text)
    if len(tokens) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is below the {len(tokens)} base pieces")
    while len(tokens) < vocab_size:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(3)
    return tokens, [-float(i) for i in range(vocab_size)], types


def _add_spm_vocab(writer, vocab_size: int) -> None:
    # Gemma 3's tokenizer form: SentencePiece BPE ranked by score, <bos> added, no chat template (as
    # the packaged Gemma 3 270M file: the loader supplies Gemma 3's).
    tokens, scores, types = spm_vocab(vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)


def write_gguf(spec: TinyModelSpec, path: Path, weight_type: str = "F32",
               overrides: dict[str, str] | None = None) -> Path:
    """Writes the model as a GGUF file with its 2-D weights in ``weight_type``.

    Args:
        spec: The tiny model.
        path: Destination ``.gguf`` file.
        weight_type: One of ``GGUF_WEIGHT_TYPES``, ``GGUF_MORE_TYPES`` or ``GGUF_UNSUPPORTED_TYPES``; applies to every 2-D
            weight (embedding and lm_head included, as llama.cpp does); norms and biases stay F32.
        overrides: Types of single tensors, by a fragment of their HF name (``"q_proj"``,
            ``"input_layernorm"``: F32 or F16 for norms), as llama.cpp's mixed presets write them.

    Returns:
        The path.
    """
    import gguf

    known = GGUF_WEIGHT_TYPES + GGUF_MORE_TYPES + GGUF_UNSUPPORTED_TYPES
    if weight_type not in known:
        raise ValueError(f"weight_type must be one of {known}, got {weight_type!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".gguf.tmp")
    writer = gguf.GGUFWriter(str(tmp), spec.arch)
    writer.add_name(spec.name)
    writer.add_context_length(spec.max_position_embeddings)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_block_count(spec.num_layers)
    writer.add_feed_forward_length(spec.intermediate_size)
    writer.add_head_count(spec.num_heads)
    writer.add_head_count_kv(spec.num_kv_heads)
    writer.add_rope_dimension_count(spec.head_dim)
    if spec.head_dim_override is not None:  # llama.cpp writes a head width of its own as key/value_length
        writer.add_key_length(spec.head_dim)
        writer.add_value_length(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    if spec.sliding_window and spec.arch == "gemma3":
        writer.add_sliding_window(spec.sliding_window)
    if spec.rope_linear is not None:  # llama.cpp's converter writes Gemma 3's scaling so
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(spec.rope_linear)
    writer.add_layer_norm_rms_eps(spec.rms_norm_eps)
    writer.add_vocab_size(spec.vocab_size)
    # llama_ftype of a file whose weights are all of one type (gguf.LlamaFileType).
    writer.add_file_type({"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
                          "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32,
                          "MXFP4": 38}[weight_type])

    if spec.arch == "gemma3":
        _add_spm_vocab(writer, spec.vocab_size)
    else:
        _add_bpe_vocab(writer, spec.vocab_size)

    if spec.arch == "phi3":  # transformers' Phi3Config pads with id 32000 unless the file names one
        writer.add_pad_token_id(SPECIAL_TOKENS.index(EOS_TOKEN))
    rng = np.random.default_rng(spec.seed + 7)
    weights = make_weights(spec)
    for hf_name, w in (fuse_phi3(weights) if spec.arch == "phi3" else weights).items():
        if spec.arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = spec.num_heads if "q_proj" in hf_name else spec.num_kv_heads
            w = _permute_for_gguf_llama(w, heads)
        if spec.arch == "gemma3" and hf_name.endswith("norm.weight"):
            w = (w + np.float32(1.0)).astype(np.float32)  # llama.cpp's converter stores Gemma norms as w + 1
        name = _gguf_name(hf_name, spec.arch)
        wtype = next((t for frag, t in (overrides or {}).items() if frag in hf_name),
                     "F32" if w.ndim == 1 else weight_type)
        if w.ndim == 1 and wtype not in ("F32", "F16"):
            wtype = "F32"  # a bias of a tensor given a block type: llama.cpp keeps those F32 too
        if wtype == "F32":
            writer.add_tensor(name, w.astype(np.float32))
        elif wtype == "F16":
            writer.add_tensor(name, w.astype(np.float16))
        elif wtype in GGUF_RANDOM_TYPES:
            qt = gguf.GGMLQuantizationType[wtype]
            writer.add_tensor(name, random_blocks_like(w, wtype, rng), raw_dtype=qt)
        else:
            qt = gguf.GGMLQuantizationType[wtype]
            writer.add_tensor(name, gguf.quants.quantize(w, qt), raw_dtype=qt)

    if spec.llama3_rope is not None:
        writer.add_tensor("rope_freqs.weight", spec.rope_freq_factors())

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)  # atomic: a killed writer never leaves a half file under the final name
    return path
