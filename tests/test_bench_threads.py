"""`crucible bench threads` configuration and report, without running a model."""

from __future__ import annotations

import pytest

from benchmarks.thread_tuning import ThreadBenchConfig, format_summary, summarize


def test_config_rejects_empty_runs() -> None:
    with pytest.raises(ValueError, match="steps >= 2"):
        ThreadBenchConfig(steps=1)
    with pytest.raises(ValueError, match="rounds >= 1"):
        ThreadBenchConfig(rounds=0)


def test_report_names_both_configurations_and_the_ratio() -> None:
    def entry(tok_s: float, threads: str) -> dict[str, object]:
        ms = 1e3 / tok_s
        return {"decode_tok_s": tok_s, "step_ms_mean": ms, "step_ms_median": ms, "step_ms_p90": ms,
                "step_ms_p99": ms, "steps": 10, "execute_ms_median": ms - 0.5, "host_ms_median": 0.5,
                "prefill_ms_median": 400.0, "cpu_threads": [threads]}

    text = format_summary(ThreadBenchConfig(), {"untuned": entry(150.0, "off"),
                                                "tuned": entry(180.0, "workers nice 19 (2), helpers idle (1)")})
    assert "untuned" in text and "helpers idle (1)" in text
    assert "execute" in text and "host" in text
    assert "tuned / untuned decode tok/s: 1.20x" in text


def test_summary_splits_each_step_into_execute_and_host() -> None:
    # Steps of 10, 12 and 20 ms, of which the graph executed 9, 10 and 19: host 1, 2 and 1 ms.
    raw = {"step_s": [0.010, 0.012, 0.020], "execute_s": [0.009, 0.010, 0.019], "prefill_s": [0.4],
           "cpu_threads": ["off"]}
    s = summarize({"untuned": raw})["untuned"]
    assert s["step_ms_median"] == pytest.approx(12.0)
    assert s["execute_ms_median"] == pytest.approx(10.0)
    assert s["host_ms_median"] == pytest.approx(1.0)  # the median of the per-step differences
    assert s["decode_tok_s"] == pytest.approx(1e3 / 14.0)


def test_summary_rejects_unmatched_execute_times() -> None:
    raw = {"step_s": [0.010, 0.012], "execute_s": [0.009], "prefill_s": [0.4], "cpu_threads": ["off"]}
    with pytest.raises(ValueError, match="1 execute times for 2 steps"):
        summarize({"tuned": raw})
