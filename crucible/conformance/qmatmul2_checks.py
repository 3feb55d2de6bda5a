"""Conformance grid of crucible.qmatmul2 (two projections of one x in one op; bounds: tolerance.py).

Each case checks the fused op three ways:
- against the float64 reference of the gguf package's dequantization (on x as the kernel quantizes
  it for act=q8), with qmatmul's dot-product bound; a gated epilogue's bound adds the propagation
  of the two dot-product errors through act(g) * u (|act'| <= 1.2 for silu and gelu_tanh);
- at M = 1 (batch-1 decode), bit for bit against the unfused ops (qmatmul, qmatmul, silu_mul) in the
  same graph, so the models' transformer parity carries over unchanged. Only subnormal results may
  differ (by under 2^-126): MAX's worker threads flush them to zero and the calling thread does not,
  and the fused epilogue runs on a worker where a small silu_mul runs on the caller;
- a control that must fail: the gated output against the reference with gate and up swapped.
"""

from __future__ import annotations

import numpy as np

from crucible.conformance import naive as R
from crucible.conformance.harness import CaseResult, Harness, result
from crucible.conformance.matmul_checks import SUPER_QTYPES, magnitude, qmatmul_acts, quantized_weights
from crucible.conformance.tolerance import U32, dot_bound, error_ratio

# Type pairs: SmolLM2 Q4_K_M's q|k + v (Q5_0 + Q8_0), a 4096-wide Q4_K_M's (Q4_K + Q6_K), one type for
# both (a fused gate|up), and the batch-1 Q4 rows beside a K-quant (different x layouts in one op).
QMATMUL2_PAIRS = (("q5_0", "q8_0"), ("q4_k", "q6_k"), ("q8_0", "q8_0"), ("q4_0", "q4_k"))
# The GPU branch launches crucible.qmatmul's kernel per weight (its grid covers every format): two pairs
# check the op's own code there (strides, the gated scratch) at half the compile time of four.
QMATMUL2_GPU_PAIRS = QMATMUL2_PAIRS[:2]


def qmatmul2_pairs(target: str) -> tuple[tuple[str, str], ...]:
    """The type pairs the grid checks on a target ("cpu" or "gpu")."""
    return QMATMUL2_GPU_PAIRS if target == "gpu" else QMATMUL2_PAIRS
QMATMUL2_M = (1, 2, 7, 20, 64, 300)
# (K, Na, Nb): odd and ragged widths; the first shape streams enough bytes to split over the cores.
QMATMUL2_KN = ((576, 576, 192), (64, 33, 7), (160, 5, 40))
QMATMUL2_KN_K = ((1536, 576, 192), (256, 33, 7), (768, 7, 40))
GATED = ("silu", "gelu_tanh")
SUBNORMAL = float(np.finfo(np.float32).tiny)  # 2^-126: below it, a flush to zero is the only difference


def qmatmul2_shapes(qa: str, qb: str) -> list[tuple[int, int, int, int]]:
    """(M, K, Na, Nb) for a type pair: K a multiple of 256 when either type has 256-value super-blocks (K-quants, IQ4_XS)."""
    kn = QMATMUL2_KN_K if qa in SUPER_QTYPES or qb in SUPER_QTYPES else QMATMUL2_KN
    return [(m, k, na, nb) for m in QMATMUL2_M for k, na, nb in kn]


def qmatmul2_graph(h: Harness, qa: str, qb: str):
    """Inputs x [m, k], wa [na] of qa, wb [nb] of qb, wc [na] of qb. Per activation form: the fused
    cat(wa, wb), silu(wa, wc) and gelu_tanh(wa, wc), then the unfused ops of the same: qmatmul of
    wa, wb and wc, and silu_mul of [a | c] for each gated act."""
    from max.dtype import DType
    from max.graph import TensorType, ops

    from graphs import kernel_ops as K

    f32 = DType.float32
    acts = qmatmul_acts(h, qa) if qmatmul_acts(h, qa) == qmatmul_acts(h, qb) else ("f32",)

    def build(x, wa, wb, wc):
        x, wa, wb, wc = x.tensor, wa.tensor, wb.tensor, wc.tensor
        n_a, n_b = wa.shape[0], wb.shape[0]
        outs = []
        for act in acts:
            def q2(w1, w2, n1, n2, epilogue, q1=qa, q2_=qb, act=act):
                out_w = n1 + n2 if epilogue == "cat" else n1
                out = TensorType(f32, [x.shape[0], out_w], device=h.ref)
                return ops.custom("crucible.qmatmul2", h.ref, [x, w1, w2], [out],
                                  parameters={"qa": q1, "qb": q2_, "act": act, "epilogue": epilogue})[0].tensor

            def q1(w, n, qtype, act=act):
                out = TensorType(f32, [x.shape[0], n], device=h.ref)
                return ops.custom("crucible.qmatmul", h.ref, [x, w], [out],
                                  parameters={"qtype": qtype, "act": act, "variant": "auto"})[0].tensor

            ya, yb, yc = q1(wa, n_a, qa), q1(wb, n_b, qb), q1(wc, n_a, qb)
            outs += [q2(wa, wb, n_a, n_b, "cat")] + [q2(wa, wc, n_a, n_a, g) for g in GATED]
            outs += [ya, yb] + [K.silu_mul(ops.concat([ya, yc], axis=1), g) for g in GATED]
        return outs

    types = [TensorType(f32, ["m", "k"], device=h.ref), TensorType(DType.uint8, ["na", "kba"], device=h.ref),
             TensorType(DType.uint8, ["nb", "kbb"], device=h.ref), TensorType(DType.uint8, ["na", "kbb"], device=h.ref)]
    return h.model(f"qmatmul2_{qa}_{qb}", types, build), acts


