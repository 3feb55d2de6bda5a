"""Full-sequence logits of our graphs against transformers, for the tiny models in their weight forms
(every form on the tiny Llama; ARCH_FORMS says why).

Bounds: both sides compute in fp32 on the same (for GGUF: the same dequantized) weights, so the only
differences are summation order and transcendental implementations, a relative effect of a few fp32
ulps per op: max |logit difference| <= 1e-4 + 2e-6 * max|logit| (tiny Llama logits reach ~10,
measured 3e-6; the tied tiny Qwen2's reach ~150, measured 1.2e-4; the tiny Qwen3's, with per-head q/k
norms and 128-wide heads on a 192-wide model, measured 6e-5 against a bound of 4e-4; the tiny Gemma 3's
reach ~140 over an 85-token prompt that five of its six layers see through a 16-token window, measured
5e-5 against 3.7e-4, where ignoring the window gives 8.5 and one rope base for all layers 3.8) and
identical top-1 everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphs.generate import full_logits, greedy_generate, incremental_logits
from tests.conftest import FORMS

PROMPT = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
# Every weight form on the tiny Llama. The weight form is read by the architecture-independent loader
# into the same projection ops, while the architecture shapes the graph around them, so the other
# architectures take the float HF form, the two block formats the greedy and prefill/decode tests
# need anyway (Q4_1, Q8_0) and one more each: 19 graphs where the full cross is 28.
ARCH_FORMS = {"llama": FORMS, "qwen2": ("hf", "Q4_0", "Q8_0", "Q4_1"), "qwen3": ("hf", "F16", "Q8_0", "Q4_1"),
              "gemma3": ("hf", "hf_bf16", "Q8_0", "Q4_1")}


def _bound(reference_logits: np.ndarray) -> float:
    return 1e-4 + 2e-6 * float(np.abs(reference_logits).max())


@pytest.mark.parametrize("arch,form", [(a, f) for a in ARCHS for f in ARCH_FORMS[a]])
def test_logits_match_transformers(tiny_crucible, tiny_reference, arch: str, form: str) -> None:
    model, ref = tiny_crucible(arch, form), tiny_reference(arch, form)
    ids = ref.chat_prompt_ids(PROMPT)
    ids = ids + ids[1:]  # longer than the tiny Gemma 3's 16-token window
    ours, theirs = full_logits(model, ids), ref.logits(ids)
    assert ours.shape == theirs.shape == (len(ids), model.config.vocab_size)
    assert np.abs(ours - theirs).max() <= _bound(theirs)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert model.provenance["hot_path_fallbacks"] == []


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(tiny_crucible, tiny_reference, arch: str) -> None:
    model, ref = tiny_crucible(arch, "Q4_1"), tiny_reference(arch, "Q4_1")
    ids = ref.chat_prompt_ids(PROMPT)
    steps: list[float] = []
    executes: list[float] = []
    ours = greedy_generate(model, [ids], 24, step_times=steps, execute_times=executes)[0]
    assert ours == ref.greedy(ids, 24).token_ids[: len(ours)]
    # One execution time per step, each inside its step (the benchmarks subtract them).
    assert len(executes) == len(steps) == len(ours)
    assert all(0 < e <= s for e, s in zip(executes[1:], np.diff(steps)))


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_then_decode_equals_one_prefill(tiny_crucible, tiny_reference, arch: str) -> None:
    model, ref = tiny_crucible(arch, "Q8_0"), tiny_reference(arch, "Q8_0")
    ids = ref.chat_prompt_ids(PROMPT)
    ids = ids + ids[1:30]  # long enough that decode continues well past the prefill
    n = len(ids) // 2
    step_by_step = incremental_logits(model, ids, n)  # rows predict tokens n .. len
    one_shot = full_logits(model, ids)[n - 1:]
    # Same weights and kernels, different summation order (attention tiles of a prefill vs split keys
    # of a decode step): a few fp32 ulps relative to the logits' scale.
    np.testing.assert_allclose(step_by_step, one_shot, rtol=0, atol=1e-5 + 1e-6 * np.abs(one_shot).max())


def test_chunked_prefill_and_page_crossing(tiny_crucible, tiny_reference) -> None:
    """A 300-token prompt (three 128-token pages) prefilled in chunks of 100, 128 and 72."""
    model, ref = tiny_crucible("llama", "hf"), tiny_reference("llama", "hf")
    rng = np.random.default_rng(5)
    ids = [1] + [int(t) for t in rng.integers(3, model.config.vocab_size, 299)]
    chunked = greedy_generate(model, [ids], 6, prefill_chunks=[100, 128, 72])[0]
    assert chunked == greedy_generate(model, [ids], 6)[0] == ref.greedy(ids, 6).token_ids


def test_batched_sequences_equal_each_alone(tiny_crucible) -> None:
    model = tiny_crucible("qwen2", "Q4_0")
    rng = np.random.default_rng(6)
    prompts = [[1] + [int(t) for t in rng.integers(3, 400, n)] for n in (3, 50, 129, 7)]
    together = greedy_generate(model, prompts, 10)
    alone = [greedy_generate(model, [p], 10)[0] for p in prompts]
    assert together == alone
