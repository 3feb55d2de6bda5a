"""`crucible bench serve --systems ...`: the same load against Crucible, `max serve` and `llama-server`.

Each system is started on a free loopback port, loaded with benchmarks/serve_load.py at every
concurrency level, and stopped before the next one starts, so no two servers share the two cores:
  crucible   `crucible serve` on the GGUF (our kernels), --max-batch-size = the highest level
  max        `max serve` with MAX's built-in Llama pipeline on the float32 export of the same weights
             (crucible/export.py), --max-batch-size = the highest level (MAX defaults CPU to 1)
  max-q4_0   the same `max serve` on a `llama-quantize --pure` Q4_0 of the GGUF (MAX's loader rejects
             the Q8_0 tensors of the plain preset), --quantization-encoding q4_0
  llama.cpp  `llama-server` on the GGUF, started per level with one slot per stream (-np = level), with
             the best flags of this host's sweep (python -m benchmarks.llamacpp_sweep) where one was run
On a GPU (`device="gpu"`) with a Hugging Face folder (e.g. benchmarks/synth_model.py's Llama-3-8B shape):
  crucible   `crucible serve --devices gpu` on the folder (bf16: the GPU default)
  max        `max serve --devices gpu` on the same folder (its default encoding, bf16)
Every system runs `reps` times, in an order shuffled per rep (seeded, recorded). A target is MET only
when it holds for our worst rep against the baseline's best, or, from paired.MIN_PAIRS reps on, when
the paired bootstrap interval of the ratio lies on its side (benchmarks/paired.py); a system whose
server fails to start or whose requests fail drops out of later reps and its targets print FAILED
with its own error line.
One table, serve.json and serve.png come out.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from benchmarks.paired import pair_by_rep, ratio_interval, verdict_value
from benchmarks.serve_load import LoadResult, format_results, run_load
from crucible.core.atomic_write import write_text_atomic
from crucible.core.registry import DEFAULT_MODEL
from crucible.core.proc import free_port, wait_healthy

SERVE_SYSTEMS = ("crucible", "max", "max-q4_0", "llama.cpp")
BASELINES = ("max", "max-q4_0", "llama.cpp")
# Output tok/s needed against each baseline at a level, 1.0x unless listed: #56 asks one HTTP stream
# at 1.1x llama-server's.
TOK_NEED = {("llama.cpp", 1): 1.1}


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
        reps: Runs of every system (each starts its server afresh).
        seed: Seeds the order of the systems in each rep.
        device: "cpu" or "gpu" (crucible and max only).
        kv_cache_gib: Crucible's KV cache (an 8B model at 64 streams needs several GiB).
    """

    model: str = DEFAULT_MODEL
    systems: tuple[str, ...] = SERVE_SYSTEMS
    levels: tuple[int, ...] = (1, 4, 16, 64)
    max_requests: int = 64
    max_seconds: float = 120.0
    max_tokens: int = 128
    build_llama_cpp: bool = False
    reps: int = 3
    seed: int = 0
    device: str = "cpu"
    kv_cache_gib: float = 1.0

    def __post_init__(self) -> None:
        unknown = set(self.systems) - set(SERVE_SYSTEMS)
        if unknown:
            raise ValueError(f"unknown systems {sorted(unknown)}; choose from {', '.join(SERVE_SYSTEMS)}")
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"device must be cpu or gpu, got {self.device!r}")
        if self.device == "gpu" and set(self.systems) - {"crucible", "max"}:
            raise ValueError("on a GPU the systems are crucible and max (llama.cpp here is a CPU build)")
        if not self.levels or min(self.levels) < 1:
            raise ValueError("levels must be positive")
        if self.reps < 1:
            raise ValueError(f"reps must be >= 1, got {self.reps}")


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


class ServeFailed(RuntimeError):
    """A system's server did not start; the message is its own error line."""


