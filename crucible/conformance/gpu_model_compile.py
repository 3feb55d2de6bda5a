"""Compiles whole decoder graphs for one GPU architecture with no GPU present (virtual device mode).

Run as ``python -m crucible.conformance.gpu_model_compile --api cuda --arch sm_90a MODEL:DTYPE ...``.
Each MODEL (registry name, GGUF file or HF folder) is built exactly as ``crucible serve --devices gpu``
builds it (graphs.model.CrucibleModel on the accelerator, in DTYPE: float32 or bfloat16) and loaded
into a session, which compiles every kernel of the graph for the architecture; nothing runs. Prints
one JSON line: per model its compile seconds and the ops of its graph. Virtual-device settings are
process-wide, so each architecture gets its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _spec(text: str) -> tuple[str, str]:
    model, _, dtype = text.rpartition(":")
    if not model or dtype not in ("float32", "bfloat16"):
        raise argparse.ArgumentTypeError(f"expected MODEL:float32 or MODEL:bfloat16, got {text!r}")
    return model, dtype


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["cuda", "hip"], required=True)
    parser.add_argument("--arch", required=True, help="e.g. sm_90a, sm_80, gfx942")
    parser.add_argument("models", nargs="+", type=_spec, metavar="MODEL:DTYPE")
    args = parser.parse_args(argv)

    from crucible.conformance.precompile import VirtualGPU

    VirtualGPU(args.api, args.arch).activate()

    from graphs.model import CrucibleModel, ModelOptions

    report = {"api": args.api, "arch": args.arch, "models": []}
    for model, dtype in args.models:
        start = time.perf_counter()
        m = CrucibleModel(model, ModelOptions(device="gpu", dtype=dtype))
        prov = m.provenance
        report["models"].append({"model": model, "dtype": prov["dtype"], "ops": prov["ops"],
                                 "hot_path_fallbacks": prov["hot_path_fallbacks"],
                                 "kv_cache_dtype": str(m.kv_params.dtype),
                                 "seconds": round(time.perf_counter() - start, 1)})
        print(f"[gpu_model_compile] {args.arch} {model} {dtype}: {report['models'][-1]['seconds']} s",
              file=sys.stderr, flush=True)
    print(json.dumps(report), flush=True)
    # As in gpu_compile.py: MAX's runtime can abort while tearing down virtual devices at exit.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
