"""benchmarks/qmatmul2_ab.py: its configuration, and a short run whose fused and unfused graphs agree."""

from __future__ import annotations

import pytest

from benchmarks.qmatmul2_ab import PatternConfig, main, run


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="pattern"):
        PatternConfig(pattern="attention")
    with pytest.raises(ValueError, match="act"):
        PatternConfig(act="q4")
    with pytest.raises(ValueError, match=">= 1"):
        PatternConfig(layers=0)


def test_short_run_times_both_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    # run() raises if the fused graph's output is not the unfused one's, bit for bit.
    unfused, fused = run(PatternConfig(pattern="qkv", act="f32", layers=2, rounds=2, reps=2), log=lambda m: None)
    assert len(unfused) == len(fused) == 2 and min(unfused + fused) > 0
    assert main(["--pattern", "mlp", "--qtype", "q8_0", "--act", "q8", "--layers", "2", "--rounds", "1"]) == 0
    assert "fused / unfused" in capsys.readouterr().out
