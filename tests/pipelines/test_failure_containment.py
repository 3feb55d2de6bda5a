"""A failure belongs to its request: an exception injected at each stage of one request's life ends
that request alone (finish_reason "error", its KV pages released), while the requests beside it finish
with the same tokens as when they run alone, and the engine goes on serving."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from graphs.generate import greedy_generate
from pipelines import engine as engine_mod
from pipelines.generator import Generator
from pipelines.sampling import SamplingParams

MARK = "\x00injected-failure"  # a stop string that marks the request whose stage fails
OTHERS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
TARGET = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop=(MARK,))


class Injected(RuntimeError):
    """The failure the test plants."""


def _is_target(engine, ctx) -> bool:
    return any(live.seq is ctx and MARK in live.detok._stop for live in engine._live.values())


def _plant(stage: str, engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes `stage` raise for the marked request only (after its first few steps where it can)."""
    calls = {"n": 0}

    def third_time() -> bool:
        calls["n"] += 1
        return calls["n"] >= 3

    if stage == "admission":
        real = engine_mod.Sampler

        def sampler(params, index=0):
            if MARK in params.stop:
                raise Injected("admission")
            return real(params, index)

        monkeypatch.setattr(engine_mod, "Sampler", sampler)
    elif stage in ("alloc", "kv_step"):
        name = "alloc" if stage == "alloc" else "step"
        real_kv = getattr(engine.runner.kv, name)

        def kv_call(ctx, *a, **k):
            if _is_target(engine, ctx) and third_time():
                raise Injected(stage)
            return real_kv(ctx, *a, **k)

        monkeypatch.setattr(engine.runner.kv, name, kv_call)
    elif stage == "execute":
        real_run = engine._run

        def run(plan):
            if any(MARK in e.request.params.stop for e in plan) and third_time():
                raise Injected("execute")
            return real_run(plan)

        monkeypatch.setattr(engine, "_run", run)
    elif stage == "sample":
        real_sample = engine_mod.Sampler.sample

        def sample(self, logits):
            if MARK in self.params.stop and third_time():
                raise Injected("sample")
            return real_sample(self, logits)

        monkeypatch.setattr(engine_mod.Sampler, "sample", sample)
    elif stage == "detokenize":
        real_add = engine_mod.IncrementalDetokenizer.add

        def add(self, token_id):
            if MARK in self._stop and third_time():
                raise Injected("detokenize")
            return real_add(self, token_id)

        monkeypatch.setattr(engine_mod.IncrementalDetokenizer, "add", add)
    else:
        raise AssertionError(stage)


@pytest.mark.parametrize("stage", ["admission", "alloc", "execute", "sample", "detokenize", "kv_step"])
def test_a_failing_request_fails_alone(stage: str, make_engine, tiny_model, monkeypatch) -> None:
    engine = make_engine(max_batch_size=4, max_step_tokens=64)
    rng = np.random.default_rng(7)
    # A long prompt (prefilled in chunks of 64) and short ones, the marked one in the middle.
    prompts = [[1] + [int(t) for t in rng.integers(3, 397, n - 1)] for n in (150, 9, 40, 5)]
    _plant(stage, engine, monkeypatch)
    gen = Generator(engine=engine)
    # A plain greedy step takes its token on the device, without the host sampler: to fail in
    # sampling, the target asks for logprobs, so its steps read the logits.
    target = replace(TARGET, logprobs=1) if stage == "sample" else TARGET
    results = gen.generate_ids(prompts, [OTHERS, OTHERS, target, OTHERS])
    target = results[2]
    assert target.finish_reason == "error" and stage in target.error
    for i in (0, 1, 3):
        assert results[i].finish_reason == "length", results[i].error
        assert results[i].token_ids == greedy_generate(tiny_model, [prompts[i]], 10)[0]
    assert engine.kv_pages_in_use() == 0 and engine.scheduler.reserved_pages == 0
    assert not engine.scheduler.running and not engine._live
    monkeypatch.undo()  # the stage works again: the same engine serves the marked request now
    again = gen.generate_ids([prompts[2]], [TARGET])[0]
    assert again.finish_reason == "length" and again.token_ids == greedy_generate(tiny_model, [prompts[2]], 10)[0]
    assert engine.kv_pages_in_use() == 0


def test_a_batch_that_fails_to_execute_is_retried_one_by_one(make_engine, tiny_model, monkeypatch) -> None:
    """Control for the isolation: when every request's execution fails, every request ends in error."""
    engine = make_engine(max_batch_size=4)
    monkeypatch.setattr(engine, "_run", lambda plan: (_ for _ in ()).throw(Injected("execute")))
    results = Generator(engine=engine).generate_ids([[1, 5, 6], [1, 7]], [OTHERS, OTHERS])
    assert [r.finish_reason for r in results] == ["error", "error"]
    assert engine.kv_pages_in_use() == 0 and not engine._live


def test_negative_seeds_are_fixed_seeds(make_engine) -> None:
    engine = make_engine(max_batch_size=4)
    gen = Generator(engine=engine)
    p = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=-1)
    a, b = gen.generate_ids([[1, 5, 6, 7]] * 2, [p, p])
    assert a.finish_reason == "length" and a.token_ids == b.token_ids
    with pytest.raises(ValueError, match="64-bit"):
        SamplingParams(seed=-(2**63) - 1)
    with pytest.raises(ValueError, match="64-bit"):
        SamplingParams(seed=2**63)
    SamplingParams(seed=-(2**63))
    SamplingParams(seed=2**63 - 1)
