"""Whole decoder graphs compile for the GPUs we serve on, in virtual device mode (no GPU needed).

Built exactly as `crucible serve --devices gpu` builds them (CrucibleModel on the accelerator): the tiny
Llama in float32 and from bf16 safetensors in bfloat16 (its untied head), the tiny Qwen2 from bf16
safetensors and the tiny Gemma 3 (sliding windows, q/k norms) in bfloat16, and SmolLM2's GGUF in bfloat16 (its blocks stay blocks, read by qmatmul with bf16
activations). sm_90a is the H100/H200 target, sm_80 the A100 (with `--all-targets`). Numerics are checked on a GPU by the
device check; here the graphs and every kernel in them must code-generate for each architecture.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.background import BackgroundJobs


def _specs(tiny_models: dict) -> list[tuple[str, str]]:
    """(model, dtype) of each decoder, in the order the report lists them."""
    return [(str(tiny_models["llama"].hf), "float32"), (str(tiny_models["qwen2"].hf_bf16), "bfloat16"),
            (str(tiny_models["gemma3"].hf), "bfloat16"), ("smollm2-135m", "bfloat16"),
            (str(tiny_models["llama"].hf_bf16), "bfloat16")]


def background_command(request: pytest.FixtureRequest, arch: str) -> list[str]:
    """The compile of one architecture, started with the session (tests/support/background.py)."""
    specs = _specs(request.getfixturevalue("tiny_models"))
    return [sys.executable, "-m", "crucible.conformance.gpu_model_compile", "--api", "cuda", "--arch", arch,
            *(f"{m}:{d}" for m, d in specs)]


@pytest.mark.gpu_compile
@pytest.mark.parametrize("arch", ["sm_90a", pytest.param("sm_80", marks=pytest.mark.extra_target)])
def test_decoders_compile_for_the_gpu(background_jobs: BackgroundJobs, request: pytest.FixtureRequest,
                                      tiny_models, arch: str) -> None:
    specs = _specs(tiny_models)
    proc = background_jobs.run(request, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(m["model"], m["dtype"]) for m in report["models"]] == specs
    for m, (_, dtype) in zip(report["models"], specs):
        assert m["hot_path_fallbacks"] == [], m
        assert m["kv_cache_dtype"] == f"DType.{dtype}", m
        ops = m["ops"]
        assert ops.get("crucible:crucible.attention_paged", 0) > 0 and ops.get("crucible:crucible.embedding") == 1
    llama, qwen2, gemma3, smollm2, llama_bf16 = (m["ops"] for m in report["models"])
    # HF float weights go through crucible.matmul (bf16 tensors in the bf16 graphs); the one qmatmul
    # of a bf16 HF graph is the tied head reading bf16 bytes with float32 activations (float32 logits).
    assert qwen2["crucible:crucible.qmatmul"] == 1 and qwen2["crucible:crucible.matmul"] > 0
    assert "crucible:crucible.qmatmul" not in llama
    assert "crucible:crucible.matmul" not in smollm2 and smollm2["crucible:crucible.qmatmul"] > 0
    # Over GGUF blocks the gate|up projection, its activation and down are one crucible.mlp per layer.
    assert smollm2["crucible:crucible.mlp"] == 30 and "crucible:crucible.silu_mul" not in smollm2
    # The untied bf16 head is its own weight, bound as bytes for the float32-logits qmatmul.
    assert llama_bf16["crucible:crucible.qmatmul"] == 1 and llama_bf16["crucible:crucible.matmul"] == 8
