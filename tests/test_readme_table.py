"""The README's performance table is the one benchmarks/readme_table.py renders from committed JSON."""

from __future__ import annotations

import pytest

from benchmarks.readme_table import BEGIN, END, ROOT, render, rendered_readme, replace_in


def test_readme_tables_are_generated() -> None:
    text = (ROOT / "README.md").read_text()
    assert rendered_readme(text) == text, "run python -m benchmarks.readme_table"


def test_failed_baseline_shows_its_error(tmp_path) -> None:
    import json

    run = tmp_path / "r"
    run.mkdir()
    summary = {"crucible": {"prefill_tok_s": 100.0, "decode_tok_s": 10.0, "decode_tok_s_min": 9.0}}
    (run / "e2e.json").write_text(json.dumps({"config": {"model": "/x/m.gguf", "reps": 3}, "summary": summary,
                                              "notes": {"max-q4_0_failed": "max exited with signal 11 (SIGSEGV)\nlog"}}))
    table = render(("r",), tmp_path)
    assert "| m.gguf (`r`, 3 reps) | 100 / 10.0 | - | - | - | FAILED: max exited with signal 11 (SIGSEGV) |" in table
    with pytest.raises(ValueError):
        replace_in("no markers", table)
    assert table.startswith(BEGIN) and table.endswith(END)
