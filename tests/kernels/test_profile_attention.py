"""The standalone attention profiling driver (benchmarks/profile_attention.mojo) still builds and runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from crucible.proc import child_env, find_tool

REPO = Path(__file__).resolve().parents[2]


def test_profile_attention_builds_and_times_a_decode_call(tmp_path: Path) -> None:
    mojo = find_tool("mojo")
    assert mojo, "the mojo compiler is part of the test environment (modular==26.7.0)"
    exe = tmp_path / "profile_attention"
    # child_env: once an earlier test has imported MAX's pipelines, the `mojo` launcher needs the
    # environment without MAX's interpreter overrides (crucible/proc.py).
    build = subprocess.run([mojo, "build", "-I", str(REPO), "-O3", str(REPO / "benchmarks/profile_attention.mojo"),
                            "-o", str(exe)], cwd=REPO, capture_output=True, text=True, env=child_env())
    assert build.returncode == 0, build.stderr[-4000:]
    # 9/3 heads over 300 keys (across a page boundary), 3 timed calls.
    run = subprocess.run([str(exe), "9", "3", "299", "3"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    m = re.search(r"Hq 9 Hkv 3 D 128 keys 300 : ([0-9.]+) us per call, ([0-9.]+) GB/s", run.stdout)
    assert m, run.stdout
    assert float(m.group(1)) > 0 and float(m.group(2)) > 0
