"""Batch-1 GEMV read rates of the GGUF formats from DRAM: `python -m benchmarks.kquant_gemv`.

crucible.qmatmul at M = 1, K = N = 4096 (a Llama-3-8B projection), run as a model runs it: a chain of
distinct weight copies in one graph (kernel_graphs.GraphSet.chain), their total at least 4x the
last-level cache sysfs reports, so no copy is still cached when its turn comes. The read-bandwidth
probe streams a buffer of the same size in the same interleaved rounds; each row gives its weight
bytes per second and that as a share of the probe (the target for Q4_K and Q6_K: >= 60%).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np

from benchmarks.kernels import KernelBench, _per_op

FORMATS = ("q4_0", "q8_0", "q4_k", "q5_k", "q6_k")


def llc_bytes() -> int:
    """The largest cache sysfs lists for cpu0 (the last level), in bytes."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        text = (index / "size").read_text().strip() if (index / "size").is_file() else ""
        if text:
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=32 << 20)


def weights(qtype: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    from crucible.conformance.matmul_checks import quantized_weights

    return quantized_weights(n, k, qtype, rng)


def run(k: int, n: int, total_bytes: int, formats: tuple[str, ...], log=print) -> dict:
    """One chain per format, each timed against the probe over total_bytes; returns the report."""
    bench = KernelBench("cpu")
    rng = np.random.default_rng(0)
    x = bench._buf(rng.standard_normal((1, k)).astype(np.float32))
    probe_n = total_bytes // 4
    probe = bench._call(bench.graphs.bandwidth(), [bench._buf(np.ones(probe_n, np.float32))])
    rows = []
    for qtype in formats:
        wq = weights(qtype, n, k, rng)
        copies = max(2, math.ceil(total_bytes / wq.nbytes))
        bufs = [bench._buf(wq) for _ in range(copies)]
        chain = bench.graphs.chain("crucible", qtype, copies, k, wq.shape)
        raw = bench._time({"crucible": bench._call(chain, [x, *bufs]), "probe": probe})
        probe_gbps = probe_n * 4 / raw.pop("probe").median / 1e9
        per_op = _per_op(raw, copies)["crucible"]
        gbps = wq.nbytes / per_op.median / 1e9
        row = {"qtype": qtype, "M": 1, "K": k, "N": n, "copies": copies, "weight_mb": round(wq.nbytes / 1e6, 2),
               "us_per_op": round(per_op.median * 1e6, 1), "read_gbps": round(gbps, 1),
               "probe_gbps": round(probe_gbps, 1), "share_of_probe": round(gbps / probe_gbps, 3)}
        rows.append(row)
        log(f"{qtype:5s} {row['us_per_op']:8.1f} us/op  {gbps:6.1f} GB/s  probe {probe_gbps:5.1f} GB/s  "
            f"{100 * gbps / probe_gbps:5.1f}% ({copies} copies, {copies * wq.nbytes / 1e9:.2f} GB)")
        del bufs
    return {"llc_bytes": llc_bytes(), "total_bytes": total_bytes, "cpu_threads": os.cpu_count(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--llc-multiple", type=float, default=4.0, help="buffers per chain, in LLC sizes")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    llc = llc_bytes()
    total = int(args.llc_multiple * llc)
    print(f"last-level cache {llc / 2**20:.0f} MiB (sysfs): chains of {total / 1e9:.2f} GB per format")
    report = run(args.k, args.n, total, tuple(args.formats.split(",")))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
