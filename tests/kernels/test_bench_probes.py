"""The kernel benchmark's probes, as the benchmark builds them (benchmarks/kernel_graphs.py).

crucible.read_bandwidth: its sum must be the sum of the input, across the 4 MB chunk boundaries it hands
out to the cores (a chunk read twice or skipped would show). crucible.overhead_probe chains: each op
must run, in order, and the parallel variant must run every item (x + 1 per op either way)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def graphs():
    from max.driver import CPU
    from max.engine import InferenceSession
    from max.graph import DeviceRef

    from benchmarks.kernel_graphs import GraphSet
    from crucible.core.kernel_build import kernel_package

    return GraphSet(InferenceSession(devices=[CPU()]), DeviceRef.CPU(), kernel_package().path, {})


@pytest.fixture(scope="module")
def probe(graphs):
    from max.driver import Buffer

    model = graphs.bandwidth()
    return lambda x: float(model.execute(Buffer.from_numpy(x))[0].to_numpy()[0])


@pytest.mark.parametrize("n", [1, 17, 64, (1 << 20) - 1, (1 << 20) + 5, 3 * (1 << 20) + 77])
def test_probe_sums_every_element_once(probe, n: int) -> None:
    # Integers 1..4 are exact in fp32 and a chunk's partial sum stays below 2^24 (1M x 4 < 16.7M):
    # only the order of the final additions differs from numpy's, so the bound is a few ulps of the total.
    x = np.random.default_rng(n).integers(1, 5, n).astype(np.float32)
    expected = float(x.astype(np.float64).sum())
    assert abs(probe(x) - expected) <= 1e-6 * expected + 1e-6


@pytest.mark.parametrize("parallel", [False, True])
def test_overhead_chain_runs_every_op(graphs, parallel: bool) -> None:
    from max.driver import Buffer

    model = graphs.overhead_chain(9, parallel)
    y = model.execute(Buffer.from_numpy(np.array([0.5], np.float32)))[0].to_numpy()
    assert y.tolist() == [9.5]


@pytest.mark.parametrize("phases", [2, 7])
def test_overhead_phases_run_every_item_in_phase_order(graphs, phases: int) -> None:
    """Each item of a phase copies its mark from the same item of the phase before, on whichever
    worker claims it: x + 1 per op only if every item of every phase ran after the phase before ended
    (a mark read before it was written would be 0 and lower the increment)."""
    from max.driver import Buffer

    model = graphs.overhead_chain(3, True, phases)
    for _ in range(20):  # the workers' interleaving differs from run to run
        y = model.execute(Buffer.from_numpy(np.array([0.5], np.float32)))[0].to_numpy()
        assert y.tolist() == [3.5]


def test_prebuild_compiles_only_the_accepted_graphs_and_runs_none(graphs) -> None:
    from benchmarks.kernel_graphs import GraphSet, NotRun

    graphs.bandwidth()  # loaded for real first, so the prebuild below finds it in MAX's cache
    asked: list[str] = []

    def accept(name: str) -> bool:
        asked.append(name)
        return name == "read_bandwidth"

    pre = GraphSet(graphs.session, graphs.ref, graphs.kernels, {}, prebuild=accept)
    compiled, skipped = pre.bandwidth(), pre.empty()
    assert isinstance(compiled, NotRun) and isinstance(skipped, NotRun)
    assert asked == ["read_bandwidth", "empty"]
    assert compiled.execute(np.ones(4, np.float32)) == []


@pytest.mark.parametrize("m", [1, 3])
def test_chain_runs_every_op_in_order(graphs, m: int) -> None:
    """GraphSet.chain (the chain rows, and the GPU target rows at every M): x_{i+1} = x_i @ W_i^T
    through distinct weights, cut to K columns; here N = 48 < K = 64, so the glue repeats y first."""
    from max.driver import Buffer

    rng = np.random.default_rng(m)
    k, n = 64, 48
    x = rng.standard_normal((m, k)).astype(np.float32)
    ws = [(rng.standard_normal((n, k)) / 8).astype(np.float32) for _ in range(3)]
    y = graphs.chain("crucible", "f32", 3, k, (n, k)).execute(*[Buffer.from_numpy(a) for a in (x, *ws)])[0].to_numpy()
    ref = x.astype(np.float64)
    for w in ws:
        ref = np.concatenate([ref @ w.T] * 2, axis=1)[:, :k]
    assert y.shape == (m, k)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


_CONCURRENT_SCRIPT = """
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from max.driver import CPU, Buffer
from max.engine import InferenceSession
from max.graph import DeviceRef
from benchmarks.kernel_graphs import GraphSet
from crucible.core.kernel_build import kernel_package

model = GraphSet(InferenceSession(devices=[CPU()]), DeviceRef.CPU(), kernel_package().path, {}).overhead_chain(3, True, 5)

def run(seed):
    out = []
    for i in range(100):
        x = np.array([seed + i * 0.25], np.float32)
        out.append(float(model.execute(Buffer.from_numpy(x))[0].to_numpy()[0]) - float(x[0]))
    return out

with ThreadPoolExecutor(2) as pool:
    results = list(pool.map(run, [0, 1000]))
print("increments", sorted(set(d for r in results for d in r)))
"""


def test_concurrent_graphs_hand_off_without_deadlock(graphs) -> None:
    """Two Python threads executing parallel ops at once (kernels/handoff.mojo): both graphs' bodies
    queue on the same runtime workers, so an op must not wait forever on a body stuck behind the other
    graph's, and every item of every phase must still run, in phase order (x + 1 per op). In a child
    process with a timeout, so that a deadlock fails the test instead of hanging the suite."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    graphs.overhead_chain(3, True, 5)  # compiled here, so the child finds it in MAX's cache
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    try:
        run = subprocess.run([sys.executable, "-c", _CONCURRENT_SCRIPT], capture_output=True, text=True,
                             timeout=600, cwd=repo, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("two concurrent graphs of parallel ops did not finish in 600 s (a hand-off deadlock)")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "increments [3.0]"
