"""Continuous-batching decisions and preemption (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.request import Request, RequestState
from pipelines.sampling import SamplingParams
from pipelines.scheduler import Scheduler, SchedulerConfig


def _req(prompt_len: int, max_tokens: int = 8) -> Request:
    return Request(list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens))


def _config(**kw) -> SchedulerConfig:
    base = dict(max_batch_size=4, max_step_tokens=64, total_pages=4, page_size=128, max_seq_len=1024)
    base.update(kw)
    return SchedulerConfig(**base)


def test_decode_first_then_chunked_prefill_within_the_token_budget() -> None:
    s = Scheduler(_config())
    long, short = _req(100), _req(10)
    s.add(long)
    s.add(short)
    plan = s.schedule().entries
    assert [(e.request, e.tokens, e.samples) for e in plan] == [(long, 64, False)]
    long.prefilled = 64
    plan = s.schedule().entries
    assert [(e.request, e.tokens, e.samples) for e in plan] == [(long, 36, True), (short, 10, True)]
    long.prefilled, short.prefilled = 100, 10
    plan = s.schedule().entries
    assert [(e.request, e.tokens) for e in plan] == [(long, 1), (short, 1)]


def test_requests_wait_for_the_pages_of_their_prompt() -> None:
    s = Scheduler(_config(total_pages=3, max_step_tokens=1024))
    a, b, c = _req(200, 100), _req(200, 100), _req(10, 10)  # a, b: 2 pages of prompt; c: 1
    for r in (a, b, c):
        s.add(r)
    s.schedule()
    assert s.running == [a] and list(s.waiting) == [b, c]  # FCFS: c waits behind b
    assert s.reserved_pages == 2
    s.finish(a)
    assert a.state is RequestState.FINISHED and s.reserved_pages == 0
    s.schedule()
    assert s.running == [b, c] and s.reserved_pages == 3


def _decode(s: Scheduler, token: int = 7) -> list:
    """One step as the engine commits it: every entry advances, those that sample get a token. Checks
    first that each entry's pages hold what MAX's alloc takes for it: its pending token, or the whole
    prefill (alloc comes before chunking)."""
    schedule = s.schedule()
    c = s.config
    assert s.reserved_pages <= c.total_pages
    for e in schedule.entries:
        r = e.request
        written = r.prefill_length if r.in_prefill else r.context_length
        assert s.held[r.request_id] >= c.pages_for(written)
    for e in schedule.entries:
        e.request.prefilled += e.tokens if e.request.in_prefill else 0
        if e.samples:
            e.request.output_ids.append(token)
    return schedule.preempted


def test_pages_are_taken_as_sequences_grow_and_the_newest_is_preempted() -> None:
    # Page 4 tokens, 4 pages: three 3-token prompts fit at once although each may grow to 11 tokens.
    s = Scheduler(_config(page_size=4, total_pages=4, max_seq_len=16))
    a, b, c = _req(3, 8), _req(3, 8), _req(3, 8)
    for r in (a, b, c):
        s.add(r)
    assert _decode(s) == [] and s.running == [a, b, c] and s.reserved_pages == 3  # prompts + first tokens
    # Context 4 still fits one page each; at 5 tokens a and b take a second page and c must go.
    assert _decode(s) == []
    assert _decode(s) == [c]
    assert s.running == [a, b] and list(s.waiting) == [c] and s.reserved_pages == 4
    assert c.state is RequestState.WAITING and c.prefilled == 0 and c.recomputed == 2 and c.preemptions == 1
    assert c.in_prefill and c.prefill_ids == c.prompt_ids + c.output_ids and c.prefill_length == 5
    while a.state is RequestState.RUNNING and len(a.output_ids) < 8:  # b grows past 8 tokens: a keeps its place
        preempted = _decode(s)
        if preempted:
            break
    assert preempted == [b] and s.running == [a] and list(s.waiting) == [b, c]  # older first at the head
    s.finish(a)
    plan = s.schedule().entries
    assert [(e.request, e.tokens, e.samples) for e in plan] == [(b, b.prefill_length, True)]
    assert s.held[b.request_id] == s.config.pages_for(b.prefill_length)


def test_the_newest_request_preempts_itself_rather_than_an_older_one() -> None:
    s = Scheduler(_config(page_size=4, total_pages=3, max_seq_len=12))
    old, new = _req(5, 3), _req(2, 8)
    s.add(old)
    s.add(new)
    assert [_decode(s) for _ in range(3)] == [[], [], []]  # old: 8 tokens in 2 pages; new: 5 tokens
    assert _decode(s) == [new]  # new's fifth token needs a second page; only new itself can give way
    assert s.running == [old] and s.reserved_pages == 2 and new.recomputed == 3


@pytest.mark.parametrize("seed", range(6))
def test_random_load_always_finishes_within_the_cache(seed: int) -> None:
    # A simulated engine: random prompts and lengths through a small cache. Every request must end with
    # its full output, pages counted never pass the cache, and each running sequence holds what it uses.
    rng = np.random.default_rng(seed)
    c = _config(max_batch_size=6, max_step_tokens=24, total_pages=12, page_size=8, max_seq_len=96)
    s = Scheduler(c)
    reqs = [_req(int(rng.integers(1, 40)), int(rng.integers(1, 50))) for _ in range(40)]
    pending = list(reqs)
    for step in range(5000):
        while pending and rng.random() < 0.3:
            s.add(pending.pop(0))
        if not (pending or s.has_work):
            break
        _decode(s, token=step)
        for r in list(s.running):
            if len(r.output_ids) >= r.params.max_tokens:
                s.finish(r)
    assert not s.has_work and s.reserved_pages == 0
    assert all(len(r.output_ids) == r.params.max_tokens for r in reqs)
    assert s.preemptions > 0  # the load is heavy enough that the test exercises preemption


def test_batch_size_limit_and_too_long_requests() -> None:
    s = Scheduler(_config(max_batch_size=2, total_pages=100))
    reqs = [_req(5) for _ in range(3)]
    for r in reqs:
        s.add(r)
    s.schedule()
    assert len(s.running) == 2 and len(s.waiting) == 1
    with pytest.raises(ValueError, match="more than one sequence may hold"):
        s.add(_req(1020, 8))


def test_control_without_growth_accounting_the_page_check_fails(monkeypatch) -> None:
    # The check in _decode must catch a scheduler that lets sequences grow past their pages.
    monkeypatch.setattr(Scheduler, "_grow", lambda self: [])
    s = Scheduler(_config(page_size=4, total_pages=4, max_seq_len=16))
    for _ in range(3):
        s.add(_req(3, 8))
    with pytest.raises(AssertionError):
        for _ in range(4):
            _decode(s)


def test_an_echo_request_that_fills_the_cache_exactly_is_admitted() -> None:
    # max_tokens 0 (echo's prompt logprobs): prompt 16 = 2 pages of 8, the whole cache; no first token.
    s = Scheduler(_config(page_size=8, total_pages=2, max_seq_len=64))
    echo = Request(list(range(1, 17)), SamplingParams(max_tokens=0, prompt_logprobs=0))
    assert s.fits_ever(echo)
    s.add(echo)
    assert [(e.request, e.tokens) for e in s.schedule().entries] == [(echo, 16)]
