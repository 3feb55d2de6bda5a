"""serve_compare's verdicts (benchmarks/serve_compare.py): a baseline that failed is never a MET, and
a MET needs our worst rep to beat the baseline's best."""

from __future__ import annotations

import json

from benchmarks.readme_table import render_serve
from benchmarks.serve_compare import check_serve_targets, format_compare, summarize
from benchmarks.serve_load import LoadResult


def _result(level: int, tok_s: float, ttft: float | None, errors: int = 0, rep: int = 0) -> LoadResult:
    return LoadResult(level, 32, errors, 10.0, int(tok_s * 10), tok_s, 3.2, ttft, ttft, 0.01, 0.02,
                      "HTTP 500" if errors else None, rep)


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
    assert targets["1 streams vs llama.cpp: output tok/s >= 1.1x"]["met"] is False
    assert targets["1 streams vs llama.cpp: p99 TTFT ratio <= 1.0"]["met"] is False


def test_a_median_win_inside_the_noise_is_not_met() -> None:
    # Medians 120 vs 110 (1.09x), but our worst rep (100) is below their best (125): not a win.
    results = {"crucible": [_result(1, t, 0.05, rep=i) for i, t in enumerate((120.0, 100.0, 125.0))],
               "max": [_result(1, t, 0.06, rep=i) for i, t in enumerate((110.0, 125.0, 105.0))]}
    t = {t["target"]: t for t in check_serve_targets(results)}["1 streams vs max: output tok/s >= 1.0x"]
    assert abs(t["value"] - 120 / 110) < 1e-9 and abs(t["worst"] - 100 / 125) < 1e-9 and t["met"] is False
    # ... and a clear win is MET: our worst (130) beats their best (125).
    results["crucible"] = [_result(1, t, 0.05, rep=i) for i, t in enumerate((140.0, 130.0, 150.0))]
    t = {t["target"]: t for t in check_serve_targets(results)}["1 streams vs max: output tok/s >= 1.0x"]
    assert t["met"] is True
    s = summarize(results)["crucible"][1]
    assert (s["tok_s"], s["tok_s_min"], s["tok_s_max"], s["reps"]) == (140.0, 130.0, 150.0, 3)


def test_a_system_that_did_not_start_is_failed_with_its_error(tmp_path) -> None:
    results = {"crucible": [_result(1, 120.0, 0.05), _result(16, 360.0, 0.4)], "max-q4_0": []}
    info = {"crucible": {}, "max-q4_0": {"failed": "KeyError: 'Q8_0'"}}
    targets = check_serve_targets(results, info)
    mine = [t for t in targets if "max-q4_0" in t["target"]]
    assert len(mine) == 4 and all(t["met"] is None and "KeyError: 'Q8_0'" in t["failed"] for t in mine)
    # The README table shows the error where the numbers would be.
    run = tmp_path / "r"
    run.mkdir()
    data = {"config": {"model": "m", "levels": [1, 16], "max_tokens": 128, "reps": 3}, "targets": targets,
            "summary": {s: {str(k): v for k, v in lv.items()} for s, lv in summarize(results).items()},
            "systems": {"crucible": {"results": []}, "max-q4_0": {"results": [], **info["max-q4_0"]}}}
    (run / "serve.json").write_text(json.dumps(data))
    table = render_serve("r", tmp_path)
    assert "| 1 | 120.0 [120.0-120.0] (0.05) | FAILED: KeyError: 'Q8_0' |" in table
    assert "- FAILED: 1 streams vs max-q4_0: output tok/s" in table


def test_a_lead_in_every_rep_is_met_by_the_paired_interval_and_a_split_one_is_not() -> None:
    """10 reps on a host drifting 1.6x: ours 1.21x (one stream against llama.cpp needs 1.1x, #56) and
    0.8x the TTFT in every rep beats the worst-rep rule's reach (worst 0.76x) but the paired intervals
    lie on the targets' side; the controls, ahead in only half the reps or by 1.05x (under the need),
    stay NOT MET."""
    def results(ratios: list[float]) -> dict[str, list[LoadResult]]:
        base = [100.0 + 60.0 * (i % 3) / 2 for i in range(len(ratios))]  # 100, 130, 160, ...
        return {"crucible": [_result(1, b * r, 0.08 * 100 / b * (2 - r / 1.1), rep=i)
                             for i, (b, r) in enumerate(zip(base, ratios))],
                "llama.cpp": [_result(1, b, 0.08 * 100 / b, rep=i) for i, b in enumerate(base)]}

    lead_ratios = [1.1 * r for r in (1.1, 1.12, 1.08, 1.1, 1.09, 1.11, 1.1, 1.13, 1.1, 1.1)]
    lead = {t["target"]: t for t in check_serve_targets(results(lead_ratios))}
    tok = lead["1 streams vs llama.cpp: output tok/s >= 1.1x"]
    ttft = lead["1 streams vs llama.cpp: p99 TTFT ratio <= 1.0"]
    assert tok["worst"] < 1.1 and tok["interval"][0] > 1.1 and tok["met_by"] == "interval"
    assert ttft["worst"] > 1.0 and ttft["interval"][1] < 1.0 and ttft["met_by"] == "interval"
    split_ratios = [1.1 * r for r in (1.2, 0.9, 1.15, 0.92, 1.18, 0.9, 1.1, 0.95, 1.2, 0.9)]
    split = {t["target"]: t for t in check_serve_targets(results(split_ratios))}
    assert split["1 streams vs llama.cpp: output tok/s >= 1.1x"]["met"] is False
    short = {t["target"]: t for t in check_serve_targets(results([1.05] * 10))}
    assert short["1 streams vs llama.cpp: output tok/s >= 1.1x"]["interval"][0] > 1.0
    assert short["1 streams vs llama.cpp: output tok/s >= 1.1x"]["met"] is False
    assert "paired interval" in format_compare(results([1.1] * 10), list(lead.values()))
