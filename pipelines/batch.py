"""Offline batch generation over a JSONL file of prompts (`crucible batch IN OUT`).

Input lines: {"prompt": "..."} or {"messages": [...]}, with an optional "id" (default "line-N") and any
field of the HTTP API's bodies, checked the same way (pipelines/openai_request.py): sampling, penalties,
logit_bias, n, response_format, tools and tool_choice, ... An unknown field makes that row an error.
Output lines: {"id", "text", "finish_reason", "prompt_tokens", "completion_tokens",
"time_to_first_token_s", "total_time_s"} (plus "tool_calls" when the model called tools; with n > 1
one such entry per sequence under "choices"), or {"id", "error"} for a row that could not run; a row
that failed while generating has both (finish_reason "error"). One failing row never stops the others.

- Rows go through the continuous-batching engine together (a window of them at a time).
- Resumable: rows whose id is already in OUT are skipped; a torn last line (killed mid-write) is cut
  off before appending.
- Every line is written with one append-mode write, so a killed run never leaves a half line behind
  a complete one, and never mixes two rows.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pipelines.generator import Generator
from pipelines.openai_request import GenerationRequest, final_output, parse_request, prompt_jobs
from pipelines.request import Request, RequestOutput
from pipelines.sampling import SamplingParams


@dataclass(frozen=True)
class BatchRow:
    """A parsed input line: either runnable (its request and each prompt's (ids, params)) or an error."""

    row_id: str
    request: GenerationRequest | None = None
    jobs: list[tuple[list[int], SamplingParams]] | None = None
    error: str | None = None


def parse_row(line_no: int, line: str, generator: Generator, raw: bool = False) -> BatchRow:
    """Parses and validates one JSONL line with the HTTP API's checks (never raises: problems become
    error rows). A "prompt" string is one user chat message, or raw text to continue with `raw`."""
    row_id = f"line-{line_no}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return BatchRow(row_id, error=f"invalid JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(obj, dict):
        return BatchRow(row_id, error="each line must be a JSON object")
    if "id" in obj:
        row_id = str(obj["id"])
    try:
        if "messages" in obj:
            kind, body = "chat", obj
        elif "prompt" in obj and isinstance(obj["prompt"], list) and not raw and \
                any(isinstance(p, str) for p in obj["prompt"]):
            return BatchRow(row_id, error="a list of text prompts is raw text to continue: run with --raw, "
                                          "or give each prompt its own row")
        elif "prompt" in obj and (raw or not isinstance(obj["prompt"], str)):
            kind, body = "completion", obj  # raw text, or token ids
        elif "prompt" in obj:
            kind, body = "chat", {**{k: v for k, v in obj.items() if k != "prompt"},
                                  "messages": [{"role": "user", "content": obj["prompt"]}]}
        else:
            return BatchRow(row_id, error="a row needs a non-empty 'prompt' string or a 'messages' list")
        if body.get("stream"):
            return BatchRow(row_id, error="'stream' is not available in batch")
        engine = generator.engine
        req = parse_request(body, kind, engine.max_seq_len, require_model=False, extra_fields=frozenset({"id"}))
        return BatchRow(row_id, req, prompt_jobs(engine.tokenizer, req, engine.max_seq_len))
    except ValueError as exc:  # RequestError names the field
        return BatchRow(row_id, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - e.g. the tokenizer refusing a lone surrogate: this row only
        return BatchRow(row_id, error=f"{type(exc).__name__}: {exc}")


def done_ids(out_path: Path) -> set[str]:
    """Ids already in the output; cuts off a torn trailing line left by a killed run."""
    if not out_path.exists():
        return set()
    data = out_path.read_bytes()
    keep = data if data.endswith(b"\n") or not data else data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        with out_path.open("r+b") as f:
            f.truncate(len(keep))
    ids = set()
    for line in keep.decode("utf-8").splitlines():
        try:
            ids.add(str(json.loads(line)["id"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return ids


class JsonlAppender:
    """Appends whole lines with single writes to an O_APPEND file descriptor."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        written = os.write(self.fd, data)
        if written != len(data):  # pragma: no cover - regular files take whole small writes
            raise OSError(f"short write ({written} of {len(data)} bytes)")

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)


class _RowRun:
    """One row's sequences in flight, and its output record once all have finished."""

    def __init__(self, row: BatchRow, requests: list[Request]) -> None:
        self.row, self.requests = row, requests
        self.texts: dict[str, list[str]] = {r.request_id: [] for r in requests}
        self.outputs: dict[str, RequestOutput] = {}  # request id -> its last output, once finished

    def record(self) -> dict:
        """{"id", "text", "finish_reason", ...} for one sequence; n > 1 or several prompts put one such
        entry (without "id") per sequence under "choices"."""
        entries = []
        for r in self.requests:
            o = self.outputs[r.request_id]
            content, calls, reason = final_output(self.row.request, "".join(self.texts[r.request_id]), o.finish_reason)
            entry = {"text": content, "finish_reason": reason, "prompt_tokens": o.prompt_tokens,
                     "completion_tokens": o.completion_tokens,
                     "time_to_first_token_s": (r.first_token_time - r.arrival) if r.first_token_time else None,
                     "total_time_s": time.perf_counter() - r.arrival}
            if calls:
                entry["tool_calls"] = [c.openai() for c in calls]
            if o.error:
                entry["error"] = o.error
            entries.append(entry)
        if len(entries) == 1:
            return {"id": self.row.row_id, **entries[0]}
        record: dict = {"id": self.row.row_id, "choices": entries}
        errors = [e["error"] for e in entries if "error" in e]
        if errors:
            record["error"] = errors[0]
        return record


@dataclass
class BatchSummary:
    total_rows: int = 0
    skipped: int = 0
    completed: int = 0
    errors: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


def input_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of every non-blank input line."""
    with path.open("r", encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if line.strip():
                yield i, line


def generate_rows(generator: Generator, rows: Iterable[tuple[int, str]], on_record: Callable[[dict], None],
                  skip: frozenset[str] | set[str] = frozenset(), window: int = 256, raw: bool = False,
                  summary: BatchSummary | None = None, tick: Callable[[], None] | None = None) -> BatchSummary:
    """Runs input lines through the engine, handing each row's record to `on_record` the moment it is
    complete (error rows at once). The one row loop of `run_batch` and of the Ray replicas.

    Args:
        generator: A loaded Generator (its engine batches the rows).
        rows: (line number, line) pairs.
        on_record: Receives each output record.
        skip: Row ids already done (counted, not run).
        window: Rows in flight at most.
        raw: Treat "prompt" strings as raw text to continue instead of a user chat message.
        summary: Counts to add to (a new one if None).
        tick: Called after every engine step (progress).

    Returns:
        The summary.
    """
    engine = generator.engine
    summary = summary or BatchSummary()
    in_flight: dict[str, _RowRun] = {}  # engine request id -> its row
    todo = iter(rows)
    exhausted = False
    try:
        while True:
            while not exhausted and len(in_flight) < window:
                nxt = next(todo, None)
                if nxt is None:
                    exhausted = True
                    break
                row = parse_row(nxt[0], nxt[1], generator, raw)
                if row.row_id in skip:
                    summary.skipped += 1
                    continue
                run = None
                if row.error is None:
                    try:
                        run = _RowRun(row, generator.submit_jobs(row.jobs))
                    except Exception as exc:  # noqa: BLE001 - too long for the context, bad ids, ...
                        row = BatchRow(row.row_id, error=str(exc))
                if run is None:
                    on_record({"id": row.row_id, "error": row.error})
                    summary.errors += 1
                    continue
                for r in run.requests:
                    in_flight[r.request_id] = run
            if not in_flight and exhausted:
                break
            for o in engine.step():
                run = in_flight.get(o.request_id)
                if run is None:
                    continue
                run.texts[o.request_id].append(o.text_delta)
                if not o.finished:
                    continue
                del in_flight[o.request_id]
                run.outputs[o.request_id] = o
                if len(run.outputs) < len(run.requests):
                    continue
                record = run.record()
                on_record(record)
                summary.completion_tokens += sum(o.completion_tokens for o in run.outputs.values())
                if "error" in record:
                    summary.errors += 1
                else:
                    summary.completed += 1
            if tick is not None:
                tick()
    finally:
        for rid in in_flight:  # interrupted: free the engine's pages; rows stay undone for a rerun
            engine.abort(rid)
    return summary


def run_batch(generator: Generator, in_path: Path, out_path: Path, window: int = 256,
              raw: bool = False, progress: TextIO | None = sys.stderr) -> BatchSummary:
    """Generates for every row of in_path not yet in out_path, appending results to out_path.

    Rows stream through the engine: up to `window` are in flight, each result is written the moment
    its request finishes, and new rows are submitted as others complete.

    Args:
        generator: A loaded Generator (its engine batches the rows).
        in_path: JSONL input.
        out_path: JSONL output (created or appended to).
        window: Rows in flight at most.
        raw: Treat "prompt" strings as raw text to continue instead of a user chat message.
        progress: Where the progress line goes (None: silent).

    Returns:
        Counts and timing.
    """
    summary = BatchSummary()
    skip = done_ids(out_path)
    rows = list(input_lines(in_path))
    summary.total_rows = len(rows)
    out = JsonlAppender(out_path)
    start = time.perf_counter()
    last_report = [start]

    def tick() -> None:
        if time.perf_counter() - last_report[0] > 0.5:
            report_progress(progress, summary, start)
            last_report[0] = time.perf_counter()

    try:
        generate_rows(generator, rows, out.write, skip, window, raw, summary, tick)
    finally:
        out.close()
        summary.seconds = time.perf_counter() - start
    if progress is not None:
        report_progress(progress, summary, start)
        progress.write("\n")
    return summary


def report_progress(stream: TextIO | None, s: BatchSummary, start: float) -> None:
    if stream is None:
        return
    elapsed = time.perf_counter() - start
    done = s.completed + s.errors + s.skipped
    rate = s.completion_tokens / elapsed if elapsed > 0 else 0.0
    rows_per_s = (s.completed + s.errors) / elapsed if elapsed > 0 else 0.0
    eta = (s.total_rows - done) / rows_per_s if rows_per_s > 0 else float("nan")
    stream.write(f"\r[batch] {done}/{s.total_rows} rows ({s.errors} errors, {s.skipped} skipped) "
                 f"| {rate:.1f} tok/s | ETA {eta:.0f}s   ")
    stream.flush()
