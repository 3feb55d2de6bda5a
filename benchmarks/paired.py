"""A paired bootstrap interval of a ratio of medians: the noise-aware verdict for interleaved reps.

A benchmark rep runs every system once, back to back, so the samples of one rep share the host's state
of that moment (these VMs drift by up to 2x within minutes). Resampling whole reps keeps that pairing:
the interval says how far the ratio of medians moves when the reps themselves are drawn again. A target
"ours / baseline >= need" is beyond the noise when the whole interval lies above `need`.

Percentile intervals from few reps come out too narrow, so none is given below MIN_PAIRS reps; the
verdict then rests on the worst-rep rule alone (benchmarks/e2e.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_PAIRS = 8         # fewer reps than this give no interval
LEVEL = 0.95          # two-sided: the lower end is the 2.5th percentile
RESAMPLES = 10_000


def ratio_interval(ours: Sequence[float], base: Sequence[float], level: float = LEVEL,
                   resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """The percentile bootstrap interval of median(ours) / median(base), resampling reps in pairs.

    Args:
        ours: Our value in each rep (higher is better, e.g. tok/s).
        base: The baseline's value in the same reps, in the same order.
        level: Two-sided coverage of the interval.
        resamples: Bootstrap draws.
        seed: The generator's seed (the interval is reproducible from the samples).

    Returns:
        (low, high), or None with fewer than MIN_PAIRS reps.

    Raises:
        ValueError: The sequences differ in length, a value is not positive, or level is not in (0, 1).
    """
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(base, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need one value per rep for both systems, got {a.shape} and {b.shape}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if (a <= 0).any() or (b <= 0).any():
        raise ValueError("every value must be positive")
    if len(a) < MIN_PAIRS:
        return None
    idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))  # [resamples, reps]
    ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [tail, 1.0 - tail])
    return float(lo), float(hi)


def pair_by_rep(ours: dict[int, float], base: dict[int, float]) -> tuple[list[float], list[float]]:
    """Both systems' values in the reps where both ran ({rep: value} each), in rep order."""
    reps = sorted(set(ours) & set(base))
    return [ours[r] for r in reps], [base[r] for r in reps]


def paired_values(samples: Sequence[object], ours: str, base: str, metric: str) -> tuple[list[float], list[float]]:
    """The metric of two systems in the reps where both ran, in rep order.

    Args:
        samples: Objects with `system`, `rep` and the metric as attributes (benchmarks.e2e.Sample).
        ours: Our system's name.
        base: The baseline's name.
        metric: The attribute to read.

    Returns:
        Our values and the baseline's, one per shared rep.
    """
    values: dict[str, dict[int, float]] = {ours: {}, base: {}}
    for s in samples:
        if s.system in values:
            values[s.system][s.rep] = float(getattr(s, metric))
    return pair_by_rep(values[ours], values[base])


def verdict_value(t: dict, unit: str = "x") -> str:
    """The value part of a printed verdict: the ratio, the worst-rep ratio, the interval where there is
    one, and which rule met the target or that the ratio is inside the noise.

    Args:
        t: A target as check_targets makes them ("value", "worst", "need", "met", and optionally
            "interval", "pairs", "met_by"; "lower" True where lower is better).
        unit: Printed after each ratio.
    """
    if t.get("value") is None:
        return "-"
    iv = t.get("interval")
    paired = f"; {LEVEL:.0%} paired interval [{iv[0]:.2f}, {iv[1]:.2f}] over {t['pairs']} reps" if iv else ""
    text = f"{t['value']:.2f}{unit} (worst rep vs best: {t['worst']:.2f}{unit}{paired})"
    if t["met"] and t.get("met_by") == "interval":
        return text + ", met by the interval"
    ahead = t["value"] <= t["need"] if t.get("lower") else t["value"] >= t["need"]
    return text + (", inside the noise" if t["met"] is False and ahead else "")
