"""Compiled Crucible models shared by the graph tests (one compile per model form per session)."""

from __future__ import annotations

import pytest

from crucible.reference import Reference
from graphs.model import CrucibleModel

# Weight forms of the tiny models: the HF folders and every GGUF tensor type.
FORMS = ("hf", "hf_bf16", "F32", "F16", "Q8_0", "Q4_0", "Q4_1")


def _path(files, form: str):
    if form == "hf":
        return files.hf
    if form == "hf_bf16":
        return files.hf_bf16
    return files.gguf[form]


@pytest.fixture(scope="session")
def tiny_crucible(tiny_models):
    """(arch, form) -> CrucibleModel, compiled on first use."""
    cache: dict[tuple[str, str], CrucibleModel] = {}

    def get(arch: str, form: str) -> CrucibleModel:
        if (arch, form) not in cache:
            cache[(arch, form)] = CrucibleModel(str(_path(tiny_models[arch], form)))
        return cache[(arch, form)]

    return get


@pytest.fixture(scope="session")
def tiny_reference(tiny_models):
    cache: dict[tuple[str, str], Reference] = {}

    def get(arch: str, form: str) -> Reference:
        if (arch, form) not in cache:
            cache[(arch, form)] = Reference(_path(tiny_models[arch], form))
        return cache[(arch, form)]

    return get


@pytest.fixture(scope="session")
def smollm2_model() -> CrucibleModel:
    return CrucibleModel("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_ref() -> Reference:
    return Reference("smollm2-135m")
