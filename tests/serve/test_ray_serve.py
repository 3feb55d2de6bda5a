"""`crucible serve --ray --replicas 2` on a local Ray cluster: what differs from one process.

The routes, errors and API key are the same app's (tests/serve/test_openai_client.py runs its whole suite
through Ray Serve's proxy too). Here: /health names both replicas and either may answer; /metrics sums
the replicas' counters; a killed replica is replaced while the other serves; a model that cannot load
stops the command with one line and status 2, and so does a cluster too small for the replicas; SIGTERM
takes the cluster down.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve")

from crucible.core.proc import child_env, free_port  # noqa: E402
from serve.launch import Server  # noqa: E402
from tests.serve.conftest import RAY_REPLICAS  # noqa: E402

AUTH = {"Authorization": "Bearer sesame"}


def _health(server: Server) -> dict:
    return httpx.get(server.base_url + "/health", timeout=30).json()


def _counter(server: Server, route: str) -> int:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    m = re.search(rf'crucible_requests_total{{route="{route}",status="200"}} (\d+)', text)
    return int(m.group(1)) if m else 0


def _complete(server: Server, max_tokens: int = 3) -> httpx.Response:
    return httpx.post(server.v1 + "/completions", headers=AUTH, timeout=120,
                      json={"model": "tiny-llama-Q4_0.gguf", "prompt": "Paris is", "max_tokens": max_tokens,
                            "temperature": 0})


def test_health_names_every_replica_and_either_answers(ray_server: Server) -> None:
    body = _health(ray_server)
    assert body["status"] == "ok"
    replicas = body["replicas"]
    assert replicas["target"] == replicas["live"] == RAY_REPLICAS
    ids = {m["replica"] for m in replicas["members"]}
    assert len(ids) == RAY_REPLICAS and all(m["engine"]["alive"] for m in replicas["members"])
    # Serve's router spreads requests: in 30 tries both replicas answer (all one replica: p = 2**-29).
    answered = {_health(ray_server)["replica"] for _ in range(30)}
    assert answered == ids


def test_metrics_sum_over_replicas(ray_server: Server) -> None:
    before = _counter(ray_server, "/v1/completions")
    for _ in range(6):
        assert _complete(ray_server).status_code == 200
    # Each replica posts its counters every second (serve/cluster.py); the sum catches up within a few.
    deadline = time.time() + 15
    while _counter(ray_server, "/v1/completions") != before + 6:
        assert time.time() < deadline, (before, _counter(ray_server, "/v1/completions"))
        time.sleep(0.5)
    text = httpx.get(ray_server.base_url + "/metrics", timeout=30).text
    assert f"crucible_replicas_live {RAY_REPLICAS}" in text and f"crucible_replicas_target {RAY_REPLICAS}" in text
    assert "crucible_ready 1.0" in text


def _pids(server: Server) -> list[int]:
    return [m["pid"] for m in _health(server)["replicas"]["members"]]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_replica_is_replaced_while_the_other_serves(ray_server: Server) -> None:
    old = {m["replica"] for m in _health(ray_server)["replicas"]["members"]}
    pids = _pids(ray_server)
    assert len(pids) == RAY_REPLICAS and all(_alive(p) for p in pids), pids
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.time() + 180
    while True:
        members = _health(ray_server)["replicas"]
        ids = {m["replica"] for m in members["members"]}
        if members["live"] == RAY_REPLICAS and ids - old:
            break
        assert time.time() < deadline, f"no replacement replica within 180 s: {members}"
        time.sleep(1.0)
    assert len(ids & old) == 1  # the survivor, and one new replica
    for _ in range(4):
        assert _complete(ray_server).status_code == 200


def test_sigterm_takes_the_cluster_down(ray_server: Server) -> None:
    # Last of the tests on the module's server: it stops it.
    pids = _pids(ray_server)
    ray_server.process.terminate()
    assert ray_server.process.wait(timeout=60) == 0
    deadline = time.time() + 20
    while any(_alive(p) for p in pids):
        assert time.time() < deadline, [p for p in pids if _alive(p)]
        time.sleep(0.5)


def _serve_cli(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crucible.cli", "serve", "--port", str(free_port()), "--ray", *flags],
                          capture_output=True, text=True, timeout=300,
                          env=child_env({"RAY_AUTH_MODE": "disabled", "MAX_SERVE_DISABLE_TELEMETRY": "1"}))


def _error_line(proc: subprocess.CompletedProcess) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("crucible serve: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_a_cluster_too_small_is_refused_at_once(tiny_models) -> None:
    proc = _serve_cli("--model", str(tiny_models["llama"].gguf["Q4_0"]), "--replicas", "3",
                      "--cpus-per-replica", "1000")
    assert proc.returncode == 2 and "need 3000 CPUs" in _error_line(proc), proc.stderr[-3000:]


def test_a_model_that_cannot_load_stops_with_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    proc = _serve_cli("--model", str(broken), "--replicas", "1")
    line = _error_line(proc)
    assert proc.returncode == 2 and "cannot load model" in line and "broken.gguf" in line, proc.stderr[-3000:]
