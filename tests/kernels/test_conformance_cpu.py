"""Every CPU kernel against its float64 reference over the conformance grid (crucible/conformance).

Bounds are derived per op and dtype in crucible/conformance/tolerance.py; each case records its error as
a ratio to its bound, so a failure message shows how far off it was.
"""

from __future__ import annotations

import pytest

from crucible.conformance import checks
from crucible.conformance.harness import CaseResult, Harness
from graphs.kernel_ops import Q8_ACT_QTYPES


def _assert_all_pass(results: list[CaseResult], min_cases: int) -> None:
    assert len(results) >= min_cases, f"grid shrank: {len(results)} cases"
    failed = [r for r in results if not r.passed]
    assert not failed, "\n".join(f"{r.op}[{r.variant}] {r.shape}: err {r.max_err:.3g} > {r.bound:.3g}"
                                 for r in failed)


def test_matmul_all_variants(cpu_harness: Harness) -> None:
    results = checks.check_matmul(cpu_harness, "float32", ("auto", "gemm", "gemv"))
    # 6 M values x 5 (K, N) + 3 large shapes, three variants each.
    _assert_all_pass(results, 3 * (6 * 5 + 3))


@pytest.mark.parametrize("qtype", checks.QTYPES)
def test_qmatmul(cpu_harness: Harness, qtype: str) -> None:
    results = checks.check_qmatmul(cpu_harness, qtype)
    _assert_all_pass(results, 7 * 4 + 4)
    # The control case exists: a misread layout (halves of each 32-value chunk swapped; for Q4 the
    # nibble order) would have been caught.
    assert any("misread-layout-is-detected" in r.variant for r in results)
    # M = 1, batched decode 2..20 and prefill up to 512 rows.
    assert {1, 2, 8, 20, 64, 512} <= {int(r.shape.split()[0][2:]) for r in results if r.variant == qtype}
    if qtype in Q8_ACT_QTYPES:
        # int8 activations: every decode-path shape (M <= 32) against both references, and its own
        # misread-layout control.
        q8 = [r for r in results if ":act=q8" in r.variant and "misread" not in r.variant]
        decode_shapes = sum(1 for r in results if r.variant == qtype and int(r.shape.split()[0][2:]) <= 32)
        assert len(q8) == 2 * decode_shapes and decode_shapes >= 5 * 5
        assert any(r.variant == qtype + ":act=q8:misread-layout-is-detected" for r in results)


@pytest.mark.parametrize("pair", checks.QMATMUL2_PAIRS, ids=lambda p: "+".join(p))
def test_qmatmul2(cpu_harness: Harness, pair: tuple[str, str]) -> None:
    results = checks.check_qmatmul2(cpu_harness, *pair)
    tag = "+".join(pair)
    variants = {r.variant for r in results}
    # Every epilogue in both activation forms, bit-equal to the unfused ops at M = 1, and the control.
    for act in ("", ":act=q8"):
        assert {f"{tag}{act}:{e}" for e in ("cat", "silu", "gelu_tanh", "equals-unfused-at-M=1",
                                           "gate-up-swap-is-detected")} <= variants
    # M = 1, batched decode and prefill (300 rows: the GEMM and its epilogue).
    assert {1, 7, 20, 300} <= {int(r.shape.split()[0][2:]) for r in results if r.variant == tag + ":cat"}
    # 6 M values (f32) + the 4 decode ones (q8), 3 shapes, 3 epilogues.
    _assert_all_pass(results, (6 + 4) * 3 * 3)


@pytest.mark.parametrize("triple", checks.MLP_TRIPLES, ids=lambda t: "+".join(t))
def test_mlp(cpu_harness: Harness, triple: tuple[str, str, str]) -> None:
    results = checks.check_mlp(cpu_harness, *triple)
    tag = "+".join(triple)
    variants = {r.variant for r in results}
    # Both gates in both activation forms (h and the output against float64), bit-equal to the
    # unfused ops, and the control.
    for act in ("", ":act=q8"):
        assert {f"{tag}{act}:{g}{e}" for g in ("silu", "gelu_tanh") for e in ("", ":h", ":equals-unfused")} <= variants
        assert f"{tag}{act}:gate-up-swap-is-detected" in variants
    # M = 1, batched decode and prefill (64 rows: qmatmul2's GEMM path, then qmatmul's).
    assert {1, 2, 7, 20, 64} == {int(r.shape.split()[0][2:]) for r in results if r.variant == tag + ":silu"}
    # 5 M values (f32) + the 4 decode ones (q8), 3 shapes, 2 gates, 3 checks each, + 2 controls.
    _assert_all_pass(results, (5 + 4) * 3 * 2 * 3 + 2)


def test_rmsnorm_rope_silu(cpu_harness: Harness) -> None:
    results = checks.check_elementwise(cpu_harness, "float32")
    assert {r.op for r in results} == {"crucible.rmsnorm", "crucible.add_rmsnorm", "crucible.rope",
                                       "crucible.silu_mul"}
    # Both gated activations (SwiGLU and Gemma's GeGLU), and the control that tells them apart.
    assert {r.variant for r in results if r.op == "crucible.silu_mul"} == {"", "gelu_tanh", "act-ignored-is-detected"}
    _assert_all_pass(results, 4 * 7 + 1)


def test_qkv_rope_write(cpu_harness: Harness) -> None:
    # q, cached k and cached v in both layouts for every batch of the attention grid.
    _assert_all_pass(checks.check_qkv_rope_write(cpu_harness), (len(checks.ATTENTION_CASES) + 1) * 6)


def test_embedding_every_table_format(cpu_harness: Harness) -> None:
    _assert_all_pass(checks.check_embedding(cpu_harness), 5)


def test_attention_ragged_and_paged(cpu_harness: Harness) -> None:
    results = checks.check_attention(cpu_harness, "float32")
    ops = {r.op for r in results}
    assert ops == {"crucible.attention_ragged", "crucible.attention_paged", "crucible.kv_cache_write"}
    _assert_all_pass(results, len(checks.ATTENTION_CASES) * 2)


def test_benchmark_probes(cpu_harness: Harness) -> None:
    # Both probes in the conformance grid, so the GPU run checks their GPU branches too.
    _assert_all_pass(checks.check_probes(cpu_harness), 2)