def run_system(system: str, cfg: ServeCompareConfig, source, log_dir: Path, rep: int = 0,
               log=print) -> tuple[list[LoadResult], dict]:
    """Starts one system, runs every level, stops it; returns its results and what it ran.

    Raises:
        ServeFailed: the server did not start (MAX's own error line in the message).
    """
    top = max(cfg.levels)
    run = lambda url, name, levels: run_load(url, name, list(levels), cfg.max_requests, cfg.max_seconds,  # noqa: E731
                                             cfg.max_tokens, rep=rep)
    if system == "crucible":
        from serve.launch import start_server, stop_server

        # Prefix caching off, as for max serve below: every system computes every prompt.
        server = start_server(str(source.path), "--max-batch-size", str(top), "--max-queue", str(4 * top),
                              "--no-prefix-caching", "--devices", cfg.device, "--kv-cache-gib", str(cfg.kv_cache_gib))
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
    if system in ("max", "max-q4_0"):
        return _run_max(system, cfg, source, log_dir / f"{system}-serve-rep{rep}.log", run, log)
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


def _run_max(system: str, cfg: ServeCompareConfig, source, log_path: Path, run, log) -> tuple[list[LoadResult], dict]:
    """`max serve` on the float32 export ("max") or on a pure Q4_0 requantization ("max-q4_0")."""
    from benchmarks.e2e import max_error_line
    from crucible.export import export_hf_float32
    from crucible.max_cli import MaxCliError, start_max_serve

    extra: tuple[str, ...] = ("--max-batch-size", str(max(cfg.levels)), "--no-enable-prefix-caching")
    if source.format == "hf":  # the folder as it is, in MAX's default encoding for it on the device
        folder = source.path
        info = {"kernels": "MAX built-in Llama pipeline", "weights": f"{source.path.name} as stored"}
    else:
        folder = export_hf_float32(source, log=log)
        info = {"kernels": "MAX built-in Llama pipeline", "weights": f"float32 export of {source.path.name}"}
    if system == "max-q4_0":
        from benchmarks.llamacpp import ensure_built, pure_q4_0

        q4_0 = pure_q4_0(ensure_built(log=log), source.path)
        extra += ("--weight-path", str(q4_0), "--quantization-encoding", "q4_0")
        info["weights"] = f"llama-quantize --pure Q4_0 of {source.path.name} ({q4_0.name})"
    try:
        server = start_max_serve(folder, log_path, custom=False, extra=extra, devices=cfg.device)
    except MaxCliError as exc:
        raise ServeFailed(max_error_line(log_path.read_text() if log_path.is_file() else str(exc))) from exc
    try:
        results = run(server.base_url, _served_id(server.base_url), cfg.levels)
    finally:
        server.stop()
    if any(r.errors for r in results):
        info["server_error"] = max_error_line(log_path.read_text())
    return results, info


def run_compare(cfg: ServeCompareConfig, source, out_dir: Path, log=print) -> tuple[dict[str, list[LoadResult]], dict]:
    """cfg.reps rounds of every system in a shuffled order; a failing system drops out of later reps.

    Returns:
        ({system: its results over all reps and levels}, {system: what it ran, and why it failed}).
    """
    results: dict[str, list[LoadResult]] = {s: [] for s in cfg.systems}
    info: dict[str, dict] = {s: {} for s in cfg.systems}
    live = list(cfg.systems)
    order_rng = random.Random(cfg.seed)
    orders = []
    for rep in range(cfg.reps):
        order = list(live)
        order_rng.shuffle(order)
        orders.append(order)
        for system in order:
            log(f"rep {rep + 1}/{cfg.reps}: {system}: starting and loading ...")
            try:
                rs, ran = run_system(system, cfg, source, out_dir, rep, log=log)
            except ServeFailed as exc:
                rs, ran = [], {"failed": str(exc)}
            results[system] += rs
            info[system].update(ran)
            errors = [r for r in rs if r.errors]
            if errors and "failed" not in ran:
                first = errors[0]
                info[system]["failed"] = (f"{first.errors} of {first.requests} requests failed at {first.concurrency} "
                                          f"streams: {ran.get('server_error') or first.first_error}")
            if "failed" in info[system]:
                log(f"{system}: FAILED, dropped from later reps: {info[system]['failed']}")
                live.remove(system)
    for system in cfg.systems:
        info[system]["order"] = orders
    return results, info


