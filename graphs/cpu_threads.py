"""Scheduling priorities for MAX's CPU runtime threads, so they cannot hold up the thread that drives a step.

What a batch-1 decode step looked like on the 2-core machine (SmolLM2 Q4_1, `perf sched timehist`,
per-thread /proc counters):
- MAX runs a graph on its two runtime workers ("🔥 Thread0", "🔥 Thread1"); the Python thread that
  called `execute` sleeps until the result is ready. After the last op the workers keep busy-waiting,
  so both cores stay taken. When the Python thread was woken with the result it often waited for a
  core for 2.5-4 ms (one scheduler tick): 10-15% of steps took 9-10 ms instead of 6.
- While a graph runs, a libmax helper thread wakes every 100-200 us (a timed condition-variable
  wait, about 15 us of CPU each time). Each wake preempts a worker that is running a kernel: about
  50 preemptions and 0.75 ms of CPU per 6 ms step.
What this module does, once both kinds of thread have been seen:
- the workers get nice 19, so a woken Python thread (nice 0) takes a core from their busy-wait at
  once, and so does anything else on the machine that needs a core briefly;
- the helper gets SCHED_IDLE: it runs only when a core is otherwise idle. Executions are unaffected
  (measured: no step waited on it), it stops stealing time from kernels.
In-process A/B (interleaved, 8 x 48 decode steps each): mean decode step 6.75 -> 5.62 ms
(148 -> 178 tok/s), p90 8.79 -> 5.88 ms; 512-token prefill 396 -> 369 ms. Workers niced alone: 6.30 ms;
helper idled alone: 5.88 ms (its median gain, without the tick-long outliers fixed).

Also tried, not used: how long the workers busy-wait before they sleep. MAX 26.7 reads it from two
places that must agree, `MODULAR_THREAD_BUSY_WAIT_US` (the driver's CPU device) and
`MODULAR_RUNTIME_THREAD_BUSY_WAIT_TIME_US` (the engine's config key `runtime.thread_busy_wait_time_us`);
both default to 200 us, and setting only the first aborts the process at `InferenceSession()`
("getOrCreateCPUDevice called requesting different options"). Wall per execute of 300 single Q4_1
4096 x 4096 qmatmuls, one process per run, runs alternating between values (us): 0 -> 452, 510;
20 -> 410, 457; 200 -> 362, 367, 480; 1000 -> 420, 444, 564; 2000 -> 352; 10000 -> 354, 384. The
spread between processes at one value (this host drifts up to 1.5x) is as large as any difference
between values, and the calling thread's 60-90 us of CPU per execute was the same at every value: the
default stays. Nor `MODULAR_ENABLE_AFFINITY=1`, which pins worker N to CPU N (the calling thread stays
free): 3 alternating process pairs, single Q4_0 act=q8 4096 x 4096 op / chain of 8 per op, us, unset vs
set: 402.6 / 356.1 vs 367.2 / 307.4; 284.6 / 233.4 vs 294.9 / 238.8; 372.2 / 323.0 vs 349.3 / 303.1.
The single op's excess over the chain (1.13-1.22x) is the same pinned or not.

The threads are found by what they are and do, not by creation order: workers by their name, the helper
as a thread that is neither a Python thread nor a worker and that woke at least twice per millisecond
of an execution while using little CPU per wake. Both settings are process-wide and a non-root process
cannot undo them: every later model in the process shares the tuned runtime. Linux only; elsewhere,
or with `ModelOptions(tune_threads=False)`, nothing is changed and the status says so.
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
