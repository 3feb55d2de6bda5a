"""The IQ4 level lookup (kernels/quant_iq.iq4_levels) executed on the code paths other than AVX-512's.

The conformance grid runs on the host's widest path; an AVX-512 host never runs the AVX2 pshufb
lookup nor the lane-by-lane one. Both run here: tests/kernels/iq4_levels_check.mojo built for
x86-64-v3 (AVX2) and baseline x86-64, executed on this x86 host (either runs on any x86-64 CPU).
The check compares every index, with upper bits set, against the levels table.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest

from crucible.core.proc import child_env, find_tool

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="builds x86-64 code to run here")
@pytest.mark.parametrize("cpu", ["x86-64-v3", "x86-64"])
def test_iq4_levels_on_avx2_and_baseline_x86(cpu: str, tmp_path: Path) -> None:
    mojo = find_tool("mojo")
    assert mojo, "the mojo compiler is part of the test environment (modular==26.7.0)"
    exe = tmp_path / f"iq4_levels_{cpu}"
    build = subprocess.run([mojo, "build", "-I", str(REPO), "--target-cpu", cpu,
                            str(REPO / "tests/kernels/iq4_levels_check.mojo"), "-o", str(exe)],
                           cwd=REPO, capture_output=True, text=True, env=child_env())
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mismatches: 0" in run.stdout
