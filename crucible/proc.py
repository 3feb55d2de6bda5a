"""Environment for child processes started from a process that has imported MAX.

Importing MAX's pipelines sets PYTHONEXECUTABLE (to the interpreter on PATH, not the venv's) and
PYTHONPATH=":" for its Mojo-Python interop. A child Python (the `mojo` launcher script, a server
process) then no longer finds the virtual environment's site-packages and fails with
"No module named ...". Children get the environment without those two.
"""

from __future__ import annotations

import os


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Returns os.environ minus MAX's interpreter overrides, plus `extra`."""
    env = dict(os.environ)
    env.pop("PYTHONEXECUTABLE", None)
    if env.get("PYTHONPATH", "").strip(":") == "":
        env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env
