"""Session-wide fixtures: the tiny test models (generated once) and the SmolLM2 reference."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crucible.reference import Reference
from graphs.model import CrucibleModel
from tests.support.background import EARLY_JOBS, BackgroundJobs
from tests.support.tiny_models import (
    GGUF_WEIGHT_TYPES,
    TINY_GEMMA3,
    TINY_LLAMA,
    TINY_QWEN2,
    TINY_QWEN3,
    TinyModelSpec,
    write_gguf,
    write_hf,
)


# Compile-only targets beyond those we serve on (sm_90a; the CPUs): sm_80 (A100) and gfx942 (MI300X)
# show the GPU kernels are not tied to Hopper, and apple-m1 is NEON at 4 lanes as neoverse-v2 is. Their
# compiles are long on 2 cores, so they run on request: `make test ARGS=--all-targets`.
ALL_TARGETS_OPTION = "--all-targets"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(ALL_TARGETS_OPTION, action="store_true",
                     help="also compile for targets we do not serve on (sm_80, gfx942, apple-m1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Skipped rather than deselected, so that -ra prints the reason and how to run them.
    if config.getoption(ALL_TARGETS_OPTION):
        return
    skip = pytest.mark.skip(reason=f"a target we do not serve on: run with {ALL_TARGETS_OPTION}")
    for item in items:
        if item.get_closest_marker("extra_target"):
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def background_jobs(request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundJobs]:
    """Starts, with the first test, the jobs of the first EARLY_JOBS selected tests whose module defines
    `background_command` (tests/support/background.py); the others start when their test runs."""
    jobs = BackgroundJobs(tmp_path_factory.mktemp("background"))
    for item in request.session.items:
        if (not hasattr(getattr(item, "module", None), "background_command")
                or item.get_closest_marker("skip") is not None or jobs.started >= EARLY_JOBS):
            continue
        try:
            jobs.start(item, request)
        except Exception:  # noqa: BLE001 - the test starts its job again and reports the error itself
            continue
    yield jobs
    jobs.stop_all()


@dataclass(frozen=True)
class TinyModelFiles:
    """Every on-disk form of one tiny model."""

    spec: TinyModelSpec
    hf: Path
    hf_bf16: Path
    gguf: dict[str, Path]  # weight type -> file


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModelFiles]:
    """The tiny Llama, Qwen2, Qwen3 and Gemma 3 models as HF folders (fp32, bf16) and GGUF files of every weight type."""
    root = tmp_path_factory.mktemp("tiny-models")
    out = {}
    for spec in (TINY_LLAMA, TINY_QWEN2, TINY_QWEN3, TINY_GEMMA3):
        out[spec.arch] = TinyModelFiles(
            spec=spec,
            hf=write_hf(spec, root / spec.name),
            hf_bf16=write_hf(spec, root / f"{spec.name}-bf16", dtype="bfloat16"),
            gguf={t: write_gguf(spec, root / f"{spec.name}-{t}.gguf", t) for t in GGUF_WEIGHT_TYPES},
        )
    return out


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


@pytest.fixture(scope="session")
def tiny_model(tiny_crucible):
    """The tiny Llama as a Q4_0 GGUF, compiled once (the engine, batch and in-process server tests)."""
    return tiny_crucible("llama", "Q4_0")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model):
    from crucible.core.tokenizer import load_tokenizer

    return load_tokenizer(tiny_model.source)


@pytest.fixture
def make_engine(tiny_model, tiny_tokenizer):
    """Builds engines on the shared compiled tiny model with the given EngineConfig settings."""
    from pipelines.engine import EngineConfig, LLMEngine

    def make(**settings) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(tiny_model.source.path), **settings), model=tiny_model,
                         tokenizer=tiny_tokenizer)

    return make
