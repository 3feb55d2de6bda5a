"""What a model file holds, from its headers: the same model as GGUF and as an HF folder has the same
parameter count; tensor types are counted as stored, also types Crucible cannot run yet, which
`crucible models PATH` lists (status 0) while loading them fails in one line that names the type."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.cli import main
from crucible.core.registry import resolve_model
from graphs.inventory import inventory
from tests.support.tiny_models import TINY_LLAMA, write_gguf


def test_gguf_and_hf_forms_of_one_model_agree(tiny_models) -> None:
    files = tiny_models["llama"]
    gguf = inventory(resolve_model(str(files.gguf["Q4_0"])))
    hf = inventory(resolve_model(str(files.hf)))
    bf16 = inventory(resolve_model(str(files.hf_bf16)))
    assert gguf.architecture == "llama" and hf.architecture == "LlamaForCausalLM"
    assert gguf.parameters == hf.parameters == bf16.parameters > 0
    assert hf.tensor_types == {"F32": sum(gguf.tensor_types.values())}
    assert bf16.weight_bytes * 2 == hf.weight_bytes  # 2 bytes an element against 4
    # Q4_0 stores 18 bytes per 32 elements: the 2-D weights shrink, the norms stay F32
    assert set(gguf.tensor_types) == {"Q4_0", "F32"} and gguf.weight_bytes < hf.weight_bytes / 4


def test_control_a_wrong_count_is_seen(tiny_models) -> None:
    """The parameter count is the sum of the tensors' elements, not a file-size estimate."""
    inv = inventory(resolve_model(str(tiny_models["llama"].gguf["F32"])))
    assert inv.weight_bytes == 4 * inv.parameters
    assert inv.parameters != inventory(resolve_model(str(tiny_models["qwen2"].gguf["F32"]))).parameters


def test_models_lists_a_file_it_cannot_load_and_loading_names_the_type(tmp_path: Path, capsys) -> None:
    path = write_gguf(TINY_LLAMA, tmp_path / "tiny-mxfp4.gguf", "MXFP4")
    assert main(["models", str(path)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{path}: llama,") and "MXFP4" in line and "parameters" in line
    assert main(["generate", "hi", "--model", str(path), "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "MXFP4" in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("n,text", [(0, "0"), (999, "999"), (1500, "1.5K"), (2_500_000, "2.5M"),
                                    (7_000_000_000, "7.0B")])
def test_parameter_counts_read_well(n: int, text: str) -> None:
    from graphs.inventory import _count

    assert _count(n) == text
