"""The continuous-batching engine on a compiled tiny model: batching invariance, a small KV cache,
aborts and limits."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.generate import greedy_generate
from pipelines.generator import Generator
from pipelines.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _prompts(rng: np.random.Generator, lengths) -> list[list[int]]:
    return [[1] + [int(t) for t in rng.integers(3, 397, n - 1)] for n in lengths]


def test_eight_prompts_together_equal_each_alone(make_engine, tiny_model) -> None:
    gen = Generator(engine=make_engine(max_batch_size=8))
    prompts = _prompts(np.random.default_rng(0), (5, 40, 3, 130, 17, 64, 1, 90))
    together = gen.generate_ids(prompts, [GREEDY] * 8)
    for p, r in zip(prompts, together):
        assert r.finish_reason == "length" and r.completion_tokens == 12
        assert r.token_ids == greedy_generate(tiny_model, [p], 12)[0]
    assert gen.engine.kv_pages_in_use() == 0


def test_greedy_steps_copy_ids_and_a_logprobs_request_gets_logits(make_engine, monkeypatch) -> None:
    # A step whose rows are all plain greedy takes its tokens on the device (only [B] ids come back);
    # one row that reads its logits (logprobs) makes the whole step return logits, with the same tokens.
    engine = make_engine(max_batch_size=4)
    asked: list[bool] = []
    execute = engine.runner.execute

    def spy(seqs, all_positions=False, tokens_only=False):
        asked.append(tokens_only)
        return execute(seqs, all_positions=all_positions, tokens_only=tokens_only)

    monkeypatch.setattr(engine.runner, "execute", spy)
    gen = Generator(engine=engine)
    prompts = _prompts(np.random.default_rng(3), (7, 30))
    plain = gen.generate_ids(prompts, [GREEDY] * 2)
    assert asked and all(asked)
    asked.clear()
    mixed = gen.generate_ids(prompts, [GREEDY, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)])
    assert asked and not any(asked)
    assert [r.token_ids for r in mixed] == [r.token_ids for r in plain]
    assert len(mixed[1].logprobs) == 12


def test_fifty_requests_through_a_deliberately_small_cache(make_engine, tiny_model) -> None:
    # 6 pages of 128 tokens: at most a few requests fit at once; the rest must wait, none may fail.
    from graphs.runner import kv_page_bytes

    page_bytes = kv_page_bytes(tiny_model)
    assert page_bytes == 2 * 2 * 128 * 1 * 64 * 4  # K and V, 2 layers, 128 tokens, 1 KV head of 64, float32
    engine = make_engine(max_batch_size=8, max_step_tokens=96, kv_cache_gib=6 * page_bytes / 2**30)
    assert engine.kv_pages_total() >= 6
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 300, 50)
    prompts = _prompts(rng, lengths)
    params = [SamplingParams(temperature=0, max_tokens=int(m), ignore_eos=True) for m in rng.integers(1, 20, 50)]
    results = Generator(engine=engine).generate_ids(prompts, params)
    assert all(r.finish_reason == "length" for r in results)
    assert [r.completion_tokens for r in results] == [p.max_tokens for p in params]
    for p, prm, r in list(zip(prompts, params, results))[::7]:  # spot-check correctness against solo runs
        assert r.token_ids == greedy_generate(tiny_model, [p], prm.max_tokens)[0]
    assert engine.kv_pages_in_use() == 0
    assert engine.scheduler.reserved_pages == 0


def test_abort_frees_pages_at_the_next_step(make_engine) -> None:
    engine = make_engine(max_batch_size=4)
    req = engine.submit([1, 5, 6, 7], SamplingParams(temperature=0, max_tokens=500, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.kv_pages_in_use() > 0
    engine.abort(req.request_id)
    outs = engine.step()
    assert any(o.request_id == req.request_id and o.finish_reason == "abort" for o in outs)
    assert engine.kv_pages_in_use() == 0 and not engine.has_work


def test_limits_are_clear_errors(make_engine) -> None:
    engine = make_engine(max_seq_len=64)
    with pytest.raises(ValueError, match="exceeds the context limit of 64"):
        engine.submit([1] * 60, SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="empty"):
        engine.submit([], SamplingParams())
    with pytest.raises(ValueError, match="vocabulary"):
        engine.submit([1, 100000], SamplingParams())
    assert not engine.has_work


def test_seeded_sampling_repeats_and_stop_strings_cut(make_engine, tiny_tokenizer) -> None:
    gen = Generator(engine=make_engine())
    p = SamplingParams(temperature=0.9, top_p=0.9, seed=42, max_tokens=16, ignore_eos=True)
    a, b = gen.generate(["Tell me about Paris."] * 2, p)
    assert a.token_ids == b.token_ids and a.text == b.text
    full = gen.generate(["Tell me about Paris."], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    stop_at = full.text[len(full.text) // 2:][:3]
    if stop_at.strip():
        cut = gen.generate(["Tell me about Paris."], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                                     stop=(stop_at,)))[0]
        assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop_at)]


def test_every_step_is_reproducible_while_another_thread_is_busy(make_engine, tiny_model, monkeypatch) -> None:
    # Regression: MAX stages the KV cache lengths and page table by an asynchronous copy, and on CPU
    # the graph did not wait for it. With a busy second thread (the server's event loop) about one
    # decode step in 500 read the previous step's values and wrote the new token's K/V to the wrong
    # slot. Executing each step twice exposes it: the second run must give the same logits, bit for bit.
    import json
    import threading

    runs, mismatches = [], []
    execute = tiny_model.execute

    def twice(tokens, row_offsets, logit_rows, kv, tokens_only=False):
        # Logits both times (a greedy step asks for ids only): the comparison stays bit for bit.
        first = np.array(execute(tokens, row_offsets, logit_rows, kv))
        second = execute(tokens, row_offsets, logit_rows, kv)
        runs.append(len(tokens))
        if not np.array_equal(first, second):
            mismatches.append((len(tokens), float(np.abs(first - second).max())))
        return second.argmax(-1) if tokens_only else second

    monkeypatch.setattr(tiny_model, "execute", twice)
    stop = threading.Event()

    def busy() -> None:  # allocates and formats, as a server's event loop does
        while not stop.is_set():
            arrays = [np.random.rand(1000) for _ in range(50)]
            json.dumps([a[:10].tolist() for a in arrays])

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        gen = Generator(engine=make_engine(max_batch_size=4))
        rng = np.random.default_rng(7)
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        for _ in range(16):  # one request at a time: ~400 batch-1 decode steps, the pattern that failed
            gen.generate_ids(_prompts(rng, [int(rng.integers(20, 60))]), [params])
    finally:
        stop.set()
        thread.join()
    assert len(runs) > 300 and not mismatches, f"{len(mismatches)} of {len(runs)} steps differed: {mismatches[:5]}"


def _spied_engine(make_engine, tiny_model, monkeypatch, **settings):
    """An engine of 4 KV pages (128 tokens each) that records (prompt length, tokens prefilled, outputs)
    of each request it preempts."""
    from graphs.runner import kv_page_bytes

    engine = make_engine(max_batch_size=4, kv_cache_gib=4 * kv_page_bytes(tiny_model) / 2**30, **settings)
    assert engine.kv_pages_total() == 4
    seen: list[tuple[int, int, int]] = []
    preempt = engine.scheduler._preempt

    def spy(req) -> None:
        seen.append((len(req.prompt_ids), req.prefilled, len(req.output_ids)))
        preempt(req)

    monkeypatch.setattr(engine.scheduler, "_preempt", spy)
    return engine, seen


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preempted_requests_recompute_and_give_the_same_tokens(make_engine, tiny_model, monkeypatch,
                                                               prefix_caching) -> None:
    # Six ~110-token prompts are admitted on one page each and need a second page past 128 tokens, so
    # the newest give their pages back mid-output and are recomputed later, to the same greedy tokens.
    # With 8-token steps, a request with prompt logprobs is preempted halfway through its prompt and
    # must start over, its logprobs whole.
    rng = np.random.default_rng(11)
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    many = _prompts(rng, rng.integers(100, 120, 6))
    engine, seen = _spied_engine(make_engine, tiny_model, monkeypatch, prefix_caching=prefix_caching)
    results = Generator(engine=engine).generate_ids(many, [greedy] * 6)
    assert any(out > 0 for _, _, out in seen)
    assert engine.kv_pages_in_use() == 0 and engine.scheduler.reserved_pages == 0 and not engine._live

    first = _prompts(rng, (100, 370))
    echo = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=1)
    long_params = [SamplingParams(temperature=0, max_tokens=60, ignore_eos=True), echo]
    engine, seen = _spied_engine(make_engine, tiny_model, monkeypatch, prefix_caching=prefix_caching,
                                 max_step_tokens=8)
    results += Generator(engine=engine).generate_ids(first, long_params)
    assert any(n == 370 and 0 < done < 370 and out == 0 for n, done, out in seen)
    assert engine.kv_pages_in_use() == 0 and engine.scheduler.reserved_pages == 0 and not engine._live

    alone = Generator(engine=make_engine(max_batch_size=4))
    expected = alone.generate_ids(many, [greedy] * 6) + alone.generate_ids(first, long_params)
    for r, e in zip(results, expected):
        assert r.finish_reason == "length" and r.token_ids == e.token_ids
    got, want = results[-1].prompt_logprobs, expected[-1].prompt_logprobs
    assert len(got) == len(want) == 370 and got[0] is None
    assert all(g.token_id == w.token_id and abs(g.logprob - w.logprob) < 1e-4 for g, w in zip(got[1:], want[1:]))
