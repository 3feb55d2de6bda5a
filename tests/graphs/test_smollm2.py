"""SmolLM2-135M-Instruct from its Q4_1 GGUF on our kernels, against transformers on the same weights.

Bound: logits reach ~40 in magnitude; fp32 on both sides over 30 layers leaves <= 1e-3 absolute
difference (measured: ~9e-5) and the same top-1 at every position.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphs.generate import full_logits, greedy_generate

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
    assert prov["ops"]["crucible:crucible.qmatmul"] == 30 * 4 + 1  # 4 projections per layer + lm_head
    assert prov["ops"]["crucible:crucible.attention_paged"] == 30
    file_bytes = smollm2_model.source.size_bytes
    # Quantized tensors stay in their blocks: the loaded weights are no larger than the file.
    assert smollm2_model.weights.nbytes <= 1.05 * file_bytes
    assert smollm2_model.weights.layers[0].qkv.qtype == "q4_1"
    assert smollm2_model.weights.embedding.qtype == "q8_0"
