"""SmolLM2-135M-Instruct from its Q4_1 GGUF on our kernels, against transformers on the same weights.

Bound: logits reach ~40 in magnitude; fp32 on both sides over 30 layers leaves <= 1e-3 absolute
difference (measured: ~9e-5) and the same top-1 at every position.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from graphs.generate import full_logits, greedy_generate, incremental_logits
from graphs.model import CrucibleModel, ModelOptions

QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.",
             "How many legs does a spider have?")


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm2_model, smollm2_ref) -> None:
    ids = smollm2_ref.chat_prompt_ids([{"role": "user", "content": QUESTIONS[0]}])
    ours, theirs = full_logits(smollm2_model, ids), smollm2_ref.logits(ids)
    assert np.abs(ours - theirs).max() <= 1e-3
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


@pytest.mark.slow
@pytest.mark.parametrize("question", QUESTIONS)
def test_smollm2_greedy_32_tokens_identical(smollm2_model, smollm2_ref, question: str) -> None:
    ids = smollm2_ref.chat_prompt_ids([{"role": "user", "content": question}])
    ours = greedy_generate(smollm2_model, [ids], 32, stop_ids=smollm2_model.config.eos_token_ids)[0]
    theirs = smollm2_ref.greedy(ids, 32).token_ids
    assert ours == theirs
    if question == QUESTIONS[0]:
        assert "Paris" in smollm2_ref.tokenizer.decode(ours, skip_special_tokens=True)


@pytest.mark.slow
def test_smollm2_every_hot_op_is_ours_and_weights_stay_quantized(smollm2_model) -> None:
    prov = smollm2_model.provenance
    assert prov["hot_path_fallbacks"] == []
    assert prov["ops"]["crucible:crucible.qmatmul"] == 30 * 2 + 1  # qkv, o per layer + lm_head
    assert prov["ops"]["crucible:crucible.mlp"] == 30  # gate|up, silu_mul and down per layer
    assert "crucible:crucible.silu_mul" not in prov["ops"] and "crucible:crucible.qmatmul2" not in prov["ops"]
    assert prov["ops"]["crucible:crucible.attention_paged"] == 30
    file_bytes = smollm2_model.source.size_bytes
    # Quantized tensors stay in their blocks: the loaded weights are no larger than the file.
    assert smollm2_model.weights.nbytes <= 1.05 * file_bytes
    assert [lin.qtype for lin in smollm2_model.weights.layers[0].qkv] == ["q4_1"]  # q|k|v fused
    assert smollm2_model.weights.embedding.qtype == "q8_0"


@pytest.mark.slow
def test_smollm2_steps_reprioritize_max_threads(smollm2_model, smollm2_ref) -> None:
    """After a prefill the model has found MAX's runtime workers and its execution helper (graphs/cpu_threads)."""
    ids = smollm2_ref.chat_prompt_ids([{"role": "user", "content": QUESTIONS[1]}])
    greedy_generate(smollm2_model, [ids], 4)
    status = smollm2_model.provenance["cpu_threads"]
    assert re.fullmatch(r"workers nice 19 \([1-9]\d*\), helpers idle \([1-9]\d*\)", status), status


@pytest.mark.slow
def test_smollm2_int8_activations_stay_close_to_transformers(smollm2_ref) -> None:
    """activations="q8" (int8 x in the decode matmuls, llama.cpp's CPU scheme) on decode steps.

    Not float-exact by design: measured max |diff| 2.5-2.6 logits (mean 0.25-0.37) and top-1 agreement
    95-100% on the decode rows of these prompts; llama.cpp itself answers QUESTIONS[0] with the same
    non-answer as this mode does ("L'Etoile, la Marseillaise, ..."), where float activations say Paris.
    The bound (4 logits, 90% top-1) catches a broken variant: a wrong scale or offset moves logits by
    tens and scrambles the argmax.
    """
    model = CrucibleModel("smollm2-135m", ModelOptions(activations="q8"))
    assert model.provenance["activations"] == "q8"
    for question in QUESTIONS:
        ids = smollm2_ref.chat_prompt_ids([{"role": "user", "content": question}])
        n0 = len(ids) // 2
        ours = incremental_logits(model, ids, n0)  # decode steps: M = 1, the int8 path
        theirs = smollm2_ref.logits(ids)[n0 - 1:]
        assert np.abs(ours - theirs).max() <= 4.0
        assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.9


def test_int8_activations_are_a_cpu_variant() -> None:
    with pytest.raises(ValueError, match="CPU kernel variant"):
        ModelOptions(device="gpu", activations="q8")
    with pytest.raises(ValueError, match="f32 or q8"):
        ModelOptions(activations="int4")
