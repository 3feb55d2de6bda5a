"""`crucible qualify`: a qualification record of one model on one target (JSON and Markdown).

A record says what was checked and on what: the version matrix, the kernel build's content hash, the
op conformance grid's summary, the graph's provenance (which ops are ours, which are MAX's), logits
parity against transformers, and end-to-end throughput. On a GPU, where transformers does not run,
parity reads a reference saved here (`python -m benchmarks.model_parity MODEL --save-reference F`,
then `--reference F`). Everything outside ``run`` (timings, the
date) is deterministic, so two runs on one machine give the same record except ``run``; errors are
rounded to 2 significant digits because torch's CPU reductions may differ in the last bits.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from crucible.core.atomic_write import write_text_atomic
from crucible.core.registry import DEFAULT_MODEL
from crucible.core.versions import describe_cpu

RECORD_VERSION = 1
PARITY_PROMPT = "What is the capital of France?"


@dataclass(frozen=True)
class QualifyConfig:
    """What to qualify.

    Attributes:
        model: Registry name, GGUF file or Hugging Face folder.
        target: "cpu" or "gpu".
        conformance: Run the op conformance grid (minutes); when off the record says so.
        e2e_reps: Repetitions of the batch-1 throughput measurement.
        prompt_tokens: Prefill length of the throughput measurement.
        gen_tokens: Decode length of the throughput measurement.
        dtype: The model's compute dtype (ModelOptions.dtype: auto = float32 on CPU, bfloat16 on GPU).
        reference: A saved transformers reference (benchmarks/model_parity.py) instead of running
            transformers; needed on a GPU machine without it.
    """

    model: str = DEFAULT_MODEL
    target: str = "cpu"
    conformance: bool = True
    e2e_reps: int = 3
    prompt_tokens: int = 512
    gen_tokens: int = 128
    dtype: str = "auto"
    reference: Path | None = None

    def __post_init__(self) -> None:
        if self.target not in ("cpu", "gpu"):
            raise ValueError(f"target must be cpu or gpu, got {self.target!r}")
        if self.e2e_reps < 1:
            raise ValueError("e2e_reps must be >= 1")


def _sig(x: float, digits: int = 2) -> float:
    return float(f"{x:.{digits}g}")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    for f in files:
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def conformance_summary(target: str) -> tuple[dict, float]:
    """Runs the whole conformance grid; returns its per-op summary and the seconds it took."""
    from crucible.conformance.checks import run_all
    from crucible.conformance.harness import Harness

    start = time.perf_counter()
    results = run_all(Harness(target))
    by_op: dict[str, dict] = {}
    for r in results:
        e = by_op.setdefault(f"{r.op} {r.dtype}", {"cases": 0, "passed": 0, "variants": set()})
        e["cases"] += 1
        e["passed"] += int(r.passed)
        e["variants"].add(r.variant.split(" ")[0])
    for e in by_op.values():
        e["variants"] = sorted(e["variants"])
    failed = [f"{r.op}[{r.variant}] {r.dtype} {r.shape}" for r in results if not r.passed]
    summary = {"cases": len(results), "passed": len(results) - len(failed), "failed": failed,
               "by_op": dict(sorted(by_op.items())), "reference": "float64 numpy / gguf dequantization"}
    return summary, time.perf_counter() - start


def provenance_record(model) -> dict:
    """Op counts by origin (ours or MAX's) and target, read off the compiled graph."""
    counts = Counter(f"{op.origin}:{op.name}@{op.target or '-'}" for op in model.ops)
    hot = Counter(f"{op.origin}:{op.kind}" for op in model.ops if op.kind)
    return {"ops": dict(sorted(counts.items())), "hot_path": dict(sorted(hot.items())),
            "hot_path_fallbacks": model.provenance["hot_path_fallbacks"]}


def parity_record(model, source) -> dict:
    """Logits of every position of a chat prompt against transformers (float32, CPU)."""
    import numpy as np

    from crucible.reference import Reference
    from graphs.generate import full_logits

    ref = Reference(source)
    ids = ref.chat_prompt_ids([{"role": "user", "content": PARITY_PROMPT}])
    ours, theirs = full_logits(model, ids), ref.logits(ids)
    diff = float(np.abs(ours - theirs).max())
    scale = float(np.abs(theirs).max())
    # Both sides read the same (dequantized) weights in float32; the bound covers float32 reordering
    # over a 30-layer model, scaled by the logit magnitude. A bfloat16 model gets model_parity's bf16
    # bound (5e-2 of max |logit|, 90% top-1; provisional until measured on a GPU).
    bf16 = model.options.compute_dtype == "bfloat16"
    bound, need_top1 = (5e-2 * scale, 0.9) if bf16 else (1e-3 + 1e-5 * scale, 1.0)
    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
    return {"prompt": PARITY_PROMPT, "positions": len(ids), "max_abs_logit_diff": _sig(diff),
            "max_abs_logit": _sig(scale), "bound": _sig(bound), "top1_agreement": top1,
            "passed": diff <= bound and top1 >= need_top1, "reference": "transformers float32 CPU"}


def saved_parity_record(model, reference: Path) -> dict:
    """Logits and greedy tokens against a saved transformers reference, with model_parity's bounds for
    the model's dtype (float32: 1e-4 of max |logit| and every top-1; bfloat16: 5e-2, provisional until
    measured on a GPU, and 90% of top-1)."""
    from crucible.parity_reference import compare, load_reference

    rows = load_reference(reference)
    bf16 = model.options.compute_dtype == "bfloat16"
    ratio_bound, top1 = (5e-2, 0.9) if bf16 else (1e-4, 1.0)
    passed, out = compare(model, rows, ratio_bound, top1)
    scale = max(r.max_abs for r in rows)
    return {"prompt": rows[0].prompt, "positions": sum(o["positions"] for o in out),
            "max_abs_logit_diff": _sig(max(o["max_abs_diff"] for o in out)), "max_abs_logit": _sig(scale),
            "bound": _sig(ratio_bound * scale), "top1_agreement": min(o["top1_agreement"] for o in out),
            "greedy_identical": all(o["greedy_identical"] for o in out), "prompts": len(rows),
            "passed": passed, "reference": f"saved transformers float32 logits ({reference.name}, "
                                           f"{out[0]['compared_ids']} vocab ids per position)"}


def qualify(cfg: QualifyConfig, log=print) -> dict:
    """Builds the record (see the module docstring)."""
    from crucible.core.registry import resolve_model
    from crucible.core.tokenizer import load_tokenizer
    from crucible.core.versions import version_matrix
    from graphs.model import CrucibleModel, ModelOptions
    from pipelines.throughput import batch1_engine, chat_prompt_of_length, time_batch1

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    timings: dict[str, object] = {}
    log(f"loading {cfg.model} ...")
    t = time.perf_counter()
    source = resolve_model(cfg.model)
    model = CrucibleModel(source, ModelOptions(device=cfg.target, dtype=cfg.dtype))
    timings["model_load_s"] = round(time.perf_counter() - t, 2)
    record: dict[str, object] = {
        "record_version": RECORD_VERSION,
        "model": {"name": source.name, "format": source.format, "path": str(source.path),
                  "bytes": source.size_bytes, "sha256": _file_sha256(source.path)},
        "target": cfg.target,
        "dtype": model.options.compute_dtype,
        "versions": version_matrix(cfg.target),
        "kernel_build": model.provenance["kernel_build"],
    }
    if cfg.conformance:
        log("conformance grid ...")
        record["conformance"], secs = conformance_summary(cfg.target)
        timings["conformance_s"] = round(secs, 1)
    else:
        record["conformance"] = {"skipped": "--no-conformance was given: this record qualifies no op"}
    record["provenance"] = provenance_record(model)
    log("logits parity against transformers ...")
    record["parity"] = saved_parity_record(model, cfg.reference) if cfg.reference else parity_record(model, source)
    log("batch-1 throughput ...")
    tokenizer = load_tokenizer(source)
    _, ids = chat_prompt_of_length(tokenizer, cfg.prompt_tokens)
    engine = batch1_engine(model, tokenizer, len(ids))
    time_batch1(engine, ids, 2)  # warm-up: the first execution of a shape allocates and warms caches
    samples = [time_batch1(engine, ids, cfg.gen_tokens) for _ in range(cfg.e2e_reps)]
    pre = sorted(s.prefill_tok_s for s in samples)
    dec = sorted(s.decode_tok_s for s in samples)
    record["e2e"] = {"batch": 1, "prompt_tokens": len(ids), "gen_tokens": cfg.gen_tokens, "reps": cfg.e2e_reps}
    timings["e2e"] = {"prefill_tok_s_median": round(pre[len(pre) // 2], 1),
                      "decode_tok_s_median": round(dec[len(dec) // 2], 1),
                      "prefill_tok_s": [round(x, 1) for x in pre], "decode_tok_s": [round(x, 1) for x in dec]}
    record["run"] = {"started": started, "timings": timings}
    record["qualified"] = bool(record["parity"]["passed"] and not record["provenance"]["hot_path_fallbacks"]
                               and cfg.conformance and not record["conformance"]["failed"])
    return record


def to_markdown(record: dict) -> str:
    """The record as a short human-readable report."""
    v, m = record["versions"], record["model"]
    conf = record["conformance"]
    lines = [f"# Qualification: {m['name']} on {record['target']} ({record.get('dtype', 'float32')})", "",
             f"**Qualified: {'yes' if record['qualified'] else 'NO'}**", "",
             f"- model: `{m['path']}` ({m['format']}, {m['bytes']} bytes, sha256 `{m['sha256'][:16]}...`)",
             f"- kernel build: `{record['kernel_build']}`",
             f"- versions: python {v['python']}, max {v['max']}, mojo `{v['mojo']}`, transformers "
             f"{v['transformers']}, torch {v['torch']}",
             f"- CPU: {describe_cpu(v['cpu'])}",
             ]
    if v.get("gpu"):
        lines.append(f"- GPU: {v['gpu']}")
    lines += ["", "## Op conformance"]
    if "skipped" in conf:
        lines.append(f"SKIPPED: {conf['skipped']}")
    else:
        lines.append(f"{conf['passed']}/{conf['cases']} cases passed against {conf['reference']}.")
        lines += ["", "| op dtype | cases | passed | variants |", "|---|---|---|---|"]
        for op, e in conf["by_op"].items():
            lines.append(f"| {op} | {e['cases']} | {e['passed']} | {', '.join(e['variants'])} |")
    p = record["provenance"]
    lines += ["", "## Provenance (read off the compiled graph)",
              f"Hot-path fallbacks to MAX built-ins: {p['hot_path_fallbacks'] or 'none'}", "",
              "| hot-path op | count |", "|---|---|"]
    lines += [f"| {k} | {n} |" for k, n in p["hot_path"].items()]
    par = record["parity"]
    lines += ["", "## Logits parity against transformers",
              f"{par['positions']} positions of \"{par['prompt']}\": max |diff| {par['max_abs_logit_diff']} "
              f"(bound {par['bound']}, logits up to {par['max_abs_logit']}), top-1 agreement "
              f"{par['top1_agreement']:.0%}: {'passed' if par['passed'] else 'FAILED'} (reference: {par['reference']})"]
    e2e, t = record["e2e"], record["run"]["timings"]["e2e"]
    lines += ["", "## Throughput (batch 1; varies run to run)",
              f"prefill {e2e['prompt_tokens']} tokens: {t['prefill_tok_s_median']} tok/s; decode "
              f"{e2e['gen_tokens']} tokens: {t['decode_tok_s_median']} tok/s (median of {e2e['reps']})",
              "", f"Run started {record['run']['started']}."]
    return "\n".join(lines) + "\n"


def write_record(record: dict, out_dir: Path) -> Path:
    """Writes qualification.json and qualification.md atomically; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "qualification.json"
    for target, text in ((path, json.dumps(record, indent=1, sort_keys=True, default=str)),
                         (out_dir / "qualification.md", to_markdown(record))):
        write_text_atomic(target, text)
    return path
