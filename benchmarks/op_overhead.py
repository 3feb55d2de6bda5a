"""The fixed costs a fused op saves, on this machine: `python -m benchmarks.op_overhead [--runs 3]`.

Prints KernelBench.op_overhead once per run: the dispatch of one op in a graph, the parallel hand-off
every parallel CPU kernel adds to it, and one phase boundary inside a single hand-off
(common.parallel_phases). Fusing P parallel ops of a decode step into one op of P phases replaces
P - 1 times (dispatch + hand-off) by P - 1 phase boundaries; the ratio says what a fused decoder
layer can save per op before any of its work is counted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="measurements, each its own interleaved rounds")
    parser.add_argument("--target", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--out", type=Path, help="write the runs as JSON here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")

    from benchmarks.kernels import KernelBench
    from crucible.core.versions import cpu_info, describe_cpu

    bench = KernelBench(args.target)
    runs = []
    for i in range(args.runs):
        r = bench.op_overhead()
        runs.append(r)
        print(f"run {i + 1}: dispatch {r['op_dispatch_us']:.2f} us, parallel hand-off {r['parallel_handoff_us']:.2f} us, "
              f"phase boundary {r['phase_us']:.2f} us", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"target": args.target, "cpu": describe_cpu(cpu_info()),
                                        "cpu_threads": bench.threads.status, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
