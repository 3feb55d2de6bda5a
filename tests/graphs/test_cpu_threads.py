"""Finding MAX's runtime threads from /proc counters (graphs/cpu_threads.py), without compiling a graph."""

from __future__ import annotations

import sys
import threading

import pytest

from graphs.cpu_threads import CpuThreadTuner, ThreadSample, find_helpers, sample_threads

WORKER = "\U0001f525 Thread0"


def _pair(wakes: int, cpu_ns: int, name: str = "python") -> tuple[ThreadSample, ThreadSample]:
    return ThreadSample(name, 1_000, 10), ThreadSample(name, 1_000 + cpu_ns, 10 + wakes)


def test_helper_is_the_thread_that_wakes_often_and_briefly() -> None:
    samples = {
        101: _pair(wakes=50, cpu_ns=50 * 15_000),              # the helper: 15 us per wake
        102: _pair(wakes=50, cpu_ns=50 * 400_000),             # a busy pool thread doing real work
        103: _pair(wakes=3, cpu_ns=3 * 10_000),                # a quiet poller
        104: _pair(wakes=5_000, cpu_ns=1_000, name=WORKER),    # workers are never helpers
        105: _pair(wakes=50, cpu_ns=50 * 15_000),              # a Python thread
    }
    before = {tid: pair[0] for tid, pair in samples.items()}
    after = {tid: pair[1] for tid, pair in samples.items()}
    assert find_helpers(before, after, elapsed_ms=6.0, python_tids={105}) == [101]
    # The wake threshold scales with the execution: 50 wakes in 100 ms is a quiet thread.
    assert find_helpers(before, after, elapsed_ms=100.0, python_tids={105}) == []


def test_helper_born_during_the_execution_counts_from_zero() -> None:
    after = {201: ThreadSample("python", 40 * 10_000, 40)}
    assert find_helpers({}, after, elapsed_ms=6.0, python_tids=set()) == [201]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sample_threads_sees_this_thread() -> None:
    samples = sample_threads()
    me = samples[threading.get_native_id()]
    assert me.cpu_ns > 0 and me.wakes >= 0 and me.name


def test_disabled_tuner_only_runs() -> None:
    tuner = CpuThreadTuner(enabled=False)
    assert tuner.execute(lambda: 42) == 42
    assert tuner.status == "off"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_short_executions_are_not_probes() -> None:
    tuner = CpuThreadTuner(enabled=True)
    assert tuner.execute(lambda: "done") == "done"  # far under a millisecond: nothing to learn from
    assert tuner.status == "pending"
