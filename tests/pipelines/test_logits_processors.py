"""logit_bias and the penalties: the batched pass equals a per-row reference written from the
definitions (OpenAI's presence/frequency, vLLM's repetition), rows without them are untouched, and a
control that applies the penalties to prompt tokens too must differ. Then, in the engine, a frequency
penalty changes greedy text and min_p keeps only the likely tokens."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.logits_processors import apply_penalties
from pipelines.sampling import Sampler, SamplingParams

VOCAB = 97  # odd on purpose


def _reference(logits: np.ndarray, p: SamplingParams, prompt: list[int], output: list[int],
               count_prompt: bool = False) -> np.ndarray:
    """One row, written from the definitions (bias, then repetition, then frequency and presence)."""
    z = logits.astype(np.float64).copy()
    for t, b in p.logit_bias:
        z[t] += b
    seen = set(prompt) | set(output)
    for t in seen:
        if p.repetition_penalty != 1:
            z[t] = z[t] / p.repetition_penalty if z[t] > 0 else z[t] * p.repetition_penalty
    counted = output + (prompt if count_prompt else [])
    for t in set(counted):
        z[t] -= counted.count(t) * p.frequency_penalty + p.presence_penalty
    return z


def _case(rng: np.random.Generator, n: int):
    logits = rng.standard_normal((n, VOCAB)).astype(np.float32) * 3
    params, prompts, outputs = [], [], []
    for i in range(n):
        kind = i % 4
        params.append(SamplingParams(
            presence_penalty=float(rng.uniform(-2, 2)) if kind in (1, 3) else 0.0,
            frequency_penalty=float(rng.uniform(-2, 2)) if kind in (1, 3) else 0.0,
            repetition_penalty=float(rng.uniform(0.5, 2)) if kind in (2, 3) else 1.0,
            logit_bias={int(t): float(rng.uniform(-100, 100)) for t in rng.integers(0, VOCAB, 3)} if kind == 3 else {}))
        prompts.append(rng.integers(0, VOCAB, int(rng.integers(1, 40))).tolist())
        outputs.append(rng.integers(0, VOCAB, int(rng.integers(0, 30))).tolist())  # 0: nothing generated yet
    return logits, params, prompts, outputs


@pytest.mark.parametrize("n,seed", [(1, 0), (3, 1), (16, 2), (33, 3)])
def test_batched_penalties_equal_the_per_row_reference(n: int, seed: int) -> None:
    logits, params, prompts, outputs = _case(np.random.default_rng(seed), n)
    got = apply_penalties(logits, params, prompts, outputs)
    for i in range(n):
        # float32 arithmetic on values up to ~100 + a few logits: 1e-4 absolute covers its rounding
        np.testing.assert_allclose(got[i], _reference(logits[i], params[i], prompts[i], outputs[i]), atol=1e-4)
        if not params[i].penalized:
            assert np.array_equal(got[i], logits[i])
    assert np.array_equal(apply_penalties(logits[:1], [SamplingParams()], prompts[:1], outputs[:1]), logits[:1])


def test_control_counting_prompt_tokens_for_frequency_must_differ() -> None:
    """OpenAI's frequency and presence penalties count generated tokens only; a reference that also
    counts the prompt is wrong and the comparison must see it."""
    logits, params, prompts, outputs = _case(np.random.default_rng(7), 8)
    got = apply_penalties(logits, params, prompts, outputs)
    wrong = np.stack([_reference(logits[i], params[i], prompts[i], outputs[i], count_prompt=True) for i in range(8)])
    assert not np.allclose(got, wrong, atol=1e-4)


def test_min_p_keeps_only_tokens_near_the_best() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    sampler = Sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=0))
    drawn = {sampler.sample(logits) for _ in range(300)}
    assert drawn == {0, 1}  # 0.15 < 0.5 * 0.5


def test_a_frequency_penalty_changes_greedy_text(make_engine) -> None:
    from pipelines.generator import Generator

    gen = Generator(engine=make_engine(max_batch_size=4))
    plain, penalized = gen.generate_ids([[5, 6, 7, 8]] * 2, [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=2.0)])
    assert plain.token_ids != penalized.token_ids
    # the penalty pushes repeats down: the penalized text repeats no more than the free one
    assert len(set(penalized.token_ids)) >= len(set(plain.token_ids))


def test_logit_bias_forces_a_token(make_engine) -> None:
    from pipelines.generator import Generator

    gen = Generator(engine=make_engine(max_batch_size=4))
    [res] = gen.generate_ids([[5, 6, 7]], [SamplingParams(temperature=0.8, seed=1, max_tokens=6, ignore_eos=True,
                                                          logit_bias={"42": 100})])
    assert res.token_ids == [42] * 6
    with pytest.raises(ValueError, match="vocabulary"):
        gen.engine.submit([5, 6], SamplingParams(logit_bias={10_000: 1.0}))
