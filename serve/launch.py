"""Starting and stopping a `crucible serve` process (tests and the serving benchmark use it)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from crucible.core.proc import child_env, free_port


@dataclass(frozen=True)
class Server:
    base_url: str
    api_key: str | None
    process: subprocess.Popen

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


def start_server(model: str, *extra: str, api_key: str | None = None, timeout_s: float = 900,
                 python: str = sys.executable, env: dict[str, str] | None = None) -> Server:
    """Starts `crucible serve` and waits until /health says ok (503 while loading is expected).

    Args:
        model: What to serve.
        *extra: More `crucible serve` flags.
        api_key: Required key, if any.
        timeout_s: How long loading may take.
        python: The interpreter whose environment runs the server (default: this one).
        env: More environment variables for the server.
    """
    port = free_port()
    cmd = [python, "-m", "crucible.cli", "serve", "--model", model, "--port", str(port), *extra]
    if api_key:
        cmd += ["--api-key", api_key]
    proc = subprocess.Popen(cmd, env=child_env({"MAX_SERVE_DISABLE_TELEMETRY": "1", **(env or {})}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    saw_loading = False
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{proc.stdout.read()[-4000:]}")
        try:
            r = httpx.get(base + "/health", timeout=2)
            if r.status_code == 200:
                return Server(base, api_key, proc)
            if r.status_code == 503:
                saw_loading = True
            elif r.status_code == 500:
                raise RuntimeError(f"model failed to load: {r.text}")
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server not healthy after {timeout_s}s (saw loading: {saw_loading})")


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
