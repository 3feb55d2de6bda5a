"""llama-server's flags swept once per host, so `bench serve` compares against llama.cpp at its best.

    python -m benchmarks.llamacpp_sweep [--model FILE] [--levels 1,16]

For each setting (flash attention on/off, threads 2/1, batch sizes -b/-ub 2048/512 (its default) and
512/128, continuous batching on/off) one llama-server per concurrency level serves a short load
(benchmarks/serve_load.py). The record, kept in llama.cpp's build cache as `server-sweep.json` and
printed, names the best setting per level by output tok/s; benchmarks/serve_compare.py starts
llama-server with it. Continuous batching off is run at 1 stream only (with several streams it
serializes them by design).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from crucible.core.atomic_write import write_text_atomic


@dataclass(frozen=True)
class ServerFlags:
    """One llama-server setting beyond the per-level slots and context."""

    flash_attn: str = "auto"
    threads: int = 2
    batch: int = 2048
    ubatch: int = 512
    cont_batching: bool = True

    def args(self) -> list[str]:
        return ["-fa", self.flash_attn, "-t", str(self.threads), "-b", str(self.batch), "-ub", str(self.ubatch),
                "--cont-batching" if self.cont_batching else "--no-cont-batching"]


def settings(cpus: int) -> list[ServerFlags]:
    """The grid: every flash-attention, batch-size and thread choice with continuous batching, plus the
    fastest-looking single-stream alternative without it."""
    grid = [ServerFlags(fa, t, b, ub) for fa in ("on", "off") for t in sorted({cpus, 1}, reverse=True)
            for b, ub in ((2048, 512), (512, 128))]
    return grid + [ServerFlags(fa, cpus, 2048, 512, cont_batching=False) for fa in ("on", "off")]


def sweep_path() -> Path:
    from benchmarks.llamacpp import default_cache_dir

    return default_cache_dir() / "server-sweep.json"


def best_flags(level: int, path: Path | None = None, model: str | None = None) -> ServerFlags | None:
    """The swept best setting for a concurrency level, or None (no sweep, or a sweep of another model).

    A level that was not swept takes the nearest swept level's (by ratio); above one stream only
    settings with continuous batching count (without it the streams wait for each other), so the
    choice is always a measured row.
    """
    p = path or sweep_path()
    if not p.is_file():
        return None
    record = json.loads(p.read_text())
    if model is not None and record.get("model") != model:
        return None
    rows = [r for r in record.get("rows", []) if r.get("errors") == 0 and (level == 1 or r["flags"]["cont_batching"])]
    if not rows:
        return None
    # Ties (4 streams between 1 and 16) go to the higher level: its load is the likelier one.
    nearest = min({r["level"] for r in rows}, key=lambda lv: (round(abs(math.log(lv / level)), 9), -lv))
    return ServerFlags(**max((r for r in rows if r["level"] == nearest), key=lambda r: r["output_tok_s"])["flags"])


def run_sweep(model: str, levels: tuple[int, ...], max_seconds: float, log=print) -> dict:
    """Runs the grid; returns the record (rows and the best setting per level)."""
    from benchmarks.llamacpp import build_dict, ensure_built, llama_server_command
    from benchmarks.serve_load import run_load
    from crucible.core.proc import free_port, wait_healthy
    from crucible.core.registry import resolve_model

    source = resolve_model(model)
    build = ensure_built(log=log)
    rows = []
    log_dir = sweep_path().parent / "sweep-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for flags in settings(os.cpu_count() or 2):
        for level in levels:
            if not flags.cont_batching and level > 1:
                continue
            port = free_port()
            cmd = llama_server_command(build, source.path, port, slots=level, ctx_per_slot=1024,
                                       threads=flags.threads, extra=flags.args())
            log_path = log_dir / f"{flags.flash_attn}-t{flags.threads}-b{flags.batch}-cb{int(flags.cont_batching)}-{level}.log"
            with log_path.open("w") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            try:
                wait_healthy(url, proc, log_path, 300)
                r = run_load(url, "default", [level], max(2 * level, 8), max_seconds, 128)[0]
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            rows.append({"flags": asdict(flags), "level": level, "output_tok_s": r.output_tok_per_s,
                         "ttft_p50_s": r.ttft_p50_s, "errors": r.errors})
            log(f"{' '.join(flags.args()):<60} {level:>3} streams  {r.output_tok_per_s:8.1f} output tok/s  "
                f"errors {r.errors}")
    best = {}
    for level in levels:
        ok = [r for r in rows if r["level"] == level and r["errors"] == 0]
        if ok:
            best[str(level)] = max(ok, key=lambda r: r["output_tok_s"])
    return {"model": source.path.name, "build": build_dict(build), "rows": rows, "best": best}


def main(argv: list[str] | None = None) -> int:
    from crucible.core.registry import DEFAULT_MODEL

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--levels", default="1,16", help="concurrency levels, comma-separated")
    p.add_argument("--max-seconds", type=float, default=20.0, help="per setting and level")
    p.add_argument("--out", type=Path, help="also write the record here")
    args = p.parse_args(argv)
    record = run_sweep(args.model, tuple(int(x) for x in args.levels.split(",")), args.max_seconds)
    text = json.dumps(record, indent=1, default=str)
    write_text_atomic(sweep_path(), text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, text)
    for level, row in record["best"].items():
        print(f"best at {level} streams: {' '.join(ServerFlags(**row['flags']).args())} "
              f"({row['output_tok_s']:.1f} output tok/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
