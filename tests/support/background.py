"""Compile-only subprocesses started when the session starts, at low priority.

The virtual-GPU compiles (the op grid, the whole decoders) are long, need nothing from the other
tests and time nothing, while the rest of the suite leaves the cores partly idle (compiles, servers
waiting). So these jobs start with the first test, niced, and their tests collect the results where
they run. A test run alone starts its job when it needs it.

A test module opts in by defining `background_command(request, **params) -> argv` for its
parametrized test; the test calls `BackgroundJobs.run(request, timeout)`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

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

    def start(self, item: pytest.Item, request: pytest.FixtureRequest) -> None:
        """Starts the job of test `item` (its module's `background_command`) unless it runs already."""
        if item.nodeid in self._jobs:
            return
        spec = getattr(item, "callspec", None)
        argv = item.module.background_command(request, **(spec.params if spec else {}))
        name = f"job{len(self._jobs)}"
        out, err = self.root / f"{name}.out", self.root / f"{name}.err"
        # Its own session: a kill reaches the compile workers it spawns too.
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen(["nice", "-n", str(NICENESS), *argv], stdout=o, stderr=e, env=child_env(),
                                    start_new_session=True)
        self._jobs[item.nodeid] = _Job(argv, proc, out, err)

    @property
    def started(self) -> int:
        return len(self._jobs)

    def run(self, request: pytest.FixtureRequest, timeout: float) -> subprocess.CompletedProcess:
        """The finished job of the requesting test (started now if it was not), like
        subprocess.run(..., text=True).

        Args:
            request: the test's own request.
            timeout: seconds to wait from now before the job is killed and TimeoutExpired raised.

        Returns:
            Its exit status, stdout and stderr.
        """
        self.start(request.node, request)
        job = self._jobs[request.node.nodeid]
        try:
            job.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(job)
            raise
        return subprocess.CompletedProcess(job.argv, job.proc.returncode, job.out.read_text(errors="replace"),
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
