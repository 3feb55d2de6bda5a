"""The GPU device check's bookkeeping (benchmarks/device_check.py), with a fake benchmark: no GPU, no graphs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import benchmarks.kernels
from benchmarks import device_check
from benchmarks.kernel_row import Row


class _BenchThatRunsOutOfTime:
    """Adds one row per progress line, then fails the way a call killed at its time limit would lose the rest."""

    def __init__(self, target: str, quick: bool, block_s: float, targets_only: bool = False) -> None:
        self.target = target
        self.targets_only = targets_only
        self.rows: list[Row] = []
        self.extra: dict[str, float] = {"read_bandwidth_gbps": 2374.5}

    def run(self, log) -> list[Row]:
        for n in (1, 2):
            self.rows.append(Row("matmul", "target", {"M": 1, "K": 576, "N": n}, "tiled", "bfloat16", "gpu", 1.0, 1.0))
            log(f"  {n} rows")
        raise TimeoutError("out of time")


@pytest.fixture(autouse=True)
def precompile_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The parallel compiles are recorded, not run (they would spawn MAX processes)."""
    calls: list[tuple] = []

    def fake_bench(target: str, quick: bool, jobs: int, targets_only: bool = False) -> dict:
        calls.append(("bench", target, quick, jobs, targets_only))
        return {"graphs": [], "workers": jobs, "seconds": 0.0}

    monkeypatch.setattr("benchmarks.bench_precompile.precompile_bench", fake_bench)
    monkeypatch.setattr("crucible.conformance.precompile.precompile",
                        lambda h, build_all, jobs: calls.append(("grid", jobs)) or {})
    return calls


def test_bench_rows_survive_a_run_cut_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            precompile_calls: list[tuple]) -> None:
    monkeypatch.setattr(benchmarks.kernels, "KernelBench", _BenchThatRunsOutOfTime)
    monkeypatch.setattr(sys, "argv", ["device_check.py", str(tmp_path), "--bench-only"])
    assert device_check.main(str(tmp_path)) == 1  # the bench step failed and says so
    status = json.loads((tmp_path / "status.json").read_text())
    assert "conformance" not in status and status["bench"]["ok"] is False
    # The graphs were compiled side by side before the rows ran.
    assert [c[:3] for c in precompile_calls] == [("bench", "gpu", True)] and status["bench_precompile"]["ok"]
    partial = json.loads((tmp_path / "kernels-partial.json").read_text())
    assert [r["shape"]["N"] for r in partial["rows"]] == [1, 2]
    assert partial["extra"]["read_bandwidth_gbps"] == 2374.5


def test_conformance_only_skips_the_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         precompile_calls: list[tuple]) -> None:
    import crucible.conformance.checks as checks

    monkeypatch.setattr(checks, "run_all", lambda h: [])
    monkeypatch.setattr("crucible.conformance.harness.Harness", lambda target: type("H", (), {"compile_seconds": {}})())
    monkeypatch.setattr(sys, "argv", ["device_check.py", str(tmp_path), "--conformance-only"])
    device_check.main(str(tmp_path))
    status = json.loads((tmp_path / "status.json").read_text())
    assert "bench" not in status and status["conformance"]["result"] == {"cases": 0, "failed": 0}
    assert [c[0] for c in precompile_calls] == ["grid"] and status["grid_precompile"]["ok"]


class _AttentionOnlyBench(_BenchThatRunsOutOfTime):
    """Records which attention rows were asked for; the whole run must not start."""

    skipped: list[str] = []

    def probe(self) -> None:
        self.extra["read_bandwidth_gbps"] = 2325.6

    def attention_rows(self, model, new_tokens: int, cached: int) -> None:
        self.rows.append(Row("attention_paged", model.name, {"new": new_tokens, "cached": cached}, "decode",
                             "bfloat16", "gpu", 1.0, 1.0))

    def run(self, log) -> list[Row]:
        raise AssertionError("--attention-only ran the whole benchmark")


def test_attention_only_runs_just_the_attention_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmarks.kernels, "KernelBench", _AttentionOnlyBench)
    monkeypatch.setattr("benchmarks.kernel_report.write_report", lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["device_check.py", str(tmp_path), "--attention-only"])
    assert device_check.main(str(tmp_path)) == 0
    status = json.loads((tmp_path / "status.json").read_text())
    assert "conformance" not in status and status["bench"]["ok"] is True
    partial = json.loads((tmp_path / "kernels-partial.json").read_text())
    # The speed-target row (Llama-3-8B decode over 4096 cached tokens) comes first.
    assert partial["rows"][0]["model"] == "llama-3-8b" and partial["rows"][0]["shape"] == {"new": 1, "cached": 4096}
    assert {r["op"] for r in partial["rows"]} == {"attention_paged"}


