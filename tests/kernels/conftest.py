"""One CPU harness for the whole kernel suite: each op group's graph compiles once per session."""

from __future__ import annotations

import pytest

from crucible.conformance.harness import Harness


@pytest.fixture(scope="session")
def cpu_harness() -> Harness:
    return Harness("cpu")
