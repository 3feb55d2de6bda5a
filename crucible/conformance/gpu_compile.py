"""Compiles every op's GPU branch for one GPU architecture with no GPU present (virtual device mode).

Run as ``python -m crucible.conformance.gpu_compile --api cuda --arch sm_90a``: virtual-device settings
are process-wide, so each architecture gets its own process. Compiles exactly the graphs the GPU
conformance grid runs (checks.compile_all), every variant and dtype; runs nothing. The graphs compile
in `--jobs` worker processes (precompile.py; one process compiles one graph at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", choices=["cuda", "hip"], required=True)
    parser.add_argument("--arch", required=True, help="e.g. sm_90a, sm_80, gfx942")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes compiling graphs side by side (default: one per CPU)")
    args = parser.parse_args(argv)

    from crucible.conformance.precompile import VirtualGPU

    virtual = VirtualGPU(args.api, args.arch)
    virtual.activate()

    from crucible.conformance.checks import compile_all
    from crucible.conformance.harness import Harness
    from crucible.conformance.precompile import precompile

    start = time.perf_counter()
    h = Harness("gpu", compile_only=True)
    if args.jobs > 1:
        seconds = precompile(h, compile_all, args.jobs, virtual)
    else:
        compile_all(h)
        seconds = h.compile_seconds
    print(json.dumps({"api": args.api, "arch": args.arch, "graphs": sorted(seconds), "jobs": args.jobs,
                      "graph_seconds": {k: round(v, 1) for k, v in seconds.items()},
                      "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    # MAX's runtime sometimes aborts while tearing down virtual devices at interpreter exit
    # ("terminate called without an active exception", seen once in CI after every graph had
    # compiled); the result is already printed, so leave without running that teardown.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
