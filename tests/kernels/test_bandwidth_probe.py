"""crucible.read_bandwidth, the benchmark's read-bandwidth probe: its sum must be the sum of the input,
across the 4 MB chunk boundaries it hands out to the cores (a chunk read twice or skipped would show)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def probe():
    from max.driver import CPU, Buffer
    from max.engine import InferenceSession
    from max.graph import DeviceRef

    from benchmarks.kernel_graphs import GraphSet
    from crucible.kernel_build import kernel_package

    graphs = GraphSet(InferenceSession(devices=[CPU()]), DeviceRef.CPU(), kernel_package().path, {})
    model = graphs.bandwidth()
    return lambda x: float(model.execute(Buffer.from_numpy(x))[0].to_numpy()[0])


@pytest.mark.parametrize("n", [1, 17, 64, (1 << 20) - 1, (1 << 20) + 5, 3 * (1 << 20) + 77])
def test_probe_sums_every_element_once(probe, n: int) -> None:
    # Integers 1..4 are exact in fp32 and a chunk's partial sum stays below 2^24 (1M x 4 < 16.7M):
    # only the order of the final additions differs from numpy's, so the bound is a few ulps of the total.
    x = np.random.default_rng(n).integers(1, 5, n).astype(np.float32)
    expected = float(x.astype(np.float64).sum())
    assert abs(probe(x) - expected) <= 1e-6 * expected + 1e-6
