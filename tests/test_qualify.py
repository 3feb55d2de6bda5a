"""`crucible qualify`: the record's content on the tiny model, and that two runs differ only in `run`."""

from __future__ import annotations

from pathlib import Path

from crucible.qualify import QualifyConfig, qualify, write_record


def test_two_records_equal_except_timings(tiny_models, tmp_path: Path) -> None:
    cfg = QualifyConfig(model=str(tiny_models["llama"].gguf["Q4_0"]), conformance=False, e2e_reps=1,
                        prompt_tokens=48, gen_tokens=8)
    first, second = qualify(cfg, log=lambda _: None), qualify(cfg, log=lambda _: None)
    assert first.pop("run") != second.pop("run")  # timings and start time differ ...
    assert first == second                          # ... nothing else does

    assert first["kernel_build"] == first["versions"]["kernel_build"]
    assert first["provenance"]["hot_path_fallbacks"] == []
    assert first["provenance"]["hot_path"]["crucible:attention"] == 2  # one per layer of the tiny model
    assert first["parity"]["passed"] and first["parity"]["top1_agreement"] == 1.0
    # Without the op grid nothing is qualified, and the record says why.
    assert "skipped" in first["conformance"] and first["qualified"] is False

    second["run"] = {"started": "x", "timings": {"e2e": {"prefill_tok_s_median": 1.0, "decode_tok_s_median": 2.0}}}
    path = write_record(second, tmp_path)
    md = path.with_suffix(".md").read_text()
    assert "Qualified: NO" in md and "SKIPPED" in md and "Hot-path fallbacks to MAX built-ins: none" in md
    assert not list(tmp_path.glob("*.tmp"))


def test_parity_from_a_saved_reference(tiny_models, tmp_path: Path) -> None:
    # The GPU machine has no transformers: parity reads a reference saved here (model_parity's form).
    from benchmarks.model_parity import reference_rows, save_reference

    model = str(tiny_models["llama"].hf)
    ref = tmp_path / "ref.npz"
    save_reference(reference_rows(model, 6), ref)
    cfg = QualifyConfig(model=model, conformance=False, e2e_reps=1, prompt_tokens=48, gen_tokens=4, reference=ref)
    record = qualify(cfg, log=lambda _: None)
    par = record["parity"]
    assert record["dtype"] == "float32" and par["passed"] and par["greedy_identical"] and par["prompts"] == 3
    assert "ref.npz" in par["reference"] and par["max_abs_logit_diff"] <= par["bound"]
    assert "(float32)" in write_record({**record, "run": {"started": "x", "timings": {"e2e": {
        "prefill_tok_s_median": 1.0, "decode_tok_s_median": 2.0}}}}, tmp_path).with_suffix(".md").read_text()
