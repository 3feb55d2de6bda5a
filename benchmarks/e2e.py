"""`crucible bench e2e`: batch-1 prefill and decode throughput of one model on three stacks, interleaved.

Systems (same model, SmolLM2-135M by default):
  crucible   our graph on the Q4_1 GGUF (blocks stay quantized), greedy, in this process: the prefill
             of the prompt is one step (prompt tokens / its time), decode is the next `gen` steps
             ((gen - 1) / their time); end-of-turn is ignored, as llama-bench does.
  max        MAX's built-in Llama pipeline on the same weights dequantized to float32, through
             `max generate --num-warmups 1`: its context-encoding and token-generation throughput (it
             stops at end-of-turn, so decode may cover fewer tokens).
  max-q4_0   the same MAX pipeline on quantized weights, as close to ours as MAX accepts: a `--pure`
             Q4_0 requantization of the GGUF (llama-quantize; MAX's GGUF loader refuses the Q8_0/Q6_K
             tensors llama.cpp's plain presets keep), `--quantization-encoding q4_0`. Where MAX fails
             the report says FAILED with MAX's own error line.
  llama.cpp  `llama-bench -p <prompt> -n <gen> -d <prompt> -fa 0,1` on the same GGUF, built from the
             llama-cpp-python sdist (benchmarks/llamacpp.py; built on request, cached): decode at the
             same context depth as ours, each test at its faster flash-attention setting.
Each repetition runs every system once, in an order shuffled per rep (seeded, recorded); the report
gives medians, min-max spread and ratios. A target is MET only beyond the noise: when it holds for our
worst rep against the baseline's best (ratio of min to max), or, from benchmarks.paired.MIN_PAIRS reps
on, when the 95% paired bootstrap interval of the ratio of medians lies wholly above it
(benchmarks/paired.py). A baseline that failed makes its targets SKIPPED. JSON and a PNG chart are
written too.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.paired import paired_values, ratio_interval, verdict_value
from crucible.core.atomic_write import write_text_atomic
from crucible.core.registry import DEFAULT_MODEL

# crucible: our default (float32 activations). crucible-q8: the same model with int8 activations in the
# decode matmuls (ModelOptions.activations="q8"), the scheme llama.cpp's CPU backend uses.
SYSTEMS = ("crucible", "crucible-q8", "max", "max-q4_0", "llama.cpp")
CRUCIBLE_SYSTEMS = {"crucible": "f32", "crucible-q8": "q8"}


@dataclass(frozen=True)
class E2EConfig:
    """What to run.

    Attributes:
        model: Registry name or GGUF path (the Q4_1 GGUF for SmolLM2).
        prompt_tokens: Prefill length (chat template included for crucible and max).
        gen_tokens: Decode length.
        reps: Repetitions of the whole interleaved round.
        systems: Which of SYSTEMS to run.
        build_llama_cpp: Build llama.cpp if it is not cached (~15 min on 2 cores).
        tune_threads: Crucible re-prioritizes MAX's CPU runtime threads (graphs/cpu_threads.py); False
            measures it with MAX's defaults. Process-wide: one setting per run.
    """

    model: str = DEFAULT_MODEL
    prompt_tokens: int = 512
    gen_tokens: int = 128
    reps: int = 3
    systems: tuple[str, ...] = SYSTEMS
    build_llama_cpp: bool = False
    tune_threads: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown:
            raise ValueError(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
        if self.prompt_tokens < 16 or self.gen_tokens < 2 or self.reps < 1:
            raise ValueError("need prompt_tokens >= 16, gen_tokens >= 2 and reps >= 1")


@dataclass(frozen=True)
class Sample:
    """One system's numbers from one repetition."""

    system: str
    rep: int
    prefill_tok_s: float
    decode_tok_s: float
    prompt_tokens: int
    gen_tokens: int


