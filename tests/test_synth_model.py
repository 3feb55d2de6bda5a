"""The synthetic Llama folder of the GPU serving sweep (benchmarks/synth_model.py), at a tiny shape on
the CPU: transformers and Crucible load it as written, every id decodes, and the serving comparison
runs on it (crucible only here; `max serve` joins on the GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.synth_model import SHAPES, write_synthetic


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("synth") / "tiny", SHAPES["tiny"], "bfloat16")


def test_transformers_reads_the_folder_and_every_id_decodes(synth: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shape = SHAPES["tiny"]
    model = AutoModelForCausalLM.from_pretrained(synth)
    assert model.config.vocab_size == shape.vocab_size and model.lm_head.weight.dtype == torch.bfloat16
    w = model.model.layers[0].mlp.down_proj.weight.float()
    assert 0.01 < float(w.std()) < 0.04 and abs(float(w.mean())) < 1e-3
    tok = AutoTokenizer.from_pretrained(synth)
    assert len(tok) == shape.vocab_size
    from crucible.core.tokenizer import chat_prompt_ids

    ids = chat_prompt_ids(tok, [{"role": "user", "content": "Hello there"}])
    assert max(ids) < 400 and tok.decode([shape.vocab_size - 1]) == f"<t{shape.vocab_size - 1}>"


def test_crucible_loads_it_and_the_sweep_runs(synth: Path, tmp_path: Path) -> None:
    from benchmarks.serve_compare import ServeCompareConfig, run_compare
    from crucible.core.registry import resolve_model

    cfg = ServeCompareConfig(model=str(synth), systems=("crucible",), levels=(1, 2), max_requests=2,
                             max_seconds=30, max_tokens=8, reps=1)
    results, info = run_compare(cfg, resolve_model(str(synth)), tmp_path, log=lambda m: None)
    assert "failed" not in info["crucible"], info
    assert [r.concurrency for r in results["crucible"]] == [1, 2]
    assert all(r.errors == 0 and r.output_tok_per_s > 0 for r in results["crucible"])
    assert "device=cpu" in info["crucible"]["kernels"]


def test_gpu_sweeps_only_compare_with_max() -> None:
    from benchmarks.serve_compare import ServeCompareConfig

    with pytest.raises(ValueError, match="crucible and max"):
        ServeCompareConfig(systems=("crucible", "llama.cpp"), device="gpu")
    assert json.loads(json.dumps(SHAPES["llama3-8b"].tensors()[-1])) == ["lm_head.weight", [128256, 4096]]
    n = sum(int(np.prod(s)) for _, s in SHAPES["llama3-8b"].tensors())
    assert 8.0e9 < n < 8.1e9  # Llama-3-8B's 8.03 B parameters
