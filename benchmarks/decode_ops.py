"""Per-op time of a batch-1 SmolLM2 Q4_K_M decode step's projections: `python -m benchmarks.decode_ops`.

Each row is a chain of distinct weight copies (GraphSet.chain, as many copies as the step runs of
that op, so they share the cache as the model's do), timed with float and int8 activations in
interleaved rounds; us per op includes the chain's slice between ops. The shapes and types are those
llama-quantize's Q4_K_M preset writes for SmolLM2-135M (576 is no multiple of 256, so most tensors
fall back to Q5_0).
"""

from __future__ import annotations

import argparse

import numpy as np

# (GGUF type, K, N, copies per decode step)
SMOLLM2_Q4_K_M = (("q5_0", 576, 1536, 30), ("q5_0", 576, 576, 30), ("q4_k", 1536, 576, 16),
                  ("q6_k", 1536, 576, 14), ("q8_0", 576, 49152, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    from benchmarks.kernels import KernelBench
    from benchmarks.timing import time_interleaved
    from crucible.conformance.matmul_checks import quantized_weights

    bench = KernelBench("cpu")
    rng = np.random.default_rng(0)
    for qtype, k, n, copies in SMOLLM2_Q4_K_M:
        x = bench._buf(rng.standard_normal((1, k)).astype(np.float32))  # x: [1, K]
        wq = quantized_weights(n, k, qtype, rng)  # [N, row bytes]
        bufs = [bench._buf(wq) for _ in range(copies)]
        systems = {act: bench._call(bench.graphs.chain("crucible", qtype, copies, k, wq.shape, act), [x, *bufs])
                   for act in ("f32", "q8")}
        t = time_interleaved(systems, rounds=args.rounds, block_s=0.2)
        us = {act: t[act].median / copies * 1e6 for act in systems}
        print(f"{qtype} K={k} N={n} ({wq.nbytes / 1e3:.0f} KB, {copies} copies): float act {us['f32']:7.1f} us/op, "
              f"int8 act {us['q8']:7.1f} us/op", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