@dataclass
class E2EReport:
    config: E2EConfig
    samples: list[Sample] = field(default_factory=list)
    notes: dict[str, object] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per system: median, min and max of prefill and decode tok/s."""
        out: dict[str, dict[str, float]] = {}
        for system in self.config.systems:
            rows = [s for s in self.samples if s.system == system]
            if not rows:
                continue
            entry: dict[str, float] = {"n": len(rows)}
            for metric in ("prefill_tok_s", "decode_tok_s"):
                vals = [getattr(s, metric) for s in rows]
                entry[metric] = statistics.median(vals)
                entry[metric + "_min"] = min(vals)
                entry[metric + "_max"] = max(vals)
            entry["prompt_tokens"] = rows[0].prompt_tokens
            entry["gen_tokens"] = statistics.median(s.gen_tokens for s in rows)
            out[system] = entry
        return out


class CrucibleRunner:
    """Our model loaded once, timed through the serving engine (pipelines/throughput.py): each run is a
    fresh request, one prefill step, then gen - 1 decode steps."""

    def __init__(self, model: str, system: str = "crucible", session=None, tune_threads: bool = True,
                 prompt_tokens: int = 512) -> None:
        from crucible.core.registry import resolve_model
        from crucible.core.tokenizer import load_tokenizer
        from graphs.model import CrucibleModel, ModelOptions
        from pipelines.throughput import batch1_engine

        self.system = system
        self.source = resolve_model(model)
        options = ModelOptions(activations=CRUCIBLE_SYSTEMS[system], tune_threads=tune_threads)
        self.model = CrucibleModel(self.source, options, session=session)
        self.engine = batch1_engine(self.model, load_tokenizer(self.source), prompt_tokens)

    def warm_up(self, prompt_ids: list[int]) -> None:
        """One untimed prefill + decode: the first execution of a new shape allocates and warms
        caches (measured 380-520 tok/s prefill vs ~1080 after), as MAX's --num-warmups and
        llama-bench's own warm-up run do for the other systems."""
        self.run(prompt_ids, 2, -1)

    def run(self, prompt_ids: list[int], gen_tokens: int, rep: int) -> Sample:
        from pipelines.throughput import time_batch1

        t = time_batch1(self.engine, prompt_ids, gen_tokens)
        return Sample(self.system, rep, t.prefill_tok_s, t.decode_tok_s, t.prompt_tokens, t.generated)


def max_sample(folder: Path, text: str, gen_tokens: int, rep: int, q4_0: Path | None = None) -> Sample:
    """MAX's built-in pipeline, one `max generate` process (one warm-up run): on the float32 folder, or
    with q4_0 on that GGUF file (the folder then gives config and tokenizer)."""
    from crucible.max_cli import max_generate

    # Prefix caching off: the warm-up run would otherwise leave the prompt cached and skip its prefill.
    extra = ("--num-warmups", "1", "--no-enable-prefix-caching")
    if q4_0 is not None:
        extra += ("--quantization-encoding", "q4_0")
    r = max_generate(folder, text, gen_tokens, custom=False, weight_path=q4_0, extra=extra)
    return Sample("max" if q4_0 is None else "max-q4_0", rep, r.prefill_tok_s, r.decode_tok_s, r.prompt_tokens,
                  r.output_tokens)


def llama_cpp_sample(build, gguf: Path, prompt_tokens: int, gen_tokens: int, rep: int) -> Sample:
    from benchmarks.llamacpp import best_rows, llama_bench

    # Decode at the same depth as ours (after the prompt), at llama.cpp's faster -fa per test.
    rows = best_rows(llama_bench(build, gguf, n_prompt=prompt_tokens, n_gen=gen_tokens,
                                 threads=os.cpu_count() or 2, repetitions=1, depth=prompt_tokens))
    return Sample("llama.cpp", rep, statistics.median(rows["pp"].tok_s_samples),
                  statistics.median(rows["tg"].tok_s_samples), prompt_tokens, gen_tokens)


