"""The e2e benchmark's bookkeeping (no model runs): config checks, prompt sizing, summary, targets, report."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.e2e import E2EConfig, E2EReport, Sample, check_targets, format_report, write_report
from pipelines.throughput import chat_prompt_of_length
from crucible.core.registry import resolve_model
from crucible.core.tokenizer import chat_prompt_ids, load_tokenizer


def test_config_rejects_unknown_systems_and_tiny_runs() -> None:
    with pytest.raises(ValueError, match="unknown systems"):
        E2EConfig(systems=("crucible", "vllm"))
    with pytest.raises(ValueError):
        E2EConfig(gen_tokens=1)


def test_prompt_hits_its_length(tiny_models) -> None:
    tok = load_tokenizer(resolve_model(str(tiny_models["llama"].gguf["Q4_0"])))
    text, ids = chat_prompt_of_length(tok, 200)
    assert 190 <= len(ids) <= 200
    assert ids == chat_prompt_ids(tok, [{"role": "user", "content": text}])


def _report() -> E2EReport:
    r = E2EReport(E2EConfig(reps=3))
    for rep, (c, m, l) in enumerate([((700, 140), (600, 30), (350, 130)), ((720, 150), (640, 28), (340, 137)),
                                     ((650, 145), (630, 27), (346, 120))]):
        r.samples += [Sample("crucible", rep, c[0], c[1], 512, 128), Sample("max", rep, m[0], m[1], 512, 100),
                      Sample("llama.cpp", rep, l[0], l[1], 512, 128)]
    return r


def test_summary_targets_and_files(tmp_path: Path) -> None:
    report = _report()
    s = report.summary()
    assert s["crucible"]["decode_tok_s"] == 145 and s["crucible"]["decode_tok_s_min"] == 140
    assert s["max"]["prefill_tok_s"] == 630
    targets = {t["target"]: t for t in check_targets(s)}
    assert targets["decode batch 1: crucible / llama.cpp >= 1.0x"]["met"] is True       # 145 / 130
    assert targets["decode batch 1: crucible / max >= 4.0x"]["met"] is True             # 145 / 28
    assert targets["prefill batch 1: crucible / max >= 1.0x"]["value"] == pytest.approx(700 / 630)
    text = format_report(report, check_targets(s))
    assert "MET" in text and "llama.cpp" in text
    path = write_report(report, check_targets(s), {"python": "x"}, tmp_path)
    assert path.is_file() and path.with_suffix(".png").stat().st_size > 0


def test_missing_system_is_skipped_not_met() -> None:
    report = _report()
    report.samples = [s for s in report.samples if s.system != "llama.cpp"]
    t = {x["target"]: x for x in check_targets(report.summary())}
    assert t["decode batch 1: crucible / llama.cpp >= 1.0x"]["met"] is None
    assert "SKIPPED" in format_report(report, list(t.values()))


def test_int8_variant_gets_its_own_targets() -> None:
    report = _report()
    assert not any("crucible-q8" in t["target"] for t in check_targets(report.summary()))
    report.samples += [Sample("crucible-q8", rep, 700, d, 512, 128) for rep, d in enumerate((150, 160, 155))]
    t = {x["target"]: x for x in check_targets(report.summary())}
    assert t["decode batch 1: crucible-q8 / llama.cpp >= 1.0x"]["value"] == pytest.approx(155 / 130)
    assert t["decode batch 1: crucible / llama.cpp >= 1.0x"]["value"] == pytest.approx(145 / 130)
    assert "crucible-q8" in format_report(report, list(t.values()))


def test_failing_baseline_is_skipped_with_its_reason(tiny_models, monkeypatch) -> None:
    """llama-bench crashing on the second rep (as it did on an AMX host) drops llama.cpp from the report
    with the reason, instead of ending the benchmark with a traceback."""
    import benchmarks.llamacpp as llamacpp
    from benchmarks.e2e import run_e2e

    fake = llamacpp.LlamaCppBuild(Path("/nonexistent"), "fake", 0.0, False, ())
    monkeypatch.setattr(llamacpp, "is_built", lambda cache_dir=None: True)
    monkeypatch.setattr(llamacpp, "ensure_built", lambda cache_dir=None, log=print: fake)
    calls = []

    def bench(build, gguf, *, n_prompt, n_gen, threads, repetitions, depth=0, flash_attn=(0, 1)):
        calls.append(n_prompt)
        if len(calls) > 1:
            raise llamacpp.LlamaCppError(f"llama-bench failed ({llamacpp.exit_status(-11)}):\n")
        return [llamacpp.LlamaBenchResult("pp", n_prompt, 0, (300.0,), "x"),
                llamacpp.LlamaBenchResult("tg", 0, n_gen, (100.0,), "x")]

    monkeypatch.setattr(llamacpp, "llama_bench", bench)
    cfg = E2EConfig(model=str(tiny_models["llama"].gguf["Q4_0"]), systems=("llama.cpp",), prompt_tokens=64,
                    gen_tokens=8, reps=3)
    log: list[str] = []
    report = run_e2e(cfg, log=log.append)
    assert len(calls) == 2                      # no third attempt after the failure
    assert report.samples == []                 # the first rep's sample is not kept alone
    assert "SIGSEGV" in report.notes["llama.cpp_failed"]
    assert any("RUN FAILED" in line for line in log)
    text = format_report(report, check_targets(report.summary()))
    assert "FAILED   llama.cpp: llama-bench failed (signal 11 (SIGSEGV)):" in text
    assert "SKIPPED  decode batch 1: crucible / llama.cpp" in text


def test_ratio_inside_the_noise_is_not_met() -> None:
    """Medians 1.04x apart, but our worst rep is below the baseline's best: NOT MET, said so."""
    r = E2EReport(E2EConfig(reps=3, systems=("crucible", "llama.cpp")))
    for rep, (ours, theirs) in enumerate(((104, 100), (99, 103), (108, 95))):
        r.samples += [Sample("crucible", rep, 500, ours, 512, 128), Sample("llama.cpp", rep, 400, theirs, 512, 128)]
    t = {x["target"]: x for x in check_targets(r.summary())}["decode batch 1: crucible / llama.cpp >= 1.0x"]
    assert t["value"] == pytest.approx(104 / 100) and t["worst"] == pytest.approx(99 / 103)
    assert t["met"] is False
    assert "NOT MET  decode batch 1: crucible / llama.cpp >= 1.0x: 1.04x (worst rep vs best: 0.96x), inside the noise" \
        in format_report(r, [t])


