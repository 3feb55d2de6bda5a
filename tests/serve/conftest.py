"""Real server processes on free loopback ports, started once per session and torn down at the end."""

from __future__ import annotations

from collections.abc import Iterator

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
