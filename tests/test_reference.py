"""The transformers reference on the embedded SmolLM2-135M-Instruct."""

from __future__ import annotations

import numpy as np
from crucible.reference import Reference


def test_reference_answers_paris(smollm2_ref: Reference) -> None:
    result = smollm2_ref.greedy_chat(
        [{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=32
    )
    assert "Paris" in result.text, result.text
    assert result.token_ids[-1] in smollm2_ref.eos_token_ids  # stopped at <|im_end|>


def test_reference_logits_are_consistent_with_greedy(smollm2_ref: Reference) -> None:
    ref = smollm2_ref
    prompt = ref.chat_prompt_ids([{"role": "user", "content": "Name a color."}])
    result = ref.greedy(prompt, max_new_tokens=6)
    logits = ref.logits(prompt + result.token_ids[:-1])
    assert logits.shape == (len(prompt) + len(result.token_ids) - 1, 49152)
    # Row t predicts token t+1: the argmax of each row from the last prompt row on is the next greedy id.
    predicted = logits[len(prompt) - 1:].argmax(-1)
    assert list(predicted) == result.token_ids
    assert np.isfinite(logits).all()
