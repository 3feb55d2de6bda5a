"""`crucible batch --ray` on a local Ray cluster of 2 CPUs with 2 replicas of the tiny model: the same
JSONL contract as the single-process batch (pipelines/ray_batch.py).

- The output equals the single-process output row for row (greedy), error rows included.
- A replica killed mid-run (its process exits, fault injected by CRUCIBLE_RAY_CRASH_ONCE) loses no row
  and writes none twice; a rerun skips every row.
- Without --ray, Ray is never imported.
The Ray runs go through the command line in a child process, as users run them: Ray Data's driver
(pyarrow's compute) crashes in a process that holds a loaded MAX model (MAX 26.7, Ray 2.60), as this
test process does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

from crucible.core.proc import child_env  # noqa: E402
from pipelines.batch import run_batch  # noqa: E402
from pipelines.ray_batch import CRASH_ONCE_ENV  # noqa: E402


def _cli_batch(model: str, rows: Path, out: Path, *flags: str, env: dict[str, str] | None = None) -> dict:
    """`crucible batch` in a child process; returns its summary counts (from the last stderr line)."""
    code = ("import sys; from crucible import cli; "
            f"status = cli.main(['batch', {str(rows)!r}, {str(out)!r}, '--model', {model!r}, *{list(flags)!r}]); "
            "print('RAY' if 'ray' in sys.modules else 'NO-RAY', status)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env=child_env({"RAY_AUTH_MODE": "disabled", **(env or {})}))
    assert proc.returncode == 0 and proc.stdout.split()[-2:-1] in (["RAY"], ["NO-RAY"]), proc.stderr[-3000:]
    last = [line for line in proc.stderr.splitlines() if line.startswith("[batch]")][-1]
    done, errors, skipped = (int(w) for w in (last.split()[1], last.split()[4], last.split()[6]))
    return {"ray_imported": proc.stdout.split()[-2] == "RAY", "status": int(proc.stdout.split()[-1]),
            "completed": done, "errors": errors, "skipped": skipped}


RAY2 = ("--ray", "--replicas", "2", "--cpus-per-replica", "1")


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ray-batch") / "in.jsonl"
    lines = [json.dumps({"id": f"r{i}", "prompt": f"Count to {i}.", "max_tokens": 6, "temperature": 0})
             for i in range(9)]
    lines.insert(4, json.dumps({"id": "crash-here", "prompt": "Tell me about Paris.", "max_tokens": 6,
                                "temperature": 0}))
    lines.insert(7, "{not json")
    lines.append(json.dumps({"id": "bad-field", "prompt": "hi", "frobnicate": 1}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _by_id(path: Path) -> dict[str, dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by_id = {r["id"]: r for r in records}
    assert len(by_id) == len(records), "a row was written twice"
    return by_id


def _comparable(r: dict) -> dict:
    return {k: v for k, v in r.items() if k not in ("time_to_first_token_s", "total_time_s")}


def test_ray_output_equals_single_process_and_a_killed_replica_loses_nothing(
        rows_file: Path, tiny_model, make_engine, tmp_path: Path) -> None:
    from pipelines.generator import Generator

    model = str(tiny_model.source.path)
    single = tmp_path / "single.jsonl"
    run_batch(Generator(engine=make_engine()), rows_file, single, progress=None)

    marker = tmp_path / "crashed"
    out = tmp_path / "ray.jsonl"
    s = _cli_batch(model, rows_file, out, *RAY2, env={CRASH_ONCE_ENV: str(marker)})
    assert marker.exists(), "the fault was not injected: the test would prove nothing"
    ours, theirs = _by_id(out), _by_id(single)
    assert ours.keys() == theirs.keys() and len(ours) == 12
    assert {k: _comparable(v) for k, v in ours.items()} == {k: _comparable(v) for k, v in theirs.items()}
    assert "error" in ours["line-8"] and "frobnicate" in ours["bad-field"]["error"]
    assert (s["completed"], s["errors"], s["skipped"], s["status"]) == (10, 2, 0, 1)  # 1: rows with errors

    again = _cli_batch(model, rows_file, out, *RAY2)
    assert (again["completed"], again["errors"], again["skipped"]) == (0, 0, 12)
    assert len(out.read_text().splitlines()) == 12


def test_a_resumed_ray_run_does_only_the_missing_rows(rows_file: Path, tiny_model, tmp_path: Path) -> None:
    out = tmp_path / "partial.jsonl"
    out.write_text(json.dumps({"id": "r0", "text": "kept"}) + "\n" + '{"id": "r1", "te')  # a torn last line
    s = _cli_batch(str(tiny_model.source.path), rows_file, out, "--ray")
    ours = _by_id(out)
    assert s["skipped"] == 1 and s["ray_imported"] and len(ours) == 12 and ours["r0"]["text"] == "kept"


def test_without_ray_flag_ray_is_not_imported(rows_file: Path, tiny_model, tmp_path: Path) -> None:
    s = _cli_batch(str(tiny_model.source.path), rows_file, tmp_path / "o.jsonl")
    assert not s["ray_imported"] and (s["completed"], s["errors"]) == (10, 2)
