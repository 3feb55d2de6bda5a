"""`crucible batch`: bad rows, empty input, resuming after a kill, and agreement with the Python API."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.batch import run_batch
from pipelines.generator import Generator
from pipelines.sampling import SamplingParams

ROWS = [
    {"id": "a", "prompt": "What is the capital of France?", "temperature": 0, "max_tokens": 6},
    {"prompt": "Name a color.", "temperature": 0, "max_tokens": 5},
    "{not json",
    {"id": "no-prompt", "temperature": 0.5},
    {"id": "chat", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0},
    {"id": "bad-role", "messages": [{"role": "wizard", "content": "x"}]},
    {"id": "neg", "prompt": "x", "max_tokens": -1},
    {"id": "long", "prompt": "word " * 1200, "max_tokens": 4},
    {"id": "seeded", "prompt": "Tell me a story.", "temperature": 0.8, "seed": 3, "max_tokens": 5},
]


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _read(path: Path) -> dict[str, dict]:
    return {json.loads(line)["id"]: json.loads(line) for line in path.read_text().splitlines()}


def test_bad_rows_are_reported_and_the_run_goes_on(make_engine, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    s = run_batch(Generator(engine=make_engine(max_seq_len=1024)), _write(tmp_path / "in.jsonl", ROWS), out,
                  progress=None)
    got = _read(out)
    assert s.completed == 4 and s.errors == 5
    assert "invalid JSON" in got["line-3"]["error"]
    assert "prompt" in got["no-prompt"]["error"]
    assert "role" in got["bad-role"]["error"]
    assert "max_tokens" in got["neg"]["error"]
    assert "context limit" in got["long"]["error"]
    for rid in ("a", "line-2", "chat", "seeded"):
        assert got[rid]["completion_tokens"] >= 1 and "text" in got[rid] and "error" not in got[rid]
        assert got[rid]["prompt_tokens"] > 0 and got[rid]["total_time_s"] > 0


def test_empty_input_writes_nothing(make_engine, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    s = run_batch(Generator(engine=make_engine()), _write(tmp_path / "in.jsonl", []), out, progress=None)
    assert s.total_rows == 0 and out.read_text() == ""


def test_resume_after_a_kill_skips_done_rows_and_drops_a_torn_line(make_engine, tmp_path: Path) -> None:
    src = _write(tmp_path / "in.jsonl", ROWS[:2] + ROWS[4:5] + ROWS[8:])
    gen = Generator(engine=make_engine())
    full = tmp_path / "full.jsonl"
    run_batch(gen, src, full, progress=None)
    lines = full.read_text().splitlines(keepends=True)
    killed = tmp_path / "killed.jsonl"
    killed.write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # one row done, one torn mid-line
    s = run_batch(gen, src, killed, progress=None)
    assert s.skipped == 1 and s.completed == 3
    text = killed.read_text()
    assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())
    assert _read(killed).keys() == _read(full).keys()
    for rid, row in _read(full).items():  # greedy and seeded rows reproduce exactly
        assert _read(killed)[rid]["text"] == row["text"]


def test_output_matches_the_python_api(make_engine, tmp_path: Path) -> None:
    gen = Generator(engine=make_engine())
    rows = [ROWS[0], ROWS[4], ROWS[8]]
    out = tmp_path / "out.jsonl"
    run_batch(gen, _write(tmp_path / "in.jsonl", rows), out, progress=None)
    got = _read(out)
    api = gen.generate(["What is the capital of France?", [{"role": "user", "content": "Say hi"}], "Tell me a story."],
                       [SamplingParams(temperature=0, max_tokens=6), SamplingParams(temperature=0, max_tokens=4),
                        SamplingParams(temperature=0.8, seed=3, max_tokens=5)])
    assert [got["a"]["text"], got["chat"]["text"], got["seeded"]["text"]] == [r.text for r in api]


def test_a_row_that_fails_while_generating_gets_an_error_record(make_engine, tmp_path: Path, monkeypatch) -> None:
    """Any failure stays in its row: a seed of -1 (once fatal) runs, a sampler that raises ends its own
    row with an error record, and every other row is generated."""
    from pipelines import engine as engine_mod

    real = engine_mod.Sampler.sample

    def sample(self, logits):
        if self.params.seed == 13:
            raise RuntimeError("planted sampler fault")
        return real(self, logits)

    monkeypatch.setattr(engine_mod.Sampler, "sample", sample)
    rows = [{"id": "minus-one", "prompt": "hi", "max_tokens": 4, "seed": -1},
            {"id": "faulty", "prompt": "hi", "max_tokens": 4, "seed": 13},
            {"id": "after", "prompt": "Name a color.", "max_tokens": 4, "temperature": 0},
            {"id": "surrogate", "prompt": "\ud800"}]
    out = tmp_path / "out.jsonl"
    s = run_batch(Generator(engine=make_engine()), _write(tmp_path / "in.jsonl", rows), out, progress=None)
    got = _read(out)
    assert s.completed == 2 and s.errors == 2
    assert got["minus-one"]["completion_tokens"] == 4 and "error" not in got["minus-one"]
    assert got["after"]["completion_tokens"] == 4 and "error" not in got["after"]
    assert got["faulty"]["finish_reason"] == "error" and "planted sampler fault" in got["faulty"]["error"]
    assert "error" in got["surrogate"]


def test_batch_exit_status_says_whether_a_row_failed(tmp_path: Path, monkeypatch) -> None:
    from types import SimpleNamespace

    from crucible import cli
    from pipelines import batch

    def fake_run(gen, in_path, out_path, raw=False):
        del gen, in_path, out_path, raw
        return batch.BatchSummary(total_rows=2, completed=1, errors=errors)

    monkeypatch.setattr(batch, "run_batch", fake_run)
    loaded = SimpleNamespace(engine=SimpleNamespace(model=SimpleNamespace(load_line=lambda: "a fake model")))
    monkeypatch.setattr("pipelines.generator.Generator", lambda *a, **k: loaded)
    src = _write(tmp_path / "in.jsonl", ROWS[:1])
    for errors, status in ((0, 0), (1, 1)):
        assert cli.main(["batch", str(src), str(tmp_path / "out.jsonl")]) == status
    assert cli.main(["batch", str(tmp_path / "missing.jsonl"), str(tmp_path / "out.jsonl")]) == 2


def test_rows_take_the_http_api_fields_with_the_same_checks(make_engine, tmp_path: Path) -> None:
    """Tools, response_format, n and penalties in batch rows; unknown or out-of-range fields are error rows
    that name the field, as the HTTP API's 400s do."""
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["C", "F"]}}, "required": ["unit"],
        "additionalProperties": False}}}]
    rows = [
        {"id": "json", "prompt": "A city?", "max_tokens": 60, "temperature": 0,
         "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {
             "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
             "additionalProperties": False}}}},
        {"id": "tool", "messages": [{"role": "user", "content": "Unit?"}], "tools": tools, "tool_choice": "required",
         "max_tokens": 60, "temperature": 0},
        {"id": "n3", "prompt": "Hi", "n": 3, "max_tokens": 3, "temperature": 0.9, "seed": 4, "frequency_penalty": 1},
        {"id": "unknown", "prompt": "Hi", "reasoning_effort": "low"},
        {"id": "penalty", "prompt": "Hi", "presence_penalty": 2.5},
        {"id": "stream", "prompt": "Hi", "stream": True},
    ]
    out = tmp_path / "out.jsonl"
    s = run_batch(Generator(engine=make_engine(max_batch_size=8)), _write(tmp_path / "in.jsonl", rows), out,
                  progress=None)
    got = _read(out)
    assert s.completed == 3 and s.errors == 3
    assert json.loads(got["json"]["text"]) in ({"ok": True}, {"ok": False})
    assert got["tool"]["finish_reason"] == "tool_calls" and got["tool"]["tool_calls"][0]["function"]["name"] == "pick"
    assert len(got["n3"]["choices"]) == 3 and all(c["completion_tokens"] == 3 for c in got["n3"]["choices"])
    assert "reasoning_effort" in got["unknown"]["error"]
    assert "presence_penalty" in got["penalty"]["error"]
    assert "stream" in got["stream"]["error"]
