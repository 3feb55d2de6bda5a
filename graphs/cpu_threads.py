"""Scheduling priorities for MAX's CPU runtime threads, so they cannot hold up the thread that drives a step.

MAX's two runtime workers busy-wait after each graph, so the Python thread woken with a step's result
could wait a whole scheduler tick for a core; and a libmax helper wakes every 100-200 us during an
execution, preempting a worker that runs a kernel. Once both kinds of thread have been seen:
- the workers get nice 19, so a woken Python thread (nice 0) takes a core from their busy-wait at once;
- the helper gets SCHED_IDLE: it runs only when a core is otherwise idle.
Threads are found by what they are and do (workers by name; the helper as a non-Python, non-worker
thread that wakes at least twice per millisecond of an execution using little CPU per wake), not by
creation order. Both settings are process-wide and a non-root process cannot undo them. Linux only;
elsewhere, or with `ModelOptions(tune_threads=False)`, nothing changes and the status says so.
The investigation (traces, A/B numbers, the busy-wait and affinity settings tried) is docs/cpu-threads.md;
`crucible bench threads` measures the effect.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

WORKER_PREFIX = "\U0001f525"  # MAX/Mojo runtime threads are named "🔥 Thread<N>"
WORKER_NICE = 19
# The helper wakes every 100-200 us while a graph runs; at 2 wakes per ms a quiet thread (tokenizer
# pools, BLAS, MAX's signal poller at 256 ms) never qualifies.
HELPER_MIN_WAKES_PER_MS = 2.0
HELPER_MAX_CPU_PER_WAKE_NS = 100_000
MIN_PROBE_MS = 1.0
MAX_PROBES = 16  # executions sampled at most, until the helper is found


@dataclass(frozen=True)
class ThreadSample:
    """One thread's counters. cpu_ns: time on a CPU; wakes: voluntary context switches."""

    name: str
    cpu_ns: int
    wakes: int


def _task_dir() -> str:
    return f"/proc/{os.getpid()}/task"


def sample_threads() -> dict[int, ThreadSample]:
    """Counters of every thread of this process (threads that exit while being read are skipped)."""
    out: dict[int, ThreadSample] = {}
    for entry in os.listdir(_task_dir()):
        base = f"{_task_dir()}/{entry}"
        try:
            with open(f"{base}/comm", encoding="utf-8", errors="replace") as f:
                name = f.read().strip()
            with open(f"{base}/schedstat") as f:
                cpu_ns = int(f.read().split()[0])
            with open(f"{base}/status") as f:
                wakes = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, ValueError, StopIteration):
            continue
        out[int(entry)] = ThreadSample(name, cpu_ns, wakes)
    return out


def find_helpers(before: dict[int, ThreadSample], after: dict[int, ThreadSample], elapsed_ms: float,
                 python_tids: set[int]) -> list[int]:
    """Threads that behaved like MAX's execution helper during an `elapsed_ms` long execution.

    Args:
        before: sample_threads() just before the execution.
        after: sample_threads() just after it.
        elapsed_ms: How long the execution took.
        python_tids: Native ids of Python threads (never candidates).

    Returns:
        Thread ids that woke at least HELPER_MIN_WAKES_PER_MS per ms with little CPU per wake.
    """
    found = []
    for tid, now in after.items():
        if tid in python_tids or now.name.startswith(WORKER_PREFIX):
            continue
        then = before.get(tid, ThreadSample(now.name, 0, 0))
        wakes = now.wakes - then.wakes
        if wakes < max(8.0, HELPER_MIN_WAKES_PER_MS * elapsed_ms):
            continue
        if (now.cpu_ns - then.cpu_ns) / wakes <= HELPER_MAX_CPU_PER_WAKE_NS:
            found.append(tid)
    return found


class CpuThreadTuner:
    """Watches the first executions of a model and sets the priorities once the threads are known.

    Args:
        enabled: False leaves every thread as MAX made it.
    """

    def __init__(self, enabled: bool) -> None:
        supported = hasattr(os, "sched_setscheduler") and os.path.isdir(_task_dir())
        self.enabled = enabled and supported
        self._status = "off" if not enabled else ("pending" if supported else "unsupported (not Linux)")
        self._workers: set[int] = set()
        self._helpers: set[int] = set()
        self._probes = 0
        self._lock = threading.Lock()

    @property
    def status(self) -> str:
        """"off", "pending" (no execution seen yet), or what was set, e.g. "workers nice 19 (2), helpers idle (1)"."""
        return self._status

    def execute(self, run: Callable[[], T]) -> T:
        """Runs `run()` (one graph execution); while the threads are not all found, samples around it."""
        if not self.enabled or self._probes >= MAX_PROBES or self._helpers:
            return run()
        before = sample_threads()
        start = time.perf_counter()
        result = run()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        after = sample_threads()
        with self._lock:
            # Every sampled execution counts, short ones too: sampling /proc costs ~0.1-0.3 ms, so a
            # model whose steps all stay under MIN_PROBE_MS must not pay it on every step.
            self._probes += 1
            if elapsed_ms >= MIN_PROBE_MS:
                self._tune(before, after, elapsed_ms)
            if not self._helpers and self._probes == MAX_PROBES and self.enabled:
                logger.warning("Crucible: MAX's execution helper thread not found in %d executions; status: %s",
                               MAX_PROBES, self._status)
        return result

    def _tune(self, before: dict[int, ThreadSample], after: dict[int, ThreadSample], elapsed_ms: float) -> None:
        python_tids = {t.native_id for t in threading.enumerate() if t.native_id is not None}
        try:
            for tid, sample in after.items():
                if sample.name.startswith(WORKER_PREFIX) and tid not in self._workers:
                    os.setpriority(os.PRIO_PROCESS, tid, WORKER_NICE)
                    self._workers.add(tid)
            for tid in find_helpers(before, after, elapsed_ms, python_tids):
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                self._helpers.add(tid)
            # An earlier model in this process may have idled the helper already (it then barely wakes).
            for tid, sample in after.items():
                if (tid not in python_tids and not sample.name.startswith(WORKER_PREFIX)
                        and os.sched_getscheduler(tid) == os.SCHED_IDLE):
                    self._helpers.add(tid)
        except ProcessLookupError:
            return  # a thread exited between sampling and setting; the next probe retries
        except OSError as err:
            self.enabled = False
            self._status = f"failed: {err}"
            logger.warning("Crucible: could not set CPU thread priorities (%s); running with MAX's defaults", err)
            return
        self._status = f"workers nice {WORKER_NICE} ({len(self._workers)}), helpers idle ({len(self._helpers)})"
        if self._helpers:
            logger.info("Crucible CPU threads: %s", self._status)
