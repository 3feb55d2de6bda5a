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