def summarize(results: dict[str, list[LoadResult]]) -> dict[str, dict[int, dict[str, float | int | None]]]:
    """Per system and level over the reps: output tok/s and p99 TTFT as median, min and max, and errors."""
    out: dict[str, dict[int, dict[str, float | int | None]]] = {}
    for system, rs in results.items():
        for level in sorted({r.concurrency for r in rs}):
            at = [r for r in rs if r.concurrency == level]
            tok = [r.output_tok_per_s for r in at]
            ttft = [r.ttft_p99_s for r in at if r.ttft_p99_s is not None]
            out.setdefault(system, {})[level] = {
                "reps": len(at), "errors": sum(r.errors for r in at),
                "tok_s": statistics.median(tok), "tok_s_min": min(tok), "tok_s_max": max(tok),
                "ttft_p99_s": statistics.median(ttft) if ttft else None,
                "ttft_p99_s_min": min(ttft, default=None), "ttft_p99_s_max": max(ttft, default=None)}
    return out


def check_serve_targets(results: dict[str, list[LoadResult]], info: dict | None = None) -> list[dict[str, object]]:
    """The serving targets: at 1 and 16 streams, output tok/s >= 1.0x each baseline (TOK_NEED's ratio
    where it lists one) and p99 TTFT no worse.

    value: the ratio of medians over the reps. MET only when our worst rep beats the baseline's best
    (tok/s: our min over their max; TTFT: our max over their min), or, from paired.MIN_PAIRS reps on,
    when the paired bootstrap interval of the ratio lies wholly on the target's side ("met_by" says
    which). A system that failed, or any rep with a failed request, makes the target FAILED (met None),
    never a ratio.
    """
    info = info or {}
    summary = summarize(results)
    targets = []
    ours = summary.get("crucible", {})
    for other in BASELINES:
        if other not in results:
            continue
        theirs = summary.get(other, {})
        for level in (1, 16):
            a, b = ours.get(level), theirs.get(level)
            name = f"{level} streams vs {other}"
            broken = [f"{s}: {info[s]['failed']}" for s in ("crucible", other) if info.get(s, {}).get("failed")]
            broken += [f"{s} had {r['errors']} failed requests" if r["errors"] else f"{s} produced no tokens"
                       for s, r in (("crucible", a), (other, b))
                       if r is not None and (r["errors"] or not r["tok_s_min"] or r["ttft_p99_s"] is None)]
            if broken or a is None or b is None:
                # A run with failed requests is no measurement: never a ratio of infinity called MET.
                reason = "; ".join(broken) if broken else None
                for metric in ("output tok/s", "p99 TTFT"):
                    t = {"target": f"{name}: {metric}", "met": None, "value": None}
                    if reason:
                        t["failed"] = reason
                    targets.append(t)
                continue
            per_rep = {s: [r for r in results[s] if r.concurrency == level] for s in ("crucible", other)}
            tok = pair_by_rep(*({r.rep: r.output_tok_per_s for r in per_rep[s]} for s in ("crucible", other)))
            ttft = pair_by_rep(*({r.rep: r.ttft_p99_s for r in per_rep[s] if r.ttft_p99_s is not None}
                                 for s in ("crucible", other)))
            need = TOK_NEED.get((other, level), 1.0)
            tok_iv = ratio_interval(*tok) if tok[0] else None
            ttft_iv = ratio_interval(*ttft) if ttft[0] else None  # lower is better: met below 1.0
            for t, worst_met, iv_met in (
                ({"target": f"{name}: output tok/s >= {need:.1f}x", "value": a["tok_s"] / b["tok_s"],
                  "worst": a["tok_s_min"] / b["tok_s_max"], "interval": tok_iv, "pairs": len(tok[0]), "need": need},
                 lambda t: t["worst"] >= t["need"], lambda t: t["interval"][0] > t["need"] and t["value"] >= t["need"]),
                ({"target": f"{name}: p99 TTFT ratio <= 1.0", "value": a["ttft_p99_s"] / b["ttft_p99_s"],
                  "worst": a["ttft_p99_s_max"] / b["ttft_p99_s_min"], "interval": ttft_iv, "pairs": len(ttft[0]),
                  "need": 1.0, "lower": True},
                 lambda t: t["worst"] <= 1.0, lambda t: t["interval"][1] < 1.0 and t["value"] <= 1.0),
            ):
                t["met_by"] = "worst rep" if worst_met(t) else (
                    "interval" if t["interval"] is not None and iv_met(t) else None)
                t["met"] = t["met_by"] is not None
                targets.append(t)
    return targets


