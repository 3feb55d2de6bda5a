"""Weights in 4 KB pages against weights in 2 MB transparent huge pages, one matmul build, one process, interleaved.

    .venv/bin/python -m benchmarks.hugepage_ab 4096 4096 --qtype q4_1 --act f32 --copies 8
    .venv/bin/python -m benchmarks.hugepage_ab 4096 4096 --copies 8          # fp32 crucible.matmul

The batch-1 rows stream their weights once per op, and hardware prefetchers stop at page boundaries,
so a host whose THP mode is "madvise" (no huge pages unless asked for) might read them faster from
huge pages. Both systems run the same compiled graph (crucible.matmul, or crucible.qmatmul for a GGUF
qtype) on the same weights: "plain" from numpy's own allocation, "huge" copied into anonymous memory
aligned to 2 MB and advised MADV_HUGEPAGE before it is touched (the AnonHugePages line shows whether
the kernel gave huge pages). Prints each round's medians (us per op) and the medians of rounds.
"""

from __future__ import annotations

import argparse
import mmap
from pathlib import Path

import numpy as np

from benchmarks.matmul_ab import check_weight_args, random_operands

HUGE = 2 << 20


def huge_page_copy(a: np.ndarray) -> tuple[np.ndarray, mmap.mmap]:
    """A copy of `a` in 2 MB-aligned anonymous memory advised MADV_HUGEPAGE; keep the mmap alive with it."""
    region = mmap.mmap(-1, a.nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(region, dtype=np.uint8)
    start = (-raw.ctypes.data) % HUGE
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out, region


def anon_huge_kb() -> str:
    with open("/proc/self/smaps_rollup") as f:
        return next((line.split(":")[1].strip() for line in f if line.startswith("AnonHugePages")), "?")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("k", type=int)
    p.add_argument("n", type=int)
    p.add_argument("--qtype", choices=("f32", "q4_0", "q4_1", "q8_0"), default="f32")
    p.add_argument("--act", choices=("f32", "q8"), default="f32", help="crucible.qmatmul's activation variant")
    p.add_argument("--copies", type=int, default=1, help="a chain of this many ops on distinct weights")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args(argv)
    if min(args.k, args.n, args.copies, args.rounds) < 1:
        p.error("k, n, --copies and --rounds must be >= 1")
    check_weight_args(p, args)

    from max.driver import Buffer
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
    # x: [1, K]; w: [N, K] floats, or [N, K / 32 * block bytes] uint8 GGUF blocks.
    x_np, w_np = random_operands(1, args.k, args.n, args.qtype)
    x = Buffer.from_numpy(x_np)
    huge = [huge_page_copy(w_np) for _ in range(args.copies)]
    weights = {
        "plain": [Buffer.from_numpy(w_np.copy()) for _ in range(args.copies)],
        "huge": [Buffer.from_numpy(h) for h, _ in huge],
    }
    graphs = GraphSet(session, DeviceRef.CPU(), kernel_package(Path("kernels").resolve()).path, {})
    model = graphs.chain("crucible", args.qtype, args.copies, args.k, w_np.shape, args.act)
    systems = {name: (lambda ws=ws: threads.execute(lambda: model.execute(x, *ws))) for name, ws in weights.items()}

    print(f"{args.qtype} act={args.act} M=1 K={args.k} N={args.n}, chain of {args.copies}, us per op; "
          f"AnonHugePages {anon_huge_kb()}", flush=True)
    per_round: dict[str, list[float]] = {s: [] for s in systems}
    for r in range(args.rounds):
        t = time_interleaved(systems)
        for s in systems:
            per_round[s].append(t[s].median * 1e6 / args.copies)
        print(r, {s: round(v[-1], 1) for s, v in per_round.items()}, flush=True)
    print("medians of rounds (us):", {s: round(float(np.median(v)), 1) for s, v in per_round.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
