"""One matmul or qmatmul shape on two kernel builds (and MAX's ops.matmul for fp32), in one process, interleaved.

    git archive HEAD~1 kernels | tar -x -C /tmp/old        # the kernels before a change
    .venv/bin/python -m benchmarks.matmul_ab 512 1536 1536 --rounds 8 /tmp/old/kernels kernels
    .venv/bin/python -m benchmarks.matmul_ab 1 4096 4096 --qtype q4_1 --act q8 --copies 8 /tmp/old/kernels kernels

Prints each round's medians (us) for A, B and MAX, then the medians of rounds and in how many rounds
B beat A. The op-level companion of kernel_ab.py (a whole model's decode): a kernel change is judged
where the host's drift hits both builds alike (see kernel_ab.py's docstring).

--qtype q4_0 | q4_1 | q8_0 times crucible.qmatmul on weights quantized by the gguf reference (no MAX
baseline: MAX has no op over GGUF blocks). --copies N (M = 1 only) times a chain of N ops on distinct
weight copies in one graph (the kernel benchmark's "chain" rows): each op reads its weights from
memory, one execute overhead per N ops; times are per op.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def check_weight_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rejects --qtype / --act combinations the ops do not take (exits through p.error)."""
    if args.qtype != "f32" and args.k % 32:
        p.error("GGUF block weights need k to be a multiple of 32")
    if args.act != "f32" and args.qtype == "f32":
        p.error("--act q8 needs --qtype q4_0, q4_1 or q8_0")


def random_operands(m: int, k: int, n: int, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Seeded operands for one matmul shape.

    Returns:
        x: [m, k] float32, and w: [n, k] float32 (nn.Linear layout) for qtype "f32", else the gguf
        reference quantizer's [n, k / 32 * block bytes] uint8 blocks of it.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32) / np.float32(np.sqrt(k))
    if qtype != "f32":
        from crucible.conformance.reference import quantize

        w = quantize(w, qtype)
    return x, w


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("m", type=int)
    p.add_argument("k", type=int)
    p.add_argument("n", type=int)
    p.add_argument("a", type=Path, help="kernel source folder A (before)")
    p.add_argument("b", type=Path, help="kernel source folder B (after)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block-s", type=float, default=0.15, help="seconds per system per round")
    p.add_argument("--qtype", choices=("f32", "q4_0", "q4_1", "q8_0"), default="f32",
                   help="weights: fp32 (crucible.matmul) or GGUF blocks (crucible.qmatmul)")
    p.add_argument("--act", choices=("f32", "q8"), default="f32", help="crucible.qmatmul's activation variant")
    p.add_argument("--copies", type=int, default=0, help="a chain of this many ops on distinct weights (M = 1)")
    args = p.parse_args(argv)
    if min(args.m, args.k, args.n, args.rounds) < 1:
        p.error("m, k, n and --rounds must be >= 1")
    if args.copies < 0 or (args.copies and args.m != 1):
        p.error("--copies must be >= 0, and chains are decode rows (m = 1)")
    check_weight_args(p, args)

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
    x_np, w_np = random_operands(args.m, args.k, args.n, args.qtype)
    x = Buffer.from_numpy(x_np).to(dev)
    ws = [Buffer.from_numpy(w_np.copy()).to(dev) for _ in range(max(1, args.copies))]
    inputs = [x, *ws]

    def graph(graphs: GraphSet, system: str):
        if args.copies:
            return graphs.chain(system, args.qtype, args.copies, args.k, w_np.shape, args.act)
        if args.qtype != "f32":
            return graphs.qmatmul(args.qtype, args.act)
        return graphs.matmul(system, DType.float32)

    per_op = max(1, args.copies)
    systems = {}
    for name, folder in (("A", args.a), ("B", args.b)):
        graphs = GraphSet(session, DeviceRef.CPU(), kernel_package(folder.resolve()).path, {})
        model = graph(graphs, "crucible")
        systems[name] = lambda model=model: threads.execute(lambda: model.execute(*inputs))
    if args.qtype == "f32":
        max_model = graph(graphs, "max")
        systems["max"] = lambda: threads.execute(lambda: max_model.execute(*inputs))

    per_round: dict[str, list[float]] = {s: [] for s in systems}
    what = "fp32 matmul" if args.qtype == "f32" else f"qmatmul {args.qtype} act={args.act}"
    chain = f", chains of {args.copies} copies, us per op" if args.copies else ", us per call"
    print(f"{what} M={args.m} K={args.k} N={args.n}{chain}, A={args.a} B={args.b}", flush=True)
    for r in range(args.rounds):
        t = time_interleaved(systems, block_s=args.block_s)
        for s in systems:
            per_round[s].append(t[s].median * 1e6 / per_op)
        print(r, {s: round(v[-1], 1) for s, v in per_round.items()}, flush=True)
    print("medians of rounds (us):", {s: round(float(np.median(v)), 1) for s, v in per_round.items()})
    wins = sum(b < a for a, b in zip(per_round["A"], per_round["B"]))
    print(f"B faster than A in {wins} of {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