def format_compare(results: dict[str, list[LoadResult]], targets: list[dict[str, object]]) -> str:
    """Every rep's rows, then the medians over the reps with their range, then the verdicts."""
    parts = [format_results(system, rs).splitlines()[1:] for system, rs in results.items()]
    header = format_results("x", []).splitlines()[0]
    lines = [header] + [ln for p in parts for ln in p]
    ms = lambda v: "-" if v is None else f"{v * 1000:.0f}"  # noqa: E731
    lines.append("medians over reps: out tok/s [min-max], p99 TTFT ms [min-max]")
    for system, levels in summarize(results).items():
        for level, r in levels.items():
            lines.append(f"  {system:<12}{level:>4} streams  {r['tok_s']:8.1f} [{r['tok_s_min']:.1f}-{r['tok_s_max']:.1f}]"
                         f"  {ms(r['ttft_p99_s'])} [{ms(r['ttft_p99_s_min'])}-{ms(r['ttft_p99_s_max'])}]"
                         f"  ({r['reps']} reps{', %d errors' % r['errors'] if r['errors'] else ''})")
    for t in targets:
        if t.get("failed"):
            lines.append(f"FAILED   {t['target']}: {t['failed']}")
            continue
        state = "SKIPPED" if t["met"] is None else ("MET    " if t["met"] else "NOT MET")
        value = verdict_value(t, unit="")
        lines.append(f"{state}  {t['target']}: {value}")
    return "\n".join(lines)


def write_compare(results: dict[str, list[LoadResult]], info: dict, targets: list, versions: dict,
                  cfg: ServeCompareConfig, out_dir: Path) -> Path:
    """Writes serve.json and serve.png; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "serve.json"
    data = {"config": asdict(cfg), "versions": versions, "targets": targets,
            "summary": {s: {str(level): v for level, v in levels.items()} for s, levels in summarize(results).items()},
            "systems": {s: {"results": [asdict(r) for r in rs], **info.get(s, {})} for s, rs in results.items()}}
    write_text_atomic(path, json.dumps(data, indent=1, default=str))
    try:
        plot_serve(json.loads(path.read_text()), path.with_suffix(".png"))
    except ImportError as exc:  # the GPU machine's image may lack matplotlib: the JSON is the record
        print(f"serve.png not drawn: {exc}")
    return path


def plot_serve(data: dict, png: Path) -> None:
    """Output tok/s and p99 TTFT against concurrency of a serve.json (as loaded) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for system, entry in data["systems"].items():
        if "summary" in data:  # medians over the reps
            levels = data["summary"].get(system, {})
            xs = [int(lv) for lv in levels]
            tok = [v["tok_s"] for v in levels.values()]
            ttft = [v["ttft_p99_s"] for v in levels.values()]
        else:  # one rep (records before reps)
            xs = [r["concurrency"] for r in entry["results"]]
            tok = [r["output_tok_per_s"] for r in entry["results"]]
            ttft = [r["ttft_p99_s"] for r in entry["results"]]
        axes[0].plot(xs, tok, marker="o", label=system)
        axes[1].plot(xs, [(v or 0) * 1000 for v in ttft], marker="o", label=system)
    for ax, title in zip(axes, ("output tok/s", "p99 time to first token (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"{data['config']['model']}, {data['config']['max_tokens']} tokens per request")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
