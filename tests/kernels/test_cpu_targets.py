"""The CPU kernels compile for CPUs other than this host: other SIMD widths and aarch64.

The conformance grid runs the kernels on the host's CPU only, so code written for one vector width
(16 float lanes with AVX-512, 8 with AVX2) could leave other CPUs unable to compile the package at
all: until the shared shuffle helpers (kernels/shuffles.mojo), 4-lane targets (aarch64 NEON, baseline
x86-64) failed in the GEMM's panel transpose and decode attention's sum tree. Each target here
compiles tests/kernels/cpu_targets.mojo, which instantiates every width-dependent CPU body, to an
object file (`mojo build --emit object`); nothing runs, since the host cannot run other targets.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from crucible.core.proc import child_env, find_tool

REPO = Path(__file__).resolve().parents[2]

# (target triple, target CPU, what it stands for)
TARGETS = [
    ("aarch64-unknown-linux-gnu", "neoverse-v2", "AWS Graviton 4 / NVIDIA Grace: NEON, 4 lanes"),
    ("arm64-apple-macosx13.0", "apple-m1", "Apple silicon: NEON, 4 lanes"),
    ("x86_64-unknown-linux-gnu", "x86-64", "baseline x86-64: SSE2, 4 lanes, no FMA"),
    ("x86_64-unknown-linux-gnu", "x86-64-v3", "AVX2 + FMA, 8 lanes, no int8 dot product"),
    ("x86_64-unknown-linux-gnu", "skylake-avx512", "Intel Skylake-SP: AVX-512 without VBMI or VNNI, 16 lanes"),
    ("x86_64-unknown-linux-gnu", "znver4", "AMD Zen 4: AVX-512 with VNNI, 16 lanes"),
]


# apple-m1 takes neoverse-v2's NEON path: it compiles with --all-targets.
EXTRA = {"apple-m1"}


@pytest.mark.parametrize("triple,cpu,what", [
    pytest.param(*t, id=t[1], marks=[pytest.mark.extra_target] if t[1] in EXTRA else []) for t in TARGETS])
def test_cpu_kernels_compile_for(triple: str, cpu: str, what: str, tmp_path: Path) -> None:
    mojo = find_tool("mojo")
    assert mojo, "the mojo compiler is part of the test environment (modular==26.7.0)"
    obj = tmp_path / f"cpu_targets_{cpu}.o"
    build = subprocess.run(
        [mojo, "build", "-I", str(REPO), "-O3", "--target-triple", triple, "--target-cpu", cpu,
         "--emit", "object", str(REPO / "tests/kernels/cpu_targets.mojo"), "-o", str(obj)],
        cwd=REPO, capture_output=True, text=True, env=child_env(),
    )
    assert build.returncode == 0, f"{what}:\n" + build.stderr[-4000:]
    # An object with code in it, not an empty module: the kernels are instantiated by main().
    assert obj.stat().st_size > 100_000, f"{what}: object file is only {obj.stat().st_size} bytes"
