"""One row of ``crucible bench kernels``: an op at one shape, each system's timing and rates.

Its own module so the target checks (kernel_targets.py) and the report (kernel_report.py) read
rows without importing the benchmark's graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.timing import Timing


@dataclass
class Row:
    """One benchmarked configuration: an op at one shape, every system's timing and derived rates."""

    op: str
    model: str
    shape: dict[str, int]
    variant: str
    dtype: str
    target: str
    flops: float
    bytes: float
    times_us: dict[str, float] = field(default_factory=dict)
    spread_us: dict[str, list[float]] = field(default_factory=dict)
    rounds_us: dict[str, list[float]] = field(default_factory=dict)  # each interleaved round's median
    gflops: dict[str, float] = field(default_factory=dict)
    gbps: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)  # baseline time / crucible time (>1: we win)
    # Read bandwidth of the probe timed interleaved with this row's systems (0: not measured); the
    # ceiling for this row's "% of read bandwidth" target (see KernelBench._time_with_ceiling).
    ceiling_gbps: float = 0.0
    # Distinct copies of the weights (or KV sequences) the row rotates through, so that reads come
    # from DRAM (benchmarks/cache_size.py); 1: one buffer, read from wherever it sits.
    rotated: int = 1
    # Systems whose read rate beat the run's best probe: their bytes came from a cache, not DRAM.
    over_probe: list[str] = field(default_factory=list)

    def fill(self, timings: dict[str, Timing]) -> Row:
        for name, t in timings.items():
            self.times_us[name] = t.median * 1e6
            self.spread_us[name] = [t.p10 * 1e6, t.p90 * 1e6]
            self.rounds_us[name] = [r * 1e6 for r in t.rounds]
            self.gflops[name] = self.flops / t.median / 1e9 if self.flops else 0.0
            self.gbps[name] = self.bytes / t.median / 1e9 if self.bytes else 0.0
        ours = timings["crucible"].median
        for name, t in timings.items():
            if name != "crucible":
                self.ratios[name] = t.median / ours
        return self

    def slowest_us(self, name: str) -> float:
        """The system's slowest round (its median time where no rounds were kept)."""
        return max(self.rounds_us.get(name) or [self.times_us[name]])

    def fastest_us(self, name: str) -> float:
        """The system's fastest round (its median time where no rounds were kept)."""
        return min(self.rounds_us.get(name) or [self.times_us[name]])
