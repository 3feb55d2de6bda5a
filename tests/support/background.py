"""Compile-only subprocesses started when the session starts, at low priority.

The virtual-GPU compiles (the op grid, the whole decoders) are a sixth of the cold suite, need nothing
from the other tests and do not time anything. The rest of the suite keeps 2 cores two-thirds busy, so
these jobs start with the first test, niced, and take the cores the others leave idle; their tests
collect the results where they run. A test run alone starts its job when it needs it.

A test module opts in by defining `background_command(request, **params) -> argv` for its
parametrized test; the test calls `BackgroundJobs.run(request.node.nodeid, that argv, timeout)`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from crucible.core.proc import child_env

NICENESS = 10  # the foreground tests (servers, timed steps) keep their share of the cores
EARLY_JOBS = 2  # started with the session; more would hold several GiB of compiler each at once


@dataclass
class _Job:
    argv: list[str]
    proc: subprocess.Popen
    out: Path
    err: Path


class BackgroundJobs:
    """Named subprocesses writing to files under `root` (pipes would fill while nobody reads them)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._jobs: dict[str, _Job] = {}

    def start(self, key: str, argv: list[str]) -> None:
        """Starts `argv` under `key` unless a job of that key runs already."""
        if key in self._jobs:
            return
        name = f"job{len(self._jobs)}"
        out, err = self.root / f"{name}.out", self.root / f"{name}.err"
        # Its own session: a kill reaches the compile workers it spawns too.
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen(["nice", "-n", str(NICENESS), *argv], stdout=o, stderr=e, env=child_env(),
                                    start_new_session=True)
        self._jobs[key] = _Job(argv, proc, out, err)

    @property
    def started(self) -> int:
        return len(self._jobs)

    def run(self, key: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """The finished job of `key` (started now if it was not), like subprocess.run(..., text=True).

        Args:
            key: the job's name (a test's node id).
            argv: its command; must be the command it was started with.
            timeout: seconds to wait from now before the job is killed and TimeoutExpired raised.

        Returns:
            Its exit status, stdout and stderr.
        """
        self.start(key, argv)
        job = self._jobs[key]
        assert job.argv == argv, f"{key} was started as {job.argv}"
        try:
            job.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(job)
            raise
        return subprocess.CompletedProcess(argv, job.proc.returncode, job.out.read_text(errors="replace"),
                                           job.err.read_text(errors="replace"))

    def stop_all(self) -> None:
        """Kills the jobs nobody collected (a run stopped early or deselected their tests)."""
        for job in self._jobs.values():
            self._kill(job)

    @staticmethod
    def _kill(job: _Job) -> None:
        try:
            os.killpg(job.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it and its workers have ended
        job.proc.wait()
