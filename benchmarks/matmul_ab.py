"""One fp32 matmul shape on two kernel builds and MAX's ops.matmul, in one process, interleaved.

    git archive HEAD~1 kernels | tar -x -C /tmp/old        # the kernels before a change
    .venv/bin/python -m benchmarks.matmul_ab 512 1536 1536 --rounds 8 /tmp/old/kernels kernels

Prints each round's medians (us) for A, B and MAX, then the medians of rounds and in how many rounds
B beat A. The op-level companion of kernel_ab.py (a whole model's decode): a kernel change is judged
where the host's drift hits both builds alike (see kernel_ab.py's docstring).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("m", type=int)
    p.add_argument("k", type=int)
    p.add_argument("n", type=int)
    p.add_argument("a", type=Path, help="kernel source folder A (before)")
    p.add_argument("b", type=Path, help="kernel source folder B (after)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block-s", type=float, default=0.15, help="seconds per system per round")
    args = p.parse_args(argv)
    if min(args.m, args.k, args.n, args.rounds) < 1:
        p.error("m, k, n and --rounds must be >= 1")

    from max.driver import Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef

    from benchmarks.kernel_graphs import GraphSet
    from benchmarks.timing import time_interleaved
    from crucible.devices import max_device
    from crucible.kernel_build import kernel_package
    from graphs.cpu_threads import CpuThreadTuner

    dev = max_device("cpu")
    session = InferenceSession(devices=[dev])
    threads = CpuThreadTuner(True)
    rng = np.random.default_rng(0)
    # x: [M, K], w: [N, K] (nn.Linear layout), float32.
    x = Buffer.from_numpy(rng.standard_normal((args.m, args.k), dtype=np.float32)).to(dev)
    w = Buffer.from_numpy(rng.standard_normal((args.n, args.k), dtype=np.float32)).to(dev)
    systems = {}
    for name, folder in (("A", args.a), ("B", args.b)):
        graphs = GraphSet(session, DeviceRef.CPU(), kernel_package(folder.resolve()).path, {})
        model = graphs.matmul("crucible", DType.float32)
        systems[name] = lambda model=model: threads.execute(lambda: model.execute(x, w))
    max_model = graphs.matmul("max", DType.float32)
    systems["max"] = lambda: threads.execute(lambda: max_model.execute(x, w))

    per_round: dict[str, list[float]] = {s: [] for s in systems}
    print(f"fp32 matmul M={args.m} K={args.k} N={args.n}, us per call, A={args.a} B={args.b}", flush=True)
    for r in range(args.rounds):
        t = time_interleaved(systems, block_s=args.block_s)
        for s in systems:
            per_round[s].append(t[s].median * 1e6)
        print(r, {s: round(v[-1], 1) for s, v in per_round.items()}, flush=True)
    print("medians of rounds (us):", {s: round(float(np.median(v)), 1) for s, v in per_round.items()})
    wins = sum(b < a for a, b in zip(per_round["A"], per_round["B"]))
    print(f"B faster than A in {wins} of {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
