"""Prefix caching (MAX's paged-KV prefix cache, whole 128-token pages): a prompt seen before is not
computed again, the output is the same as without the cache, n sequences share their prompt's pages,
and no page stays held after a long run of mixed requests with shared prefixes, aborts and errors.
Time to first token is a benchmark (benchmarks/prefix_cache.py), not a timed test."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.generate import greedy_generate
from pipelines.generator import Generator
from pipelines.sampling import SamplingParams
from tests.support.openai_fixtures import reference_logprobs

PAGE = 128
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 390, n).tolist()


def test_a_repeated_prompt_reuses_its_pages_and_gives_the_same_tokens(make_engine, tiny_model) -> None:
    engine = make_engine(max_batch_size=4, max_step_tokens=256)
    gen = Generator(engine=engine)
    prompt = _prompt(700)
    first = gen.generate_ids([prompt], [GREEDY])[0]
    computed = engine.stats.prompt_tokens
    second = gen.generate_ids([prompt], [GREEDY])[0]
    reused = (700 - 1) // PAGE * PAGE  # full pages; the last token is always computed
    assert engine.scheduler.cached_tokens == reused
    assert engine.stats.prompt_tokens - computed == 700 - reused
    assert first.token_ids == second.token_ids == greedy_generate(tiny_model, [prompt], 6)[0]
    longer = gen.generate_ids([prompt + _prompt(50, 1)], [GREEDY])[0]  # a shared prefix, a new tail
    assert engine.scheduler.cached_tokens == 2 * reused
    assert longer.token_ids == greedy_generate(tiny_model, [prompt + _prompt(50, 1)], 6)[0]
    assert engine.kv_pages_in_use() == 0


def test_control_no_prefix_caching_computes_everything(make_engine) -> None:
    engine = make_engine(max_batch_size=4, prefix_caching=False)
    gen = Generator(engine=engine)
    prompt = _prompt(300)
    gen.generate_ids([prompt, prompt], [GREEDY, GREEDY])
    gen.generate_ids([prompt], [GREEDY])
    assert engine.scheduler.cached_tokens == 0 and engine.stats.prompt_tokens == 900


def test_n_sequences_share_the_prompt_pages(make_engine) -> None:
    engine = make_engine(max_batch_size=8)
    gen = Generator(engine=engine)
    prompt = _prompt(400)
    results = gen.create(kind="completion", prompt=prompt, n=4, max_tokens=5, temperature=0.9, seed=11,
                         ignore_eos=True)
    assert len(results) == 4
    assert engine.scheduler.cached_tokens == 3 * (399 // PAGE * PAGE)  # every sibling after the first
    assert engine.stats.prompt_tokens == 400 + 3 * (400 - 399 // PAGE * PAGE)
    again = gen.create(kind="completion", prompt=prompt, n=4, max_tokens=5, temperature=0.9, seed=11,
                       ignore_eos=True)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]  # sequence i draws with seed + i
    assert len({tuple(r.token_ids) for r in results}) > 1
    assert engine.kv_pages_in_use() == 0


def test_no_page_is_left_after_mixed_requests_with_aborts_and_errors(make_engine, monkeypatch) -> None:
    import pipelines.engine as engine_mod

    engine = make_engine(max_batch_size=8, max_step_tokens=192, kv_cache_gib=0.02)
    rng = np.random.default_rng(5)
    shared = [_prompt(260, s) for s in range(3)]
    real = engine_mod.Sampler.sample

    def flaky(self, logits):  # every request with seed 13 fails when it draws its second token
        if self.params.seed == 13 and self.params.stop == ("never-matches",):
            raise RuntimeError("planted sampling bug")
        return real(self, logits)

    monkeypatch.setattr(engine_mod.Sampler, "sample", flaky)
    submitted, finished = [], {}
    for i in range(200):
        prompt = shared[i % 3] + _prompt(int(rng.integers(1, 90)), 100 + i)
        params = SamplingParams(temperature=0.7, seed=13 if i % 17 == 0 else i, max_tokens=int(rng.integers(1, 12)),
                                stop=("never-matches",), n=2 if i % 11 == 0 else 1)
        submitted += engine.submit_n(prompt, params)
        if i % 7 == 0:
            engine.abort(submitted[-1].request_id)
        if i % 5 == 4:
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out.finish_reason
    while engine.has_work:
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.finish_reason
    assert len(finished) == len(submitted)
    reasons = set(finished.values())
    assert {"abort", "error", "length"} <= reasons
    assert engine.scheduler.cached_tokens > 0
    assert engine.kv_pages_in_use() == 0 and engine.scheduler.reserved_pages == 0 and not engine._live


@pytest.mark.parametrize("chunk", [512, 48])
def test_echo_logprobs_are_the_model_logprobs_of_the_prompt(make_engine, tiny_model, chunk: int) -> None:
    """Prompt logprobs (echo) equal log-softmax of one full prefill's logits, also when the prompt is
    prefilled in chunks and when its prefix is in the cache (those prompts are computed in full)."""
    engine = make_engine(max_batch_size=4, max_step_tokens=chunk)
    gen = Generator(engine=engine)
    prompt = _prompt(300, 9)
    gen.generate_ids([prompt], [GREEDY])  # the prefix is now in the cache
    [r] = gen.create(kind="completion", prompt=prompt, max_tokens=0, echo=True, logprobs=2)
    assert r.finish_reason == "length" and r.token_ids == []
    logp = reference_logprobs(tiny_model, prompt)
    assert r.prompt_logprobs[0] is None and len(r.prompt_logprobs) == len(prompt)
    got = np.array([e.logprob for e in r.prompt_logprobs[1:]])
    want = logp[np.arange(len(prompt) - 1), prompt[1:]]
    np.testing.assert_allclose(got, want, atol=1e-4)  # the same kernels; only chunk boundaries differ
    assert all(len(e.top) == 2 for e in r.prompt_logprobs[1:])
    assert engine.kv_pages_in_use() == 0
