"""Compiles the kernel benchmark's graphs in parallel worker processes, into MAX's graph cache.

One process compiles one graph at a time, and on a GPU a graph costs tens of seconds to compile
whatever it holds, so a device call could spend its whole time compiling. The conformance grid has
the same cure (crucible/conformance/precompile.py). The benchmark builds its
graphs lazily, row by row, so here each worker runs the whole benchmark dry (KernelBench with
`prebuild`): every row is walked, the graphs whose name falls to this worker (a CRC32 of the name,
modulo the workers) are compiled, and nothing real is executed or timed. The run that follows loads
every graph from the cache, in seconds.
"""

from __future__ import annotations

import multiprocessing
import time
import zlib
from concurrent.futures import ProcessPoolExecutor

from benchmarks.kernels import KernelBench, Target


def _shard_of(name: str, shards: int) -> int:
    return zlib.crc32(name.encode()) % shards


def _prebuild_worker(target: Target, quick: bool, shard: int, shards: int,
                     targets_only: bool = False) -> tuple[int, list[str]]:
    """One worker's dry run. Returns (shard, the graph names it compiled)."""
    built: list[str] = []

    def mine(name: str) -> bool:
        if _shard_of(name, shards) == shard:
            built.append(name)
            return True
        return False

    bench = KernelBench(target, quick=quick, block_s=1e-4, prebuild=mine, targets_only=targets_only)
    bench.run(log=lambda _message: None)
    return shard, built


def precompile_bench(target: Target, quick: bool, jobs: int, log=print,
                     targets_only: bool = False) -> dict[str, object]:
    """Compiles every graph `KernelBench(target, quick).run()` uses, in `jobs` spawned workers.

    Args:
        target: ``cpu`` or ``gpu``.
        quick: The quick benchmark's rows (as the run that follows).
        jobs: Worker processes.
        targets_only: The targets-only run's rows (KernelBench targets_only).
        log: Progress lines.

    Returns:
        {"graphs": names compiled, "workers": jobs, "seconds": wall time}.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    start = time.perf_counter()
    # spawn: a forked copy of a process that already runs MAX is not safe.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        done = list(pool.map(_prebuild_worker, [target] * jobs, [quick] * jobs, range(jobs), [jobs] * jobs,
                             [targets_only] * jobs))
    names = sorted(name for _shard, built in done for name in built)
    seconds = time.perf_counter() - start
    log(f"[bench precompile] {len(names)} graphs in {seconds:.1f} s with {jobs} workers")
    return {"graphs": names, "workers": jobs, "seconds": round(seconds, 1)}
