"""Ray scaling on one machine, on the same cores: `crucible batch` against `--ray` with 1 and 2 replicas,
and (`--serve`) `crucible serve` against `--ray` with 1 and 2 replicas behind Ray Serve's proxy.

    python -m benchmarks.ray_scaling --rows 48 --max-tokens 32 --reps 2 --out benchmarks/results/<dir>
    python -m benchmarks.ray_scaling --serve --levels 1,8 --max-requests 16 --max-tokens 64 --out ...

Batch: each configuration runs the same JSONL file into a fresh output, as a child process (its wall
time includes starting Ray and loading the model in every replica: what a user waits for), in an order
rotated per rep. Reported: output tok/s by wall time, and each Ray configuration's ratio to the plain
batch (its overhead when below 1).
Serve: each configuration is started, warmed up and loaded at each concurrency level by
benchmarks/serve_load.py (streaming chat requests); reported: output tok/s, TTFT and ITL per level, and
the ratio of output tok/s to the plain server's. Start-up is not counted.
On CPUs a replica's MAX runtime uses every core of the machine (26.7 takes no thread count), so 2
replicas on 2 cores share them rather than split them.
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

RAY_CONFIGS = {
    "ray-1x2cpu": ("--ray", "--replicas", "1", "--cpus-per-replica", "2"),
    "ray-2x1cpu": ("--ray", "--replicas", "2", "--cpus-per-replica", "1"),
}
CONFIGS = {"batch": (), **RAY_CONFIGS}
SERVE_CONFIGS = {"serve": (), **RAY_CONFIGS}


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


def run_serve_config(name: str, model: str, levels: list[int], max_requests: int, max_tokens: int) -> list[dict]:
    """One configuration's server, started and loaded at every level; its results per level."""
    import dataclasses

    import httpx

    from benchmarks.serve_load import run_load
    from serve.launch import start_server, stop_server

    flags = SERVE_CONFIGS[name]
    server = start_server(model, *flags, "--max-batch-size", str(max(levels)), env={"RAY_AUTH_MODE": "disabled"})
    try:
        want = int(flags[flags.index("--replicas") + 1]) if flags else None
        deadline = time.time() + 300
        def live() -> int | None:
            return httpx.get(server.base_url + "/health", timeout=30).json().get("replicas", {}).get("live")

        while want and live() != want:
            if time.time() > deadline:
                raise RuntimeError(f"{name}: the replicas did not all report")
            time.sleep(0.5)
        served = httpx.get(server.v1 + "/models", timeout=30).json()["data"][0]["id"]
        return [dataclasses.asdict(r) for r in run_load(server.base_url, served, levels, max_requests, 120.0,
                                                          max_tokens)]
    finally:
        stop_server(server)


def serve_main(args: argparse.Namespace) -> int:
    levels = [int(c) for c in args.levels.split(",")]
    names = list(SERVE_CONFIGS)
    runs: dict[str, list[list[dict]]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            runs[name].append(run_serve_config(name, args.model, levels, args.max_requests, args.max_tokens))
            print(f"rep {rep + 1}: {name}: " + ", ".join(f"c={r['concurrency']} {r['output_tok_per_s']:.1f} tok/s "
                                                         f"({r['errors']} errors)" for r in runs[name][-1]), flush=True)
    summary: dict[str, dict] = {}
    for n in names:
        summary[n] = {}
        for i, c in enumerate(levels):
            tok_s = statistics.median(rep[i]["output_tok_per_s"] for rep in runs[n])
            base = statistics.median(rep[i]["output_tok_per_s"] for rep in runs["serve"])
            itl = statistics.median(rep[i]["itl_p50_s"] or 0.0 for rep in runs[n])
            summary[n][str(c)] = {"tok_s_median": round(tok_s, 2), "vs_serve": round(tok_s / base, 3),
                                  "itl_p50_ms_median": round(itl * 1000, 1)}
            print(f"{n:<12} c={c:<3} {tok_s:8.1f} output tok/s  ITL p50 {itl * 1000:6.1f} ms  "
                  f"{tok_s / base:.2f}x plain serve")
    from crucible.core.versions import version_matrix

    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "ray-serve-scaling.json", json.dumps(
        {"model": args.model, "levels": levels, "max_requests": args.max_requests, "max_tokens": args.max_tokens,
         "reps": args.reps, "runs": runs, "summary": summary, "versions": version_matrix("cpu")}, indent=1,
        default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--rows", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument("--serve", action="store_true", help="the server's scaling instead of the batch's")
    p.add_argument("--levels", default="1,8", help="with --serve: concurrency levels")
    p.add_argument("--max-requests", type=int, default=16, help="with --serve: requests per level at most")
    args = p.parse_args(argv)
    if args.serve:
        return serve_main(args)
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