class BaselineError(RuntimeError):
    """A baseline system (MAX's pipeline, llama.cpp) failed to produce a sample."""


def baseline_sample(system: str, runner: object, text: str, gguf: Path, cfg: E2EConfig, rep: int) -> Sample:
    """One sample of a baseline: "max" (runner: the float32 folder), "max-q4_0" (runner: (folder, pure
    Q4_0 GGUF)) or "llama.cpp" (runner: its build).

    Raises:
        BaselineError: the baseline's process failed (the message has its error output).
    """
    from benchmarks.llamacpp import LlamaCppError
    from crucible.max_cli import MaxCliError

    try:
        if system == "max":
            return max_sample(runner, text, cfg.gen_tokens, rep)
        if system == "max-q4_0":
            folder, q4_0 = runner
            return max_sample(folder, text, cfg.gen_tokens, rep, q4_0=q4_0)
        return llama_cpp_sample(runner, gguf, cfg.prompt_tokens, cfg.gen_tokens, rep)
    except MaxCliError as exc:
        raise BaselineError(f"{max_error_line(str(exc))}\n{exc}") from exc
    except LlamaCppError as exc:
        raise BaselineError(str(exc)) from exc


def max_error_line(log: str) -> str:
    """MAX's own error from a failed `max` run's message: its last exception line ("KeyError: ...",
    "RuntimeError: Generated out-of-vocabulary token_id=..."), else the exit line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        head = ln.split(":", 1)[0]
        if head.endswith("CancelledError"):
            continue  # a server's request tasks cancelled after the error that matters
        if ln.startswith("Segmentation fault") or (head.endswith(("Error", "Exception")) and " " not in head):
            return ln[:300]
    import re

    from benchmarks.llamacpp import exit_status

    code = re.search(r" exited (-?\d+)", log)
    if code:
        return f"max exited with {exit_status(int(code.group(1)))}"
    return (lines[-1] if lines else "(no output)")[:300]


def run_e2e(cfg: E2EConfig, log=print) -> E2EReport:
    """Prepares every system, then runs cfg.reps interleaved rounds."""
    from crucible.core.registry import resolve_model
    from crucible.core.tokenizer import load_tokenizer
    from pipelines.throughput import chat_prompt_of_length

    report = E2EReport(cfg)
    source = resolve_model(cfg.model)
    if source.format != "gguf":
        raise ValueError("bench e2e compares stacks on one GGUF file (llama.cpp reads only GGUF)")
    text, ids = chat_prompt_of_length(load_tokenizer(source), cfg.prompt_tokens)
    report.notes["prompt_tokens_chat"] = len(ids)
    runners: dict[str, object] = {}
    session = None
    for system in CRUCIBLE_SYSTEMS:
        if system in cfg.systems:
            log(f"{system}: loading and compiling ...")
            runner = CrucibleRunner(cfg.model, system, session, cfg.tune_threads, len(ids))
            session = runner.model.session  # one session (one thread pool) for both variants
            runner.warm_up(ids)
            runners[system] = runner
            report.notes["crucible_kernel_build"] = runner.model.provenance["kernel_build"]
    build = None
    from benchmarks.llamacpp import LlamaCppError

    if "max" in cfg.systems or "max-q4_0" in cfg.systems:
        from crucible.export import export_hf_float32

        folder = export_hf_float32(source, log=log)
        if "max" in cfg.systems:
            runners["max"] = folder
            report.notes["max_weights"] = f"float32 export of {source.path.name} ({folder})"
    if "llama.cpp" in cfg.systems or "max-q4_0" in cfg.systems:
        from benchmarks.llamacpp import LlamaCppError, build_dict, ensure_built, is_built

        if not is_built() and not cfg.build_llama_cpp:
            log("llama.cpp: NOT BUILT, its rows are skipped; rerun with --build-llama-cpp (~15 min on 2 cores)")
            report.notes["llama.cpp"] = "skipped: not built (--build-llama-cpp builds it)"
        else:
            try:
                build = ensure_built(log=log)
                if "llama.cpp" in cfg.systems:
                    runners["llama.cpp"] = build
                report.notes["llama.cpp"] = build_dict(build)
            except LlamaCppError as exc:
                log(f"llama.cpp: BUILD FAILED, its rows are skipped: {exc}")
                report.notes["llama.cpp"] = f"build failed: {str(exc)[:500]}"
    if "max-q4_0" in cfg.systems and build is not None:
        from benchmarks.llamacpp import pure_q4_0

        try:
            pure = pure_q4_0(build, source.path)
            runners["max-q4_0"] = (folder, pure)
            report.notes["max-q4_0_weights"] = f"llama-quantize --pure Q4_0 of {source.path.name} ({pure})"
        except LlamaCppError as exc:
            log(f"max-q4_0: its Q4_0 file could not be made, its rows are skipped: {exc}")
            report.notes["max-q4_0_failed"] = f"llama-quantize --pure Q4_0 failed: {exc}"[:1000]
    elif "max-q4_0" in cfg.systems:
        report.notes["max-q4_0"] = "skipped: its Q4_0 file is made by llama.cpp's llama-quantize, not built"
    order_rng = random.Random(0)
    report.notes["order"] = []
    for rep in range(cfg.reps):
        # A fresh order each rep: no system always runs first (cold) or right after a heavy one.
        order = [s for s in cfg.systems if s in runners]
        order_rng.shuffle(order)
        report.notes["order"].append(order)
        for system in order:
            if system not in runners:
                continue
            log(f"rep {rep + 1}/{cfg.reps}: {system} ...")
            if system in CRUCIBLE_SYSTEMS:
                s = runners[system].run(ids, cfg.gen_tokens, rep)
            else:
                try:
                    s = baseline_sample(system, runners[system], text, source.path, cfg, rep)
                except BaselineError as exc:
                    # A baseline that fails drops out of every later rep, and the report says why:
                    # its targets print SKIPPED, never a ratio over the reps that did run.
                    log(f"{system}: RUN FAILED, its rows are skipped: {exc}")
                    report.notes[f"{system}_failed"] = str(exc)[:1000]
                    report.samples = [x for x in report.samples if x.system != system]
                    del runners[system]
                    continue
            report.samples.append(s)
            log(f"  prefill {s.prefill_tok_s:8.1f} tok/s   decode {s.decode_tok_s:7.1f} tok/s")
    for system in CRUCIBLE_SYSTEMS:
        if system in runners:
            report.notes[f"{system}_cpu_threads"] = runners[system].model.provenance["cpu_threads"]
    return report


def check_targets(summary: dict[str, dict[str, float]], samples: Sequence[Sample] = ()) -> list[dict[str, object]]:
    """The e2e targets: decode >= 1.0x llama.cpp, >= 4x MAX (float32) and >= 1.0x MAX on Q4_0;
    prefill >= 1.0x MAX.

    Checked for each crucible variant that ran (crucible-q8 only where it ran). "value" is the ratio
    of medians; "worst" is our worst rep over the baseline's best; "interval" is the paired bootstrap
    interval of the ratio (benchmarks/paired.py; None below MIN_PAIRS shared reps or without samples).
    MET needs worst >= need, or an interval whose low end is above need ("met_by" says which).

    Args:
        summary: E2EReport.summary().
        samples: The report's samples, for the paired interval.
    """
    targets = []
    for ours_name in CRUCIBLE_SYSTEMS:
        ours = summary.get(ours_name)
        if ours is None and ours_name != "crucible":
            continue
        for other, metric, need in (("llama.cpp", "decode_tok_s", 1.0), ("max", "decode_tok_s", 4.0),
                                    ("max", "prefill_tok_s", 1.0), ("max-q4_0", "decode_tok_s", 1.0),
                                    ("max-q4_0", "prefill_tok_s", 1.0)):
            name = f"{metric.split('_')[0]} batch 1: {ours_name} / {other} >= {need}x"
            if ours is None or other not in summary:
                targets.append({"target": name, "met": None, "value": None, "worst": None, "need": need})
                continue
            ratio = ours[metric] / summary[other][metric]
            worst = ours[metric + "_min"] / summary[other][metric + "_max"]
            a, b = paired_values(samples, ours_name, other, metric)
            interval = ratio_interval(a, b) if a else None
            met_by = "worst rep" if worst >= need else (
                "interval" if interval is not None and interval[0] > need and ratio >= need else None)
            targets.append({"target": name, "met": met_by is not None, "value": ratio, "worst": worst,
                            "interval": interval, "pairs": len(a), "met_by": met_by, "need": need})
    return targets


def format_report(report: E2EReport, targets: list[dict[str, object]]) -> str:
    s = report.summary()
    lines = [f"batch 1, prompt {report.notes.get('prompt_tokens_chat')} tokens (llama.cpp: "
             f"{report.config.prompt_tokens}), decode {report.config.gen_tokens} tokens, "
             f"{report.config.reps} interleaved reps; medians [min-max]; crucible's CPU threads: "
             f"{report.notes.get('crucible_cpu_threads', 'n/a')}",
             f"{'system':<13}{'prefill tok/s':>24}{'decode tok/s':>24}{'gen':>6}"]
    for system, e in s.items():
        lines.append(f"{system:<13}{e['prefill_tok_s']:>10.1f} [{e['prefill_tok_s_min']:.0f}-{e['prefill_tok_s_max']:.0f}]"
                     f"{'':>4}{e['decode_tok_s']:>10.1f} [{e['decode_tok_s_min']:.0f}-{e['decode_tok_s_max']:.0f}]"
                     f"{e['gen_tokens']:>6.0f}")
    for key, why in report.notes.items():
        if key.endswith("_failed"):
            first = (str(why).strip().splitlines() or ["(no message)"])[0]
            lines.append(f"FAILED   {key.removesuffix('_failed')}: {first[:300]}")
    for t in targets:
        state = "SKIPPED" if t["met"] is None else ("MET    " if t["met"] else "NOT MET")
        value = verdict_value(t)
        lines.append(f"{state}  {t['target']}: {value}")
    return "\n".join(lines)


def write_report(report: E2EReport, targets: list[dict[str, object]], versions: dict, out_dir: Path) -> Path:
    """Writes e2e.json and e2e.png under out_dir; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "e2e.json"
    data = {"config": asdict(report.config), "summary": report.summary(), "targets": targets,
            "samples": [asdict(s) for s in report.samples], "notes": report.notes, "versions": versions}
    write_text_atomic(path, json.dumps(data, indent=1, default=str))
    plot_e2e(json.loads(path.read_text()), path.with_suffix(".png"))
    return path


def plot_e2e(data: dict, png: Path) -> None:
    """Prefill and decode tok/s per system of an e2e.json (as loaded) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = data["summary"]
    systems = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, metric, title in zip(axes, ("prefill_tok_s", "decode_tok_s"), ("prefill", "decode")):
        med = [summary[s][metric] for s in systems]
        err = [[m - summary[s][metric + "_min"] for s, m in zip(systems, med)],
               [summary[s][metric + "_max"] - m for s, m in zip(systems, med)]]
        ax.bar(systems, med, yerr=err, capsize=4,
               color=["tab:orange", "tab:red", "tab:blue", "tab:purple", "tab:green"][:len(systems)])
        ax.set_title(f"{title} (tok/s, batch 1)")
    fig.suptitle(f"{data['config']['model']}: median and min-max of {data['config']['reps']} reps")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