def test_max_error_line_is_maxs_own() -> None:
    from benchmarks.e2e import max_error_line

    oov = ("`max generate ...` exited 1:\nTraceback (most recent call last):\n  File \"context.py\", line 878\n"
           "RuntimeError: Generated out-of-vocabulary token_id=9223372036854775807 for request 94 (valid range: [0, 49152))\n")
    assert max_error_line(oov).startswith("RuntimeError: Generated out-of-vocabulary token_id=9223372036854775807")
    key = "`max generate ...` exited 1:\n    dtype = _GGML_TO_DTYPE[tensor.tensor_type]\nKeyError: <GGMLQuantizationType.Q8_0: 8>\n"
    assert max_error_line(key) == "KeyError: <GGMLQuantizationType.Q8_0: 8>"
    assert max_error_line("`max generate --devices cpu` exited -11:\n") == "max exited with signal 11 (SIGSEGV)"
    # max serve: the request tasks cancelled after the error are not the error.
    serve = oov + "Traceback (most recent call last):\n    await fut\nasyncio.exceptions.CancelledError\n"
    assert max_error_line(serve).startswith("RuntimeError: Generated out-of-vocabulary token_id")


def test_system_order_is_shuffled_per_rep(tiny_models, monkeypatch) -> None:
    from benchmarks import e2e

    class Fake:
        def __init__(self, model, system, *a) -> None:
            self.system = system
            self.model = type("M", (), {"session": None, "provenance": {"kernel_build": "x", "cpu_threads": "x"}})()

        def warm_up(self, ids) -> None:
            pass

        def run(self, ids, gen, rep) -> Sample:
            return Sample(self.system, rep, 1.0, 1.0, len(ids), gen)

    monkeypatch.setattr(e2e, "CrucibleRunner", Fake)
    cfg = E2EConfig(model=str(tiny_models["llama"].gguf["Q4_0"]), systems=("crucible", "crucible-q8"),
                    prompt_tokens=64, gen_tokens=8, reps=6)
    report = e2e.run_e2e(cfg, log=lambda m: None)
    orders = report.notes["order"]
    assert len(orders) == 6 and {tuple(o) for o in orders} == {("crucible", "crucible-q8"), ("crucible-q8", "crucible")}
    assert [s.system for s in report.samples] == [name for o in orders for name in o]


