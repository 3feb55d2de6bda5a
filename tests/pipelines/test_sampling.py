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
