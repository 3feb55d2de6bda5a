"""benchmarks/qmatmul2_ab.py: its configuration, and a short run whose fused and unfused graphs agree."""

from __future__ import annotations

import pytest

from benchmarks.qmatmul2_ab import PatternConfig, main


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="pattern"):
        PatternConfig(pattern="attention")
    with pytest.raises(ValueError, match="act"):
        PatternConfig(act="q4")
    with pytest.raises(ValueError, match=">= 1"):
        PatternConfig(layers=0)


@pytest.mark.parametrize("pattern", ["mlp", "mlp_op"])
def test_short_run_times_both_graphs(capsys: pytest.CaptureFixture[str], pattern: str) -> None:
    # run() raises unless the fused graph's output is the unfused one's, bit for bit; two graphs of
    # one layer each keep the compile short.
    assert main(["--pattern", pattern, "--qtype", "q8_0", "--act", "q8", "--layers", "1", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "outputs equal" in out and "fused / unfused" in out
    assert len(out.split("unfused ms:")[1].splitlines()[0].split()) == 2  # one median per round
