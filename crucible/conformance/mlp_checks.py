"""Conformance grid of crucible.mlp (gate|up, the gated activation and down in one op; bounds: tolerance.py).

Each case checks the fused op three ways:
- against the float64 reference of the gguf package's dequantization, in two steps: h as
  crucible.qmatmul2 computes it in the same graph against act(x @ Wg^T) * (x @ Wu^T) with
  qmatmul2's gated bound, then the fused output against h @ Wd^T (for act=q8 on h as the kernel
  quantizes it) with qmatmul's dot-product bound;
- at every M (decode rows and prefill), bit for bit against the unfused ops (qmatmul2 with the gated
  epilogue, then qmatmul) in the same graph: the fused op calls the same row functions on the same
  shares, so the models' transformer parity carries over unchanged. Only subnormal values may differ
  (a worker thread may flush them to zero where the calling thread does not);
- a control that must fail: the output against the reference with gate and up swapped.
"""

from __future__ import annotations

import numpy as np

from crucible.conformance import naive as R
from crucible.conformance.harness import CaseResult, Harness, result
from crucible.conformance.matmul_checks import SUPER_QTYPES, magnitude, qmatmul_acts, quantized_weights
from crucible.conformance.qmatmul2_checks import SUBNORMAL, gated_bound
from crucible.conformance.tolerance import dot_bound, error_ratio

# (gate, up, down) types: SmolLM2 Q4_K_M's (Q5_0 gate and up, a K-quant down), and the batch-1 Q4 rows
# of two types beside a Q8_0 down.
MLP_TRIPLES = (("q5_0", "q5_0", "q4_k"), ("q4_0", "q4_1", "q8_0"))
# The GPU branch launches qmatmul2's and qmatmul's kernels (their grids cover every format): one triple
# checks the op's own code there (the h buffer, the strides).
MLP_GPU_TRIPLES = MLP_TRIPLES[:1]
MLP_M = (1, 2, 7, 20, 64)
# (H, I): SmolLM2's widths (both passes split over the cores), then small and odd ones (one task).
MLP_HI = ((576, 1536), (64, 96), (160, 32))
MLP_HI_K = ((576, 1536), (64, 256), (160, 512))
GATES = ("silu", "gelu_tanh")


def mlp_triples(target: str) -> tuple[tuple[str, str, str], ...]:
    """The type triples the grid checks on a target ("cpu" or "gpu")."""
    return MLP_GPU_TRIPLES if target == "gpu" else MLP_TRIPLES


def mlp_shapes(qd: str) -> list[tuple[int, int, int]]:
    """(M, H, I) for a down type: I a multiple of 256 when down has 256-value super-blocks (K-quants, IQ4_XS)."""
    return [(m, hh, i) for m in MLP_M for hh, i in (MLP_HI_K if qd in SUPER_QTYPES else MLP_HI)]


def mlp_graph(h: Harness, qg: str, qu: str, qd: str):
    """Inputs x [m, H], wg and wu [I] rows, wd [H] rows. Per activation form and gate: crucible.mlp,
    then the unfused qmatmul2 (gated) and qmatmul of the same weights, h included as an output."""
    from max.dtype import DType
    from max.graph import TensorType, ops

    f32 = DType.float32
    forms = {qmatmul_acts(h, q) for q in (qg, qu, qd)}
    acts = forms.pop() if len(forms) == 1 else ("f32",)

    def build(x, wg, wu, wd):
        x, wg, wu, wd = x.tensor, wg.tensor, wu.tensor, wd.tensor
        n_i, n_h = wg.shape[0], wd.shape[0]
        outs = []
        for act in acts:
            for gate in GATES:
                fused = ops.custom("crucible.mlp", h.ref, [x, wg, wu, wd], [TensorType(f32, [x.shape[0], n_h], device=h.ref)],
                                   parameters={"qg": qg, "qu": qu, "qd": qd, "act": act, "gate": gate})[0].tensor
                hid = ops.custom("crucible.qmatmul2", h.ref, [x, wg, wu], [TensorType(f32, [x.shape[0], n_i], device=h.ref)],
                                 parameters={"qa": qg, "qb": qu, "act": act, "epilogue": gate})[0].tensor
                down = ops.custom("crucible.qmatmul", h.ref, [hid, wd], [TensorType(f32, [x.shape[0], n_h], device=h.ref)],
                                  parameters={"qtype": qd, "act": act, "variant": "auto"})[0].tensor
                outs += [fused, hid, down]
        return outs

    types = [TensorType(f32, ["m", "hidden"], device=h.ref), TensorType(DType.uint8, ["inter", "kbg"], device=h.ref),
             TensorType(DType.uint8, ["inter", "kbu"], device=h.ref), TensorType(DType.uint8, ["hidden", "kbd"], device=h.ref)]
    return h.model(f"mlp_{qg}_{qu}_{qd}", types, build), acts


