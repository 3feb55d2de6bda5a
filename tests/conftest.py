"""Session-wide fixtures: the tiny test models (generated once) and the SmolLM2 reference."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from crucible.testing.tiny_models import (
    GGUF_WEIGHT_TYPES,
    TINY_LLAMA,
    TINY_QWEN2,
    TinyModelSpec,
    write_gguf,
    write_hf,
)


@dataclass(frozen=True)
class TinyModelFiles:
    """Every on-disk form of one tiny model."""

    spec: TinyModelSpec
    hf: Path
    hf_bf16: Path
    gguf: dict[str, Path]  # weight type -> file


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModelFiles]:
    """The tiny Llama and Qwen2 models as HF folders (fp32, bf16) and GGUF files of every weight type."""
    root = tmp_path_factory.mktemp("tiny-models")
    out = {}
    for spec in (TINY_LLAMA, TINY_QWEN2):
        out[spec.arch] = TinyModelFiles(
            spec=spec,
            hf=write_hf(spec, root / spec.name),
            hf_bf16=write_hf(spec, root / f"{spec.name}-bf16", dtype="bfloat16"),
            gguf={t: write_gguf(spec, root / f"{spec.name}-{t}.gguf", t) for t in GGUF_WEIGHT_TYPES},
        )
    return out
