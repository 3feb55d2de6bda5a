"""Continuous-batching decisions (no model needed)."""

from __future__ import annotations

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
    plan = s.schedule()
    assert [(e.request, e.tokens, e.samples) for e in plan] == [(long, 64, False)]
    long.prefilled = 64
    plan = s.schedule()
    assert [(e.request, e.tokens, e.samples) for e in plan] == [(long, 36, True), (short, 10, True)]
    long.prefilled, short.prefilled = 100, 10
    plan = s.schedule()
    assert [(e.request, e.tokens) for e in plan] == [(long, 1), (short, 1)]


def test_requests_wait_for_pages_and_get_them_when_others_finish() -> None:
    s = Scheduler(_config(total_pages=3, max_step_tokens=256))
    a, b, c = _req(100, 100), _req(100, 100), _req(10, 10)  # a, b need 2 pages each; c needs 1
    for r in (a, b, c):
        s.add(r)
    s.schedule()
    assert s.running == [a] and list(s.waiting) == [b, c]  # FCFS: c waits behind b
    assert s.reserved_pages == 2
    s.finish(a)
    assert a.state is RequestState.FINISHED and s.reserved_pages == 0
    s.schedule()
    assert s.running == [b, c] and s.reserved_pages == 3


def test_batch_size_limit_and_too_long_requests() -> None:
    s = Scheduler(_config(max_batch_size=2, total_pages=100))
    reqs = [_req(5) for _ in range(3)]
    for r in reqs:
        s.add(r)
    s.schedule()
    assert len(s.running) == 2 and len(s.waiting) == 1
    with pytest.raises(ValueError, match="more than one sequence may hold"):
        s.add(_req(1020, 8))
