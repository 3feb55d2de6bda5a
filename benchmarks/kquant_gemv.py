"""Batch-1 GEMV read rates of the GGUF formats from DRAM: `python -m benchmarks.kquant_gemv`.

crucible.qmatmul at M = 1, K = N = 4096 (a Llama-3-8B projection), run as a model runs it: a chain of
distinct weight copies in one graph (kernel_graphs.GraphSet.chain), rotated through as many weight
sets as it takes to stream 4x the last-level cache sysfs reports (benchmarks/cache_size.py), so no
copy is still cached when its turn comes. The read-bandwidth probe streams a buffer of the same size
in the same interleaved rounds; each row gives its weight bytes per second and that as a share of the
probe (the target for Q4_K and Q6_K: >= 60%).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from benchmarks.cache_size import ColdSize, llc_bytes
from benchmarks.kernels import KernelBench, _per_op
from graphs.kernel_ops import Q8_ACT_QTYPES

FORMATS = ("q4_0", "q8_0", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs")


def weights(qtype: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    from crucible.conformance.matmul_checks import quantized_weights

    return quantized_weights(n, k, qtype, rng)


def run(k: int, n: int, cold: ColdSize, formats: tuple[str, ...], act: str = "f32", log=print) -> dict:
    """One chain per format, each timed against the probe over cold.cold_bytes; returns the report."""
    bench = KernelBench("cpu")
    bench.cold = cold  # the probe and the chains stream cold.cold_bytes (--llc-multiple)
    rng = np.random.default_rng(0)
    x = bench._buf(rng.standard_normal((1, k)).astype(np.float32))
    probe, probe_bytes = bench._probe_call()
    rows = []
    for qtype in formats:
        wq = weights(qtype, n, k, rng)
        ops_n, arg_sets, distinct = bench._chain_sets(x, wq)
        sets = len(arg_sets)
        chain = bench.graphs.chain("crucible", qtype, ops_n, k, wq.shape, act)
        raw = bench._time({"crucible": bench._cycle(chain, arg_sets), "probe": probe})
        probe_gbps = probe_bytes / raw.pop("probe").median / 1e9
        per_op = _per_op(raw, ops_n)["crucible"]
        gbps = wq.nbytes / per_op.median / 1e9
        row = {"qtype": qtype, "act": act if qtype in Q8_ACT_QTYPES else "f32", "M": 1, "K": k, "N": n, "ops": ops_n, "sets": sets,
               "weight_mb": round(wq.nbytes / 1e6, 2), "us_per_op": round(per_op.median * 1e6, 1),
               "read_gbps": round(gbps, 1), "probe_gbps": round(probe_gbps, 1),
               "share_of_probe": round(gbps / probe_gbps, 3)}
        rows.append(row)
        log(f"{qtype:5s} {row['us_per_op']:8.1f} us/op  {gbps:6.1f} GB/s  probe {probe_gbps:5.1f} GB/s  "
            f"{100 * gbps / probe_gbps:5.1f}% ({ops_n} ops x {sets} sets, {distinct * wq.nbytes / 1e9:.2f} GB)")
        del arg_sets
    return {"llc_bytes": cold.cache_bytes, "total_bytes": cold.cold_bytes, "cpu_threads": os.cpu_count(),
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--llc-multiple", type=int, default=4, help="bytes streamed per chain, in LLC sizes")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--act", default="f32", choices=("f32", "q8"), help="crucible.qmatmul's activation variant")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    cold = ColdSize(llc_bytes(), args.llc_multiple)
    print(f"last-level cache {cold.cache_bytes / 2**20:.0f} MiB (sysfs): {cold.cold_bytes / 1e9:.2f} GB per chain")
    report = run(args.k, args.n, cold, tuple(args.formats.split(",")), args.act)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
