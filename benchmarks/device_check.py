"""The GPU device check: the conformance grid, the quick kernel benchmark and whole models on a real GPU.

Run where a GPU is lent (see README): writes conformance.json, kernels.json/.png, models/models.json and
a log under the output folder, and keeps going past a failing step so one run reports everything it can.

    python3 benchmarks/device_check.py OUT [--bench-only | --conformance-only | --attention-only | --models-only
                                            | --synth-only | --sweep-only | --targets-only]

`--targets-only` runs only the rows the GPU kernel targets are judged on (KernelBench targets_only:
bf16 matmul chains at M = 1..4096 against MAX, Q4_0 / Q4_K chains in each read variant, the 4096-key
decode attention over a deep cache) and prints each target, met or not.

`--models-only` runs benchmarks/device_models.py on the folder `prepare` wrote here (build/device-models,
carried): parity of whole models in float32 and bfloat16 against transformers' references, then
`crucible serve --devices gpu` answering over HTTP. `--synth-only` writes the Llama-3-8B-shaped folder of
random bf16 weights (benchmarks/synth_model.py, 16 GB) to /tmp/synth-llama3-8b, which stays while the
machine is warm; `--sweep-only` then serves it with `crucible serve` and `max serve` at 1, 16 and 64
streams (benchmarks/serve_compare.py; it writes the folder first if it is missing).

Compiling dominates on a GPU, so the grid and the benchmark are best run as two calls; their graphs
compile in one worker process per CPU first (crucible/conformance/precompile.py,
benchmarks/bench_precompile.py). The benchmark writes the rows it has so far to kernels-partial.json
at each progress line, so a call that runs out of time still returns them.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from crucible.core.atomic_write import write_text_atomic

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks.kernel_row import Row
    from benchmarks.kernels import KernelBench


def main(out: str) -> int:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    status: dict[str, object] = {}

    def step(name, fn):
        start = time.perf_counter()
        try:
            result = fn()
            # A step that ran but reports failed cases (the conformance grid) is not ok.
            status[name] = {"ok": not (isinstance(result, dict) and result.get("failed")), "result": result}
        except Exception as exc:  # noqa: BLE001 - report and continue with the next step
            status[name] = {"ok": False, "error": repr(exc), "trace": traceback.format_exc()[-6000:]}
            print(f"[{name}] FAILED: {exc!r}", flush=True)
        status[name]["seconds"] = round(time.perf_counter() - start, 1)
        (out_dir / "status.json").write_text(json.dumps(status, indent=1, default=str))

    def versions():
        from crucible.core.versions import version_matrix

        return version_matrix("gpu")

    def conformance():
        import os

        from crucible.conformance.checks import compile_all, run_all
        from crucible.conformance.harness import Harness
        from crucible.conformance.precompile import precompile

        h = Harness("gpu")
        # The graphs compile side by side in worker processes; run_all then loads them from the cache.
        # A failed precompile is its own failed step, and the grid compiles its graphs as it goes.
        step("grid_precompile", lambda: precompile(h, compile_all, jobs=os.cpu_count() or 1))
        results = run_all(h)
        (out_dir / "conformance.json").write_text(json.dumps(
            {"results": [asdict(r) for r in results], "compile_seconds": h.compile_seconds}, indent=1))
        failed = [asdict(r) for r in results if not r.passed]
        print(f"[conformance] {len(results)} cases, {len(failed)} failed", flush=True)
        for r in failed[:40]:
            print("  FAIL", r, flush=True)
        return {"cases": len(results), "failed": len(failed)}

    def bench():
        import os

        from benchmarks.bench_precompile import precompile_bench
        from benchmarks.kernel_report import format_table, write_report
        from benchmarks.kernel_targets import check_targets
        from benchmarks.kernels import KernelBench

        # The graphs compile side by side first; the rows below load them from MAX's cache (or, if
        # that step failed, compile as they go).
        targets_only = "--targets-only" in sys.argv
        step("bench_precompile", lambda: precompile_bench("gpu", True, os.cpu_count() or 1,
                                                          targets_only=targets_only))
        b = KernelBench("gpu", quick=True, block_s=0.03, targets_only=targets_only)

        def log(message: str) -> None:
            print(message, flush=True)
            write_text_atomic(out_dir / "kernels-partial.json", json.dumps(
                {"extra": b.extra, "rows": [asdict(r) for r in b.rows]}, indent=1, default=str))

        if "--attention-only" in sys.argv:
            rows = attention_only(b, log)
        else:
            rows = b.run(log=log)
        targets = check_targets(rows, b.extra, "gpu")
        print(format_table(rows), flush=True)
        for t in targets:
            print(f"  {'MET' if t['met'] else 'NOT MET'}: {t['target']}: {t['value']:.3f} (worst {t['worst']:.3f})",
                  flush=True)
        write_report(rows, b.extra, targets, versions(), out_dir)
        return {**b.extra, "targets": targets}

    def models():
        from benchmarks.device_models import run as run_models

        status = run_models(Path("build/device-models"), out_dir / "models", "gpu", ("float32", "bfloat16"),
                            {"float32": (1e-4, 1.0), "bfloat16": (5e-2, 0.9)})
        failed = sorted(k for k, v in status.items() if not v["ok"])
        return {"steps": len(status), "failed": failed}

    def qualify_gpu():
        # `crucible qualify --target gpu` on the tiny Llama (bf16) with its carried reference; the op
        # grid has its own call (--conformance-only), so the record says it was skipped.
        from crucible.qualify import QualifyConfig, qualify, write_record

        folder = Path("build/device-models")
        cfg = QualifyConfig(model=str(folder / "tiny-llama"), target="gpu", conformance=False, e2e_reps=1,
                            prompt_tokens=128, gen_tokens=32, reference=folder / "tiny-llama.npz")
        record = qualify(cfg, log=lambda m: print(m, flush=True))
        write_record(record, out_dir / "qualify")
        return {"failed": [] if record["parity"]["passed"] else ["parity"], "parity": record["parity"]}

    synth_dir = Path("/tmp/synth-llama3-8b")

    def synth():
        from benchmarks.synth_model import SHAPES, write_synthetic

        if not (synth_dir / "model.safetensors").is_file():
            write_synthetic(synth_dir, SHAPES["llama3-8b"], "bfloat16")
        return {"folder": str(synth_dir), "bytes": (synth_dir / "model.safetensors").stat().st_size}

    def sweep():
        from benchmarks.serve_compare import (ServeCompareConfig, check_serve_targets, format_compare, run_compare,
                                              write_compare)
        from crucible.core.registry import resolve_model

        synth()
        # A call runs at most 600 s: two 16 GB loads and compiles, then 3 levels of at most 30 s each per
        # system. `--sweep-only max` or `--sweep-only crucible` runs one system, should both not fit.
        only = [a for a in sys.argv if a in ("crucible", "max")]
        cfg = ServeCompareConfig(model=str(synth_dir), systems=tuple(only) or ("crucible", "max"),
                                 levels=(1, 16, 64), max_requests=64, max_seconds=30, max_tokens=128, reps=1,
                                 device="gpu", kv_cache_gib=16.0)
        serve_dir = out_dir / "serve"
        serve_dir.mkdir(parents=True, exist_ok=True)
        results, info = run_compare(cfg, resolve_model(str(synth_dir)), serve_dir, log=lambda m: print(m, flush=True))
        targets = check_serve_targets(results, info)
        print(format_compare(results, targets), flush=True)
        write_compare(results, info, targets, versions(), cfg, serve_dir)
        return {"targets": targets, "failed": [s for s, i in info.items() if "failed" in i]}

    step("versions", versions)
    if "--synth-only" in sys.argv:
        step("synth", synth)
    elif "--sweep-only" in sys.argv:
        step("sweep", sweep)
    elif "--models-only" in sys.argv:
        step("models", models)
        step("qualify", qualify_gpu)
    else:
        if not any(f in sys.argv for f in ("--bench-only", "--attention-only", "--targets-only")):
            step("conformance", conformance)
        if "--conformance-only" not in sys.argv:
            step("bench", bench)
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "trace"} for k, v in status.items()},
                     default=str)[:3000])
    return 0 if all(v["ok"] for v in status.values()) else 1


def attention_only(b: KernelBench, log: Callable[[str], None]) -> list[Row]:
    """Only the attention rows of the benchmark: for a call with too little time for the whole run.

    Args:
        b: the GPU benchmark, probed here (its read ceiling) and given the attention rows.
        log: progress lines; each also rewrites kernels-partial.json.

    Returns:
        The rows, the Llama-3-8B decode target (4096 cached tokens) first.
    """
    from benchmarks.kernels import LLAMA3_8B, SMOLLM2

    b.probe()
    log(f"read bandwidth {b.extra['read_bandwidth_gbps']:.1f} GB/s")
    for model, new_tokens, cached in ((LLAMA3_8B, 1, 4096), (SMOLLM2, 1, 512), (SMOLLM2, 1, 4096),
                                      (SMOLLM2, 64, 0), (LLAMA3_8B, 1, 512), (SMOLLM2, 512, 0)):
        b.attention_rows(model, new_tokens, cached)
        log(f"  attention {model.name} new={new_tokens} cached={cached} done ({len(b.rows)} rows)")
    if b.skipped:
        b.extra["skipped"] = list(b.skipped)
    return b.rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "device-out"))