def check_mlp(h: Harness, qg: str, qu: str, qd: str) -> list[CaseResult]:
    """crucible.mlp for one type triple: both gates and every activation form over the grid."""
    model, acts = mlp_graph(h, qg, qu, qd)
    rng = np.random.default_rng(5)
    out = []
    for m, hh, i in mlp_shapes(qd):
        x = rng.standard_normal((m, hh)).astype(np.float32)
        wg, wu, wd = quantized_weights(i, hh, qg, rng), quantized_weights(i, hh, qu, rng), quantized_weights(hh, i, qd, rng)
        dg, du, dd = R.dequantize(wg, qg, i, hh), R.dequantize(wu, qu, i, hh), R.dequantize(wd, qd, hh, i)
        mg, mu, md = magnitude(wg, dg, qg), magnitude(wu, du, qu), magnitude(wd, dd, qd)
        ys = h.run(model, [x, wg, wu, wd])
        shape = f"M={m} H={hh} I={i}"
        for a, act in enumerate(acts):
            if act == "q8" and m > 32:
                continue  # act=q8 changes only the decode path (M <= 32): the f32 outputs cover prefill
            tag = f"{qg}+{qu}+{qd}" + (":act=q8" if act == "q8" else "")
            xr = R.quantize_activations_q8(x) if act == "q8" else x.astype(np.float64)
            rg, ru = xr @ dg.T, xr @ du.T
            bg, bu = dot_bound(xr, mg, rg, False), dot_bound(xr, mu, ru, False)
            for j, gate in enumerate(GATES):
                fused, hid, down = ys[3 * (a * len(GATES) + j): 3 * (a * len(GATES) + j) + 3]
                h_ref = R.silu_mul(np.concatenate([rg, ru], axis=1), gate)
                out.append(result(h, "crucible.mlp", f"{tag}:{gate}:h", "float32", shape,
                                  error_ratio(np.abs(hid - h_ref), gated_bound(rg, ru, bg, bu, gate, h_ref)), 1.0))
                hr = R.quantize_activations_q8(hid) if act == "q8" and m <= 32 else hid.astype(np.float64)
                ref = hr @ dd.T
                bound = dot_bound(hr, md, ref, False)
                out.append(result(h, "crucible.mlp", f"{tag}:{gate}", "float32", shape,
                                  error_ratio(np.abs(fused - ref), bound), 1.0))
                out.append(result(h, "crucible.mlp", f"{tag}:{gate}:equals-unfused", "float32", shape,
                                  float(np.abs(fused - down).max()), SUBNORMAL))
                if (m, hh, gate) == (7, mlp_shapes(qd)[0][1], "silu"):
                    # gate and up swapped: h from the float64 reference of up and gate exchanged.
                    swapped_h = R.silu_mul(np.concatenate([ru, rg], axis=1), "silu")
                    swapped = swapped_h @ dd.T
                    miss = error_ratio(np.abs(fused - swapped), dot_bound(swapped_h, md, swapped, False))
                    out.append(result(h, "crucible.mlp", tag + ":gate-up-swap-is-detected", "float32", shape,
                                      1.0 / max(miss, 1e-30), 1.0))
    return out
