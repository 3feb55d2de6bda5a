"""`crucible batch IN OUT --ray [ADDRESS]`: the same JSONL contract as pipelines/batch.py, on Ray Data.

Ray is the engine this field already runs offline batches on (vLLM's included), so we do not build a
cluster layer of our own. The driver:
- reads the ids already in OUT (resume) and the input's lines, and makes a Ray Dataset of the rows not
  yet done, in blocks of `block_rows`;
- maps the blocks over an actor pool of `replicas`, each actor holding one loaded Generator with
  `cpus_per_replica` CPUs (or `gpus_per_replica` GPUs); an actor runs its block through the same row
  loop as the single-process batch (batch.generate_rows: per-row errors, n, tools, ...);
- appends each block's records to OUT as the block comes back (streaming execution), one whole line
  per write, so a killed driver leaves a file that the next run resumes.
A replica that dies mid-block (its process killed) is restarted by Ray and the block runs again on a
live replica: its rows were not written yet, so none is lost and none is written twice.

Ray is an optional extra (`pip install .[ray]`); nothing imports this module unless --ray was given.
Call run_ray_batch from a process that has not loaded a MAX model (the command line's driver loads
none): there, Ray Data's driver side (pyarrow's compute) crashed with a segmentation fault (MAX 26.7,
Ray 2.60).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pipelines.batch import BatchSummary, JsonlAppender, done_ids, input_lines, report_progress

# The test suite's fault injection: a replica that meets this row id exits once, as a killed process
# would (tests/pipelines/test_ray_batch.py). The file named by the variable records that it happened.
CRASH_ONCE_ENV = "CRUCIBLE_RAY_CRASH_ONCE"
MAX_RESTARTS = 3


@dataclass(frozen=True)
class RayBatchConfig:
    """How the batch runs on Ray.

    Attributes:
        address: A running cluster ("auto", "ray://host:10001") or None for a local one on this machine.
        replicas: Actors, each with one loaded model.
        cpus_per_replica: CPUs Ray reserves for each actor. MAX's CPU runtime does not take a thread
            count (26.7's InferenceSession(num_threads=...) aborts), so a CPU replica uses every core of
            its node: on CPUs, one replica per node is the efficient layout.
        gpus_per_replica: GPUs per actor (0 on CPU; a GPU replica runs the model with device="gpu").
        block_rows: Rows per Ray Data block: the unit an actor runs (its engine batches at most these
            rows, so keep it above the engine's batch size) and a retry repeats.
        local_cpus: CPUs of the local cluster when address is None (None: Ray's default, all of them).
    """

    address: str | None = None
    replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    block_rows: int = 64
    local_cpus: int | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.block_rows < 1:
            raise ValueError("replicas and block_rows must be >= 1")
        if self.cpus_per_replica <= 0 or self.gpus_per_replica < 0:
            raise ValueError("cpus_per_replica must be > 0 and gpus_per_replica >= 0")


class _Replica:
    """A Ray Data actor: one Generator, loaded once; each call runs one block of rows."""

    def __init__(self, model: str, settings: dict, raw: bool) -> None:
        from pipelines.generator import Generator

        self.generator = Generator(model, **settings)
        self.raw = raw

    def __call__(self, block: dict) -> dict:
        # block: {"line_no": [n], "line": [n]} -> {"record": [JSON text of each row's record]}
        rows = list(zip((int(n) for n in block["line_no"]), (str(x) for x in block["line"])))
        self._maybe_crash(rows)
        from pipelines.batch import generate_rows

        records: list[str] = []
        generate_rows(self.generator, rows, lambda r: records.append(json.dumps(r, ensure_ascii=False)), raw=self.raw)
        return {"record": records}

    @staticmethod
    def _maybe_crash(rows: list[tuple[int, str]]) -> None:
        marker = os.environ.get(CRASH_ONCE_ENV)
        if not marker or Path(marker).exists():
            return
        if any('"crash-here"' in line for _, line in rows):
            Path(marker).write_text(str(os.getpid()))
            os._exit(17)  # noqa: SLF001 - a killed replica: no cleanup, no exception to catch


def run_ray_batch(model: str, in_path: Path, out_path: Path, cfg: RayBatchConfig, settings: dict,
                  raw: bool = False, progress: TextIO | None = sys.stderr) -> BatchSummary:
    """Generates every row of in_path not yet in out_path on a Ray actor pool, appending to out_path.

    Args:
        model: What each replica loads (registry name, GGUF file or HF folder).
        in_path: JSONL input.
        out_path: JSONL output (created or appended to).
        cfg: The Ray side.
        settings: EngineConfig fields for each replica's Generator (device, max_batch_size, ...).
        raw: Treat "prompt" strings as raw text to continue.
        progress: Where the progress line goes (None: silent).

    Returns:
        Counts and timing (as pipelines.batch.run_batch).
    """
    import ray

    summary = BatchSummary()
    skip = done_ids(out_path)
    rows = list(input_lines(in_path))
    summary.total_rows = len(rows)
    todo = [(n, line) for n, line in rows if _row_id(n, line) not in skip]
    summary.skipped = len(rows) - len(todo)
    start = time.perf_counter()
    if not todo:
        summary.seconds = time.perf_counter() - start
        return summary
    started_here = not ray.is_initialized()
    if started_here:
        # "local": a cluster of this process's own, never one that `ray start` left running
        ray.init(address=cfg.address or "local", num_cpus=cfg.local_cpus if cfg.address is None else None,
                 include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": forwarded_env()})
    out = JsonlAppender(out_path)
    try:
        ds = ray.data.from_items([{"line_no": n, "line": line} for n, line in todo],
                                 override_num_blocks=max(1, -(-len(todo) // cfg.block_rows)))
        ds = ds.map_batches(
            _Replica, fn_constructor_args=(model, settings, raw), batch_size=cfg.block_rows,
            compute=ray.data.ActorPoolStrategy(size=cfg.replicas),
            num_cpus=cfg.cpus_per_replica, num_gpus=cfg.gpus_per_replica or None,
            # A dead replica is restarted and its block retried; a replica that keeps dying (a model
            # that cannot load) fails the run after a few tries instead of looping.
            max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS)
        last = start
        for item in ds.iter_rows():
            record = json.loads(item["record"])
            out.write(record)
            summary.completion_tokens += _tokens(record)
            if "error" in record:
                summary.errors += 1
            else:
                summary.completed += 1
            if time.perf_counter() - last > 0.5:
                report_progress(progress, summary, start)
                last = time.perf_counter()
    finally:
        out.close()
        summary.seconds = time.perf_counter() - start
        if started_here:
            ray.shutdown()
    if progress is not None:
        report_progress(progress, summary, start)
        progress.write("\n")
    return summary


def _row_id(line_no: int, line: str) -> str:
    """The id a row gets (batch.parse_row's rule), read without the tokenizer."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return f"line-{line_no}"
    return str(obj["id"]) if isinstance(obj, dict) and "id" in obj else f"line-{line_no}"


def _tokens(record: dict) -> int:
    if "choices" in record:
        return sum(int(c.get("completion_tokens") or 0) for c in record["choices"])
    return int(record.get("completion_tokens") or 0)


def forwarded_env() -> dict[str, str]:
    """What replicas need of this process's environment (the kernel package, MAX's cache, the fault
    injection of the tests); Ray's workers start from the cluster's environment otherwise."""
    names = ("CRUCIBLE_PREBUILT_KERNELS", "MODULAR_CACHE_DIR", "MAX_SERVE_DISABLE_TELEMETRY", CRASH_ONCE_ENV,
             "PYTHONPATH")
    return {k: os.environ[k] for k in names if k in os.environ}
