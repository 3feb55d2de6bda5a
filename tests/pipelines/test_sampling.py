"""Sampling parameters and the sampler (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.sampling import Sampler, SamplingError, SamplingParams, stop_ids_for

LOGITS = np.array([0.1, 3.0, 2.9, -1.0, 0.5, 2.0], dtype=np.float32)


def test_greedy_and_top_k_one_pick_the_argmax() -> None:
    assert Sampler(SamplingParams(temperature=0)).sample(LOGITS) == 1
    assert Sampler(SamplingParams(temperature=1.5, top_k=1, seed=3)).sample(LOGITS) == 1


def test_same_seed_same_draws_and_different_seeds_differ() -> None:
    draws = lambda seed: [Sampler(SamplingParams(temperature=1.0, seed=seed)).sample(LOGITS)  # noqa: E731
                          for _ in range(1)]
    a = Sampler(SamplingParams(temperature=1.0, seed=11))
    b = Sampler(SamplingParams(temperature=1.0, seed=11))
    seq_a = [a.sample(LOGITS) for _ in range(50)]
    assert seq_a == [b.sample(LOGITS) for _ in range(50)]
    c = Sampler(SamplingParams(temperature=1.0, seed=12))
    assert seq_a != [c.sample(LOGITS) for _ in range(50)]
    assert draws(1) == draws(1)


def test_top_k_and_top_p_restrict_the_support() -> None:
    s = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=0))
    assert {s.sample(LOGITS) for _ in range(300)} == {1, 2}
    # exp-probabilities: tokens 1 and 2 hold ~0.68 together; top_p 0.5 keeps {1, 2} (1 alone is < 0.5).
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.5, seed=0))
    assert {s.sample(LOGITS) for _ in range(300)} <= {1, 2}


@pytest.mark.parametrize("field,value", [("temperature", -0.1), ("temperature", 2.5), ("top_p", 0.0),
                                          ("top_k", -1), ("max_tokens", 0), ("stop", ("",))])
def test_invalid_parameters_name_themselves(field: str, value: object) -> None:
    with pytest.raises(SamplingError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field


def test_stop_ids_include_the_model_end_token_unless_ignored() -> None:
    assert stop_ids_for(SamplingParams(stop_token_ids=(7,)), (2,)) == {2, 7}
    assert stop_ids_for(SamplingParams(ignore_eos=True), (2,)) == frozenset()


def _reference_sample(p: SamplingParams, rng: np.random.Generator, logits: np.ndarray) -> int:
    """The sampler as first written: every filter over the whole vocabulary, a full stable sort for top_p,
    and numpy's own choice(); the fast path must draw the same token from the same generator state."""
    z = logits.astype(np.float64) / p.temperature
    if p.top_k:
        k = min(p.top_k, z.size)
        z = np.where(z >= np.partition(z, -k)[-k], z, -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        keep = order[: int(np.searchsorted(np.cumsum(probs[order]), p.top_p) + 1)]
        mask = np.zeros_like(probs, dtype=bool)
        mask[keep] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    if p.min_p > 0.0:
        probs = np.where(probs >= p.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return int(rng.choice(probs.size, p=probs))


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.7), dict(top_p=0.9), dict(top_p=0.5, temperature=1.3),
                                dict(top_k=40), dict(top_k=40, top_p=0.95), dict(min_p=0.05),
                                dict(top_p=0.95, min_p=0.1), dict(top_p=0.999999)])
def test_fast_sampler_draws_what_the_full_sort_draws(kw: dict) -> None:
    """Vocabulary 49152 (SmolLM2's): peaked and flat logits, ties, and masked (-inf) tokens; 60 draws each,
    one generator per side with the same seed."""
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal(49152).astype(np.float32) * scale for scale in (0.5, 3.0, 12.0)]
    tied = np.round(rng.standard_normal(49152) * 2).astype(np.float32)  # many exact ties
    masked = rows[1].copy()
    masked[rng.random(49152) < 0.9] = -np.inf                           # a grammar's mask
    p = SamplingParams(seed=9, **kw)
    fast, ref = Sampler(p), np.random.default_rng(9)
    for logits in rows + [tied, masked]:
        for _ in range(12):
            assert fast.sample(logits) == _reference_sample(p, ref, logits)


def test_control_a_different_generator_state_draws_differently() -> None:
    """The equality above is not vacuous: one draw apart, the two sides disagree."""
    logits = np.random.default_rng(5).standard_normal(49152).astype(np.float32) * 3
    p = SamplingParams(seed=9, top_p=0.9)
    fast, ref = Sampler(p), np.random.default_rng(9)
    ref.random()
    assert [fast.sample(logits) for _ in range(20)] != [_reference_sample(p, ref, logits) for _ in range(20)]


def test_nucleus_cuts_where_the_sorted_running_sum_reaches_top_p() -> None:
    from pipelines.sampling import nucleus

    probs = np.array([0.1, 0.3, 0.05, 0.3, 0.25])
    assert nucleus(probs, 0.5).tolist() == [1, 3]             # ties by id: 1 then 3 (0.6 >= 0.5)
    assert nucleus(probs, 0.3).tolist() == [1]
    assert nucleus(probs, 0.86).tolist() == [0, 1, 3, 4]
    assert nucleus(np.array([0.0, 1.0, 0.0]), 0.9).tolist() == [1]


@pytest.mark.parametrize("kw", [dict(), dict(top_k=3), dict(top_p=0.5), dict(min_p=0.1)])
def test_logits_no_token_can_come_from_are_a_clear_error(kw: dict) -> None:
    """All masked, NaN or +inf: an error naming why, never token 0 or an index error."""
    s = Sampler(SamplingParams(seed=1, **kw))
    with pytest.raises(ValueError, match="every logit is -inf"):
        s.sample(np.full(10, -np.inf, dtype=np.float32))
    for bad, what in ((np.nan, "NaN"), (np.inf, r"\+inf")):
        logits = LOGITS.copy()
        logits[3] = bad
        with pytest.raises(ValueError, match=what):
            s.sample(logits)


def test_extreme_but_valid_parameters_draw_a_token_not_nan() -> None:
    """temperature 5e-324 and repetition_penalty 1e-40 passed validation and then gave NaN probabilities
    (a 500): a temperature under GREEDY_BELOW is greedy, and an extreme penalty saturates."""
    from pipelines.logits_processors import apply_penalties

    assert Sampler(SamplingParams(temperature=5e-324, seed=1)).sample(LOGITS) == 1
    p = SamplingParams(repetition_penalty=1e-40, seed=1)
    out = apply_penalties(LOGITS[None, :], [p], [[2]], [[4]])[0]   # token 2 in the prompt, 4 generated
    assert np.isfinite(out).all() and out[2] == out[4] == np.finfo(np.float32).max
    assert Sampler(p).sample(out) in (2, 4)
