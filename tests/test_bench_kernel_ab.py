"""benchmarks/kernel_ab.py configuration, statistics and report, without running a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.kernel_ab import ABConfig, format_ab, summarize_rounds

DIRS = (Path("/tmp/old/kernels"), Path("kernels"))


def test_config_rejects_bad_runs() -> None:
    with pytest.raises(ValueError, match="two kernel folders"):
        ABConfig(kernels=(Path("kernels"),))
    with pytest.raises(ValueError, match="steps >= 2"):
        ABConfig(kernels=DIRS, steps=1)
    with pytest.raises(ValueError, match="rounds >= 1"):
        ABConfig(kernels=DIRS, rounds=0)


def test_rounds_score_by_their_median_step() -> None:
    # Round 1: A's median 10 ms, B's 8 ms (B's outlier step does not count); round 2: A 9, B 9.5.
    a = [[0.010, 0.011, 0.009], [0.009, 0.009, 0.020]]
    b = [[0.008, 0.050, 0.007], [0.0095, 0.0095, 0.009]]
    s = summarize_rounds(a, b)
    assert s.a_ms == pytest.approx((10.0, 9.0))
    assert s.b_ms == pytest.approx((8.0, 9.5))
    assert s.b_wins == 1
    assert s.ratio == pytest.approx(8.75 / 9.5)


def test_rounds_must_pair() -> None:
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        summarize_rounds([[0.01]], [])
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        summarize_rounds([], [])


def test_report_names_both_builds_and_the_ratio() -> None:
    cfg = ABConfig(kernels=DIRS, context=300, rounds=2)
    text = format_ab(cfg, ("aaaa", "bbbb"), summarize_rounds([[0.010], [0.010]], [[0.009], [0.008]]))
    assert "300-token prompt" in text
    assert "A /tmp/old/kernels (kernel build aaaa): median 10.00 ms" in text
    assert "B kernels (kernel build bbbb): median 8.50 ms" in text
    assert "B / A step time: 0.850; B faster in 2 of 2 rounds" in text
