"""One frozen model configuration for the Llama family, read from a Hugging Face config.json or from GGUF
metadata.

Supported architectures: Llama (2, 3, SmolLM2: no biases, optional llama3 rope scaling), Mistral (a Llama
whose config.json window covers every layer), Qwen2 (q/k/v biases) and Qwen3 (RMSNorm of each q and k head
before rope, head_dim of its own), both with config.json's optional sliding-window layers, Phi-3 (a Llama
with fused q|k|v and gate|up tensors) and Gemma 3 text models (embedding scaled by sqrt(hidden), norms with
weights 1 + w, GeGLU MLP, norms before and after attention and the MLP, q/k norms, query_pre_attn_scalar,
sliding-window layers with their own rope base).
Anything else is rejected by name, never guessed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from crucible.core.errors import UnsupportedModelError  # noqa: F401 - raised here, re-exported
from crucible.core.registry import ModelSource

Arch = Literal["llama", "qwen2", "qwen3", "gemma3", "phi3"]
HF_ARCHITECTURES: dict[str, Arch] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
GGUF_ARCHITECTURES: dict[str, Arch] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3",
                                       "phi3": "phi3"}
# Gemma 3: every sixth layer (5, 11, ...) attends globally, the others in a sliding window, with rope
# base 10000 (llama.cpp hard-codes both for the gemma3 GGUF architecture; HF configs may spell them out).
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 style frequency scaling (rope_scaling.rope_type == "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """Everything the graph builder needs about a model.

    Attributes:
        arch: "llama", "qwen2" or "qwen3".
        vocab_size: Embedding rows.
        hidden_size: Model width H.
        intermediate_size: MLP width I.
        num_layers: Decoder layers.
        num_heads: Query heads Hq.
        num_kv_heads: Key/value heads Hkv.
        head_dim: D.
        rope_theta: Rotary base.
        rope_scaling: Llama 3 scaling or None.
        rope_interleaved: True for GGUF Llama weights (llama.cpp permutes q/k rows to interleaved pairs).
        rms_norm_eps: Norm epsilon.
        tie_word_embeddings: lm_head shares the embedding.
        qkv_bias: q/k/v projections have biases.
        max_position_embeddings: Context length.
        bos_token_id: Beginning-of-sequence id, if any.
        eos_token_ids: End ids (the model's end-of-turn token among them).
        rope_freq_factors: [D/2] divisors of the rotary frequencies, llama.cpp's form of Llama 3.1/3.2
            scaling (the GGUF tensor rope_freqs.weight), or None.
        qk_norm: Each head of q and k goes through an RMSNorm (weights [D]) before rope (Qwen3, Gemma 3).
        embed_scale: Factor on the embedding rows (Gemma: sqrt(hidden)), or None.
        post_norms: An RMSNorm on the attention and MLP outputs before each residual add (Gemma 3).
        mlp_act: Gate activation of the MLP: "silu" (SwiGLU) or "gelu_tanh" (Gemma's GeGLU).
        query_scale: Attention score scale when it is not head_dim ** -0.5 (Gemma 3:
            query_pre_attn_scalar ** -0.5), or None.
        sliding_window: W of the sliding-window layers (a query at p sees p - W + 1 .. p); 0 = none.
        sliding_layers: Per layer, whether it is a sliding-window layer (empty when W = 0).
        rope_local_theta: Rotary base of the sliding-window layers (Gemma 3: 10000), or None (rope_theta).
        rope_linear_factor: Linear rope scaling of the global layers (positions divided by it; Gemma 3
            4B and up: 8), 1.0 for none.
    """

    arch: Arch
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    rope_interleaved: bool
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    rope_freq_factors: tuple[float, ...] | None = None
    qk_norm: bool = False
    embed_scale: float | None = None
    post_norms: bool = False
    mlp_act: Literal["silu", "gelu_tanh"] = "silu"
    query_scale: float | None = None
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()
    rope_local_theta: float | None = None
    rope_linear_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim not in (64, 128, 256):
            raise UnsupportedModelError(f"head_dim {self.head_dim} is not supported (64, 128 or 256)")
        if self.num_layers < 1 or self.hidden_size < 1:
            raise UnsupportedModelError("a model needs at least one layer and a positive width")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise UnsupportedModelError(f"rope_freqs.weight has {len(self.rope_freq_factors)} factors; "
                                        f"head_dim {self.head_dim} needs {self.head_dim // 2}")
        if self.sliding_window < 0:
            raise UnsupportedModelError(f"sliding_window must be >= 0, got {self.sliding_window}")
        if self.sliding_window and len(self.sliding_layers) != self.num_layers:
            raise UnsupportedModelError(f"{len(self.sliding_layers)} layer types for {self.num_layers} layers")
        if not self.sliding_window and any(self.sliding_layers):
            raise UnsupportedModelError("sliding-window layers need a sliding_window")
        if self.query_scale is not None and not self.qk_norm:
            raise UnsupportedModelError("a query scale of its own is folded into the q norm; this model has none")
        if self.mlp_act not in ("silu", "gelu_tanh"):
            raise UnsupportedModelError(f"MLP activation {self.mlp_act!r} is not supported (silu, gelu_tanh)")

    def layer_window(self, layer: int) -> int:
        """The attention window of a layer: sliding_window for a sliding layer, else 0 (all keys)."""
        return self.sliding_window if self.sliding_layers and self.sliding_layers[layer] else 0

    def inv_freq(self, local: bool = False) -> np.ndarray:
        """[D/2] float32 inverse rotary frequencies, computed in float32 as transformers does.

        Args:
            local: For a sliding-window layer: rope_local_theta's frequencies (unscaled) when set.
        """
        d = self.head_dim
        theta = self.rope_local_theta if local and self.rope_local_theta is not None else self.rope_theta
        exponent = np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / np.float32(d)
        inv = (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)
        if local and self.rope_local_theta is not None:
            return inv
        if self.rope_linear_factor != 1.0:  # transformers' "linear" rope type: inv_freq / factor
            return (inv / np.float32(self.rope_linear_factor)).astype(np.float32)
        if self.rope_freq_factors is not None:  # llama.cpp: theta = pos * inv_freq / factor
            return (inv / np.asarray(self.rope_freq_factors, dtype=np.float32)).astype(np.float32)
        s = self.rope_scaling
        if s is None:
            return inv
        # transformers' _compute_llama3_parameters.
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
        smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)


def _rope_scaling(raw: dict | None) -> RopeScaling | None:
    if not raw:
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise UnsupportedModelError(f"rope scaling type {kind!r} is not supported (only llama3)")
    return RopeScaling(float(raw["factor"]), float(raw["low_freq_factor"]), float(raw["high_freq_factor"]),
                       int(raw["original_max_position_embeddings"]))


def _eos_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)  # type: ignore[union-attr]


def config_from_hf(folder: Path) -> ModelConfig:
    """Reads config.json (and generation_config.json for end ids) of a Hugging Face folder."""
    raw = json.loads((folder / "config.json").read_text())
    archs = raw.get("architectures") or []
    arch = HF_ARCHITECTURES.get(archs[0] if archs else "")
    if arch is None:
        raise UnsupportedModelError(
            f"architecture {archs or raw.get('model_type')} is not supported; Crucible runs "
            f"{', '.join(sorted(HF_ARCHITECTURES))}")
    if arch == "llama" and (raw.get("attention_bias") or raw.get("mlp_bias")):
        raise UnsupportedModelError("Llama with attention_bias/mlp_bias is not supported")
    if arch == "phi3":
        _check_phi3_hf(raw)
    eos = _eos_ids(raw.get("eos_token_id"))
    gen = folder / "generation_config.json"
    if gen.is_file():
        eos = tuple(dict.fromkeys(eos + _eos_ids(json.loads(gen.read_text()).get("eos_token_id"))))
    heads = int(raw["num_attention_heads"])
    rope_theta, rope_raw = raw.get("rope_theta", 10000.0), raw.get("rope_scaling")
    extra: dict = {}
    if arch == "gemma3":
        extra = _gemma3_hf(raw)
        rope_theta, rope_raw = extra.pop("rope_theta"), extra.pop("rope_scaling")
    else:
        extra = _sliding_hf(archs[0], raw)
        if "rope_parameters" in raw and "rope_theta" not in raw:  # transformers 5 writes it there
            rope_theta, rope_raw = raw["rope_parameters"].get("rope_theta", 10000.0), raw["rope_parameters"]
    return ModelConfig(
        arch=arch,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        rope_theta=float(rope_theta),
        rope_scaling=_rope_scaling(rope_raw),
        rope_interleaved=False,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", arch == "gemma3")),
        qkv_bias=arch == "qwen2" or (arch in ("qwen3", "gemma3") and bool(raw.get("attention_bias"))),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos,
        qk_norm=arch in ("qwen3", "gemma3"),
        **extra,
    )


def _check_phi3_hf(raw: dict) -> None:
    """Phi-3's variants that would need more than a Llama decoder with fused weights: LongRoPE (the
    128k models, Phi-3.5), partial rotary (Phi-4-mini), a non-SiLU MLP."""
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise UnsupportedModelError(f"Phi-3 rope scaling {rope.get('rope_type', rope.get('type'))!r} is not supported")
    partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if float(partial) != 1.0:
        raise UnsupportedModelError(f"Phi-3 with partial_rotary_factor {partial} is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"Phi-3 MLP activation {raw['hidden_act']!r} is not supported (silu)")


def _sliding_hf(hf_arch: str, raw: dict) -> dict:
    """Sliding-window layers of a Mistral, Phi-3, Qwen2 or Qwen3 config.json, as transformers reads them.

    Mistral: every layer attends in `sliding_window` (4096 when the key is absent: v0.1; v0.2 and later
    write null). Phi-3: every layer, when the key is set. Qwen2 / Qwen3: only with `use_sliding_window`, the layers `layer_types` names, or else
    those from `max_window_layers` on. Llama's config has no window.
    """
    if hf_arch == "MistralForCausalLM":
        window = raw.get("sliding_window", 4096)
        types = ["sliding_attention"] * int(raw["num_hidden_layers"])
    elif hf_arch == "Phi3ForCausalLM":  # transformers' Phi3Config: none unless given (Phi-3-mini-4k: 2047)
        window = raw.get("sliding_window")
        types = ["sliding_attention"] * int(raw["num_hidden_layers"])
    elif hf_arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and raw.get("use_sliding_window"):
        window = raw.get("sliding_window", 4096)
        first = int(raw.get("max_window_layers", 28))
        types = raw.get("layer_types") or [
            "sliding_attention" if i >= first else "full_attention" for i in range(int(raw["num_hidden_layers"]))]
    else:
        return {}
    if set(types) - {"full_attention", "sliding_attention"}:
        raise UnsupportedModelError(f"layer types {sorted(set(types))} are not supported")
    if window is None or "sliding_attention" not in types:
        return {}
    if int(window) <= 0:
        raise UnsupportedModelError(f"sliding_window must be positive, got {window}")
    return {"sliding_window": int(window), "sliding_layers": tuple(t == "sliding_attention" for t in types)}


def _gemma3_hf(raw: dict) -> dict:
    """Gemma 3's own config keys (transformers 4.5x and 5.x spellings) as ModelConfig fields."""
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if raw.get(key) is not None:
            raise UnsupportedModelError(f"Gemma 3 with {key}={raw[key]} is not supported")
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError("Gemma 3 with bidirectional attention is not supported")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedModelError(f"Gemma 3 MLP activation {act!r} is not supported (gelu_pytorch_tanh)")
    n_layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or [
        "full_attention" if (i + 1) % int(raw.get("sliding_window_pattern", GEMMA3_SLIDING_PATTERN)) == 0
        else "sliding_attention" for i in range(n_layers)]
    if set(types) - {"full_attention", "sliding_attention"}:
        raise UnsupportedModelError(f"Gemma 3 layer types {sorted(set(types))} are not supported")
    params = raw.get("rope_parameters") or {}
    full = params.get("full_attention", {})
    local = params.get("sliding_attention", {})
    if local.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"rope scaling {local['rope_type']!r} on sliding layers is not supported")
    return {
        "embed_scale": float(np.sqrt(np.float32(raw["hidden_size"]))),
        "post_norms": True,
        "mlp_act": "gelu_tanh",
        "query_scale": float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        "sliding_window": int(raw.get("sliding_window") or 4096),  # transformers' Gemma3TextConfig default
        "sliding_layers": tuple(t == "sliding_attention" for t in types),
        "rope_local_theta": float(local.get("rope_theta", raw.get("rope_local_base_freq", GEMMA3_LOCAL_ROPE_THETA))),
        "rope_theta": float(full.get("rope_theta", raw.get("rope_theta", 1000000.0))),
        **_gemma3_global_scaling(full if full.get("rope_type", "default") != "default" else raw.get("rope_scaling")),
    }