def _drifting_report(ratios: list[float]) -> E2EReport:
    """Reps on a host whose speed drifts 1.6x between reps; ours is `ratio` times llama.cpp in each rep."""
    r = E2EReport(E2EConfig(reps=len(ratios), systems=("crucible", "llama.cpp")))
    for rep, ratio in enumerate(ratios):
        base = 60.0 + 40.0 * (rep % 3) / 2     # 60, 80, 100, 60, ...
        r.samples += [Sample("crucible", rep, 500, base * ratio, 512, 128),
                      Sample("llama.cpp", rep, 400, base, 512, 128)]
    return r


def test_a_lead_in_every_rep_is_met_by_the_paired_interval() -> None:
    """1.08-1.14x in each of 10 reps while the host drifts 1.6x: the worst rep (60 * 1.08) loses to the best
    baseline rep (100), but the paired interval lies above 1.0."""
    r = _drifting_report([1.10, 1.12, 1.08, 1.14, 1.09, 1.11, 1.13, 1.10, 1.12, 1.09])
    t = {x["target"]: x for x in check_targets(r.summary(), r.samples)}["decode batch 1: crucible / llama.cpp >= 1.0x"]
    assert t["worst"] < 1.0 and t["pairs"] == 10
    assert t["interval"][0] > 1.0 and t["met"] is True and t["met_by"] == "interval"
    assert "met by the interval" in format_report(r, [t])
    # Without the samples (the old call) there is no interval and the worst-rep rule alone says NOT MET.
    assert {x["target"]: x for x in check_targets(r.summary())}[t["target"]]["met"] is False


def test_control_a_lead_in_half_the_reps_is_not_met() -> None:
    """Medians above 1.0x, but the paired ratios straddle it: the interval holds 1.0, so NOT MET."""
    r = _drifting_report([0.95, 1.15, 1.12, 0.96, 1.18, 0.94, 0.93, 1.10, 1.14, 0.97])
    t = {x["target"]: x for x in check_targets(r.summary(), r.samples)}["decode batch 1: crucible / llama.cpp >= 1.0x"]
    assert t["value"] > 1.0 and t["interval"][0] <= 1.0 <= t["interval"][1]
    assert t["met"] is False and t["met_by"] is None
    assert "inside the noise" in format_report(r, [t])


def test_paired_interval_needs_enough_reps_and_paired_values() -> None:
    from benchmarks.paired import MIN_PAIRS, paired_values, ratio_interval

    assert ratio_interval([110.0] * (MIN_PAIRS - 1), [100.0] * (MIN_PAIRS - 1)) is None
    lo, hi = ratio_interval([110.0] * MIN_PAIRS, [100.0] * MIN_PAIRS)
    assert lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    assert ratio_interval(list(range(1, 11)), list(range(2, 12)), seed=3) == ratio_interval(
        list(range(1, 11)), list(range(2, 12)), seed=3)
    with pytest.raises(ValueError, match="one value per rep"):
        ratio_interval([1.0] * 9, [1.0] * 10)
    with pytest.raises(ValueError, match="positive"):
        ratio_interval([1.0] * 9 + [0.0], [1.0] * 10)
    # A rep where only one system ran (its baseline failed later) is not paired.
    r = _drifting_report([1.1, 1.2, 1.3])
    r.samples = [s for s in r.samples if not (s.system == "llama.cpp" and s.rep == 1)]
    ours, base = paired_values(r.samples, "crucible", "llama.cpp", "decode_tok_s")
    assert ours == pytest.approx([66.0, 130.0]) and base == [60.0, 100.0]
