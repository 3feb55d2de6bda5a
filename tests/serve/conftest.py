"""Real server processes on free loopback ports, started once per session and torn down at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from serve.launch import Server, start_server, stop_server


@pytest.fixture(scope="session")
def server(tiny_models) -> Iterator[Server]:
    """The tiny Llama (Q4_0 GGUF, 1024-token context) with default settings and no API key."""
    s = start_server(str(tiny_models["llama"].gguf["Q4_0"]), "--max-batch-size", "32")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def guarded_server(tiny_models) -> Iterator[Server]:
    """API key, a small admission limit (4) and a 16 KB body limit."""
    s = start_server(str(tiny_models["llama"].gguf["Q4_0"]), "--max-queue", "4", "--max-batch-size", "4",
                     "--max-body-bytes", "16384", api_key="sesame")
    yield s
    stop_server(s)


# The guarded settings as 2 replicas behind Ray Serve's proxy, on a local Ray cluster (serve/ray_serve.py).
RAY_REPLICAS = 2


@pytest.fixture(scope="module")  # one Ray cluster per module that uses it, gone when the module ends
def ray_server(tiny_models) -> Iterator[Server]:
    """`crucible serve --ray --replicas 2` with guarded_server's settings; ready once both replicas report."""
    pytest.importorskip("ray.serve")
    s = start_server(str(tiny_models["llama"].gguf["Q4_0"]), "--max-queue", "4", "--max-batch-size", "4",
                     "--max-body-bytes", "16384", "--ray", "--replicas", str(RAY_REPLICAS), "--cpus-per-replica",
                     "1", api_key="sesame", env={"RAY_AUTH_MODE": "disabled"})
    deadline = time.time() + 120
    while httpx.get(s.base_url + "/health", timeout=10).json().get("replicas", {}).get("live") != RAY_REPLICAS:
        assert time.time() < deadline, "the replicas did not all report within 120 s"
        time.sleep(0.5)
    yield s
    stop_server(s)
