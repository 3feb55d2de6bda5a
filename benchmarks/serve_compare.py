"""`crucible bench serve --systems ...`: the same load against Crucible, `max serve` and `llama-server`.

Each system is started on a free loopback port, loaded with benchmarks/serve_load.py at every
concurrency level, and stopped before the next one starts, so no two servers share the two cores:
  crucible   `crucible serve` on the GGUF (our kernels), --max-batch-size = the highest level
  max        `max serve` with MAX's built-in Llama pipeline on the float32 export of the same weights
             (crucible/export.py), --max-batch-size = the highest level (MAX defaults CPU to 1)
  llama.cpp  `llama-server` on the GGUF, started per level with one slot per stream (-np = level), with
             the best flags of this host's sweep (python -m benchmarks.llamacpp_sweep) where one was run
One table, serve.json and serve.png come out, with the serving targets as MET / NOT MET.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from benchmarks.serve_load import LoadResult, format_results, run_load
from crucible.core.atomic_write import write_text_atomic
from crucible.core.registry import DEFAULT_MODEL
from crucible.core.proc import free_port, wait_healthy

SERVE_SYSTEMS = ("crucible", "max", "llama.cpp")


@dataclass(frozen=True)
class ServeCompareConfig:
    """What to compare.

    Attributes:
        model: Registry name or GGUF file.
        systems: Which of SERVE_SYSTEMS.
        levels: Concurrency levels.
        max_requests: Requests per level at most (at least the level itself).
        max_seconds: Seconds per level at most.
        max_tokens: Tokens per request.
        build_llama_cpp: Build llama.cpp if it is not cached.
    """

    model: str = DEFAULT_MODEL
    systems: tuple[str, ...] = SERVE_SYSTEMS
    levels: tuple[int, ...] = (1, 4, 16, 64)
    max_requests: int = 64
    max_seconds: float = 120.0
    max_tokens: int = 128
    build_llama_cpp: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.systems) - set(SERVE_SYSTEMS)
        if unknown:
            raise ValueError(f"unknown systems {sorted(unknown)}; choose from {', '.join(SERVE_SYSTEMS)}")
        if not self.levels or min(self.levels) < 1:
            raise ValueError("levels must be positive")


@contextmanager
def _llama_server(build, gguf: Path, slots: int, log_path: Path, extra: list[str] | None = None) -> Iterator[str]:
    from benchmarks.llamacpp import llama_server_command

    port = free_port()
    cmd = llama_server_command(build, gguf, port, slots=slots, ctx_per_slot=1024, threads=os.cpu_count() or 2,
                               extra=extra)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log_path, 300)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _served_id(base_url: str) -> str:
    """The first model id the server lists (what requests must name)."""
    return httpx.get(base_url + "/v1/models", timeout=10).json()["data"][0]["id"]


def run_system(system: str, cfg: ServeCompareConfig, source, log_dir: Path, log=print) -> tuple[list[LoadResult], dict]:
    """Starts one system, runs every level, stops it; returns its results and what it ran."""
    top = max(cfg.levels)
    run = lambda url, name, levels: run_load(url, name, list(levels), cfg.max_requests, cfg.max_seconds,  # noqa: E731
                                             cfg.max_tokens)
    if system == "crucible":
        from serve.launch import start_server, stop_server

        # Prefix caching off, as for max serve below: every system computes every prompt.
        server = start_server(str(source.path), "--max-batch-size", str(top), "--max-queue", str(4 * top),
                              "--no-prefix-caching")
        try:
            # Generation responses carry the kernel build header (/v1/models does not).
            served = _served_id(server.base_url)
            probe = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
                "model": served, "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]})
            kernels = probe.headers.get("x-crucible-kernels", "")
            return run(server.base_url, served, cfg.levels), {
                "kernels": kernels, "weights": source.path.name}
        finally:
            stop_server(server)
    if system == "max":
        from crucible.export import export_hf_float32
        from crucible.max_cli import start_max_serve

        folder = export_hf_float32(source, log=log)
        server = start_max_serve(folder, log_dir / "max-serve.log", custom=False,
                                 extra=("--max-batch-size", str(top), "--no-enable-prefix-caching"))
        try:
            return run(server.base_url, _served_id(server.base_url), cfg.levels), {
                "kernels": "MAX built-in Llama pipeline", "weights": f"float32 export of {source.path.name}"}
        finally:
            server.stop()
    from benchmarks.llamacpp import build_dict, ensure_built
    from benchmarks.llamacpp_sweep import best_flags

    build = ensure_built(log=log)
    results = []
    used = {}
    for level in cfg.levels:  # one slot per stream: a server per level
        flags = best_flags(level, model=source.path.name)
        extra = flags.args() if flags is not None else None
        used[level] = " ".join(extra) if extra else "defaults (no sweep on this host)"
        with _llama_server(build, source.path, level, log_dir / f"llama-server-{level}.log", extra) as url:
            results += run(url, "default", (level,))
    return results, {"kernels": "llama.cpp", "weights": source.path.name, "build": build_dict(build),
                     "flags_per_level": used}


def check_serve_targets(results: dict[str, list[LoadResult]]) -> list[dict[str, object]]:
    """The serving targets: at 1 and 16 streams, output tok/s >= 1.0x each other system, p99 TTFT no worse."""
    targets = []
    ours = {r.concurrency: r for r in results.get("crucible", [])}
    for other in ("max", "llama.cpp"):
        theirs = {r.concurrency: r for r in results.get(other, [])}
        for level in (1, 16):
            a, b = ours.get(level), theirs.get(level)
            name = f"{level} streams vs {other}"
            if a is None or b is None:
                targets += [{"target": f"{name}: output tok/s", "met": None, "value": None},
                            {"target": f"{name}: p99 TTFT", "met": None, "value": None}]
                continue
            broken = [f"{s} had {r.errors} failed requests" if r.errors else f"{s} produced no tokens"
                      for s, r in (("crucible", a), (other, b))
                      if r.errors or not r.output_tok_per_s or r.ttft_p99_s is None]
            if broken:
                # A run with failed requests is no measurement: never a ratio of infinity called MET.
                reason = "; ".join(broken)
                targets += [{"target": f"{name}: output tok/s", "met": None, "value": None, "failed": reason},
                            {"target": f"{name}: p99 TTFT", "met": None, "value": None, "failed": reason}]
                continue
            ratio = a.output_tok_per_s / b.output_tok_per_s
            targets.append({"target": f"{name}: output tok/s >= 1.0x", "met": ratio >= 1.0, "value": ratio})
            ttft = a.ttft_p99_s / b.ttft_p99_s
            targets.append({"target": f"{name}: p99 TTFT ratio <= 1.0", "met": ttft <= 1.0, "value": ttft})
    return targets


def format_compare(results: dict[str, list[LoadResult]], targets: list[dict[str, object]]) -> str:
    parts = [format_results(system, rs).splitlines()[1:] for system, rs in results.items()]
    header = format_results("x", []).splitlines()[0]
    lines = [header] + [ln for p in parts for ln in p]
    for t in targets:
        if t.get("failed"):
            lines.append(f"FAILED   {t['target']}: {t['failed']}")
            continue
        state = "SKIPPED" if t["met"] is None else ("MET    " if t["met"] else "NOT MET")
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"{state}  {t['target']}: {value}")
    return "\n".join(lines)


def write_compare(results: dict[str, list[LoadResult]], info: dict, targets: list, versions: dict,
                  cfg: ServeCompareConfig, out_dir: Path) -> Path:
    """Writes serve.json and serve.png; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "serve.json"
    data = {"config": asdict(cfg), "versions": versions, "targets": targets,
            "systems": {s: {"results": [asdict(r) for r in rs], **info.get(s, {})} for s, rs in results.items()}}
    write_text_atomic(path, json.dumps(data, indent=1, default=str))
    plot_serve(json.loads(path.read_text()), path.with_suffix(".png"))
    return path


def plot_serve(data: dict, png: Path) -> None:
    """Output tok/s and p99 TTFT against concurrency of a serve.json (as loaded) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for system, entry in data["systems"].items():
        rs = entry["results"]
        xs = [r["concurrency"] for r in rs]
        axes[0].plot(xs, [r["output_tok_per_s"] for r in rs], marker="o", label=system)
        axes[1].plot(xs, [(r["ttft_p99_s"] or 0) * 1000 for r in rs], marker="o", label=system)
    for ax, title in zip(axes, ("output tok/s", "p99 time to first token (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"{data['config']['model']}, {data['config']['max_tokens']} tokens per request")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
