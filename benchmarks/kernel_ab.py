"""Batch-1 decode of the same model on two kernel builds, in one process, in interleaved rounds.

    git archive HEAD~1 kernels | tar -x -C /tmp/old        # the kernels before a change
    .venv/bin/python -m benchmarks.kernel_ab --context 300 --rounds 12 /tmp/old/kernels kernels

This host's speed drifts by up to 1.5x between processes and for seconds at a time inside one, so the
two builds are compared where that drift hits both alike: one model per kernel folder in the same
process (MAX's runtime threads, tuned by graphs/cpu_threads.py, are shared), and rounds that alternate
A, B, A, B, ... Each round is one greedy session (graphs.generate.greedy_generate) of `steps` decode
steps after a `context`-token prompt; its score is the median step time. Both builds must generate the
same tokens first (a kernel change that alters the greedy output is not a speed change).
Run it twice with the folders swapped: a build that is faster only in the second position is not faster.
Both folders must register every op today's graph uses: a folder from before crucible.qmatmul2 or
crucible.mlp cannot build it (measure a graph change with --unfused-a or benchmarks/qmatmul2_ab.py).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from crucible.core.registry import DEFAULT_MODEL


@dataclass(frozen=True)
class ABConfig:
    """What to run.

    Attributes:
        kernels: Two kernel source folders (A, then B).
        model: Registry name or model path.
        context: Prompt tokens before decoding (synthetic ids).
        steps: Decode steps per round.
        rounds: Rounds per build; the builds alternate.
        activations: ModelOptions.activations for both builds ("q8": the int8 decode rows).
        unfused_a: Build A's graph with ModelOptions.fuse_pairs=False (a graph change, measured with
            the same kernel folder given twice).
    """

    kernels: tuple[Path, Path]
    model: str = DEFAULT_MODEL
    context: int = 300
    steps: int = 32
    rounds: int = 12
    activations: str = "f32"
    unfused_a: bool = False

    def __post_init__(self) -> None:
        if len(self.kernels) != 2:
            raise ValueError("need exactly two kernel folders (A and B)")
        if self.context < 1 or self.steps < 2 or self.rounds < 1:
            raise ValueError("need context >= 1, steps >= 2 and rounds >= 1")
        if self.activations not in ("f32", "q8"):
            raise ValueError(f"activations must be f32 or q8, got {self.activations!r}")


@dataclass(frozen=True)
class ABSummary:
    """Median step time (ms) of each round, per build, and how the rounds compare."""

    a_ms: tuple[float, ...]
    b_ms: tuple[float, ...]

    @property
    def b_wins(self) -> int:
        """Rounds in which B's median step was shorter than A's in the same round."""
        return sum(1 for a, b in zip(self.a_ms, self.b_ms) if b < a)

    @property
    def ratio(self) -> float:
        """B's median over rounds divided by A's (below 1: B is faster)."""
        return float(np.median(self.b_ms) / np.median(self.a_ms))


def summarize_rounds(a_steps: list[list[float]], b_steps: list[list[float]]) -> ABSummary:
    """Per-round medians from step times in seconds.

    Args:
        a_steps: [rounds][steps] seconds per decode step with build A.
        b_steps: The same for build B, round r run right after A's round r.

    Returns:
        The summary in milliseconds.
    """
    if len(a_steps) != len(b_steps) or not a_steps:
        raise ValueError(f"need the same, non-zero number of rounds; got {len(a_steps)} and {len(b_steps)}")
    return ABSummary(tuple(float(np.median(r)) * 1e3 for r in a_steps),
                     tuple(float(np.median(r)) * 1e3 for r in b_steps))


def format_ab(cfg: ABConfig, hashes: tuple[str, str], summary: ABSummary) -> str:
    lines = [f"{cfg.model}, activations {cfg.activations}, batch 1, {cfg.context}-token prompt, {cfg.steps} decode steps per round, "
             f"{cfg.rounds} interleaved rounds per build, one process; score = median step (ms) per round"]
    sides = (("A", cfg.kernels[0], hashes[0], summary.a_ms), ("B", cfg.kernels[1], hashes[1], summary.b_ms))
    for name, path, h, ms in sides:
        graph = ", graph without qmatmul2" if name == "A" and cfg.unfused_a else ""
        lines.append(f"{name} {path} (kernel build {h}{graph}): median {np.median(ms):.2f} ms; rounds "
                     + " ".join(f"{v:.2f}" for v in ms))
    lines.append(f"B / A step time: {summary.ratio:.3f}; B faster in {summary.b_wins} of {len(summary.a_ms)} rounds")
    return "\n".join(lines)


def run_ab(cfg: ABConfig, log=print) -> tuple[tuple[str, str], ABSummary]:
    """Loads both builds, checks they generate the same tokens, then alternates rounds.

    Returns:
        The two kernel build hashes and the summary.

    Raises:
        RuntimeError: The builds generate different tokens.
    """
    from benchmarks.thread_tuning import synthetic_prompt
    from crucible.core.kernel_build import kernel_package
    from graphs.generate import greedy_generate
    from graphs.model import CrucibleModel, ModelOptions

    opts = [ModelOptions(activations=cfg.activations, fuse_pairs=not (i == 0 and cfg.unfused_a)) for i in (0, 1)]
    models = [CrucibleModel(cfg.model, o, kernels=kernel_package(k.resolve())) for o, k in zip(opts, cfg.kernels)]
    hashes = (models[0].kernels.content_hash, models[1].kernels.content_hash)
    log(f"loaded kernel builds {hashes[0]} (A) and {hashes[1]} (B)")
    ids = synthetic_prompt(cfg.context, models[0].config.vocab_size)
    tokens = [greedy_generate(m, [ids], 8) for m in models]
    if tokens[0] != tokens[1]:
        raise RuntimeError(f"the builds generate different tokens: {tokens[0]} vs {tokens[1]}")
    steps: list[list[list[float]]] = [[], []]
    for r in range(cfg.rounds):
        for i, m in enumerate(models):
            times: list[float] = []
            greedy_generate(m, [ids], cfg.steps + 1, step_times=times)
            steps[i].append(np.diff(times).tolist())
        log(f"round {r + 1}/{cfg.rounds}: A {np.median(steps[0][-1]) * 1e3:.2f} ms, "
            f"B {np.median(steps[1][-1]) * 1e3:.2f} ms")
    return hashes, summarize_rounds(steps[0], steps[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernel_ab", description=__doc__.split("\n")[0])
    p.add_argument("kernels", nargs=2, type=Path, help="kernel folders A and B")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name or model path")
    p.add_argument("--context", type=int, default=300, help="prompt tokens before decoding")
    p.add_argument("--steps", type=int, default=32, help="decode steps per round")
    p.add_argument("--rounds", type=int, default=12, help="rounds per build (alternating)")
    p.add_argument("--activations", choices=("f32", "q8"), default="f32", help="both builds' activation mode")
    p.add_argument("--unfused-a", action="store_true",
                   help="A's graph without crucible.qmatmul2 (ModelOptions.fuse_pairs=False)")
    args = p.parse_args(argv)
    cfg = ABConfig(kernels=tuple(args.kernels), model=args.model, context=args.context, steps=args.steps,
                   rounds=args.rounds, activations=args.activations, unfused_a=args.unfused_a)
    start = time.perf_counter()
    hashes, summary = run_ab(cfg, log=lambda msg: print(msg, flush=True))
    print(format_ab(cfg, hashes, summary))
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
