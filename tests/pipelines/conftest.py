"""An engine on the tiny Llama (Q4_0 GGUF) shared by the pipeline tests."""

from __future__ import annotations

import pytest

from crucible.tokenizer import load_tokenizer
from pipelines.engine import EngineConfig, LLMEngine


@pytest.fixture(scope="session")
def tiny_model(tiny_crucible):
    return tiny_crucible("llama", "Q4_0")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model):
    return load_tokenizer(tiny_model.source)


@pytest.fixture
def make_engine(tiny_model, tiny_tokenizer):
    """Builds engines on the shared compiled tiny model with the given settings."""

    def make(**settings) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(tiny_model.source.path), **settings), model=tiny_model,
                         tokenizer=tiny_tokenizer)

    return make
