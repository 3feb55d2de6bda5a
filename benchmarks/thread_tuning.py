"""`crucible bench threads`: batch-1 decode with and without Crucible's CPU thread priorities.

graphs/cpu_threads.py gives MAX's runtime workers nice 19 and its execution helper SCHED_IDLE. A process
without CAP_SYS_NICE cannot take that back, so each configuration runs in its own child process, and
the children alternate (untuned, tuned, untuned, ...) so slow drifts of a shared machine hit both alike.
Each child loads the model, warms up, then runs `steps` greedy decode steps after a prompt of
`context` tokens, `sessions` times (graphs.generate.greedy_generate), and prints one JSON line: the
prefill times and every decode step's time, measured around the whole step (KV inputs, execute, argmax),
and the part of each step spent in the graph execution alone; the rest is host work (the report's
"host" column: MAX's KV cache inputs, the step's token arrays, argmax), which thread priorities and
kernels do not touch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from crucible.core.registry import DEFAULT_MODEL

CONFIGS = ("untuned", "tuned")


@dataclass(frozen=True)
class ThreadBenchConfig:
    """What to run.

    Attributes:
        model: Registry name or model path.
        context: Prompt tokens before decoding (synthetic ids).
        steps: Decode steps per session.
        sessions: Sessions per child process.
        rounds: Child processes per configuration (they alternate).
    """

    model: str = DEFAULT_MODEL
    context: int = 512
    steps: int = 64
    sessions: int = 3
    rounds: int = 3

    def __post_init__(self) -> None:
        if self.context < 1 or self.steps < 2 or self.sessions < 1 or self.rounds < 1:
            raise ValueError("need context >= 1, steps >= 2, sessions >= 1 and rounds >= 1")


def synthetic_prompt(context: int, vocab_size: int) -> list[int]:
    """[context] token ids spread over the vocabulary, the same in every decode benchmark run."""
    return ((np.arange(context, dtype=np.int64) * 7919 + 1000) % vocab_size).tolist()


def child(cfg: ThreadBenchConfig, tuned: bool) -> dict[str, object]:
    """Runs in the child process: one configuration's sessions. Returns seconds per prefill and step."""
    from graphs.generate import greedy_generate
    from graphs.model import CrucibleModel, ModelOptions

    model = CrucibleModel(cfg.model, ModelOptions(tune_threads=tuned))
    ids = synthetic_prompt(cfg.context, model.config.vocab_size)
    prefills: list[float] = []
    steps: list[float] = []
    executes: list[float] = []
    for session in range(cfg.sessions + 1):  # session 0 warms up (first executions allocate)
        times: list[float] = []
        exec_times: list[float] = []
        start = time.perf_counter()
        greedy_generate(model, [ids], cfg.steps + 1, step_times=times, execute_times=exec_times)
        if session > 0:
            prefills.append(times[0] - start)
            steps.extend(np.diff(times).tolist())
            executes.extend(exec_times[1:])  # entry 0 is the prefill's
    return {"config": "tuned" if tuned else "untuned", "cpu_threads": model.provenance["cpu_threads"],
            "prefill_s": prefills, "step_s": steps, "execute_s": executes}


def run_thread_bench(cfg: ThreadBenchConfig, log=print) -> dict[str, dict[str, object]]:
    """Alternates child processes of both configurations; returns per-configuration summaries."""
    samples: dict[str, dict[str, list]] = {c: {"prefill_s": [], "step_s": [], "execute_s": [], "cpu_threads": []}
                                           for c in CONFIGS}
    for r in range(cfg.rounds):
        for config in CONFIGS:
            log(f"round {r + 1}/{cfg.rounds}: {config} ...")
            cmd = [sys.executable, "-m", "benchmarks.thread_tuning", config, cfg.model, str(cfg.context),
                   str(cfg.steps), str(cfg.sessions)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{config} child failed ({proc.returncode}): {proc.stderr[-2000:]}")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            samples[config]["prefill_s"] += out["prefill_s"]
            samples[config]["step_s"] += out["step_s"]
            samples[config]["execute_s"] += out["execute_s"]
            samples[config]["cpu_threads"].append(out["cpu_threads"])
            log(f"  mean step {np.mean(out['step_s']) * 1e3:.2f} ms ({out['cpu_threads']})")
    return summarize(samples)


def summarize(samples: dict[str, dict[str, list]]) -> dict[str, dict[str, object]]:
    """Per-configuration step statistics (ms) from the children's raw seconds.

    Args:
        samples: config -> {"prefill_s", "step_s", "execute_s": [seconds], "cpu_threads": [str]}; step_s
            and execute_s hold the same steps in the same order.

    Returns:
        config -> decode tok/s, step mean / median / p90 / p99, the median of the graph execution and
        of the host work per step (step minus its execution), prefill median, thread settings.
    """
    summary = {}
    for config, s in samples.items():
        steps = np.asarray(s["step_s"]) * 1e3
        executes = np.asarray(s["execute_s"]) * 1e3
        if executes.shape != steps.shape:
            raise ValueError(f"{config}: {executes.size} execute times for {steps.size} steps")
        summary[config] = {
            "decode_tok_s": float(1e3 / steps.mean()), "step_ms_mean": float(steps.mean()),
            "step_ms_median": float(np.median(steps)), "step_ms_p90": float(np.percentile(steps, 90)),
            "step_ms_p99": float(np.percentile(steps, 99)), "steps": int(steps.size),
            "execute_ms_median": float(np.median(executes)), "host_ms_median": float(np.median(steps - executes)),
            "prefill_ms_median": float(np.median(s["prefill_s"]) * 1e3), "cpu_threads": sorted(set(s["cpu_threads"])),
        }
    return summary


def format_summary(cfg: ThreadBenchConfig, summary: dict[str, dict[str, object]]) -> str:
    lines = [f"{cfg.model}, batch 1, {cfg.context}-token prompt then {cfg.steps} decode steps x {cfg.sessions} "
             f"sessions x {cfg.rounds} alternating processes per configuration; step = KV inputs + execute + argmax",
             "execute, host: medians per step of the graph execution and of the rest (KV inputs, token arrays, argmax)",
             f"{'config':<10}{'decode tok/s':>14}{'mean ms':>10}{'median':>9}{'p90':>8}{'p99':>8}{'execute':>9}{'host':>7}"
             f"{'prefill ms':>12}  threads"]
    for config, s in summary.items():
        lines.append(f"{config:<10}{s['decode_tok_s']:>14.1f}{s['step_ms_mean']:>10.2f}{s['step_ms_median']:>9.2f}"
                     f"{s['step_ms_p90']:>8.2f}{s['step_ms_p99']:>8.2f}{s['execute_ms_median']:>9.2f}"
                     f"{s['host_ms_median']:>7.2f}{s['prefill_ms_median']:>12.1f}  "
                     f"{', '.join(s['cpu_threads'])}")
    ratio = summary["tuned"]["decode_tok_s"] / summary["untuned"]["decode_tok_s"]
    lines.append(f"tuned / untuned decode tok/s: {ratio:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    # Child mode: python -m benchmarks.thread_tuning {tuned|untuned} MODEL CONTEXT STEPS SESSIONS
    config, model, context, steps, sessions = sys.argv[1:6]
    if config not in CONFIGS:
        raise SystemExit(f"unknown configuration {config!r}; choose from {', '.join(CONFIGS)}")
    result = child(ThreadBenchConfig(model, int(context), int(steps), int(sessions), 1), config == "tuned")
    print(json.dumps(result))
