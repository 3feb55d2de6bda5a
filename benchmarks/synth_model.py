"""A Llama-shaped Hugging Face folder of random weights, for serving benchmarks where real weights
cannot be carried (the GPU machine takes 64 MiB a call; Llama-3-8B's bf16 weights are 16 GB).

    python -m benchmarks.synth_model OUT_DIR --shape llama3-8b --dtype bfloat16

Speed depends on the shapes and dtype, not on the values, so random weights time the same as real ones
(greedy text is noise; requests set ignore_eos / max_tokens). The folder is what `max serve` and
`crucible serve` both load: config.json (LlamaForCausalLM), model.safetensors written tensor by tensor
(memory stays at one tensor), and a byte-level BPE tokenizer whose vocabulary is padded with inert
tokens to the model's size, so every id the model emits decodes.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crucible.core.bf16 import bf16_bits


@dataclass(frozen=True)
class SynthShape:
    """A Llama decoder's shape."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float = 500000.0
    max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: heads must divide hidden_size and kv heads must divide heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every weight, in file order."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        out = [("model.embed_tokens.weight", (self.vocab_size, h))]
        for layer in range(self.num_layers):
            p = f"model.layers.{layer}."
            out += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (self.num_heads * d, h)),
                    (p + "self_attn.k_proj.weight", (self.num_kv_heads * d, h)),
                    (p + "self_attn.v_proj.weight", (self.num_kv_heads * d, h)),
                    (p + "self_attn.o_proj.weight", (h, self.num_heads * d)),
                    (p + "post_attention_layernorm.weight", (h,)), (p + "mlp.gate_proj.weight", (i, h)),
                    (p + "mlp.up_proj.weight", (i, h)), (p + "mlp.down_proj.weight", (h, i))]
        return out + [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab_size, h))]


SHAPES = {s.name: s for s in (
    SynthShape("llama3-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
               num_heads=32, num_kv_heads=8),
    SynthShape("tiny", vocab_size=1000, hidden_size=256, intermediate_size=352, num_layers=2, num_heads=4,
               num_kv_heads=2, max_position_embeddings=2048),  # head_dim 64, as our attention requires
)}


def _tokenizer(vocab_size: int):
    from tests.support.tiny_tokenizer import TinyTokenizerSpec, build_tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    base = build_tokenizer(TinyTokenizerSpec(400))
    model = json.loads(base.to_str())["model"]
    vocab = dict(model["vocab"])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    # Inert tokens up to the model's vocabulary: no merge produces them, and they decode to their text.
    n = len(vocab)
    for k in range(n, vocab_size):
        vocab[f"<t{k}>"] = k
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return tok


def _random_bf16_bits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random bf16 weights built from integer bits (8B of them in seconds, not minutes): a random sign,
    a magnitude in [2^-8, 2^-4) (4 binades), a random mantissa. Mean 0, std about 0.02."""
    r = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    return (r & 0x807F) | ((119 + ((r >> 7) & 0x3)) << 7).astype(np.uint16)


def write_synthetic(folder: Path, shape: SynthShape, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Writes the folder (config, safetensors, tokenizer); returns it.

    Args:
        folder: Destination (created).
        shape: The decoder's shape.
        dtype: "bfloat16" or "float32" storage.
        seed: numpy seed of the weights.
    """
    from tests.support.tiny_tokenizer import BOS_TOKEN, CHAT_TEMPLATE, EOS_TOKEN, SPECIAL_TOKENS

    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be bfloat16 or float32, got {dtype!r}")
    folder.mkdir(parents=True, exist_ok=True)
    width = 2 if dtype == "bfloat16" else 4
    header, offset = {}, 0
    for name, shp in shape.tensors():
        nbytes = int(np.prod(shp)) * width
        header[name] = {"dtype": "BF16" if width == 2 else "F32", "shape": list(shp), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    rng = np.random.default_rng(seed)
    tmp = folder / "model.safetensors.tmp"
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, shp in shape.tensors():
            if len(shp) == 1:
                w = np.ones(shp, np.float32)  # norms
                f.write((bf16_bits(w) if width == 2 else w).tobytes())
            elif width == 2:
                f.write(_random_bf16_bits(rng, shp).tobytes())
            else:
                f.write((rng.standard_normal(shp, dtype=np.float32) * np.float32(0.02)).tobytes())
    tmp.replace(folder / "model.safetensors")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads, "head_dim": shape.head_dim, "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings, "rms_norm_eps": 1e-5,
        "rope_theta": shape.rope_theta, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": SPECIAL_TOKENS.index(BOS_TOKEN), "eos_token_id": SPECIAL_TOKENS.index(EOS_TOKEN),
        "torch_dtype": dtype,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}))
    _tokenizer(shape.vocab_size).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN, "unk_token": None, "add_bos_token": False, "chat_template": CHAT_TEMPLATE,
        "model_max_length": shape.max_position_embeddings}, indent=1))
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    folder = write_synthetic(args.out, SHAPES[args.shape], args.dtype, args.seed)
    size = (folder / "model.safetensors").stat().st_size
    print(f"{args.shape} ({args.dtype}, {size / 2**30:.2f} GiB of weights) -> {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
