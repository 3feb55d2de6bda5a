"""Every op's GPU branch compiles for the GPUs we target, in virtual device mode (no GPU needed).

sm_90a is the H100/H200 target; sm_80 (A100) and gfx942 (MI300X) show the kernels are not tied to
one architecture (those two run with `--all-targets`). Each architecture compiles in its own process
(virtual-device settings are global).
"""

from __future__ import annotations

import json
import sys

import pytest

from crucible.conformance.attention_checks import HEAD_DIMS
from crucible.conformance.matmul_checks import QTYPES
from crucible.conformance.mlp_checks import MLP_GPU_TRIPLES
from crucible.conformance.qmatmul2_checks import QMATMUL2_GPU_PAIRS
from tests.support.background import BackgroundJobs

EXPECTED_GRAPHS = {f"qmatmul_{q}" for q in QTYPES} | {f"qmatmul2_{a}_{b}" for a, b in QMATMUL2_GPU_PAIRS} | {
    f"mlp_{g}_{u}_{d}" for g, u, d in MLP_GPU_TRIPLES} | {
    f"attention_{kind}_{d}" for d in HEAD_DIMS for kind in ("ragged_float32", "ragged_bfloat16", "paged")} | {
    "matmul_float32_tiled_gemv", "matmul_bfloat16_auto_tiled_tensor_core_tensor_core_vec_gemv", "embedding",
    "elementwise_float32", "elementwise_bfloat16", "probes",
} | {f"qkv_rope_write_{d}" for d in (*HEAD_DIMS, 80)}


def background_command(request: pytest.FixtureRequest, api: str, arch: str) -> list[str]:
    """The compile of one architecture, started with the session (tests/support/background.py)."""
    return [sys.executable, "-m", "crucible.conformance.gpu_compile", "--api", api, "--arch", arch]


@pytest.mark.gpu_compile
@pytest.mark.parametrize("api,arch", [
    ("cuda", "sm_90a"),
    pytest.param("cuda", "sm_80", marks=pytest.mark.extra_target),
    pytest.param("hip", "gfx942", marks=pytest.mark.extra_target),
])
def test_gpu_branches_compile(background_jobs: BackgroundJobs, request: pytest.FixtureRequest,
                              api: str, arch: str) -> None:
    proc = background_jobs.run(request, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report["graphs"]) == EXPECTED_GRAPHS
