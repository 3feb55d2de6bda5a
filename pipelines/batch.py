"""Offline batch generation over a JSONL file of prompts (`crucible batch IN OUT`).

Input lines: {"prompt": "..."} or {"messages": [...]}, with an optional "id" (default "line-N") and
optional sampling fields (temperature, top_p, top_k, seed, max_tokens, stop, ignore_eos).
Output lines: {"id", "text", "finish_reason", "prompt_tokens", "completion_tokens",
"time_to_first_token_s", "total_time_s"}, or {"id", "error"} for a row that could not run; a row that
failed while generating has both (finish_reason "error"). One failing row never stops the others.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pipelines.generator import Generator, validate_messages
from pipelines.sampling import SamplingError, SamplingParams

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "max_tokens", "stop", "ignore_eos")


@dataclass(frozen=True)
class BatchRow:
    """A parsed input line: either runnable (prompt_ids, params) or an error to report."""

    row_id: str
    prompt_ids: list[int] | None = None
    params: SamplingParams | None = None
    error: str | None = None


def parse_row(line_no: int, line: str, encode: Callable[[object], list[int]]) -> BatchRow:
    """Parses and validates one JSONL line (never raises: problems become error rows)."""
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
            prompt: object = validate_messages(obj["messages"])
        elif isinstance(obj.get("prompt"), str) and obj["prompt"]:
            prompt = obj["prompt"]
        else:
            return BatchRow(row_id, error="a row needs a non-empty 'prompt' string or a 'messages' list")
        fields = {k: obj[k] for k in SAMPLING_FIELDS if k in obj}
        if "stop" in fields:
            stop = fields["stop"]
            fields["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
        params = SamplingParams(**fields)
        return BatchRow(row_id, encode(prompt), params)
    except (SamplingError, ValueError, TypeError) as exc:
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


@dataclass
class BatchSummary:
    total_rows: int = 0
    skipped: int = 0
    completed: int = 0
    errors: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open("r", encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if line.strip():
                yield i, line


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
    engine = generator.engine
    summary = BatchSummary()
    skip = done_ids(out_path)
    rows = list(_lines(in_path))
    summary.total_rows = len(rows)
    out = JsonlAppender(out_path)
    start = last_report = time.perf_counter()
    in_flight: dict[str, tuple[str, object]] = {}  # engine request id -> (row id, Request)
    texts: dict[str, list[str]] = {}
    todo = iter(rows)
    exhausted = False
    try:
        while True:
            while not exhausted and len(in_flight) < window:
                nxt = next(todo, None)
                if nxt is None:
                    exhausted = True
                    break
                row = parse_row(nxt[0], nxt[1], lambda p: generator.encode(p, raw))
                if row.row_id in skip:
                    summary.skipped += 1
                    continue
                if row.error is None:
                    try:
                        req = engine.submit(row.prompt_ids, row.params)
                    except Exception as exc:  # noqa: BLE001 - too long for the context, bad ids, ...
                        row = BatchRow(row.row_id, error=str(exc))
                if row.error is not None:
                    out.write({"id": row.row_id, "error": row.error})
                    summary.errors += 1
                    continue
                in_flight[req.request_id] = (row.row_id, req)
                texts[req.request_id] = []
            if not in_flight and exhausted:
                break
            for o in engine.step():
                if o.request_id not in in_flight:
                    continue
                texts[o.request_id].append(o.text_delta)
                if not o.finished:
                    continue
                row_id, req = in_flight.pop(o.request_id)
                record = {"id": row_id, "text": "".join(texts.pop(o.request_id)),
                          "finish_reason": o.finish_reason, "prompt_tokens": o.prompt_tokens,
                          "completion_tokens": o.completion_tokens,
                          "time_to_first_token_s": (req.first_token_time - req.arrival) if req.first_token_time else None,
                          "total_time_s": time.perf_counter() - req.arrival}
                if o.error:
                    record["error"] = o.error
                out.write(record)
                summary.completion_tokens += o.completion_tokens
                if o.finish_reason == "error":
                    summary.errors += 1
                else:
                    summary.completed += 1
            if time.perf_counter() - last_report > 0.5:
                _report(progress, summary, start)
                last_report = time.perf_counter()
    finally:
        for rid in in_flight:  # interrupted: free the engine's pages; rows stay undone for a rerun
            engine.abort(rid)
        out.close()
        summary.seconds = time.perf_counter() - start
    if progress is not None:
        _report(progress, summary, start)
        progress.write("\n")
    return summary


def _report(stream: TextIO | None, s: BatchSummary, start: float) -> None:
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
