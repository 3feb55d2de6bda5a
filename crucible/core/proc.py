"""Environment for child processes started from a process that has imported MAX.

Importing MAX's pipelines sets PYTHONEXECUTABLE (to the interpreter on PATH, not the venv's) and
PYTHONPATH=":" for its Mojo-Python interop. A child Python (the `mojo` launcher script, a server
process) then no longer finds the virtual environment's site-packages and fails with
"No module named ...". Children get the environment without those two.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Returns os.environ minus MAX's interpreter overrides, plus `extra`."""
    env = dict(os.environ)
    env.pop("PYTHONEXECUTABLE", None)
    if env.get("PYTHONPATH", "").strip(":") == "":
        env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env


def _max_site_packages() -> list[Path]:
    spec = importlib.util.find_spec("max")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p).parent for p in spec.submodule_search_locations]


def find_tool(name: str) -> str | None:
    """A console script of the Modular wheels (`mojo`, `max`): beside the interpreter (a venv's bin/),
    then beside the environment MAX is installed in, then on PATH.

    A process MAX spawns (its serve model worker) runs the interpreter on PATH instead of the venv's,
    with the venv's site-packages only on sys.path; the second place finds the venv's bin/ from there.
    """
    candidates = [Path(sys.executable).parent / name]
    candidates += [site.parents[2] / "bin" / name for site in _max_site_packages()]  # <prefix>/lib/pythonX.Y/site-packages
    for path in candidates:
        if path.exists():
            return str(path)
    return shutil.which(name)


def free_port() -> int:
    """A free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    """Polls url + /health until it answers 200; kills the process if it never does.

    Raises:
        RuntimeError: The process exited (the message has the tail of its log) or timed out.
    """
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}):\n{log_path.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError(f"server at {url} not healthy after {timeout_s}s:\n{log_path.read_text(errors='replace')[-4000:]}")
