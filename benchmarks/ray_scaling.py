"""Ray batch scaling on one machine: `crucible batch` against `--ray` with 1 and 2 replicas on the same cores.

    python -m benchmarks.ray_scaling --rows 48 --max-tokens 32 --reps 2 --out benchmarks/results/<dir>

Each configuration runs the same JSONL file into a fresh output, as a child process (its wall time
includes starting Ray and loading the model in every replica: what a user waits for), in an order
rotated per rep. Reported: output tok/s by wall time, and each Ray configuration's ratio to the plain
batch (its overhead when below 1). On CPUs a replica's MAX runtime uses every core of the machine (26.7
takes no thread count), so 2 replicas on 2 cores share them rather than split them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crucible.core.atomic_write import write_text_atomic
from crucible.core.proc import child_env
from crucible.core.registry import DEFAULT_MODEL

CONFIGS = {
    "batch": (),
    "ray-1x2cpu": ("--ray", "--replicas", "1", "--cpus-per-replica", "2"),
    "ray-2x1cpu": ("--ray", "--replicas", "2", "--cpus-per-replica", "1"),
}


def _rows(n: int, max_tokens: int) -> str:
    return "".join(json.dumps({"id": f"q{i}", "prompt": f"Write one sentence about the number {i}.",
                               "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}) + "\n"
                   for i in range(n))


def run_config(name: str, model: str, rows: Path, work: Path) -> dict:
    """One run of one configuration: wall seconds and the tokens it wrote."""
    out = work / f"{name}-{time.monotonic_ns()}.jsonl"
    cmd = [sys.executable, "-m", "crucible.cli", "batch", str(rows), str(out), "--model", model, *CONFIGS[name]]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env({"RAY_AUTH_MODE": "disabled"}),
                          timeout=3600)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed: {proc.stderr[-2000:]}")
    tokens = sum(int(json.loads(line).get("completion_tokens") or 0) for line in out.read_text().splitlines())
    return {"seconds": round(seconds, 2), "tokens": tokens, "tok_s": round(tokens / seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--rows", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    names = list(CONFIGS)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = work / "rows.jsonl"
        rows.write_text(_rows(args.rows, args.max_tokens))
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[: rep % len(names)]:
                runs[name].append(run_config(name, args.model, rows, work))
                print(f"rep {rep + 1}: {name}: {runs[name][-1]}", flush=True)
    med = {n: statistics.median(r["tok_s"] for r in rs) for n, rs in runs.items()}
    summary = {n: {"tok_s_median": med[n], "vs_batch": round(med[n] / med["batch"], 3)} for n in names}
    for n in names:
        print(f"{n:<12} {med[n]:8.1f} output tok/s (wall)  {summary[n]['vs_batch']:.2f}x plain batch")
    from crucible.core.versions import version_matrix

    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "ray-scaling.json", json.dumps(
        {"model": args.model, "rows": args.rows, "max_tokens": args.max_tokens, "reps": args.reps,
         "runs": runs, "summary": summary, "versions": version_matrix("cpu")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
