"""precompile.py's bookkeeping, without compiling: which graphs a grid builds, and that asking builds none.

The parallel compile itself runs in test_gpu_compile.py (every GPU graph, two workers in CI).
"""

from __future__ import annotations

import pytest

from crucible.conformance.checks import compile_all
from crucible.conformance.harness import Harness
from crucible.conformance.precompile import VirtualGPU, graph_keys

from crucible.conformance.attention_checks import HEAD_DIMS
from crucible.conformance.matmul_checks import QTYPES
from crucible.conformance.mlp_checks import MLP_TRIPLES
from crucible.conformance.qmatmul2_checks import QMATMUL2_PAIRS

CPU_GRAPHS = (
    ["matmul_float32_auto_gemm_gemv"] + [f"qmatmul_{q}" for q in QTYPES]
    + [f"qmatmul2_{a}_{b}" for a, b in QMATMUL2_PAIRS] + [f"mlp_{g}_{u}_{d}" for g, u, d in MLP_TRIPLES]
    + ["embedding", "elementwise_float32"]
    + [g for d in HEAD_DIMS for g in (f"attention_ragged_float32_{d}", f"attention_paged_{d}")]
    + [f"qkv_rope_write_{d}" for d in (*HEAD_DIMS, 80)] + ["probes"]
)


def test_graph_keys_lists_the_cpu_grid_and_compiles_nothing(cpu_harness: Harness) -> None:
    compiled_before = dict(cpu_harness.compile_seconds)
    assert graph_keys(cpu_harness, compile_all) == CPU_GRAPHS
    assert cpu_harness.compile_seconds == compiled_before
    assert cpu_harness.only is None  # restored: the harness builds every graph again


def test_only_skips_the_other_graphs() -> None:
    h = Harness("cpu", compile_only=True, only=frozenset())
    compile_all(h)
    assert h.compile_seconds == {}
    assert h.requested == CPU_GRAPHS


def test_virtual_gpu_rejects_an_unknown_api() -> None:
    with pytest.raises(ValueError, match="cuda or hip"):
        VirtualGPU("metal", "m3")
