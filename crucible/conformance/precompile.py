"""Compiles a conformance grid's graphs in parallel worker processes, into MAX's graph cache.

Compiling costs about the same for every graph, whatever it holds (seconds to tens of seconds for a
graph of one op), and one process compiles one graph at a time: threads do not help (two graphs in
two threads of one process took as long as in a row). Separate processes do, and MAX's graph cache
carries their work over: a process that compiles a graph another process already compiled loads it
from the cache in seconds.

So `precompile` asks a harness which graphs its grid builds (without building them), compiles them
in `jobs` spawned workers, and the grid's own run then loads each from the cache. The workers
inherit the environment, so MAX's cache folder (MODULAR_CACHE_DIR) is the caller's.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from crucible.conformance.harness import Harness, Target


@dataclass(frozen=True)
class VirtualGPU:
    """A virtual device (compiles GPU code with no GPU present).

    Attributes:
        api: ``cuda`` or ``hip``.
        arch: The target architecture, e.g. ``sm_90a``, ``sm_80``, ``gfx942``.
    """

    api: str
    arch: str

    def __post_init__(self) -> None:
        if self.api not in ("cuda", "hip"):
            raise ValueError(f"virtual device api must be cuda or hip, got {self.api!r}")

    def activate(self) -> None:
        """Makes this process's accelerator the virtual device (process-wide; before any session)."""
        from max import driver

        driver.set_virtual_device_api(self.api)
        driver.set_virtual_device_target_arch(self.arch)
        driver.set_virtual_device_count(1)


def graph_keys(h: Harness, build_all: Callable[[Harness], object]) -> list[str]:
    """The keys of the graphs `build_all(h)` would build, in its order, found without building any."""
    saved_only, saved_requested = h.only, h.requested
    # A fresh list: a shared harness has already been asked for graphs, in its tests' order.
    h.only, h.requested = frozenset(), []
    try:
        build_all(h)
        keys = list(h.requested)
    finally:
        h.only = saved_only
        h.requested = saved_requested + [k for k in h.requested if k not in saved_requested]
    return keys


# One harness per worker process, made by the pool's initializer (a worker's own state, not shared).
_worker: dict[str, object] = {}


def _init_worker(target: Target, virtual: VirtualGPU | None, build_all: Callable[[Harness], object]) -> None:
    if virtual is not None:
        virtual.activate()
    _worker["harness"] = Harness(target, compile_only=True, only=frozenset())
    _worker["build_all"] = build_all


def _compile_one(key: str) -> tuple[str, float, int]:
    h = _worker["harness"]
    assert isinstance(h, Harness)
    h.only = frozenset([key])
    _worker["build_all"](h)  # type: ignore[operator]
    if key not in h.compile_seconds:
        raise RuntimeError(f"graph {key!r} was not built by this worker")
    return key, h.compile_seconds[key], os.getpid()


def precompile(h: Harness, build_all: Callable[[Harness], object], jobs: int,
               virtual: VirtualGPU | None = None) -> dict[str, float]:
    """Compiles every graph `build_all(h)` builds, in `jobs` worker processes.

    Args:
        h: The caller's harness: only asked for the graph keys (its target is the workers').
        build_all: A module-level function that builds a grid's graphs on a harness
            (``checks.compile_all``); workers import it by name.
        jobs: Worker processes (at most one per graph is used).
        virtual: The virtual device the workers compile for; None for the harness's real target.

    Returns:
        Seconds each graph took in its worker, by key.
    """
    keys = graph_keys(h, build_all)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    start = time.perf_counter()
    # spawn: MAX's runtime is already up in this process, and a forked copy of it is not safe.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(keys)), mp_context=ctx, initializer=_init_worker,
                             initargs=(h.target, virtual, build_all)) as pool:
        done = {key: seconds for key, seconds, _pid in pool.map(_compile_one, keys)}
    print(f"[precompile] {len(done)} graphs in {time.perf_counter() - start:.1f} s with "
          f"{min(jobs, len(keys))} workers", flush=True)
    return done