def _gemma3_global_scaling(raw: dict | None) -> dict:
    # Gemma 3 4B and up scale their global layers' rope linearly (factor 8); other types are refused.
    kind = (raw or {}).get("rope_type", (raw or {}).get("type"))
    if kind == "linear":
        return {"rope_scaling": None, "rope_linear_factor": float(raw["factor"])}
    return {"rope_scaling": raw}


def config_from_gguf(reader) -> ModelConfig:
    """Reads the `<arch>.*` and tokenizer keys of an open gguf.GGUFReader."""
    from crucible.core import gguf_meta

    def field(key: str, default: object = None) -> object:
        return gguf_meta.field(reader, key, default)

    arch_name = field("general.architecture")
    arch = GGUF_ARCHITECTURES.get(str(arch_name))
    if arch is None:
        raise UnsupportedModelError(
            f"GGUF architecture {arch_name!r} is not supported; Crucible runs {', '.join(GGUF_ARCHITECTURES)}")
    p = str(arch_name)
    names = {t.name for t in reader.tensors}
    heads = int(field(f"{p}.attention.head_count"))
    hidden = int(field(f"{p}.embedding_length"))
    vocab = field(f"{p}.vocab_size") or gguf_meta.vocab_size(reader)
    scaling = field(f"{p}.rope.scaling.type")
    if (arch in ("llama", "phi3") and scaling not in (None, "none")) or (
            arch == "gemma3" and scaling not in (None, "none", "linear")):
        raise UnsupportedModelError(f"GGUF rope scaling {field(f'{p}.rope.scaling.type')!r} is not supported")
    if arch == "phi3" and "rope_factors_long.weight" in names:
        raise UnsupportedModelError("GGUF phi3 with LongRoPE factors (the 128k models) is not supported")
    if arch == "phi3" and int(field(f"{p}.rope.dimension_count", hidden // heads)) != hidden // heads:
        raise UnsupportedModelError(
            f"GGUF phi3 with partial rotary ({field(f'{p}.rope.dimension_count')} of {hidden // heads} dims) "
            "is not supported")
    factors = None
    if "rope_freqs.weight" in names:  # llama.cpp's form of Llama 3.1/3.2 frequency scaling
        t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        if t.tensor_type.name != "F32":
            raise UnsupportedModelError(f"rope_freqs.weight has GGUF type {t.tensor_type.name}; expected F32")
        factors = tuple(float(x) for x in np.asarray(t.data, dtype=np.float32).reshape(-1))
    n_layers = int(field(f"{p}.block_count"))
    head_dim = int(field(f"{p}.attention.key_length") or field(f"{p}.rope.dimension_count", hidden // heads))
    eos = _eos_ids(field("tokenizer.ggml.eos_token_id"))
    extra: dict = {}
    if arch == "gemma3":
        # llama.cpp (llama-model.cpp, LLM_ARCH_GEMMA3): the 27B model (62 layers) scales queries by
        # (hidden / heads) ** -0.5, every other size by head_dim ** -0.5.
        qpas = hidden / heads if n_layers == 62 else head_dim
        window = int(field(f"{p}.attention.sliding_window", 0) or 0)
        if window <= 0:  # llama.cpp requires it too: without it every layer would silently be global
            raise UnsupportedModelError(f"GGUF gemma3 file without {p}.attention.sliding_window")
        extra = {
            "embed_scale": float(np.sqrt(np.float32(hidden))), "post_norms": True, "mlp_act": "gelu_tanh",
            "query_scale": float(qpas) ** -0.5, "sliding_window": window,
            "sliding_layers": tuple((i + 1) % GEMMA3_SLIDING_PATTERN != 0 for i in range(n_layers)),
            "rope_local_theta": GEMMA3_LOCAL_ROPE_THETA,
            "rope_linear_factor": float(field(f"{p}.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0,
        }
        # The chat template ends a turn with <end_of_turn>, not the file's eos (<eos>): both stop.
        end_of_turn = gguf_meta.token_id(reader, "<end_of_turn>")
        if end_of_turn is not None:
            eos = tuple(dict.fromkeys(eos + (end_of_turn,)))
    if arch == "phi3":
        # Phi-3's turns end with <|end|>, the file's eos is <|endoftext|> (llama.cpp stops at both). The
        # file's sliding_window is not applied: llama.cpp disables Phi-3's window, and so do we.
        end = gguf_meta.token_id(reader, "<|end|>")
        if end is not None:
            eos = tuple(dict.fromkeys(eos + (end,)))
    return ModelConfig(
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(field(f"{p}.feed_forward_length")),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=int(field(f"{p}.attention.head_count_kv", heads)),
        # Qwen3 and Gemma 3 write their head width as key_length (it is not hidden / heads there)
        head_dim=head_dim,
        rope_theta=float(field(f"{p}.rope.freq_base", 10000.0)),
        rope_scaling=None,
        # llama.cpp's converter permutes Llama q/k rows to interleaved rotary pairs; Qwen2 stays NeoX.
        rope_interleaved=arch == "llama",
        rms_norm_eps=float(field(f"{p}.attention.layer_norm_rms_epsilon", 1e-6)),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        max_position_embeddings=int(field(f"{p}.context_length", 4096)),
        bos_token_id=field("tokenizer.ggml.bos_token_id"),
        eos_token_ids=eos,
        rope_freq_factors=factors,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        **extra,
    )


def load_config(source: ModelSource) -> ModelConfig:
    """The config of a resolved model source."""
    if source.format == "hf":
        return config_from_hf(source.path)
    from crucible.core.gguf_meta import open_gguf

    return config_from_gguf(open_gguf(source.path))
