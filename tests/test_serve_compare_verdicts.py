"""serve_compare's verdicts (benchmarks/serve_compare.py): a baseline that failed is never a MET."""

from __future__ import annotations

from benchmarks.serve_compare import check_serve_targets, format_compare
from benchmarks.serve_load import LoadResult


def _result(level: int, tok_s: float, ttft: float | None, errors: int = 0) -> LoadResult:
    return LoadResult(level, 32, errors, 10.0, int(tok_s * 10), tok_s, 3.2, ttft, ttft, 0.01, 0.02)


def test_a_baseline_with_errors_is_failed_not_met() -> None:
    results = {"crucible": [_result(1, 120.0, 0.05), _result(16, 360.0, 0.4)],
               "llama.cpp": [_result(1, 0.0, None, errors=32), _result(16, 200.0, 0.5)]}
    targets = {t["target"]: t for t in check_serve_targets(results)}
    broken = targets["1 streams vs llama.cpp: output tok/s"]
    assert broken["met"] is None and "llama.cpp had 32 failed requests" in broken["failed"]
    assert targets["16 streams vs llama.cpp: output tok/s >= 1.0x"]["met"] is True
    assert targets["16 streams vs llama.cpp: p99 TTFT ratio <= 1.0"]["met"] is True
    text = format_compare(results, list(targets.values()))
    assert "FAILED   1 streams vs llama.cpp: output tok/s: llama.cpp had 32 failed requests" in text
    assert not any(line.startswith("MET") and "1 streams vs llama.cpp" in line for line in text.splitlines())


def test_control_a_slower_crucible_is_not_met() -> None:
    results = {"crucible": [_result(1, 100.0, 0.05)], "llama.cpp": [_result(1, 150.0, 0.04)]}
    targets = {t["target"]: t for t in check_serve_targets(results)}
    assert targets["1 streams vs llama.cpp: output tok/s >= 1.0x"]["met"] is False
    assert targets["1 streams vs llama.cpp: p99 TTFT ratio <= 1.0"]["met"] is False
