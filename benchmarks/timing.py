"""Interleaved timing of several systems on the same work, with medians and spread.

Systems take turns in rounds: each round runs every system for a short block of back-to-back calls,
in an order shuffled per round (seeded), so slow drifts of a shared noisy machine (other tenants,
clock changes) hit all systems alike and no system always runs first or after the same neighbour.
Ratios of medians are what the benchmarks report; each round's median is kept too, so a verdict can
ask that our worst round beat the baseline's best (benchmarks/kernel_targets.py). Blocks rather than single calls because some
systems leave busy threads behind them: numpy's OpenBLAS workers spin after each call and stole
half the CPU from a MAX call timed right after one (measured: 128 us alone, 251-466 us right after a
numpy matmul). A pause after each block lets them settle; the CLI also sets OPENBLAS_THREAD_TIMEOUT
low before numpy loads.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

SETTLE_S = 0.01


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one system: median and the 10th/90th percentiles, and each round's median."""

    median: float
    p10: float
    p90: float
    reps: int
    rounds: tuple[float, ...] = ()

    def scaled(self, factor: float) -> Timing:
        """Every time times factor (a chain's time per op: factor 1 / ops)."""
        return Timing(self.median * factor, self.p10 * factor, self.p90 * factor, self.reps,
                      tuple(r * factor for r in self.rounds))


def time_interleaved(
    systems: Mapping[str, Callable[[], object]],
    rounds: int = 3,
    block_s: float = 0.15,
    min_block: int = 3,
    max_block: int = 40,
    warmup: int = 2,
    seed: int = 0,
) -> dict[str, Timing]:
    """Times each callable in rounds of per-system blocks.

    Args:
        systems: Name -> zero-argument callable that runs (and finishes) one call.
        rounds: Rounds; every system runs one block per round.
        block_s: Target duration of one block.
        min_block: Calls per block at least.
        max_block: Calls per block at most.
        warmup: Untimed calls of each system before its first block.
        seed: Seeds the order of the systems in each round.

    Returns:
        Name -> Timing over all timed calls.
    """
    samples: dict[str, list[float]] = {name: [] for name in systems}
    per_round: dict[str, list[float]] = {name: [] for name in systems}
    order = list(systems)
    rng = random.Random(seed)
    warm: set[str] = set()
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            fn = systems[name]
            if name not in warm:
                warm.add(name)
                for _ in range(warmup):
                    fn()
            start = time.perf_counter()
            block: list[float] = []
            while len(block) < max_block and (len(block) < min_block or time.perf_counter() - start < block_s):
                t0 = time.perf_counter()
                fn()
                block.append(time.perf_counter() - t0)
            samples[name] += block
            per_round[name].append(float(np.median(block)))
            time.sleep(SETTLE_S)
    return {
        name: Timing(float(np.median(s)), float(np.percentile(s, 10)), float(np.percentile(s, 90)), len(s),
                     tuple(per_round[name]))
        for name, s in samples.items()
    }