class _TargetsOnlyBench(_BenchThatRunsOutOfTime):
    """The GPU target rows of one made-up run: our bf16 GEMV at half MAX's speed, Q4_0 staged at 3x it."""

    def run(self, log) -> list[Row]:
        assert self.targets_only, "--targets-only must reach KernelBench"
        # dtype as the benchmark writes it: str(DType.bfloat16)
        gemv = Row("matmul", "target", {"M": 1, "K": 4096, "N": 4096, "copies": 8}, "chain", "DType.bfloat16", "gpu",
                   0.0, 33.6e6).fill({"crucible": _t(20e-6), "max": _t(10e-6)})
        q4 = Row("qmatmul", "target", {"M": 1, "K": 4096, "N": 4096, "copies": 28}, "chain:q4_0:staged",
                 "DType.bfloat16", "gpu", 0.0, 9.45e6).fill({"crucible": _t(20e-6 / 3)})
        self.rows += [gemv, q4]
        log("  chains done")
        return self.rows


def _t(seconds: float):
    from benchmarks.timing import Timing

    return Timing(median=seconds, p10=seconds, p90=seconds, reps=1, rounds=(seconds,))


def test_targets_only_judges_the_gpu_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             precompile_calls: list[tuple]) -> None:
    monkeypatch.setattr(benchmarks.kernels, "KernelBench", _TargetsOnlyBench)
    monkeypatch.setattr(sys, "argv", ["device_check.py", str(tmp_path), "--targets-only"])
    assert device_check.main(str(tmp_path)) == 0
    status = json.loads((tmp_path / "status.json").read_text())
    assert "conformance" not in status and precompile_calls == [("bench", "gpu", True, precompile_calls[0][3], True)]
    targets = {t["target"]: t for t in status["bench"]["result"]["targets"]}
    gemv = targets["bf16 GEMV M=1 K=4096 N=4096 >= 0.9x MAX (chain)"]
    assert gemv["value"] == pytest.approx(0.5) and not gemv["met"]
    q4 = targets["q4_0 [staged] M=1 >= 2.5x our bf16 GEMV (chain)"]
    assert q4["value"] == pytest.approx(3.0) and q4["met"]
    # 9.45 MB in 6.67 us is 1417 GB/s: 59.7% of the run's 2374.5 GB/s probe, just short of 60%.
    share = targets["q4_0 [staged] M=1 K=4096 N=4096 >= 60% of read bandwidth (chain)"]
    assert share["value"] == pytest.approx(9.45e6 / (20e-6 / 3) / 1e9 / 2374.5) and not share["met"]
    assert (tmp_path / "kernels.json").is_file()


def test_a_failed_grid_precompile_is_reported_and_the_grid_still_runs(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import crucible.conformance.checks as checks

    def broken(h, build_all, jobs):
        raise RuntimeError("worker died")

    monkeypatch.setattr("crucible.conformance.precompile.precompile", broken)
    monkeypatch.setattr(checks, "run_all", lambda h: [])
    monkeypatch.setattr("crucible.conformance.harness.Harness", lambda target: type("H", (), {"compile_seconds": {}})())
    monkeypatch.setattr(sys, "argv", ["device_check.py", str(tmp_path), "--conformance-only"])
    assert device_check.main(str(tmp_path)) == 1  # not silent: the run's status says a step failed
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["grid_precompile"]["ok"] is False and "worker died" in status["grid_precompile"]["error"]
    assert status["conformance"]["ok"] is True


def test_failed_conformance_cases_fail_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One failed case makes the conformance step, and the run, not ok (it was ok: true before)."""
    import crucible.conformance.checks as checks
    from crucible.conformance.harness import CaseResult

    bad = CaseResult("crucible.qmatmul", "q4_k", "float32", "M=1 K=256 N=33", 3.0, 1.0, False, "gpu")
    good = CaseResult("crucible.qmatmul", "q4_0", "float32", "M=1 K=64 N=33", 0.1, 1.0, True, "gpu")
    monkeypatch.setattr(checks, "run_all", lambda h: [good, bad])
    monkeypatch.setattr("crucible.conformance.harness.Harness", lambda target: type("H", (), {"compile_seconds": {}})())
    monkeypatch.setattr(sys, "argv", ["device_check.py", str(tmp_path), "--conformance-only"])
    assert device_check.main(str(tmp_path)) == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["conformance"]["ok"] is False and status["conformance"]["result"] == {"cases": 2, "failed": 1}