def gated_bound(g: np.ndarray, u: np.ndarray, bg: np.ndarray, bu: np.ndarray, act: str,
                 ref: np.ndarray) -> np.ndarray:
    """Elementwise bound on |act(g') u' - act(g) u| for g', u' within bg, bu of g, u; ref: act(g) u."""
    # |act(g') u' - act(g) u| <= |act'| |u| |g' - g| + |act(g')| |u' - u| + the epilogue's own rounding,
    # with |act'| <= 1.2 and |act(g')| <= |act(g)| + 1.2 |g' - g|.
    act_g = np.abs(R.silu_mul(np.concatenate([g, np.ones_like(g)], axis=1), act))
    return 1.2 * np.abs(u) * bg + (act_g + 1.2 * bg) * bu + 8 * U32 * np.abs(ref) + 1e-6


def check_qmatmul2(h: Harness, qa: str, qb: str) -> list[CaseResult]:
    """crucible.qmatmul2 for one type pair: every epilogue and activation form over the grid."""
    model, acts = qmatmul2_graph(h, qa, qb)
    rng = np.random.default_rng(3)
    out = []
    for m, k, na, nb in qmatmul2_shapes(qa, qb):
        x = rng.standard_normal((m, k)).astype(np.float32)
        wa, wb, wc = quantized_weights(na, k, qa, rng), quantized_weights(nb, k, qb, rng), quantized_weights(na, k, qb, rng)
        da, db, dc = R.dequantize(wa, qa, na, k), R.dequantize(wb, qb, nb, k), R.dequantize(wc, qb, na, k)
        ma, mb, mc = magnitude(wa, da, qa), magnitude(wb, db, qb), magnitude(wc, dc, qb)
        ys = h.run(model, [x, wa, wb, wc])
        shape = f"M={m} K={k} Na={na} Nb={nb}"
        for i, act in enumerate(acts):
            if act == "q8" and m > 32:
                continue  # act=q8 changes only the decode path (M <= 32): the f32 outputs cover prefill
            cat, silu, gelu, ya, yb, silu_u, gelu_u = ys[7 * i: 7 * i + 7]
            xr = R.quantize_activations_q8(x) if act == "q8" else x.astype(np.float64)
            ra, rb, rc = xr @ da.T, xr @ db.T, xr @ dc.T
            ba, bb, bc = dot_bound(xr, ma, ra, False), dot_bound(xr, mb, rb, False), dot_bound(xr, mc, rc, False)
            tag = f"{qa}+{qb}" + (":act=q8" if act == "q8" else "")
            ref = np.concatenate([ra, rb], axis=1)
            out.append(result(h, "crucible.qmatmul2", tag + ":cat", "float32", shape,
                              error_ratio(np.abs(cat - ref), np.concatenate([ba, bb], axis=1)), 1.0))
            for g, y in zip(GATED, (silu, gelu)):
                ref = R.silu_mul(np.concatenate([ra, rc], axis=1), g)
                out.append(result(h, "crucible.qmatmul2", f"{tag}:{g}", "float32", shape,
                                  error_ratio(np.abs(y - ref), gated_bound(ra, rc, ba, bc, g, ref)), 1.0))
            if m == 1:
                same = max(np.abs(cat - np.concatenate([ya, yb], axis=1)).max(), np.abs(silu - silu_u).max(),
                           np.abs(gelu - gelu_u).max())
                out.append(result(h, "crucible.qmatmul2", tag + ":equals-unfused-at-M=1", "float32", shape,
                                  float(same), SUBNORMAL))
            if (m, k) == (7, qmatmul2_shapes(qa, qb)[0][1]):
                swapped = R.silu_mul(np.concatenate([rc, ra], axis=1), "silu")
                miss = error_ratio(np.abs(silu - swapped), gated_bound(rc, ra, bc, ba, "silu", swapped))
                out.append(result(h, "crucible.qmatmul2", tag + ":gate-up-swap-is-detected", "float32", shape,
                                  1.0 / max(miss, 1e-30), 1.0))
    return out
