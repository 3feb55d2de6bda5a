"""`crucible bench threads` configuration and report, without running a model."""

from __future__ import annotations

import pytest

from benchmarks.thread_tuning import ThreadBenchConfig, format_summary


def test_config_rejects_empty_runs() -> None:
    with pytest.raises(ValueError, match="steps >= 2"):
        ThreadBenchConfig(steps=1)
    with pytest.raises(ValueError, match="rounds >= 1"):
        ThreadBenchConfig(rounds=0)


def test_report_names_both_configurations_and_the_ratio() -> None:
    def entry(tok_s: float, threads: str) -> dict[str, object]:
        ms = 1e3 / tok_s
        return {"decode_tok_s": tok_s, "step_ms_mean": ms, "step_ms_median": ms, "step_ms_p90": ms,
                "step_ms_p99": ms, "steps": 10, "prefill_ms_median": 400.0, "cpu_threads": [threads]}

    text = format_summary(ThreadBenchConfig(), {"untuned": entry(150.0, "off"),
                                                "tuned": entry(180.0, "workers nice 19 (2), helpers idle (1)")})
    assert "untuned" in text and "helpers idle (1)" in text
    assert "tuned / untuned decode tok/s: 1.20x" in text
